#!/usr/bin/env python3
"""Writes the hand-made seeds of fuzz_api that reach the inference path
(fuzz/corpus/fuzz_api/seed_*): each is the stream of choices fuzz_api.c reads,
spelled out here one choice at a time, so that a seed starts on a valid (or
deliberately wrong) use of one new field and the fuzzer mutates from there.
Run from the repository root; the seeds are committed. Keep this in step with
the order in which LLVMFuzzerTestOneInput and build_inference read."""
import os

SUPPORTS, FORWARD, BACKWARD = 0, 1, 2
F32, F16, BF16 = 0, 1, 2
# build_inference's feature bits
PAGED, APPEND, SEQUSED, SPLITS, BIAS, DBIAS, SINKS, DSINKS = (1 << i for i in range(8))

PLAIN = [0, 0]            # no mutation, host memory, aligned
BUFFER = [0x40, 0, 0]     # in an attn_buffer at offset 0 claiming all of it
ABSENT = [4]              # a NULL tensor pointer
WRONG_DTYPE = [1, 1, 0]   # dtype mutated to f16, host memory, aligned


def inside(slot):
    """Memory inside an earlier slot's (q 0, k 1, o 3, bias 13), at its start."""
    return [0x80, slot, 0]


def size(n):
    """pick_size's byte for n."""
    special = {16: 227, 64: 228, 256: 229, 0: 224, -1: 225, 2**31 - 1: 232}
    return [n - 1] if 1 <= n <= 8 else [special[n]]


def head(op, varlen=False, dt=F32, B=2, nq=3, nk=5, hq=2, hkv=1, d=4, causal=False):
    """Everything up to the inference choices: a valid call."""
    s = [0, op, 1 if varlen else 0, dt]
    for n in (B, nq, nk, hq, hkv, d):
        s += size(n)
    s += PLAIN * 9                      # q k v o lse do dq dk dv
    s += [0, 0, 1 if causal else 0, 0, 0, 0]  # scale softcap flags windows alibi
    if varlen:
        s += [0, 0, 0]                  # cu: even splits of the rows
    else:
        s += [0, 0]                     # batch (ignored for bshd), no cu_seqlens
    return s


def seqused(entries, memory=PLAIN):
    """entries: fill_seqused's bytes, 0 = the room beside the new rows."""
    return memory + entries


