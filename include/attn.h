/*
 * attn: transformer attention, softmax(Q K^T * scale) V, computed blockwise with
 * the online softmax (FlashAttention) on CUDA, OpenCL or the CPU, behind one API.
 *
 * Read this header top to bottom; it is the whole public interface.
 *
 *   1. Status codes          attn_status, attn_status_name(), attn_strerror()
 *   2. Backends and devices  attn_backend, attn_device_count(), attn_device_info_get()
 *   3. Contexts              attn_context_create(), attn_errmsg()
 *   4. Device buffers        attn_buffer_create(), attn_buffer_wrap(), ...
 *   5. Tensors               attn_tensor, attn_tensor_bshd(), attn_tensor_varlen()
 *   6. Parameters            attn_params, attn_params_init()
 *   7. Forward and backward  attn_forward(), attn_backward(), attn_supports()
 *   8. Merging partial results  attn_merge()
 *   9. Tuning                attn_tune()
 *
 * The exact semantics (causal alignment, windows, GQA, softcap, ALiBi, bias,
 * sinks, KV caches, variable-length batches, rows that see no key) are those
 * of the golden cases' README (tests/golden/README.md of the source tree).
 *
 * Every call returns an attn_status. When a call that takes a context fails,
 * attn_errmsg(ctx) holds one sentence naming the argument that was wrong.
 * The library never prints, exits or aborts; set ATTN_DEBUG=1 for a debug
 * log on stderr. A call that fails validation leaves every output untouched.
 *
 * Thread safety: distinct contexts may be used from distinct threads at once;
 * one context must not be used from two threads at the same time. A call that
 * finds its context inside another thread's call does not wait and does not
 * touch the context: it returns ATTN_EBUSY at once, leaving attn_errmsg() to
 * the call that is running (the check is one atomic exchange per call; it
 * catches the mistake, it is no lock). Creating and freeing contexts, and
 * freeing a buffer, are not checked: free nothing another thread still uses.
 * The CPU backend runs on omp_get_max_threads() OpenMP threads, or on as
 * many as the system lets it create (under an address-space limit, say),
 * never failing for want of threads.
 */
#ifndef ATTN_H
#define ATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(ATTN_SHARED_BUILD)
#define ATTN_API __declspec(dllexport)
#elif defined(__GNUC__)
#define ATTN_API __attribute__((visibility("default")))
#else
#define ATTN_API
#endif

#define ATTN_VERSION_MAJOR 0
#define ATTN_VERSION_MINOR 1
#define ATTN_VERSION_PATCH 0
#define ATTN_VERSION_STRING "0.1.0"

/* The largest head dimension every backend accepts. */
#define ATTN_MAX_HEAD_DIM 256

/* ------------------------------------------------------------------------ */
/* 1. Status codes                                                           */
/* ------------------------------------------------------------------------ */

/* One table gives the enum, the names and the messages, so they cannot drift
 * apart. X(NAME, value, message). */
#define ATTN_STATUS_MAP(X)                                                      \
  X(OK, 0, "success")                                                           \
  X(ENULL, 1, "a required pointer argument is NULL")                            \
  X(ESIZE, 2, "a size is zero or negative")                                     \
  X(EHEADDIM, 3, "the head dimension is above ATTN_MAX_HEAD_DIM")               \
  X(EHEADS, 4, "the query head count is not a multiple of the key/value heads") \
  X(ESHAPE, 5, "tensor shapes disagree")                                        \
  X(ESTRIDE, 6, "strides make tensor elements overlap")                         \
  X(EOVERFLOW, 7, "a size or offset overflows")                                 \
  X(ESEQLENS, 8, "cu_seqlens is malformed or disagrees with the tensors")       \
  X(EWINDOW, 9, "a window bound is below -1")                                   \
  X(ESCALAR, 10, "scale or softcap is negative, not finite or outside float32") \
  X(EDTYPE, 11, "dtypes disagree or are not supported")                         \
  X(EALIAS, 12, "an output shares memory with an input or another output")      \
  X(EALIBI, 13, "the ALiBi slopes are missing or of the wrong length")          \
  X(EBACKEND, 14, "unknown backend name")                                       \
  X(EUNAVAILABLE, 15, "the requested backend or device is not available")       \
  X(EUNSUPPORTED, 16, "the backend does not support this combination")          \
  X(ENOMEM, 17, "out of memory")                                                \
  X(EDEVICE, 18, "the device or its driver reported an error")                  \
  X(EBUILD, 19, "a device kernel failed to compile")                            \
  X(EBUFFER, 20, "a buffer belongs to another context or is too small")         \
  X(EINVAL, 21, "invalid argument")                                             \
  X(EINTERNAL, 22, "internal error")                                            \
  X(EBUSY, 23, "the context is in use by another call")                         \
  X(ECACHE, 24, "KV-cache lengths or block table entries are out of range")     \
  X(EIO, 25, "a file could not be read or written")

