/*
 * The work one call of attn run must do, for its rates: the query-key pairs
 * its mask leaves visible (GFLOP/s) and the bytes it must move at the least
 * (GB/s, to hold against the machine's memory bandwidth: attn bandwidth).
 */
#include "rules.h"
#include "run.h"

#include <stdlib.h>

/* The keys [lo, hi) row i of a sequence of lengths nq, nk sees. */
static void key_range(const run_opts *o, int64_t i, int64_t nk, int64_t *lo, int64_t *hi) {
  int64_t wr = o->params.window_right;
  if ((o->params.flags & ATTN_CAUSAL) && wr != 0) wr = 0;
  attn__key_range(attn__diag(i, o->nq, nk), nk, o->params.window_left, wr, lo, hi);
}

/* The keys some row of the sequence sees: rows' ranges overlap or touch
 * (attn__key_block_range), so they form one range. */
static void seq_keys(const run_opts *o, int64_t nk, int64_t *lo, int64_t *hi) {
  int64_t wr = o->params.window_right;
  if ((o->params.flags & ATTN_CAUSAL) && wr != 0) wr = 0;
  attn__key_block_range(0, o->nq, o->nq, nk, o->params.window_left, wr, lo, hi);
}

static int64_t len_of(const run_opts *o, const int64_t *lens, int64_t b) {
  return lens ? lens[b] : o->nk;
}

double run_pairs(const run_opts *o, const int64_t *lens) {
  double pairs = 0, seq = 0;
  for (int64_t b = 0; b < o->batch; b++) {
    int64_t nk = len_of(o, lens, b);
    /* A sequence as long as the one before has its pairs. */
    if (b == 0 || nk != len_of(o, lens, b - 1)) {
      seq = 0;
      for (int64_t i = 0; i < o->nq; i++) {
        int64_t lo, hi;
        key_range(o, i, nk, &lo, &hi);
        if (hi > lo) seq += (double)(hi - lo);
      }
    }
    pairs += seq;
  }
  return pairs;
}

void run_bias_shape(const run_opts *o, int64_t keys, int64_t shape[4]) {
  shape[0] = o->bias == RUN_BIAS_HEADS ? 1 : o->batch;
  shape[1] = o->bias == RUN_BIAS_KEYS ? 1 : o->hq;
  shape[2] = o->bias == RUN_BIAS_KEYS ? 1 : o->nq;
  shape[3] = keys;
}

static int by_start(const void *a, const void *b) {
  const int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
  return x < y ? -1 : x > y;
}

/* Keys in the union of n ranges [lo, hi) (sorted here). */
static int64_t union_length(int64_t (*r)[2], int64_t n) {
  qsort(r, (size_t)n, sizeof r[0], by_start);
  int64_t total = 0, end = INT64_MIN;
  for (int64_t i = 0; i < n; i++) {
    int64_t lo = r[i][0] > end ? r[i][0] : end, hi = r[i][1];
    if (hi > lo) total += hi - lo;
    if (hi > end) end = hi;
  }
  return total;
}

/* Entries of the bias some visible pair reads: an entry of a broadcast
 * dimension serves every sequence or row, and counts once. Without the
 * memory for it, the bias's whole size. */
static double bias_entries(const run_opts *o, const int64_t *lens, int64_t keys) {
  int64_t shape[4];
  run_bias_shape(o, keys, shape);
  if (o->bias == RUN_BIAS_NONE) return 0;
  const int64_t nb = shape[0], ni = shape[2];
  /* Per entry (bb, ii) of the first and third dimensions: the union of
   * the ranges of the sequences and rows it serves. */
  const int64_t per = nb == 1 ? o->batch : 1;
  int64_t(*r)[2] = malloc(sizeof *r * (size_t)per);
  if (!r) return (double)shape[0] * (double)shape[1] * (double)shape[2] * (double)keys;
  double total = 0;
  for (int64_t bb = 0; bb < nb; bb++)
    for (int64_t ii = 0; ii < ni; ii++) {
      int64_t n = 0;
      for (int64_t b = nb == 1 ? 0 : bb; b < (nb == 1 ? o->batch : bb + 1); b++) {
        int64_t nk = len_of(o, lens, b);
        if (ni == 1)
          seq_keys(o, nk, &r[n][0], &r[n][1]);
        else
          key_range(o, ii, nk, &r[n][0], &r[n][1]);
        n++;
      }
      total += (double)union_length(r, n);
    }
  free(r);
  return total * (double)shape[1];
}

double run_bytes_forward(const run_opts *o, const run_cache *c) {
  const double es = (double)attn_dtype_size(o->dtype), row = (double)o->hkv * (double)o->d * es;
  const double eq = (double)o->batch * (double)o->nq * (double)o->hq * (double)o->d;
  double keys = 0;
  for (int64_t b = 0; b < o->batch; b++) {
    int64_t lo, hi;
    seq_keys(o, c->lens[b], &lo, &hi);
    if (hi > lo) keys += (double)(hi - lo);
  }
  double bytes =
      2 * keys * row + 2 * eq * es + 4.0 * (double)o->batch * (double)o->hq * (double)o->nq;
  bytes += bias_entries(o, c->lens, c->cap) * es;
  if (o->sinks) bytes += 4.0 * (double)o->hq;
  if (o->append) bytes += 4.0 * (double)o->batch * (double)o->nq * row; /* k_new, v_new in, out */
  return bytes;
}

double run_bytes_backward(const run_opts *o) {
  const double es = (double)attn_dtype_size(o->dtype);
  const double eq = (double)o->batch * (double)o->nq * (double)o->hq * (double)o->d;
  const double ek = (double)o->batch * (double)o->nk * (double)o->hkv * (double)o->d;
  double bytes = (4 * eq + 4 * ek) * es + 4.0 * (double)o->batch * (double)o->hq * (double)o->nq;
  if (o->bias != RUN_BIAS_NONE) {
    int64_t s[4];
    run_bias_shape(o, o->nk, s);
    bytes += bias_entries(o, NULL, o->nk) * es +
             4.0 * (double)s[0] * (double)s[1] * (double)s[2] * (double)s[3];
  }
  if (o->sinks) bytes += 8.0 * (double)o->hq;
  return bytes;
}
