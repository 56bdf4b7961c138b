/* Validation: every argument of forward/backward is checked here, once, and
 * turned into the normalized attn__problem the backends receive. Each class
 * of bad input has its own status, and the sentence names the argument. */
#include "attn_internal.h"

#include <stddef.h>

#include <stdio.h>
#include <stdlib.h>

/* Where a tensor's bytes are, for the aliasing checks. Host memory (and the
 * buffers of a host-memory backend) share one address space, space = NULL;
 * a device buffer is its own space, keyed by its native handle. */
typedef struct region {
  const void *space;
  uintptr_t lo, hi; /* [lo, hi) in bytes */
  const attn_tensor *t;
  size_t esize;
} region;

static const char *const dims_bshd[4] = {"batch", "seqlen", "heads", "head_dim"};
static const char *const dims_varlen[3] = {"rows", "heads", "head_dim"};
static const char *const dims_lse_bshd[4] = {"batch", "heads", "seqlen", "hilo"};
static const char *const dims_lse_varlen[3] = {"heads", "rows", "hilo"};
static const char *const dims_paged[4] = {"pages", "page_size", "heads", "head_dim"};
static const char *const dims_bias[4] = {"batch", "heads", "seqlen_q", "seqlen_k"};
static const char *const dims_batch[1] = {"batch"};
static const char *const dims_heads[1] = {"heads"};
static const char *const dims_table[2] = {"batch", "max_pages"};

static int mul_overflows(int64_t a, int64_t b, int64_t *out) {
  if (a != 0 && b > INT64_MAX / a) return 1;
  *out = a * b;
  return 0;
}

/* Elements do not overlap when, with the dimensions sorted by stride, each
 * stride is larger than the furthest offset the smaller dimensions reach. */
static int strides_overlap(const attn_tensor *t) {
  int idx[4], n = 0;
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] > 1) idx[n++] = i;
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && t->stride[idx[j]] < t->stride[idx[j - 1]]; j--) {
      int tmp = idx[j];
      idx[j] = idx[j - 1];
      idx[j - 1] = tmp;
    }
  int64_t reach = 0; /* furthest element offset of the smaller dimensions */
  for (int i = 0; i < n; i++) {
    int64_t s = t->stride[idx[i]];
    if (s <= reach) return 1;
    reach += s * (t->shape[idx[i]] - 1);
  }
  return 0;
}

/* Checks one tensor: memory, dtype, rank, shape against `want` (entries < 0
 * are free but must be positive), strides and extent. Fills r. */
static int check_tensor(attn_context *ctx, const char *name, const attn_tensor *t, attn_dtype dtype,
                        int ndim, const char *const *dims, const int64_t *want, region *r) {
  if (!t) return attn__error(ctx, ATTN_ENULL, "%s is NULL", name);
  if (!t->data && !t->buffer)
    return attn__error(ctx, ATTN_ENULL, "%s: data and buffer are both NULL", name);
  if (t->data && t->buffer)
    return attn__error(ctx, ATTN_EINVAL, "%s: give either data (host memory) or buffer, not both",
                       name);
  if (t->buffer && t->buffer->ctx != ctx)
    return attn__error(ctx, ATTN_EBUFFER, "%s: the buffer belongs to another context", name);
  if ((unsigned)t->dtype > ATTN_I32)
    return attn__error(ctx, ATTN_EDTYPE, "%s: dtype %d is not f32, f16, bf16 or i32", name,
                       (int)t->dtype);
  if (t->dtype != dtype)
    return attn__error(ctx, ATTN_EDTYPE, "%s: dtype %s differs from the expected %s", name,
                       attn_dtype_name(t->dtype), attn_dtype_name(dtype));
  if (t->ndim != ndim)
    return attn__error(ctx, ATTN_ESHAPE, "%s: ndim is %d, expected %d", name, t->ndim, ndim);
  for (int i = 0; i < ndim; i++) {
    if (t->shape[i] <= 0)
      return attn__error(ctx, ATTN_ESIZE, "%s: shape[%d] (%s) is %lld; sizes must be positive",
                         name, i, dims[i], (long long)t->shape[i]);
  }
  for (int i = 0; i < ndim; i++) {
    if (want && want[i] >= 0 && t->shape[i] != want[i])
      return attn__error(ctx, ATTN_ESHAPE, "%s: shape[%d] (%s) is %lld, expected %lld", name, i,
                         dims[i], (long long)t->shape[i], (long long)want[i]);
  }
  for (int i = 0; i < ndim; i++)
    if (t->stride[i] < 0)
      return attn__error(ctx, ATTN_ESTRIDE, "%s: stride[%d] (%s) is negative (%lld)", name, i,
                         dims[i], (long long)t->stride[i]);
  /* Extent, in elements then bytes, with every product checked. */
  int64_t count = 1, last = 0;
  for (int i = 0; i < ndim; i++) {
    int64_t span;
    if (mul_overflows(count, t->shape[i], &count) ||
        mul_overflows(t->shape[i] - 1, t->stride[i], &span) || last > INT64_MAX - span)
      return attn__error(ctx, ATTN_EOVERFLOW, "%s: shape and strides overflow a 64-bit offset",
                         name);
    last += span;
  }
  size_t esize = attn_dtype_size(t->dtype);
  if ((uint64_t)last >= (uint64_t)(SIZE_MAX / esize) - 1 ||
      (uint64_t)last > (uint64_t)INT64_MAX / esize - 1)
    /* last is at most INT64_MAX here, so the count is one past it: unsigned. */
    return attn__error(ctx, ATTN_EOVERFLOW, "%s: its extent (%llu elements) overflows size_t", name,
                       (unsigned long long)last + 1);
  size_t bytes = ((size_t)last + 1) * esize;
  if (strides_overlap(t))
    return attn__error(
        ctx, ATTN_ESTRIDE, "%s: strides {%lld, %lld, %lld, %lld} make elements overlap", name,
        (long long)t->stride[0], (long long)(ndim > 1 ? t->stride[1] : 0),
        (long long)(ndim > 2 ? t->stride[2] : 0), (long long)(ndim > 3 ? t->stride[3] : 0));
  r->t = t;
  r->esize = esize;
  if (t->buffer) {
    if (t->offset % esize != 0)
      return attn__error(ctx, ATTN_EBUFFER,
                         "%s: offset %zu is not a multiple of the %zu-byte element", name,
                         t->offset, esize);
    if (t->offset > t->buffer->bytes || bytes > t->buffer->bytes - t->offset)
      return attn__error(ctx, ATTN_EBUFFER,
                         "%s: needs %zu bytes at offset %zu, but its buffer holds %zu", name, bytes,
                         t->offset, t->buffer->bytes);
    if (ctx->backend && ctx->backend->host_memory) {
      /* A wrapped host pointer may itself be misaligned. */
      if (((uintptr_t)t->buffer->native + t->offset) % esize != 0)
        return attn__error(ctx, ATTN_EBUFFER,
                           "%s: the buffer's memory at offset %zu is not aligned to the %zu-byte "
                           "element",
                           name, t->offset, esize);
      r->space = NULL;
      r->lo = (uintptr_t)t->buffer->native + t->offset;
    } else {
      r->space = t->buffer->native;
      r->lo = t->offset;
    }
  } else {
    /* The CPU backend and the reference read host memory through typed
     * pointers: a misaligned one is undefined behaviour there. */
    if ((uintptr_t)t->data % esize != 0)
      return attn__error(ctx, ATTN_EINVAL,
                         "%s: data is not aligned to its element size (%zu bytes)", name, esize);
    if ((uintptr_t)t->data > UINTPTR_MAX - bytes)
      return attn__error(ctx, ATTN_EOVERFLOW, "%s: data + extent wraps the address space", name);
    r->space = NULL;
    r->lo = (uintptr_t)t->data;
  }
  r->hi = r->lo + bytes;
  return ATTN_OK;
}

