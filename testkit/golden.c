/*
 * Golden cases: a folder of .npy files and a case.json computed in float64
 * (see the golden README), loaded with the kit's JSON and .npy readers into
 * an at_golden, every field checked against the others before it is used;
 * and the listing of a folder of cases.
 */
#define _POSIX_C_SOURCE 200809L /* opendir, strdup */

#include "golden.h"

#include "file.h"
#include "json.h"
#include "npy.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The inputs are produced by attn's own tooling, but a hand-edited or
 * truncated file must give a message, not undefined behaviour: every size is
 * bounded before it is multiplied. */
#define GOLDEN_MAX_JSON_BYTES (1 << 20)
#define GOLDEN_MAX_DIM ((int64_t)1 << 31)
#define GOLDEN_MAX_ELEMS ((int64_t)1 << 34)

/* ---------------------------------------------------------------------- */
/* Loading a case                                                           */
/* ---------------------------------------------------------------------- */

static int load_cu(const at_json *root, const char *key, int64_t batch, int32_t **out, char *err,
                   size_t errlen) {
  const at_json *a = at_json_get(root, key);
  if (!a || a->type != AT_JSON_ARR || a->n != batch + 1) {
    at_seterr(err, errlen, "case.json: %s must be an array of batch + 1 = %lld integers", key,
              (long long)(batch + 1));
    return -1;
  }
  int32_t *cu = malloc((size_t)a->n * sizeof *cu);
  if (!cu) {
    at_seterr(err, errlen, "case.json: out of memory");
    return -1;
  }
  for (int i = 0; i < a->n; i++) {
    int64_t x;
    if (at_json_int(a->items[i], 0, INT32_MAX, &x) != 0 || (i == 0 && x != 0) ||
        (i > 0 && x < cu[i - 1])) {
      at_seterr(err, errlen,
                "case.json: %s[%d] must be a non-negative integer, 0 first, never decreasing", key,
                i);
      free(cu);
      return -1;
    }
    cu[i] = (int32_t)x;
  }
  *out = cu;
  return 0;
}

/* dir/name.npy of the case, in the shape case.json implies. */
static int load_npy(const at_golden *g, const char *name, int optional, at_npy_want want, int ndim,
                    const int64_t *shape, void **out, char *err, size_t errlen) {
  char path[1200];
  snprintf(path, sizeof path, "%s/%s.npy", g->dir, name);
  return at_npy_load(path, optional, want, ndim, shape, out, err, errlen);
}

static double peer_of(const at_json *peer, const char *key) {
  const at_json *v = at_json_get(peer, key);
  return v && v->type == AT_JSON_NUM && isfinite(v->num) && v->num >= 0 ? v->num : NAN;
}

