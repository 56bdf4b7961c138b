/* Public entry points: contexts, buffers, tensors, parameters, and the
 * forward/backward calls, which validate (src/problem.c), stage host memory
 * through a GPU backend's buffers when needed, and dispatch. */
#include "attn_internal.h"

#include <stdio.h>
#include <stdlib.h>

/* Enters ctx for one call, or says why not. A context whose creation failed
 * keeps its message and answers ATTN_EUNAVAILABLE. A context that another
 * thread's call is inside answers ATTN_EBUSY without waiting and without
 * writing anything, errmsg included: that is the other call's. Every call
 * that enters leaves through leave(). */
static int enter(attn_context *ctx) {
  if (!ctx) return ATTN_ENULL;
  if (!ctx->backend) return ATTN_EUNAVAILABLE;
  if (atomic_exchange_explicit(&ctx->busy, 1, memory_order_acquire)) return ATTN_EBUSY;
  ctx->errmsg[0] = '\0';
  return ATTN_OK;
}

static int leave(attn_context *ctx, int rc) {
  atomic_store_explicit(&ctx->busy, 0, memory_order_release);
  return rc;
}

/* A public entry point: the call's body runs inside enter() and leave(). */
#define ENTERED(ctx, body)         \
  do {                             \
    int entered_ = enter(ctx);     \
    if (entered_) return entered_; \
    return leave(ctx, (body));     \
  } while (0)

/* ---------------------------------------------------------------------- */
/* Contexts                                                                 */
/* ---------------------------------------------------------------------- */

int attn_context_create(const char *spec, attn_context **out) {
  if (!out) return ATTN_ENULL;
  attn_context *ctx = calloc(1, sizeof *ctx);
  *out = ctx;
  if (!ctx) return ATTN_ENOMEM;
  atomic_init(&ctx->busy, 0);
  attn__settings_read(&ctx->settings);
  return attn__backend_open(ctx, spec);
}

void attn_context_free(attn_context *ctx) {
  if (!ctx) return;
  if (ctx->backend && ctx->backend->close) ctx->backend->close(ctx);
  attn__settings_free(&ctx->settings);
  free(ctx);
}

const char *attn_errmsg(const attn_context *ctx) {
  if (!ctx) return "the context is NULL (out of memory, or never created)";
  return ctx->errmsg;
}

attn_backend attn_context_backend(const attn_context *ctx) {
  return ctx && ctx->backend ? ctx->backend->kind : ATTN_BACKEND_AUTO;
}

int attn_context_device(const attn_context *ctx) {
  return ctx && ctx->backend ? ctx->device : -1;
}

int attn_context_device_info(const attn_context *ctx, attn_device_info *out) {
  if (!ctx || !out) return ATTN_ENULL;
  if (!ctx->backend) return ATTN_EUNAVAILABLE;
  return attn_device_info_get(ctx->backend->kind, ctx->device, out);
}

int attn_context_set_stream(attn_context *ctx, void *stream) {
  ENTERED(ctx, ctx->backend->set_stream(ctx, stream));
}

int attn_context_synchronize(attn_context *ctx) {
  ENTERED(ctx, ctx->backend->synchronize(ctx));
}

int attn_selftest(attn_context *ctx) {
  ENTERED(ctx, ctx->backend->selftest(ctx));
}

/* ---------------------------------------------------------------------- */
/* Buffers                                                                  */
/* ---------------------------------------------------------------------- */

static int new_buffer(attn_context *ctx, void *native, size_t bytes, int owned, attn_buffer **out) {
  attn_buffer *b = malloc(sizeof *b);
  if (!b) {
    if (owned) ctx->backend->buffer_release(ctx, native);
    return attn__error(ctx, ATTN_ENOMEM, "out of memory for a buffer handle");
  }
  b->ctx = ctx;
  b->native = native;
  b->bytes = bytes;
  b->owned = owned;
  *out = b;
  return ATTN_OK;
}

