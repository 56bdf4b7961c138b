/*
 * fuzz_api: argument validation of attn_supports, attn_forward and
 * attn_backward on the CPU backend.
 *
 * The input is a stream of choices (fuzz_bytes.h): the operation and the
 * context, the layout, dtype and base sizes, then per tensor a mutation (a
 * NULL pointer, a wrong dtype, rank or shape entry, odd strides, an
 * attn_buffer, memory inside another tensor's), then the parameters: scale,
 * softcap, flags, window bounds, ALiBi, cu_seqlens. Each tensor gets real
 * host memory of exactly the bytes its shape and strides address, so any
 * access the library makes beyond that is the library's (ASan reports it).
 *
 * Invariants checked beyond "no sanitizer report":
 *   - every status is in the table of attn.h;
 *   - attn_errmsg() is a sentence after a failure and "" after a success;
 *   - attn_supports writes no memory at all;
 *   - a call failing validation writes no memory at all;
 *   - a call that succeeds leaves every input element as it was (an output
 *     that shared bytes with an input should have been EALIAS);
 *   - a validation error of attn_supports is the error of the call itself.
 *
 * Regions the harness stays out of until their fixes land (issue 9, item 5),
 * each a defect reported already: window bounds near INT64_MAX (signed
 * overflow in attn__cpu_query_range), parameters beyond float32 and NaN/Inf
 * data (NaN reaches the float-to-int conversion in the CPU's exp),
 * misaligned host pointers. With WINDOW_MAX or PARAM_MAX lifted the fuzzer
 * finds the first two within a minute. See WINDOW_MAX, PARAM_MAX and fill().
 */
#include "attn.h"
#include "fuzz_bytes.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per-tensor memory cap: larger tensors are shrunk, since the point is the
 * validation, not the arithmetic. */
#define CAP_BYTES ((int64_t)64 * 1024)
/* Above this many multiply-adds the call is only asked of attn_supports:
 * the point is the validation, and a CPU pass under the sanitizers costs
 * about a millisecond per million. */
#define WORK_CAP ((double)(1 << 22))
/* Most cu_seqlens entries the harness allocates (batch is shrunk to it). */
#define CU_CAP 4096
/* Stays clear of the known overflow of window bounds near INT64_MAX. */
#define WINDOW_MAX (INT64_MAX / 4)
/* Stays clear of the known NaN from parameters beyond float32's range. */
#define PARAM_MAX 1e30

enum { T_Q, T_K, T_V, T_O, T_LSE, T_DO, T_DQ, T_DK, T_DV, NT };
static const int is_output_fwd[NT] = {0, 0, 0, 1, 1, 0, 0, 0, 0};
static const int is_output_bwd[NT] = {0, 0, 0, 0, 0, 0, 1, 1, 1};
enum { OP_SUPPORTS, OP_FORWARD, OP_BACKWARD };

static attn_context *cpu, *other, *failed;

typedef struct slot {
  attn_tensor t;
  int present;      /* 0: the call gets a NULL tensor pointer */
  int alloc;        /* index into the allocations, -1 when none */
  size_t off;       /* bytes from the allocation's start to the first element */
  attn_buffer *buf; /* when t.buffer is set */
} slot;

typedef struct allocation {
  unsigned char *mem, *snap;
  size_t bytes;
} allocation;

typedef struct harness {
  slot s[NT];
  allocation a[NT + 1];
  int na;
  attn_params p;
  int32_t *cu_q, *cu_k;
  float *alibi;
} harness;

/* Contents every dtype reads as finite and small: 16-bit words 0x3Cxx and
 * 0xBCxx are about +-1 as f16, +-0.01 as bf16, and their pairs small f32.
 * Made once: filling each allocation byte by byte was most of the time. */
#define PATTERN_BYTES (CAP_BYTES + 1024)
static unsigned char pattern[PATTERN_BYTES];

