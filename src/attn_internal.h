/*
 * The core's private interface: what src/ shares with the backends in cpu/,
 * cl/ and cuda/. Nothing here is public API. A backend depends on this header
 * and on attn.h, and on nothing in another backend's folder.
 */
#ifndef ATTN_INTERNAL_H
#define ATTN_INTERNAL_H

#include "attn.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#ifndef __cplusplus
#include <stdatomic.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define ATTN__PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define ATTN__PRINTF(f, a)
#endif

/* ---------------------------------------------------------------------- */
/* The normalized problem a backend receives                                */
/* ---------------------------------------------------------------------- */

/* One operand, already validated. native is what attn__backend.buffer_alloc
 * returned (a host pointer on the CPU, a device pointer as void * on CUDA, a
 * cl_mem on OpenCL) and offset is in bytes from it. Strides are in elements.
 *
 * Row r of head h of sequence b lives at element
 *     b * sb + (row0(b) + r) * ss + h * sh + c * sd
 * where row0(b) is cu_seqlens[b] for varlen problems (and sb is then 0) and 0
 * for bshd. For lse, the same formula holds with c = 0 (lse has no column):
 * bshd lse [B, Hq, Nq] gives sb = Hq*Nq, sh = Nq, ss = 1; varlen lse
 * [Hq, total_q] gives sb = 0, sh = total_q, ss = 1. A (hi, lo) lse keeps
 * lo at sd past hi (see attn__problem.lse_hilo). */
typedef struct attn__tensor {
  void *native;
  size_t offset;
  attn_dtype dtype;
  int64_t sb, ss, sh, sd;
  /* Host memory that a device backend receives staged (src/api.c): a fresh
   * buffer at offset 0, so its base is aligned whatever the host address.
   * A plan, made before the staging, judges alignment by this. */
  int staged;
} attn__tensor;

typedef struct attn__problem {
  attn_dtype dtype; /* of q, k, v, o, do, dq, dk, dv (lse is f32) */
  int64_t batch;    /* sequences */
  int64_t heads_q;  /* Hq */
  int64_t heads_kv; /* Hkv; Hq % Hkv == 0 */
  int64_t head_dim; /* d, 1..ATTN_MAX_HEAD_DIM */
  int64_t seqlen_q; /* bshd: Nq; varlen: the longest query sequence */
  int64_t seqlen_k; /* bshd: Nk; varlen: the longest key sequence */
  int64_t total_q;  /* rows of q over all sequences */
  int64_t total_k;
  int varlen;           /* q is [total_q, heads, d], its sequences given by cu_seqlens */
  const int32_t *cu_q; /* host memory, batch + 1 entries; NULL for bshd or on the device */
  const int32_t *cu_k; /* NULL too for a paged cache */
  /* cu_seqlens and the ALiBi slopes where they live in a device buffer
   * (attn_params' *_tensor fields on a GPU): native set, contiguous, nothing
   * in them checked, and the host pointers (cu_q, cu_k, alibi) NULL. Then
   * seqlen_q and seqlen_k are the tensors' rows, bounds of every sequence. */
  attn__tensor cu_q_dev, cu_k_dev, alibi_dev;
  float scale;   /* resolved: never 0 */
  float softcap; /* 0 = off */
  /* Causal is folded in: window_right is 0 when causal (or smaller when
   * the caller's window was already tighter). -1 = unbounded. */
  int64_t window_left;
  int64_t window_right;
  int causal;         /* informational; the window already says it */
  const float *alibi; /* host memory, heads_q slopes; NULL = none (or alibi_dev) */
  int deterministic;  /* backward: 1 = no atomics, fixed reduction order */
  int allow_tf32;     /* f32 forward: products may round their operands to TF32 */
  int async;
  int has_lse; /* forward: whether lse is wanted */
  /* lse holds (hi, lo) pairs: lo at element + lse.sd (attn_tensor_lse_hilo);
   * 0 for a plain float32 lse, whose sd is then 0. */
  int lse_hilo;
  attn__tensor q, k, v, o, lse;
  attn__tensor dout, dq, dk, dv; /* backward only */

  /* KV cache (forward only; attn_params' inference fields). With seqused_k,
   * sequence b attends to seqused_k[b] + seqlen_new keys of a capacity of
   * seqlen_k (bshd, paged) or its cu_seqlens_k length (varlen). */
  int has_seqused;
  attn__tensor seqused_k; /* int32, entry b at b * sb */
  /* The caller's host copy (validated), or NULL where seqused_k lives on the
   * device: only then may the host read lengths. */
  const int32_t *seqused_host;
  int64_t seqlen_new;            /* rows appended per sequence; 0 = none */
  attn__tensor k_new, v_new;     /* bshd strides, like k */
  int64_t page_size;             /* 0 = not paged */
  int64_t num_pages;             /* pages in k and v */
  int64_t max_pages;             /* block_table columns */
  attn__tensor block_table;      /* int32, entry [b][p] at b * sb + p * ss */
  const int32_t *block_host;     /* like seqused_host */
  int num_splits;                /* 0 = the backend chooses, 1 = none, N */

  /* Score terms. bias: entry [b][h][i][j] at b * sb + h * sh + i * ss + j * sd,
   * a broadcast dimension having stride 0. dbias likewise (float32, the same
   * broadcast). sinks, dsinks: float32, head h at h * sh. */
  int has_bias, has_dbias, has_sinks, has_dsinks;
  attn__tensor bias, dbias, sinks, dsinks;
} attn__problem;