static int buffer_create(attn_context *ctx, size_t bytes, attn_buffer **out) {
  if (!out) return attn__error(ctx, ATTN_ENULL, "out is NULL");
  *out = NULL;
  if (bytes == 0) return attn__error(ctx, ATTN_ESIZE, "bytes is 0");
  void *native = NULL;
  int rc = ctx->backend->buffer_alloc(ctx, bytes, &native);
  if (rc) return rc;
  return new_buffer(ctx, native, bytes, 1, out);
}

int attn_buffer_create(attn_context *ctx, size_t bytes, attn_buffer **out) {
  ENTERED(ctx, buffer_create(ctx, bytes, out));
}

static int buffer_wrap(attn_context *ctx, void *native, size_t bytes, attn_buffer **out) {
  if (!out) return attn__error(ctx, ATTN_ENULL, "out is NULL");
  *out = NULL;
  if (!native) return attn__error(ctx, ATTN_ENULL, "native is NULL");
  if (bytes == 0) return attn__error(ctx, ATTN_ESIZE, "bytes is 0");
  if (ctx->backend->buffer_check) {
    int rc = ctx->backend->buffer_check(ctx, native, bytes);
    if (rc) return rc;
  }
  return new_buffer(ctx, native, bytes, 0, out);
}

int attn_buffer_wrap(attn_context *ctx, void *native, size_t bytes, attn_buffer **out) {
  ENTERED(ctx, buffer_wrap(ctx, native, bytes, out));
}

static int check_range(attn_context *ctx, const attn_buffer *buf, const void *host, size_t offset,
                       size_t bytes, const char *host_name) {
  if (!buf) return attn__error(ctx, ATTN_ENULL, "buf is NULL");
  if (!host) return attn__error(ctx, ATTN_ENULL, "%s is NULL", host_name);
  if (buf->ctx != ctx) return attn__error(ctx, ATTN_EBUFFER, "buf belongs to another context");
  if (offset > buf->bytes || bytes > buf->bytes - offset)
    return attn__error(ctx, ATTN_EBUFFER, "offset %zu + bytes %zu is past the buffer's %zu bytes",
                       offset, bytes, buf->bytes);
  return ATTN_OK;
}

static int buffer_write(attn_context *ctx, attn_buffer *buf, size_t offset, const void *src,
                        size_t bytes) {
  int rc = check_range(ctx, buf, src, offset, bytes, "src");
  if (rc || bytes == 0) return rc;
  return ctx->backend->buffer_write(ctx, buf->native, offset, src, bytes);
}

int attn_buffer_write(attn_context *ctx, attn_buffer *buf, size_t offset, const void *src,
                      size_t bytes) {
  ENTERED(ctx, buffer_write(ctx, buf, offset, src, bytes));
}

static int buffer_read(attn_context *ctx, const attn_buffer *buf, size_t offset, void *dst,
                       size_t bytes) {
  int rc = check_range(ctx, buf, dst, offset, bytes, "dst");
  if (rc || bytes == 0) return rc;
  return ctx->backend->buffer_read(ctx, buf->native, offset, dst, bytes);
}

int attn_buffer_read(attn_context *ctx, const attn_buffer *buf, size_t offset, void *dst,
                     size_t bytes) {
  ENTERED(ctx, buffer_read(ctx, buf, offset, dst, bytes));
}

void *attn_buffer_native(const attn_buffer *buf) {
  return buf ? buf->native : NULL;
}

size_t attn_buffer_size(const attn_buffer *buf) {
  return buf ? buf->bytes : 0;
}

void attn_buffer_free(attn_buffer *buf) {
  if (!buf) return;
  if (buf->owned && buf->ctx && buf->ctx->backend)
    buf->ctx->backend->buffer_release(buf->ctx, buf->native);
  free(buf);
}