typedef enum attn_status {
#define ATTN__STATUS_ENUM(name, value, msg) ATTN_##name = value,
  ATTN_STATUS_MAP(ATTN__STATUS_ENUM)
#undef ATTN__STATUS_ENUM
} attn_status;

/* "ATTN_EALIAS" for ATTN_EALIAS; "ATTN_UNKNOWN" for a value not in the table. */
ATTN_API const char *attn_status_name(int status);
/* A short message for the code: the table's third column. */
ATTN_API const char *attn_strerror(int status);

/* ------------------------------------------------------------------------ */
/* 2. Backends and devices                                                   */
/* ------------------------------------------------------------------------ */

typedef enum attn_backend {
  ATTN_BACKEND_AUTO = 0, /* CUDA, else an OpenCL GPU, else the CPU */
  ATTN_BACKEND_CPU = 1,
  ATTN_BACKEND_OPENCL = 2,
  ATTN_BACKEND_CUDA = 3
} attn_backend;

/* "auto", "cpu", "opencl", "cuda". */
ATTN_API const char *attn_backend_name(attn_backend backend);

/* Whether the library was built with this backend (1) or not (0). */
ATTN_API int attn_backend_compiled(attn_backend backend);

/* The number of usable devices of a backend on this machine: 0 when the
 * backend was not built, or its runtime or driver is missing. The CPU always
 * has exactly one. A CUDA device this build has no code for (its compute
 * capability outside CMAKE_CUDA_ARCHITECTURES, SASS or PTX) is not usable:
 * it is not counted, and the others are numbered 0.. in CUDA's order. */
ATTN_API int attn_device_count(attn_backend backend);

/* Why a backend has no device, in one sentence ("" when it has some). */
ATTN_API const char *attn_backend_unavailable_reason(attn_backend backend);

typedef struct attn_device_info {
  attn_backend backend;
  int index;             /* the N of "backend:N" */
  int is_gpu;            /* 1 for a GPU or accelerator, 0 for a CPU */
  char name[128];        /* the device's own name */
  char version[128];     /* driver / API version, e.g. "OpenCL 3.0 CUDA" */
  uint64_t memory_bytes; /* global memory; 0 when unknown */
  int compute_major;     /* CUDA compute capability; 0 elsewhere */
  int compute_minor;
  int compute_units; /* multiprocessors, compute units or CPU threads */
} attn_device_info;

ATTN_API int attn_device_info_get(attn_backend backend, int index, attn_device_info *out);

/* ------------------------------------------------------------------------ */
/* 3. Contexts                                                               */
/* ------------------------------------------------------------------------ */

/* A context is bound to one backend and one device. */
typedef struct attn_context attn_context;

/* Creates a context from a specification: "auto", "cpu", "opencl", "cuda",
 * each optionally followed by ":N" for a device index ("cuda:1"). NULL or ""
 * means the environment variable ATTN_BACKEND, and "auto" when that is unset.
 *
 * Like sqlite3_open(), *out receives a context even when the call fails
 * (unless memory ran out, when it receives NULL), so that attn_errmsg() can
 * say why; such a context can only be asked for its message and freed. An
 * explicit choice that cannot be met is an error (ATTN_EUNAVAILABLE); there is
 * no silent fallback. An unknown name is ATTN_EBACKEND, and the message lists
 * the valid ones. */
