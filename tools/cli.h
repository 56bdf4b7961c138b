/*
 * What the attn program's files share: how a command reports a failure, and
 * the commands main() dispatches to. Private to tools/.
 */
#ifndef ATTN_TOOLS_CLI_H
#define ATTN_TOOLS_CLI_H

#include "attn.h"

#include <stddef.h>

/* Exit statuses: 1 when something failed while running (a device, memory, a
 * case outside its tolerance), 2 when what was asked for is wrong (usage, a
 * value, a damaged input file) and running again unchanged cannot help. */
enum { EXIT_FAILED = 1, EXIT_USAGE = 2 };

/* The prefix of every message: "attn", or "attn run" once a command runs. */
extern const char *cli_prog;

/* Prints "<cli_prog>: <message>" on one line of stderr and returns EXIT_USAGE. */
int cli_complain(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
/* Says what failed with the library's message; returns the exit status. */
int cli_fail_ctx(attn_context *ctx, int rc, const char *what);
/* Says so; returns EXIT_FAILED. */
int cli_out_of_host_memory(void);

/* The number parser of every integer option: the whole of s, base 10, within
 * [lo, hi]; otherwise a sentence naming the option and the value on stderr,
 * and -1. run_options.c */
int cli_parse_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
/* A dtype's name (f32, f16, bf16) the same way; run_options.c. */
int cli_parse_dtype(const char *opt, const char *s, attn_dtype *out);

/* Bytes this process may still allocate (MemAvailable, else the physical
 * memory, capped by an address-space limit): a bound for refusing absurd
 * sizes before allocating. main.c */
double cli_memory_available(void);
/* "1.5 GB": bytes in decimal units, written into buf. */
const char *cli_human_bytes(double bytes, char *buf, size_t len);

/* The commands: argv[0] is the command's name; each returns the exit status. */
int cmd_info(int argc, char **argv);      /* cmd_info.c */
int cmd_run(int argc, char **argv);       /* cmd_run.c */
int cmd_bench(int argc, char **argv);     /* cmd_bench.c */
int cmd_vit(int argc, char **argv);       /* cmd_run.c */
int cmd_check(int argc, char **argv);     /* cmd_check.c */
int cmd_bandwidth(int argc, char **argv); /* cmd_bandwidth.c */
int cmd_tune(int argc, char **argv);      /* cmd_tune.c */

#endif /* ATTN_TOOLS_CLI_H */