/* ---------------------------------------------------------------------- */
/* Tensors and parameters                                                   */
/* ---------------------------------------------------------------------- */

static attn_tensor contiguous(void *data, attn_dtype dtype, int ndim, const int64_t *shape) {
  attn_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.ndim = ndim;
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    t.shape[i] = shape[i];
    t.stride[i] = s;
    /* An absurd shape saturates the strides rather than overflowing:
     * validation then rejects the tensor with ATTN_EOVERFLOW. */
    int64_t n = shape[i] > 0 ? shape[i] : 1;
    s = s > INT64_MAX / n ? INT64_MAX : s * n;
  }
  return t;
}

attn_tensor attn_tensor_bshd(void *data, attn_dtype dtype, int64_t batch, int64_t seqlen,
                             int64_t heads, int64_t head_dim) {
  int64_t shape[4] = {batch, seqlen, heads, head_dim};
  return contiguous(data, dtype, 4, shape);
}

attn_tensor attn_tensor_varlen(void *data, attn_dtype dtype, int64_t total_rows, int64_t heads,
                               int64_t head_dim) {
  int64_t shape[3] = {total_rows, heads, head_dim};
  return contiguous(data, dtype, 3, shape);
}

attn_tensor attn_tensor_lse(float *data, int64_t batch, int64_t heads, int64_t seqlen) {
  if (batch == 0) {
    int64_t shape[2] = {heads, seqlen};
    return contiguous(data, ATTN_F32, 2, shape);
  }
  int64_t shape[3] = {batch, heads, seqlen};
  return contiguous(data, ATTN_F32, 3, shape);
}

attn_tensor attn_tensor_lse_hilo(float *data, int64_t batch, int64_t heads, int64_t seqlen) {
  if (batch == 0) {
    int64_t shape[3] = {heads, seqlen, 2};
    return contiguous(data, ATTN_F32, 3, shape);
  }
  int64_t shape[4] = {batch, heads, seqlen, 2};
  return contiguous(data, ATTN_F32, 4, shape);
}

attn_tensor attn_tensor_1d(void *data, attn_dtype dtype, int64_t n) {
  return contiguous(data, dtype, 1, &n);
}

attn_tensor attn_tensor_2d(void *data, attn_dtype dtype, int64_t rows, int64_t cols) {
  int64_t shape[2] = {rows, cols};
  return contiguous(data, dtype, 2, shape);
}

attn_tensor attn_tensor_bias(void *data, attn_dtype dtype, int64_t batch, int64_t heads,
                             int64_t seqlen_q, int64_t seqlen_k) {
  int64_t shape[4] = {batch, heads, seqlen_q, seqlen_k};
  return contiguous(data, dtype, 4, shape);
}

attn_tensor attn_tensor_on(attn_tensor t, attn_buffer *buffer, size_t offset) {
  t.data = NULL;
  t.buffer = buffer;
  t.offset = offset;
  return t;
}

void attn_params_init(attn_params *p) {
  if (!p) return;
  memset(p, 0, sizeof *p);
  p->size = sizeof *p;
  p->window_left = -1;
  p->window_right = -1;
}

/* ---------------------------------------------------------------------- */
/* Forward and backward                                                     */
/* ---------------------------------------------------------------------- */

/* Bytes from a validated tensor's first element to past its last. */
static size_t tensor_bytes(const attn_tensor *t) {
  int64_t last = 0;
  for (int i = 0; i < t->ndim; i++)
    last += (t->shape[i] - 1) * t->stride[i];
  return ((size_t)last + 1) * attn_dtype_size(t->dtype);
}

/* Host tensors handed to a device backend go through temporary device
 * buffers, each holding the span from the tensor's first element to its
 * last. Inputs are written before the call. Outputs are read back after it,
 * element by element where the span has gaps: those bytes may belong to
 * another output (dq, dk and dv as slices of one fused tensor), which a
 * copy of the whole span would overwrite with stale values. */