/* attn_merge's problem: n parts of rows [batch][seqlen][heads] (varlen:
 * batch 1, seqlen the total rows, sb 0), o and lse addressed as in
 * attn__problem. */
typedef struct attn__merge {
  int n;
  attn_dtype dtype;
  int64_t batch, seqlen, heads, head_dim;
  attn__tensor *o_parts, *lse_parts; /* n each */
  attn__tensor o, lse;
  int has_lse;
} attn__merge;

/* The rules over these (sequence lengths, visibility, scores) are in
 * rules.h. */

/* ---------------------------------------------------------------------- */
/* Scalars                                                                  */
/* ---------------------------------------------------------------------- */

static inline float attn__bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Round to nearest even; NaN stays NaN. */
static inline uint16_t attn__f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float attn__f16_to_f32(uint16_t h);
uint16_t attn__f32_to_f16(float f);

/* Element i of host memory holding dtype dt, as a float, and back (rounded
 * to nearest even). For the reference, the program and the tests: the
 * backends convert tile by tile in their own ways. */
static inline float attn__load(const void *base, attn_dtype dt, int64_t i) {
  switch (dt) {
    case ATTN_F16:
      return attn__f16_to_f32(((const uint16_t *)base)[i]);
    case ATTN_BF16:
      return attn__bf16_to_f32(((const uint16_t *)base)[i]);
    case ATTN_I32:
      return (float)((const int32_t *)base)[i];
    case ATTN_F32:
      break;
  }
  return ((const float *)base)[i];
}
static inline void attn__store(void *base, attn_dtype dt, int64_t i, float x) {
  switch (dt) {
    case ATTN_F16:
      ((uint16_t *)base)[i] = attn__f32_to_f16(x);
      return;
    case ATTN_BF16:
      ((uint16_t *)base)[i] = attn__f32_to_bf16(x);
      return;
    case ATTN_I32:
      ((int32_t *)base)[i] = (int32_t)x;
      return;
    case ATTN_F32:
      break;
  }
  ((float *)base)[i] = x;
}

/* ---------------------------------------------------------------------- */
/* Contexts, errors, buffers                                                */
/* ---------------------------------------------------------------------- */

typedef struct attn__backend attn__backend;

/* What the environment asks for (src/env.c, the library's one reader of
 * it). Strings are empty when the variable is unset. */
typedef struct attn__settings {
  int debug;               /* ATTN_DEBUG set and not "0": log to stderr */
  char *backend;           /* ATTN_BACKEND, the backend when none is named:
                            * a copy of any length, NULL when unset */
  int backend_nomem;       /* set, but no memory for the copy */
  char cl_library[1024];   /* ATTN_CL_LIBRARY: the OpenCL library to load */
  int cl_library_too_long; /* ATTN_CL_LIBRARY did not fit in cl_library */
  int cl_cache;            /* 0 when ATTN_CL_CACHE=0 or there is no folder */
  char cl_cache_dir[1024]; /* ATTN_CL_CACHE_DIR, $XDG_CACHE_HOME/attn or
                            * $HOME/.cache/attn */
} attn__settings;

/* Reads them now; and the process's copy, read once, for what is needed
 * before a context exists (the debug log, the OpenCL loader). */
