/*
 * The KV-cache append: rows r of k_new and v_new of sequence b written into
 * k and v at key row attn__seq_used(b) + r, through attn__key_row (so a
 * paged cache takes its block table, a varlen one its cu_seqlens_k), before
 * the forward pass reads them as keys like any other.
 */
#include "cpu_internal.h"

/* Row r of head h of sequence b of t (bshd strides, as k_new has). */
static const char *cpu_new_row(const attn__tensor *t, int64_t b, int64_t r, int64_t h) {
  const int64_t e = b * t->sb + r * t->ss + h * t->sh;
  return (const char *)t->native + t->offset + (ptrdiff_t)e * (ptrdiff_t)attn_dtype_size(t->dtype);
}

static void cpu_append_one(const attn__problem *pb, const attn__tensor *src,
                           const attn__tensor *dst, int64_t b, int64_t r, int64_t h) {
  const int64_t d = pb->head_dim;
  const size_t size = attn_dtype_size(dst->dtype);
  const char *x = cpu_new_row(src, b, r, h);
  const int64_t e = attn__key_row(pb, dst, b, attn__seq_used(pb, b) + r) + h * dst->sh;
  char *y = (char *)dst->native + dst->offset + (ptrdiff_t)e * (ptrdiff_t)size;
  if (src->sd == 1 && dst->sd == 1) {
    memcpy(y, x, (size_t)d * size);
    return;
  }
  /* k_new has q's dtype, and so has the cache: bytes move as they are. */
  for (int64_t c = 0; c < d; c++)
    memcpy(y + (ptrdiff_t)(c * dst->sd) * (ptrdiff_t)size,
           x + (ptrdiff_t)(c * src->sd) * (ptrdiff_t)size, size);
}

/* One thread, in order: pages may be shared between sequences (a common
 * prefix), and two sequences that append into the same page then write in a
 * fixed order rather than race. A decoding step appends a row or a few; a
 * prefill's copy is small beside its attention. */
int attn__cpu_append(attn_context *ctx, const attn__problem *pb) {
  for (int64_t b = 0; b < pb->batch; b++)
    for (int64_t r = 0; r < pb->seqlen_new; r++)
      for (int64_t h = 0; h < pb->heads_kv; h++) {
        cpu_append_one(pb, &pb->k_new, &pb->k, b, r, h);
        cpu_append_one(pb, &pb->v_new, &pb->v, b, r, h);
      }
  return ATTN_OK;
}
