/*
 * fuzz_backend: the backend specification, given to attn_context_create
 * directly and through ATTN_BACKEND (with a NULL and an empty spec).
 *
 * The input is the specification; a NUL ends it early, as it would a C
 * string. The fuzz build has the CPU backend only (fuzz/run.sh), so the
 * expected outcome is known exactly and checked against an independent
 * reading of the grammar in attn.h: "auto" or "cpu", optionally ":N", with N
 * decimal digits; device 0 exists, any other N is ATTN_EUNAVAILABLE, an N
 * above 1000000 or malformed is ATTN_EBACKEND, as is any other name; "opencl"
 * and "cuda" are ATTN_EUNAVAILABLE (not built) when well formed.
 */
#define _XOPEN_SOURCE 700 /* putenv */

#include "attn.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The status the specification must give, read independently. */
static int expected(const char *spec) {
  const char *colon = strchr(spec, ':');
  size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
  static const char *const names[] = {"auto", "cpu", "opencl", "cuda"};
  int found = -1;
  for (int i = 0; i < 4; i++)
    if (strlen(names[i]) == len && memcmp(spec, names[i], len) == 0) found = i;
  if (found < 0) return ATTN_EBACKEND;
  uint64_t index = 0;
  if (colon) {
    const char *d = colon + 1;
    if (!*d) return ATTN_EBACKEND;
    for (; *d; d++) {
      if (*d < '0' || *d > '9') return ATTN_EBACKEND;
      index = index * 10 + (uint64_t)(*d - '0');
      if (index > 1000000) return ATTN_EBACKEND;
    }
  }
  if (found >= 2) return ATTN_EUNAVAILABLE;
  return index == 0 ? ATTN_OK : ATTN_EUNAVAILABLE;
}

static void try_spec(const char *spec, const char *shown, int want) {
  attn_context *ctx = NULL;
  int rc = attn_context_create(spec, &ctx);
  const char *msg = attn_errmsg(ctx);
  int bad = !ctx || rc != want || (rc == ATTN_OK) != (msg[0] == '\0') ||
            (rc == ATTN_OK && attn_context_backend(ctx) != ATTN_BACKEND_CPU);
  if (bad) {
    fprintf(stderr, "fuzz_backend: \"%s\" gave %s (\"%s\"), expected %s\n", shown,
            attn_status_name(rc), msg, attn_status_name(want));
    abort();
  }
  attn_context_free(ctx);
}

/* ATTN_BACKEND lives in this buffer, given to putenv once: setenv would
 * keep every value it replaces (glibc never frees them), and the process
 * would grow by each input. */
#define ENV_NAME "ATTN_BACKEND="
static char env[1 << 20]; /* specs longer than this (-max_len) skip the variable */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  memcpy(env, ENV_NAME, sizeof ENV_NAME);
  if (putenv(env) != 0) abort();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *spec = malloc(size + 1);
  if (!spec) abort();
  memcpy(spec, data, size);
  spec[size] = '\0';
  /* An empty specification means ATTN_BACKEND, unset here: "auto". */
  int want = spec[0] ? expected(spec) : ATTN_OK;
  try_spec(spec, spec, want);
  if (size < sizeof env - sizeof ENV_NAME) {
    memcpy(env + sizeof ENV_NAME - 1, spec, size + 1);
    try_spec(NULL, spec, want);
    try_spec("", spec, want);
    env[sizeof ENV_NAME - 1] = '\0';
  }
  free(spec);
  return 0;
}