ATTN_API int attn_context_create(const char *spec, attn_context **out);

/* Frees a context. Buffers created on it must be freed first. NULL is a no-op. */
ATTN_API void attn_context_free(attn_context *ctx);

/* The sentence describing the last failure on this context, or "" after a
 * success. Valid until the next call on the context. A call refused with
 * ATTN_EBUSY leaves it alone: it belongs to the call that was running. */
ATTN_API const char *attn_errmsg(const attn_context *ctx);

/* The backend and device the context got. */
ATTN_API attn_backend attn_context_backend(const attn_context *ctx);
ATTN_API int attn_context_device(const attn_context *ctx);
ATTN_API int attn_context_device_info(const attn_context *ctx, attn_device_info *out);

/* Work on a GPU runs on a queue: a cudaStream_t for CUDA, a cl_command_queue
 * for OpenCL (on the context's device). NULL restores the context's own,
 * which on CUDA is a blocking stream: it waits for work on the legacy
 * default stream (handle 0), so a caller who never sets a stream is safe.
 * Calls still return only after their work is complete, unless the flag
 * ATTN_ASYNC is set in attn_params.flags. The CPU takes only NULL. */
ATTN_API int attn_context_set_stream(attn_context *ctx, void *stream);

/* Waits for all work the context queued. */
ATTN_API int attn_context_synchronize(attn_context *ctx);

/* Runs a tiny element-wise kernel (C = A + B) on the context's device and
 * checks it, before any attention kernel: whether the device works at all. */
ATTN_API int attn_selftest(attn_context *ctx);

/* ------------------------------------------------------------------------ */
/* 4. Device buffers                                                         */
/* ------------------------------------------------------------------------ */

/* Memory on the context's device. On the CPU backend it is host memory; on
 * CUDA a device allocation; on OpenCL a cl_mem. */
typedef struct attn_buffer attn_buffer;

ATTN_API int attn_buffer_create(attn_context *ctx, size_t bytes, attn_buffer **out);

/* Wraps memory the caller already has on the context's device, without
 * copying or taking ownership: a host pointer for the CPU, a device pointer
 * (cast to void *) for CUDA, a cl_mem for OpenCL. attn_buffer_free() releases
 * only the wrapper. */
ATTN_API int attn_buffer_wrap(attn_context *ctx, void *native, size_t bytes, attn_buffer **out);

ATTN_API int attn_buffer_write(attn_context *ctx, attn_buffer *buf, size_t offset, const void *src,
                               size_t bytes);
ATTN_API int attn_buffer_read(attn_context *ctx, const attn_buffer *buf, size_t offset, void *dst,
                              size_t bytes);

/* The native handle: host pointer, device pointer or cl_mem. */
ATTN_API void *attn_buffer_native(const attn_buffer *buf);
ATTN_API size_t attn_buffer_size(const attn_buffer *buf);

/* NULL is a no-op. */
ATTN_API void attn_buffer_free(attn_buffer *buf);

/* ------------------------------------------------------------------------ */
/* 5. Tensors                                                                */
/* ------------------------------------------------------------------------ */

/* ATTN_I32 is for the index tensors of attn_params (seqused_k, block_table),
 * never for q, k, v or their gradients. */
typedef enum attn_dtype { ATTN_F32 = 0, ATTN_F16 = 1, ATTN_BF16 = 2, ATTN_I32 = 3 } attn_dtype;

/* "f32", "f16", "bf16", "i32". */
ATTN_API const char *attn_dtype_name(attn_dtype dtype);
ATTN_API size_t attn_dtype_size(attn_dtype dtype);

