/*
 * What the suites share: one test body run on every backend (the ggml
 * test-backend-ops idea), problems with random inputs in any layout, and the
 * checks every output must pass.
 *
 * A suite lists its tests as at_test entries and calls at_main(). Each test
 * runs once per backend (cpu, opencl, cuda) on a context shared by the
 * backend's group; on a backend that is absent, or left out by
 * ATTN_TEST_BACKENDS=cpu,opencl, it is reported SKIPPED with the reason.
 * Tests that do not depend on a backend are listed separately ("common").
 *
 * Command line: --backend NAME (repeatable) and --common pick the groups
 * (default: all); --filter PATTERN passes a name filter to cmocka. The
 * program exits 77 when nothing ran because everything was skipped, so ctest
 * shows the entry as skipped.
 */
#ifndef ATTN_TESTUTIL_H
#define ATTN_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "attn.h"
#include "attn_internal.h"
#include "ref.h"

typedef struct at_backend {
  attn_backend kind;
  const char *name; /* "cpu", "opencl", "cuda"; "common" for the common group */
  int present;      /* has a device and is selected */
  char why[512];    /* why it is not present */
  attn_context *ctx;
  int small; /* keep problems few and small: a slow device (PoCL compiles kernels slowly) */
} at_backend;

typedef void (*at_fn)(at_backend *b);

typedef struct at_test {
  const char *name;
  at_fn fn;
  const void *arg;
} at_test;

