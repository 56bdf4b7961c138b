/*
 * The cross-language rules test (tests/test_rules.c): every language's
 * attention rules evaluated over one table of inputs and held to the C ones
 * (src/rules.h). Each language has an evaluator that runs its own functions
 * (cl/common.cl through an OpenCL device, cuda/common.cuh in a CUDA kernel)
 * on the same rows.
 *
 * The rules and their names, the same in every language:
 *   diag(i, nq, nk)                 = i + nk - nq, the key on row i's diagonal
 *   key_range(dg, nk, wl, wr)       keys [lo, hi) visible to the row of diagonal dg
 *   query_range(j, nq, nk, wl, wr)  rows [lo, hi) that see key j
 *   key_block_range(i0, i1, ...)    keys visible to any row of [i0, i1)
 *   query_block_range(j0, j1, ...)  rows that see any key of [j0, j1)
 *   key_visible(dg, j, wl, wr)      whether key j is visible to the row of diagonal dg
 *   block_unmasked(i0, i_last, j0, j1, ...)
 *                                   whether every row of [i0, i_last] sees every key of
 *                                   [j0, j1), all in the sequence: a tile with no mask
 *                                   (CUDA's tile kernels; a language without it gives -1)
 *   score(dot, scale, softcap, slope, dist, &t)
 *                                   the epilogue in order: scale, softcap, ALiBi
 *                                   (dist = dg - j); t = tanh(dot*scale/softcap), 0 off
 *   score_grad(ds, t, softcap)      d(score)/d(dot*scale) applied to ds: ds (1 - t^2)
 * A window bound of -1 is no bound; causal arrives as wr = 0. Ranges are
 * clamped to [0, n) and empty when lo >= hi.
 */
#ifndef ATTN_RULES_TABLE_H
#define ATTN_RULES_TABLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct rules_in {
  int32_t nq, nk, wl, wr; /* one sequence's shape and window */
  int32_t i, j;           /* a query row and a key, each in range */
  int32_t i0, i1, j0, j1; /* a query block [i0, i1) and a key block [j0, j1), non-empty */
  int32_t j2;             /* the key tile's end before clamping to nk, as kernels' tiles have */
  float dot, scale, softcap, slope, ds;
} rules_in;

typedef struct rules_out {
  int32_t diag;
  int32_t key_lo, key_hi;     /* key_range(diag(i)) */
  int32_t query_lo, query_hi; /* query_range(j) */
  int32_t kblock_lo, kblock_hi;
  int32_t qblock_lo, qblock_hi;
  int32_t visible;  /* key_visible(diag(i), j) */
  int32_t unmasked; /* block_unmasked(i0, i1 - 1, j0, j2), -1 where the language has none */
  float score, t;   /* score(dot, ..., diag(i) - j) and its tanh */
  float score_log2; /* the same in log2 units (C and OpenCL: score * log2(e)) */
  float grad;       /* score_grad(ds, t, softcap) */
} rules_out;

/* Each evaluator fills out[0..n) and returns 0; or returns -1 with a
 * sentence in why when its language's runtime or device is missing (the
 * test then skips that language, saying why), and -2 with a sentence when it
 * failed where it should have run (the test fails). */
int rules_eval_c(const rules_in *in, int n, rules_out *out);
int rules_eval_opencl(const rules_in *in, int n, rules_out *out, char *why, size_t why_len);
int rules_eval_cuda(const rules_in *in, int n, rules_out *out, char *why, size_t why_len);

#endif
