/*
 * The shared half of the suites: the per-backend runner around cmocka, random
 * problems in every layout, and the checks against the double reference.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, strdup */

#include "testutil.h"

#include "file.h"
#include "golden.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* ---------------------------------------------------------------------- */
/* Runner                                                                   */
/* ---------------------------------------------------------------------- */

typedef struct at_slot {
  at_backend *b;
  const at_test *t;
} at_slot;

static const at_test *g_current;
static int g_ran, g_skipped;

const void *at_arg(void) {
  return g_current ? g_current->arg : NULL;
}

void at_note_skip(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  print_message("  skipped: %s\n", msg);
  g_skipped++;
}

static void trampoline(void **state) {
  at_slot *s = *state;
  g_current = s->t;
  at_env_restore();
  if (!s->b->present) at_skip("%s backend: %s", s->b->name, s->b->why);
  if (s->b->kind != ATTN_BACKEND_AUTO && !s->b->ctx)
    fail_msg("%s backend has a device but no context could be created: %s", s->b->name, s->b->why);
  s->t->fn(s->b);
  g_ran++;
}

enum { MAX_LIVE = 4096 };
/* Larger than any file a suite reads (golden arrays, OpenCL program caches). */
#define AT_MAX_FILE_BYTES ((size_t)1 << 30)
static void *g_live[MAX_LIVE];
static int g_nlive;

static void track(void *p) {
  if (g_nlive < MAX_LIVE) g_live[g_nlive++] = p; /* beyond: untracked, still freed by at_free */
}

void *at_malloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  assert_non_null(p);
  track(p);
  return p;
}

void *at_calloc(size_t n, size_t size) {
  void *p = at_malloc(n * size);
  memset(p, 0, n * size);
  return p;
}

void at_free(void *p) {
  if (!p) return;
  for (int i = g_nlive - 1; i >= 0; i--)
    if (g_live[i] == p) {
      g_live[i] = g_live[--g_nlive];
      break;
    }
  free(p);
}

unsigned char *at_read_file(const char *path, size_t *len) {
  unsigned char *buf = at_file_read(path, AT_MAX_FILE_BYTES, len);
  if (!buf && (errno == EFBIG || errno == ENOMEM || errno == EIO))
    fail_msg("%s: %s", path, at_file_error(errno));
  if (buf) track(buf);
  return buf;
}

void at_write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
}

static int teardown(void **state) {
  (void)state;
  at_env_restore();
  while (g_nlive > 0)
    free(g_live[--g_nlive]);
  return 0;
}

const char *at_golden_dir(void) {
  const char *e = getenv("ATTN_GOLDEN_DIR");
  if (e && *e) return e;
  return ATTN_GOLDEN_DIR;
}

static int listed(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; p && *p;) {
    const char *c = strchr(p, ',');
    size_t len = c ? (size_t)(c - p) : strlen(p);
    while (len && isspace((unsigned char)*p))
      p++, len--;
    while (len && isspace((unsigned char)p[len - 1]))
      len--;
    if (len == n && strncmp(p, name, n) == 0) return 1;
    p = c ? c + 1 : NULL;
  }
  return 0;
}

static int run_group(const char *suite, at_backend *b, const at_test *tests, size_t n) {
  if (n == 0) return 0;
  struct CMUnitTest *ut = calloc(n, sizeof *ut);
  at_slot *slots = calloc(n, sizeof *slots);
  char **names = calloc(n, sizeof *names);
  char group[128];
  if (!ut || !slots || !names) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(b->name) + strlen(tests[i].name) + 2;
    names[i] = malloc(len);
    if (!names[i]) exit(1);
    snprintf(names[i], len, "%s/%s", b->name, tests[i].name);
    slots[i].b = b;
    slots[i].t = &tests[i];
    ut[i].name = names[i];
    ut[i].test_func = trampoline;
    ut[i].teardown_func = teardown;
    ut[i].initial_state = &slots[i];
  }
  snprintf(group, sizeof group, "%s/%s", suite, b->name);
  if (!b->present) print_message("[ SKIPPED  ] %s: %s\n", group, b->why);
  int failed = _cmocka_run_group_tests(group, ut, n, NULL, NULL);
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  free(names);
  free(slots);
  free(ut);
  return failed;
}

