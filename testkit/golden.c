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

/* An optional array of n integers in [lo, hi]: 0 with *out NULL when key is absent or null, 0
 * with a malloc'd array, or -1 with a sentence. */
static int load_ints(const at_json *root, const char *dir, const char *key, int64_t n, int64_t lo,
                     int64_t hi, int32_t **out, char *err, size_t errlen) {
  const at_json *a = at_json_get(root, key);
  *out = NULL;
  if (!a || a->type == AT_JSON_NULL) return 0;
  if (a->type != AT_JSON_ARR || a->n != n) {
    at_seterr(err, errlen, "%s/case.json: %s must be an array of %lld integers", dir, key,
              (long long)n);
    return -1;
  }
  int32_t *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
  if (!x) {
    at_seterr(err, errlen, "%s/case.json: out of memory", dir);
    return -1;
  }
  for (int i = 0; i < a->n; i++) {
    int64_t v;
    if (at_json_int(a->items[i], lo, hi, &v) != 0) {
      at_seterr(err, errlen, "%s/case.json: %s[%d] must be an integer in [%lld, %lld]", dir, key, i,
                (long long)lo, (long long)hi);
      free(x);
      return -1;
    }
    x[i] = (int32_t)v;
  }
  *out = x;
  return 0;
}

/* An optional non-negative integer: 0 when absent or null. */
static int opt_int(const at_json *root, const char *key, int64_t lo, int64_t *out) {
  const at_json *v = at_json_get(root, key);
  *out = 0;
  if (!v || v->type == AT_JSON_NULL) return 0;
  return at_json_int(v, lo, GOLDEN_MAX_DIM, out);
}

/* The block table, an array of batch arrays of max_pages integers (any int32: the library checks
 * the entries a sequence uses). */
