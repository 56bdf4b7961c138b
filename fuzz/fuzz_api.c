/*
 * fuzz_api: argument validation of attn_supports, attn_forward,
 * attn_backward and attn_merge on the CPU backend.
 *
 * The input is a stream of choices (fuzz_bytes.h): the operation and the
 * context, the layout, dtype and base sizes, then per tensor a mutation (a
 * NULL pointer, a wrong dtype, rank or shape entry, odd strides, an
 * attn_buffer, memory inside another tensor's), then the parameters: scale,
 * softcap, flags, window bounds, ALiBi, cu_seqlens. Each tensor gets real
 * host memory of exactly the bytes its shape and strides address, so any
 * access the library makes beyond that is the library's (ASan reports it).
 *
 * The inference path's choices come last, so that an input written before
 * them keeps its meaning (and, ending there, uses none of them): either
 * attn_merge instead of the operation (n from -1 to 300, parts mutated like
 * any tensor, o and lse as its outputs), or the KV-cache and score-term
 * fields of attn_params: k and v made paged with a block table, k_new and
 * v_new, seqused_k, num_splits, a bias (broadcast, any dtype, -inf rows) and
 * dbias, sinks and dsinks. The int32 entries (seqused_k, the block table)
 * are picked around each sequence's capacity and at the edges of int32; in
 * an attn_buffer they are not validated but clamped.
 *
 * Invariants checked beyond "no sanitizer report":
 *   - every status is in the table of attn.h;
 *   - attn_errmsg() is a sentence after a failure and "" after a success;
 *   - attn_supports writes no memory at all;
 *   - a call failing validation (ATTN_EUNSUPPORTED included) writes no
 *     memory at all;
 *   - a call that succeeds writes every element of its outputs (each held a
 *     signalling NaN before) and nothing else:
 *     every input element, and every byte between elements, is as it was
 *     (an output that shared bytes with an input should have been EALIAS);
 *     when the forward appends, k and v change only in the appended rows,
 *     which then hold k_new's and v_new's values;
 *   - a validation error of attn_supports is the error of the call itself;
 *     where attn_supports passed validation, the call fails validation only
 *     over what attn_supports does not take (o, lse, do, dq, dk, dv), and
 *     its verdict on the plan is attn_supports's
 *     (ATTN_OK then no ATTN_EUNSUPPORTED, and the other way round);
 *   - attn_forward refuses dbias and dsinks, attn_backward the KV-cache
 *     fields; attn_merge refuses n outside 1..ATTN_MAX_MERGE;
 *   - validation lets through only appends that fit: every sequence's used
 *     rows (clamped as src/rules.h clamps entries it cannot check) plus the
 *     new ones lie within its capacity.
 *
 * The inputs reach every edge: window bounds up to INT64_MAX, parameters of
 * any double (beyond float32, NaN, inf), NaN, inf and huge values in the
 * tensors (poke()), and host data misaligned by 1 to 3 bytes.
 */
#include "attn.h"
#include "fuzz_bytes.h"

#include <float.h>
#include <limits.h>
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
/* attn_merge's parts built from the input; the other parts of the n repeat
 * them (inputs may share memory), so that n = 256 costs no more memory than
 * n = 4, and one more, anywhere in the array, has its own mutations. */
#define MERGE_BUILT 4
/* The longest part arrays: n beyond it (up to INT_MAX) gets this many, and
 * a library that reads past them before refusing n is caught by ASan. */
#define MERGE_ARRAY 300

/* The call's tensors, attn_params' tensors, and attn_merge's parts: pairs
 * (o_parts[s], lse_parts[s]), MERGE_BUILT + 1 of them. */
enum { T_Q, T_K, T_V, T_O, T_LSE, T_DO, T_DQ, T_DK, T_DV };
enum { T_SEQUSED = T_DV + 1, T_KNEW, T_VNEW, T_TABLE, T_BIAS, T_DBIAS, T_SINKS, T_DSINKS, T_PART };
enum { NT = T_PART + 2 * (MERGE_BUILT + 1) };
/* One allocation per slot, and k and v again when they are made paged. */
#define NA (NT + 2)
enum { OP_SUPPORTS, OP_FORWARD, OP_BACKWARD, OP_MERGE };

/* The inference fields, one bit each in the byte that turns them on. */
enum {
  F_PAGED = 1,
  F_APPEND = 2,
  F_SEQUSED = 4,
  F_SPLITS = 8,
  F_BIAS = 16,
  F_DBIAS = 32,
  F_SINKS = 64,
  F_DSINKS = 128
};

/* What a successful call may do to a byte: keep it, write it (an output
 * element), or append to it from k_new / v_new once, or more than once
 * (pages shared by sequences: any of the writers' values). */
enum { KEEP, WRITTEN, APPENDED, APPENDED_AGAIN };

/* The harness's own loops over elements and bytes: no coverage tracing,
 * which cost most of an input's time there and guides nothing (their
 * comparisons are on the harness's sizes, not on the input's choices). */
#define NO_COVERAGE __attribute__((no_sanitize("coverage")))

