/*
 * decode_paged: text generation over a paged KV cache (a block table).
 *
 * Instead of a fixed stretch of rows per sequence, the cache is a pool of
 * pages of PAGE rows, [pages, PAGE, heads_kv, head_dim], shared by all
 * sequences, and each sequence's row j lives in row j % PAGE of page
 * block_table[b][j / PAGE]. A sequence takes a page from the free list when
 * it grows past the last one it has, so memory follows the tokens actually
 * generated, and the pages of one sequence need not be adjacent or in order.
 *
 * The loop is decode.c's: a prefill of the whole prompt, then one token a
 * step, each call appending the new rows (written through the block table)
 * and attending to everything the sequence holds. After each call the example
 * checks that the new rows landed in the right pages, and o against attention
 * recomputed from scratch (in double) over every row the sequence has seen.
 * Rows no call has written yet hold NaN, so a wrong read fails the check.
 */
#include <attn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* 2 sequences, 4 query heads sharing 2 key/value heads, a prompt of 6
 * tokens, then 10 generated ones; pages of 4 rows, at most 8 a sequence, 16
 * in the pool. */
enum { B = 2, HQ = 4, HKV = 2, D = 16, PROMPT = 6, STEPS = 10 };
enum { PAGE = 4, MAX_PAGES = 8, POOL = 16, CAP = PAGE * MAX_PAGES, ROW = HKV * D };

/* Element (b, s, h, c) of a bshd array of seqlen n and `heads` heads; of the
 * pages too, as [POOL, PAGE, HKV, D]. */
static size_t at(int b, int s, int h, int c, int n, int heads) {
  return (((size_t)b * n + s) * heads + h) * D + c;
}

static void fill(float *x, size_t n, unsigned *seed) {
  for (size_t i = 0; i < n; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    x[i] = (float)((*seed >> 8) / 8388608.0 - 1.0);
  }
}

/* Plain causal attention of sequence b's n new query rows over its first nk
 * keys, in double (see decode.c). keys and values are [B, CAP, HKV, D], each
 * sequence's rows in order: the check never reads the pages. */
static void reference(const float *q, int n, const float *keys, const float *values, int b, int nk,
                      double *o) {
  double s[CAP];
  for (int i = 0; i < n; i++)
    for (int h = 0; h < HQ; h++) {
      int hk = h / (HQ / HKV), last = i + nk - n;
      double m = -INFINITY, sum = 0;
      for (int j = 0; j <= last; j++) {
        double dot = 0;
        for (int c = 0; c < D; c++)
          dot += (double)q[at(b, i, h, c, n, HQ)] * keys[at(b, j, hk, c, CAP, HKV)];
        s[j] = dot / sqrt(D);
        if (s[j] > m) m = s[j];
      }
      for (int j = 0; j <= last; j++)
        sum += exp(s[j] - m);
      for (int c = 0; c < D; c++) {
        double acc = 0;
        for (int j = 0; j <= last; j++)
          acc += exp(s[j] - m) / sum * values[at(b, j, hk, c, CAP, HKV)];
        o[at(b, i, h, c, n, HQ)] = acc;
      }
    }
}