void attn__settings_read(attn__settings *out);
void attn__settings_free(attn__settings *s);
const attn__settings *attn__settings_process(void);

struct attn_context {
  const attn__backend *backend; /* NULL for a context whose creation failed */
  int device;
  void *impl;              /* the backend's per-context state */
  attn__settings settings; /* read at creation */
  char errmsg[2048];
#ifndef __cplusplus
  /* 1 while a call is inside (src/api.c), so that a second thread's call is
   * refused with ATTN_EBUSY. Last, and left out of C++ (the CUDA files),
   * which never touches it: C11 atomics are not C++'s. */
  atomic_int busy;
#endif
};

struct attn_buffer {
  attn_context *ctx;
  void *native;
  size_t bytes;
  int owned; /* 0 for attn_buffer_wrap() */
};

/* Records a sentence for ctx (ctx may be NULL) and returns status. */
int attn__error(attn_context *ctx, int status, const char *fmt, ...) ATTN__PRINTF(3, 4);
/* A log line on stderr when ATTN_DEBUG is set to a non-zero value. */
void attn__debug(const char *fmt, ...) ATTN__PRINTF(1, 2);

/* ---------------------------------------------------------------------- */
/* The backend interface                                                    */
/* ---------------------------------------------------------------------- */

/* What a backend decided to run for one problem. kernel is the backend's
 * own enum of kernel families and config a row of its tuning table (a
 * traits struct, static or cached per device, so the pointer outlives the
 * call); the core reads only name and workspace. */
typedef struct attn__plan {
  int backward;
  int kernel;
  const void *config;
  const char *name; /* the family and tiles in words, for ATTN_DEBUG */
  size_t workspace; /* device scratch bytes beyond the operands */
} attn__plan;

/* A backend is this table plus the state it hangs on ctx->impl. Functions
 * report failures through attn__error(ctx, ...) and return its status. The
 * core validates every argument before calling plan/forward/backward, so
 * a backend sees only well-formed problems. */
struct attn__backend {
  attn_backend kind;
  const char *name;
  /* 1 when native handles are host pointers (the CPU): host tensors are then
   * passed straight through, with no staging. */
  int host_memory;

  /* Devices present; 0 and a sentence in why when the runtime or driver is
   * missing. Called more than once: cache the probe. Must not fail hard on a
   * machine without the backend's runtime. */
  int (*device_count)(char *why, size_t why_len);
  int (*device_info)(int index, attn_device_info *out);

  /* Binds ctx to device `index` (already range-checked), setting ctx->impl. */
  int (*open)(attn_context *ctx, int index);
  void (*close)(attn_context *ctx);

  int (*buffer_alloc)(attn_context *ctx, size_t bytes, void **native);
  void (*buffer_release)(attn_context *ctx, void *native);
  int (*buffer_write)(attn_context *ctx, void *native, size_t offset, const void *src,
                      size_t bytes);
  int (*buffer_read)(attn_context *ctx, void *native, size_t offset, void *dst, size_t bytes);
  /* attn_buffer_wrap(): ATTN_EBUFFER with a sentence when native is not
   * memory of the context's device holding `bytes` bytes. NULL where the
   * backend cannot tell (a host pointer). */
  int (*buffer_check)(attn_context *ctx, void *native, size_t bytes);

  int (*set_stream)(attn_context *ctx, void *stream); /* NULL restores the default */
  int (*synchronize)(attn_context *ctx);
  int (*selftest)(attn_context *ctx);

  /* The one decision of what runs (ggml's "best kernel"): ATTN_OK with *out
   * filled, or ATTN_EUNSUPPORTED with a sentence. attn_supports() is this
   * call; attn_forward() and attn_backward() make it once and hand *out to
   * forward/backward, which run exactly that plan and never answer
   * ATTN_EUNSUPPORTED. Looks at the problem's shape, never at its memory:
   * host tensors are not staged yet. */
  int (*plan)(attn_context *ctx, const attn__problem *pb, int backward, attn__plan *out);
  int (*forward)(attn_context *ctx, const attn__problem *pb, const attn__plan *plan);
  int (*backward)(attn_context *ctx, const attn__problem *pb, const attn__plan *plan);
  /* Writes k_new and v_new into the cache (pb->seqlen_new > 0), before
   * forward runs on the same queue. */
  int (*append)(attn_context *ctx, const attn__problem *pb);
  /* attn_merge(), validated. */
  int (*merge)(attn_context *ctx, const attn__merge *m);
  /* attn_tune() (src/tune.c measures): how many configurations the backend
   * has to try for (dtype, head_dim), 0 for none; tune_use makes
   * configuration i the context's (ATTN_EUNSUPPORTED: it does not fit the
   * device, skip it); tune_keep makes it the device's choice, for this
   * context and later ones. NULL where the backend tunes nothing. */
  int (*tune_count)(attn_context *ctx, attn_dtype dtype, int64_t head_dim);
  int (*tune_use)(attn_context *ctx, attn_dtype dtype, int64_t head_dim, int i);
  int (*tune_keep)(attn_context *ctx, attn_dtype dtype, int64_t head_dim, int i);
};

