/*
 * The CUDA backend's one decision of what runs (ggml's "best kernel"): the
 * first row of the tuning table that covers the problem on the device
 * (attn__cuda_workspace then sizes its scratch). The rows are the families'
 * (attn_cuda.h), walked decoding first (the few query rows it covers run
 * there, keys split across the device), then the Hopper forward and
 * backward (where the device runs sm_90a code), then tensor cores (f32
 * through TF32 when the problem allows it), then the f32 wide kernel, then
 * the general kernels, which cover every problem.
 *
 * A toolkit before CUDA 12 builds no Hopper kernels (they need its tensor
 * maps; CMake then sets ATTN_CUDA_HOPPER to 0), nor the sm_90a code they
 * would run from: their rows are left out here, the one place that uses
 * them, and an H100 takes the tensor-core rows.
 */
#include "attn_cuda.h"

#include <stdio.h>

/* What a family needs of the problem beyond the row's key. */
static int family_covers(attn__cuda_kernel k, const attn__problem *pb) {
  switch (k) {
    case ATTN__CUDA_HOPPER_FORWARD:
    case ATTN__CUDA_HOPPER_BACKWARD:
    case ATTN__CUDA_MMA_FORWARD:
    case ATTN__CUDA_MMA_BACKWARD: {
      /* The kernels index rows in int. */
      const int64_t lim = (int64_t)1 << 30;
      if (pb->seqlen_q >= lim || pb->seqlen_k >= lim || pb->total_q >= lim || pb->total_k >= lim)
        return 0;
      int ok = attn__cuda_aligned16(&pb->q) && attn__cuda_aligned16(&pb->k) &&
               attn__cuda_aligned16(&pb->v) && attn__cuda_aligned16(&pb->o);
      if (k == ATTN__CUDA_MMA_BACKWARD || k == ATTN__CUDA_HOPPER_BACKWARD)
        ok = ok && attn__cuda_aligned16(&pb->dout) && attn__cuda_aligned16(&pb->dq) &&
             attn__cuda_aligned16(&pb->dk) && attn__cuda_aligned16(&pb->dv) && pb->lse.native;
      /* A bias of q's dtype or f32 loads as 16-byte chunks of contiguous
       * keys, by cp.async where a chunk is 16-byte aligned and element by
       * element where rows are not whole chunks (cp_async16_any); a dbias
       * that sums over broadcast dimensions in a fixed order is the general
       * kernels'. */
      if (pb->has_bias) {
        const attn__tensor *b = &pb->bias;
        ok = ok && (b->dtype == pb->dtype || b->dtype == ATTN_F32) && b->sd == 1 &&
             attn__cuda_base(b) % attn_dtype_size(b->dtype) == 0;
        /* The Hopper forward reads its bias tiles with ldmatrix: 16 bits. */
        if (k == ATTN__CUDA_HOPPER_FORWARD) ok = ok && b->dtype == pb->dtype;
      }
      /* Its TF32 rows stage dense copies of q, k and v^T. */
      if (k == ATTN__CUDA_HOPPER_FORWARD && pb->dtype == ATTN_F32 && pb->varlen) ok = 0;
      if (pb->deterministic && attn__cuda_dbias_sums(pb)) ok = 0;
      return ok;
    }
    case ATTN__CUDA_F32_FORWARD:
      return attn__cuda_rows4(&pb->q, pb) && attn__cuda_rows4(&pb->k, pb) &&
             attn__cuda_rows4(&pb->v, pb);
    case ATTN__CUDA_GENERAL_FORWARD:
    case ATTN__CUDA_GENERAL_BACKWARD:
      break;
    case ATTN__CUDA_DECODE:
      return attn__cuda_decode_covers(pb);
  }
  return 1;
}

/* Whether the device's code has the row's instructions: an image built for
 * cc or later, and cc's own specific image where the row needs one. */
static int code_runs(const attn__cuda_config *c, const attn__cuda_device *dev) {
  if (c->specific) return dev->arch_specific && dev->arch == c->cc;
  return dev->arch >= c->cc;
}