static void make_pattern(void) {
  for (size_t i = 0; i < sizeof pattern; i++)
    pattern[i] = i % 2 ? ((i / 2) % 3 ? 0x3C : 0xBC) : (unsigned char)(i * 37);
}

static void fill(unsigned char *m, size_t n) {
  for (size_t at = 0; at < n; at += sizeof pattern)
    memcpy(m + at, pattern, n - at < sizeof pattern ? n - at : sizeof pattern);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  make_pattern();
  if (attn_context_create("cpu", &cpu) != ATTN_OK ||
      attn_context_create("cpu", &other) != ATTN_OK) {
    fprintf(stderr, "fuzz_api: no CPU context: %s\n", attn_errmsg(cpu));
    abort();
  }
  /* A context whose creation failed: every call on it must say so. */
  if (attn_context_create("nonsense", &failed) == ATTN_OK || !failed) abort();
  return 0;
}

static void check(int ok, const char *what, int rc, const char *msg) {
  if (ok) return;
  fprintf(stderr, "fuzz_api: invariant broken: %s (status %s, message \"%s\")\n", what,
          attn_status_name(rc), msg ? msg : "");
  abort();
}

static int64_t pick_size(fz_bytes *b) {
  static const int64_t special[] = {0,
                                    -1,
                                    2,
                                    16,
                                    64,
                                    ATTN_MAX_HEAD_DIM,
                                    ATTN_MAX_HEAD_DIM + 1,
                                    (int64_t)1 << 20,
                                    INT32_MAX,
                                    (int64_t)1 << 32,
                                    ((int64_t)1 << 32) + 1,
                                    3037000500, /* about sqrt(INT64_MAX) */
                                    (int64_t)1 << 62,
                                    INT64_MAX,
                                    INT64_MIN,
                                    -(INT64_MAX / 2)};
  uint8_t c = fz_u8(b);
  if (c < 224) return 1 + c % 8;
  if (c < 240) return special[c - 224];
  return (int64_t)fz_u64(b);
}

static attn_dtype pick_dtype(fz_bytes *b) {
  static const int weird[] = {3, 4, -1, 255, 0x7fffffff, (int)0x80000000};
  uint8_t c = fz_u8(b);
  if (c < 240) return (attn_dtype)(c % 3);
  return (attn_dtype)weird[c % 6];
}

/* A double: the usual values, and the edges of what validation must refuse. */
static double pick_scalar(fz_bytes *b) {
  static const double special[] = {0,    1,    0.125, -1,      NAN, INFINITY, -INFINITY,
                                   -0.0, 1e30, 1e-45, DBL_MIN, 50,  1e-30,    -1e300};
  uint8_t c = fz_u8(b);
  double x = c < 14 ? special[c] : c < 128 ? (double)c / 16 : fz_f64(b);
  if (isfinite(x) && fabs(x) > PARAM_MAX) x = x > 0 ? PARAM_MAX : -PARAM_MAX;
  return x;
}

static int64_t pick_window(fz_bytes *b) {
  static const int64_t special[] = {-1, 0, 1, 2, 7, -2, INT64_MIN, INT64_MIN + 1, WINDOW_MAX, 1000};
  uint8_t c = fz_u8(b);
  int64_t w = c < 10 ? special[c] : c < 128 ? c - 10 : (int64_t)fz_u64(b);
  return w > WINDOW_MAX ? WINDOW_MAX : w;
}

static int64_t pick_stride(fz_bytes *b) {
  static const int64_t special[] = {
      0, 1, -1, 2, INT64_MAX, INT64_MIN, (int64_t)1 << 62, ((int64_t)1 << 31) + 1};
  uint8_t c = fz_u8(b);
  if (c < 8) return special[c];
  if (c < 128) return c - 8;
  return (int64_t)fz_u64(b);
}

static size_t esize_of(attn_dtype dt) {
  size_t e = attn_dtype_size(dt);
  return e ? e : 4;
}