int at_golden_load(const char *dir, at_golden *g, char *err, size_t errlen) {
  memset(g, 0, sizeof *g);
  g->peer_o = g->peer_lse = g->peer_dq = g->peer_dk = g->peer_dv = NAN;
  if (!dir || !*dir) {
    at_seterr(err, errlen, "no case folder given");
    return -1;
  }
  if (strlen(dir) >= sizeof g->dir) {
    at_seterr(err, errlen, "%s: path too long", dir);
    return -1;
  }
  snprintf(g->dir, sizeof g->dir, "%s", dir);
  size_t dl = strlen(g->dir);
  while (dl > 1 && g->dir[dl - 1] == '/')
    g->dir[--dl] = 0;
  const char *base = strrchr(g->dir, '/');
  base = base ? base + 1 : g->dir;
  size_t bl = strlen(base) < sizeof g->name - 1 ? strlen(base) : sizeof g->name - 1;
  memcpy(g->name, base, bl);
  g->name[bl] = 0;

  char path[1200];
  snprintf(path, sizeof path, "%s/case.json", g->dir);
  size_t len = 0;
  char *text = (char *)at_file_read(path, GOLDEN_MAX_JSON_BYTES, &len);
  if (!text) {
    at_seterr(err, errlen, "%s: %s", path, at_file_error(errno));
    return -1;
  }
  char jerr[256] = "";
  at_json *root = at_json_parse(text, len, jerr, sizeof jerr);
  free(text);
  if (!root) {
    at_seterr(err, errlen, "%s: case.json: %s", g->dir, jerr);
    return -1;
  }
  if (root->type != AT_JSON_OBJ) {
    at_json_free(root);
    at_seterr(err, errlen, "%s: case.json: the top level is not an object", g->dir);
    return -1;
  }

  int rc = -1;
  const at_json *v;
#define FAIL(...)                        \
  do {                                   \
    at_seterr(err, errlen, __VA_ARGS__); \
    goto fail;                           \
  } while (0)

  v = at_json_get(root, "layout");
  if (!v || v->type != AT_JSON_STR ||
      (strcmp(v->str, "bshd") != 0 && strcmp(v->str, "varlen") != 0))
    FAIL("%s/case.json: layout must be \"bshd\" or \"varlen\"", g->dir);
  g->varlen = strcmp(v->str, "varlen") == 0;

  v = at_json_get(root, "dtype");
  if (!v || v->type != AT_JSON_STR) FAIL("%s/case.json: dtype must be a string", g->dir);
  if (strcmp(v->str, "f32") == 0)
    g->dtype = ATTN_F32;
  else if (strcmp(v->str, "f16") == 0)
    g->dtype = ATTN_F16;
  else if (strcmp(v->str, "bf16") == 0)
    g->dtype = ATTN_BF16;
  else
    FAIL("%s/case.json: dtype \"%s\" is not f32, f16 or bf16", g->dir, v->str);

  if (at_json_int(at_json_get(root, "batch"), 1, GOLDEN_MAX_DIM, &g->batch) != 0)
    FAIL("%s/case.json: batch must be a positive integer", g->dir);
  if (at_json_int(at_json_get(root, "heads_q"), 1, 65536, &g->heads_q) != 0)
    FAIL("%s/case.json: heads_q must be a positive integer", g->dir);
  if (at_json_int(at_json_get(root, "heads_kv"), 1, 65536, &g->heads_kv) != 0)
    FAIL("%s/case.json: heads_kv must be a positive integer", g->dir);
  if (g->heads_q % g->heads_kv != 0)
    FAIL("%s/case.json: heads_q %lld is not a multiple of heads_kv %lld", g->dir,
         (long long)g->heads_q, (long long)g->heads_kv);
  if (at_json_int(at_json_get(root, "head_dim"), 1, 65536, &g->head_dim) != 0)
    FAIL("%s/case.json: head_dim must be a positive integer", g->dir);

  attn_params_init(&g->params);
  if (g->varlen) {
    if (load_cu(root, "cu_seqlens_q", g->batch, &g->cu_q_, err, errlen) != 0 ||
        load_cu(root, "cu_seqlens_k", g->batch, &g->cu_k_, err, errlen) != 0)
      goto fail;
    g->total_q = g->cu_q_[g->batch];
    g->total_k = g->cu_k_[g->batch];
    g->params.cu_seqlens_q = g->cu_q_;
    g->params.cu_seqlens_k = g->cu_k_;
    g->params.batch = g->batch;
  } else {
    if (at_json_int(at_json_get(root, "seqlen_q"), 1, GOLDEN_MAX_DIM, &g->seqlen_q) != 0 ||
        at_json_int(at_json_get(root, "seqlen_k"), 1, GOLDEN_MAX_DIM, &g->seqlen_k) != 0)
      FAIL("%s/case.json: seqlen_q and seqlen_k must be positive integers for layout bshd", g->dir);
    g->total_q = g->batch * g->seqlen_q;
    g->total_k = g->batch * g->seqlen_k;
  }
  if ((double)g->total_q * (double)g->heads_q * (double)g->head_dim > (double)GOLDEN_MAX_ELEMS ||
      (double)g->total_k * (double)g->heads_kv * (double)g->head_dim > (double)GOLDEN_MAX_ELEMS)
    FAIL("%s/case.json: the tensors would be too large", g->dir);

  v = at_json_get(root, "scale");
  if (!v || v->type != AT_JSON_NUM || !isfinite(v->num) || v->num < 0)
    FAIL("%s/case.json: scale must be a finite non-negative number", g->dir);
  g->params.scale = v->num;

  v = at_json_get(root, "causal");
  if (!v || v->type != AT_JSON_BOOL) FAIL("%s/case.json: causal must be true or false", g->dir);
  if (v->boolean) g->params.flags |= ATTN_CAUSAL;

  v = at_json_get(root, "window");
  if (v && v->type != AT_JSON_NULL) {
    if (v->type != AT_JSON_ARR || v->n != 2 ||
        at_json_int(v->items[0], -1, INT64_MAX / 2, &g->params.window_left) != 0 ||
        at_json_int(v->items[1], -1, INT64_MAX / 2, &g->params.window_right) != 0)
      FAIL("%s/case.json: window must be [left, right], integers >= -1", g->dir);
  }

  v = at_json_get(root, "softcap");
  if (v && v->type != AT_JSON_NULL) {
    if (v->type != AT_JSON_NUM || !isfinite(v->num) || v->num < 0)
      FAIL("%s/case.json: softcap must be a finite non-negative number", g->dir);
    g->params.softcap = v->num;
  }

  v = at_json_get(root, "alibi_slopes");
  if (v && v->type != AT_JSON_NULL) {
    if (v->type != AT_JSON_ARR || v->n != g->heads_q)
      FAIL("%s/case.json: alibi_slopes must be null or an array of heads_q = %lld numbers", g->dir,
           (long long)g->heads_q);
    g->alibi_ = malloc((size_t)v->n * sizeof *g->alibi_);
    if (!g->alibi_) FAIL("%s: out of memory", g->dir);
    for (int i = 0; i < v->n; i++) {
      if (v->items[i]->type != AT_JSON_NUM || !isfinite(v->items[i]->num))
        FAIL("%s/case.json: alibi_slopes[%d] is not a finite number", g->dir, i);
      g->alibi_[i] = (float)v->items[i]->num;
    }
    g->params.alibi_slopes = g->alibi_;
    g->params.alibi_count = v->n;
  }

  const at_json *peer = at_json_get(root, "peer_max_err");
  if (peer && peer->type == AT_JSON_OBJ) {
    g->peer_o = peer_of(peer, "o");
    g->peer_lse = peer_of(peer, "lse");
    g->peer_dq = peer_of(peer, "dq");
    g->peer_dk = peer_of(peer, "dk");
    g->peer_dv = peer_of(peer, "dv");
  }

  {
    int64_t B = g->batch, Hq = g->heads_q, Hkv = g->heads_kv, d = g->head_dim;
    int64_t qs[4], ks[4], ls[3];
    int nd = g->varlen ? 3 : 4;
    if (g->varlen) {
      int64_t a[3] = {g->total_q, Hq, d}, b[3] = {g->total_k, Hkv, d}, c[2] = {Hq, g->total_q};
      memcpy(qs, a, sizeof a);
      memcpy(ks, b, sizeof b);
      memcpy(ls, c, sizeof c);
    } else {
      int64_t a[4] = {B, g->seqlen_q, Hq, d}, b[4] = {B, g->seqlen_k, Hkv, d},
              c[3] = {B, Hq, g->seqlen_q};
      memcpy(qs, a, sizeof a);
      memcpy(ks, b, sizeof b);
      memcpy(ls, c, sizeof c);
    }
    at_npy_want in = g->dtype == ATTN_F32 ? AT_NPY_F32 : AT_NPY_U16;
    if (load_npy(g, "q", 0, in, nd, qs, &g->q, err, errlen) != 0 ||
        load_npy(g, "k", 0, in, nd, ks, &g->k, err, errlen) != 0 ||
        load_npy(g, "v", 0, in, nd, ks, &g->v, err, errlen) != 0 ||
        load_npy(g, "o", 0, AT_NPY_F32, nd, qs, (void **)&g->o, err, errlen) != 0 ||
        load_npy(g, "lse", 0, AT_NPY_F32, nd - 1, ls, (void **)&g->lse, err, errlen) != 0 ||
        load_npy(g, "do", 1, in, nd, qs, &g->dout, err, errlen) != 0 ||
        load_npy(g, "dq", 1, AT_NPY_F32, nd, qs, (void **)&g->dq, err, errlen) != 0 ||
        load_npy(g, "dk", 1, AT_NPY_F32, nd, ks, (void **)&g->dk, err, errlen) != 0 ||
        load_npy(g, "dv", 1, AT_NPY_F32, nd, ks, (void **)&g->dv, err, errlen) != 0)
      goto fail;
    /* A backward check needs the upstream gradient and all three answers. */
    if (!g->dout || !g->dq || !g->dk || !g->dv) {
      free(g->dout);
      free(g->dq);
      free(g->dk);
      free(g->dv);
      g->dout = NULL;
      g->dq = g->dk = g->dv = NULL;
    }
  }
  rc = 0;
#undef FAIL
fail:
  at_json_free(root);
  if (rc != 0) {
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", g->dir);
    at_golden_free(g);
    snprintf(g->dir, sizeof g->dir, "%s", keep);
  }
  return rc;
}