/* A description of memory, not an owner of it.
 *
 * q, k, v, o, do, dq, dk, dv:
 *   ndim 4, layout bshd: shape {batch, seqlen, heads, head_dim};
 *   ndim 3, layout varlen: shape {total_rows, heads, head_dim}, the sequences
 *   given by cu_seqlens in attn_params.
 * lse: float32, ndim 3 {batch, heads_q, seqlen_q} for bshd, ndim 2
 *   {heads_q, total_q} for varlen; or, with one more dimension of size 2 at
 *   the end ({batch, heads_q, seqlen_q, 2}, {heads_q, total_q, 2}), each row's
 *   lse as two floats: [0] is the lse rounded to float32, [1] what the
 *   rounding dropped (at most half an ulp of [0]). The backward pass computes
 *   exp(s - lse) for every score, so the rounding of a float32 lse enters
 *   every probability of the row: about 1e-4 relative at logits of 1e3 and
 *   6e-4 at 1e4, where naive float32 attention is exact to about 1e-7. With
 *   the second float, f32 gradients stay as exact as the naive ones at any
 *   logit size (attn_tensor_lse_hilo). f16/bf16 backward kernels round P to
 *   16 bits, which dwarfs the rounding of lse, and use [0] alone.
 *
 * stride[i] is in elements, for dimension i. Any strides are allowed as long
 * as no two elements share memory (so bhsd, or a slice of a fused qkv tensor,
 * works). attn_tensor_bshd() and friends fill contiguous strides.
 *
 * The memory is either host memory (data, with buffer NULL) or a device
 * buffer of the context (buffer, with offset in bytes and data NULL). Host
 * memory given to a GPU backend is staged through the device for the call.
 * Either way the address of the first element must be a multiple of the
 * element size (host data: ATTN_EINVAL; a buffer offset: ATTN_EBUFFER). */
typedef struct attn_tensor {
  void *data;
  attn_buffer *buffer;
  size_t offset;
  attn_dtype dtype;
  int ndim;
  int64_t shape[4];
  int64_t stride[4];
} attn_tensor;

/* Contiguous [batch, seqlen, heads, head_dim] in host memory. */
ATTN_API attn_tensor attn_tensor_bshd(void *data, attn_dtype dtype, int64_t batch, int64_t seqlen,
                                      int64_t heads, int64_t head_dim);
/* Contiguous [total_rows, heads, head_dim] in host memory. */
ATTN_API attn_tensor attn_tensor_varlen(void *data, attn_dtype dtype, int64_t total_rows,
                                        int64_t heads, int64_t head_dim);
/* Contiguous float32 lse: [batch, heads, seqlen] (varlen: batch 0 gives the
 * 2-d [heads, total_rows] form). */
ATTN_API attn_tensor attn_tensor_lse(float *data, int64_t batch, int64_t heads, int64_t seqlen);
/* The same with each row's lse as a float32 pair (hi, lo), 2 * batch * heads
 * * seqlen floats: {batch, heads, seqlen, 2} (varlen: batch 0 gives
 * {heads, total_rows, 2}). Gradients stay exact at large logits (see lse
 * above); hi alone is the plain lse. */
ATTN_API attn_tensor attn_tensor_lse_hilo(float *data, int64_t batch, int64_t heads,
                                          int64_t seqlen);
/* Contiguous 1-d [n] and 2-d [rows, cols] tensors in host memory: sinks,
 * seqused_k, block tables. */
ATTN_API attn_tensor attn_tensor_1d(void *data, attn_dtype dtype, int64_t n);
ATTN_API attn_tensor attn_tensor_2d(void *data, attn_dtype dtype, int64_t rows, int64_t cols);
/* A contiguous bias (see attn_params.bias) [batch, heads, seqlen_q, seqlen_k];
 * give 1 for a dimension that broadcasts. */
ATTN_API attn_tensor attn_tensor_bias(void *data, attn_dtype dtype, int64_t batch, int64_t heads,
                                      int64_t seqlen_q, int64_t seqlen_k);
/* The same tensor moved to a device buffer at a byte offset. */
ATTN_API attn_tensor attn_tensor_on(attn_tensor t, attn_buffer *buffer, size_t offset);

/* ------------------------------------------------------------------------ */
/* 6. Parameters                                                             */
/* ------------------------------------------------------------------------ */

