/*
 * The decoding family's host decisions (its kernels are decode.cu's): which
 * problems it covers, into how many parts it splits each row's keys, and the
 * workspace the split parts need. The plan (plan.c) and the launcher both
 * ask here, so the workspace sized at planning is the one the launch uses.
 */
#include "attn_cuda.h"

/* Keys a block takes per step (16 per warp, 4 warps): a split has at least
 * one such block, and the automatic choice gives each at least this many
 * of them, so that a split's start-up (Q, the first tiles in flight) stays
 * small beside its streaming. */
enum { KEY_BLOCK = 64, AUTO_MIN_BLOCKS = 4 };

int attn__cuda_decode_covers(const attn__problem *pb) {
  /* Key and row indices are int, pages too. */
  const int64_t lim = (int64_t)1 << 30;
  if (pb->seqlen_q >= lim || pb->seqlen_k >= lim || pb->total_q >= lim || pb->num_pages > INT32_MAX)
    return 0;
  if (pb->heads_q / pb->heads_kv * pb->seqlen_q > ATTN__CUDA_DECODE_MAX_ROWS) return 0;
  /* An f32 lse is the backward's: its P = exp(s - lse) is exact to float32
   * (with the (hi, lo) form, at any logit size) only when the backward
   * recomputes each score bit for bit, as the general family does its own,
   * whose dot products run in another order than these kernels'. And the
   * plain lse must be the (hi, lo) form's hi. So an f32 call that wants an
   * lse runs there; inference, which wants none, runs here. */
  if (pb->dtype == ATTN_F32 && pb->has_lse) return 0;
  /* The kernels load rows as 16-byte chunks. */
  if (pb->dtype == ATTN_F32)
    return attn__cuda_rows4(&pb->q, pb) && attn__cuda_rows4(&pb->k, pb) &&
           attn__cuda_rows4(&pb->v, pb);
  return pb->head_dim % 8 == 0 && attn__cuda_aligned16(&pb->q) && attn__cuda_aligned16(&pb->k) &&
         attn__cuda_aligned16(&pb->v);
}

/* The longest key range of a sequence that the host can know: the used
 * lengths when the caller gave them in host memory (validated there), else
 * the capacity. */
static int64_t longest_keys(const attn__problem *pb) {
  if (!pb->seqused_host) return pb->seqlen_k;
  int64_t n = 0;
  for (int64_t b = 0; b < pb->batch; b++) {
    const int64_t k = (int64_t)pb->seqused_host[b * pb->seqused_k.sb] + pb->seqlen_new;
    if (k > n) n = k;
  }
  return n;
}

/* Blocks of row c that an SM holds, by shared memory: the SM's is the
 * block's opt-in maximum plus the 1 KB the runtime reserves a block (228 KB
 * on sm_90, 164 KB on sm_80). */
static int64_t blocks_per_sm(const attn__cuda_device *dev, const attn__cuda_config *c) {
  const int64_t n = (int64_t)(dev->smem_optin + 1024) / (int64_t)(c->smem + 1024);
  const int64_t by_threads = 2048 / c->threads;
  return n < 1 ? 1 : n > by_threads ? by_threads : n;
}

int attn__cuda_decode_splits(const attn__cuda_device *dev, const attn__cuda_config *c,
                             const attn__problem *pb) {
  const int64_t nk = longest_keys(pb);
  const int64_t key_blocks = (nk + KEY_BLOCK - 1) / KEY_BLOCK;
  int64_t most =
      key_blocks < ATTN__CUDA_DECODE_MAX_SPLITS ? key_blocks : ATTN__CUDA_DECODE_MAX_SPLITS;
  if (most < 1) most = 1;
  if (pb->num_splits >= 1) return (int)(pb->num_splits < most ? pb->num_splits : most);

  /* Automatic: FlashAttention-2's choice (num_splits_heuristic). With the
   * blocks of one wave (every SM full) as the unit, the fewest splits whose
   * waves fill at least 85% of the last one as well as the best count does,
   * skipping counts that give the same split length as one less. */
  const int64_t group = pb->heads_q / pb->heads_kv;
  const int64_t rblocks = (group * pb->seqlen_q + 15) / 16;
  const int64_t units = pb->batch * pb->heads_kv * rblocks;
  const int64_t slots = (int64_t)dev->sm_count * blocks_per_sm(dev, c);
  if (5 * units >= 4 * slots) return 1;
  const int64_t by_length = key_blocks / AUTO_MIN_BLOCKS;
  if (by_length < most) most = by_length < 1 ? 1 : by_length;
  double eff[ATTN__CUDA_DECODE_MAX_SPLITS + 1], best = 0;
  for (int64_t s = 1; s <= most; s++) {
    const double waves = (double)(units * s) / (double)slots;
    const double full = (double)(int64_t)waves == waves ? waves : (double)((int64_t)waves + 1);
    eff[s] = waves / full;
    if (eff[s] > best) best = eff[s];
  }
  for (int64_t s = 1; s <= most; s++) {
    const int eligible = s == 1 || (key_blocks + s - 1) / s != (key_blocks + s - 2) / (s - 1);
    if (eligible && eff[s] >= 0.85 * best) return (int)s;
  }
  return 1;
}

static size_t align256(size_t n) {
  return (n + 255) & ~(size_t)255;
}

size_t attn__cuda_decode_ws_ml(const attn__problem *pb, int splits) {
  return align256(sizeof(float) * 2 * (size_t)splits * (size_t)pb->total_q * (size_t)pb->heads_q);
}

size_t attn__cuda_decode_workspace(const attn__cuda_device *dev, const attn__cuda_config *c,
                                   const attn__problem *pb) {
  const int splits = attn__cuda_decode_splits(dev, c, pb);
  if (splits <= 1) return 0;
  const size_t rows = (size_t)splits * (size_t)pb->total_q * (size_t)pb->heads_q;
  return attn__cuda_decode_ws_ml(pb, splits) +
         align256(sizeof(float) * rows * (size_t)pb->head_dim);
}
