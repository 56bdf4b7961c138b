/* Runs one tiny forward pass through the installed library on the CPU and
 * checks it against a hand computation: the package is usable, not only found. */
#include <attn.h>
#include <math.h>
#include <stdio.h>

int main(void) {
  attn_context *ctx = NULL;
  int rc = attn_context_create("cpu", &ctx);
  if (rc != ATTN_OK) {
    fprintf(stderr, "consumer: %s\n", attn_errmsg(ctx));
    attn_context_free(ctx);
    return 1;
  }
  /* One query, two keys, d = 1: o = softmax([q*k0, q*k1]) . v */
  float q[1] = {1.0f}, k[2] = {0.0f, 1.0f}, v[2] = {2.0f, 4.0f}, o[1] = {0}, lse[1] = {0};
  attn_tensor tq = attn_tensor_bshd(q, ATTN_F32, 1, 1, 1, 1);
  attn_tensor tk = attn_tensor_bshd(k, ATTN_F32, 1, 2, 1, 1);
  attn_tensor tv = attn_tensor_bshd(v, ATTN_F32, 1, 2, 1, 1);
  attn_tensor to = attn_tensor_bshd(o, ATTN_F32, 1, 1, 1, 1);
  attn_tensor tl = attn_tensor_lse(lse, 1, 1, 1);
  attn_params p;
  attn_params_init(&p);
  rc = attn_forward(ctx, &p, &tq, &tk, &tv, &to, &tl);
  double e = exp(1.0), want = (2.0 + 4.0 * e) / (1.0 + e);
  int ok = rc == ATTN_OK && fabs(o[0] - want) < 1e-5 && fabs(lse[0] - log(1.0 + e)) < 1e-5;
  printf("consumer: %s, o = %.6f (expected %.6f)\n", attn_status_name(rc), o[0], want);
  attn_context_free(ctx);
  return ok ? 0 : 1;
}
