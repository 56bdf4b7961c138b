/*
 * fuzz_golden: the test kit's golden-case reader (testkit/golden.c) with its
 * JSON and .npy readers (json.c, npy.c), through at_golden_load on a case
 * folder written from the input.
 *
 * The input is the folder's files joined by the separator "@@@@\n", in the
 * order of FILES below: case.json, then q.npy, k.npy and so on. A file past
 * the last part is absent (as do.npy .. dv.npy may be); an empty part is an
 * empty file. The seeds in fuzz/corpus/fuzz_golden are real small cases in
 * this form, and fuzz/golden.dict gives the fuzzer the formats' words.
 *
 * Going through files rather than calling the readers on memory tests what
 * `attn check` runs: the file reading, and the cross-checks of case.json
 * against every .npy header. The folder lives in
 * /dev/shm where there is one, so it costs no disk writes.
 *
 * Invariants: at_golden_load returns 0, or -1 with a sentence; never a
 * crash, a sanitizer report, a hang or a large allocation (libFuzzer's
 * -rss_limit_mb and -malloc_limit_mb catch those). A case that loads has
 * every array it promises.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */

#include "golden.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const FILES[] = {"case.json", "q.npy",  "k.npy",  "v.npy",  "o.npy",
                                    "lse.npy",   "do.npy", "dq.npy", "dk.npy", "dv.npy"};
#define NFILES (sizeof FILES / sizeof FILES[0])
#define SEP "@@@@\n"

static char dir[256];

static void remove_dir(void) {
  char path[512];
  for (size_t i = 0; i < NFILES; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, FILES[i]);
    unlink(path);
  }
  rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/fuzz_golden.XXXXXX", base ? base : "/tmp");
  if (!mkdtemp(dir)) {
    perror("fuzz_golden: mkdtemp");
    abort();
  }
  atexit(remove_dir);
  return 0;
}

static void write_part(const char *name, const uint8_t *p, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
    perror("fuzz_golden: writing the case");
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const size_t seplen = strlen(SEP);
  size_t start = 0, part = 0;
  while (part < NFILES) {
    size_t end = start;
    while (end + seplen <= size && memcmp(data + end, SEP, seplen) != 0)
      end++;
    if (end + seplen > size) end = size;
    write_part(FILES[part++], data + start, end - start);
    if (end == size) break;
    start = end + seplen;
  }
  char path[512];
  for (size_t i = part; i < NFILES; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, FILES[i]);
    unlink(path);
  }

  at_golden g;
  char err[512] = "";
  int rc = at_golden_load(dir, &g, err, sizeof err);
  if (rc != 0 && rc != -1) {
    fprintf(stderr, "fuzz_golden: at_golden_load returned %d\n", rc);
    abort();
  }
  if (rc == -1 && err[0] == '\0') {
    fprintf(stderr, "fuzz_golden: a refused case with no message\n");
    abort();
  }
  if (rc == 0) {
    if (!g.q || !g.k || !g.v || !g.o || !g.lse) {
      fprintf(stderr, "fuzz_golden: a loaded case lacks an input or a reference\n");
      abort();
    }
    at_golden_free(&g);
  }
  return 0;
}