int at_main(int argc, char **argv, const char *suite, const at_test *tests, size_t ntests,
            const at_test *common, size_t ncommon) {
  static const attn_backend kinds[3] = {ATTN_BACKEND_CPU, ATTN_BACKEND_OPENCL, ATTN_BACKEND_CUDA};
  char picked[256] = "";
  int want_common = 0, any_arg = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      size_t l = strlen(picked);
      snprintf(picked + l, sizeof picked - l, "%s%s", l ? "," : "", argv[++i]);
      any_arg = 1;
    } else if (strcmp(argv[i], "--common") == 0) {
      want_common = 1;
      any_arg = 1;
    } else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc) {
      cmocka_set_test_filter(argv[++i]);
    } else {
      fprintf(stderr,
              "usage: %s [--backend cpu|opencl|cuda]... [--common] [--filter PATTERN]\n"
              "  ATTN_TEST_BACKENDS=cpu,opencl limits the backends; ATTN_GOLDEN_DIR the cases\n",
              argv[0]);
      return 2;
    }
  }
  if (!any_arg) want_common = 1;
  const char *env = getenv("ATTN_TEST_BACKENDS");
  int failed = 0;

  if (want_common && ncommon) {
    at_backend c = {.kind = ATTN_BACKEND_AUTO, .name = "common", .present = 1};
    failed += run_group(suite, &c, common, ncommon);
  }
  for (int k = 0; k < 3; k++) {
    at_backend b = {.kind = kinds[k], .name = attn_backend_name(kinds[k])};
    if (any_arg && !listed(picked, b.name)) continue;
    if (ntests == 0) continue;
    if (env && *env && !listed(env, b.name)) {
      snprintf(b.why, sizeof b.why, "left out by ATTN_TEST_BACKENDS=%s", env);
    } else if (attn_device_count(b.kind) <= 0) {
      snprintf(b.why, sizeof b.why, "%s", attn_backend_unavailable_reason(b.kind));
      if (!b.why[0]) snprintf(b.why, sizeof b.why, "no device");
    } else {
      b.present = 1;
      char spec[32];
      snprintf(spec, sizeof spec, "%s", b.name);
      int rc = attn_context_create(spec, &b.ctx);
      if (rc != ATTN_OK) {
        snprintf(b.why, sizeof b.why, "%s: %s", attn_status_name(rc), attn_errmsg(b.ctx));
        attn_context_free(b.ctx);
        b.ctx = NULL;
      } else {
        attn_device_info info;
        const char *small = getenv("ATTN_TEST_SMALL");
        const char *tiles = getenv("ATTN_TEST_CL_TILES");
        const int forced = b.kind == ATTN_BACKEND_OPENCL && tiles && atoi(tiles) != 0 &&
                           at_cl_force_tiles(b.ctx, tiles) > 0;
        if (tiles && atoi(tiles) != 0 && !forced) {
          /* A GPU device runs them in the suite's plain opencl entry. */
          snprintf(b.why, sizeof b.why,
                   "ATTN_TEST_CL_TILES: the %s device already runs the GPU-class kernels, or "
                   "has none",
                   b.name);
          b.present = 0;
          attn_context_free(b.ctx);
          b.ctx = NULL;
          failed += run_group(suite, &b, tests, ntests);
          continue;
        }
        b.small = (small && atoi(small) != 0) ||
                  (b.kind == ATTN_BACKEND_OPENCL &&
                   attn_context_device_info(b.ctx, &info) == ATTN_OK && !info.is_gpu);
        if (attn_context_device_info(b.ctx, &info) == ATTN_OK)
          print_message("[ BACKEND  ] %s:%d %s (%s)%s%s\n", b.name, attn_context_device(b.ctx),
                        info.name, info.version, b.small ? ", small problems" : "",
                        forced ? ", the GPU-class kernels (ATTN_TEST_CL_TILES)" : "");
      }
    }
    failed += run_group(suite, &b, tests, ntests);
    attn_context_free(b.ctx);
  }
  if (failed) return failed > 100 ? 100 : failed;
  return g_ran == 0 ? 77 : 0; /* everything skipped, or nothing to run */
}

int at_mentions(const char *msg, const char *word) {
  size_t n = strlen(word);
  if (!msg || !n) return 0;
  for (const char *p = strstr(msg, word); p; p = strstr(p + 1, word)) {
    int before = p > msg && (isalnum((unsigned char)p[-1]) || p[-1] == '_');
    int after = isalnum((unsigned char)p[n]) || p[n] == '_';
    if (!before && !after) return 1;
  }
  return 0;
}

int at_child_elsewhere(const char *log, const char *name) {
  const char *p = strstr(log, "context on device ");
  p = p ? strchr(p, '(') : NULL;
  return p && strncmp(p + 1, name, strlen(name)) != 0;
}

typedef struct saved_env {
  char *name, *value;
  int had;
} saved_env;
static saved_env g_env[32];
static int g_nenv;

void at_env_set(const char *name, const char *value) {
  if (g_nenv < 32) {
    const char *old = getenv(name);
    g_env[g_nenv].name = strdup(name);
    g_env[g_nenv].had = old != NULL;
    g_env[g_nenv].value = old ? strdup(old) : NULL;
    g_nenv++;
  }
  if (value)
    setenv(name, value, 1);
  else
    unsetenv(name);
}

void at_env_restore(void) {
  while (g_nenv > 0) {
    saved_env *e = &g_env[--g_nenv];
    if (e->had)
      setenv(e->name, e->value, 1);
    else
      unsetenv(e->name);
    free(e->name);
    free(e->value);
  }
}

