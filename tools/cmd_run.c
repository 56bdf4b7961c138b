/*
 * attn run and attn vit: a random problem on the selected backend, timed
 * (median of --repeat calls, GFLOP/s and GB/s), refused first when its
 * memory is more than there is, then checked against the reference
 * (run_reference.c).
 */
#include "run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Refuses, with the sentence the user needs, a problem whose memory is more
 * than there is (run_fits). */
static int too_big(const run_opts *o, const char *why) {
  return cli_complain("%s: %s", o->sizes[0] ? o->sizes : "the problem", why);
}

/* ---------------------------------------------------------------------- */
/* Running                                                                  */
/* ---------------------------------------------------------------------- */

/* "bias [2,16,4096,4096]" and the like, for the problem line. */
static void describe_terms(const run_opts *o, const run_cache *c, char *buf, size_t len) {
  size_t n = 0;
  buf[0] = 0;
  if (o->bias) {
    int64_t s[4];
    run_bias_shape(o, c->cap, s);
    static const char *const form[] = {
        [RUN_BIAS_FULL] = "full", [RUN_BIAS_HEADS] = "heads", [RUN_BIAS_KEYS] = "keys"};
    n += (size_t)snprintf(buf + n, len - n, ", bias %s [%lld,%lld,%lld,%lld]", form[o->bias],
                          (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3]);
  }
  if (o->sinks && n < len) n += (size_t)snprintf(buf + n, len - n, ", sinks");
  if (o->params.num_splits && n < len)
    snprintf(buf + n, len - n, ", %d split%s", o->params.num_splits,
             o->params.num_splits == 1 ? "" : "s");
}

/* The cache line: capacity, pages, the lengths used, the appended rows. */
static void print_cache(const run_opts *o, const run_cache *c) {
  int64_t lo = INT64_MAX, hi = 0;
  for (int64_t b = 0; b < o->batch; b++) {
    if (c->lens[b] < lo) lo = c->lens[b];
    if (c->lens[b] > hi) hi = c->lens[b];
  }
  printf("  cache     %lld rows per sequence", (long long)c->cap);
  if (o->page_size)
    printf(", paged: %lld pages of %lld each, %lld in a shuffled block table",
           (long long)c->max_pages, (long long)o->page_size, (long long)c->num_pages);
  if (lo == hi)
    printf(", %lld keys used", (long long)hi);
  else
    printf(", keys used %lld to %lld", (long long)lo, (long long)hi);
  if (o->append) printf(" (the last %lld appended by the call)", (long long)o->nq);
  printf("\n");
}

