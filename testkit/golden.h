/*
 * Golden cases, the test kit's public header for them: loading a case folder
 * (case.json + .npy files, see the golden README; testkit/golden.c) and
 * checking the library against it with the README's tolerance rule
 * (testkit/check.c). Shared by `attn check`, the test suites and the fuzz
 * targets; not part of the library.
 */
#ifndef AT_GOLDEN_H
#define AT_GOLDEN_H

#include "attn.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct at_golden {
  char name[128]; /* folder base name */
  char dir[1024];
  attn_dtype dtype;                                               /* case.json dtype */
  int varlen;                                                     /* layout == "varlen" */
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim; /* seqlen_* 0 for varlen */
  int64_t total_q, total_k; /* rows of q and k: batch*seqlen for bshd, cu[batch] for varlen,
                               num_pages*page_size when paged */
  attn_params params;       /* scale, flags (ATTN_CAUSAL), window, softcap, alibi, cu_seqlens,
                               seqused_k, k_new/v_new, block_table, bias, sinks: all filled,
                               pointing into memory owned by this struct (num_splits 0, dbias and
                               dsinks NULL: the checker sets them) */
  void *q, *k, *v, *dout;   /* inputs in `dtype` (raw 16-bit patterns for f16/bf16) */
  float *o, *lse, *dq, *dk, *dv; /* references, float32; dq..dv may be NULL if absent */
  double peer_o, peer_lse, peer_dq, peer_dk, peer_dv; /* peer_max_err; NAN where absent */

  /* The inference path; each is off (0, NULL) where case.json does not have it. A case with a KV
     cache is forward only (no dout). */
  int32_t *seqused_k;                      /* [batch]: cache rows used before the call */
  int64_t seqlen_new;                      /* rows appended, k_new/v_new [batch, seqlen_new, Hkv, d] */
  void *k_new, *v_new;                     /* in `dtype` */
  void *k_out, *v_out;                     /* the cache after the append, like k and v */
  int64_t page_size, max_pages, num_pages; /* paged: k, v [num_pages, page_size, Hkv, d] */
  int32_t *block_table;                    /* [batch, max_pages] */
  attn_dtype bias_dtype;
  int64_t bias_shape[4]; /* [B|1, Hq|1, Nq|1, Nk] */
  void *bias;            /* NULL without a bias */
  float *sinks;          /* [heads_q], NULL without sinks */
  float *dbias, *dsinks; /* references (float32, bias_shape and [heads_q]); NULL if absent */
  double peer_dbias, peer_dsinks;

  /* private: owned allocations */
  float *alibi_;
  int32_t *cu_q_, *cu_k_;
  attn_tensor *meta_; /* what params.seqused_k, block_table, k_new, v_new, bias, sinks point to */
} at_golden;

/* Loads one case folder; 0 on success, else -1 with a sentence in err. */
int at_golden_load(const char *dir, at_golden *g, char *err, size_t errlen);
void at_golden_free(at_golden *g);
/* Case folders (holding case.json) directly under root, or root itself if it holds case.json;
   sorted by name. Returns the count (>= 0) and a malloc'd array of malloc'd paths, or -1 with a
   sentence in err. */
int at_golden_list(const char *root, char ***dirs, char *err, size_t errlen);
void at_golden_list_free(char **dirs, int n);

/* The most outputs a case has: o, lse, k_out, v_out (the cache after an append), dq, dk, dv,
   dbias, dsinks. */
#define AT_GOLDEN_MAX_RESULTS 9

typedef struct at_golden_result {
  const char *output; /* "o", "lse", "k_out", "v_out", "dq", "dk", "dv", "dbias", "dsinks" */
  double max_err; /* max |X - ref| over finite-ref elements; INFINITY if a NaN or a wrong -inf */
  double bound;   /* the README's tolerance for this output (0 for k_out, v_out: exact copies) */
  double peer;    /* the case's peer_max_err figure; NAN where it has none */
  double ratio;   /* max_err / (F * peer) — the README's F achieved; NAN when no peer figure
                     (with TF32, max_err / (F * (peer + tf32))) */
  double tf32;    /* with ATTN_ALLOW_TF32 on an f32 case, the error rounding to TF32 alone makes
                     (the reference computed as TF32, testkit/ref.h), whose F times joins the
                     bound; 0 otherwise */
  int num_splits; /* forward outputs: the params.num_splits whose run gave max_err; -1 backward */
  int pass;
} at_golden_result;

