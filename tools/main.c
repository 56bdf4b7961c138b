/*
 * The attn program: the command table, the usage, how every command
 * reports a failure (one line on stderr, an exit status), and the memory
 * there is. The commands are in cmd_*.c.
 */
#define _POSIX_C_SOURCE 200809L /* sysconf */

#include "cli.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

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
          "  info       backends and devices present, and what ATTN_BACKEND selects\n"
          "  run        a random attention problem on the selected backend: time, rates, error\n"
          "  bench      a sweep of problems over backends, dtypes, head dims, masks, lengths and\n"
          "             passes, timed as run times one: a table, JSON lines or CSV\n"
          "  vit        ViT-B/16 self-attention of a 224x224 image (197 tokens, 12 heads of 64)\n"
          "  check      run golden case folders and compare with the tolerance rule\n"
          "  bandwidth  the device's memory read rate, the ceiling of attn run's GB/s\n"
          "  tune       measure the device's kernel configurations and keep the fastest\n"
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

/* Bytes this process may still allocate: the kernel's estimate of available
 * memory (MemAvailable), else the physical memory, capped by an address-space
 * limit. Only a bound for refusing absurd problems before allocating. */
double cli_memory_available(void) {
  double avail = INFINITY;
  FILE *f = fopen("/proc/meminfo", "r");
  if (f) {
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = (double)kb * 1024.0;
    fclose(f);
  }
  if (isinf(avail)) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) avail = (double)pages * (double)page;
  }
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (double)rl.rlim_cur < avail)
    avail = (double)rl.rlim_cur;
  return avail;
}

const char *cli_human_bytes(double bytes, char *buf, size_t len) {
  static const char *const unit[] = {"bytes", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
  int u = 0;
  while (bytes >= 1000 && u < 8) {
    bytes /= 1000;
    u++;
  }
  snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
  return buf;
}

int main(int argc, char **argv) {
  if (argc < 2)
    return cli_complain(
        "give a command: info, run, bench, vit, check, bandwidth or tune (see attn --help)");
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help"))
    return usage_main(stdout);
  if (!strcmp(cmd, "--version")) return printf("attn %s\n", ATTN_VERSION_STRING), 0;
  static const struct {
    const char *name, *prog;
    int (*fn)(int, char **);
  } cmds[] = {
      {"info", "attn info", cmd_info},    {"run", "attn run", cmd_run},
      {"bench", "attn bench", cmd_bench}, {"vit", "attn vit", cmd_vit},
      {"check", "attn check", cmd_check}, {"bandwidth", "attn bandwidth", cmd_bandwidth},
      {"tune", "attn tune", cmd_tune},
  };
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(cmd, cmds[i].name)) {
      cli_prog = cmds[i].prog;
      return cmds[i].fn(argc - 1, argv + 1);
    }
  return cli_complain(
      "unknown command \"%s\" (commands: info, run, bench, vit, check, bandwidth, tune; see attn "
      "--help)",
      cmd);
}
