/*
 * decode: text generation over a KV cache.
 *
 * The cache holds each sequence's keys and values, [batch, capacity,
 * heads_kv, head_dim], of which sequence b uses the first used[b] rows. One
 * call appends the new tokens' key and value rows to the cache (params.k_new,
 * params.v_new, written at row used[b]) and attends to everything the
 * sequence then holds; the caller advances used[b] afterwards. The first call
 * is the prefill, the whole prompt at once (causal); each later one is a
 * decoding step of one token per sequence.
 *
 * After every call the example checks that the new rows were copied into the
 * cache as they are, and that o equals attention recomputed from scratch
 * (in double, the whole score matrix) over every row the sequence has seen.
 * The rows of the cache that no call has written yet hold NaN: a read of one
 * would make o NaN and fail the check.
 *
 * The cache here is host memory, which every backend takes (a GPU backend
 * copies it to the device and back for the call). A GPU program keeps it in a
 * device buffer instead (attn_buffer_create, attn_tensor_on), and then a step
 * copies nothing.
 */
#include <attn.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* 2 sequences, 4 query heads sharing 2 key/value heads, a prompt of 6
 * tokens, then 10 generated ones, in a cache of 32 rows a sequence. */
enum { B = 2, HQ = 4, HKV = 2, D = 16, CAP = 32, PROMPT = 6, STEPS = 10 };

/* Element (b, s, h, c) of a bshd array of seqlen n and `heads` heads. */
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
 * keys, in double: query row i sees key j <= i + nk - n. keys and values are
 * [B, CAP, HKV, D]; query head h reads key/value head h / (HQ / HKV). */
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
    fprintf(stderr, "decode: %s\n", attn_errmsg(ctx));
    attn_context_free(ctx);
    return 1;
  }
  printf("decode: backend %s\n", attn_backend_name(attn_context_backend(ctx)));

  /* The cache, and beside it every key and value row the example made, which
   * the check reads (never the cache). */
  static float k_cache[B * CAP * HKV * D], v_cache[B * CAP * HKV * D];
  static float k_seen[B * CAP * HKV * D], v_seen[B * CAP * HKV * D];
  for (size_t i = 0; i < sizeof k_cache / sizeof *k_cache; i++)
    k_cache[i] = v_cache[i] = NAN;
  int32_t used[B] = {0, 0};

  /* One call's new tokens: their queries, keys and values (what a model's
   * projections of the tokens would give), and the output. */
  static float q[B * PROMPT * HQ * D], k_new[B * PROMPT * HKV * D], v_new[B * PROMPT * HKV * D];
  static float o[B * PROMPT * HQ * D];
  static double want[B * PROMPT * HQ * D];

  attn_tensor tk = attn_tensor_bshd(k_cache, ATTN_F32, B, CAP, HKV, D);
  attn_tensor tv = attn_tensor_bshd(v_cache, ATTN_F32, B, CAP, HKV, D);
  attn_tensor t_used = attn_tensor_1d(used, ATTN_I32, B);

  unsigned seed = 3;
  int ok = 1;
  for (int step = 0; ok && step <= STEPS; step++) {
    int n = step == 0 ? PROMPT : 1; /* the prefill, then one token a step */
    fill(q, (size_t)B * n * HQ * D, &seed);
    fill(k_new, (size_t)B * n * HKV * D, &seed);
    fill(v_new, (size_t)B * n * HKV * D, &seed);

    attn_tensor tq = attn_tensor_bshd(q, ATTN_F32, B, n, HQ, D);
    attn_tensor to = attn_tensor_bshd(o, ATTN_F32, B, n, HQ, D);
    attn_tensor tk_new = attn_tensor_bshd(k_new, ATTN_F32, B, n, HKV, D);
    attn_tensor tv_new = attn_tensor_bshd(v_new, ATTN_F32, B, n, HKV, D);
    attn_params p;
    attn_params_init(&p);
    p.flags |= ATTN_CAUSAL; /* aligned to the cache's end: a new row sees itself and all before */
    p.seqused_k = &t_used;  /* rows already in the cache */
    p.k_new = &tk_new;      /* written at rows used[b] .. used[b] + n - 1 */
    p.v_new = &tv_new;
    int rc = attn_forward(ctx, &p, &tq, &tk, &tv, &to, NULL);
    if (rc != ATTN_OK) {
      fprintf(stderr, "decode: step %d: %s: %s\n", step, attn_status_name(rc), attn_errmsg(ctx));
      ok = 0;
      break;
    }

    /* The check: the new rows are in the cache, bit for bit, and o is
     * attention over all the rows so far. */
    for (int b = 0; b < B; b++)
      for (int r = 0; r < n; r++) {
        size_t row = at(b, used[b] + r, 0, 0, CAP, HKV), row_new = at(b, r, 0, 0, n, HKV);
        memcpy(k_seen + row, k_new + row_new, HKV * D * sizeof(float));
        memcpy(v_seen + row, v_new + row_new, HKV * D * sizeof(float));
        if (memcmp(k_cache + row, k_seen + row, HKV * D * sizeof(float)) ||
            memcmp(v_cache + row, v_seen + row, HKV * D * sizeof(float))) {
          printf("  step %d: sequence %d's row %d was not appended to the cache\n", step, b,
                 used[b] + r);
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
    /* The golden cases' float32 tolerance without a peer figure
     * (tests/golden/README.md). */
    double bound = 1e-5 * big;
    printf("  %s over %2d keys: max|err| %.2e (bound %.1e) %s\n", step ? "step   " : "prefill",
           used[0] + n, err, bound, err <= bound ? "ok" : "WRONG");
    ok &= err <= bound;

    for (int b = 0; b < B; b++)
      used[b] += n; /* the caller advances the used lengths */
  }

  attn_context_free(ctx);
  printf("decode: %s\n", ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}
