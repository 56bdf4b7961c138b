/*
 * The KV cache of attn run: its capacity, the lengths its sequences use and
 * the shuffled block table of a paged cache, all drawn from --seed.
 */
#include "run.h"

#include <stdlib.h>

int run_has_cache(const run_opts *o) {
  return o->page_size > 0 || o->cache_extra >= 0 || o->append;
}

int64_t run_cache_capacity(const run_opts *o, int64_t *max_pages) {
  *max_pages = 0;
  /* Lengths and page numbers are int32 (seqused_k, block_table). */
  const int64_t lim = INT32_MAX;
  const int64_t extra = o->cache_extra > 0 ? o->cache_extra : 0;
  if (!run_has_cache(o)) return o->nk;
  if (o->nk > lim || extra > lim - o->nk) return -1;
  int64_t cap = o->nk + extra;
  if (o->page_size > 0) {
    *max_pages = (cap + o->page_size - 1) / o->page_size;
    if (*max_pages > lim / o->page_size || *max_pages > lim / o->batch) return -1;
    cap = *max_pages * o->page_size;
  }
  return cap;
}

int64_t run_cache_rows(const run_opts *o, const run_cache *c) {
  return o->page_size > 0 ? c->num_pages * o->page_size : o->batch * c->cap;
}

/* splitmix64: the layout's own stream, so that the inputs' values stay what
 * the seed gave them before these options. */
static uint64_t next(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int run_cache_make(const run_opts *o, run_cache *c) {
  memset(c, 0, sizeof *c);
  c->cap = run_cache_capacity(o, &c->max_pages);
  c->num_pages = o->batch * c->max_pages;
  const int64_t fresh = o->append ? o->nq : 0;
  uint64_t s = o->seed ^ 0x6A09E667F3BCC909ull;
  c->lens = malloc(sizeof *c->lens * (size_t)o->batch);
  if (!c->lens) return -1;
  /* The first sequence is the longest; with --cache-extra the others use a
   * part of it, at least half and at least the rows they append. */
  int64_t lo = (o->nk + 1) / 2 > fresh ? (o->nk + 1) / 2 : fresh;
  for (int64_t b = 0; b < o->batch; b++)
    c->lens[b] = o->cache_extra >= 0 && b > 0
                     ? lo + (int64_t)(next(&s) % (uint64_t)(o->nk - lo + 1))
                     : o->nk;
  /* seqused_k where some sequence uses less than the capacity, or where it
   * says where appended rows go. */
  int need = o->append || o->cache_extra >= 0 || (o->page_size > 0 && c->cap != o->nk);
  if (need) {
    c->seqused = malloc(sizeof *c->seqused * (size_t)o->batch);
    if (!c->seqused) return -1;
    for (int64_t b = 0; b < o->batch; b++)
      c->seqused[b] = (int32_t)(c->lens[b] - fresh);
  }
  if (o->page_size > 0) {
    /* Every page once, in a random order (Fisher-Yates): sequences read
     * pages scattered over the whole cache, as a server's do. */
    c->table = malloc(sizeof *c->table * (size_t)c->num_pages);
    if (!c->table) return -1;
    for (int64_t i = 0; i < c->num_pages; i++)
      c->table[i] = (int32_t)i;
    for (int64_t i = c->num_pages - 1; i > 0; i--) {
      int64_t j = (int64_t)(next(&s) % (uint64_t)(i + 1));
      int32_t x = c->table[i];
      c->table[i] = c->table[j];
      c->table[j] = x;
    }
  }
  return 0;
}

void run_cache_free(run_cache *c) {
  free(c->lens);
  free(c->seqused);
  free(c->table);
  memset(c, 0, sizeof *c);
}
