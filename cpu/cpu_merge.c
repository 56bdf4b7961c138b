/*
 * attn_merge on the CPU: n results of the same rows, each over a part of the
 * keys, combined by their lse (attn__merge_lse): lse = log sum exp(lse_s),
 * o = sum exp(lse_s - lse) o_s. One row per step, rows spread over the
 * threads; each output row is written by one thread.
 */
#include "cpu_internal.h"

#include <omp.h>

static const char *cpu_elem(const attn__tensor *t, int64_t b, int64_t s, int64_t h) {
  const int64_t e = b * t->sb + s * t->ss + h * t->sh;
  return (const char *)t->native + t->offset + (ptrdiff_t)e * (ptrdiff_t)attn_dtype_size(t->dtype);
}

static void cpu_merge_row(const attn__merge *m, int64_t b, int64_t s, int64_t h, float *lse,
                          float *w, float *acc) {
  const int64_t d = m->head_dim;
  for (int p = 0; p < m->n; p++)
    lse[p] = *(const float *)cpu_elem(&m->lse_parts[p], b, s, h);
  const float out = attn__merge_lse(lse, 1, m->n, w);
  for (int64_t c = 0; c < d; c++)
    acc[c] = 0.0f;
  for (int p = 0; p < m->n; p++) {
    /* A part that saw nothing adds nothing, whatever its o holds. */
    if (w[p] == 0.0f) continue;
    const attn__tensor *t = &m->o_parts[p];
    const char *x = cpu_elem(t, b, s, h);
    for (int64_t c = 0; c < d; c++)
      acc[c] += w[p] * attn__load(x, t->dtype, c * t->sd);
  }
  char *y = (char *)cpu_elem(&m->o, b, s, h);
  for (int64_t c = 0; c < d; c++)
    attn__store(y, m->o.dtype, c * m->o.sd, acc[c]);
  if (m->has_lse) *(float *)cpu_elem(&m->lse, b, s, h) = out;
}

int attn__cpu_merge(attn_context *ctx, const attn__merge *m) {
  const int64_t rows = m->batch * m->seqlen * m->heads;
#pragma omp parallel num_threads(attn__cpu_threads())
  {
    float lse[ATTN_MAX_MERGE], w[ATTN_MAX_MERGE], acc[ATTN_MAX_HEAD_DIM];
#pragma omp for schedule(static)
    for (int64_t x = 0; x < rows; x++)
      cpu_merge_row(m, x / (m->seqlen * m->heads), x / m->heads % m->seqlen, x % m->heads, lse, w,
                    acc);
  }
  return ATTN_OK;
}