/* The most a call stages: attn_merge's parts, o and lse. */
#define MAX_STAGED (2 * ATTN_MAX_MERGE + 2)
typedef struct staging {
  int n;
  void *native[MAX_STAGED];
  const attn_tensor *user[MAX_STAGED];
  int output[MAX_STAGED];
} staging;

static int has_gaps(const attn_tensor *t) {
  int64_t count = 1;
  for (int i = 0; i < t->ndim; i++)
    count *= t->shape[i];
  return (size_t)count * attn_dtype_size(t->dtype) != tensor_bytes(t);
}

/* Copies t's elements from img, an image of t's span, into t's memory. */
static void scatter(const attn_tensor *t, const char *img) {
  size_t es = attn_dtype_size(t->dtype);
  int nd = t->ndim;
  int64_t idx[4] = {0, 0, 0, 0}, inner = t->shape[nd - 1], s_in = t->stride[nd - 1];
  char *dst = t->data;
  for (;;) {
    int64_t off = 0;
    for (int i = 0; i < nd - 1; i++)
      off += idx[i] * t->stride[i];
    if (s_in == 1) {
      memcpy(dst + off * (int64_t)es, img + off * (int64_t)es, (size_t)inner * es);
    } else {
      for (int64_t j = 0; j < inner; j++) {
        int64_t e = (off + j * s_in) * (int64_t)es;
        memcpy(dst + e, img + e, es);
      }
    }
    int i = nd - 2;
    while (i >= 0 && ++idx[i] == t->shape[i])
      idx[i--] = 0;
    if (i < 0) break;
  }
}

/* output: 0 an input, 1 an output, 2 both (a cache appended to). */
static int stage(attn_context *ctx, staging *st, const attn_tensor *t, attn__tensor *pt, int output,
                 const char *name) {
  if (!t || !t->data) return ATTN_OK;
  size_t bytes = tensor_bytes(t);
  void *native = NULL;
  int rc = ctx->backend->buffer_alloc(ctx, bytes, &native);
  if (rc) {
    /* The backend's sentence names its own argument; the caller's is the tensor. */
    char why[sizeof ctx->errmsg];
    memcpy(why, ctx->errmsg, sizeof why);
    return attn__error(ctx, rc, "%s: staging it on the device failed: %s", name, why);
  }
  st->native[st->n] = native;
  st->user[st->n] = t;
  st->output[st->n] = output;
  st->n++;
  pt->native = native;
  pt->offset = 0;
  if (output == 1) return ATTN_OK;
  return ctx->backend->buffer_write(ctx, native, 0, t->data, bytes);
}

static int unstage_output(attn_context *ctx, void *native, const attn_tensor *t) {
  size_t bytes = tensor_bytes(t);
  if (!has_gaps(t)) return ctx->backend->buffer_read(ctx, native, 0, t->data, bytes);
  char *img = malloc(bytes);
  if (!img) return attn__error(ctx, ATTN_ENOMEM, "out of host memory staging a strided output");
  int rc = ctx->backend->buffer_read(ctx, native, 0, img, bytes);
  if (!rc) scatter(t, img);
  free(img);
  return rc;
}

static void unstage(attn_context *ctx, staging *st) {
  for (int i = 0; i < st->n; i++)
    ctx->backend->buffer_release(ctx, st->native[i]);
  st->n = 0;
}

/* One operand of a call: the caller's tensor, where the problem holds it,
 * whether it is written, and its name. */
typedef struct operand {
  const attn_tensor *user;
  attn__tensor *pt;
  int output;
  const char *name;
} operand;

/* Stages what is in host memory (device backends), runs the plan (the cache
 * append first), and brings staged outputs back. */