void at_golden_free(at_golden *g) {
  if (!g) return;
  free(g->q);
  free(g->k);
  free(g->v);
  free(g->dout);
  free(g->o);
  free(g->lse);
  free(g->dq);
  free(g->dk);
  free(g->dv);
  free(g->alibi_);
  free(g->cu_q_);
  free(g->cu_k_);
  memset(g, 0, sizeof *g);
  g->peer_o = g->peer_lse = g->peer_dq = g->peer_dk = g->peer_dv = NAN;
}

/* ---------------------------------------------------------------------- */
/* Listing                                                                  */
/* ---------------------------------------------------------------------- */

static int has_case(const char *dir) {
  char path[4200];
  struct stat st;
  int n = snprintf(path, sizeof path, "%s/case.json", dir);
  if (n < 0 || (size_t)n >= sizeof path) return 0;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int at_golden_list(const char *root, char ***dirs, char *err, size_t errlen) {
  *dirs = NULL;
  if (!root || !*root) {
    at_seterr(err, errlen, "no golden folder given");
    return -1;
  }
  if (strlen(root) > 2048) {
    at_seterr(err, errlen, "%s: path too long", root);
    return -1;
  }
  if (has_case(root)) {
    char **one = malloc(sizeof *one);
    if (!one || !(one[0] = strdup(root))) {
      free(one);
      at_seterr(err, errlen, "out of memory");
      return -1;
    }
    *dirs = one;
    return 1;
  }
  DIR *dp = opendir(root);
  if (!dp) {
    at_seterr(err, errlen, "%s: %s", root, strerror(errno));
    return -1;
  }
  char **list = NULL;
  int n = 0, cap = 0;
  struct dirent *de;
  while ((de = readdir(dp)) != NULL) {
    if (de->d_name[0] == '.') continue;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", root, de->d_name);
    if (!has_case(path)) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 32;
      char **l2 = realloc(list, (size_t)cap * sizeof *l2);
      if (!l2) goto oom;
      list = l2;
    }
    if (!(list[n] = strdup(path))) goto oom;
    n++;
  }
  closedir(dp);
  /* Every path shares the root prefix, so sorting paths sorts names. */
  if (n > 1) qsort(list, (size_t)n, sizeof *list, cmp_str);
  *dirs = list;
  return n;
oom:
  closedir(dp);
  at_golden_list_free(list, n);
  at_seterr(err, errlen, "out of memory");
  return -1;
}

void at_golden_list_free(char **dirs, int n) {
  if (!dirs) return;
  for (int i = 0; i < n; i++)
    free(dirs[i]);
  free(dirs);
}