int main(void) {
  attn_context *ctx = NULL;
  if (attn_context_create(NULL, &ctx) != ATTN_OK) {
    fprintf(stderr, "decode_paged: %s\n", attn_errmsg(ctx));
    attn_context_free(ctx);
    return 1;
  }
  printf("decode_paged: backend %s\n", attn_backend_name(attn_context_backend(ctx)));

  /* The pool of pages, and the free list, in a scrambled order (i * 7 mod 16)
   * so that no sequence gets adjacent pages. */
  static float k_pages[POOL * PAGE * ROW], v_pages[POOL * PAGE * ROW];
  for (size_t i = 0; i < sizeof k_pages / sizeof *k_pages; i++)
    k_pages[i] = v_pages[i] = NAN;
  int32_t free_list[POOL], n_free = POOL;
  for (int i = 0; i < POOL; i++)
    free_list[i] = (int32_t)(i * 7 % POOL);
  /* Every entry names a page of the pool, also past a sequence's last page:
   * those entries are never read. */
  int32_t block_table[B][MAX_PAGES] = {{0}};
  int32_t used[B] = {0, 0};

  /* Every key and value row made so far, in order, for the check. */
  static float k_seen[B * CAP * ROW], v_seen[B * CAP * ROW];

  static float q[B * PROMPT * HQ * D], k_new[B * PROMPT * ROW], v_new[B * PROMPT * ROW];
  static float o[B * PROMPT * HQ * D];
  static double want[B * PROMPT * HQ * D];

  attn_tensor tk = attn_tensor_bshd(k_pages, ATTN_F32, POOL, PAGE, HKV, D);
  attn_tensor tv = attn_tensor_bshd(v_pages, ATTN_F32, POOL, PAGE, HKV, D);
  attn_tensor t_table = attn_tensor_2d(block_table, ATTN_I32, B, MAX_PAGES);
  attn_tensor t_used = attn_tensor_1d(used, ATTN_I32, B);

  unsigned seed = 5;
  int ok = 1;
  for (int step = 0; ok && step <= STEPS; step++) {
    int n = step == 0 ? PROMPT : 1;
    /* Pages for the rows this call appends, from the free list (a server
     * would wait, or evict a sequence, when it runs out). */
    for (int b = 0; b < B; b++)
      for (int r = used[b]; r < used[b] + n; r++)
        if (r % PAGE == 0 && n_free > 0) block_table[b][r / PAGE] = free_list[--n_free];

    fill(q, (size_t)B * n * HQ * D, &seed);
    fill(k_new, (size_t)B * n * ROW, &seed);
    fill(v_new, (size_t)B * n * ROW, &seed);
    attn_tensor tq = attn_tensor_bshd(q, ATTN_F32, B, n, HQ, D);
    attn_tensor to = attn_tensor_bshd(o, ATTN_F32, B, n, HQ, D);
    attn_tensor tk_new = attn_tensor_bshd(k_new, ATTN_F32, B, n, HKV, D);
    attn_tensor tv_new = attn_tensor_bshd(v_new, ATTN_F32, B, n, HKV, D);
    attn_params p;
    attn_params_init(&p);
    p.flags |= ATTN_CAUSAL;
    p.block_table = &t_table; /* k and v are pages: [POOL, PAGE, HKV, D] */
    p.seqused_k = &t_used;
    p.k_new = &tk_new;
    p.v_new = &tv_new;
    int rc = attn_forward(ctx, &p, &tq, &tk, &tv, &to, NULL);
    if (rc != ATTN_OK) {
      fprintf(stderr, "decode_paged: step %d: %s: %s\n", step, attn_status_name(rc),
              attn_errmsg(ctx));
      ok = 0;
      break;
    }

    /* Row j of sequence b is row j % PAGE of page block_table[b][j / PAGE]. */
    for (int b = 0; b < B; b++)
      for (int r = 0; r < n; r++) {
        int j = used[b] + r;
        size_t seen = at(b, j, 0, 0, CAP, HKV), row_new = at(b, r, 0, 0, n, HKV);
        size_t paged = at(block_table[b][j / PAGE], j % PAGE, 0, 0, PAGE, HKV);
        memcpy(k_seen + seen, k_new + row_new, ROW * sizeof(float));
        memcpy(v_seen + seen, v_new + row_new, ROW * sizeof(float));
        if (memcmp(k_pages + paged, k_seen + seen, ROW * sizeof(float)) ||
            memcmp(v_pages + paged, v_seen + seen, ROW * sizeof(float))) {
          printf("  step %d: sequence %d's row %d is not in page %d\n", step, b, j,
                 (int)block_table[b][j / PAGE]);
          ok = 0;
        }
      }
    double err = 0, big = 1;
    for (int b = 0; b < B; b++)
      reference(q, n, k_seen, v_seen, b, used[b] + n, want);
    for (size_t i = 0; i < (size_t)B * n * HQ * D; i++) {
      double e = fabs(o[i] - want[i]);
      if (!(e <= err)) err = e; /* a NaN counts as the largest error */
      if (fabs(want[i]) > big) big = fabs(want[i]);
    }
    double bound = 1e-5 * big; /* as decode.c */
    printf("  %s over %2d keys in %d pages: max|err| %.2e (bound %.1e) %s\n",
           step ? "step   " : "prefill", used[0] + n, (used[0] + n + PAGE - 1) / PAGE, err, bound,
           err <= bound ? "ok" : "WRONG");
    ok &= err <= bound;

    for (int b = 0; b < B; b++)
      used[b] += n;
  }

  printf("  block table: ");
  for (int b = 0; b < B; b++) {
    printf("%s[", b ? ", " : "");
    for (int i = 0; i < (used[b] + PAGE - 1) / PAGE; i++)
      printf("%s%d", i ? " " : "", (int)block_table[b][i]);
    printf("]");
  }
  printf("\n");
  attn_context_free(ctx);
  printf("decode_paged: %s\n", ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}