/* Whether some element of a lies in the same bytes as some element of b. Two
 * tensors with the same strides (slices of one fused tensor) are checked
 * exactly; otherwise intersecting address ranges count as sharing. */
static int elements_meet(const attn_tensor *t, int dim, int64_t rem, int64_t esize) {
  if (dim < 0) return rem > -esize && rem < esize;
  /* A dimension of one element adds no offset, and its stride, never
   * followed, may be any value (its byte count may overflow). */
  int64_t n = t->shape[dim];
  if (n == 1 || t->stride[dim] == 0) return elements_meet(t, dim - 1, rem, esize);
  /* The smaller dimensions reach less than one stride (strides_overlap),
   * so only the two multiples of this stride nearest to rem can work. */
  int64_t s = t->stride[dim] * esize;
  int64_t c0 = rem / s;
  for (int64_t c = c0 - 1; c <= c0 + 1; c++)
    if (c > -n && c < n && elements_meet(t, dim - 1, rem - c * s, esize)) return 1;
  return 0;
}

static int regions_share(const region *a, const region *b) {
  if (a->space != b->space || a->hi <= b->lo || b->hi <= a->lo) return 0;
  const attn_tensor *ta = a->t, *tb = b->t;
  if (ta->ndim != tb->ndim || a->esize != b->esize) return 1;
  for (int i = 0; i < ta->ndim; i++)
    if (ta->shape[i] != tb->shape[i] || ta->stride[i] != tb->stride[i]) return 1;
  /* Sort dimensions by stride so the search goes from the largest down. */
  attn_tensor s = *ta;
  for (int i = 1; i < s.ndim; i++)
    for (int j = i; j > 0 && s.stride[j] < s.stride[j - 1]; j--) {
      int64_t x = s.stride[j];
      s.stride[j] = s.stride[j - 1];
      s.stride[j - 1] = x;
      x = s.shape[j];
      s.shape[j] = s.shape[j - 1];
      s.shape[j - 1] = x;
    }
  int64_t delta = (int64_t)(b->lo - a->lo);
  return elements_meet(&s, s.ndim - 1, delta, (int64_t)a->esize);
}

/* k or v, whose head_dim must be q's (want[nd - 1]): named as such before
 * check_tensor's general shape message. */
static int check_kv(attn_context *ctx, const char *name, const attn_tensor *t, attn_dtype dtype,
                    int nd, const char *const *dims, const int64_t *want, region *out) {
  const int64_t d = want[nd - 1];
  if (t->ndim == nd && t->shape[nd - 1] != d && t->shape[nd - 1] > 0)
    return attn__error(ctx, ATTN_ESHAPE, "%s: head_dim %lld differs from q's %lld", name,
                       (long long)t->shape[nd - 1], (long long)d);
  return check_tensor(ctx, name, t, dtype, nd, dims, want, out);
}

static void fill_tensor(attn_context *ctx, const attn_tensor *t, int varlen, int is_lse,
                        attn__tensor *out) {
  if (t->buffer) {
    out->native = t->buffer->native;
    out->offset = t->offset;
  } else {
    out->native = t->data;
    out->offset = 0;
  }
  out->staged = !t->buffer && ctx && ctx->backend && !ctx->backend->host_memory;
  out->dtype = t->dtype;
  if (is_lse) {
    /* bshd [B, H, N]; varlen [H, total]. */
    out->sb = varlen ? 0 : t->stride[0];
    out->sh = varlen ? t->stride[0] : t->stride[1];
    out->ss = varlen ? t->stride[1] : t->stride[2];
    out->sd = 0;
  } else if (varlen) {
    out->sb = 0;
    out->ss = t->stride[0];
    out->sh = t->stride[1];
    out->sd = t->stride[2];
  } else {
    out->sb = t->stride[0];
    out->ss = t->stride[1];
    out->sh = t->stride[2];
    out->sd = t->stride[3];
  }
  (void)ctx;
}

/* A metadata tensor (1-d or 2-d): memory only; the caller sets strides. */
static void fill_meta(attn_context *ctx, const attn_tensor *t, attn__tensor *out) {
  memset(out, 0, sizeof *out);
  out->native = t->buffer ? t->buffer->native : t->data;
  out->offset = t->buffer ? t->offset : 0;
  out->staged = !t->buffer && ctx && ctx->backend && !ctx->backend->host_memory;
  out->dtype = t->dtype;
}

/* A bias or its gradient: [b, h, i, j] strides, 0 where the size is 1. */
static void fill_bias(attn_context *ctx, const attn_tensor *t, attn__tensor *out) {
  fill_meta(ctx, t, out);
  out->sb = t->shape[0] == 1 ? 0 : t->stride[0];
  out->sh = t->shape[1] == 1 ? 0 : t->stride[1];
  out->ss = t->shape[2] == 1 ? 0 : t->stride[2];
  out->sd = t->stride[3];
}