typedef struct at_golden_report {
  int status;        /* attn_status of the library call (ATTN_OK when it ran) */
  char message[512]; /* attn_errmsg when status != OK ("forward: ..." or "backward: ...") */
  int skipped;       /* the backend declined the case (status ATTN_EUNSUPPORTED, the reason in
                        message): the results filled before are valid, the rest is not a pass */
  int n_forward;     /* r[0 .. n_forward-1] are the forward's results, the backward's follow */
  int n;             /* results filled */
  at_golden_result r[AT_GOLDEN_MAX_RESULTS];
  int pass; /* status OK and every result passes; never set for a skipped case */
} at_golden_report;

/* What the README allows for one output ("o", "lse", "dq", ...) of a case of
   dtype dt whose reference's largest magnitude is maxref: F * peer + 1e-6 * max(1, maxref).
   Without a peer figure (peer NAN), lse is held to float32 arithmetic on exact inputs
   (1e-5 * max(1, maxref), the README's rule for f16/bf16), and any other output to a per-dtype
   relative bound: 1e-5 (f32), 1e-2 (f16), 2e-2 (bf16) times max(1, maxref). */
double at_golden_bound(const char *out, attn_dtype dt, double peer, double maxref);

/* What rounding to TF32 alone costs an output, for the README's TF32 rule: max |tf32 - exact| over
   n elements of the reference computed as TF32 and exactly (infinities equal to themselves). */
double at_golden_tf32_cost(const double *tf32, const double *exact, int64_t n);

/* The num_splits values every forward case runs with: the backend's choice (0), none (1), and a
   forced split (3); each run is held to the same rule, and the backward takes the first run's o
   and lse. */
#define AT_GOLDEN_SPLIT_RUNS 3
extern const int at_golden_splits[AT_GOLDEN_SPLIT_RUNS];

/* Runs the case on ctx (host tensors; forward once per at_golden_splits value, then backward
   unless forward_only) with g->params (a caller may add ATTN_ALLOW_TF32 to its flags: then an f32
   case is held to the README's TF32 rule, each bound growing by F times the error rounding to
   TF32 alone makes, see at_golden_result.tf32), compares every output with the tolerance rule of
   the golden README (rows
   whose reference lse is -inf, or with sinks is the sink while the reference o row is zero, must
   give exactly that lse and an all-zero o and dq row; no NaN anywhere; f16/bf16 lse within
   1e-5*max(1,max|ref|)); after an append, the cache k and v must equal k_out and v_out exactly.
   Outputs converted from the input dtype to float for comparison. Elements the library leaves
   unwritten count as NaN. Each call is first put to attn_supports: a backend that declines the
   forward or the backward (ATTN_EUNSUPPORTED) gets rep->skipped with its reason, the results of
   what ran before kept. Returns rep->status: ATTN_OK when the library ran (pass or fail is
   rep->pass), else the failing call's status. */
int at_golden_run(attn_context *ctx, const at_golden *g, int forward_only, at_golden_report *rep);

/* The same with the test kit's float64 reference (testkit/ref.c) in place of the library, held
   to the same rule (ctx only carries messages). The reference reads appended rows from k_new and
   v_new and leaves the cache alone, so k_out and v_out are not compared, and it runs once (the
   splits are the library's). Backend independent: it checks the golden cases and the reference
   against each other. */
int at_golden_run_reference(attn_context *ctx, const at_golden *g, int forward_only,
                            at_golden_report *rep);

#ifdef __cplusplus
}
#endif
#endif /* AT_GOLDEN_H */
