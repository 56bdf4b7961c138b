/*
 * What attn run and attn vit share between their files: the problem as the
 * options give it, the tensors of a run, and the reference check. Private to
 * tools/.
 */
#ifndef ATTN_TOOLS_RUN_H
#define ATTN_TOOLS_RUN_H

#include "attn_internal.h"
#include "cli.h"

#include <stddef.h>
#include <stdint.h>

typedef struct run_opts {
  const char *backend;
  attn_dtype dtype;
  int64_t batch, nq, nk, hq, hkv, d;
  attn_params params;
  int alibi;
  int backward;
  int64_t repeat;
  int check; /* -1 auto, 0 no, 1 yes */
  uint64_t seed;
  char sizes[256]; /* the size options given, for messages: "--seqlen 99999999999" */
} run_opts;

/* Defaults of attn run: 1 x 1024 x 12 heads of 64, f32, 10 timed calls. */
void run_defaults(run_opts *o);
/* Parses the options shared by run and vit (vit takes fewer); returns 1 for
 * --help, -1 on error (said on stderr), else 0. run_options.c */
int run_parse(int argc, char **argv, run_opts *o, int vit);
/* The --help text of attn run. */
extern const char run_help[];

/* A tensor of a run: its device buffer and one host copy of its contents. */
typedef struct device_tensor {
  attn_buffer *buf;
  attn_tensor t;
  void *host;
  size_t bytes;
} device_tensor;

/* Seconds on a monotonic clock. cmd_run.c */
double run_now_s(void);

/* Prints the error of the outputs (read back from the buffers) against the
 * double reference; returns the exit status. run_reference.c */
int run_check_reference(attn_context *ctx, const run_opts *o, const attn_params *p,
                        device_tensor *q, device_tensor *k, device_tensor *v, device_tensor *out,
                        device_tensor *lse, device_tensor *dout, device_tensor *dq,
                        device_tensor *dk, device_tensor *dv);

#endif /* ATTN_TOOLS_RUN_H */
