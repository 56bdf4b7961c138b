/*
 * The CUDA backend's private interface between its host code (cuda/cuda.c),
 * its plan (cuda/plan.c) and its kernel families:
 *   - the decoding kernels (decode*.cu): a few query rows per KV head over
 *     a long KV cache, keys split across blocks (FlashDecoding);
 *   - the Hopper forward (wgmma, sm_90a only; hopper_fwd.cuh) for head dims
 *     64, 96, 128 and 256, f16/bf16 (hopper_fwd.cu), and f32 through TF32
 *     at 64, 96 and 128 for dense problems without a bias or KV cache that
 *     allow it (hopper_fwd_tf32.cu);
 *   - the Hopper backward (the same; hopper_bwd.cu) for head dims 64, 96
 *     and 128, without those terms and not in deterministic mode;
 *   - the tensor-core kernels (mma.sync + ldmatrix, f16/bf16; mma_*.cu) for
 *     the common head dims, and the forward's f32 rows through TF32, for
 *     problems that allow it (ATTN_ALLOW_TF32);
 *   - the f32 forward's wide kernel (general_fwd32.cuh) for padded head dims
 *     64 and 128 with 16-byte rows;
 *   - the general kernels (any head dim 1..256, every dtype, f32 in true
 *     fp32 on the CUDA cores; general*.cu), which cover every problem.
 *
 * Each family exports its rows of the tuning table: one kernel
 * configuration each, its traits and its launcher. The plan walks them in
 * the order above and takes the first row whose key (dtype, head dim, lowest
 * compute capability, TF32) and needs (shared memory, alignment) the problem
 * and the device meet; the launcher then runs exactly that row.
 */
#ifndef ATTN_CUDA_H
#define ATTN_CUDA_H

#include "attn_internal.h"

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor as the decoding and cache kernels address it: its first element
 * (NULL for an absent tensor) and its strides in elements. */
typedef struct attn__cuda_view {
  char *p;
  long long sb, ss, sh, sd;
} attn__cuda_view;

/* A tensor's first element on the device (NULL for an absent tensor). */
static inline char *attn__cuda_at(const attn__tensor *t) {
  return t->native ? (char *)t->native + t->offset : NULL;
}

static inline attn__cuda_view attn__cuda_view_of(const attn__tensor *t) {
  attn__cuda_view v;
  v.p = attn__cuda_at(t);
  v.sb = t->sb;
  v.ss = t->ss;
  v.sh = t->sh;
  v.sd = t->sd;
  return v;
}

/* What the plan needs of a device, queried once when a context opens. */
typedef struct attn__cuda_device {
  int sm_count;
  int cc;            /* compute capability, 10 * major + minor */
  size_t smem_optin; /* cudaDevAttrMaxSharedMemoryPerBlockOptin */
  /* The compute capability the code the device runs was compiled for (75
   * where an H200 runs compute_75 PTX), and whether it is the architecture-
   * specific kind (sm_90a: wgmma, setmaxnreg): what a row may use. */
  int arch;
  int arch_specific;
} attn__cuda_device;

/* Reads dev->arch and dev->arch_specific on the current device (image.cu). */
cudaError_t attn__cuda_code_arch(attn__cuda_device *dev);

/* Everything a launcher needs for one call. All pointers are device
 * pointers except pb's host-side fields (cu_q, cu_k, alibi in pb are host
 * memory; the device copies, or the caller's device tensors, are here). */
typedef struct attn__cuda_launch {
  const attn__problem *pb;
  const attn__cuda_device *dev;
  cudaStream_t stream;
  const int32_t *cu_q; /* device copy of the offsets (clamped), NULL for bshd */
  const int32_t *cu_k;
  const float *alibi; /* the slopes on the device, NULL for none */
  void *workspace;    /* at least the plan's workspace bytes, 256-byte aligned */
} attn__cuda_launch;