int at_child(const char *mode, const char *const *env, char *out, size_t outlen) {
  /* The environment is built here, before fork: between fork and exec the
   * child may only make async-signal-safe calls (OpenMP threads may hold
   * malloc's lock). */
  size_t n = 0, m = 0;
  while (environ[n])
    n++;
  while (env && env[m])
    m++;
  char **envp = calloc(n + m + 1, sizeof *envp);
  assert_non_null(envp);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    int drop = 0;
    for (size_t j = 0; j < m && !drop; j++) {
      size_t len = strcspn(env[j], "=");
      drop = strncmp(environ[i], env[j], len) == 0 && environ[i][len] == '=';
    }
    if (!drop) envp[k++] = environ[i];
  }
  for (size_t j = 0; j < m; j++)
    if (strchr(env[j], '=')) envp[k++] = (char *)env[j];
  envp[k] = NULL;
  char self[4096];
  ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
  assert_true(sl > 0);
  self[sl] = 0;
  char *const args[] = {self, "--child", (char *)mode, NULL};

  int fds[2];
  assert_int_equal(pipe(fds), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    execve(self, args, envp);
    _exit(127);
  }
  close(fds[1]);
  size_t got = 0;
  char sink[512];
  for (;;) {
    char *dst = got + 1 < outlen ? out + got : sink;
    size_t room = got + 1 < outlen ? outlen - 1 - got : sizeof sink;
    ssize_t r = read(fds[0], dst, room);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (dst != sink) got += (size_t)r;
  }
  if (outlen) out[got] = 0;
  close(fds[0]);
  free(envp);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

int at_child_forward(attn_context *ctx, int n, int h, int d, uint32_t seed) {
  const size_t count = (size_t)n * h * d;
  float *q = calloc(4 * count, sizeof *q); /* o unwritten reads as 0 */
  double *ref = malloc(count * sizeof *ref);
  if (!q || !ref) {
    printf("out of memory for a forward of %zu elements\n", count);
    free(q);
    free(ref);
    return 1;
  }
  float *k = q + count, *v = k + count, *o = v + count;
  uint32_t s = seed;
  for (size_t i = 0; i < count; i++) {
    s = s * 1664525u + 1013904223u;
    q[i] = (float)(s >> 8) / 16777216.0f - 0.5f;
    k[i] = (float)((s * 7u) >> 8) / 16777216.0f - 0.5f;
    v[i] = (float)((s * 13u) >> 8) / 16777216.0f - 0.5f;
  }
  attn_params p;
  attn_params_init(&p);
  attn_tensor tq = attn_tensor_bshd(q, ATTN_F32, 1, n, h, d);
  attn_tensor tk = attn_tensor_bshd(k, ATTN_F32, 1, n, h, d);
  attn_tensor tv = attn_tensor_bshd(v, ATTN_F32, 1, n, h, d);
  attn_tensor to = attn_tensor_bshd(o, ATTN_F32, 1, n, h, d);
  int bad = 0, rc = attn_forward(ctx, &p, &tq, &tk, &tv, &to, NULL);
  if (rc) {
    printf("attn_forward: %s: %s\n", attn_status_name(rc), attn_errmsg(ctx));
    bad = 1;
  } else if ((rc = at_ref_forward(ctx, &p, &tq, &tk, &tv, ref, NULL))) {
    printf("reference: %s: %s\n", attn_status_name(rc), attn_errmsg(ctx));
    bad = 1;
  }
  for (size_t i = 0; i < count && !bad; i++)
    if (!(fabs(o[i] - ref[i]) <= 1e-5)) {
      printf("o[%zu] = %.9g, want %.9g\n", i, o[i], ref[i]);
      bad = 1;
    }
  free(q);
  free(ref);
  return bad;
}

/* ---------------------------------------------------------------------- */
/* Problems                                                                 */
/* ---------------------------------------------------------------------- */

