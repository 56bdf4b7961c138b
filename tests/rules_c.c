/* The C evaluator of the rules table: src/rules.h on every row. */
#include "rules.h"
#include "rules_table.h"

int rules_eval_c(const rules_in *in, int n, rules_out *out) {
  for (int x = 0; x < n; x++) {
    const rules_in *r = &in[x];
    rules_out *o = &out[x];
    int64_t dg = attn__diag(r->i, r->nq, r->nk), lo, hi;
    o->diag = (int32_t)dg;
    attn__key_range(dg, r->nk, r->wl, r->wr, &lo, &hi);
    o->key_lo = (int32_t)lo;
    o->key_hi = (int32_t)hi;
    attn__query_range(r->j, r->nq, r->nk, r->wl, r->wr, &lo, &hi);
    o->query_lo = (int32_t)lo;
    o->query_hi = (int32_t)hi;
    attn__key_block_range(r->i0, r->i1, r->nq, r->nk, r->wl, r->wr, &lo, &hi);
    o->kblock_lo = (int32_t)lo;
    o->kblock_hi = (int32_t)hi;
    attn__query_block_range(r->j0, r->j1, r->nq, r->nk, r->wl, r->wr, &lo, &hi);
    o->qblock_lo = (int32_t)lo;
    o->qblock_hi = (int32_t)hi;
    o->visible = attn__key_visible(dg, r->j, r->wl, r->wr);
    /* C has no tile rule; its form from key_range: the last row's lo and the
     * first row's hi (clamped to nk) bound the keys every row sees. */
    int64_t lo_last, hi_first, unused;
    attn__key_range(attn__diag(r->i1 - 1, r->nq, r->nk), r->nk, r->wl, r->wr, &lo_last, &unused);
    attn__key_range(attn__diag(r->i0, r->nq, r->nk), r->nk, r->wl, r->wr, &unused, &hi_first);
    o->unmasked = r->j0 >= lo_last && r->j2 <= hi_first;
    o->score = attn__score(r->dot, r->scale, r->softcap, r->slope, dg - r->j, &o->t);
    /* C has no log2 domain of its own. */
    o->score_log2 = o->score * 1.44269504088896340736f;
    o->grad = attn__score_grad(r->ds, o->t, r->softcap);
  }
  return 0;
}