/* Each backend folder defines one of these; the registry in src/backend.c
 * lists those that were built, CPU last. */
extern const attn__backend attn__backend_cpu;
#ifdef ATTN_HAVE_OPENCL
extern const attn__backend attn__backend_opencl;
#endif
#ifdef ATTN_HAVE_CUDA
extern const attn__backend attn__backend_cuda;
#endif

/* attn_forward() and attn_backward() for a caller already inside the
 * context (src/api.c; attn_tune's measurements), and attn_tune's body
 * (src/tune.c). */
int attn__forward(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                  const attn_tensor *k, const attn_tensor *v, const attn_tensor *o,
                  const attn_tensor *lse);
int attn__backward(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                   const attn_tensor *k, const attn_tensor *v, const attn_tensor *o,
                   const attn_tensor *lse, const attn_tensor *dout, const attn_tensor *dq,
                   const attn_tensor *dk, const attn_tensor *dv);
int attn__tune(attn_context *ctx, attn_dtype dtype, int64_t head_dim, int64_t seqlen);

/* The registry (src/backend.c): the backend of a kind if it was built, and
 * opening ctx on the backend a specification ("cuda:1", NULL for
 * ATTN_BACKEND) selects. */
const attn__backend *attn__backend_find(attn_backend kind);
int attn__backend_open(attn_context *ctx, const char *spec);

/* Validation (src/problem.c): checks every argument and fills pb. What says
 * which tensors are required; attn_supports validates for the forward
 * (ATTN__SUPPORTS) or the backward (ATTN__SUPPORTS_BACKWARD), refusing what
 * that call refuses: */
enum attn__op {
  ATTN__FORWARD,
  ATTN__BACKWARD,
  ATTN__SUPPORTS,
  ATTN__REFERENCE,
  ATTN__SUPPORTS_BACKWARD
};
/* The caller's attn_params (p not NULL) as this version knows it: the
 * fields of its version over the defaults, or ATTN_EINVAL for a size no
 * version has had. Read the caller's struct only through this. */
int attn__params_read(attn_context *ctx, const attn_params *p, attn_params *out);
int attn__problem_build(attn_context *ctx, enum attn__op op, const attn_params *p,
                        const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                        const attn_tensor *o, const attn_tensor *lse, const attn_tensor *dout,
                        const attn_tensor *dq, const attn_tensor *dk, const attn_tensor *dv,
                        attn__problem *pb);
/* The optional features a problem uses, as bits: a plan declines those its
 * kernels lack with attn__decline_features (ATTN_EUNSUPPORTED, naming the
 * first). */
enum {
  ATTN__USES_SEQUSED = 1u << 0,
  ATTN__USES_PAGED = 1u << 1,
  ATTN__USES_APPEND = 1u << 2,
  ATTN__USES_BIAS = 1u << 3,
  ATTN__USES_SINKS = 1u << 4,
  ATTN__USES_DBIAS = 1u << 5,
  ATTN__USES_DSINKS = 1u << 6
};
unsigned attn__problem_uses(const attn__problem *pb);
int attn__decline_features(attn_context *ctx, const char *who, unsigned missing);

/* attn_merge()'s arguments; m->o_parts and m->lse_parts are malloc'ed (free
 * them) when it returns ATTN_OK. */
int attn__merge_build(attn_context *ctx, int n, const attn_tensor *o_parts,
                      const attn_tensor *lse_parts, const attn_tensor *o, const attn_tensor *lse,
                      attn__merge *m);

#ifdef __cplusplus
}
#endif
#endif /* ATTN_INTERNAL_H */