/* The bytes t addresses, or -1 when its shape or strides are ones
 * validation must refuse (non-positive size, negative stride, overflow):
 * such a tensor gets a token allocation. */
static int64_t extent_bytes(const attn_tensor *t) {
  if (t->ndim < 1 || t->ndim > 4) return -1;
  int64_t last = 0;
  for (int i = 0; i < t->ndim; i++) {
    int64_t span;
    if (t->shape[i] <= 0 || t->stride[i] < 0) return -1;
    if (__builtin_mul_overflow(t->shape[i] - 1, t->stride[i], &span) ||
        __builtin_add_overflow(last, span, &last))
      return -1;
  }
  int64_t bytes;
  if (__builtin_add_overflow(last, 1, &last) ||
      __builtin_mul_overflow(last, (int64_t)esize_of(t->dtype), &bytes))
    return -1;
  return bytes;
}

/* Halves the dimension reaching furthest until t fits the cap. */
static int64_t shrink_to_cap(attn_tensor *t) {
  int64_t bytes = extent_bytes(t);
  while (bytes > CAP_BYTES) {
    int best = 0;
    int64_t reach = -1;
    for (int i = 0; i < t->ndim; i++)
      if ((t->shape[i] - 1) * t->stride[i] > reach) {
        reach = (t->shape[i] - 1) * t->stride[i];
        best = i;
      }
    t->shape[best] = t->shape[best] / 2 + t->shape[best] % 2;
    bytes = extent_bytes(t);
  }
  return bytes;
}

static int new_alloc(harness *h, size_t bytes) {
  allocation *a = &h->a[h->na];
  a->bytes = bytes ? bytes : 1;
  a->mem = malloc(a->bytes);
  a->snap = malloc(a->bytes);
  if (!a->mem || !a->snap) abort();
  fill(a->mem, a->bytes);
  return h->na++;
}

/* The harness's own arithmetic on absurd sizes saturates: the library is
 * the one under test for overflow. */
static int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

static void contiguous(attn_tensor *t) {
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    t->stride[i] = s;
    s = sat_mul(s, t->shape[i] > 0 ? t->shape[i] : 1);
  }
}

/* Base sizes the harness keeps small: the largest positive one among a
 * tensor's is halved until a contiguous q and k of them fit the cap. dims
 * are {B, Nq, Nk, Hq, Hkv, d}; varlen tensors leave B out. */
static void shrink_base(int64_t *dims, int varlen, size_t esize) {
  static const int qi[4] = {0, 1, 3, 5}, ki[4] = {0, 2, 4, 5};
  for (int round = 0; round < 2 * 6 * 64; round++) {
    const int *over = NULL;
    for (int t = 0; t < 2 && !over; t++) {
      const int *ix = t ? ki : qi;
      double prod = (double)esize;
      for (int i = varlen; i < 4; i++) {
        if (dims[ix[i]] <= 0) return;
        prod *= (double)dims[ix[i]];
      }
      if (prod > (double)CAP_BYTES) over = ix;
    }
    if (!over) return;
    int big = over[3];
    for (int i = varlen; i < 4; i++)
      if (dims[over[i]] > dims[big]) big = over[i];
    dims[big] = dims[big] / 2 + dims[big] % 2;
  }
}