/* The kernel families (attn__plan.kernel). */
typedef enum attn__cuda_kernel {
  ATTN__CUDA_MMA_FORWARD = 1,
  ATTN__CUDA_MMA_BACKWARD,
  ATTN__CUDA_F32_FORWARD,
  ATTN__CUDA_GENERAL_FORWARD,
  ATTN__CUDA_GENERAL_BACKWARD,
  ATTN__CUDA_DECODE,
  ATTN__CUDA_HOPPER_FORWARD,
  ATTN__CUDA_HOPPER_BACKWARD
} attn__cuda_kernel;

typedef struct attn__cuda_config attn__cuda_config;

/* Runs a row for a problem the plan gave it: ATTN_OK, or ATTN_EDEVICE for a
 * launch or runtime error (ATTN_EINTERNAL when the plan and the launcher
 * disagree). Launchers do not synchronize. */
typedef int (*attn__cuda_launcher)(const attn__cuda_launch *L, const attn__cuda_config *c);

/* A row of the tuning table (attn__plan.config). The tiles are the kernel's
 * template arguments, copied here by the family's row builder. */
struct attn__cuda_config {
  attn__cuda_kernel kernel;
  attn_dtype dtype;
  int dim;              /* head dims d with bucket(d) == dim (see attn__cuda_dim_bucket) */
  int cc;               /* the lowest compute capability its code needs (attn__cuda_device.arch) */
  int specific;         /* and it needs cc's architecture-specific code (sm_90a) */
  int tf32;             /* f32 through TF32 tensor cores: only where the problem allows it */
  int threads;          /* a block */
  int br, bc;           /* query rows and keys a block (or a step) */
  int stages;           /* K/V slots in shared memory where the plan counts them, else 0 */
  int min_seqlen_q;     /* taken only for problems of at least this many query rows (a
                         * larger tile whose padding would cost shorter ones more) */
  int min_keys_masked;  /* and, where a window masks keys (causal), of at least this many
                         * keys (a wider key block whose diagonal costs shorter ones more) */
  size_t smem;          /* dynamic shared memory, its largest kernel */
  size_t smem_det;      /* backward: and its deterministic pass's, 0 if none */
  unsigned features;    /* the ATTN__USES_* bits (attn_internal.h) its kernels implement */
  int nondeterministic; /* backward: its sums run in no fixed order (fp32 atomics), so it
                         * never takes a deterministic problem */
  const char *name;     /* family and tiles in words */
  attn__cuda_launcher launch;
};

typedef struct attn__cuda_rows {
  const attn__cuda_config *row;
  int n;
} attn__cuda_rows;

/* The table, a family's rows each (in plan.c's order). */
extern const attn__cuda_rows attn__cuda_hopper_forward_rows;
extern const attn__cuda_rows attn__cuda_hopper_forward_rows_tf32;
extern const attn__cuda_rows attn__cuda_hopper_backward_rows;
extern const attn__cuda_rows attn__cuda_mma_forward_rows;
extern const attn__cuda_rows attn__cuda_mma_backward_rows;
extern const attn__cuda_rows attn__cuda_f32_forward_rows;
extern const attn__cuda_rows attn__cuda_general_rows_f32;
extern const attn__cuda_rows attn__cuda_general_rows_f16;
extern const attn__cuda_rows attn__cuda_general_rows_bf16;
extern const attn__cuda_rows attn__cuda_decode_rows;
extern const attn__cuda_rows attn__cuda_decode_rows_f32;

/* The head dim a family's kernels are built for: the exact one for the
 * tensor cores, else the next of 32, 64, 96, 128, 192, 256. */
static inline int attn__cuda_dim_bucket(attn__cuda_kernel k, int64_t d) {
  if (k == ATTN__CUDA_MMA_FORWARD || k == ATTN__CUDA_MMA_BACKWARD ||
      k == ATTN__CUDA_HOPPER_FORWARD || k == ATTN__CUDA_HOPPER_BACKWARD)
    return (int)d;
  if (k == ATTN__CUDA_DECODE) return d <= 64 ? 64 : d <= 128 ? 128 : 256;
  return d <= 32 ? 32 : d <= 64 ? 64 : d <= 96 ? 96 : d <= 128 ? 128 : d <= 192 ? 192 : 256;
}

/* The address of t's first element as the kernels will see it: 0 (aligned
 * to anything) for host memory the core stages into a fresh buffer. */