/* attn_params.flags */
#define ATTN_CAUSAL 0x1u        /* keys after the bottom-right-aligned diagonal are hidden */
#define ATTN_DETERMINISTIC 0x2u /* backward: bit-identical gradients run to run */
#define ATTN_ALLOW_TF32 0x8u    /* f32 forward: products may round operands to TF32 */
#define ATTN_ASYNC 0x10u        /* GPU: return once queued (device tensors only) */
/* Bit 0x4 is retired; any bit not named here is ATTN_EINVAL.
 *
 * Without ATTN_ALLOW_TF32, f32 is computed in float32. With it, the CUDA
 * backend may run an f32 forward pass on the tensor cores in TF32 (compute
 * capability 8.0 and later, head dims 32, 64, 96, 128 and 256, rows 16-byte
 * aligned): Q K^T and P V round their operands to TF32's 10-bit mantissa
 * (unit roundoff 2^-11, as f16's; float32's is 2^-24) and accumulate in
 * float32, and the softmax stays float32. A score then moves by up to about
 * 2^-11 times the sum of |q_c k_c| scale, so o and lse come near f16
 * attention's accuracy, not float32's, and large logits lose the most (a
 * score of 1e3 by up to ~0.5). The golden README states the tolerance TF32
 * is held to. On Hopper GPUs (dense problems, head dims 64, 96, 128, 256) the
 * backend's workspace then also holds TF32 copies of q, k and v. A problem
 * TF32 does not cover, every other backend, and the backward pass (it
 * reads the o and lse it is given) compute in float32 whatever the flag. */