static int run(attn_context *ctx, attn__problem *pb, const attn__plan *plan, const operand *ops,
               int nops) {
  staging st = {0};
  int rc = ATTN_OK;
  if (!ctx->backend->host_memory) {
    for (int i = 0; i < nops && !rc; i++)
      rc = stage(ctx, &st, ops[i].user, ops[i].pt, ops[i].output, ops[i].name);
    if (st.n) pb->async = 0; /* staged results must be back before we return */
  }
  if (!rc && !plan->backward && pb->seqlen_new > 0) rc = ctx->backend->append(ctx, pb);
  if (!rc)
    rc = plan->backward ? ctx->backend->backward(ctx, pb, plan)
                        : ctx->backend->forward(ctx, pb, plan);
  for (int i = 0; i < st.n && !rc; i++)
    if (st.output[i]) rc = unstage_output(ctx, st.native[i], st.user[i]);
  unstage(ctx, &st);
  return rc;
}

/* The backend's one decision of what runs for pb, logged. */
static int make_plan(attn_context *ctx, const attn__problem *pb, int backward, attn__plan *plan) {
  int rc = ctx->backend->plan(ctx, pb, backward, plan);
  if (!rc)
    attn__debug("%s:%d: %s: %s, %zu bytes of workspace", ctx->backend->name, ctx->device,
                backward ? "backward" : "forward", plan->name, plan->workspace);
  return rc;
}

int attn__forward(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                  const attn_tensor *k, const attn_tensor *v, const attn_tensor *o,
                  const attn_tensor *lse) {
  /* The operands below come from the caller's params: read through the
   * copy, which holds defaults for the fields of a caller's older version. */
  attn_params prm;
  if (p) {
    const int r = attn__params_read(ctx, p, &prm);
    if (r) return r;
    p = &prm;
  }
  attn__problem pb;
  int rc = attn__problem_build(ctx, ATTN__FORWARD, p, q, k, v, o, lse, NULL, NULL, NULL, NULL, &pb);
  if (rc) return rc;
  attn__plan plan;
  rc = make_plan(ctx, &pb, 0, &plan);
  if (rc) return rc;
  const int app = pb.seqlen_new > 0 ? 2 : 0;
  const operand ops[] = {{q, &pb.q, 0, "q"},
                         {k, &pb.k, app, "k"},
                         {v, &pb.v, app, "v"},
                         {o, &pb.o, 1, "o"},
                         {lse, &pb.lse, 1, "lse"},
                         {p->seqused_k, &pb.seqused_k, 0, "params.seqused_k"},
                         {p->block_table, &pb.block_table, 0, "params.block_table"},
                         {p->k_new, &pb.k_new, 0, "params.k_new"},
                         {p->v_new, &pb.v_new, 0, "params.v_new"},
                         {p->bias, &pb.bias, 0, "params.bias"},
                         {p->sinks, &pb.sinks, 0, "params.sinks"}};
  return run(ctx, &pb, &plan, ops, (int)(sizeof ops / sizeof ops[0]));
}

int attn_forward(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                 const attn_tensor *k, const attn_tensor *v, const attn_tensor *o,
                 const attn_tensor *lse) {
  ENTERED(ctx, attn__forward(ctx, p, q, k, v, o, lse));
}