def main():
    seeds = {}
    B = 2
    full = [0] * B                      # each sequence full up to the new rows
    # seqused_k in host memory, then in a buffer, and with bad entries.
    seeds["seed_seqused_host"] = head(FORWARD) + [0, SEQUSED] + seqused([1, 2])
    seeds["seed_seqused_buffer"] = head(FORWARD) + [0, SEQUSED] + seqused([1, 2], BUFFER)
    seeds["seed_seqused_int32_edges"] = (head(FORWARD) + [0, SEQUSED] +
                                         seqused([224 + 4, 224 + 5]))
    seeds["seed_seqused_i32_wrong_dtype"] = head(FORWARD) + [0, SEQUSED] + seqused(full,
                                                                                     WRONG_DTYPE)
    # Appending two rows to a bshd cache, host and device lengths.
    app = [1] + PLAIN + PLAIN           # n_new 2, k_new, v_new
    seeds["seed_append_bshd"] = head(FORWARD) + [0, APPEND | SEQUSED] + app + seqused(full)
    seeds["seed_append_bshd_buffer"] = (head(FORWARD) + [0, APPEND | SEQUSED] + app +
                                        seqused([224 + 5, 224 + 4], BUFFER))
    seeds["seed_append_without_seqused"] = head(FORWARD) + [0, APPEND] + app
    seeds["seed_append_knew_inside_q"] = (head(FORWARD) + [0, APPEND | SEQUSED] + [1] + inside(0) +
                                          PLAIN + seqused(full))
    seeds["seed_append_knew_aliases_k"] = (head(FORWARD) + [0, APPEND | SEQUSED] + [1] + inside(1) +
                                           PLAIN + seqused(full))
    # Varlen: sequences of 2 and 3 key rows, lengths on the device, and a
    # sequence of 2 rows that cannot hold 3 new ones (with host lengths,
    # ECACHE; on the device, validation must still refuse it).
    seeds["seed_append_varlen"] = (head(FORWARD, varlen=True) + [0, APPEND | SEQUSED] + app +
                                   seqused(full))
    seeds["seed_append_varlen_too_short"] = (head(FORWARD, varlen=True) + [0, APPEND | SEQUSED] +
                                             [2] + PLAIN + PLAIN + seqused(full, BUFFER))
    # The same with sequence 0's length 0: clamped to its room, -1, the
    # append wrote before k (ASan: heap-buffer-overflow in the CPU's append).
    seeds["seed_append_varlen_too_short_first"] = (head(FORWARD, varlen=True) +
                                                   [0, APPEND | SEQUSED] + [2] + PLAIN + PLAIN +
                                                   seqused([224 + 6, 0], BUFFER))
    # Paged: 6 pages of 2 rows, a table of 3 pages per sequence.
    paged = [5, 1, 2] + PLAIN + PLAIN + PLAIN + [0] * (B * 3)
    seeds["seed_paged"] = head(FORWARD) + [0, PAGED] + paged
    seeds["seed_paged_append"] = (head(FORWARD) + [0, PAGED | APPEND | SEQUSED] + paged + app +
                                  seqused([1, 0]))
    seeds["seed_paged_table_edges"] = (head(FORWARD) + [0, PAGED | SEQUSED] + [5, 1, 2] +
                                       PLAIN * 3 + [224, 225, 226, 227, 228, 229] +
                                       seqused(full, BUFFER))
    seeds["seed_paged_table_buffer"] = (head(FORWARD) + [0, PAGED | APPEND | SEQUSED] + [5, 1, 2] +
                                        PLAIN * 2 + BUFFER + [225, 224, 0, 226, 227, 0] + app +
                                        seqused(full, BUFFER))
    seeds["seed_paged_backward"] = head(BACKWARD) + [0, PAGED] + paged
    # Keys enough for several key blocks of 64: split in 3 parts, and on a
    # paged cache of 64-row pages with appended rows, in 4 (GQA 4:1, one
    # query row: the CPU packs the group's heads into a tile).
    long = dict(B=1, nq=1, nk=256, hq=4, hkv=1, d=16)
    seeds["seed_splits_long_keys"] = head(FORWARD, **long) + [0, SPLITS, 3]
    seeds["seed_paged_long_splits"] = (head(FORWARD, **long) +
                                       [0, PAGED | APPEND | SEQUSED | SPLITS] + [7] + size(64) +
                                       [3] + PLAIN * 3 + [0] * 4 + [0] + PLAIN * 2 +
                                       seqused([100], BUFFER) + [4])
    seeds["seed_bias_sinks_long_keys"] = (head(FORWARD, causal=True, **long) +
                                          [0, BIAS | SINKS, 4 << 5] + PLAIN + PLAIN + [0])
    # num_splits: 2, then INT_MIN.
    seeds["seed_splits"] = head(FORWARD) + [0, SPLITS, 2]
    seeds["seed_splits_negative"] = head(FORWARD) + [0, SPLITS, 10]
    # Bias: full, broadcast over batch and heads with stride 0, of int32,
    # hiding every key, and on a paged cache.
    seeds["seed_bias"] = head(FORWARD) + [0, BIAS, 0] + PLAIN
    seeds["seed_bias_broadcast_stride0"] = head(FORWARD) + [0, BIAS, 1 | 2 | 16] + PLAIN
    seeds["seed_bias_i32"] = head(FORWARD) + [0, BIAS, 8, 3] + PLAIN
    seeds["seed_bias_all_neginf"] = head(FORWARD) + [0, BIAS, 4 | (5 << 5)] + PLAIN
    seeds["seed_bias_varlen"] = head(FORWARD, varlen=True) + [0, BIAS, 4 << 5] + PLAIN
    seeds["seed_bias_paged"] = head(FORWARD) + [0, PAGED | BIAS] + paged + [0] + PLAIN
    # Sinks, and the gradients: refused by the forward, taken by the backward.
    seeds["seed_sinks"] = head(FORWARD, causal=True) + [0, SINKS] + PLAIN + [5]
    seeds["seed_forward_dbias"] = head(FORWARD) + [0, BIAS | DBIAS, 0] + PLAIN + PLAIN
    seeds["seed_forward_dsinks"] = head(FORWARD) + [0, SINKS | DSINKS] + PLAIN + [0] + PLAIN
    seeds["seed_backward_terms"] = (head(BACKWARD) + [0, BIAS | DBIAS | SINKS | DSINKS, 2] + PLAIN +
                                    PLAIN + PLAIN + [4] + PLAIN)
    seeds["seed_backward_dbias_aliases_bias"] = (head(BACKWARD) + [0, BIAS | DBIAS, 0] + PLAIN +
                                                 inside(13))
    seeds["seed_backward_seqused"] = head(BACKWARD) + [0, SEQUSED] + seqused(full)
    seeds["seed_supports_seqused"] = head(SUPPORTS) + [0, SEQUSED] + seqused(full)
    # attn_merge: n parts (o, lse pairs), then the pointer byte.
    def merge(n_byte, parts, tail=()):
        return head(FORWARD) + [1, n_byte] + parts + list(tail) + [0]
    pair = PLAIN + PLAIN
    seeds["seed_merge_1"] = merge(0, pair)
    seeds["seed_merge_4"] = merge(3, pair * 4)
    seeds["seed_merge_256"] = merge(192 + 5, pair * 4, [7, 0] + pair)    # far part 11
    seeds["seed_merge_257"] = merge(192 + 6, pair * 4, [0, 1] + pair)    # far part 260
    seeds["seed_merge_minus_1"] = merge(192 + 0, pair)
    seeds["seed_merge_int_max"] = merge(192 + 8, pair * 4, [0, 0] + pair)
    seeds["seed_merge_part_aliases_o"] = merge(1, inside(3) + PLAIN + pair)
    seeds["seed_merge_varlen"] = (head(FORWARD, varlen=True) + [1, 2] + pair * 3 + [0])
    seeds["seed_merge_null_parts"] = merge(1, pair * 2)[:-1] + [1]

    out = "fuzz/corpus/fuzz_api"
    os.makedirs(out, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes(x & 0xFF for x in data))


if __name__ == "__main__":
    main()