typedef struct attn_params {
  /* sizeof(attn_params) as the caller's attn.h has it, set by
   * attn_params_init(). Fields added to the end in later versions take their
   * defaults for a caller built before them; a caller built against a later
   * version runs here as long as the fields this version lacks keep their
   * defaults (zero). Any other size is ATTN_EINVAL. */
  size_t size;
  /* Scores are scale * dot(q, k); 0 means 1/sqrt(head_dim). Scale and
   * softcap are used in float32: a value that rounds to inf there, or a
   * positive one that rounds to 0, is ATTN_ESCALAR. */
  double scale;
  unsigned flags;
  /* Sliding window: key j is visible to row i when
   * diag - window_left <= j <= diag + window_right, diag = i + Nk - Nq.
   * -1 means no bound, and so does any bound at least as long as the
   * sequences (window_left >= Nk, window_right >= Nq), up to INT64_MAX.
   * ATTN_CAUSAL is the same as window_right = 0. */
  int64_t window_left;
  int64_t window_right;
  /* s = softcap * tanh(s / softcap) when softcap > 0. */
  double softcap;
  /* ALiBi: one slope per query head (host memory; in a device buffer:
   * alibi_slopes_tensor below), or NULL for none;
   * s -= slope[h] * |diag - j|. A NaN or infinite slope is ATTN_EALIBI; any
   * finite one is accepted, and one so large that scores overflow float32
   * gives NaN rows, as NaN inputs do (see attn_forward). */
  const float *alibi_slopes;
  int64_t alibi_count;
  /* Variable-length batches (tensors of ndim 3): batch + 1 offsets each, in
   * host memory (in a device buffer: cu_seqlens_*_tensor below); sequence b
   * is rows cu[b] .. cu[b+1]-1. NULL for bshd. */
  const int32_t *cu_seqlens_q;
  const int32_t *cu_seqlens_k;
  int64_t batch;

  /* --- Inference over a KV cache (forward only). The tensors here may be
   * in host memory or in device buffers of the context, like q; on the
   * device, a GPU call reads them there (no round trip to the host, so it can
   * be captured in a CUDA graph) and out-of-range entries are clamped, not
   * reported: host memory is where they are checked (ATTN_ECACHE). --- */

  /* Keys used per sequence, int32 [batch]: k and v then hold a capacity (their
   * seqlen; varlen: each sequence's cu_seqlens_k length; paged: max_pages *
   * page_size) of which sequence b uses the first seqused_k[b] rows, plus the
   * rows appended below. Causal alignment and windows take that length as
   * Nk. NULL: every row. */
  const attn_tensor *seqused_k;
  /* Rows appended to the cache in the same call, [batch, seqlen_new,
   * heads_kv, head_dim] in q's dtype (needs seqused_k): they are written into
   * k and v at rows seqused_k[b] .. seqused_k[b] + seqlen_new - 1 (k and v are
   * updated in place, so there they are outputs too), and the call then
   * attends to seqused_k[b] + seqlen_new keys. seqused_k itself is left as it
   * was: the caller advances it. */
  const attn_tensor *k_new;
  const attn_tensor *v_new;
  /* Paged K/V: k and v are [pages, page_size, heads_kv, head_dim], any page
   * size from 1 up, and key row j of sequence b is row j % page_size of page
   * block_table[b][j / page_size]; int32 [batch, max_pages]. q is bshd or
   * varlen as usual (varlen: params.batch sequences). NULL: not paged. */
  const attn_tensor *block_table;
  /* Key splitting (flash-decoding): each row's keys are cut into this many
   * parts computed in parallel (GPU blocks, CPU threads) and merged by their
   * lse. 0 lets the backend choose (it splits when the rows alone cannot fill
   * the device); 1 never splits; N >= 2 asks for N (fewer when there are
   * fewer key blocks). Results agree within rounding whatever the choice. */
  int num_splits;

  /* --- Score terms (forward and backward) --- */

  /* Additive bias, f32, f16 or bf16, [batch, heads_q, seqlen_q, seqlen_k]
   * (varlen: the longest sequences, or the tensors' rows where cu_seqlens
   * is on the device; with seqused_k or pages, the capacity):
   * score += bias[b][h][i][j] after scale, softcap and ALiBi. Any of the first
   * three dimensions may have size 1: it broadcasts. A -inf entry hides its
   * key, and a row all of whose visible scores are -inf is a row that sees no
   * key (o = 0, lse = -inf). Write masks as -inf: a row whose every score
   * is a huge finite value (below about -2^31, such as bf16's lowest) is
   * beyond float32's softmax on CUDA's tensor-core kernels, whose result
   * for it is undefined (0 or NaN); the other kernels give its softmax. */
  const attn_tensor *bias;
  /* Backward output, float32, of the bias's shape: d(loss)/d(bias), summed
   * over the dimensions that broadcast. NULL: not wanted. */
  const attn_tensor *dbias;
  /* Attention sinks, float32 [heads_q]: one logit per query head that joins
   * every row's softmax denominator and carries no value:
   * lse = log(exp(sink) + sum_j exp(s_j)), o = sum_j exp(s_j - lse) v_j. A row
   * that sees no key then has o = 0 and lse = sink. */
  const attn_tensor *sinks;
  /* Backward output, float32 [heads_q]: d(loss)/d(sink). NULL: not wanted. */
  const attn_tensor *dsinks;

  /* --- Metadata as tensors (forward and backward) ---
   * cu_seqlens_q, cu_seqlens_k and alibi_slopes above are host pointers.
   * These give the same values as contiguous tensors instead, int32 [batch +
   * 1] and float32 [heads_q]; set one form of each, not both. In host memory
   * they are checked as the pointers are. In a device buffer of the context,
   * a GPU call reads them there, with no copy through the host (the call can
   * be captured in a CUDA graph), and nothing checks them: offsets are
   * clamped into the tensors' rows (a malformed entry shortens sequences, it
   * never reads or writes outside them) and a non-finite slope gives NaN
   * rows. The host then does not know the longest sequence: the launch
   * covers every row of the tensor for each sequence and blocks past a
   * sequence's end return at once. Appending (k_new) to a varlen cache needs
   * cu_seqlens_k in host memory, where each sequence's room is checked. */
  const attn_tensor *cu_seqlens_q_tensor;
  const attn_tensor *cu_seqlens_k_tensor;
  const attn_tensor *alibi_slopes_tensor;
} attn_params;

/* Defaults: size set, scale 0 (1/sqrt(d)), no flags, no window, no softcap,
 * no ALiBi, no cache, no bias, no sinks, splits chosen. Every attn_params
 * starts here. */
ATTN_API void attn_params_init(attn_params *p);

/* ------------------------------------------------------------------------ */
/* 7. Forward and backward                                                   */
/* ------------------------------------------------------------------------ */

