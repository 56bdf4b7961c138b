/*
 * The test kit's reference: attention by its definition, in double. It is
 * not part of the library: the tests and the attn program link it
 * (testkit/, the static library attn_testkit) beside the library's static
 * build, whose internal validation it calls.
 */
#ifndef ATTN_REF_H
#define ATTN_REF_H

#include "attn_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------- */
/* Reference: materializes the scores, accumulates in double (testkit/ref.c)    */
/* ---------------------------------------------------------------------- */

/* Host tensors only. With a KV cache, the reference reads appended rows from
 * params.k_new / v_new and leaves k and v alone (so a caller can compare the
 * backend's appended cache against them). o is written contiguous in q's shape ([rows, Hq, d] per
 * the layout), lse as [B, Hq, Nq] (bshd) or [Hq, total_q] (varlen); either
 * may be NULL. Validation errors are reported on ctx, which may be any
 * context (it is used for messages only). */
int at_ref_forward(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                   const attn_tensor *k, const attn_tensor *v, double *o, double *lse);
/* Gradients of sum(o * dout), dq contiguous like q, dk and dv like k. */
int at_ref_backward(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                    const attn_tensor *k, const attn_tensor *v, const attn_tensor *dout, double *dq,
                    double *dk, double *dv);
/* The same, calling progress(user, done, total) after each query row (rows
 * counted over batch and heads), so a program can show how far a slow
 * reference has come; progress may be NULL. */
typedef void (*at_progress_fn)(void *user, int64_t done, int64_t total);
int at_ref_forward_progress(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                            const attn_tensor *k, const attn_tensor *v, double *o, double *lse,
                            at_progress_fn progress, void *user);
int at_ref_backward_progress(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                             const attn_tensor *k, const attn_tensor *v, const attn_tensor *dout,
                             double *dq, double *dk, double *dv, at_progress_fn progress,
                             void *user);
/* The backward with the score terms' gradients too: dbias contiguous in the
 * shape of params.bias (summed over its broadcast dimensions), dsinks
 * [heads_q]; each may be NULL. */
int at_ref_backward_terms(attn_context *ctx, const attn_params *p, const attn_tensor *q,
                          const attn_tensor *k, const attn_tensor *v, const attn_tensor *dout,
                          double *dq, double *dk, double *dv, double *dbias, double *dsinks,
                          at_progress_fn progress, void *user);

#ifdef __cplusplus
}
#endif
#endif /* ATTN_REF_H */
