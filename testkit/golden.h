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
  int64_t total_q, total_k; /* rows: batch*seqlen for bshd, cu[batch] for varlen */
  attn_params params;       /* scale, flags (ATTN_CAUSAL), window, softcap, alibi, cu_seqlens: all
                               filled, pointing into memory owned by this struct */
  void *q, *k, *v, *dout;   /* inputs in `dtype` (raw 16-bit patterns for f16/bf16) */
  float *o, *lse, *dq, *dk, *dv; /* references, float32; dq..dv may be NULL if absent */
  double peer_o, peer_lse, peer_dq, peer_dk, peer_dv; /* peer_max_err; NAN where absent */
  /* private: owned allocations */
  float *alibi_;
  int32_t *cu_q_, *cu_k_;
} at_golden;

/* Loads one case folder; 0 on success, else -1 with a sentence in err. */
int at_golden_load(const char *dir, at_golden *g, char *err, size_t errlen);
void at_golden_free(at_golden *g);
/* Case folders (holding case.json) directly under root, or root itself if it holds case.json;
   sorted by name. Returns the count (>= 0) and a malloc'd array of malloc'd paths, or -1 with a
   sentence in err. */
int at_golden_list(const char *root, char ***dirs, char *err, size_t errlen);
void at_golden_list_free(char **dirs, int n);

typedef struct at_golden_result {
  const char *output; /* "o", "lse", "dq", "dk", "dv" */
  double max_err; /* max |X - ref| over finite-ref elements; INFINITY if a NaN or a wrong -inf */
  double bound;   /* the README's tolerance for this output */
  double ratio;   /* max_err / (F * peer) — the README's F achieved; NAN when no peer figure */
  int pass;
} at_golden_result;

typedef struct at_golden_report {
  int status;        /* attn_status of the library call (ATTN_OK when it ran) */
  char message[512]; /* attn_errmsg when status != OK */
  int n;             /* results filled: 2 forward, 5 with backward */
  at_golden_result r[5];
  int pass; /* status OK and every result passes */
} at_golden_report;

/* What the README allows for one output ("o", "lse", "dq", ...) of a case of
   dtype dt whose reference's largest magnitude is maxref: F * peer + 1e-6 * max(1, maxref).
   Without a peer figure (peer NAN), lse is held to float32 arithmetic on exact inputs
   (1e-5 * max(1, maxref), the README's rule for f16/bf16), and any other output to a per-dtype
   relative bound: 1e-5 (f32), 1e-2 (f16), 2e-2 (bf16) times max(1, maxref). */
double at_golden_bound(const char *out, attn_dtype dt, double peer, double maxref);

/* Runs the case on ctx (host tensors; forward, then backward unless forward_only), compares every
   output with the tolerance rule of the golden README (rows whose reference lse is -inf must give
   exactly -inf and an all-zero o row; no NaN anywhere; f16/bf16 lse within 1e-5*max(1,max|ref|)).
   Outputs converted from the input dtype to float for comparison. Elements the library leaves
   unwritten count as NaN. Returns rep->status: ATTN_OK when the library ran (pass or fail is
   rep->pass), else the failing call's status (rep->n is then 0, or 2 when only backward failed). */
int at_golden_run(attn_context *ctx, const at_golden *g, int forward_only, at_golden_report *rep);

#ifdef __cplusplus
}
#endif
#endif /* AT_GOLDEN_H */
