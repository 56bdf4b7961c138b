/*
 * What attn run, attn vit and attn bench share between their files: the
 * problem as the options give it, its KV cache, the tensors of a run, how a
 * call is timed, the work a call must do, the progress line, and the
 * reference check. Private to tools/.
 */
#ifndef ATTN_TOOLS_RUN_H
#define ATTN_TOOLS_RUN_H

#include "attn_internal.h"
#include "cli.h"

#include <stddef.h>
#include <stdint.h>

/* --bias FORM: which dimensions of [batch, heads, seqlen_q, keys] it has;
 * the others broadcast. */
enum run_bias { RUN_BIAS_NONE, RUN_BIAS_FULL, RUN_BIAS_HEADS, RUN_BIAS_KEYS };

typedef struct run_opts {
  const char *backend;
  attn_dtype dtype;
  int64_t batch, nq, nk, hq, hkv, d;
  attn_params params; /* num_splits included (--splits) */
  int alibi;
  int backward;
  int64_t repeat;
  int check; /* -1 auto, 0 no, 1 yes */
  uint64_t seed;
  /* The inference options. nk is then the keys the longest sequence
   * attends to, appended rows included. */
  int64_t page_size;   /* --page-size; 0 = not paged */
  int64_t cache_extra; /* --cache-extra; -1 = not given */
  int append;          /* --append: seqlen_q rows appended through k_new/v_new */
  enum run_bias bias;
  int sinks;
  char sizes[256]; /* the size options given, for messages: "--seqlen 99999999999" */
} run_opts;

/* Defaults of attn run: 1 x 1024 x 12 heads of 64, f32, 10 timed calls. */
void run_defaults(run_opts *o);
/* Parses the options shared by run and vit (vit takes fewer); returns 1 for
 * --help, -1 on error (said on stderr), else 0. run_options.c */
int run_parse(int argc, char **argv, run_opts *o, int vit);
/* The --help text of attn run. */
extern const char run_help[];

/* ---------------------------------------------------------------------- */
/* The KV cache (run_cache.c)                                               */
/* ---------------------------------------------------------------------- */

/* Whether the options ask for a KV cache in any form. */
int run_has_cache(const run_opts *o);
/* The key rows per sequence the library sees (k's seqlen; paged: max_pages *
 * page_size) and, paged, the block table's columns; -1 when a count passes
 * what int32 lengths and page numbers hold. */
int64_t run_cache_capacity(const run_opts *o, int64_t *max_pages);

typedef struct run_cache {
  int64_t cap;       /* run_cache_capacity */
  int64_t max_pages; /* block table columns; 0 unless paged */
  int64_t num_pages; /* pages of k and v: batch * max_pages */
  int64_t *lens;     /* [batch]: keys sequence b attends to, appended rows included */
  int32_t *seqused;  /* [batch]: lens minus the appended rows; NULL when not needed */
  int32_t *table;    /* [batch][max_pages]: every page once, shuffled; NULL unless paged */
} run_cache;

/* The lengths, and the block table, drawn from --seed. Returns -1 when out
 * of memory. */
int run_cache_make(const run_opts *o, run_cache *c);
void run_cache_free(run_cache *c);
/* Rows of k (and of v): batch * cap, or num_pages * page_size. */
int64_t run_cache_rows(const run_opts *o, const run_cache *c);

/* ---------------------------------------------------------------------- */
/* Tensors                                                                  */
/* ---------------------------------------------------------------------- */

/* A tensor of a run: its device buffer and one host copy of its contents. */
typedef struct device_tensor {
  attn_buffer *buf;
  attn_tensor t;
  void *host;
  size_t bytes;
} device_tensor;

/* Every tensor of a run; buf is NULL for one the options leave out. k and v
 * are the cache when there is one (paged: [pages, page_size, heads, d]). */
typedef struct run_tensors {
  device_tensor q, k, v, o, lse;
  device_tensor k_new, v_new, seqused, table, bias, sinks;
  device_tensor dout, dq, dk, dv, dbias, dsinks;
} run_tensors;

/* Elements of each tensor, in double so that no product can overflow. */
typedef struct run_sizes {
  double eq, ek, el; /* q-shaped, k-shaped (the cache), lse */
  double tensors;    /* bytes of every tensor the run uses (one copy) */
  double reference;  /* bytes of the reference's double outputs and the cache's read-back */
} run_sizes;

/* run_tensors.c */
run_sizes run_sizes_of(const run_opts *o);
/* Whether the tensors fit in the memory there is: with info NULL (before a
 * context exists) one host copy of them; with the context's device, also its
 * buffers (host memory on a CPU device, device memory on a GPU) and, with
 * check, the reference's arrays. Returns 0, or -1 with a sentence in why
 * ("the tensors would need 4.3 GB, more than the 2.1 GB of memory
 * available"). */