/* A metadata tensor given in place of a host pointer (cu_seqlens_*_tensor,
 * alibi_slopes_tensor): checked as an input of n contiguous entries. Where
 * the host can read it (data, or a host backend's buffer) *host points at
 * its values and it is then checked as the pointer is; in a device buffer
 * *host is NULL and *dev says where it is. */
static int meta_form(attn_context *ctx, const char *name, const char *ptr_name, int ptr_set,
                     const attn_tensor *t, attn_dtype dtype, const char *dim, int64_t n, region *r,
                     const void **host, attn__tensor *dev) {
  const char *const dims[1] = {dim};
  const int64_t want[1] = {n};
  if (ptr_set)
    return attn__error(ctx, ATTN_EINVAL, "%s and %s are both set; give one of them", name,
                       ptr_name);
  int rc = check_tensor(ctx, name, t, dtype, 1, dims, want, r);
  if (rc) return rc;
  if (n > 1 && t->stride[0] != 1)
    return attn__error(ctx, ATTN_ESTRIDE, "%s: stride[0] is %lld; it must be contiguous (1)", name,
                       (long long)t->stride[0]);
  memset(dev, 0, sizeof *dev);
  if (t->data) {
    *host = t->data;
  } else if (ctx && ctx->backend && ctx->backend->host_memory) {
    *host = (const char *)t->buffer->native + t->offset;
  } else {
    *host = NULL;
    fill_meta(ctx, t, dev);
    dev->sb = 1;
  }
  return ATTN_OK;
}

static int check_cu(attn_context *ctx, const char *name, const int32_t *cu, int64_t batch,
                    int64_t rows, int64_t *longest) {
  if (!cu)
    return attn__error(ctx, ATTN_ESEQLENS, "params.%s is NULL for a varlen (3-d) tensor", name);
  if (cu[0] != 0)
    return attn__error(ctx, ATTN_ESEQLENS, "params.%s[0] is %d; it must start at 0", name, cu[0]);
  *longest = 0;
  for (int64_t b = 0; b < batch; b++) {
    if (cu[b + 1] < cu[b])
      return attn__error(ctx, ATTN_ESEQLENS, "params.%s decreases at [%lld]: %d after %d", name,
                         (long long)b + 1, cu[b + 1], cu[b]);
    if (cu[b + 1] - cu[b] > *longest) *longest = cu[b + 1] - cu[b];
  }
  if (cu[batch] != rows)
    return attn__error(ctx, ATTN_ESEQLENS,
                       "params.%s[%lld] is %d, but the tensor has %lld rows; they must agree", name,
                       (long long)batch, cu[batch], (long long)rows);
  return ATTN_OK;
}

#define KNOWN_FLAGS (ATTN_CAUSAL | ATTN_DETERMINISTIC | ATTN_ALLOW_TF32 | ATTN_ASYNC)

/* The sizes attn_params has had: the first version's, every field up to
 * alibi and varlen (88 bytes on LP64), then this version's, with the
 * inference path's fields. A caller built against an earlier attn.h passes
 * its own size and gets the defaults of the fields it lacks. */
static const size_t params_sizes[] = {offsetof(attn_params, batch) + sizeof(int64_t),
                                      sizeof(attn_params)};
/* A size this large is not an attn_params of any version: uninitialized. */
#define PARAMS_SIZE_MAX 4096

/* The caller's attn_params as this version knows it, in *out: the fields its
 * size covers over the defaults. Bytes past this version's fields must be
 * zero, the defaults of fields this version does not know. */
int attn__params_read(attn_context *ctx, const attn_params *p, attn_params *out) {
  int known = p->size > sizeof(attn_params) && p->size <= PARAMS_SIZE_MAX;
  for (size_t i = 0; i < sizeof params_sizes / sizeof params_sizes[0]; i++)
    known |= p->size == params_sizes[i];
  if (!known)
    return attn__error(ctx, ATTN_EINVAL,
                       "params.size is %zu; it is set by attn_params_init() (%zu in this "
                       "version): initialize params with it",
                       p->size, sizeof(attn_params));
  const unsigned char *extra = (const unsigned char *)p + sizeof(attn_params);
  for (size_t i = 0; i + sizeof(attn_params) < p->size; i++)
    if (extra[i])
      return attn__error(ctx, ATTN_EINVAL,
                         "params: byte %zu is set, but this version of attn knows only the first "
                         "%zu bytes of attn_params; the caller's later fields cannot be honoured",
                         sizeof(attn_params) + i, sizeof(attn_params));
  attn_params_init(out);
  memcpy(out, p, p->size < sizeof *out ? p->size : sizeof *out);
  out->size = sizeof *out;
  return ATTN_OK;
}