/* What a bias adds to a row's shared memory. */
static size_t bias_smem(const attn__cuda_config *c, const attn__problem *pb) {
  if (!pb->has_bias) return 0;
  const size_t e = attn_dtype_size(pb->bias.dtype);
  if (c->kernel == ATTN__CUDA_MMA_FORWARD) return attn__cuda_mma_fwd_bias_smem(c, e);
  if (c->kernel == ATTN__CUDA_MMA_BACKWARD) return attn__cuda_mma_bwd_bias_smem(c, e);
#if ATTN_CUDA_HOPPER
  if (c->kernel == ATTN__CUDA_HOPPER_FORWARD) return attn__cuda_hopper_fwd_bias_smem(c);
#endif
  return 0;
}

/* A row of key blocks wider than 128 (the Hopper forward's 176 and 208) is
 * taken only where its blocks pad the keys at most an eighth beyond what
 * 128-key blocks do: at 197 keys one block of 208 against two of 128 (fewer
 * columns), at 1024 five of 208 (2 % more columns, 3 fewer softmax
 * passes), but at 256 two of 176 or 208 would do 38-62 % more work in as
 * many passes. */
static int keys_pad_little(const attn__cuda_config *c, const attn__problem *pb) {
  if (c->kernel != ATTN__CUDA_HOPPER_FORWARD || c->bc <= 128) return 1;
  const int64_t nk = pb->seqlen_k;
  const int64_t wide = (nk + c->bc - 1) / c->bc * c->bc, base = (nk + 127) / 128 * 128;
  return 8 * wide <= 9 * base;
}

static const attn__cuda_config *first_row(const attn__cuda_rows *t, const attn__cuda_device *dev,
                                          const attn__problem *pb, int backward) {
  for (int i = 0; i < t->n; i++) {
    const attn__cuda_config *c = &t->row[i];
    const int bwd = c->kernel == ATTN__CUDA_MMA_BACKWARD ||
                    c->kernel == ATTN__CUDA_HOPPER_BACKWARD ||
                    c->kernel == ATTN__CUDA_GENERAL_BACKWARD;
    size_t smem = c->smem;
    if (pb->deterministic && c->smem_det > smem) smem = c->smem_det;
    smem += bias_smem(c, pb);
    if (bwd == backward && c->dtype == pb->dtype && (!c->tf32 || pb->allow_tf32) &&
        pb->seqlen_q >= c->min_seqlen_q &&
        ((pb->window_left < 0 && pb->window_right < 0) || pb->seqlen_k >= c->min_keys_masked) &&
        keys_pad_little(c, pb) && c->dim == attn__cuda_dim_bucket(c->kernel, pb->head_dim) &&
        code_runs(c, dev) && smem <= dev->smem_optin &&
        (attn__problem_uses(pb) & ~c->features) == 0 &&
        !(pb->deterministic && c->nondeterministic) && family_covers(c->kernel, pb))
      return c;
  }
  return NULL;
}

const attn__cuda_config *attn__cuda_plan_unstaged(const attn__cuda_device *dev,
                                                  const attn__problem *pb) {
  return first_row(&attn__cuda_mma_forward_rows, dev, pb, 0);
}

const attn__cuda_config *attn__cuda_plan(const attn__cuda_device *dev, const attn__problem *pb,
                                         int backward, char *why, size_t why_len) {
  static const attn__cuda_rows *const table[] = {
    &attn__cuda_decode_rows,
    &attn__cuda_decode_rows_f32,
#if ATTN_CUDA_HOPPER
    &attn__cuda_hopper_forward_rows,
    &attn__cuda_hopper_forward_rows_tf32,
    &attn__cuda_hopper_backward_rows,
#endif
    &attn__cuda_mma_forward_rows,
    &attn__cuda_mma_backward_rows,
    &attn__cuda_f32_forward_rows,
    &attn__cuda_general_rows_f32,
    &attn__cuda_general_rows_f16,
    &attn__cuda_general_rows_bf16,
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    const attn__cuda_config *c = first_row(table[i], dev, pb, backward);
    if (c) return c;
  }
  if (attn__problem_uses(pb)) {
    snprintf(why, why_len, "cuda: no %s kernel implements the KV cache, bias or sinks asked for",
             backward ? "backward" : "forward");
    return NULL;
  }
  snprintf(why, why_len,
           "cuda: no %s kernel fits head dim %lld in the device's %zu bytes of shared memory a "
           "block",
           backward ? "backward" : "forward", (long long)pb->head_dim, dev->smem_optin);
  return NULL;
}