static int run_problem(const run_opts *o, const char *title) {
  char why[256];
  if (run_fits(o, NULL, 0, why, sizeof why)) return too_big(o, why);

  run_cache c;
  if (run_cache_make(o, &c)) {
    run_cache_free(&c);
    return cli_out_of_host_memory();
  }
  attn_context *ctx = NULL;
  int rc = attn_context_create(o->backend, &ctx);
  if (rc) {
    int r = cli_fail_ctx(ctx, rc, "cannot create a context");
    attn_context_free(ctx);
    run_cache_free(&c);
    return r;
  }
  attn_device_info info;
  attn_context_device_info(ctx, &info);

  /* Error against the double reference when it finishes in seconds. */
  double pairs = run_pairs(o, c.lens);
  double work = (double)o->hq * pairs * (double)o->d;
  int check = o->check < 0 ? work <= 3e8 : o->check;
  int status = 0;
  if (run_fits(o, &info, check, why, sizeof why)) {
    status = too_big(o, why);
    attn_context_free(ctx);
    run_cache_free(&c);
    return status;
  }

  attn_params p = o->params;
  float *slopes = NULL;
  run_tensors t;
  memset(&t, 0, sizeof t);
  size_t repeat = (size_t)o->repeat;
  double *tf = calloc(repeat, sizeof(double)), *tb = calloc(repeat, sizeof(double));
  if (!tf || !tb) {
    status = cli_out_of_host_memory();
    goto done;
  }
  if (o->alibi) {
    slopes = malloc(sizeof(float) * (size_t)o->hq);
    if (!slopes) {
      status = cli_out_of_host_memory();
      goto done;
    }
    for (int64_t h = 0; h < o->hq; h++)
      slopes[h] = powf(2.0f, -8.0f * (float)(h + 1) / (float)o->hq);
    p.alibi_slopes = slopes;
    p.alibi_count = o->hq;
  }
  if ((rc = run_tensors_make(ctx, o, &c, &t))) {
    status = rc == ATTN_ENOMEM && !attn_errmsg(ctx)[0]
                 ? cli_out_of_host_memory()
                 : cli_fail_ctx(ctx, rc, "cannot allocate the tensors");
    goto done;
  }
  p.seqused_k = t.seqused.buf ? &t.seqused.t : NULL;
  p.block_table = t.table.buf ? &t.table.t : NULL;
  p.k_new = t.k_new.buf ? &t.k_new.t : NULL;
  p.v_new = t.v_new.buf ? &t.v_new.t : NULL;
  p.bias = t.bias.buf ? &t.bias.t : NULL;
  p.sinks = t.sinks.buf ? &t.sinks.t : NULL;
  attn_params pb = p;
  pb.dbias = t.dbias.buf ? &t.dbias.t : NULL;
  pb.dsinks = t.dsinks.buf ? &t.dsinks.t : NULL;

  /* Appending writes the same rows to the same places each time. */
  size_t nf = 0, nb = 0;
  run_pass cf = {ctx, &p, &t}, cb = {ctx, &pb, &t};
  const int queued = (p.flags & ATTN_ASYNC) != 0;
  if (queued) {
    rc = run_time_queued(run_forward, &cf, ctx, repeat, tf, &nf);
    if (!rc && o->backward) rc = run_time_queued(run_backward, &cb, ctx, repeat, tb, &nb);
    /* The check's own calls return with their results. */
    p.flags &= ~ATTN_ASYNC;
  } else {
    rc = run_time_calls(run_forward, &cf, repeat, INFINITY, tf, &nf);
    if (!rc && o->backward) rc = run_time_calls(run_backward, &cb, repeat, INFINITY, tb, &nb);
  }
  if (rc) {
    status = cli_fail_ctx(ctx, rc, o->backward ? "attention failed" : "forward failed");
    goto done;
  }
  double flops = 4.0 * (double)o->hq * pairs * (double)o->d;
  char terms[160];
  describe_terms(o, &c, terms, sizeof terms);
  printf("%s\n", title);
  printf("  backend   %s:%d (%s)\n", attn_backend_name(info.backend), info.index, info.name);
  printf(
      "  problem   batch %lld, seqlen_q %lld, seqlen_k %lld, heads %lld/%lld, head_dim %lld, "
      "%s%s%s%s%s%s\n",
      (long long)o->batch, (long long)o->nq, (long long)o->nk, (long long)o->hq, (long long)o->hkv,
      (long long)o->d, attn_dtype_name(o->dtype),
      (p.flags & ATTN_ALLOW_TF32) ? " (TF32 allowed)" : "",
      (p.flags & ATTN_CAUSAL) ? ", causal" : "", p.softcap > 0 ? ", softcap" : "",
      o->alibi ? ", alibi" : "", terms);
  if (run_has_cache(o)) print_cache(o, &c);
  double mf = tf[nf / 2];
  char how[48] = "";
  if (queued) snprintf(how, sizeof how, " samples of %d queued calls", RUN_QUEUED_CALLS);
  printf("  forward   %.3f ms median of %zu%s, %.1f GFLOP/s, %.1f GB/s\n", mf * 1e3, nf, how,
         flops / mf * 1e-9, run_bytes_forward(o, &c) / mf * 1e-9);
  if (o->backward) {
    double mb = tb[nb / 2];
    printf(
        "  backward  %.3f ms median of %zu%s, %.1f GFLOP/s (2.5x the forward's FLOPs), %.1f GB/s\n",
        mb * 1e3, nb, how, 2.5 * flops / mb * 1e-9, run_bytes_backward(o) / mb * 1e-9);
  }
  if (!check) {
    printf("  error     not checked (problem too large for the reference; --check forces it)\n");
    goto done;
  }
  fflush(stdout); /* the results so far come before the reference's progress */
  status = run_check_reference(ctx, o, &c, &p, &t);
done:
  free(tf);
  free(tb);
  run_tensors_free(&t);
  free(slopes);
  attn_context_free(ctx);
  run_cache_free(&c);
  return status;
}

/* ---------------------------------------------------------------------- */
/* Commands                                                                 */
/* ---------------------------------------------------------------------- */

int cmd_run(int argc, char **argv) {
  run_opts o;
  run_defaults(&o);
  int rc = run_parse(argc, argv, &o, 0);
  if (rc > 0) return fputs(run_help, stdout), 0;
  if (rc < 0) return EXIT_USAGE;
  return run_problem(&o, "attn run");
}

int cmd_vit(int argc, char **argv) {
  run_opts o;
  run_defaults(&o);
  /* ViT-B/16 at 224x224: (224/16)^2 = 196 patches plus the class token,
   * 12 heads of 64 (hidden size 768). */
  o.nq = o.nk = 197;
  o.hq = o.hkv = 12;
  o.d = 64;
  o.repeat = 20;
  int rc = run_parse(argc, argv, &o, 1);
  if (rc > 0) {
    printf(
        "usage: attn vit [--batch B] [--dtype T] [--backward] [--repeat R] [--backend SPEC] "
        "[--check|--no-check] [--seed S]\n"
        "The self-attention of ViT-B/16 on 224x224 images: 197 tokens (196 patches and the class\n"
        "token), 12 heads of 64, for a batch of B images (1). Prints the backend, the median "
        "time,\n"
        "GFLOP/s and the error against the reference.\n");
    return 0;
  }
  if (rc < 0) return EXIT_USAGE;
  return run_problem(&o, "attn vit: ViT-B/16 self-attention, 224x224 images");
}