static inline uintptr_t attn__cuda_base(const attn__tensor *t) {
  return t->staged ? 0 : (uintptr_t)t->native + t->offset;
}

/* Whether t's rows load as groups of 4 elements: every row start aligned
 * to a group (16 bytes for f32, 8 for f16/bf16) and the group contiguous. */
static inline int attn__cuda_rows4(const attn__tensor *t, const attn__problem *pb) {
  return t->native && t->sd == 1 && pb->head_dim % 4 == 0 && t->ss % 4 == 0 && t->sh % 4 == 0 &&
         t->sb % 4 == 0 && attn__cuda_base(t) % (4 * attn_dtype_size(pb->dtype)) == 0;
}

/* Whether t's rows load as 16-byte chunks (cp.async, ldmatrix): the base and
 * every row start 16-byte aligned, the head dim contiguous. */
static inline int attn__cuda_aligned16(const attn__tensor *t) {
  const int64_t e = 16 / (int64_t)attn_dtype_size(t->dtype); /* elements in 16 bytes */
  return t->native && attn__cuda_base(t) % 16 == 0 && t->sd == 1 && t->ss % e == 0 &&
         t->sh % e == 0 && t->sb % e == 0;
}

/* The shared memory that a bias of elements of `size` bytes adds to a row
 * of the tensor-core forward (mma_fwd.cu) or backward (mma_bwd.cu), or a
 * bias of the data's dtype to the Hopper forward's (hopper_fwd.cu): the
 * bias tiles that ride with K and V. */
size_t attn__cuda_mma_fwd_bias_smem(const attn__cuda_config *c, size_t size);
size_t attn__cuda_mma_bwd_bias_smem(const attn__cuda_config *c, size_t size);
size_t attn__cuda_hopper_fwd_bias_smem(const attn__cuda_config *c);

/* The plan (plan.c): the row to run, or NULL with a sentence in why. */
const attn__cuda_config *attn__cuda_plan(const attn__cuda_device *dev, const attn__problem *pb,
                                         int backward, char *why, size_t why_len);

/* The mma.sync TF32 row for a problem whose Hopper TF32 row cannot have its
 * staged copies (the workspace cannot grow: cuda.c; no tensor map describes
 * them: hopper_fwd_tf32.cu): the same problem with no workspace, or NULL. */
const attn__cuda_config *attn__cuda_plan_unstaged(const attn__cuda_device *dev,
                                                  const attn__problem *pb);

/* The Hopper TF32 forward's workspace (hopper_fwd_tf32.cu): q and k rounded
 * to TF32, dense, then v^T, [batch][heads_kv][d][keys rounded up to 8],
 * each 256-byte aligned; its size, with k's and v^T's offsets. */
static inline size_t attn__cuda_tf32_staged(const attn__problem *pb, size_t *k_at, size_t *v_at) {
  const size_t d = (size_t)pb->head_dim, b = (size_t)pb->batch, hk = (size_t)pb->heads_kv;
  const size_t keys8 = ((size_t)pb->seqlen_k + 7) & ~(size_t)7;
  const size_t q = (4 * b * (size_t)pb->heads_q * (size_t)pb->seqlen_q * d + 255) & ~(size_t)255;
  const size_t k = (4 * b * hk * (size_t)pb->seqlen_k * d + 255) & ~(size_t)255;
  *k_at = q;
  *v_at = q + k;
  return q + k + ((4 * b * hk * d * keys8 + 255) & ~(size_t)255);
}

/* The backward's workspace: a float per query row and head (D = rowsum(dO *
 * O); the tensor cores' second, lse * log2(e), follows it), each block
 * 256-byte aligned, then in atomic mode the fp32 dq accumulator. The
 * forward needs none but the TF32 staging above. */