int attn__problem_build(attn_context *ctx, enum attn__op op, const attn_params *caller,
                        const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                        const attn_tensor *o, const attn_tensor *lse, const attn_tensor *dout,
                        const attn_tensor *dq, const attn_tensor *dk, const attn_tensor *dv,
                        attn__problem *pb) {
  if (!caller) return attn__error(ctx, ATTN_ENULL, "params is NULL");
  attn_params params;
  int rc = attn__params_read(ctx, caller, &params);
  if (rc) return rc;
  const attn_params *p = &params;
  if (!q) return attn__error(ctx, ATTN_ENULL, "q is NULL");
  if (!k) return attn__error(ctx, ATTN_ENULL, "k is NULL");
  if (!v) return attn__error(ctx, ATTN_ENULL, "v is NULL");
  if (op == ATTN__FORWARD && !o) return attn__error(ctx, ATTN_ENULL, "o is NULL");
  if (op == ATTN__BACKWARD) {
    const attn_tensor *req[] = {o, lse, dout, dq, dk, dv};
    const char *names[] = {"o", "lse", "do", "dq", "dk", "dv"};
    for (int i = 0; i < 6; i++)
      if (!req[i]) return attn__error(ctx, ATTN_ENULL, "%s is NULL", names[i]);
  }
  if (op == ATTN__REFERENCE && (q->buffer || k->buffer || v->buffer))
    return attn__error(ctx, ATTN_EINVAL, "the reference takes host tensors only");

  /* Layout from q's rank. */
  int varlen;
  if (q->ndim == 4) {
    varlen = 0;
  } else if (q->ndim == 3) {
    varlen = 1;
  } else {
    return attn__error(ctx, ATTN_ESHAPE, "q: ndim is %d; 4 (bshd) or 3 (varlen) expected", q->ndim);
  }
  const char *const *dims = varlen ? dims_varlen : dims_bshd;
  int nd = q->ndim;
  attn_dtype dt = q->dtype;
  if ((unsigned)dt > ATTN_BF16)
    return attn__error(ctx, ATTN_EDTYPE, "q: dtype %d is not f32, f16 or bf16", (int)dt);

  int64_t d = q->shape[nd - 1];
  if (d > ATTN_MAX_HEAD_DIM)
    return attn__error(ctx, ATTN_EHEADDIM, "q: head_dim %lld is above the maximum %d", (long long)d,
                       ATTN_MAX_HEAD_DIM);
  region rq, rk, rv;
  rc = check_tensor(ctx, "q", q, dt, nd, dims, NULL, &rq);
  if (rc) return rc;
  int64_t hq = q->shape[nd - 2];
  /* The KV-cache fields are the forward pass's. */
  const int cache_op = op == ATTN__FORWARD || op == ATTN__SUPPORTS || op == ATTN__REFERENCE;
  const int paged = p->block_table != NULL;
  if (!cache_op && (p->seqused_k || p->k_new || p->v_new || paged))
    return attn__error(ctx, ATTN_EINVAL,
                       "params.%s is set, but the KV-cache fields are for the forward pass only",
                       p->seqused_k ? "seqused_k"
                       : p->k_new   ? "k_new"
                       : p->v_new   ? "v_new"
                                    : "block_table");
  if (p->num_splits < 0)
    return attn__error(ctx, ATTN_EINVAL,
                       "params.num_splits is %d; 0 (choose), 1 (none) or a count of parts",
                       p->num_splits);
  /* k: same batch and head_dim as q; its own sequence length and heads. Paged:
   * [pages, page_size, heads, head_dim] whatever q's layout. */
  const int knd = paged ? 4 : nd;
  const char *const *kdims = paged ? dims_paged : dims;
  int64_t want_k[4] = {varlen || paged ? -1 : q->shape[0], -1, -1, -1};
  want_k[knd - 1] = d;
  rc = check_kv(ctx, "k", k, dt, knd, kdims, want_k, &rk);
  if (rc) return rc;
  int64_t hkv = k->shape[knd - 2];
  int64_t want_v[4];
  for (int i = 0; i < knd; i++)
    want_v[i] = k->shape[i];
  rc = check_kv(ctx, "v", v, dt, knd, kdims, want_v, &rv);
  if (rc) return rc;
  if (hq % hkv != 0)
    return attn__error(
        ctx, ATTN_EHEADS,
        "k: %lld key/value heads do not divide q's %lld heads (GQA needs Hq %% Hkv == 0)",
        (long long)hkv, (long long)hq);

  /* Sequences. */
  int64_t batch, nq, nk, total_q, total_k;
  region rcuq = {0}, rcuk = {0}, ralibi = {0};
  attn__tensor cuq_dev = {0}, cuk_dev = {0}, alibi_dev = {0};
  if (varlen) {
    if (p->batch <= 0)
      return attn__error(ctx, ATTN_ESIZE,
                         "params.batch is %lld; a varlen call needs the number of "
                         "sequences (> 0)",
                         (long long)p->batch);
    batch = p->batch;
    total_q = q->shape[0];
    total_k = k->shape[0];
    if (p->cu_seqlens_q_tensor) {
      const void *h;
      rc = meta_form(ctx, "params.cu_seqlens_q_tensor", "params.cu_seqlens_q",
                     p->cu_seqlens_q != NULL, p->cu_seqlens_q_tensor, ATTN_I32, "batch + 1",
                     batch + 1, &rcuq, &h, &cuq_dev);
      if (rc) return rc;
      params.cu_seqlens_q = h;
    }
    if (p->cu_seqlens_k_tensor && !paged) {
      const void *h;
      rc = meta_form(ctx, "params.cu_seqlens_k_tensor", "params.cu_seqlens_k",
                     p->cu_seqlens_k != NULL, p->cu_seqlens_k_tensor, ATTN_I32, "batch + 1",
                     batch + 1, &rcuk, &h, &cuk_dev);
      if (rc) return rc;
      params.cu_seqlens_k = h;
    }
    /* On the device the lengths are unknown here: the tensors' rows bound
     * them. */
    if (cuq_dev.native) {
      nq = total_q;
    } else {
      rc = check_cu(ctx, p->cu_seqlens_q_tensor ? "cu_seqlens_q_tensor" : "cu_seqlens_q",
                    p->cu_seqlens_q, batch, total_q, &nq);
      if (rc) return rc;
    }
    if (paged) {
      if (p->cu_seqlens_k || p->cu_seqlens_k_tensor)
        return attn__error(ctx, ATTN_ESEQLENS,
                           "params.cu_seqlens_k%s is set, but k is paged (params.block_table): "
                           "the block table and seqused_k say where each sequence's keys are",
                           p->cu_seqlens_k ? "" : "_tensor");
    } else if (cuk_dev.native) {
      nk = total_k;
      if (p->k_new)
        return attn__error(ctx, ATTN_EINVAL,
                           "params.k_new appends to a varlen cache whose cu_seqlens_k is in a "
                           "device buffer; give cu_seqlens_k in host memory, where each "
                           "sequence's room for the new rows is checked");
    } else {
      rc = check_cu(ctx, p->cu_seqlens_k_tensor ? "cu_seqlens_k_tensor" : "cu_seqlens_k",
                    p->cu_seqlens_k, batch, total_k, &nk);
      if (rc) return rc;
    }
  } else {
    if (p->cu_seqlens_q || p->cu_seqlens_k || p->cu_seqlens_q_tensor || p->cu_seqlens_k_tensor)
      return attn__error(ctx, ATTN_ESEQLENS,
                         "params.cu_seqlens_%c%s is set, but q is 4-d (bshd); varlen tensors are "
                         "3-d",
                         p->cu_seqlens_q || p->cu_seqlens_q_tensor ? 'q' : 'k',
                         p->cu_seqlens_q || p->cu_seqlens_k ? "" : "_tensor");
    batch = q->shape[0];
    nq = q->shape[1];
    nk = paged ? 0 : k->shape[1];
    if (mul_overflows(batch, nq, &total_q) || mul_overflows(batch, nk, &total_k))
      return attn__error(ctx, ATTN_EOVERFLOW, "q: batch * seqlen overflows");
  }

  /* Paged keys: the block table, and the capacity it gives each sequence. */
  region rbt = {0}, rsu = {0}, rkn = {0}, rvn = {0};
  int64_t page_size = 0, max_pages = 0;
  if (paged) {
    int64_t want[2] = {batch, -1};
    rc = check_tensor(ctx, "params.block_table", p->block_table, ATTN_I32, 2, dims_table, want,
                      &rbt);
    if (rc) return rc;
    page_size = k->shape[1];
    max_pages = p->block_table->shape[1];
    if (mul_overflows(max_pages, page_size, &nk) || nk > INT32_MAX ||
        mul_overflows(k->shape[0], page_size, &total_k))
      return attn__error(ctx, ATTN_EOVERFLOW,
                         "params.block_table: max_pages * page_size overflows 32-bit rows");
  }
  /* The cache's used lengths and the rows appended to it. */
  int64_t seqlen_new = 0;
  if ((p->k_new != NULL) != (p->v_new != NULL))
    return attn__error(ctx, ATTN_ENULL, "params.%s is NULL but params.%s is set: append both",
                       p->k_new ? "v_new" : "k_new", p->k_new ? "k_new" : "v_new");
  if (p->k_new && !p->seqused_k)
    return attn__error(ctx, ATTN_EINVAL,
                       "params.k_new is set without params.seqused_k, which says where the new "
                       "rows go");
  if (p->k_new) {
    int64_t want[4] = {batch, -1, hkv, d};
    rc = check_kv(ctx, "params.k_new", p->k_new, dt, 4, dims_bshd, want, &rkn);
    if (rc) return rc;
    seqlen_new = p->k_new->shape[1];
    int64_t want_vn[4] = {batch, seqlen_new, hkv, d};
    rc = check_kv(ctx, "params.v_new", p->v_new, dt, 4, dims_bshd, want_vn, &rvn);
    if (rc) return rc;
  }
  if (p->seqused_k) {
    int64_t want[1] = {batch};
    rc = check_tensor(ctx, "params.seqused_k", p->seqused_k, ATTN_I32, 1, dims_batch, want, &rsu);
    if (rc) return rc;
  }
  if (p->seqused_k && p->seqused_k->data) {
    for (int64_t b = 0; b < batch; b++) {
      const int64_t u = ((const int32_t *)p->seqused_k->data)[b * p->seqused_k->stride[0]];
      const int64_t cap =
          p->cu_seqlens_k ? (int64_t)p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b] : nk;
      if (u < 0 || u + seqlen_new > cap)
        return attn__error(ctx, ATTN_ECACHE,
                           "params.seqused_k[%lld] is %lld; with %lld new rows it must lie in "
                           "[0, %lld], the sequence's capacity",
                           (long long)b, (long long)u, (long long)seqlen_new,
                           (long long)(cap - seqlen_new));
    }
  } else if (seqlen_new > 0) {
    /* Lengths on the device are clamped, not checked, but each sequence must
     * hold the new rows: a varlen one its own cu_seqlens_k length, not just
     * the longest (the rules would clamp to a negative used length and the
     * append write before the sequence). */
    for (int64_t b = 0; b < (p->cu_seqlens_k ? batch : 1); b++) {
      const int64_t cap =
          p->cu_seqlens_k ? (int64_t)p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b] : nk;
      if (seqlen_new > cap)
        return attn__error(ctx, ATTN_ECACHE,
                           "params.k_new: %lld new rows do not fit sequence %lld's cache of %lld "
                           "rows",
                           (long long)seqlen_new, (long long)b, (long long)cap);
    }
  }
  if (paged && p->block_table->data) {
    /* The pages a sequence uses (all of its row when its length is on the
     * device) must exist. */
    const attn_tensor *bt = p->block_table;
    for (int64_t b = 0; b < batch; b++) {
      int64_t used = max_pages;
      if (p->seqused_k && p->seqused_k->data) {
        const int64_t u = ((const int32_t *)p->seqused_k->data)[b * p->seqused_k->stride[0]];
        used = (u + seqlen_new + page_size - 1) / page_size;
      }
      for (int64_t c = 0; c < used; c++) {
        const int32_t e = ((const int32_t *)bt->data)[b * bt->stride[0] + c * bt->stride[1]];
        if (e < 0 || e >= k->shape[0])
          return attn__error(ctx, ATTN_ECACHE,
                             "params.block_table[%lld][%lld] is %d; k and v have %lld pages",
                             (long long)b, (long long)c, e, (long long)k->shape[0]);
      }
    }
  }

  /* Scalars. */
  if (!isfinite(p->scale) || p->scale < 0)
    return attn__error(ctx, ATTN_ESCALAR,
                       "params.scale is %g; it must be finite and >= 0 "
                       "(0 means 1/sqrt(head_dim))",
                       p->scale);
  if (!isfinite(p->softcap) || p->softcap < 0)
    return attn__error(ctx, ATTN_ESCALAR,
                       "params.softcap is %g; it must be finite and >= 0 "
                       "(0 means off)",
                       p->softcap);
  /* The backends compute in float32: a value that becomes inf there would
   * turn every score into NaN, and one that becomes 0 would silently mean
   * "1/sqrt(head_dim)" or "no softcap". */
  const char *names[2] = {"scale", "softcap"};
  const double values[2] = {p->scale, p->softcap};
  for (int i = 0; i < 2; i++) {
    float f = (float)values[i];
    if (isinf(f) || (values[i] > 0 && f == 0.0f))
      return attn__error(ctx, ATTN_ESCALAR, "params.%s is %g, which is %s in float32", names[i],
                         values[i], f == 0.0f ? "0" : "inf");
  }
  if (p->window_left < -1 || p->window_right < -1)
    return attn__error(ctx, ATTN_EWINDOW,
                       "params.window_%s is %lld; a bound is >= 0, or -1 for none",
                       p->window_left < -1 ? "left" : "right",
                       (long long)(p->window_left < -1 ? p->window_left : p->window_right));
  if (p->alibi_slopes_tensor) {
    const void *h;
    rc =
        meta_form(ctx, "params.alibi_slopes_tensor", "params.alibi_slopes", p->alibi_slopes != NULL,
                  p->alibi_slopes_tensor, ATTN_F32, "heads", hq, &ralibi, &h, &alibi_dev);
    if (rc) return rc;
    if (p->alibi_count != 0 && p->alibi_count != hq)
      return attn__error(ctx, ATTN_EALIBI,
                         "params.alibi_count is %lld; with alibi_slopes_tensor it is 0 or the "
                         "number of query heads, %lld",
                         (long long)p->alibi_count, (long long)hq);
    params.alibi_slopes = h;
    params.alibi_count = h ? hq : 0;
  }
  if (!p->alibi_slopes && p->alibi_count != 0)
    return attn__error(ctx, ATTN_EALIBI, "params.alibi_slopes is NULL but alibi_count is %lld",
                       (long long)p->alibi_count);
  if (p->alibi_slopes) {
    if (p->alibi_count != hq)
      return attn__error(ctx, ATTN_EALIBI,
                         "params.alibi_count is %lld; it must be the number of query heads, %lld",
                         (long long)p->alibi_count, (long long)hq);
    for (int64_t h = 0; h < hq; h++)
      if (!isfinite(p->alibi_slopes[h]))
        return attn__error(ctx, ATTN_EALIBI, "params.alibi_slopes[%lld] is not finite",
                           (long long)h);
  }
  if (p->flags & ~KNOWN_FLAGS)
    return attn__error(ctx, ATTN_EINVAL,
                       "params.flags has bits 0x%x that name no flag (known: ATTN_CAUSAL, "
                       "ATTN_DETERMINISTIC, ATTN_ALLOW_TF32, ATTN_ASYNC)",
                       p->flags & ~KNOWN_FLAGS);

  /* Score terms: the bias (its own float dtype, size-1 dimensions
   * broadcasting) and the sinks; their gradients are backward outputs, which
   * the reference takes beside its own (it writes those) and leaves alone. */
  region rbias = {0}, rdbias = {0}, rsink = {0}, rdsink = {0};
  if (p->bias) {
    const attn_tensor *t = p->bias;
    if ((unsigned)t->dtype > ATTN_BF16)
      return attn__error(ctx, ATTN_EDTYPE, "params.bias: dtype %s is not f32, f16 or bf16",
                         attn_dtype_name(t->dtype));
    if (t->ndim == 4) {
      const int64_t full[3] = {batch, hq, nq};
      for (int i = 0; i < 3; i++)
        if (t->shape[i] != 1 && t->shape[i] != full[i])
          return attn__error(ctx, ATTN_ESHAPE,
                             "params.bias: shape[%d] (%s) is %lld; it must be %lld or 1 "
                             "(broadcast)",
                             i, dims_bias[i], (long long)t->shape[i], (long long)full[i]);
    }
    int64_t want[4] = {-1, -1, -1, nk};
    rc = check_tensor(ctx, "params.bias", t, t->dtype, 4, dims_bias, want, &rbias);
    if (rc) return rc;
  }
  if (p->dbias) {
    if (op == ATTN__FORWARD || op == ATTN__SUPPORTS)
      return attn__error(ctx, ATTN_EINVAL, "params.dbias is set, but it is a backward output");
    if (!p->bias) return attn__error(ctx, ATTN_EINVAL, "params.dbias is set without params.bias");
    rc = check_tensor(ctx, "params.dbias", p->dbias, ATTN_F32, 4, dims_bias, p->bias->shape,
                      &rdbias);
    if (rc) return rc;
  }
  if (p->sinks) {
    int64_t want[1] = {hq};
    rc = check_tensor(ctx, "params.sinks", p->sinks, ATTN_F32, 1, dims_heads, want, &rsink);
    if (rc) return rc;
  }
  if (p->dsinks) {
    if (op == ATTN__FORWARD || op == ATTN__SUPPORTS)
      return attn__error(ctx, ATTN_EINVAL, "params.dsinks is set, but it is a backward output");
    if (!p->sinks)
      return attn__error(ctx, ATTN_EINVAL, "params.dsinks is set without params.sinks");
    int64_t want[1] = {hq};
    rc = check_tensor(ctx, "params.dsinks", p->dsinks, ATTN_F32, 1, dims_heads, want, &rdsink);
    if (rc) return rc;
  }

  /* Outputs and the backward's extra inputs. */
  region ro = {0}, rl = {0}, rdo = {0}, rdq = {0}, rdk = {0}, rdv = {0};
  int has_o = o != NULL && op != ATTN__REFERENCE;
  int has_lse = lse != NULL && op != ATTN__REFERENCE;
  if (has_o) {
    int64_t want[4];
    for (int i = 0; i < nd; i++)
      want[i] = q->shape[i];
    rc = check_tensor(ctx, "o", o, dt, nd, dims, want, &ro);
    if (rc) return rc;
  }
  int lse_hilo = 0;
  if (has_lse) {
    /* One more dimension of 2 at the end: the (hi, lo) form. */
    int64_t want_bshd[4] = {batch, hq, nq, 2}, want_var[3] = {hq, total_q, 2};
    int lse_nd = varlen ? 2 : 3;
    lse_hilo = lse->ndim == lse_nd + 1;
    rc = check_tensor(ctx, "lse", lse, ATTN_F32, lse_nd + lse_hilo,
                      varlen ? dims_lse_varlen : dims_lse_bshd, varlen ? want_var : want_bshd, &rl);
    if (rc) return rc;
  }
  if (op == ATTN__BACKWARD) {
    int64_t wq[4], wk[4];
    for (int i = 0; i < nd; i++) {
      wq[i] = q->shape[i];
      wk[i] = k->shape[i];
    }
    if ((rc = check_tensor(ctx, "do", dout, dt, nd, dims, wq, &rdo)) ||
        (rc = check_tensor(ctx, "dq", dq, dt, nd, dims, wq, &rdq)) ||
        (rc = check_tensor(ctx, "dk", dk, dt, nd, dims, wk, &rdk)) ||
        (rc = check_tensor(ctx, "dv", dv, dt, nd, dims, wk, &rdv)))
      return rc;
  }

  /* Aliasing: an output may share no memory with an input or with another
   * output. Inputs may share (a fused qkv tensor). Appending makes k and v
   * outputs of the forward pass as well. */
  const region *ins[] = {&rq,  &rk,  &rv,  &ro,  &rl,   &rdo,  &rbias, &rsink,
                         &rsu, &rbt, &rkn, &rvn, &rcuq, &rcuk, &ralibi};
  const char *in_names[] = {"q",
                            "k",
                            "v",
                            "o",
                            "lse",
                            "do",
                            "params.bias",
                            "params.sinks",
                            "params.seqused_k",
                            "params.block_table",
                            "params.k_new",
                            "params.v_new",
                            "params.cu_seqlens_q_tensor",
                            "params.cu_seqlens_k_tensor",
                            "params.alibi_slopes_tensor"};
  const int n_ins = (int)(sizeof ins / sizeof ins[0]);
  const region *outs[5];
  const char *out_names[5];
  int n_outs = 0;
  if (op == ATTN__FORWARD || op == ATTN__SUPPORTS) {
    const region *f[] = {&ro, &rl, &rk, &rv};
    const char *fn[] = {"o", "lse", "k (appended to)", "v (appended to)"};
    for (int i = 0; i < (p->k_new ? 4 : 2); i++) {
      outs[n_outs] = f[i];
      out_names[n_outs++] = fn[i];
    }
  } else if (op == ATTN__BACKWARD || op == ATTN__SUPPORTS_BACKWARD) {
    const region *f[] = {&rdq, &rdk, &rdv, &rdbias, &rdsink};
    const char *fn[] = {"dq", "dk", "dv", "params.dbias", "params.dsinks"};
    for (int i = 0; i < 5; i++) {
      outs[n_outs] = f[i];
      out_names[n_outs++] = fn[i];
    }
  }
  for (int a = 0; a < n_outs; a++) {
    if (!outs[a]->t) continue;
    for (int b = 0; b < n_ins; b++)
      if (ins[b]->t && ins[b] != outs[a] && regions_share(outs[a], ins[b]))
        return attn__error(ctx, ATTN_EALIAS, "%s shares memory with %s", out_names[a], in_names[b]);
    for (int b = 0; b < a; b++)
      if (outs[b]->t && regions_share(outs[a], outs[b]))
        return attn__error(ctx, ATTN_EALIAS, "%s shares memory with %s", out_names[a],
                           out_names[b]);
  }

  memset(pb, 0, sizeof *pb);
  pb->dtype = dt;
  pb->batch = batch;
  pb->heads_q = hq;
  pb->heads_kv = hkv;
  pb->head_dim = d;
  pb->seqlen_q = nq;
  pb->seqlen_k = nk;
  pb->total_q = total_q;
  pb->total_k = total_k;
  pb->varlen = varlen;
  pb->cu_q = varlen ? p->cu_seqlens_q : NULL;
  pb->cu_k = varlen ? p->cu_seqlens_k : NULL;
  pb->cu_q_dev = cuq_dev;
  pb->cu_k_dev = cuk_dev;
  pb->alibi_dev = alibi_dev;
  pb->scale = p->scale == 0 ? (float)(1.0 / sqrt((double)d)) : (float)p->scale;
  pb->softcap = (float)p->softcap;
  pb->causal = (p->flags & ATTN_CAUSAL) != 0;
  pb->window_left = p->window_left;
  pb->window_right = p->window_right;
  /* A bound at least as long as the sequences cuts nothing (every row has
   * diag = i + nk - nq in [nk - nq, nk - 1], so diag - wl < 0 when wl >= nk
   * and diag + wr >= nk - 1 when wr >= nq): it becomes "no bound" here,
   * once, so that no backend and not the reference computes diag +- a
   * bound near INT64_MAX. */
  if (pb->window_left >= nk) pb->window_left = -1;
  if (pb->window_right >= nq) pb->window_right = -1;
  if (pb->causal && (pb->window_right < 0 || pb->window_right > 0)) pb->window_right = 0;
  pb->alibi = p->alibi_slopes;
  pb->deterministic = (p->flags & ATTN_DETERMINISTIC) != 0;
  pb->allow_tf32 = (p->flags & ATTN_ALLOW_TF32) != 0;
  pb->async = (p->flags & ATTN_ASYNC) != 0;
  fill_tensor(ctx, q, varlen, 0, &pb->q);
  fill_tensor(ctx, k, varlen, 0, &pb->k);
  fill_tensor(ctx, v, varlen, 0, &pb->v);
  if (has_o) fill_tensor(ctx, o, varlen, 0, &pb->o);
  if (has_lse) {
    fill_tensor(ctx, lse, varlen, 1, &pb->lse);
    pb->has_lse = 1;
    pb->lse_hilo = lse_hilo;
    if (lse_hilo) pb->lse.sd = lse->stride[lse->ndim - 1];
  }
  if (paged) {
    /* k and v are [pages, page_size, heads, d]: bshd strides, a page per
     * "batch" entry (attn__key_row). */
    fill_tensor(ctx, k, 0, 0, &pb->k);
    fill_tensor(ctx, v, 0, 0, &pb->v);
    pb->page_size = page_size;
    pb->num_pages = k->shape[0];
    pb->max_pages = max_pages;
    fill_meta(ctx, p->block_table, &pb->block_table);
    pb->block_table.sb = p->block_table->stride[0];
    pb->block_table.ss = p->block_table->stride[1];
    pb->block_host = p->block_table->data;
  }
  if (p->seqused_k) {
    pb->has_seqused = 1;
    fill_meta(ctx, p->seqused_k, &pb->seqused_k);
    pb->seqused_k.sb = p->seqused_k->stride[0];
    pb->seqused_host = p->seqused_k->data;
  }
  if (p->k_new) {
    pb->seqlen_new = seqlen_new;
    fill_tensor(ctx, p->k_new, 0, 0, &pb->k_new);
    fill_tensor(ctx, p->v_new, 0, 0, &pb->v_new);
  }
  pb->num_splits = p->num_splits;
  if (p->bias) {
    pb->has_bias = 1;
    fill_bias(ctx, p->bias, &pb->bias);
    if (p->dbias) {
      pb->has_dbias = 1;
      fill_bias(ctx, p->dbias, &pb->dbias);
    }
  }
  if (p->sinks) {
    pb->has_sinks = 1;
    fill_meta(ctx, p->sinks, &pb->sinks);
    pb->sinks.sh = p->sinks->stride[0];
    if (p->dsinks) {
      pb->has_dsinks = 1;
      fill_meta(ctx, p->dsinks, &pb->dsinks);
      pb->dsinks.sh = p->dsinks->stride[0];
    }
  }
  if (op == ATTN__BACKWARD) {
    fill_tensor(ctx, dout, varlen, 0, &pb->dout);
    fill_tensor(ctx, dq, varlen, 0, &pb->dq);
    fill_tensor(ctx, dk, varlen, 0, &pb->dk);
    fill_tensor(ctx, dv, varlen, 0, &pb->dv);
  }
  return ATTN_OK;
}

