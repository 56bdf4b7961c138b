/*
 * The tensors of attn run and attn bench: their sizes (checked against the
 * memory there is before anything is allocated), and each one made as a
 * buffer on the context's device with a host copy of its contents, random
 * inputs drawn from --seed.
 */
#include "run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state;
static double rnd(void) {
  /* xorshift64*: reproducible inputs for a given --seed. */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

static void fill_random(void *data, attn_dtype dt, size_t n) {
  for (size_t i = 0; i < n; i++)
    attn__store(data, dt, (int64_t)i, (float)rnd());
}

run_sizes run_sizes_of(const run_opts *o) {
  run_sizes z;
  double es = (double)attn_dtype_size(o->dtype);
  int64_t pages, cap = run_cache_capacity(o, &pages), bias[4];
  double rows = o->page_size ? (double)o->batch * (double)pages * (double)o->page_size
                             : (double)o->batch * (double)cap;
  z.eq = (double)o->batch * (double)o->nq * (double)o->hq * (double)o->d;
  z.ek = rows * (double)o->hkv * (double)o->d;
  z.el = (double)o->batch * (double)o->hq * (double)o->nq;
  double enew = o->append ? (double)o->batch * (double)o->nq * (double)o->hkv * (double)o->d : 0;
  run_bias_shape(o, cap, bias);
  double eb = o->bias ? (double)bias[0] * (double)bias[1] * (double)bias[2] * (double)bias[3] : 0;
  int copies = o->backward ? 2 : 1; /* q, o (k, v) and do, dq (dk, dv) */
  z.tensors = copies * (2 * z.eq + 2 * z.ek) * es + 4 * z.el + (2 * enew + eb) * es +
              (o->backward ? 4 * eb : 0) + 8.0 * (double)o->hq +
              4.0 * (double)o->batch * (double)(1 + pages);
  z.reference = 8 * (z.eq + z.el) + (o->backward ? 8 * (z.eq + 2 * z.ek + eb + (double)o->hq) : 0) +
                (o->append ? z.ek * es : 0);
  return z;
}

int run_fits(const run_opts *o, const attn_device_info *info, int check, char *why, size_t len) {
  const run_sizes z = run_sizes_of(o);
  const double avail = cli_memory_available();
  /* One copy of every tensor lives in host memory whatever the backend; on
   * a CPU device the buffers are host memory too. */
  double host = z.tensors;
  const char *what = "the tensors";
  if (info) {
    host = z.tensors * (info->is_gpu ? 1 : 2) + (check ? z.reference : 0);
    if (check) what = "the tensors and the reference";
  }
  char a[32], b[32];
  if (host > avail) {
    snprintf(why, len, "%s would need %s, more than the %s of memory available", what,
             cli_human_bytes(host, a, sizeof a), cli_human_bytes(avail, b, sizeof b));
    return -1;
  }
  if (info && info->is_gpu && info->memory_bytes && z.tensors > (double)info->memory_bytes) {
    snprintf(why, len, "the tensors would need %s, more than the %s of device memory available",
             cli_human_bytes(z.tensors, a, sizeof a),
             cli_human_bytes((double)info->memory_bytes, b, sizeof b));
    return -1;
  }
  return 0;
}

/* Sizes were checked against memory before: the products cannot overflow.
 * src, when given, is the contents; else random ones, or for an output
 * all-ones bytes, NaN in every dtype, so that an element a call never
 * writes fails the check. */
static int make_tensor_of(attn_context *ctx, device_tensor *dt, attn_tensor shape, int random,
                          const void *src) {
  size_t count = 1;
  for (int i = 0; i < shape.ndim; i++)
    count *= (size_t)shape.shape[i];
  dt->bytes = count * attn_dtype_size(shape.dtype);
  dt->host = calloc(1, dt->bytes);
  if (!dt->host) return ATTN_ENOMEM;
  if (src) memcpy(dt->host, src, dt->bytes);
  if (random) fill_random(dt->host, shape.dtype, count);
  if (!random && !src) memset(dt->host, 0xff, dt->bytes);
  int rc = attn_buffer_create(ctx, dt->bytes, &dt->buf);
  if (rc) return rc;
  dt->t = attn_tensor_on(shape, dt->buf, 0);
  return attn_buffer_write(ctx, dt->buf, 0, dt->host, dt->bytes);
}

static int make_tensor(attn_context *ctx, device_tensor *dt, attn_tensor shape, int random) {
  return make_tensor_of(ctx, dt, shape, random, NULL);
}

attn_tensor run_host_tensor(const device_tensor *t) {
  attn_tensor h = t->t;
  h.buffer = NULL;
  h.offset = 0;
  h.data = t->host;
  return h;
}

/* In the order that keeps the values of the inputs q, k, v (and do) what
 * a seed gave before the inference options. */
int run_tensors_make(attn_context *ctx, const run_opts *o, const run_cache *c, run_tensors *t) {
  const attn_dtype dt = o->dtype;
  attn_tensor sq = attn_tensor_bshd(NULL, dt, o->batch, o->nq, o->hq, o->d);
  attn_tensor sk = o->page_size
                       ? attn_tensor_bshd(NULL, dt, c->num_pages, o->page_size, o->hkv, o->d)
                       : attn_tensor_bshd(NULL, dt, o->batch, c->cap, o->hkv, o->d);
  attn_tensor sn = attn_tensor_bshd(NULL, dt, o->batch, o->nq, o->hkv, o->d);
  attn_tensor sl = attn_tensor_lse(NULL, o->batch, o->hq, o->nq);
  int64_t bs[4];
  run_bias_shape(o, c->cap, bs);
  attn_tensor sb = attn_tensor_bias(NULL, dt, bs[0], bs[1], bs[2], bs[3]);
  attn_tensor sbf = attn_tensor_bias(NULL, ATTN_F32, bs[0], bs[1], bs[2], bs[3]);
  attn_tensor sh = attn_tensor_1d(NULL, ATTN_F32, o->hq);
  int rc;
  rng_state = 0x9E3779B97F4A7C15ull ^ o->seed;
  if ((rc = make_tensor(ctx, &t->q, sq, 1)) || (rc = make_tensor(ctx, &t->k, sk, 1)) ||
      (rc = make_tensor(ctx, &t->v, sk, 1)) || (rc = make_tensor(ctx, &t->o, sq, 0)) ||
      (rc = make_tensor(ctx, &t->lse, sl, 0)))
    return rc;
  if (o->append &&
      ((rc = make_tensor(ctx, &t->k_new, sn, 1)) || (rc = make_tensor(ctx, &t->v_new, sn, 1))))
    return rc;
  if (c->seqused && (rc = make_tensor_of(ctx, &t->seqused, attn_tensor_1d(NULL, ATTN_I32, o->batch),
                                         0, c->seqused)))
    return rc;
  if (c->table &&
      (rc = make_tensor_of(ctx, &t->table, attn_tensor_2d(NULL, ATTN_I32, o->batch, c->max_pages),
                           0, c->table)))
    return rc;
  if (o->bias && (rc = make_tensor(ctx, &t->bias, sb, 1))) return rc;
  if (o->sinks && (rc = make_tensor(ctx, &t->sinks, sh, 1))) return rc;
  if (o->backward &&
      ((rc = make_tensor(ctx, &t->dout, sq, 1)) || (rc = make_tensor(ctx, &t->dq, sq, 0)) ||
       (rc = make_tensor(ctx, &t->dk, sk, 0)) || (rc = make_tensor(ctx, &t->dv, sk, 0)) ||
       (o->bias && (rc = make_tensor(ctx, &t->dbias, sbf, 0))) ||
       (o->sinks && (rc = make_tensor(ctx, &t->dsinks, sh, 0)))))
    return rc;
  return ATTN_OK;
}

void run_tensors_free(run_tensors *t) {
  device_tensor *all[] = {&t->q,     &t->k,       &t->v,     &t->o,     &t->lse,   &t->k_new,
                          &t->v_new, &t->seqused, &t->table, &t->bias,  &t->sinks, &t->dout,
                          &t->dq,    &t->dk,      &t->dv,    &t->dbias, &t->dsinks};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    attn_buffer_free(all[i]->buf);
    free(all[i]->host);
  }
}