static attn_context *cpu, *other, *failed;
/* FUZZ_API_TRACE=1: each call's status and message on stderr, to see what
 * a seed reaches (fuzz/api_seeds.py). */
static int trace;

typedef struct slot {
  attn_tensor t;
  int present;      /* 0: the call gets a NULL tensor pointer */
  int alloc;        /* index into the allocations, -1 when none */
  size_t off;       /* bytes from the allocation's start to the first element */
  attn_buffer *buf; /* when t.buffer is set */
} slot;

typedef struct allocation {
  unsigned char *mem, *snap;
  unsigned char *may; /* KEEP, WRITTEN, ... per byte; made after a success */
  size_t bytes;
} allocation;

typedef struct harness {
  slot s[NT];
  allocation a[NA];
  int na;
  attn_params p;
  int32_t *cu_q, *cu_k;
  float *alibi;
  int64_t nalibi;      /* slopes allocated */
  attn_tensor meta[3]; /* cu_seqlens_q, cu_seqlens_k and the slopes as tensors */
  /* attn_merge */
  int n;
  attn_tensor *o_parts, *lse_parts;
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

/* One byte per input: from 192 up, every allocation gets a NaN, an inf, a
 * huge or a negative-zero float at a place the byte picks. */
static uint8_t g_poke;

static void poke(unsigned char *m, size_t n) {
  static const float special[] = {NAN, INFINITY, -INFINITY, 1e30f, 3e38f, -0.0f};
  if (g_poke < 192 || n < 4) return;
  float v = special[g_poke % 6];
  memcpy(m + (size_t)g_poke * 7 % (n / 4) * 4, &v, sizeof v);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  make_pattern();
  trace = getenv("FUZZ_API_TRACE") != NULL;
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
  return x;
}

static int64_t pick_window(fz_bytes *b) {
  static const int64_t special[] = {-1, 0, 1, 2, 7, -2, INT64_MIN, INT64_MIN + 1, INT64_MAX, 1000};
  uint8_t c = fz_u8(b);
  return c < 10 ? special[c] : c < 128 ? c - 10 : (int64_t)fz_u64(b);
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
  if (h->na == NA) abort();
  allocation *a = &h->a[h->na];
  a->bytes = bytes ? bytes : 1;
  a->mem = malloc(a->bytes);
  a->snap = malloc(a->bytes);
  if (!a->mem || !a->snap) abort();
  fill(a->mem, a->bytes);
  poke(a->mem, a->bytes);
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
  /* k and v are built again when they become paged; no other slot uses a
   * buffer's memory (aliases go into plain allocations only). */
  attn_buffer_free(s->buf);
  s->buf = NULL;
  s->present = 1;
  s->alloc = -1;
  s->off = 0;
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
    /* Host data misaligned by 1 to 3 bytes now and then: refused, never read
     * through a misaligned typed pointer. */
    uint8_t mb = fz_u8(b);
    size_t mis = mb < 32 ? mb % 4 : 0;
    s->alloc = new_alloc(h, need + mis);
    s->off = mis;
    t->data = h->a[s->alloc].mem + mis;
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

/* ---------------------------------------------------------------------- */
/* Tensor contents                                                          */
/* ---------------------------------------------------------------------- */

/* Walks a tensor's elements in row-major order, each as its offset in
 * elements; at most `most` of them (a tensor refused for overlapping strides
 * can have far more elements than bytes). */
typedef struct walk {
  const attn_tensor *t;
  int64_t idx[4], left;
} walk;

static void walk_start(walk *w, const attn_tensor *t, int64_t most) {
  memset(w, 0, sizeof *w);
  w->t = t;
  w->left = extent_bytes(t) < 0 ? 0 : most;
}

NO_COVERAGE static int walk_next(walk *w, int64_t *e) {
  if (w->left <= 0) return 0;
  const attn_tensor *t = w->t;
  *e = 0;
  for (int i = 0; i < t->ndim; i++)
    *e += w->idx[i] * t->stride[i];
  w->left--;
  int i = t->ndim - 1;
  while (i >= 0 && ++w->idx[i] == t->shape[i])
    w->idx[i--] = 0;
  if (i < 0) w->left = 0;
  return 1;
}

/* A slot's first element in memory, or NULL when it has none that holds
 * its whole extent. */
static unsigned char *slot_mem(const harness *h, const slot *s) {
  if (!s->present || s->alloc < 0) return NULL;
  int64_t bytes = extent_bytes(&s->t);
  if (bytes < 0 || s->off + (size_t)bytes > h->a[s->alloc].bytes) return NULL;
  return h->a[s->alloc].mem + s->off;
}

static const attn_tensor *tensor_of(const harness *h, int i) {
  return h->s[i].present ? &h->s[i].t : NULL;
}

/* An int32 entry, written in the tensor's element size (a mutated dtype
 * gets the low bytes). */
static void put_entry(unsigned char *at, attn_dtype dt, int64_t v) {
  int32_t x = v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : (int32_t)v;
  size_t es = esize_of(dt);
  memcpy(at, &x, es < 4 ? es : 4);
}

/* Entry e (in elements) of a validated int32 tensor. */
static int64_t entry(const harness *h, const slot *s, int64_t e) {
  int32_t x;
  memcpy(&x, h->a[s->alloc].mem + s->off + (size_t)e * 4, 4);
  return x;
}

static int64_t longest(const int32_t *cu, int64_t batch) {
  int64_t n = 0;
  for (int64_t b = 0; cu && b < batch; b++)
    if ((int64_t)cu[b + 1] - cu[b] > n) n = (int64_t)cu[b + 1] - cu[b];
  return n;
}

/* Rows of k and v sequence b can hold, as validation reads the tensors
 * (paged: max_pages * page_size; varlen: its cu_seqlens_k length; bshd: k's
 * seqlen); 0 where they say nothing. */
static int64_t capacity(const harness *h, int64_t b) {
  const attn_tensor *k = &h->s[T_K].t;
  if (h->p.block_table) {
    const attn_tensor *bt = h->p.block_table;
    return k->ndim == 4 && bt->ndim == 2 ? sat_mul(bt->shape[1], k->shape[1]) : 0;
  }
  if (h->s[T_Q].t.ndim == 3)
    return h->cu_k && b >= 0 && b < h->p.batch ? (int64_t)h->cu_k[b + 1] - h->cu_k[b] : 0;
  return k->ndim == 4 ? k->shape[1] : 0;
}

/* Sizes the entries are picked around, kept where the harness's own
 * arithmetic on them cannot overflow (entries are int32 anyway). */
static int64_t tame(int64_t x) {
  const int64_t big = (int64_t)1 << 40;
  return x < -big ? -big : x > big ? big : x;
}

/* The block table's entries: mostly pages that exist (entry f of the
 * table gets page f + c, so that sequences share none while there are
 * enough), else the edges of the range and of int32. */
static void fill_table(harness *h, fz_bytes *b) {
  slot *s = &h->s[T_TABLE];
  unsigned char *m = slot_mem(h, s);
  if (!m) return;
  const attn_tensor *k = &h->s[T_K].t;
  const int64_t pages = k->ndim == 4 && k->shape[0] > 0 ? tame(k->shape[0]) : 1;
  const int64_t edge[] = {-1, pages, INT32_MIN, INT32_MAX, pages - 1, pages + 1, -pages, 0};
  size_t es = esize_of(s->t.dtype);
  walk w;
  int64_t e, f = 0;
  for (walk_start(&w, &s->t, CAP_BYTES); walk_next(&w, &e); f++) {
    uint8_t c = fz_u8(b);
    put_entry(m + e * (int64_t)es, s->t.dtype, c < 224 ? (f + c) % pages : edge[c % 8]);
  }
}

/* seqused_k's entries, around each sequence's room beside the appended rows
 * (the default: a full cache), and the edges. */
static void fill_seqused(harness *h, fz_bytes *b) {
  slot *s = &h->s[T_SEQUSED];
  unsigned char *m = slot_mem(h, s);
  if (!m) return;
  const attn_tensor *kn = h->p.k_new;
  const int64_t n_new = kn && kn->ndim >= 2 && kn->shape[1] > 0 ? tame(kn->shape[1]) : 0;
  size_t es = esize_of(s->t.dtype);
  walk w;
  int64_t e, f = 0;
  for (walk_start(&w, &s->t, CAP_BYTES); walk_next(&w, &e); f++) {
    const int64_t cap = tame(capacity(h, f)), room = cap - n_new;
    const int64_t edge[] = {-1, room + 1, cap, cap + 1, INT32_MIN, INT32_MAX, 0, -room};
    uint8_t c = fz_u8(b);
    int64_t v = c < 128   ? room - c % 4
                : c < 224 ? (c - 128) % (cap > 0 ? cap + 1 : 1)
                          : edge[c % 8];
    put_entry(m + e * (int64_t)es, s->t.dtype, v);
  }
}

/* -inf, +inf or NaN (which 0, 1, 2) in a float of any dtype. */
static void put_special(unsigned char *at, attn_dtype dt, int which) {
  static const float f32[] = {-INFINITY, INFINITY, NAN};
  static const uint16_t f16[] = {0xFC00, 0x7C00, 0x7E00}, bf16[] = {0xFF80, 0x7F80, 0x7FC0};
  if (dt == ATTN_F16)
    memcpy(at, &f16[which], 2);
  else if (dt == ATTN_BF16)
    memcpy(at, &bf16[which], 2);
  else
    memcpy(at, &f32[which], 4);
}

/* A score term's values: modes 0-3 keep the pattern (small and finite); 4
 * hides every third key (-inf), 5 every key (rows that see none), 6 puts a
 * NaN in every seventh, 7 alternates +inf and -inf. */
static void fill_term(harness *h, int i, int mode) {
  slot *s = &h->s[i];
  unsigned char *m = slot_mem(h, s);
  if (!m || mode < 4) return;
  size_t es = esize_of(s->t.dtype);
  walk w;
  int64_t e, f = 0;
  for (walk_start(&w, &s->t, CAP_BYTES); walk_next(&w, &e); f++) {
    int which = mode == 4 ? (f % 3 ? -1 : 0) : mode == 5 ? 0 : mode == 6 ? (f % 7 ? -1 : 2) : f % 2;
    if (which >= 0) put_special(m + e * (int64_t)es, s->t.dtype, which);
  }
}

static int pick_splits(fz_bytes *b) {
  static const int special[] = {0, 1, 2, 3, 4, 7, 64, 1000, -1, INT_MAX, INT_MIN, 1 << 20};
  uint8_t c = fz_u8(b);
  return c < 240 ? special[c % 12] : (int)fz_u32(b);
}

/* The bias's dtype: q's, or any other, ATTN_I32 and values in no table. */
static attn_dtype pick_bias_dtype(fz_bytes *b) {
  static const int dts[] = {ATTN_F32, ATTN_F16, ATTN_BF16, ATTN_I32, 4, -1, 255, INT_MIN};
  return (attn_dtype)dts[fz_u8(b) % 8];
}

/* The KV-cache and score-term fields of attn_params, each turned on by a bit
 * of one byte; seqs is the number of sequences, the other sizes are the
 * base ones. Paged first, as the capacity depends on it, and the used
 * lengths after the appended rows, as their room does. */
static void build_inference(harness *h, fz_bytes *b, attn_dtype dt, int64_t seqs, int64_t hq,
                            int64_t hkv, int64_t d) {
  uint8_t f = fz_u8(b);
  if (f & F_PAGED) {
    int64_t pages = pick_size(b), page_size = pick_size(b), max_pages = pick_size(b);
    int64_t kd[4] = {pages, page_size, hkv, d}, td[4] = {seqs, max_pages};
    build_tensor(h, b, T_K, 4, kd, dt);
    build_tensor(h, b, T_V, 4, kd, dt);
    build_tensor(h, b, T_TABLE, 2, td, ATTN_I32);
    h->p.block_table = tensor_of(h, T_TABLE);
    fill_table(h, b);
  }
  if (f & F_APPEND) {
    int64_t nd[4] = {seqs, pick_size(b), hkv, d};
    build_tensor(h, b, T_KNEW, 4, nd, dt);
    build_tensor(h, b, T_VNEW, 4, nd, dt);
    h->p.k_new = tensor_of(h, T_KNEW);
    h->p.v_new = tensor_of(h, T_VNEW);
  }
  if (f & F_SEQUSED) {
    int64_t sd[4] = {seqs};
    build_tensor(h, b, T_SEQUSED, 1, sd, ATTN_I32);
    h->p.seqused_k = tensor_of(h, T_SEQUSED);
    fill_seqused(h, b);
  }
  if (f & F_SPLITS) h->p.num_splits = pick_splits(b);
  /* The bias's full shape as validation reads it: varlen and paged give the
   * longest query sequence and the key capacity. */
  const attn_tensor *q = &h->s[T_Q].t, *k = &h->s[T_K].t;
  const int varlen = q->ndim == 3;
  const int64_t nq = varlen ? longest(h->cu_q, h->p.batch) : q->shape[1];
  const int64_t nk = h->p.block_table ? capacity(h, 0)
                     : varlen         ? longest(h->cu_k, h->p.batch)
                                      : k->shape[1];
  const int64_t full[4] = {seqs, hq, nq, nk};
  if (f & F_BIAS) {
    /* Bits 0-2 broadcast a dimension, 3 picks another dtype, 4 gives the
     * broadcast dimensions stride 0, 5-7 the values. */
    uint8_t c = fz_u8(b);
    int64_t bd[4] = {c & 1 ? 1 : seqs, c & 2 ? 1 : hq, c & 4 ? 1 : nq, nk};
    build_tensor(h, b, T_BIAS, 4, bd, c & 8 ? pick_bias_dtype(b) : dt);
    attn_tensor *t = &h->s[T_BIAS].t;
    /* Only where the extent was valid: an invalid stride on a size-1
     * dimension made build_tensor allocate a token 64 bytes, which a stride
     * of 0 there would turn into a valid tensor reaching past them. */
    if (c & 16 && extent_bytes(t) >= 0)
      for (int i = 0; i < 3; i++)
        if (t->shape[i] == 1) t->stride[i] = 0;
    h->p.bias = tensor_of(h, T_BIAS);
    fill_term(h, T_BIAS, c >> 5);
  }
  if (f & F_DBIAS) {
    int64_t dbd[4];
    memcpy(dbd, h->p.bias ? h->p.bias->shape : full, sizeof dbd);
    build_tensor(h, b, T_DBIAS, 4, dbd, ATTN_F32);
    h->p.dbias = tensor_of(h, T_DBIAS);
  }
  int64_t hd[4] = {hq};
  if (f & F_SINKS) {
    build_tensor(h, b, T_SINKS, 1, hd, ATTN_F32);
    h->p.sinks = tensor_of(h, T_SINKS);
    fill_term(h, T_SINKS, fz_u8(b) % 8);
  }
  if (f & F_DSINKS) {
    build_tensor(h, b, T_DSINKS, 1, hd, ATTN_F32);
    h->p.dsinks = tensor_of(h, T_DSINKS);
  }
}

/* attn_merge's n and parts, shaped like o (od) and lse (ld). */
static void build_merge(harness *h, fz_bytes *b, int ndim, const int64_t *od, int lse_ndim,
                        const int64_t *ld, attn_dtype dt) {
  static const int special[] = {-1, 0, 9, 64, 255, 256, 257, 300, INT_MAX, INT_MIN, 17, 128};
  uint8_t c = fz_u8(b);
  h->n = c < 192 ? 1 + c % 8 : special[c % 12];
  const int count = h->n < 1 ? 1 : h->n > MERGE_ARRAY ? MERGE_ARRAY : h->n;
  const int built = count < MERGE_BUILT ? count : MERGE_BUILT;
  for (int s = 0; s < built; s++) {
    build_tensor(h, b, T_PART + 2 * s, ndim, od, dt);
    build_tensor(h, b, T_PART + 2 * s + 1, lse_ndim, ld, ATTN_F32);
  }
  int far = -1;
  if (count > built) {
    far = built + (int)((fz_u8(b) | (unsigned)fz_u8(b) << 8) % (unsigned)(count - built));
    build_tensor(h, b, T_PART + 2 * MERGE_BUILT, ndim, od, dt);
    build_tensor(h, b, T_PART + 2 * MERGE_BUILT + 1, lse_ndim, ld, ATTN_F32);
  }
  h->o_parts = calloc((size_t)count, sizeof *h->o_parts);
  h->lse_parts = calloc((size_t)count, sizeof *h->lse_parts);
  if (!h->o_parts || !h->lse_parts) abort();
  /* A part whose slot is "NULL" is a tensor with no memory. */
  for (int s = 0; s < count; s++) {
    const int k = s == far ? MERGE_BUILT : s % built;
    if (h->s[T_PART + 2 * k].present) h->o_parts[s] = h->s[T_PART + 2 * k].t;
    if (h->s[T_PART + 2 * k + 1].present) h->lse_parts[s] = h->s[T_PART + 2 * k + 1].t;
  }
}

/* ---------------------------------------------------------------------- */
/* Checks                                                                   */
/* ---------------------------------------------------------------------- */

static void snapshot(harness *h) {
  for (int i = 0; i < h->na; i++)
    memcpy(h->a[i].snap, h->a[i].mem, h->a[i].bytes);
}

static int memory_unchanged(const harness *h) {
  for (int i = 0; i < h->na; i++)
    if (memcmp(h->a[i].snap, h->a[i].mem, h->a[i].bytes) != 0) return 0;
  return 1;
}

/* Statuses that come from validation or from attn_supports, before any
 * computation: memory must be untouched. */
static int is_validation(int rc) {
  return rc != ATTN_OK && rc != ATTN_ENOMEM && rc != ATTN_EDEVICE && rc != ATTN_EBUILD &&
         rc != ATTN_EINTERNAL;
}

static void check_status(attn_context *ctx, int rc, const char *call) {
  if (trace) fprintf(stderr, "%s: %s: %s\n", call, attn_status_name(rc), attn_errmsg(ctx));
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

/* Whether a validation message is about one of the call's own arguments
 * that attn_supports does not take: it names one first, or, for aliasing,
 * last ("params.dbias shares memory with dv"). */
static int about_extras(const char *msg, int op) {
  static const char *const fwd[] = {"o", "lse", NULL};
  static const char *const bwd[] = {"o", "lse", "do", "dq", "dk", "dv", NULL};
  const char *with = strstr(msg, " shares memory with ");
  for (const char *const *n = op == OP_FORWARD ? fwd : bwd; *n; n++) {
    size_t len = strlen(*n);
    if (strncmp(msg, *n, len) == 0 && (msg[len] == ' ' || msg[len] == ':')) return 1;
    if (with && strcmp(with + strlen(" shares memory with "), *n) == 0) return 1;
  }
  return 0;
}

/* Sequence b's first appended row: its seqused_k entry, clamped as
 * src/rules.h clamps one validation could not check (in a buffer). */
static int64_t first_new_row(const harness *h, int64_t b, int64_t n_new) {
  const slot *s = &h->s[T_SEQUSED];
  const int64_t u = entry(h, s, b * s->t.stride[0]);
  if (!s->buf) return u;
  const int64_t room = capacity(h, b) - n_new;
  return u < 0 ? 0 : u > room ? room : u;
}

/* After validation passed with an append: each sequence's appended rows lie
 * in its capacity, or the backend would write outside the sequence. */
static void check_fit(const harness *h, int rc, const char *msg) {
  const attn_tensor *kn = h->p.k_new;
  for (int64_t b = 0; b < kn->shape[0]; b++) {
    const int64_t u = first_new_row(h, b, kn->shape[1]);
    check(u >= 0 && u + kn->shape[1] <= capacity(h, b),
          "validation lets through only appends that fit each sequence's capacity", rc, msg);
  }
}

/* The element offset of column x, head hh, key row j of sequence b in a
 * validated k or v; a block table entry validation could not check (in a
 * buffer) is clamped as src/rules.h clamps it. */
static int64_t key_elem(const harness *h, const attn_tensor *k, int64_t b, int64_t j, int64_t hh,
                        int64_t x) {
  const int nd = k->ndim;
  int64_t row;
  if (h->p.block_table) {
    const slot *bt = &h->s[T_TABLE];
    const int64_t ps = k->shape[1];
    int64_t page = entry(h, bt, b * bt->t.stride[0] + j / ps * bt->t.stride[1]);
    if (bt->buf) page = page < 0 ? 0 : page >= k->shape[0] ? k->shape[0] - 1 : page;
    row = page * k->stride[0] + j % ps * k->stride[1];
  } else if (nd == 3) {
    row = (h->cu_k[b] + j) * k->stride[0];
  } else {
    row = b * k->stride[0] + j * k->stride[1];
  }
  return row + hh * k->stride[nd - 2] + x * k->stride[nd - 1];
}

/* What every output element holds before the call: a signalling NaN, which
 * no arithmetic gives (it makes quiet ones). */
static uint32_t sentinel(attn_dtype dt) {
  return dt == ATTN_F16 ? 0x7D5Au : dt == ATTN_BF16 ? 0x7FA5u : 0x7FA5A5A5u;
}

NO_COVERAGE static void fill_sentinel(harness *h, int i) {
  const slot *s = &h->s[i];
  unsigned char *m = slot_mem(h, s);
  if (!m) return;
  const size_t es = esize_of(s->t.dtype);
  const uint32_t v = sentinel(s->t.dtype);
  walk w;
  int64_t e;
  for (walk_start(&w, &s->t, CAP_BYTES); walk_next(&w, &e);)
    memcpy(m + e * (int64_t)es, &v, es < 4 ? es : 4);
}

/* After a success: marks an output's elements as ones the call may write,
 * and checks that it wrote each of them. */
NO_COVERAGE static void outputs_written(harness *h, int i, int rc, const char *msg) {
  const slot *s = &h->s[i];
  if (!s->present) return;
  const size_t es = attn_dtype_size(s->t.dtype);
  const uint32_t v = sentinel(s->t.dtype);
  unsigned char *may = h->a[s->alloc].may + s->off, *m = h->a[s->alloc].mem + s->off;
  walk w;
  int64_t e;
  for (walk_start(&w, &s->t, INT64_MAX); walk_next(&w, &e);) {
    uint32_t got = 0;
    memcpy(&got, m + e * (int64_t)es, es);
    check(got != v, "a successful call writes every element of its outputs", rc, msg);
    memset(may + e * (int64_t)es, WRITTEN, es);
  }
}

/* Marks (check == 0) or checks (check == 1) the rows appended to k or v:
 * a row written once holds the new row's value (NaN may change payload). */
NO_COVERAGE static void appended(harness *h, int ki, int check_values, int rc, const char *msg) {
  const slot *s = &h->s[ki], *sn = &h->s[ki == T_K ? T_KNEW : T_VNEW];
  const attn_tensor *k = &s->t, *kn = &sn->t;
  const attn_dtype dt = k->dtype;
  const size_t es = attn_dtype_size(dt);
  allocation *a = &h->a[s->alloc];
  const unsigned char *src = h->a[sn->alloc].mem + sn->off;
  for (int64_t b = 0; b < kn->shape[0]; b++) {
    const int64_t u = first_new_row(h, b, kn->shape[1]);
    for (int64_t r = 0; r < kn->shape[1]; r++)
      for (int64_t hh = 0; hh < kn->shape[2]; hh++)
        for (int64_t x = 0; x < kn->shape[3]; x++) {
          const size_t at = s->off + (size_t)key_elem(h, k, b, u + r, hh, x) * es;
          if (!check_values) {
            for (size_t i = 0; i < es; i++)
              a->may[at + i] = a->may[at + i] == KEEP ? APPENDED : APPENDED_AGAIN;
            continue;
          }
          if (a->may[at] != APPENDED) continue;
          const unsigned char *want = src + (b * kn->stride[0] + r * kn->stride[1] +
                                             hh * kn->stride[2] + x * kn->stride[3]) *
                                                (int64_t)es;
          uint32_t got = 0, exp = 0;
          memcpy(&got, a->mem + at, es);
          memcpy(&exp, want, es);
          const uint32_t inf = dt == ATTN_F32 ? 0x7f800000u : dt == ATTN_F16 ? 0x7c00u : 0x7f80u;
          const uint32_t sign = dt == ATTN_F32 ? 0x80000000u : 0x8000u;
          const int nan_both = (got & ~sign) > inf && (exp & ~sign) > inf;
          check(got == exp || nan_both, "the appended rows hold k_new's and v_new's values", rc,
                msg);
        }
  }
}

/* After a success: every byte that is no output element is as it was
 * (compared a page at a time, byte by byte only where a page changed). */
NO_COVERAGE static void check_writes(const harness *h, int rc, const char *msg) {
  for (int i = 0; i < h->na; i++) {
    const allocation *a = &h->a[i];
    for (size_t at = 0; at < a->bytes; at += 4096) {
      const size_t n = a->bytes - at < 4096 ? a->bytes - at : 4096;
      if (memcmp(a->mem + at, a->snap + at, n) == 0) continue;
      for (size_t j = at; j < at + n; j++)
        if (a->may[j] == KEEP && a->mem[j] != a->snap[j])
          check(0, "a successful call writes its outputs' elements and nothing else", rc, msg);
    }
  }
}

static void release(harness *h) {
  for (int i = 0; i < NT; i++)
    attn_buffer_free(h->s[i].buf);
  for (int i = 0; i < h->na; i++) {
    free(h->a[i].mem);
    free(h->a[i].snap);
    free(h->a[i].may);
  }
  free(h->cu_q);
  free(h->cu_k);
  free(h->alibi);
  free(h->o_parts);
  free(h->lse_parts);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_bytes in = {data, size};
  fz_bytes *b = &in;
  harness h;
  memset(&h, 0, sizeof h);
  for (int i = 0; i < NT; i++)
    h.s[i].alloc = -1;

  g_poke = fz_u8(b);
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
  for (int i = 0; i < T_SEQUSED; i++) {
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
      h.nalibi = n;
      for (int64_t i = 0; i < n; i++) {
        uint8_t sc = fz_u8(b);
        float x = sc < 200 ? (float)sc / 256 : sc == 200 ? NAN : sc == 201 ? INFINITY : fz_f32(b);
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
  /* The same offsets and slopes as tensors (host memory here): in place of
   * the pointers, beside them (refused), or one entry short (refused). */
  c = fz_u8(b);
  const int both = c % 4 == 2;
  if (c % 4) {
    const int64_t cut = c % 4 == 3;
    if (h.cu_q) {
      h.meta[0] = attn_tensor_1d(h.cu_q, ATTN_I32, batch + 1 - cut);
      h.meta[1] = attn_tensor_1d(h.cu_k, ATTN_I32, batch + 1);
      h.p.cu_seqlens_q_tensor = &h.meta[0];
      h.p.cu_seqlens_k_tensor = &h.meta[1];
      if (!both) h.p.cu_seqlens_q = h.p.cu_seqlens_k = NULL;
    }
    if (h.alibi) {
      h.meta[2] = attn_tensor_1d(h.alibi, ATTN_F32, h.nalibi > cut ? h.nalibi - cut : h.nalibi);
      h.p.alibi_slopes_tensor = &h.meta[2];
      if (!both) h.p.alibi_slopes = NULL;
    }
  }

  /* The inference path, last: attn_merge instead of the operation, or the
   * KV-cache and score-term fields. */
  c = fz_u8(b);
  if (c & 1) {
    op = OP_MERGE;
    build_merge(&h, b, ndim, qd, lse_ndim, ld, dt);
  } else {
    build_inference(&h, b, dt, varlen ? batch : B, hq, hkv, d);
  }
  const int appending = h.p.k_new && h.p.seqused_k;

  /* Only validation for problems too large to compute quickly. The CPU
   * works on whole 64 x 64 tiles per sequence and head, hence the padding;
   * a paged sequence's keys are its capacity. */
  const attn_tensor *tq = &h.s[T_Q].t, *tk = &h.s[T_K].t, *bt = h.p.block_table;
  if (op != OP_MERGE && tq->ndim >= 3 && tq->ndim <= 4 && tk->ndim == (bt ? 4 : tq->ndim)) {
    int nd = tq->ndim;
    double seqs = nd == 4 ? (double)tq->shape[0] : (double)(batch > 0 ? batch : 1);
    double rows_q = nd == 4 ? (double)tq->shape[1] * seqs : (double)tq->shape[0];
    double rows_k = bt        ? (double)tk->shape[1] * (double)(bt->ndim == 2 ? bt->shape[1] : 1)
                    : nd == 4 ? (double)tk->shape[1]
                              : (double)tk->shape[0];
    double work = (double)tq->shape[nd - 2] * (double)tq->shape[nd - 1] * (rows_q + 64 * seqs) *
                  (rows_k + 64);
    if (work > WORK_CAP) op = OP_SUPPORTS;
  }

  const attn_tensor *tp[NT];
  for (int i = 0; i < NT; i++)
    tp[i] = tensor_of(&h, i);
  const attn_params *pp = params_null ? NULL : &h.p;
  const char *msg = NULL;
  static const int fwd_out[] = {T_O, T_LSE}, bwd_out[] = {T_DQ, T_DK, T_DV, T_DBIAS, T_DSINKS};
  const int *outs = op == OP_BACKWARD ? bwd_out : fwd_out; /* attn_merge's too */
  const int n_outs = op == OP_BACKWARD ? 5 : 2;
  if (op != OP_SUPPORTS)
    for (int i = 0; i < n_outs; i++)
      fill_sentinel(&h, outs[i]);

  snapshot(&h);
  if (op == OP_MERGE) {
    const uint8_t np = fz_u8(b) % 16;
    int rc = attn_merge(ctx, h.n, np == 1 ? NULL : h.o_parts, np == 2 ? NULL : h.lse_parts, tp[T_O],
                        tp[T_LSE]);
    check_status(ctx, rc, "attn_merge");
    msg = ctx ? attn_errmsg(ctx) : NULL;
    if (ctx == cpu && (h.n < 1 || h.n > ATTN_MAX_MERGE))
      check(rc == ATTN_ESIZE, "attn_merge refuses n outside 1..ATTN_MAX_MERGE", rc, msg);
    if (is_validation(rc))
      check(memory_unchanged(&h), "a call failing validation writes no memory", rc, msg);
    if (rc == ATTN_OK) {
      for (int i = 0; i < h.na; i++)
        if (!(h.a[i].may = calloc(h.a[i].bytes, 1))) abort();
      outputs_written(&h, T_O, rc, msg);
      outputs_written(&h, T_LSE, rc, msg);
      check_writes(&h, rc, msg);
    }
    release(&h);
    return 0;
  }

  int src = attn_supports(ctx, pp, tp[T_Q], tp[T_K], tp[T_V], op == OP_BACKWARD);
  check_status(ctx, src, "attn_supports");
  msg = ctx ? attn_errmsg(ctx) : NULL;
  check(memory_unchanged(&h), "attn_supports writes no memory", src, msg);
  /* Validation passed (the CPU has its say only after it). */
  const int valid = ctx == cpu && (src == ATTN_OK || src == ATTN_EUNSUPPORTED);
  if (valid && pp && appending) check_fit(&h, src, msg);

  if (op != OP_SUPPORTS) {
    int rc = op == OP_FORWARD ? attn_forward(ctx, pp, tp[T_Q], tp[T_K], tp[T_V], tp[T_O], tp[T_LSE])
                              : attn_backward(ctx, pp, tp[T_Q], tp[T_K], tp[T_V], tp[T_O],
                                              tp[T_LSE], tp[T_DO], tp[T_DQ], tp[T_DK], tp[T_DV]);
    const char *call = op == OP_FORWARD ? "attn_forward" : "attn_backward";
    check_status(ctx, rc, call);
    msg = ctx ? attn_errmsg(ctx) : NULL;
    if (is_validation(rc))
      check(memory_unchanged(&h), "a call failing validation writes no memory", rc, msg);
    /* The call checks its extra tensors' pointers first and the rest in
     * attn_supports's order, so its verdict on q, k, v and the parameters
     * is the same; only aliasing (k appended to and k_new, dbias and bias)
     * is checked after every tensor, the extras included. */
    int extra_present = 1;
    for (int i = T_O; i < (op == OP_FORWARD ? T_O + 1 : T_SEQUSED); i++)
      extra_present &= h.s[i].present;
    if (src != ATTN_OK && src != ATTN_EUNSUPPORTED && extra_present)
      check(rc == src || (src == ATTN_EALIAS && about_extras(msg, op)),
            "the call fails as attn_supports did", rc, msg);
    if (valid && is_validation(rc) && rc != ATTN_EUNSUPPORTED)
      check(about_extras(msg, op),
            "where attn_supports passed validation, the call fails validation only over the "
            "arguments attn_supports does not take",
            rc, msg);
    if (src == ATTN_OK)
      check(rc != ATTN_EUNSUPPORTED, "after ATTN_OK from attn_supports, no ATTN_EUNSUPPORTED", rc,
            msg);
    if (src == ATTN_EUNSUPPORTED)
      check(rc != ATTN_OK, "after ATTN_EUNSUPPORTED from attn_supports, no ATTN_OK", rc, msg);
    if (op != OP_MERGE && pp &&
        ((h.p.cu_seqlens_q && h.p.cu_seqlens_q_tensor) ||
         (h.p.alibi_slopes && h.p.alibi_slopes_tensor)))
      check(rc != ATTN_OK, "a pointer and its tensor form are never both taken", rc, msg);
    if (op == OP_FORWARD && pp && (h.p.dbias || h.p.dsinks))
      check(rc != ATTN_OK, "attn_forward refuses dbias and dsinks", rc, msg);
    if (op == OP_BACKWARD && pp && (h.p.seqused_k || h.p.k_new || h.p.v_new || h.p.block_table))
      check(rc != ATTN_OK, "attn_backward refuses the KV-cache fields", rc, msg);
    if (rc == ATTN_OK) {
      for (int i = 0; i < h.na; i++)
        if (!(h.a[i].may = calloc(h.a[i].bytes, 1))) abort();
      for (int i = 0; i < n_outs; i++)
        outputs_written(&h, outs[i], rc, msg);
      if (op == OP_FORWARD && appending) {
        appended(&h, T_K, 0, rc, msg);
        appended(&h, T_V, 0, rc, msg);
      }
      check_writes(&h, rc, msg);
      if (op == OP_FORWARD && appending) {
        appended(&h, T_K, 1, rc, msg);
        appended(&h, T_V, 1, rc, msg);
      }
    }
  }
  release(&h);
  return 0;
}