int attn__backward(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                   const attn_tensor *k, const attn_tensor *v, const attn_tensor *o,
                   const attn_tensor *lse, const attn_tensor *dout, const attn_tensor *dq,
                   const attn_tensor *dk, const attn_tensor *dv) {
  /* The operands below come from the caller's params: read through the
   * copy, which holds defaults for the fields of a caller's older version. */
  attn_params prm;
  if (p) {
    const int r = attn__params_read(ctx, p, &prm);
    if (r) return r;
    p = &prm;
  }
  attn__problem pb;
  int rc = attn__problem_build(ctx, ATTN__BACKWARD, p, q, k, v, o, lse, dout, dq, dk, dv, &pb);
  if (rc) return rc;
  attn__plan plan;
  rc = make_plan(ctx, &pb, 1, &plan);
  if (rc) return rc;
  const operand ops[] = {{q, &pb.q, 0, "q"},
                         {k, &pb.k, 0, "k"},
                         {v, &pb.v, 0, "v"},
                         {o, &pb.o, 0, "o"},
                         {lse, &pb.lse, 0, "lse"},
                         {dout, &pb.dout, 0, "do"},
                         {dq, &pb.dq, 1, "dq"},
                         {dk, &pb.dk, 1, "dk"},
                         {dv, &pb.dv, 1, "dv"},
                         {p->bias, &pb.bias, 0, "params.bias"},
                         {p->sinks, &pb.sinks, 0, "params.sinks"},
                         {p->dbias, &pb.dbias, 1, "params.dbias"},
                         {p->dsinks, &pb.dsinks, 1, "params.dsinks"}};
  return run(ctx, &pb, &plan, ops, (int)(sizeof ops / sizeof ops[0]));
}

int attn_backward(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                  const attn_tensor *k, const attn_tensor *v, const attn_tensor *o,
                  const attn_tensor *lse, const attn_tensor *dout, const attn_tensor *dq,
                  const attn_tensor *dk, const attn_tensor *dv) {
  ENTERED(ctx, attn__backward(ctx, p, q, k, v, o, lse, dout, dq, dk, dv));
}

static int supports(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                    const attn_tensor *k, const attn_tensor *v, int backward_pass) {
  attn__problem pb;
  int rc = attn__problem_build(ctx, backward_pass ? ATTN__SUPPORTS_BACKWARD : ATTN__SUPPORTS, p, q,
                               k, v, NULL, NULL, NULL, NULL, NULL, NULL, &pb);
  if (rc) return rc;
  attn__plan plan;
  return make_plan(ctx, &pb, backward_pass != 0, &plan);
}

int attn_supports(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                  const attn_tensor *k, const attn_tensor *v, int backward_pass) {
  ENTERED(ctx, supports(ctx, p, q, k, v, backward_pass));
}

static int merge(attn_context *ctx, int n, const attn_tensor *o_parts, const attn_tensor *lse_parts,
                 const attn_tensor *o, const attn_tensor *lse) {
  attn__merge m;
  int rc = attn__merge_build(ctx, n, o_parts, lse_parts, o, lse, &m);
  if (rc) return rc;
  staging st = {0};
  if (!ctx->backend->host_memory) {
    for (int s = 0; s < n && !rc; s++) {
      rc = stage(ctx, &st, &o_parts[s], &m.o_parts[s], 0, "o_parts");
      if (!rc) rc = stage(ctx, &st, &lse_parts[s], &m.lse_parts[s], 0, "lse_parts");
    }
    if (!rc) rc = stage(ctx, &st, o, &m.o, 1, "o");
    if (!rc && lse) rc = stage(ctx, &st, lse, &m.lse, 1, "lse");
  }
  if (!rc && !ctx->backend->merge)
    rc = attn__error(ctx, ATTN_EUNSUPPORTED, "%s: attn_merge is not available here",
                     ctx->backend->name);
  if (!rc) rc = ctx->backend->merge(ctx, &m);
  for (int i = 0; i < st.n && !rc; i++)
    if (st.output[i]) rc = unstage_output(ctx, st.native[i], st.user[i]);
  unstage(ctx, &st);
  free(m.o_parts);
  return rc;
}

int attn_merge(attn_context *ctx, int n, const attn_tensor *o_parts, const attn_tensor *lse_parts,
               const attn_tensor *o, const attn_tensor *lse) {
  ENTERED(ctx, merge(ctx, n, o_parts, lse_parts, o, lse));
}

int attn_tune(attn_context *ctx, attn_dtype dtype, int64_t head_dim, int64_t seqlen) {
  ENTERED(ctx, attn__tune(ctx, dtype, head_dim, seqlen));
}