#define PAD_BYTE 0xA5
#define NAN_BYTE 0xFF /* all-ones: NaN in f32, f16 and bf16 */

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static float uniform(uint64_t *s, float amp) {
  return amp * (float)((double)(splitmix(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

int64_t at_count(const attn_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++)
    n *= t->shape[i];
  return n;
}

/* Element offset of contiguous index i in a strided tensor. */
static int64_t elem_offset(const attn_tensor *t, int64_t i) {
  int64_t off = 0;
  for (int k = t->ndim - 1; k >= 0; k--) {
    off += (i % t->shape[k]) * t->stride[k];
    i /= t->shape[k];
  }
  return off;
}

static int64_t extent(const attn_tensor *t) {
  int64_t last = 0;
  for (int k = 0; k < t->ndim; k++)
    last += (t->shape[k] - 1) * t->stride[k];
  return last + 1;
}

double at_get(const attn_tensor *t, int64_t i) {
  return attn__load(t->data, t->dtype, elem_offset(t, i));
}

static void mem_alloc(at_mem *m, size_t nbytes) {
  m->nbytes = nbytes;
  m->bytes = at_malloc(nbytes ? nbytes : 1);
  m->used = at_calloc(nbytes ? nbytes : 1, 1);
  assert_non_null(m->bytes);
  assert_non_null(m->used);
  memset(m->bytes, PAD_BYTE, nbytes);
}

static void mem_free(at_mem *m) {
  at_free(m->bytes);
  at_free(m->used);
  memset(m, 0, sizeof *m);
}

static void mark_used(at_mem *m, const attn_tensor *t) {
  size_t es = attn_dtype_size(t->dtype);
  size_t base = (size_t)((unsigned char *)t->data - m->bytes);
  int64_t n = at_count(t);
  for (int64_t i = 0; i < n; i++)
    memset(m->used + base + (size_t)elem_offset(t, i) * es, 1, es);
}

static void mem_reset(at_mem *m) {
  for (size_t i = 0; i < m->nbytes; i++)
    m->bytes[i] = m->used[i] ? NAN_BYTE : PAD_BYTE;
}

int at_padding_intact(const at_mem *m) {
  for (size_t i = 0; i < m->nbytes; i++)
    if (!m->used[i] && m->bytes[i] != PAD_BYTE) return 0;
  return 1;
}

/* Strides of a q/k/v-like tensor (shape already set) in a layout. */
static void set_strides(attn_tensor *t, at_layout L) {
  int nd = t->ndim;
  int64_t d = t->shape[nd - 1], H = t->shape[nd - 2], S = t->shape[nd - 3];
  int64_t dp = L == AT_PAD ? d + 3 : L == AT_DSTRIDE ? 2 * d : d;
  switch (L) {
    case AT_BHSD:
      t->stride[nd - 1] = 1;
      t->stride[nd - 3] = d;
      t->stride[nd - 2] = S * d;
      if (nd == 4) t->stride[0] = H * S * d;
      break;
    default:
      t->stride[nd - 1] = L == AT_DSTRIDE ? 2 : 1;
      t->stride[nd - 2] = dp;
      t->stride[nd - 3] = H * dp;
      if (nd == 4) t->stride[0] = S * H * dp;
      break;
  }
}

static attn_tensor shaped(attn_dtype dt, int varlen, int64_t B, int64_t rows, int64_t S, int64_t H,
                          int64_t d) {
  attn_tensor t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  if (varlen) {
    t.ndim = 3;
    t.shape[0] = rows;
    t.shape[1] = H;
    t.shape[2] = d;
  } else {
    t.ndim = 4;
    t.shape[0] = B;
    t.shape[1] = S;
    t.shape[2] = H;
    t.shape[3] = d;
  }
  return t;
}

/* A tensor in its own block of memory. */
static void own_tensor(at_mem *m, attn_tensor *t, at_layout L) {
  set_strides(t, L);
  mem_alloc(m, (size_t)extent(t) * attn_dtype_size(t->dtype));
  t->data = m->bytes;
  mark_used(m, t);
}

/* Three tensors (q, k, v or dq, dk, dv) as slices of one fused [.., S, 3, H, d]. */
static void fused_tensors(at_mem *m, attn_tensor *a, attn_tensor *b, attn_tensor *c) {
  attn_tensor *ts[3] = {a, b, c};
  int nd = a->ndim;
  int64_t d = a->shape[nd - 1], H = a->shape[nd - 2], S = a->shape[nd - 3];
  size_t es = attn_dtype_size(a->dtype);
  for (int i = 0; i < 3; i++) {
    ts[i]->stride[nd - 1] = 1;
    ts[i]->stride[nd - 2] = d;
    ts[i]->stride[nd - 3] = 3 * H * d;
    if (nd == 4) ts[i]->stride[0] = S * 3 * H * d;
  }
  mem_alloc(m, (size_t)(extent(a) + 2 * H * d) * es);
  for (int i = 0; i < 3; i++) {
    ts[i]->data = m->bytes + (size_t)(i * H * d) * es;
    mark_used(m, ts[i]);
  }
}

static void lse_tensor(at_mem *m, attn_tensor *t, int varlen, int64_t B, int64_t H, int64_t N,
                       at_layout L) {
  memset(t, 0, sizeof *t);
  t->dtype = ATTN_F32;
  if (varlen) {
    t->ndim = 2;
    t->shape[0] = H;
    t->shape[1] = N;
    /* padded rows, or [N, H] memory for the transposed layout */
    t->stride[1] = L == AT_BHSD ? H : 1;
    t->stride[0] = L == AT_BHSD ? 1 : L == AT_PAD ? N + 2 : N;
  } else {
    t->ndim = 3;
    t->shape[0] = B;
    t->shape[1] = H;
    t->shape[2] = N;
    t->stride[2] = L == AT_BHSD ? H : 1;
    t->stride[1] = L == AT_BHSD ? 1 : L == AT_PAD ? N + 2 : N;
    t->stride[0] = L == AT_PAD ? H * (N + 2) : H * N;
  }
  mem_alloc(m, (size_t)extent(t) * 4);
  t->data = m->bytes;
  mark_used(m, t);
}

static void fill_random(attn_tensor *strided, void **contig, attn_tensor *ref, uint64_t *seed,
                        float amp) {
  int64_t n = at_count(strided);
  size_t es = attn_dtype_size(strided->dtype);
  *contig = at_malloc((size_t)n * es + 1);
  assert_non_null(*contig);
  for (int64_t i = 0; i < n; i++) {
    attn__store(*contig, strided->dtype, i, uniform(seed, amp));
    memcpy((char *)strided->data + (size_t)elem_offset(strided, i) * es,
           (char *)*contig + (size_t)i * es, es);
  }
  *ref = *strided;
  ref->data = *contig;
  int64_t s = 1;
  for (int k = ref->ndim - 1; k >= 0; k--) {
    ref->stride[k] = s;
    s *= ref->shape[k];
  }
}

void at_prob_init(at_prob *P, const at_shape *s) {
  memset(P, 0, sizeof *P);
  P->s = *s;
  const at_shape *S = &P->s;
  P->varlen = S->cu_q != NULL;
  P->tq = P->varlen ? S->cu_q[S->B] : S->B * S->Nq;
  P->tk = P->varlen ? S->cu_k[S->B] : S->B * S->Nk;
  P->es = attn_dtype_size(S->dtype);
  assert_true(S->Hq <= 64);

  attn_params_init(&P->p);
  P->p.scale = S->scale;
  P->p.softcap = S->softcap;
  P->p.flags = S->flags;
  if (S->win) {
    P->p.window_left = S->wl;
    P->p.window_right = S->wr;
  }
  if (S->alibi) {
    for (int64_t h = 0; h < S->Hq; h++)
      P->alibi[h] = exp2f(-8.0f * (float)(h + 1) / (float)S->Hq);
    P->p.alibi_slopes = P->alibi;
    P->p.alibi_count = S->Hq;
  }
  if (P->varlen) {
    P->p.cu_seqlens_q = S->cu_q;
    P->p.cu_seqlens_k = S->cu_k;
    P->p.batch = S->B;
  }

  attn_dtype dt = S->dtype;
  P->q = shaped(dt, P->varlen, S->B, P->tq, S->Nq, S->Hq, S->d);
  P->k = shaped(dt, P->varlen, S->B, P->tk, S->Nk, S->Hkv, S->d);
  P->v = P->k;
  P->o = P->q;
  P->dout = P->q;
  P->dq = P->q;
  P->dk = P->k;
  P->dv = P->k;
  at_layout L = S->layout;
  if (L == AT_QKV) {
    assert_int_equal(S->Hq, S->Hkv);
    assert_int_equal(P->tq, P->tk);
    fused_tensors(&P->mq, &P->q, &P->k, &P->v);
    own_tensor(&P->mo, &P->o, AT_BSHD);
    own_tensor(&P->mdo, &P->dout, AT_BSHD);
    fused_tensors(&P->mdq, &P->dq, &P->dk, &P->dv);
  } else {
    /* AT_MIXED: every tensor laid out its own way, as when q, the KV cache
     * and the outputs come from different places. */
    int mixed = L == AT_MIXED;
    own_tensor(&P->mq, &P->q, mixed ? AT_BSHD : L);
    own_tensor(&P->mk, &P->k, mixed ? AT_BHSD : L);
    own_tensor(&P->mv, &P->v, mixed ? AT_DSTRIDE : L);
    own_tensor(&P->mo, &P->o, mixed ? AT_PAD : L);
    own_tensor(&P->mdo, &P->dout, mixed ? AT_BHSD : L);
    own_tensor(&P->mdq, &P->dq, mixed ? AT_PAD : L);
    /* dk and dv back to back in one block: outputs may be neighbours. */
    set_strides(&P->dk, mixed ? AT_DSTRIDE : L);
    set_strides(&P->dv, mixed ? AT_DSTRIDE : L);
    size_t kb = (size_t)extent(&P->dk) * P->es;
    mem_alloc(&P->mdkv, 2 * kb);
    P->dk.data = P->mdkv.bytes;
    P->dv.data = P->mdkv.bytes + kb;
    mark_used(&P->mdkv, &P->dk);
    mark_used(&P->mdkv, &P->dv);
  }
  lse_tensor(&P->mlse, &P->lse, P->varlen, S->B, S->Hq, P->varlen ? P->tq : S->Nq,
             L == AT_MIXED ? AT_PAD : L);

  uint64_t seed = S->seed ? S->seed : 0x5eed;
  float amp = S->amp > 0 ? (float)S->amp : 1.5f;
  fill_random(&P->q, &P->cq, &P->rq, &seed, amp);
  fill_random(&P->k, &P->ck, &P->rk, &seed, amp);
  fill_random(&P->v, &P->cv, &P->rv, &seed, 1.0f);
  fill_random(&P->dout, &P->cdo, &P->rdo, &seed, 1.0f);
  at_prob_reset_outputs(P);
}

void at_prob_reset_outputs(at_prob *P) {
  mem_reset(&P->mo);
  mem_reset(&P->mlse);
  mem_reset(&P->mdq);
  mem_reset(&P->mdkv);
}

void at_prob_free(at_prob *P) {
  at_mem *ms[] = {&P->mq, &P->mk, &P->mv, &P->mo, &P->mlse, &P->mdo, &P->mdq, &P->mdkv};
  for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
    mem_free(ms[i]);
  at_free(P->cq);
  at_free(P->ck);
  at_free(P->cv);
  at_free(P->cdo);
  memset(P, 0, sizeof *P);
}

const char *at_prob_label(const at_prob *P, char *buf, size_t len) {
  static const char *layouts[] = {"bshd", "bhsd", "qkv", "pad", "dstride", "mixed"};
  const at_shape *S = &P->s;
  int n = snprintf(buf, len, "%s %s%s B%lld", attn_dtype_name(S->dtype), layouts[S->layout],
                   P->varlen ? " varlen" : "", (long long)S->B);
  if (P->varlen)
    n += snprintf(buf + n, len - (size_t)n, " rows %lld/%lld", (long long)P->tq, (long long)P->tk);
  else
    n += snprintf(buf + n, len - (size_t)n, " Nq%lld Nk%lld", (long long)S->Nq, (long long)S->Nk);
  n += snprintf(buf + n, len - (size_t)n, " H%lld/%lld d%lld", (long long)S->Hq, (long long)S->Hkv,
                (long long)S->d);
  if (S->flags & ATTN_CAUSAL) n += snprintf(buf + n, len - (size_t)n, " causal");
  if (S->win)
    n += snprintf(buf + n, len - (size_t)n, " window(%lld,%lld)", (long long)S->wl,
                  (long long)S->wr);
  if (S->softcap > 0) n += snprintf(buf + n, len - (size_t)n, " softcap %g", S->softcap);
  if (S->alibi) n += snprintf(buf + n, len - (size_t)n, " alibi");
  if (S->scale > 0) snprintf(buf + n, len - (size_t)n, " scale %g", S->scale);
  return buf;
}

/* ---------------------------------------------------------------------- */
/* Checks                                                                   */
/* ---------------------------------------------------------------------- */

double at_tol_o(attn_dtype dt) {
  return dt == ATTN_F32 ? 1e-5 : dt == ATTN_F16 ? 1e-2 : 2e-2;
}

double at_tol_grad(attn_dtype dt) {
  return dt == ATTN_F32 ? 1e-4 : dt == ATTN_F16 ? 1e-2 : 2e-2;
}

/* Where contiguous element i of a q-shaped tensor lies: b, row, head, c. */
static void where(const at_prob *P, int64_t i, int64_t H, char *buf, size_t len) {
  int64_t d = P->s.d, c = i % d, h = (i / d) % H, r = i / d / H;
  if (P->varlen)
    snprintf(buf, len, "row %lld head %lld col %lld", (long long)r, (long long)h, (long long)c);
  else {
    int64_t S = H == P->s.Hq ? P->s.Nq : P->s.Nk;
    snprintf(buf, len, "batch %lld row %lld head %lld col %lld", (long long)(r / S),
             (long long)(r % S), (long long)h, (long long)c);
  }
}

/* The contiguous index in q's shape of column c of the row that lse index li
 * describes. */
static int64_t row_elem(const at_prob *P, int64_t li, int64_t c) {
  int64_t Hq = P->s.Hq, d = P->s.d;
  if (P->varlen) {
    int64_t h = li / P->tq, r = li % P->tq;
    return (r * Hq + h) * d + c;
  }
  int64_t N = P->s.Nq, b = li / (Hq * N), h = (li / N) % Hq, r = li % N;
  return ((b * N + r) * Hq + h) * d + c;
}

/* Compares a strided output with its reference: no NaN or inf, and max error
 * within tol * max|ref| + extra. */
static void compare(const at_prob *P, const char *what, const attn_tensor *t, const double *ref,
                    int64_t H, double tol, double extra) {
  char label[256], at[128];
  at_prob_label(P, label, sizeof label);
  int64_t n = at_count(t), worst = -1;
  double maxref = 0, err = 0;
  for (int64_t i = 0; i < n; i++) {
    double x = at_get(t, i);
    if (!isfinite(x)) {
      where(P, i, H, at, sizeof at);
      fail_msg("%s: %s is %g at %s (reference %g); no NaN or inf may appear", label, what, x, at,
               ref[i]);
    }
    if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
    if (fabs(x - ref[i]) > err) {
      err = fabs(x - ref[i]);
      worst = i;
    }
  }
  double bound = tol * maxref + extra;
  if (err > bound) {
    where(P, worst, H, at, sizeof at);
    fail_msg(
        "%s: %s max error %.3g > %.3g (= %g * max|ref| %.3g + %.3g) at %s: got %.9g, want %.9g",
        label, what, err, bound, tol, maxref, extra, at, at_get(t, worst), ref[worst]);
  }
}

/* TF32 (the golden README's rule): on an f32 problem that allows it, each
 * bound grows by F times what rounding to TF32 alone costs the output, the
 * test kit's reference computed as TF32 (the problem's own flags) against
 * the exact one (exact: the flags without ATTN_ALLOW_TF32). */
static int tf32_allowed(const at_prob *P) {
  return (P->p.flags & ATTN_ALLOW_TF32) && P->s.dtype == ATTN_F32;
}

static attn_params exact_params(const at_prob *P) {
  attn_params p = P->p;
  p.flags &= ~ATTN_ALLOW_TF32;
  return p;
}

static int refused(at_backend *b, int rc, const at_prob *P, const char *call) {
  if (rc != ATTN_EUNSUPPORTED) return 0;
  char label[256];
  const char *msg = attn_errmsg(b->ctx);
  if (!msg || !*msg)
    fail_msg("%s: %s returned ATTN_EUNSUPPORTED without a reason", at_prob_label(P, label, 256),
             call);
  print_message("  %s refuses %s: %s\n", b->name, at_prob_label(P, label, sizeof label), msg);
  return 1;
}

/* Runs the library's forward and checks it; leaves P's o and lse filled. */
static int forward_and_check(at_backend *b, at_prob *P) {
  char label[256];
  at_prob_label(P, label, sizeof label);
  /* attn_supports() answers what the call then does. */
  int sup = attn_supports(b->ctx, &P->p, &P->q, &P->k, &P->v, 0);
  int rc = attn_forward(b->ctx, &P->p, &P->q, &P->k, &P->v, &P->o, &P->lse);
  if ((sup == ATTN_EUNSUPPORTED) != (rc == ATTN_EUNSUPPORTED) ||
      (sup == ATTN_OK) != (rc == ATTN_OK))
    fail_msg("%s: attn_supports gave %s but attn_forward %s (%s)", label, attn_status_name(sup),
             attn_status_name(rc), attn_errmsg(b->ctx));
  if (refused(b, rc, P, "attn_forward")) return 0;
  if (rc != ATTN_OK)
    fail_msg("%s: attn_forward returned %s: %s", label, attn_status_name(rc), attn_errmsg(b->ctx));

  int64_t no = at_count(&P->o), nl = at_count(&P->lse);
  double *ro = at_malloc((size_t)no * sizeof *ro), *rl = at_malloc((size_t)nl * sizeof *rl);
  assert_non_null(ro);
  assert_non_null(rl);
  attn_params px = exact_params(P);
  rc = at_ref_forward(b->ctx, &px, &P->rq, &P->rk, &P->rv, ro, rl);
  if (rc != ATTN_OK)
    fail_msg("%s: the reference failed: %s: %s", label, attn_status_name(rc), attn_errmsg(b->ctx));
  double tf32_o = 0, tf32_l = 0;
  if (tf32_allowed(P)) {
    double *xo = at_malloc((size_t)no * sizeof *xo), *xl = at_malloc((size_t)nl * sizeof *xl);
    assert_true(xo && xl);
    rc = at_ref_forward(b->ctx, &P->p, &P->rq, &P->rk, &P->rv, xo, xl);
    if (rc != ATTN_OK)
      fail_msg("%s: the TF32 reference failed: %s: %s", label, attn_status_name(rc),
               attn_errmsg(b->ctx));
    tf32_o = 2 * at_golden_tf32_cost(xo, ro, no);
    tf32_l = 2 * at_golden_tf32_cost(xl, rl, nl);
    at_free(xo);
    at_free(xl);
  }

  /* Rows that see no key: o exactly 0 and lse exactly -inf. */
  double maxl = 1;
  int64_t empty = 0;
  for (int64_t li = 0; li < nl; li++) {
    double x = at_get(&P->lse, li);
    if (isinf(rl[li]) && rl[li] < 0) {
      empty++;
      if (!(isinf(x) && x < 0))
        fail_msg("%s: lse[%lld] is %g for a row that sees no key; want -inf", label, (long long)li,
                 x);
      for (int64_t c = 0; c < P->s.d; c++) {
        double oc = at_get(&P->o, row_elem(P, li, c));
        if (oc != 0)
          fail_msg("%s: o is %g (col %lld) in a row that sees no key (lse index %lld); want 0",
                   label, oc, (long long)c, (long long)li);
      }
      continue;
    }
    if (fabs(rl[li]) > maxl) maxl = fabs(rl[li]);
  }
  if (P->s.want_empty && !empty) fail_msg("%s: no row is without keys; the test is wrong", label);
  double lerr = 0;
  int64_t lworst = 0;
  for (int64_t li = 0; li < nl; li++) {
    if (isinf(rl[li])) continue;
    double x = at_get(&P->lse, li);
    if (!isfinite(x)) fail_msg("%s: lse[%lld] is %g; want %.9g", label, (long long)li, x, rl[li]);
    if (fabs(x - rl[li]) > lerr) {
      lerr = fabs(x - rl[li]);
      lworst = li;
    }
  }
  /* lse is float32 arithmetic on exact inputs in every dtype (and TF32's
   * error on top where it is allowed). */
  if (lerr > 1e-5 * maxl + tf32_l)
    fail_msg(
        "%s: lse max error %.3g > 1e-5 * max(1, max|lse|) + %.3g = %.3g at [%lld]: got %.9g, "
        "want %.9g",
        label, lerr, tf32_l, 1e-5 * maxl + tf32_l, (long long)lworst, at_get(&P->lse, lworst),
        rl[lworst]);
  compare(P, "o", &P->o, ro, P->s.Hq, P->s.tol_o > 0 ? P->s.tol_o : at_tol_o(P->s.dtype), tf32_o);
  if (!at_padding_intact(&P->mo)) fail_msg("%s: o's padding between elements was written", label);
  if (!at_padding_intact(&P->mlse))
    fail_msg("%s: lse's padding between elements was written", label);
  at_free(ro);
  at_free(rl);
  return 1;
}

int at_check_forward(at_backend *b, const at_shape *s) {
  at_prob P;
  at_prob_init(&P, s);
  int ran = forward_and_check(b, &P);
  at_prob_free(&P);
  return ran;
}

int at_check_backward(at_backend *b, const at_shape *s) {
  at_prob P;
  char label[256];
  at_prob_init(&P, s);
  at_prob_label(&P, label, sizeof label);
  if (!forward_and_check(b, &P)) {
    at_prob_free(&P);
    return 0;
  }
  int sup = attn_supports(b->ctx, &P.p, &P.q, &P.k, &P.v, 1);
  int rc =
      attn_backward(b->ctx, &P.p, &P.q, &P.k, &P.v, &P.o, &P.lse, &P.dout, &P.dq, &P.dk, &P.dv);
  if ((sup == ATTN_EUNSUPPORTED) != (rc == ATTN_EUNSUPPORTED) ||
      (sup == ATTN_OK) != (rc == ATTN_OK))
    fail_msg("%s: attn_supports(backward) gave %s but attn_backward %s (%s)", label,
             attn_status_name(sup), attn_status_name(rc), attn_errmsg(b->ctx));
  if (refused(b, rc, &P, "attn_backward")) {
    at_prob_free(&P);
    return 0;
  }
  if (rc != ATTN_OK)
    fail_msg("%s: attn_backward returned %s: %s", label, attn_status_name(rc), attn_errmsg(b->ctx));
  int64_t nq = at_count(&P.q), nk = at_count(&P.k), nl = at_count(&P.lse);
  double *rdq = at_malloc((size_t)nq * sizeof(double)),
         *rdk = at_malloc((size_t)nk * sizeof(double)),
         *rdv = at_malloc((size_t)nk * sizeof(double)),
         *rl = at_malloc((size_t)nl * sizeof(double));
  assert_true(rdq && rdk && rdv && rl);
  attn_params px = exact_params(&P);
  rc = at_ref_backward(b->ctx, &px, &P.rq, &P.rk, &P.rv, &P.rdo, rdq, rdk, rdv);
  if (rc != ATTN_OK)
    fail_msg("%s: the reference backward failed: %s: %s", label, attn_status_name(rc),
             attn_errmsg(b->ctx));
  rc = at_ref_forward(b->ctx, &px, &P.rq, &P.rk, &P.rv, NULL, rl);
  assert_int_equal(rc, ATTN_OK);
  /* TF32: the backward reads the TF32 forward's o and lse. */
  double tf32_g[3] = {0, 0, 0};
  if (tf32_allowed(&P)) {
    double *x = at_malloc((size_t)(nq + 2 * nk) * sizeof(double));
    assert_non_null(x);
    rc = at_ref_backward(b->ctx, &P.p, &P.rq, &P.rk, &P.rv, &P.rdo, x, x + nq, x + nq + nk);
    if (rc != ATTN_OK)
      fail_msg("%s: the TF32 reference backward failed: %s: %s", label, attn_status_name(rc),
               attn_errmsg(b->ctx));
    tf32_g[0] = 3 * at_golden_tf32_cost(x, rdq, nq);
    tf32_g[1] = 3 * at_golden_tf32_cost(x + nq, rdk, nk);
    tf32_g[2] = 3 * at_golden_tf32_cost(x + nq + nk, rdv, nk);
    at_free(x);
  }
  /* Rows that see no key pass no gradient: dq exactly 0. */
  for (int64_t li = 0; li < nl; li++) {
    if (!(isinf(rl[li]) && rl[li] < 0)) continue;
    for (int64_t c = 0; c < P.s.d; c++) {
      double g = at_get(&P.dq, row_elem(&P, li, c));
      if (g != 0)
        fail_msg("%s: dq is %g (col %lld) in a row that sees no key (lse index %lld); want 0",
                 label, g, (long long)c, (long long)li);
    }
  }
  double tol = at_tol_grad(P.s.dtype);
  compare(&P, "dq", &P.dq, rdq, P.s.Hq, tol, tf32_g[0]);
  compare(&P, "dk", &P.dk, rdk, P.s.Hkv, tol, tf32_g[1]);
  compare(&P, "dv", &P.dv, rdv, P.s.Hkv, tol, tf32_g[2]);
  if (!at_padding_intact(&P.mdq) || !at_padding_intact(&P.mdkv))
    fail_msg("%s: the padding between gradient elements was written", label);
  at_free(rdq);
  at_free(rdk);
  at_free(rdv);
  at_free(rl);
  at_prob_free(&P);
  return 1;
}