static inline size_t attn__cuda_ws_rows(const attn__problem *pb) {
  return (sizeof(float) * (size_t)pb->total_q * (size_t)pb->heads_q + 255) & ~(size_t)255;
}
static inline size_t attn__cuda_workspace(attn__cuda_kernel k, const attn__problem *pb) {
  size_t k_at, v_at;
  if (k == ATTN__CUDA_HOPPER_FORWARD && pb->dtype == ATTN_F32)
    return attn__cuda_tf32_staged(pb, &k_at, &v_at);
  const size_t per = attn__cuda_ws_rows(pb);
  const size_t dq = pb->deterministic ? 0 : per * (size_t)pb->head_dim;
  if (k == ATTN__CUDA_MMA_BACKWARD || k == ATTN__CUDA_HOPPER_BACKWARD) return 2 * per + dq;
  if (k == ATTN__CUDA_GENERAL_BACKWARD) return per + dq;
  return 0;
}

/* The architectures the kernels were built for (archs.c; CMake's
 * CUDA_ARCHITECTURES, "" where unknown), and whether such a list has code
 * that runs on a device of compute capability cc = 10 * major + minor. */
const char *attn__cuda_archs(void);
int attn__cuda_arch_covers(const char *archs, int cc);

/* The decoding family (decode_plan.c): whether it covers a problem (at most
 * ATTN__CUDA_DECODE_MAX_ROWS query rows per KV head, group * seqlen_q), the
 * parts each row's keys are split into (num_splits, or chosen to fill the
 * device), and its workspace: the split parts' (m, l) pairs, whose bytes
 * attn__cuda_decode_ws_ml gives, then their outputs. */
#define ATTN__CUDA_DECODE_MAX_ROWS 64
#define ATTN__CUDA_DECODE_MAX_SPLITS 256
int attn__cuda_decode_covers(const attn__problem *pb);
int attn__cuda_decode_splits(const attn__cuda_device *dev, const attn__cuda_config *c,
                             const attn__problem *pb);
size_t attn__cuda_decode_ws_ml(const attn__problem *pb, int splits);
size_t attn__cuda_decode_workspace(const attn__cuda_device *dev, const attn__cuda_config *c,
                                   const attn__problem *pb);

/* The KV cache and attn_merge (cache.cu). attn__cuda_append writes k_new and
 * v_new into the cache (L->cu_k: the device copy for a varlen cache).
 * attn__cuda_merge runs attn_merge on the stream, with a workspace of at
 * least attn__cuda_merge_workspace bytes for the parts' descriptors. Both
 * return ATTN_OK, ATTN_ENOMEM or ATTN_EDEVICE, and do not synchronize. */
int attn__cuda_append(const attn__cuda_launch *L);
size_t attn__cuda_merge_workspace(const attn__merge *m);
int attn__cuda_merge(const attn__merge *m, cudaStream_t stream, void *workspace);

/* cu_seqlens from a device buffer (in, n entries) into out on the stream,
 * clamped so that they index only the tensor's rows (meta.cu): ATTN_OK or
 * ATTN_EDEVICE. */
int attn__cuda_clamp_offsets(const int32_t *in, int32_t *out, int64_t n, int64_t rows,
                             cudaStream_t stream);

/* The backward's score-term passes every family with dbias and dsinks runs
 * (general.cu), on the stream, ATTN_OK or ATTN_EDEVICE. attn__cuda_dbias_zero:
 * dbias = 0 before the passes, unless they store every element themselves.
 * attn__cuda_dsinks: dsinks from lse and the family's D = rowsum(dO * O),
 * D of row w over the batch and head h at D[w * d_row + h * d_head]. */
int attn__cuda_dbias_zero(const attn__problem *pb, cudaStream_t stream);
int attn__cuda_dsinks(const attn__problem *pb, const float *D, long long d_row, long long d_head,
                      cudaStream_t stream);

/* Whether dbias sums over a broadcast dimension (stride 0 where the problem
 * has more than one sequence, head or query row): dK/dV's pass then adds
 * into it with atomics, or, deterministic, a pass of its own sums in order. */
static inline int attn__cuda_dbias_sums(const attn__problem *pb) {
  const attn__tensor *t = &pb->dbias;
  return pb->has_dbias && ((t->sb == 0 && pb->batch > 1) || (t->sh == 0 && pb->heads_q > 1) ||
                           (t->ss == 0 && pb->seqlen_q > 1));
}

#ifdef __cplusplus
}
#endif
#endif /* ATTN_CUDA_H */