/* o = softmax(mask(q k^T * scale)) v, written in the dtype of q; lse (may be
 * NULL) receives the natural-log sum of exp of each row's final scores. A row
 * that sees no key gets o = 0 and lse = -inf. Whether a row sees a key is
 * decided by the mask alone (causal, window, sequence lengths), never by the
 * values: a row that sees a key whose score is NaN or +inf (a NaN or inf in
 * q or k, or a score that overflows float32) gets o and lse NaN, on every
 * backend. A score of -inf from the inputs, in a row with a finite score,
 * weighs nothing, as in float32's softmax (exp(-inf) = 0). */
ATTN_API int attn_forward(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                          const attn_tensor *k, const attn_tensor *v, const attn_tensor *o,
                          const attn_tensor *lse);

/* Gradients of sum(o * dout) with respect to q, k and v, from the forward
 * pass's o and lse. dq, dk, dv are written in the dtype of q. With GQA, dk and
 * dv sum over the query heads sharing a key/value head. A row whose o or lse
 * is NaN gives NaN in its dq and in the dk and dv of the keys it sees; as the
 * backends multiply whole tiles, gradients of other keys and rows of the same
 * tile may be NaN too (0 * NaN). */
ATTN_API int attn_backward(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                           const attn_tensor *k, const attn_tensor *v, const attn_tensor *o,
                           const attn_tensor *lse, const attn_tensor *dout, const attn_tensor *dq,
                           const attn_tensor *dk, const attn_tensor *dv);

/* Whether the context's backend can run this problem (forward, or backward
 * when backward is non-zero): ATTN_OK, ATTN_EUNSUPPORTED with the reason in
 * attn_errmsg(), or the validation error the call itself would return.
 * o and lse may be NULL here. The answer is the call's own decision of which
 * kernel runs: after ATTN_OK the call does not answer ATTN_EUNSUPPORTED.
 * Deciding may build the kernels (OpenCL), so it can also fail as the call
 * would (ATTN_EBUILD, ATTN_EDEVICE); ATTN_DEBUG=1 logs what was chosen. */
ATTN_API int attn_supports(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                           const attn_tensor *k, const attn_tensor *v, int backward);

/* ------------------------------------------------------------------------ */
/* 8. Merging partial results                                                */
/* ------------------------------------------------------------------------ */

/* Combines n results of the same rows, each computed over a part of the keys
 * (by attn_forward with lse, on other devices or in other calls), into the
 * result over all of them:
 *     lse = log(sum_s exp(lse_s)),   o = sum_s exp(lse_s - lse) o_s.
 * o_parts[s] are shaped like o (bshd or varlen, one dtype), lse_parts[s] like
 * lse (plain float32 form), both arrays of n tensors; lse may be NULL. A part
 * whose row has lse -inf adds nothing; a row that is -inf in every part gets
 * o = 0 and lse = -inf. n is 1 to ATTN_MAX_MERGE. */
#define ATTN_MAX_MERGE 256
ATTN_API int attn_merge(attn_context *ctx, int n, const attn_tensor *o_parts,
                        const attn_tensor *lse_parts, const attn_tensor *o, const attn_tensor *lse);

/* ------------------------------------------------------------------------ */
/* 9. Tuning                                                                 */
/* ------------------------------------------------------------------------ */

/* Measures the context's kernel configurations for dtype and head_dim on its
 * device, forward and backward over one sequence of seqlen rows and 8 heads
 * (0: 1024 rows), and keeps the fastest: for this context at once, and for
 * every later context on the same device and driver. The OpenCL backend
 * tries variations of its tiles table's row for the device's class and
 * stores the winner beside its program cache (ATTN_CL_CACHE_DIR; with
 * ATTN_CL_CACHE=0, for this context only); every variation is compiled, so
 * this takes seconds to minutes. The CPU backend tries its tiles (query
 * and key rows per block) and stores the winner in the same folder, for
 * this CPU model, OpenMP thread count and OpenBLAS kernel set.
 * ATTN_EUNSUPPORTED where the backend has nothing to tune (CUDA: its table
 * is fixed when the library is built). ATTN_EIO when the result cannot be
 * stored.
 * ATTN_DEBUG=1 logs each measurement. */
ATTN_API int attn_tune(attn_context *ctx, attn_dtype dtype, int64_t head_dim, int64_t seqlen);

#ifdef __cplusplus
}
#endif
#endif /* ATTN_H */
