/*
 * The attn program: the command table, the usage, and how every command
 * reports a failure (one line on stderr, an exit status). The commands are
 * in cmd_*.c.
 */
#include "cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *cli_prog = "attn";

/* Prints "attn: <message>" on one line of stderr, whatever the message holds
 * (a path or a driver's log may carry newlines or escapes), and returns
 * EXIT_USAGE. */
int cli_complain(const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  for (char *c = msg; *c; c++)
    if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
  fprintf(stderr, "%s: %s\n", cli_prog, msg);
  return EXIT_USAGE;
}

static int usage_main(FILE *f) {
  fprintf(f,
          "usage: attn <command> [options]\n"
          "\n"
          "commands:\n"
          "  info     backends and devices present, and what ATTN_BACKEND selects\n"
          "  run      a random attention problem on the selected backend: time, GFLOP/s, error\n"
          "  vit      the ViT-B/16 self-attention of a 224x224 image (197 tokens, 12 heads of 64)\n"
          "  check    run golden case folders and compare with the tolerance rule\n"
          "\n"
          "Each command takes --help. The backend comes from --backend SPEC or ATTN_BACKEND\n"
          "(auto, cpu, opencl, cuda, optionally :N for a device index).\n"
          "Exit status: 0 done, 1 a failure while running (device, memory, a case out of\n"
          "tolerance), 2 a wrong command, option, value or input file.\n");
  return f == stdout ? 0 : EXIT_USAGE;
}

/* A library failure: statuses about what was asked for (a shape, a value, a
 * backend name or one that is absent, an unsupported combination) are usage
 * errors; the rest happened while running. */
int cli_fail_ctx(attn_context *ctx, int rc, const char *what) {
  cli_complain("%s: %s (%s)", what, attn_errmsg(ctx), attn_status_name(rc));
  switch (rc) {
    case ATTN_ENOMEM:
    case ATTN_EDEVICE:
    case ATTN_EBUILD:
    case ATTN_EBUFFER:
    case ATTN_EINTERNAL:
      return EXIT_FAILED;
    default:
      return EXIT_USAGE;
  }
}

int cli_out_of_host_memory(void) {
  fprintf(stderr, "%s: out of host memory\n", cli_prog);
  return EXIT_FAILED;
}

int main(int argc, char **argv) {
  if (argc < 2) return cli_complain("give a command: info, run, vit or check (see attn --help)");
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help"))
    return usage_main(stdout);
  if (!strcmp(cmd, "--version")) return printf("attn %s\n", ATTN_VERSION_STRING), 0;
  static const struct {
    const char *name, *prog;
    int (*fn)(int, char **);
  } cmds[] = {{"info", "attn info", cmd_info},
              {"run", "attn run", cmd_run},
              {"vit", "attn vit", cmd_vit},
              {"check", "attn check", cmd_check}};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(cmd, cmds[i].name)) {
      cli_prog = cmds[i].prog;
      return cmds[i].fn(argc - 1, argv + 1);
    }
  return cli_complain("unknown command \"%s\" (commands: info, run, vit, check; see attn --help)",
                      cmd);
}