/* Sets up slot i: the expected shape, then the input's mutation of it. */
static void build_tensor(harness *h, fz_bytes *b, int i, int ndim, const int64_t *shape,
                         attn_dtype dt) {
  slot *s = &h->s[i];
  attn_tensor *t = &s->t;
  memset(t, 0, sizeof *t);
  s->present = 1;
  s->alloc = -1;
  t->dtype = dt;
  t->ndim = ndim;
  for (int j = 0; j < ndim && j < 4; j++)
    t->shape[j] = shape[j];
  if (ndim >= 1 && ndim <= 4) contiguous(t);

  uint8_t m = fz_u8(b);
  int data_mode = 0; /* 0 data, 1 no memory, 2 data and buffer, 3 another context's buffer */
  switch (m & 7) {
    case 1:
      t->dtype = pick_dtype(b);
      break;
    case 2:
      t->ndim = (int)(int8_t)fz_u8(b);
      if (t->ndim >= 1 && t->ndim <= 4) contiguous(t);
      break;
    case 3:
      t->shape[fz_u8(b) % 4] = pick_size(b);
      break;
    case 4:
      s->present = 0;
      return;
    case 5:
      data_mode = 1;
      break;
    case 6:
      data_mode = 2;
      break;
    case 7:
      data_mode = 3;
      break;
  }
  int nd = t->ndim >= 1 && t->ndim <= 4 ? t->ndim : 4;
  switch ((m >> 3) & 7) {
    case 1: /* the two middle dimensions swapped, as bhsd is to bshd */
      if (nd >= 3) {
        t->stride[nd - 3] = t->shape[nd - 1];
        t->stride[nd - 2] = sat_mul(t->shape[nd - 1], t->shape[nd - 3]);
        if (nd == 4) t->stride[0] = sat_mul(t->stride[nd - 2], t->shape[nd - 2]);
      }
      break;
    case 2: { /* rows padded, as a slice of a fused tensor is */
      int64_t pad = 1 + fz_u8(b) % 8;
      for (int j = 0; j < nd - 1; j++)
        t->stride[j] = sat_mul(t->stride[j], pad);
      break;
    }
    case 3:
      t->stride[fz_u8(b) % 4] = pick_stride(b);
      break;
    case 4:
      for (int j = 0; j < 4; j++)
        t->stride[j] = fz_u8(b) % 16;
      break;
  }

  int64_t bytes = extent_bytes(t);
  if (bytes > CAP_BYTES) bytes = shrink_to_cap(t);
  size_t es = esize_of(t->dtype);

  if (data_mode == 1) return; /* data and buffer NULL */
  int use_buffer = (m >> 6) & 1 || data_mode >= 2;
  int alias = m >> 7;
  size_t need = bytes < 0 ? 64 : (size_t)bytes;
  if (alias && i > 0) {
    /* Inside an earlier tensor's memory, at a multiple of 4 bytes (aligned
     * for every dtype) that leaves room for the whole extent. */
    int j = fz_u8(b) % i;
    size_t off = (size_t)fz_u8(b) * 4;
    if (h->s[j].alloc >= 0 && !h->s[j].buf && h->a[h->s[j].alloc].bytes >= need + off) {
      s->alloc = h->s[j].alloc;
      s->off = h->s[j].off + off <= h->a[s->alloc].bytes - need ? h->s[j].off + off : off;
      t->data = h->a[s->alloc].mem + s->off;
      return;
    }
  }
  if (!use_buffer) {
    s->alloc = new_alloc(h, need);
    s->off = 0;
    t->data = h->a[s->alloc].mem;
    return;
  }
  /* An attn_buffer holding the extent at an offset; its claimed size is
   * the allocation's or less, never more. */
  uint8_t o = fz_u8(b);
  size_t off = o < 128 ? (size_t)(o % 8) * es : o;
  s->alloc = new_alloc(h, need + off);
  s->off = off;
  size_t claim = h->a[s->alloc].bytes - (fz_u8(b) < 224 ? 0 : fz_u8(b) % h->a[s->alloc].bytes);
  attn_context *owner = data_mode == 3 ? other : cpu;
  if (attn_buffer_wrap(owner, h->a[s->alloc].mem, claim, &s->buf) != ATTN_OK) abort();
  t->buffer = s->buf;
  t->offset = off;
  if (data_mode == 2) t->data = h->a[s->alloc].mem + off;
}