static int load_table(const at_json *root, at_golden *g, char *err, size_t errlen) {
  const at_json *a = at_json_get(root, "block_table");
  if (!a || a->type != AT_JSON_ARR || a->n != g->batch) {
    at_seterr(err, errlen, "%s/case.json: block_table must be an array of batch = %lld arrays",
              g->dir, (long long)g->batch);
    return -1;
  }
  /* The rows' lengths first: the allocation is bounded by what the document holds. */
  for (int b = 0; b < a->n; b++)
    if (a->items[b]->type != AT_JSON_ARR || a->items[b]->n != g->max_pages) {
      at_seterr(err, errlen,
                "%s/case.json: block_table[%d] must be an array of max_pages = %lld integers",
                g->dir, b, (long long)g->max_pages);
      return -1;
    }
  g->block_table = malloc((size_t)(g->batch * g->max_pages) * sizeof *g->block_table);
  if (!g->block_table) {
    at_seterr(err, errlen, "%s/case.json: out of memory", g->dir);
    return -1;
  }
  for (int b = 0; b < a->n; b++) {
    const at_json *row = a->items[b];
    for (int c = 0; c < row->n; c++) {
      int64_t v;
      if (at_json_int(row->items[c], INT32_MIN, INT32_MAX, &v) != 0) {
        at_seterr(err, errlen, "%s/case.json: block_table[%d][%d] is not a 32-bit integer",
                  g->dir, b, c);
        return -1;
      }
      g->block_table[b * g->max_pages + c] = (int32_t)v;
    }
  }
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
  g->peer_dbias = g->peer_dsinks = NAN;
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
  /* A paged cache: k and v are pages, and the block table says where each sequence's keys are
   * (so a varlen case has no cu_seqlens_k). */
  if (opt_int(root, "page_size", 1, &g->page_size) != 0)
    FAIL("%s/case.json: page_size must be a positive integer", g->dir);
  if (g->page_size) {
    if (at_json_int(at_json_get(root, "max_pages"), 1, GOLDEN_MAX_DIM, &g->max_pages) != 0 ||
        at_json_int(at_json_get(root, "num_pages"), 1, GOLDEN_MAX_DIM, &g->num_pages) != 0)
      FAIL("%s/case.json: a paged case needs max_pages and num_pages, positive integers", g->dir);
    if ((double)g->batch * (double)g->max_pages > (double)GOLDEN_MAX_ELEMS ||
        (double)g->max_pages * (double)g->page_size > (double)INT32_MAX ||
        (double)g->num_pages * (double)g->page_size > (double)GOLDEN_MAX_ELEMS)
      FAIL("%s/case.json: the paged cache would be too large", g->dir);
    if (load_table(root, g, err, errlen) != 0) goto fail;
  }
  if (g->varlen) {
    v = at_json_get(root, "cu_seqlens_k");
    if (load_cu(root, "cu_seqlens_q", g->batch, &g->cu_q_, err, errlen) != 0) goto fail;
    if (g->page_size) {
      if (v && v->type != AT_JSON_NULL)
        FAIL("%s/case.json: cu_seqlens_k must be null in a paged case (the block table says "
             "where the keys are)", g->dir);
    } else if (load_cu(root, "cu_seqlens_k", g->batch, &g->cu_k_, err, errlen) != 0) {
      goto fail;
    }
    g->total_q = g->cu_q_[g->batch];
    g->total_k = g->cu_k_ ? g->cu_k_[g->batch] : 0;
    g->params.cu_seqlens_q = g->cu_q_;
    g->params.cu_seqlens_k = g->cu_k_;
    g->params.batch = g->batch;
  } else {
    if (at_json_int(at_json_get(root, "seqlen_q"), 1, GOLDEN_MAX_DIM, &g->seqlen_q) != 0 ||
        at_json_int(at_json_get(root, "seqlen_k"), 1, GOLDEN_MAX_DIM, &g->seqlen_k) != 0)
      FAIL("%s/case.json: seqlen_q and seqlen_k must be positive integers for layout bshd", g->dir);
    if (g->page_size && g->seqlen_k != g->max_pages * g->page_size)
      FAIL("%s/case.json: seqlen_k %lld of a paged case must be its capacity, max_pages * "
           "page_size = %lld", g->dir, (long long)g->seqlen_k,
           (long long)(g->max_pages * g->page_size));
    g->total_q = g->batch * g->seqlen_q;
    g->total_k = g->batch * g->seqlen_k;
  }
  if (g->page_size) g->total_k = g->num_pages * g->page_size;
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

  /* The KV cache's used lengths and appended rows. */
  if (load_ints(root, g->dir, "seqused_k", g->batch, 0, INT32_MAX, &g->seqused_k, err, errlen) !=
      0)
    goto fail;
  if (opt_int(root, "seqlen_new", 0, &g->seqlen_new) != 0)
    FAIL("%s/case.json: seqlen_new must be a non-negative integer", g->dir);
  if (g->seqlen_new && !g->seqused_k)
    FAIL("%s/case.json: seqlen_new needs seqused_k (where the new rows go)", g->dir);
  if ((double)g->batch * (double)g->seqlen_new * (double)g->heads_kv * (double)g->head_dim >
      (double)GOLDEN_MAX_ELEMS)
    FAIL("%s/case.json: the appended rows would be too large", g->dir);

  /* The score terms: a bias in its own dtype, whose size-1 dimensions broadcast, and sinks. */
  v = at_json_get(root, "bias_dtype");
  const at_json *bshape = at_json_get(root, "bias_shape");
  if ((v && v->type != AT_JSON_NULL) != (bshape && bshape->type != AT_JSON_NULL))
    FAIL("%s/case.json: bias_dtype and bias_shape go together", g->dir);
  if (v && v->type != AT_JSON_NULL) {
    if (v->type != AT_JSON_STR) FAIL("%s/case.json: bias_dtype must be a string", g->dir);
    if (strcmp(v->str, "f32") == 0)
      g->bias_dtype = ATTN_F32;
    else if (strcmp(v->str, "f16") == 0)
      g->bias_dtype = ATTN_F16;
    else if (strcmp(v->str, "bf16") == 0)
      g->bias_dtype = ATTN_BF16;
    else
      FAIL("%s/case.json: bias_dtype \"%s\" is not f32, f16 or bf16", g->dir, v->str);
    const int64_t full[2] = {g->batch, g->heads_q};
    double n = 1;
    if (bshape->type != AT_JSON_ARR || bshape->n != 4)
      FAIL("%s/case.json: bias_shape must be [batch or 1, heads_q or 1, seqlen_q or 1, seqlen_k]",
           g->dir);
    for (int i = 0; i < 4; i++) {
      if (at_json_int(bshape->items[i], 1, GOLDEN_MAX_DIM, &g->bias_shape[i]) != 0 ||
          (i < 2 && g->bias_shape[i] != 1 && g->bias_shape[i] != full[i]))
        FAIL("%s/case.json: bias_shape[%d] must be a positive integer (%s)", g->dir, i,
             i == 0 ? "batch or 1" : i == 1 ? "heads_q or 1" : i == 2 ? "seqlen_q or 1" : "seqlen_k");
      n *= (double)g->bias_shape[i];
    }
    if (n > (double)GOLDEN_MAX_ELEMS) FAIL("%s/case.json: the bias would be too large", g->dir);
  }
  v = at_json_get(root, "sinks");
  if (v && v->type != AT_JSON_NULL) {
    if (v->type != AT_JSON_ARR || v->n != g->heads_q)
      FAIL("%s/case.json: sinks must be null or an array of heads_q = %lld numbers", g->dir,
           (long long)g->heads_q);
    g->sinks = malloc((size_t)v->n * sizeof *g->sinks);
    if (!g->sinks) FAIL("%s: out of memory", g->dir);
    for (int i = 0; i < v->n; i++) {
      if (v->items[i]->type != AT_JSON_NUM || !isfinite(v->items[i]->num))
        FAIL("%s/case.json: sinks[%d] is not a finite number", g->dir, i);
      g->sinks[i] = (float)v->items[i]->num;
    }
  }

  const at_json *peer = at_json_get(root, "peer_max_err");
  if (peer && peer->type == AT_JSON_OBJ) {
    g->peer_o = peer_of(peer, "o");
    g->peer_lse = peer_of(peer, "lse");
    g->peer_dq = peer_of(peer, "dq");
    g->peer_dk = peer_of(peer, "dk");
    g->peer_dv = peer_of(peer, "dv");
    g->peer_dbias = peer_of(peer, "dbias");
    g->peer_dsinks = peer_of(peer, "dsinks");
  }

  {
    int64_t B = g->batch, Hq = g->heads_q, Hkv = g->heads_kv, d = g->head_dim;
    int64_t qs[4], ks[4], ls[3];
    int nd = g->varlen ? 3 : 4, knd = g->page_size ? 4 : nd;
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
    if (g->page_size) {
      int64_t a[4] = {g->num_pages, g->page_size, Hkv, d};
      memcpy(ks, a, sizeof a);
    }
    const int64_t ns[4] = {B, g->seqlen_new, Hkv, d}, hs[1] = {Hq};
    at_npy_want in = g->dtype == ATTN_F32 ? AT_NPY_F32 : AT_NPY_U16;
    if (load_npy(g, "q", 0, in, nd, qs, &g->q, err, errlen) != 0 ||
        load_npy(g, "k", 0, in, knd, ks, &g->k, err, errlen) != 0 ||
        load_npy(g, "v", 0, in, knd, ks, &g->v, err, errlen) != 0 ||
        load_npy(g, "o", 0, AT_NPY_F32, nd, qs, (void **)&g->o, err, errlen) != 0 ||
        load_npy(g, "lse", 0, AT_NPY_F32, nd - 1, ls, (void **)&g->lse, err, errlen) != 0 ||
        load_npy(g, "do", 1, in, nd, qs, &g->dout, err, errlen) != 0 ||
        load_npy(g, "dq", 1, AT_NPY_F32, nd, qs, (void **)&g->dq, err, errlen) != 0 ||
        load_npy(g, "dk", 1, AT_NPY_F32, knd, ks, (void **)&g->dk, err, errlen) != 0 ||
        load_npy(g, "dv", 1, AT_NPY_F32, knd, ks, (void **)&g->dv, err, errlen) != 0)
      goto fail;
    if (g->seqlen_new &&
        (load_npy(g, "k_new", 0, in, 4, ns, &g->k_new, err, errlen) != 0 ||
         load_npy(g, "v_new", 0, in, 4, ns, &g->v_new, err, errlen) != 0 ||
         load_npy(g, "k_out", 0, in, knd, ks, &g->k_out, err, errlen) != 0 ||
         load_npy(g, "v_out", 0, in, knd, ks, &g->v_out, err, errlen) != 0))
      goto fail;
    if (g->bias_shape[0] &&
        (load_npy(g, "bias", 0, g->bias_dtype == ATTN_F32 ? AT_NPY_F32 : AT_NPY_U16, 4,
                  g->bias_shape, &g->bias, err, errlen) != 0 ||
         load_npy(g, "dbias", 1, AT_NPY_F32, 4, g->bias_shape, (void **)&g->dbias, err, errlen) !=
             0))
      goto fail;
    if (g->sinks &&
        load_npy(g, "dsinks", 1, AT_NPY_F32, 1, hs, (void **)&g->dsinks, err, errlen) != 0)
      goto fail;
    /* The KV-cache fields are the forward pass's: such a case has no backward to check. */
    if ((g->seqused_k || g->page_size) && (g->dout || g->dq || g->dk || g->dv))
      FAIL("%s: a case with a KV cache (seqused_k, pages) is forward only, but it has gradient "
           "files (do.npy, dq.npy, ...)", g->dir);
    /* A backward check needs the upstream gradient and all three answers. */
    if (!g->dout || !g->dq || !g->dk || !g->dv) {
      free(g->dout);
      free(g->dq);
      free(g->dk);
      free(g->dv);
      free(g->dbias);
      free(g->dsinks);
      g->dout = NULL;
      g->dq = g->dk = g->dv = g->dbias = g->dsinks = NULL;
    }
  }

  /* What params points to. */
  g->meta_ = calloc(6, sizeof *g->meta_);
  if (!g->meta_) FAIL("%s: out of memory", g->dir);
  if (g->seqused_k) {
    g->meta_[0] = attn_tensor_1d(g->seqused_k, ATTN_I32, g->batch);
    g->params.seqused_k = &g->meta_[0];
  }
  if (g->page_size) {
    g->meta_[1] = attn_tensor_2d(g->block_table, ATTN_I32, g->batch, g->max_pages);
    g->params.block_table = &g->meta_[1];
  }
  if (g->seqlen_new) {
    g->meta_[2] = attn_tensor_bshd(g->k_new, g->dtype, g->batch, g->seqlen_new, g->heads_kv,
                                   g->head_dim);
    g->meta_[3] = attn_tensor_bshd(g->v_new, g->dtype, g->batch, g->seqlen_new, g->heads_kv,
                                   g->head_dim);
    g->params.k_new = &g->meta_[2];
    g->params.v_new = &g->meta_[3];
  }
  if (g->bias) {
    g->meta_[4] = attn_tensor_bias(g->bias, g->bias_dtype, g->bias_shape[0], g->bias_shape[1],
                                   g->bias_shape[2], g->bias_shape[3]);
    g->params.bias = &g->meta_[4];
  }
  if (g->sinks) {
    g->meta_[5] = attn_tensor_1d(g->sinks, ATTN_F32, g->heads_q);
    g->params.sinks = &g->meta_[5];
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
  free(g->seqused_k);
  free(g->k_new);
  free(g->v_new);
  free(g->k_out);
  free(g->v_out);
  free(g->block_table);
  free(g->bias);
  free(g->sinks);
  free(g->dbias);
  free(g->dsinks);
  free(g->alibi_);
  free(g->cu_q_);
  free(g->cu_k_);
  free(g->meta_);
  memset(g, 0, sizeof *g);
  g->peer_o = g->peer_lse = g->peer_dq = g->peer_dk = g->peer_dv = NAN;
  g->peer_dbias = g->peer_dsinks = NAN;
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