int attn__merge_build(attn_context *ctx, int n, const attn_tensor *o_parts,
                      const attn_tensor *lse_parts, const attn_tensor *o, const attn_tensor *lse,
                      attn__merge *m) {
  if (n < 1 || n > ATTN_MAX_MERGE)
    return attn__error(ctx, ATTN_ESIZE, "n is %d; attn_merge takes 1 to %d parts", n,
                       ATTN_MAX_MERGE);
  if (!o_parts) return attn__error(ctx, ATTN_ENULL, "o_parts is NULL");
  if (!lse_parts) return attn__error(ctx, ATTN_ENULL, "lse_parts is NULL");
  if (!o) return attn__error(ctx, ATTN_ENULL, "o is NULL");
  if (o->ndim != 4 && o->ndim != 3)
    return attn__error(ctx, ATTN_ESHAPE, "o: ndim is %d; 4 (bshd) or 3 (varlen) expected", o->ndim);
  const int varlen = o->ndim == 3, nd = o->ndim;
  const char *const *dims = varlen ? dims_varlen : dims_bshd;
  if ((unsigned)o->dtype > ATTN_BF16)
    return attn__error(ctx, ATTN_EDTYPE, "o: dtype %d is not f32, f16 or bf16", (int)o->dtype);
  region ro, rl = {0};
  int rc = check_tensor(ctx, "o", o, o->dtype, nd, dims, NULL, &ro);
  if (rc) return rc;
  if (o->shape[nd - 1] > ATTN_MAX_HEAD_DIM)
    return attn__error(ctx, ATTN_EHEADDIM, "o: head_dim %lld is above the maximum %d",
                       (long long)o->shape[nd - 1], ATTN_MAX_HEAD_DIM);
  const int64_t batch = varlen ? 1 : o->shape[0], seqlen = varlen ? o->shape[0] : o->shape[1];
  const int64_t heads = o->shape[nd - 2];
  int64_t want_lse_b[3] = {batch, heads, seqlen}, want_lse_v[2] = {heads, seqlen};
  const int lnd = varlen ? 2 : 3;
  const char *const *ldims = varlen ? dims_lse_varlen : dims_lse_bshd;
  if (lse) {
    rc = check_tensor(ctx, "lse", lse, ATTN_F32, lnd, ldims, varlen ? want_lse_v : want_lse_b, &rl);
    if (rc) return rc;
    if (regions_share(&rl, &ro)) return attn__error(ctx, ATTN_EALIAS, "lse shares memory with o");
  }
  region *parts = malloc(sizeof(region) * 2 * (size_t)n);
  m->o_parts = malloc(sizeof(attn__tensor) * 2 * (size_t)n);
  if (!parts || !m->o_parts) {
    free(parts);
    free(m->o_parts);
    return attn__error(ctx, ATTN_ENOMEM, "out of host memory for %d parts", n);
  }
  m->lse_parts = m->o_parts + n;
  char name[40];
  for (int s = 0; s < n && !rc; s++) {
    snprintf(name, sizeof name, "o_parts[%d]", s);
    rc = check_tensor(ctx, name, &o_parts[s], o->dtype, nd, dims, o->shape, &parts[2 * s]);
    if (!rc) {
      snprintf(name, sizeof name, "lse_parts[%d]", s);
      rc = check_tensor(ctx, name, &lse_parts[s], ATTN_F32, lnd, ldims,
                        varlen ? want_lse_v : want_lse_b, &parts[2 * s + 1]);
    }
    for (int i = 0; i < 2 && !rc; i++) {
      if (regions_share(&ro, &parts[2 * s + i]))
        rc = attn__error(ctx, ATTN_EALIAS, "o shares memory with %s_parts[%d]", i ? "lse" : "o", s);
      else if (lse && regions_share(&rl, &parts[2 * s + i]))
        rc = attn__error(ctx, ATTN_EALIAS, "lse shares memory with %s_parts[%d]", i ? "lse" : "o",
                         s);
    }
    if (!rc) {
      fill_tensor(ctx, &o_parts[s], varlen, 0, &m->o_parts[s]);
      fill_tensor(ctx, &lse_parts[s], varlen, 1, &m->lse_parts[s]);
    }
  }
  free(parts);
  if (rc) {
    free(m->o_parts);
    m->o_parts = m->lse_parts = NULL;
    return rc;
  }
  m->n = n;
  m->dtype = o->dtype;
  m->batch = batch;
  m->seqlen = seqlen;
  m->heads = heads;
  m->head_dim = o->shape[nd - 1];
  fill_tensor(ctx, o, varlen, 0, &m->o);
  m->has_lse = lse != NULL;
  if (lse) fill_tensor(ctx, lse, varlen, 1, &m->lse);
  return ATTN_OK;
}

unsigned attn__problem_uses(const attn__problem *pb) {
  return (pb->has_seqused ? ATTN__USES_SEQUSED : 0u) | (pb->page_size ? ATTN__USES_PAGED : 0u) |
         (pb->seqlen_new ? ATTN__USES_APPEND : 0u) | (pb->has_bias ? ATTN__USES_BIAS : 0u) |
         (pb->has_sinks ? ATTN__USES_SINKS : 0u) | (pb->has_dbias ? ATTN__USES_DBIAS : 0u) |
         (pb->has_dsinks ? ATTN__USES_DSINKS : 0u);
}

int attn__decline_features(attn_context *ctx, const char *who, unsigned missing) {
  static const char *const names[] = {"seqused_k (a KV cache)",
                                      "a paged KV cache",
                                      "appending to the KV cache",
                                      "an additive bias",
                                      "attention sinks",
                                      "dbias",
                                      "dsinks"};
  for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
    if (missing & (1u << i))
      return attn__error(ctx, ATTN_EUNSUPPORTED, "%s: %s is not available here", who, names[i]);
  return ATTN_OK;
}