static int32_t *build_cu(fz_bytes *b, int64_t batch, int64_t rows) {
  if (rows > INT32_MAX) rows = INT32_MAX;
  if (rows < 0) rows = 0;
  uint8_t mode = fz_u8(b);
  if (mode % 8 == 7) return NULL;
  int32_t *cu = malloc((size_t)(batch + 1) * sizeof *cu);
  if (!cu) abort();
  cu[0] = 0;
  for (int64_t i = 1; i <= batch; i++) {
    switch (mode % 8) {
      case 0: /* an even split */
      case 1:
      case 2:
        cu[i] = (int32_t)(rows * i / batch);
        break;
      case 3: /* lengths from the input, the last one ending at rows */
      case 4:
        cu[i] = i == batch ? (int32_t)rows : cu[i - 1] + (int32_t)(fz_u8(b) % 4);
        break;
      case 5: /* raw values */
        cu[i] = (int32_t)fz_u32(b);
        break;
      case 6: /* one entry off */
        cu[i] = (int32_t)(rows * i / batch);
        break;
    }
  }
  if (mode % 8 == 6) {
    int64_t at = fz_u8(b) % (batch + 1);
    static const int32_t bad[] = {-1, 1, INT32_MAX, INT32_MIN};
    int32_t delta = bad[fz_u8(b) % 4];
    cu[at] = (int32_t)((uint32_t)cu[at] + (uint32_t)delta);
  }
  if (mode % 8 == 5 && fz_u8(b) % 2) cu[0] = 0;
  return cu;
}

static void snapshot(harness *h) {
  for (int i = 0; i < h->na; i++)
    memcpy(h->a[i].snap, h->a[i].mem, h->a[i].bytes);
}

static int memory_unchanged(const harness *h) {
  for (int i = 0; i < h->na; i++)
    if (memcmp(h->a[i].snap, h->a[i].mem, h->a[i].bytes) != 0) return 0;
  return 1;
}

/* Whether every element of a validated host tensor is as before the call. */
static int elements_unchanged(const harness *h, const slot *s) {
  const attn_tensor *t = &s->t;
  const allocation *a = &h->a[s->alloc];
  size_t es = attn_dtype_size(t->dtype);
  size_t base = s->off;
  int64_t idx[4] = {0, 0, 0, 0};
  for (;;) {
    int64_t e = 0;
    for (int i = 0; i < t->ndim; i++)
      e += idx[i] * t->stride[i];
    size_t at = base + (size_t)e * es;
    if (memcmp(a->mem + at, a->snap + at, es) != 0) return 0;
    int i = t->ndim - 1;
    while (i >= 0 && ++idx[i] == t->shape[i])
      idx[i--] = 0;
    if (i < 0) return 1;
  }
}

/* Statuses that come from validation or from attn_supports, before any
 * computation: memory must be untouched. */
static int is_validation(int rc) {
  return rc != ATTN_OK && rc != ATTN_ENOMEM && rc != ATTN_EDEVICE && rc != ATTN_EBUILD &&
         rc != ATTN_EINTERNAL;
}

static void check_status(attn_context *ctx, int rc, const char *call) {
  char what[128];
  snprintf(what, sizeof what, "%s: status in the table", call);
  check(strcmp(attn_status_name(rc), "ATTN_UNKNOWN") != 0, what, rc, NULL);
  if (!ctx) {
    snprintf(what, sizeof what, "%s: a NULL context gives ATTN_ENULL", call);
    check(rc == ATTN_ENULL, what, rc, NULL);
    return;
  }
  const char *msg = attn_errmsg(ctx);
  snprintf(what, sizeof what, "%s: a message after a failure, none after a success", call);
  check(rc == ATTN_OK ? msg[0] == '\0' : msg[0] != '\0', what, rc, msg);
  if (ctx == failed) {
    snprintf(what, sizeof what, "%s: a failed context gives ATTN_EUNAVAILABLE", call);
    check(rc == ATTN_EUNAVAILABLE, what, rc, msg);
  }
}

