/*
 * A progress line on stderr, shared by the reference check of attn run and
 * the sweep of attn bench. On a terminal it is one line rewritten in place
 * and cleared at the end, so that it never stays beside the results; in a
 * log (not a terminal) a line is written whole, for the callers that want
 * one there.
 */
#define _POSIX_C_SOURCE 200809L /* isatty */

#include "run.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

void run_progress_start(run_progress *pg) {
  pg->t0 = run_now_s();
  pg->tty = isatty(STDERR_FILENO);
  pg->shown = 0;
}

void run_progress_show(run_progress *pg, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* Clearing to the end of the line: a shorter message leaves nothing of
   * a longer one before it. */
  if (pg->tty)
    fprintf(stderr, "\r%s: %s\033[K", cli_prog, msg);
  else
    fprintf(stderr, "%s: %s\n", cli_prog, msg);
  fflush(stderr);
  pg->shown = 1;
}

void run_progress_clear(run_progress *pg) {
  if (pg->tty && pg->shown) {
    fputs("\r\033[K", stderr);
    fflush(stderr);
  }
  pg->shown = 0;
}