#define AT_TEST(f) \
  { #f, f, NULL }

/* The arg of the running test's entry (tests made at run time, e.g. one per golden case). */
const void *at_arg(void);

int at_main(int argc, char **argv, const char *suite, const at_test *tests, size_t ntests,
            const at_test *common, size_t ncommon);

/* Makes an OpenCL context run the GPU-class kernels (attn_fwd, bwd.cl) for
 * every dtype and head dim, whatever its device's class (cl_tiles.c): the
 * suites do so under ATTN_TEST_CL_TILES (spec: "1", or bwd.cl's tiles as
 * "BQ,BK,BTM,BDK,BJK"). How many configs it switched: 0 on a GPU device,
 * and where the OpenCL backend is not built. */
int at_cl_force_tiles(attn_context *ctx, const char *spec);
/* The OpenCL device's NVIDIA compute capability (major * 10 + minor; 0
 * elsewhere, and on other backends), whether the plan gives (dtype,
 * head_dim) the tensor-core forward there (fwd_mma.cl; -1: no config), and
 * every tensor-core config of the context replaced by the portable one, as
 * when the driver cannot build it (returns how many). tests/cl_tiles.c. */
int at_cl_nv_cc(attn_context *ctx);
int at_cl_fwd_mma(attn_context *ctx, attn_dtype dtype, int64_t head_dim);
int at_cl_portable(attn_context *ctx);

/* Skips the running test with a reason (shown by cmocka). */
#define at_skip(...)           \
  do {                         \
    at_note_skip(__VA_ARGS__); \
    skip();                    \
  } while (0)
void at_note_skip(const char *fmt, ...);

/* Memory of the running test. What a test leaves allocated, because it
 * failed or skipped halfway (cmocka leaves by longjmp), the runner frees, so
 * that LeakSanitizer reports only real leaks. */
void *at_malloc(size_t bytes);
/* A whole file, read by the test kit's reader, with a NUL after its bytes
 * (text can be searched as a string); *len excludes the NUL. NULL when it
 * cannot be opened or is not a regular file; a failed read fails the test.
 * at_free it. */
unsigned char *at_read_file(const char *path, size_t *len);
/* Writes len bytes to path, replacing the file; fails the test if it cannot. */
void at_write_file(const char *path, const void *data, size_t len);
void *at_calloc(size_t n, size_t size);
void at_free(void *p);

/* The golden folder: $ATTN_GOLDEN_DIR, else the build's default (the cache
 * variable ATTN_GOLDEN_DIR, tests/golden/cases in the source tree). */
const char *at_golden_dir(void);

/* Whether msg names `word` as a whole token (letters, digits and '_' around it
 * do not count), e.g. "k" in "k: head_dim 8 differs" but not in "kv". */
int at_mentions(const char *msg, const char *word);

/* Sets or unsets (value NULL) an environment variable for one test, saving
 * the old value; at_env_restore() puts everything back. */
void at_env_set(const char *name, const char *value);
void at_env_restore(void);

/* Runs this program again as `PROGRAM --child MODE` in a fresh process (fork
 * and exec: nothing probed or cached in this process carries over), with the
 * environment changed by env: "NAME=VALUE" sets, "NAME" unsets; NULL ends
 * the list. Returns the exit status, or 128 + the signal that killed it; what
 * it printed goes to out. Suites dispatch "--child MODE" themselves. */
int at_child(const char *mode, const char *const *env, char *out, size_t outlen);

/* What a child (above) may run: a forward of f32 q, k and v [1, n, h, d],
 * random from seed, on ctx against the double reference. 0 when every
 * element of o is within 1e-5 of it; 1 after a line on stdout saying what
 * went wrong. */
int at_child_forward(attn_context *ctx, int n, int h, int d, uint32_t seed);

/* Whether a child's debug log (ATTN_DEBUG=1) shows its OpenCL context on
 * another device than the one named `name`: the test then skips. A driver may
 * keep its device from child processes while the parent holds a context
 * (NVIDIA's OpenCL does on the H200 machine): "opencl:N" then names another
 * device in the child, which tests something else. */
int at_child_elsewhere(const char *log, const char *name);

/* ---------------------------------------------------------------------- */
/* Random problems                                                          */
/* ---------------------------------------------------------------------- */

typedef enum {
  AT_BSHD,    /* contiguous [B, S, H, d] */
  AT_BHSD,    /* [B, H, S, d] memory, described with strides */
  AT_QKV,     /* q, k, v slices of one fused [B, S, 3, H, d] tensor (needs Hq == Hkv, Nq == Nk) */
  AT_PAD,     /* head dim padded to d + 3 in memory; the padding must stay untouched */
  AT_DSTRIDE, /* head-dim stride 2: element c at 2c */
  AT_MIXED,   /* each tensor its own: q bshd, k bhsd, v dstride, o pad, do bhsd, dq pad, ... */
} at_layout;

typedef struct at_shape {
  attn_dtype dtype;
  int64_t B, Nq, Nk, Hq, Hkv, d;
  /* varlen when cu_q is set: B sequences, rows cu[b] .. cu[b+1]-1 */
  const int32_t *cu_q, *cu_k;
  at_layout layout;
  unsigned flags; /* ATTN_CAUSAL, ATTN_DETERMINISTIC, ATTN_ALLOW_TF32 */
  int64_t wl, wr; /* window; 0 in both means none (-1, -1) unless win is set */
  int win;
  double softcap, scale;
  int alibi;      /* 1: ALiBi slopes 2^-(8(h+1)/Hq) */
  double amp;     /* input amplitude; 0 means 1.5 for q and k */
  uint64_t seed;  /* 0 means a fixed default */
  double tol_o;   /* 0: at_tol_o(dtype); larger where the problem is ill-conditioned */
  int want_empty; /* the test is about rows that see no key: there must be some */
} at_shape;

/* One memory block holding one or more strided tensors, with a map of which
 * element slots belong to a tensor: the rest is padding. */
typedef struct at_mem {
  unsigned char *bytes;
  size_t nbytes;
  unsigned char *used; /* per byte: 1 if some tensor element covers it */
} at_mem;

typedef struct at_prob {
  at_shape s;
  int varlen;
  int64_t tq, tk; /* rows of q and k over all sequences */
  size_t es;      /* element size of the dtype */
  attn_params p;
  float alibi[64];
  /* Memory blocks. With AT_QKV, mq holds q, k and v and mdq holds dq, dk and
   * dv (mk, mv, mdkv unused); otherwise mdkv holds dk and dv back to back. */
  at_mem mq, mk, mv, mo, mlse, mdo, mdq, mdkv;
  attn_tensor q, k, v, o, lse, dout, dq, dk, dv;
  /* The same inputs contiguous, for the reference. */
  void *cq, *ck, *cv, *cdo;
  attn_tensor rq, rk, rv, rdo;
} at_prob;

/* Builds the problem with random inputs; outputs filled with NaN and their
 * padding with a fixed pattern. */
void at_prob_init(at_prob *P, const at_shape *s);
void at_prob_free(at_prob *P);
/* Refills the outputs (o, lse, dq, dk, dv) with NaN and their padding with the pattern. */
void at_prob_reset_outputs(at_prob *P);
/* Whether every byte of the outputs' padding still holds the pattern. */
int at_padding_intact(const at_mem *m);

/* A label for messages: "f32 bshd B2 Nq70 Nk70 H2/2 d32 causal". */
const char *at_prob_label(const at_prob *P, char *buf, size_t len);

/* Element i (in the contiguous order of t's shape) of a strided tensor, as a double. */
double at_get(const attn_tensor *t, int64_t i);
int64_t at_count(const attn_tensor *t);

/* Runs forward on b and checks o and lse against the double reference:
 * tolerance per dtype (with ATTN_ALLOW_TF32 on f32, plus F times what
 * rounding to TF32 alone costs: the golden README's TF32 rule), rows with no
 * key exactly zero / -inf, no NaN, padding untouched. Returns 1 when it ran, 0 when the backend
 * refused the problem with ATTN_EUNSUPPORTED (with a reason, which is checked). */
int at_check_forward(at_backend *b, const at_shape *s);
/* The same for forward then backward, checking dq, dk, dv. */
int at_check_backward(at_backend *b, const at_shape *s);

/* Tolerances relative to max|ref|: forward o, and gradients. */
double at_tol_o(attn_dtype dt);
double at_tol_grad(attn_dtype dt);

#endif /* ATTN_TESTUTIL_H */