int run_fits(const run_opts *o, const attn_device_info *info, int check, char *why, size_t len);
/* Every tensor the options ask for, inputs random from o->seed, outputs NaN
 * (so that an element a call never writes fails the check). On failure
 * the status, and the tensors made so far are still freed by
 * run_tensors_free. */
int run_tensors_make(attn_context *ctx, const run_opts *o, const run_cache *c, run_tensors *t);
void run_tensors_free(run_tensors *t);
/* The same tensor over its host copy (for the reference). */
attn_tensor run_host_tensor(const device_tensor *t);

/* ---------------------------------------------------------------------- */
/* Timing (run_timing.c)                                                    */
/* ---------------------------------------------------------------------- */

/* Seconds on a monotonic clock, and n times sorted ascending (their
 * median is then t[n / 2]). */
double run_now_s(void);
void run_sort_times(double *t, size_t n);

/* A call to time; returns an attn status. */
typedef int (*run_call)(void *arg);
/* One untimed call, then calls each timed on the host clock (synchronous:
 * on a device the work is done when a call returns) until max of them, or,
 * after the first, until budget_s seconds have passed since the untimed
 * one ended. t (max entries) receives the times sorted ascending, *n their
 * count. Returns the first failing call's status. */
int run_time_calls(run_call fn, void *arg, size_t max, double budget_s, double *t, size_t *n);
/* Calls queued (ATTN_ASYNC in their params): one untimed call and
 * attn_context_synchronize, then max samples, each RUN_QUEUED_CALLS calls
 * back to back and one synchronize on the host clock, divided by the
 * calls: a call's time on the device with its launch overlapped by the
 * calls before it, as a loop that queues its work sees it. t and *n as
 * run_time_calls. */
#define RUN_QUEUED_CALLS 16
int run_time_queued(run_call fn, void *arg, attn_context *ctx, size_t max, double *t, size_t *n);
/* The passes attn run and attn bench time: attn_forward and attn_backward on
 * a run_pass's tensors, as run_calls (arg: the run_pass). */
typedef struct run_pass {
  attn_context *ctx;
  const attn_params *p;
  run_tensors *t;
} run_pass;
int run_forward(void *arg);
int run_backward(void *arg);

/* ---------------------------------------------------------------------- */
/* Progress on stderr (run_progress.c)                                      */
/* ---------------------------------------------------------------------- */

typedef struct run_progress {
  double t0; /* when it started (run_now_s) */
  int tty;   /* stderr is a terminal */
  int shown; /* a line is on the terminal */
} run_progress;

void run_progress_start(run_progress *pg);
/* "<cli_prog>: <message>": on a terminal over the line before, in place;
 * elsewhere as a line of its own. */
void run_progress_show(run_progress *pg, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* On a terminal, the line cleared, so that output after it starts clean. */
void run_progress_clear(run_progress *pg);

/* ---------------------------------------------------------------------- */
/* Work of a call (run_work.c)                                              */
/* ---------------------------------------------------------------------- */

/* Query-key pairs the mask leaves visible, over every sequence, for one
 * head: the FLOPs follow them. The backward pass has no cache (lens NULL:
 * every sequence has nk keys). */
double run_pairs(const run_opts *o, const int64_t *lens);
/* Bytes a call must move at the least: the K and V rows some query row sees
 * (each once), q, o, lse, the bias entries of visible pairs, the sinks, and
 * appended rows read from k_new/v_new and written to the cache. The
 * backward: q, k, v, o, do, lse, the visible bias entries read, dq, dk, dv,
 * dbias, dsinks written. */
double run_bytes_forward(const run_opts *o, const run_cache *c);
double run_bytes_backward(const run_opts *o);
/* The bias's shape for the options: [batch or 1, heads or 1, seqlen_q or 1,
 * keys]. */
void run_bias_shape(const run_opts *o, int64_t keys, int64_t shape[4]);

/* ---------------------------------------------------------------------- */
/* The check (run_reference.c)                                              */
/* ---------------------------------------------------------------------- */

/* Prints the error of the outputs (read back from the buffers) against the
 * double reference, and with --append whether the cache holds the appended
 * rows; returns the exit status (EXIT_FAILED outside the tolerance). p is
 * the forward's parameters, over the device tensors of t. */
int run_check_reference(attn_context *ctx, const run_opts *o, const run_cache *c,
                        const attn_params *p, run_tensors *t);

#endif /* ATTN_TOOLS_RUN_H */