static void release(harness *h) {
  for (int i = 0; i < NT; i++)
    attn_buffer_free(h->s[i].buf);
  for (int i = 0; i < h->na; i++) {
    free(h->a[i].mem);
    free(h->a[i].snap);
  }
  free(h->cu_q);
  free(h->cu_k);
  free(h->alibi);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_bytes in = {data, size};
  fz_bytes *b = &in;
  harness h;
  memset(&h, 0, sizeof h);

  uint8_t c = fz_u8(b);
  int op = c % 3;
  int which = (c >> 2) & 7;
  attn_context *ctx = which < 6 ? cpu : which == 6 ? NULL : failed;
  int params_null = (c >> 5) == 7;

  /* Layout and base sizes. */
  c = fz_u8(b);
  int varlen = c % 4 == 1;
  int ndim = c % 4 == 3 ? (int)(c >> 2) - 8 : varlen ? 3 : 4;
  attn_dtype dt = pick_dtype(b);
  int64_t B = pick_size(b), nq = pick_size(b), nk = pick_size(b), hq = pick_size(b),
          hkv = pick_size(b), d = pick_size(b);
  size_t es = esize_of(dt);
  int64_t dims[6] = {B, nq, nk, hq, hkv, d};
  shrink_base(dims, varlen, es);
  B = dims[0], nq = dims[1], nk = dims[2], hq = dims[3], hkv = dims[4], d = dims[5];
  /* Varlen rows are the totals Nq, Nk; B is then the number of sequences. */
  int64_t qd[4] = {B, nq, hq, d}, kd[4] = {B, nk, hkv, d}, ld[4] = {B, hq, nq, 0};
  if (varlen) {
    int64_t q3[4] = {nq, hq, d, 0}, k3[4] = {nk, hkv, d, 0}, l2[4] = {hq, nq, 0, 0};
    memcpy(qd, q3, sizeof qd);
    memcpy(kd, k3, sizeof kd);
    memcpy(ld, l2, sizeof ld);
  }
  int lse_ndim = ndim == 3 ? 2 : ndim == 4 ? 3 : ndim;
  for (int i = 0; i < NT; i++) {
    const int64_t *shape = i == T_K || i == T_V || i == T_DK || i == T_DV ? kd : qd;
    if (i == T_LSE)
      build_tensor(&h, b, i, lse_ndim, ld, ATTN_F32);
    else
      build_tensor(&h, b, i, ndim, shape, dt);
  }

  /* Parameters. */
  attn_params_init(&h.p);
  h.p.scale = pick_scalar(b);
  h.p.softcap = fz_u8(b) % 2 ? pick_scalar(b) : 0;
  c = fz_u8(b);
  h.p.flags = (c & 0x1f) | (c & 0x20 ? 1u << (fz_u8(b) % 32) : 0);
  h.p.window_left = pick_window(b);
  h.p.window_right = pick_window(b);
  c = fz_u8(b);
  int64_t heads = h.s[T_Q].t.shape[h.s[T_Q].t.ndim == 3 ? 1 : 2];
  if (c % 4) {
    int64_t near = (int64_t)((uint64_t)heads + (uint64_t)(int64_t)(int8_t)fz_u8(b));
    int64_t count = c % 4 == 1 ? heads : c % 4 == 2 ? near : pick_size(b);
    h.p.alibi_count = count;
    /* NULL with a count, or slopes: count of them when the harness can
     * allocate that many, else one (the count then differs from q's heads,
     * which are capped, so validation refuses before reading). */
    if (fz_u8(b) % 8) {
      int64_t n = count > 0 && count <= CAP_BYTES ? count : 1;
      h.alibi = malloc((size_t)n * sizeof *h.alibi);
      if (!h.alibi) abort();
      for (int64_t i = 0; i < n; i++) {
        uint8_t sc = fz_u8(b);
        float x = sc < 200 ? (float)sc / 256 : sc == 200 ? NAN : sc == 201 ? INFINITY : fz_f32(b);
        if (isfinite(x) && fabsf(x) > (float)PARAM_MAX)
          x = x > 0 ? (float)PARAM_MAX : -(float)PARAM_MAX;
        h.alibi[i] = x;
      }
      h.p.alibi_slopes = h.alibi;
    }
  }
  int64_t batch = varlen ? B : pick_size(b) % 4;
  if (batch > CU_CAP) batch = CU_CAP;
  h.p.batch = batch;
  c = fz_u8(b);
  if (batch > 0 && (varlen || c % 16 == 1)) {
    h.cu_q = build_cu(b, batch, h.s[T_Q].t.shape[0]);
    h.cu_k = build_cu(b, batch, h.s[T_K].t.shape[0]);
    h.p.cu_seqlens_q = h.cu_q;
    h.p.cu_seqlens_k = h.cu_k;
  }

  /* Only validation for problems too large to compute quickly. The CPU
   * works on whole 64 x 64 tiles per sequence and head, hence the padding. */
  const attn_tensor *tq = &h.s[T_Q].t, *tk = &h.s[T_K].t;
  if (tq->ndim >= 3 && tq->ndim <= 4 && tk->ndim == tq->ndim) {
    int nd = tq->ndim;
    double seqs = nd == 4 ? (double)tq->shape[0] : (double)(batch > 0 ? batch : 1);
    double rows_q = nd == 4 ? (double)tq->shape[1] * seqs : (double)tq->shape[0];
    double rows_k = nd == 4 ? (double)tk->shape[1] : (double)tk->shape[0];
    double work = (double)tq->shape[nd - 2] * (double)tq->shape[nd - 1] * (rows_q + 64 * seqs) *
                  (rows_k + 64);
    if (work > WORK_CAP) op = OP_SUPPORTS;
  }

  const attn_tensor *tp[NT];
  for (int i = 0; i < NT; i++)
    tp[i] = h.s[i].present ? &h.s[i].t : NULL;
  const attn_params *pp = params_null ? NULL : &h.p;

  snapshot(&h);
  int src = attn_supports(ctx, pp, tp[T_Q], tp[T_K], tp[T_V], op == OP_BACKWARD);
  check_status(ctx, src, "attn_supports");
  check(memory_unchanged(&h), "attn_supports writes no memory", src, attn_errmsg(ctx));

  if (op != OP_SUPPORTS) {
    int rc = op == OP_FORWARD ? attn_forward(ctx, pp, tp[T_Q], tp[T_K], tp[T_V], tp[T_O], tp[T_LSE])
                              : attn_backward(ctx, pp, tp[T_Q], tp[T_K], tp[T_V], tp[T_O],
                                              tp[T_LSE], tp[T_DO], tp[T_DQ], tp[T_DK], tp[T_DV]);
    const char *call = op == OP_FORWARD ? "attn_forward" : "attn_backward";
    check_status(ctx, rc, call);
    const char *msg = ctx ? attn_errmsg(ctx) : NULL;
    if (is_validation(rc))
      check(memory_unchanged(&h), "a call failing validation writes no memory", rc, msg);
    /* The call checks its extra tensors' pointers first and the rest in
     * attn_supports's order, so its verdict on q, k, v and the parameters
     * is the same. */
    int extra_present = 1;
    for (int i = T_O; i < (op == OP_FORWARD ? T_O + 1 : NT); i++)
      extra_present &= h.s[i].present;
    if (src != ATTN_OK && src != ATTN_EUNSUPPORTED && extra_present)
      check(rc == src, "the call fails as attn_supports did", rc, msg);
    if (rc == ATTN_OK) {
      const int *outs = op == OP_FORWARD ? is_output_fwd : is_output_bwd;
      for (int i = 0; i < NT; i++)
        if (h.s[i].present && !outs[i] && h.s[i].alloc >= 0 && (op == OP_BACKWARD || i <= T_V))
          check(elements_unchanged(&h, &h.s[i]), "a successful call leaves its inputs as they were",
                rc, msg);
    }
  }
  release(&h);
  return 0;
}
