/*
 * The attn program on bad input: every wrong command, option, value, folder
 * or damaged golden file gives one line on stderr and exit status 2, prints
 * nothing on stdout, and returns at once (no crash, no hang, no attempt at a
 * huge allocation). And `attn run` shows the reference's progress on stderr
 * when it takes more than a second, and only then; runs each inference
 * option (KV cache, pages, appending, bias, sinks, splits) to its check; exits
 * 1 on a result outside the tolerance; `attn bandwidth` reports a rate; and
 * `attn bench` writes a row per problem and pass as JSON lines (every field,
 * the FLOPs of the mask), CSV (a header) or a table, its progress on a
 * terminal alone, and a row it cannot run as an error row with exit 1.
 * The program runs in a child process (posix_spawn) with the CPU backend;
 * backend-independent ("common" tests only).
 */
#define _XOPEN_SOURCE 700 /* mkdtemp, posix_openpt */

#include "golden.h"
#include "json.h"
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* Bad input is refused before any work: a second is plenty, and the bound
 * stays generous for the sanitizer build on a busy machine. */
#define QUICK_S 30.0
/* The slow-reference run: about 2 s of reference here, more under ASan. */
#define SLOW_S 240.0

enum { OUT_CAP = 1 << 16 };

typedef struct outcome {
  int status; /* exit status, 128 + signal, or -1 when it ran past its time */
  double seconds;
  char out[OUT_CAP], err[OUT_CAP]; /* what it printed (the middle dropped past OUT_CAP) */
} outcome;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Past the capacity the middle goes: the tests look at how output starts and
 * how it ends. */
static void append(char *buf, size_t *len, const char *data, size_t n) {
  const size_t cap = OUT_CAP - 1, head = OUT_CAP / 4;
  if (n > cap - head) {
    data += n - (cap - head);
    n = cap - head;
  }
  if (*len + n > cap) {
    size_t drop = *len + n - cap;
    memmove(buf + head, buf + head + drop, *len - head - drop);
    *len -= drop;
  }
  memcpy(buf + *len, data, n);
  *len += n;
  buf[*len] = 0;
}

/* Runs `attn ARGS...` (args ends with NULL) with ATTN_BACKEND=cpu, stdout and
 * stderr captured; stderr goes to a terminal (a pseudo-terminal) when tty is
 * set. Killed after limit_s. */
static void run_attn_on(outcome *r, double limit_s, int tty, const char *const *args) {
  const char *argv[32] = {ATTN_PROGRAM};
  int argc = 1;
  for (; args[argc - 1]; argc++) {
    assert_true(argc < 31);
    argv[argc] = args[argc - 1];
  }
  argv[argc] = NULL;
  at_env_set("ATTN_BACKEND", "cpu");

  int po[2], pe[2] = {-1, -1}, slave = -1;
  assert_int_equal(pipe(po), 0);
  if (tty) {
    pe[0] = posix_openpt(O_RDWR | O_NOCTTY);
    assert_true(pe[0] >= 0);
    assert_int_equal(grantpt(pe[0]), 0);
    assert_int_equal(unlockpt(pe[0]), 0);
    slave = open(ptsname(pe[0]), O_RDWR | O_NOCTTY);
    assert_true(slave >= 0);
  } else {
    assert_int_equal(pipe(pe), 0);
    slave = pe[1];
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, po[1], 1);
  posix_spawn_file_actions_adddup2(&fa, slave, 2);
  posix_spawn_file_actions_addclose(&fa, po[0]);
  posix_spawn_file_actions_addclose(&fa, pe[0]);
  pid_t pid;
  fflush(NULL);
  double t0 = now_s();
  int rc = posix_spawn(&pid, ATTN_PROGRAM, &fa, NULL, (char *const *)argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(po[1]);
  close(slave);
  assert_int_equal(rc, 0);

  size_t nout = 0, nerr = 0;
  r->out[0] = r->err[0] = 0;
  struct pollfd pf[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
  int open_fds = 2, killed = 0;
  while (open_fds > 0) {
    double left = limit_s - (now_s() - t0);
    if (left <= 0) {
      kill(pid, SIGKILL);
      killed = 1;
      break;
    }
    int n = poll(pf, 2, (int)(left * 1000) + 1);
    if (n < 0 && errno == EINTR) continue;
    assert_true(n >= 0);
    for (int i = 0; i < 2; i++) {
      if (pf[i].fd < 0 || !pf[i].revents) continue;
      char buf[4096];
      ssize_t got = read(pf[i].fd, buf, sizeof buf);
      if (got > 0) {
        append(i ? r->err : r->out, i ? &nerr : &nout, buf, (size_t)got);
      } else if (got == 0 || errno != EINTR) {
        /* EOF, or EIO from a terminal whose last writer closed it. */
        close(pf[i].fd);
        pf[i].fd = -1;
        open_fds--;
      }
    }
  }
  for (int i = 0; i < 2; i++)
    if (pf[i].fd >= 0) close(pf[i].fd);
  int ws;
  while (waitpid(pid, &ws, 0) < 0)
    assert_int_equal(errno, EINTR);
  r->seconds = now_s() - t0;
  r->status = killed ? -1 : WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

#define RUN(r, limit, tty, ...)                      \
  do {                                               \
    const char *const args_[] = {__VA_ARGS__, NULL}; \
    run_attn_on((r), (limit), (tty), args_);         \
  } while (0)

static int count_char(const char *s, char c) {
  int n = 0;
  for (; *s; s++)
    n += *s == c;
  return n;
}

/* The contract for bad input: status 2 in time, one line on stderr naming
 * what was wrong (mention), nothing on stdout. */
static void assert_refused(const outcome *r, const char *what, const char *mention) {
  if (r->status != 2 || count_char(r->err, '\n') != 1 || r->err[strlen(r->err) - 1] != '\n' ||
      strchr(r->err, '\r') || r->out[0] || strncmp(r->err, "attn", 4) != 0 ||
      (mention && !strstr(r->err, mention)))
    fail_msg(
        "attn %s: status %d after %.1f s (want 2), stderr \"%s\" (want one line naming "
        "\"%s\"), stdout \"%s\" (want nothing)",
        what, r->status, r->seconds, r->err, mention ? mention : "", r->out);
}

typedef struct bad_call {
  const char *args[8];
  const char *mention; /* what the error line must name */
} bad_call;

static void check_table(const bad_call *t, size_t n) {
  outcome *r = at_malloc(sizeof *r);
  for (size_t i = 0; i < n; i++) {
    char what[512] = "";
    for (int a = 0; t[i].args[a]; a++) {
      size_t len = strlen(what);
      snprintf(what + len, sizeof what - len, "%s\"%s\"", a ? " " : "", t[i].args[a]);
    }
    run_attn_on(r, QUICK_S, 0, t[i].args);
    assert_refused(r, what, t[i].mention);
  }
  at_free(r);
}

static void absurd_sizes_are_refused_before_allocating(at_backend *b) {
  (void)b;
  static const bad_call t[] = {
      {{"run", "--seqlen", "-1"}, "-1"},
      {{"run", "--seqlen", "0"}, "--seqlen 0"},
      {{"run", "--seqlen", "99999999999"}, "would need"},
      {{"run", "--seqlen", "4611686018427387904"}, "would need"},
      {{"run", "--seqlen", "99999999999999999999"}, "64 bits"},
      {{"run", "--seqlen-q", "3", "--seqlen-k", "9223372036854775807"}, "would need"},
      {{"run", "--batch", "1000000", "--seqlen", "100000"}, "--batch 1000000 --seqlen 100000"},
      {{"run", "--heads", "9223372036854775807", "--heads-kv", "1"}, "would need"},
      {{"vit", "--batch", "100000000000"}, "would need"},
      {{"run", "--dim", "0"}, "--dim 0"},
      {{"run", "--dim", "257"}, "--dim 257"},
      {{"run", "--heads", "3", "--heads-kv", "2"}, "--heads-kv 2"},
      {{"run", "--heads", "2", "--heads-kv", "4"}, "--heads-kv 4"},
      {{"run", "--repeat", "2147483648"}, "2147483648"},
      {{"run", "--repeat", "-1"}, "--repeat -1"},
      {{"run", "--repeat", "0"}, "--repeat 0"},
      {{"run", "--seed", "-1"}, "--seed"},
      {{"run", "--seed", "18446744073709551616"}, "18446744073709551616"},
      {{"run", "--window", "-2,0"}, "-2"},
      {{"run", "--softcap", "1e39"}, "1e39"},
      {{"run", "--softcap", "1e-50"}, "1e-50"},
      {{"run", "--scale", "-1"}, "--scale -1"},
      {{"run", "--page-size", "0"}, "--page-size 0"},
      {{"run", "--page-size", "2147483648"}, "2147483648"},
      {{"run", "--cache-extra", "-1"}, "--cache-extra -1"},
      {{"run", "--cache-extra", "2147483647", "--seqlen", "2"}, "2^31-1"},
      {{"run", "--seqlen-k", "3000000000", "--append", "--seqlen-q", "1"}, "2^31-1"},
      {{"run", "--page-size", "1", "--batch", "3000", "--seqlen", "1000000"}, "2^31-1"},
      {{"run", "--cache-extra", "2000000000", "--seqlen", "8"}, "would need"},
      {{"run", "--splits", "0"}, "--splits 0"},
      {{"run", "--splits", "-2"}, "--splits -2"},
      {{"bandwidth", "--size", "0"}, "--size 0"},
      {{"bandwidth", "--size", "99999999999"}, "--size 99999999999"},
      {{"bandwidth", "--repeat", "0"}, "--repeat 0"},
      {{"bench", "--seqlens", "0"}, "--seqlens 0"},
      {{"bench", "--seqlens", "99999999999"}, "99999999999"},
      {{"bench", "--dims", "257"}, "--dims 257"},
      {{"bench", "--repeat", "0"}, "--repeat 0"},
      {{"bench", "--budget", "-1"}, "--budget"},
      {{"bench", "--heads", "12", "--heads-kv", "5"}, "--heads-kv 5"},
      {{"bench", "--hidden", "256", "--dims", "64,128", "--heads-kv", "4"}, "head dim 128"},
  };
  check_table(t, sizeof t / sizeof t[0]);
}

static void malformed_values_are_refused(at_backend *b) {
  (void)b;
  static const bad_call t[] = {
      {{"run", "--seqlen", "abc"}, "abc"},
      {{"run", "--seqlen", "12abc"}, "12abc"},
      {{"run", "--seqlen", ""}, "--seqlen"},
      {{"run", "--seqlen", " 12"}, "--seqlen"},
      {{"run", "--seqlen", "0x10"}, "0x10"},
      {{"run", "--dim", "6.5"}, "6.5"},
      {{"run", "--seed", "1e3"}, "1e3"},
      {{"run", "--repeat", "+"}, "--repeat"},
      {{"run", "--window", "128"}, "128"},
      {{"run", "--window", "1,x"}, "--window R"},
      {{"run", "--window", ",0"}, "--window L"},
      {{"run", "--scale", "nan"}, "nan"},
      {{"run", "--softcap", "inf"}, "inf"},
      {{"run", "--scale", "0.1x"}, "0.1x"},
      {{"run", "--dtype", "f64"}, "f64"},
      {{"run", "--dtype", ""}, "--dtype"},
      {{"run", "--backend", ""}, "--backend"},
      {{"run", "--backend", "nonsense"}, "nonsense"},
      {{"vit", "--batch", "-3"}, "--batch -3"},
      {{"run", "--bias", "bogus"}, "bogus"},
      {{"run", "--splits", "x"}, "\"x\""},
      {{"run", "--splits", "2.5"}, "2.5"},
      {{"run", "--page-size", "1x"}, "1x"},
      {{"bandwidth", "--size", "1e3"}, "1e3"},
      {{"bandwidth", "--backend", "nonsense"}, "nonsense"},
      {{"bench", "--seqlens", "12,x"}, "\"x\""},
      {{"bench", "--seqlens", "64,,128"}, "empty"},
      {{"bench", "--seqlens", "64,"}, "empty"},
      {{"bench", "--dtypes", "f32,f64"}, "f64"},
      {{"bench", "--masks", "none,sideways"}, "sideways"},
      {{"bench", "--masks", "window:x"}, "window:L"},
      {{"bench", "--passes", "fwd,sideways"}, "sideways"},
      {{"bench", "--format", "xml"}, "xml"},
      {{"bench", "--budget", "nan"}, "nan"},
      {{"bench", "--backends", "cpu,nonsense"}, "nonsense"},
      {{"bench", "--backends", ""}, "--backends"},
      {{"bench", "--output", "/nonexistent/attn-bench/rows.json"}, "/nonexistent/attn-bench"},
  };
  check_table(t, sizeof t / sizeof t[0]);
}

static void missing_option_values_are_refused(at_backend *b) {
  (void)b;
  static const bad_call t[] = {
      {{"run", "--seqlen"}, "--seqlen"},         {{"run", "--dim"}, "--dim"},
      {{"run", "--repeat"}, "--repeat"},         {{"run", "--seed"}, "--seed"},
      {{"run", "--window"}, "--window"},         {{"run", "--scale"}, "--scale"},
      {{"run", "--dtype"}, "--dtype"},           {{"run", "--backend"}, "--backend"},
      {{"vit", "--batch"}, "--batch"},           {{"check", "--backend"}, "--backend"},
      {{"run", "--page-size"}, "--page-size"},   {{"run", "--cache-extra"}, "--cache-extra"},
      {{"run", "--splits"}, "--splits"},         {{"bandwidth", "--size"}, "--size"},
      {{"bandwidth", "--backend"}, "--backend"}, {{"bench", "--seqlens"}, "--seqlens"},
      {{"bench", "--format"}, "--format"},       {{"bench", "--output"}, "--output"},
      {{"bench", "--budget"}, "--budget"},       {{"bench", "--backends"}, "--backends"},
  };
  check_table(t, sizeof t / sizeof t[0]);
}

static void unknown_commands_and_flags_are_refused(at_backend *b) {
  (void)b;
  static const bad_call t[] = {
      {{NULL}, "command"},
      {{"bogus"}, "bogus"},
      {{""}, "command"},
      {{"run", "--bogus"}, "--bogus"},
      {{"run", "--kv-heads", "2"}, "--kv-heads"},
      {{"run", ""}, "\"\""},
      {{"vit", "--seqlen", "5"}, "--seqlen"},
      {{"info", "--bogus"}, "--bogus"},
      {{"check", "--bogus"}, "--bogus"},
      {{"bandwidth", "--bogus"}, "--bogus"},
      {{"bench", "--bogus"}, "--bogus"},
      {{"bench", "--causal"}, "--causal"},
      {{"vit", "--bias"}, "--bias"},
      {{"vit", "--page-size", "16"}, "--page-size"},
  };
  check_table(t, sizeof t / sizeof t[0]);
}

/* The options that cannot go together, each refused naming the clash. */
static void clashing_inference_options_are_refused(at_backend *b) {
  (void)b;
  static const bad_call t[] = {
      {{"run", "--page-size", "16", "--backward"}, "--backward"},
      {{"run", "--cache-extra", "0", "--backward"}, "--backward"},
      {{"run", "--append", "--backward"}, "--backward"},
      {{"run", "--append", "--seqlen-q", "5", "--seqlen-k", "4"}, "--append"},
      {{"bench", "--seqlen-k", "64", "--passes", "bwd"}, "--passes"},
  };
  check_table(t, sizeof t / sizeof t[0]);
}

/* ---------------------------------------------------------------------- */
/* Damaged golden folders                                                   */
/* ---------------------------------------------------------------------- */

/* Copies every file of case folder src into a new folder dst (writable,
 * whatever the source's permissions). */
static void copy_folder(const char *src, const char *dst) {
  assert_int_equal(mkdir(dst, 0755), 0);
  DIR *d = opendir(src);
  assert_non_null(d);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char from[4096], to[4096];
    snprintf(from, sizeof from, "%s/%s", src, e->d_name);
    snprintf(to, sizeof to, "%s/%s", dst, e->d_name);
    size_t len;
    unsigned char *data = at_read_file(from, &len);
    assert_non_null(data);
    at_write_file(to, data, len);
    at_free(data);
  }
  closedir(d);
}

/* A small valid case to damage: the golden folder's "tiny", else its first. */
static void source_case(char *out, size_t len) {
  snprintf(out, len, "%s/tiny", at_golden_dir());
  char probe[4200];
  snprintf(probe, sizeof probe, "%s/case.json", out);
  if (access(probe, R_OK) == 0) return;
  char err[512], **dirs = NULL;
  int n = at_golden_list(at_golden_dir(), &dirs, err, sizeof err);
  if (n <= 0) {
    at_golden_list_free(dirs, n > 0 ? n : 0);
    at_skip("no golden case in %s", at_golden_dir());
  }
  snprintf(out, len, "%s", dirs[0]);
  at_golden_list_free(dirs, n);
}

/* The same .npy with its first shape entry one larger, data unchanged. */
static void grow_first_dim(const char *path) {
  size_t len;
  unsigned char *buf = at_read_file(path, &len);
  assert_true(len > 10 && buf[6] == 1);
  size_t hlen = (size_t)buf[8] | (size_t)buf[9] << 8;
  char header[4096];
  assert_true(hlen < sizeof header - 16 && 10 + hlen <= len);
  memcpy(header, buf + 10, hlen);
  header[hlen] = 0;
  char *shape = strstr(header, "'shape': (");
  assert_non_null(shape);
  char *num = shape + strlen("'shape': (");
  char *end;
  long first = strtol(num, &end, 10);
  char rebuilt[4096];
  int n =
      snprintf(rebuilt, sizeof rebuilt, "%.*s%ld%s", (int)(num - header), header, first + 1, end);
  while (n > 0 && (rebuilt[n - 1] == '\n' || rebuilt[n - 1] == ' '))
    n--;
  /* Pad with spaces to a multiple of 64 bytes, newline last, as numpy does. */
  while ((10 + n + 1) % 64)
    rebuilt[n++] = ' ';
  rebuilt[n++] = '\n';
  unsigned char *out = at_malloc(10 + (size_t)n + (len - 10 - hlen));
  memcpy(out, buf, 8);
  out[8] = (unsigned char)(n & 0xff);
  out[9] = (unsigned char)(n >> 8);
  memcpy(out + 10, rebuilt, (size_t)n);
  memcpy(out + 10 + n, buf + 10 + hlen, len - 10 - hlen);
  at_write_file(path, out, 10 + (size_t)n + (len - 10 - hlen));
  at_free(out);
  at_free(buf);
}

static void truncate_file(const char *path, size_t keep) {
  size_t len;
  unsigned char *buf = at_read_file(path, &len);
  assert_true(keep < len);
  at_write_file(path, buf, keep);
  at_free(buf);
}

/* Each damage: a folder name, the file it names, and how to make it. */
enum {
  D_JSON_CUT,
  D_JSON_GARBAGE,
  D_NPY_HEADER_CUT,
  D_NPY_DATA_CUT,
  D_NPY_SHAPE,
  D_MISSING,
  D_FIFO,
  D_DIR,
  D_COUNT
};
static const struct {
  const char *name, *file;
} damages[D_COUNT] = {
    [D_JSON_CUT] = {"json_cut", "case.json"},
    [D_JSON_GARBAGE] = {"json_garbage", "case.json"},
    [D_NPY_HEADER_CUT] = {"npy_header_cut", "q.npy"},
    [D_NPY_DATA_CUT] = {"npy_data_cut", "k.npy"},
    [D_NPY_SHAPE] = {"npy_shape", "q.npy"},
    [D_MISSING] = {"missing", "v.npy"},
    [D_FIFO] = {"fifo", "o.npy"},
    [D_DIR] = {"dir", "lse.npy"},
};

/* root/good, a copy of a valid case, and root/<damage> for each damage. */
static void make_damaged(char *root, size_t len) {
  char src[4096], dir[4200], path[4400];
  source_case(src, sizeof src);
  snprintf(root, len, "/tmp/attn-cli-XXXXXX");
  assert_non_null(mkdtemp(root));
  snprintf(dir, sizeof dir, "%s/good", root);
  copy_folder(src, dir);
  for (int d = 0; d < D_COUNT; d++) {
    snprintf(dir, sizeof dir, "%s/%s", root, damages[d].name);
    copy_folder(src, dir);
    snprintf(path, sizeof path, "%s/%s", dir, damages[d].file);
    size_t n;
    switch (d) {
      case D_JSON_CUT:
        at_free(at_read_file(path, &n));
        truncate_file(path, n / 2);
        break;
      case D_JSON_GARBAGE:
        at_write_file(path, "{\"layout\": \"bshd\", \x01\x02 ]]", 25);
        break;
      case D_NPY_HEADER_CUT:
        truncate_file(path, 40);
        break;
      case D_NPY_DATA_CUT:
        at_free(at_read_file(path, &n));
        truncate_file(path, n - 4);
        break;
      case D_NPY_SHAPE:
        grow_first_dim(path);
        break;
      case D_MISSING:
        assert_int_equal(unlink(path), 0);
        break;
      case D_FIFO:
        assert_int_equal(unlink(path), 0);
        assert_int_equal(mkfifo(path, 0644), 0);
        break;
      case D_DIR:
        assert_int_equal(unlink(path), 0);
        assert_int_equal(mkdir(path, 0755), 0);
        break;
    }
  }
}

static void remove_tree(const char *path) {
  DIR *d = opendir(path);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      char sub[4400];
      snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
      remove_tree(sub);
    }
    closedir(d);
    rmdir(path);
  } else {
    unlink(path);
  }
}

static void each_damaged_case_is_refused_naming_its_file(at_backend *b) {
  (void)b;
  char root[64], dir[256];
  make_damaged(root, sizeof root);
  outcome *r = at_malloc(sizeof *r);
  for (int d = 0; d < D_COUNT; d++) {
    snprintf(dir, sizeof dir, "%s/%s", root, damages[d].name);
    RUN(r, QUICK_S, 0, "check", dir);
    char what[300];
    snprintf(what, sizeof what, "check on a case with a damaged %s (%s)", damages[d].file,
             damages[d].name);
    assert_refused(r, what, damages[d].file);
  }
  at_free(r);
  remove_tree(root);
}

static void check_runs_the_good_case_beside_broken_ones(at_backend *b) {
  (void)b;
  char root[64], dir[256];
  make_damaged(root, sizeof root);
  outcome *r = at_malloc(sizeof *r);
  RUN(r, QUICK_S, 0, "check", root);
  assert_int_equal(r->status, 2);
  /* One line per broken case, naming its folder. */
  assert_int_equal(count_char(r->err, '\n'), D_COUNT);
  for (int d = 0; d < D_COUNT; d++) {
    snprintf(dir, sizeof dir, "%s/%s", root, damages[d].name);
    if (!strstr(r->err, dir)) fail_msg("stderr does not name %s:\n%s", dir, r->err);
  }
  /* The good case ran and passed, and the summary counts the others. */
  assert_non_null(strstr(r->out, "\ngood "));
  assert_null(strstr(r->out, "FAIL"));
  char summary[64];
  snprintf(summary, sizeof summary, "1 case, 0 failed, %d could not be read", D_COUNT);
  if (!strstr(r->out, summary)) fail_msg("stdout lacks \"%s\":\n%s", summary, r->out);
  at_free(r);
  remove_tree(root);
}

static void missing_folders_and_files_are_refused(at_backend *b) {
  (void)b;
  char root[64], path[256];
  make_damaged(root, sizeof root);
  outcome *r = at_malloc(sizeof *r);
  snprintf(path, sizeof path, "%s/nowhere", root);
  RUN(r, QUICK_S, 0, "check", path);
  assert_refused(r, "check on a missing folder", path);
  snprintf(path, sizeof path, "%s/good/case.json", root);
  RUN(r, QUICK_S, 0, "check", path);
  assert_refused(r, "check on a file", path);
  snprintf(path, sizeof path, "%s/empty", root);
  assert_int_equal(mkdir(path, 0755), 0);
  RUN(r, QUICK_S, 0, "check", path);
  assert_refused(r, "check on a folder with no case", path);
  RUN(r, QUICK_S, 0, "check", "");
  assert_refused(r, "check on an empty path", NULL);
  at_free(r);
  remove_tree(root);
}

/* ---------------------------------------------------------------------- */
/* What still works                                                         */
/* ---------------------------------------------------------------------- */

/* The "error" lines of a run's stdout: they follow the random inputs. */
static void error_lines(const char *out, char *buf, size_t len) {
  buf[0] = 0;
  for (const char *p = strstr(out, "  error"); p; p = strstr(p + 1, "  error")) {
    size_t l = strcspn(p, "\n"), have = strlen(buf);
    snprintf(buf + have, len - have, "%.*s\n", (int)l, p);
  }
}

static void seeds_use_all_64_bits(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  char one[512], wide[512];
  RUN(r, QUICK_S, 0, "run", "--seqlen", "16", "--heads", "1", "--repeat", "1", "--seed", "1");
  assert_int_equal(r->status, 0);
  error_lines(r->out, one, sizeof one);
  /* 2^32 + 1: the same inputs as seed 1 if the seed were cut to 32 bits. */
  RUN(r, QUICK_S, 0, "run", "--seqlen", "16", "--heads", "1", "--repeat", "1", "--seed",
      "4294967297");
  assert_int_equal(r->status, 0);
  error_lines(r->out, wide, sizeof wide);
  assert_true(one[0]);
  assert_string_not_equal(one, wide);
  RUN(r, QUICK_S, 0, "run", "--seqlen", "16", "--heads", "1", "--repeat", "1", "--seed",
      "18446744073709551615");
  assert_int_equal(r->status, 0);
  at_free(r);
}

/* About 2 s of double-precision reference: the optimized build's reference
 * is some 100 times faster than that of the -O0 sanitizer build. */
#ifdef __OPTIMIZE__
#define SLOW_ARGS "run", "--seqlen", "1024", "--heads", "4", "--repeat", "1", "--check"
#else
#define SLOW_ARGS "run", "--seqlen", "256", "--heads", "2", "--repeat", "1", "--check"
#endif

static void slow_reference_shows_progress_on_stderr(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN(r, SLOW_S, 0, SLOW_ARGS);
  assert_int_equal(r->status, 0);
  /* The results are on stdout as always. */
  assert_non_null(strstr(r->out, "  error     o max|err|"));
  if (r->seconds < 1.5) at_skip("the run took %.1f s: too fast to need progress", r->seconds);
  /* In a log (not a terminal): whole lines, no carriage returns. */
  if (!strstr(r->err, "attn run: reference forward: ") || strchr(r->err, '\r') ||
      !strstr(r->err, "attn run: reference done in "))
    fail_msg("stderr after %.1f s lacks the progress lines:\n%s", r->seconds, r->err);
  at_free(r);
}

static void progress_on_a_terminal_rewrites_one_line(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN(r, SLOW_S, 1, SLOW_ARGS);
  assert_int_equal(r->status, 0);
  if (r->seconds < 1.5) at_skip("the run took %.1f s: too fast to need progress", r->seconds);
  const char *last = strrchr(r->err, '\r');
  if (!strstr(r->err, "\rattn run: reference forward: ") || strchr(r->err, '\n') || !last ||
      strcmp(last, "\r\033[K") != 0)
    fail_msg("stderr on a terminal is not one rewritten line, cleared at the end:\n%s", r->err);
  at_free(r);
}

static void quick_reference_shows_no_progress(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN(r, QUICK_S, 0, "run", "--seqlen", "32", "--heads", "2", "--repeat", "1", "--backward",
      "--check");
  assert_int_equal(r->status, 0);
  assert_non_null(strstr(r->out, "  error     dq"));
  assert_string_equal(r->err, "");
  at_free(r);
}

/* ---------------------------------------------------------------------- */
/* The inference options                                                    */
/* ---------------------------------------------------------------------- */

/* Runs attn run with args (ending with NULL) and --check: status 0, a rate in
 * GB/s beside GFLOP/s, and every check line "ok". A backend that lacks the
 * feature refuses it (ATTN_EUNSUPPORTED, status 2): the test then skips,
 * saying so, until the CPU backend has it. */
/* Whether stderr holds nothing but the reference's progress lines, which a
 * check that takes more than a second prints (a loaded machine). */
static int only_progress(const char *err) {
  for (const char *p = err; *p; p += strcspn(p, "\n") + (p[strcspn(p, "\n")] == '\n')) {
    if (strncmp(p, "attn: reference ", 16) != 0) return 0;
  }
  return 1;
}

static void run_checked(outcome *r, const char *const *args) {
  const char *argv[24];
  int n = 0;
  argv[n++] = "run";
  for (; args[n - 1]; n++) {
    assert_true(n < 20);
    argv[n] = args[n - 1];
  }
  argv[n++] = "--repeat";
  argv[n++] = "2";
  argv[n++] = "--check";
  argv[n] = NULL;
  run_attn_on(r, QUICK_S, 0, argv);
  if (r->status == 2 && strstr(r->err, "ATTN_EUNSUPPORTED"))
    at_skip("the CPU backend does not have this yet: %.*s", (int)strcspn(r->err, "\n"), r->err);
  if (r->status != 0 || !strstr(r->out, " GB/s\n") || !strstr(r->out, "  error     o max|err|") ||
      strstr(r->out, "FAIL") || !only_progress(r->err))
    fail_msg("attn run with an inference option: status %d (want 0), stdout:\n%s\nstderr:\n%s",
             r->status, r->out, r->err);
  for (const char *p = strstr(r->out, "  error"); p; p = strstr(p + 1, "  error")) {
    size_t l = strcspn(p, "\n");
    if (l < 4 || strncmp(p + l - 4, ": ok", 4) != 0)
      fail_msg("a check line does not end in \": ok\": %.*s", (int)l, p);
  }
}

#define RUN_CHECKED(r, ...)                          \
  do {                                               \
    const char *const args_[] = {__VA_ARGS__, NULL}; \
    run_checked((r), args_);                         \
  } while (0)

/* Each string of a NULL-ended list in a run's stdout. */
static void out_has_all(const outcome *r, const char *const *want) {
  for (; *want; want++)
    if (!strstr(r->out, *want)) fail_msg("\"%s\" is not in the output:\n%s", *want, r->out);
}

#define OUT_HAS(r, ...)                              \
  do {                                               \
    const char *const want_[] = {__VA_ARGS__, NULL}; \
    out_has_all((r), want_);                         \
  } while (0)

/* A decoding-like shape: a few query rows over a longer cache, GQA, three
 * sequences (their lengths differ with --cache-extra). */
#define DECODE \
  "--batch", "3", "--seqlen-q", "2", "--seqlen-k", "70", "--heads", "4", "--heads-kv", "2"

static void every_run_prints_gb_per_s_beside_gflop_per_s(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN(r, QUICK_S, 0, "run", "--seqlen", "16", "--heads", "1", "--repeat", "1", "--backward");
  assert_int_equal(r->status, 0);
  if (!strstr(r->out, "GFLOP/s, ") || count_char(r->out, '\n') < 4 ||
      !strstr(r->out, " GB/s\n  backward") || !strstr(r->out, "GB/s\n  error"))
    fail_msg("the forward and backward lines lack GB/s:\n%s", r->out);
  at_free(r);
}

static void a_cache_with_used_lengths_passes_its_check(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN_CHECKED(r, DECODE, "--cache-extra", "9");
  /* The first sequence uses 70 keys, the others between 35 and 70. */
  assert_non_null(strstr(r->out, "  cache     79 rows per sequence, keys used "));
  at_free(r);
}

static void a_paged_cache_passes_its_check(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN_CHECKED(r, DECODE, "--page-size", "16");
  /* 70 keys in pages of 16: 5 pages a sequence, the last in part. */
  assert_non_null(strstr(r->out, "paged: 5 pages of 16 each, 15 in a shuffled block table"));
  RUN_CHECKED(r, DECODE, "--page-size", "7", "--cache-extra", "20", "--causal");
  at_free(r);
}

static void appended_rows_are_checked_in_the_cache(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN_CHECKED(r, DECODE, "--append");
  assert_non_null(strstr(r->out, "  cache     k and v hold the 6 appended rows in place"));
  RUN_CHECKED(r, DECODE, "--append", "--page-size", "4", "--cache-extra", "10", "--causal");
  assert_non_null(strstr(r->out, "  cache     k and v hold the 6 appended rows in place"));
  at_free(r);
}

static void each_bias_form_passes_its_check(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN_CHECKED(r, "--batch", "2", "--seqlen", "40", "--heads", "2", "--bias");
  assert_non_null(strstr(r->out, "bias full [2,2,40,40]"));
  RUN_CHECKED(r, "--batch", "2", "--seqlen", "40", "--heads", "2", "--bias", "heads", "--causal");
  assert_non_null(strstr(r->out, "bias heads [1,2,40,40]"));
  RUN_CHECKED(r, "--batch", "2", "--seqlen", "40", "--heads", "2", "--bias", "keys", "--dtype",
              "bf16");
  assert_non_null(strstr(r->out, "bias keys [2,1,1,40]"));
  /* Over a cache, the bias spans its capacity. */
  RUN_CHECKED(r, DECODE, "--bias", "--cache-extra", "5");
  assert_non_null(strstr(r->out, "bias full [3,4,2,75]"));
  at_free(r);
}

static void sinks_pass_their_check(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN_CHECKED(r, "--seqlen", "40", "--heads", "2", "--sinks", "--causal");
  assert_non_null(strstr(r->out, ", sinks"));
  at_free(r);
}

static void the_backward_checks_dbias_and_dsinks(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN_CHECKED(r, "--seqlen", "30", "--heads", "2", "--bias", "--sinks", "--backward");
  OUT_HAS(r, "  error     dq ", "  error     dbias ", ", dsinks ");
  RUN_CHECKED(r, "--batch", "2", "--seqlen", "30", "--heads", "2", "--bias", "heads", "--backward",
              "--dtype", "f16");
  assert_non_null(strstr(r->out, "  error     dbias "));
  at_free(r);
}

static void key_splits_pass_their_check(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN_CHECKED(r, DECODE, "--splits", "3");
  assert_non_null(strstr(r->out, ", 3 splits"));
  RUN_CHECKED(r, DECODE, "--splits", "1");
  RUN_CHECKED(r, DECODE, "--splits", "auto");
  at_free(r);
}

/* --async: each pass timed over queued calls, which the lines say, and the
 * check after them reads finished results (the append's rows too). */
static void queued_calls_are_timed_and_checked(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN_CHECKED(r, "--seqlen", "30", "--heads", "2", "--bias", "--backward", "--async");
  OUT_HAS(r, "  forward   ", " samples of 16 queued calls, ", "  backward  ");
  RUN_CHECKED(r, DECODE, "--append", "--page-size", "4", "--async", "--splits", "2");
  assert_non_null(strstr(r->out, "  cache     k and v hold the 6 appended rows in place"));
  at_free(r);
}

/* --tf32 (ATTN_ALLOW_TF32): the problem line says so, the check passes, and
 * what rounding to TF32 alone costs is printed beside the error. */
static void a_tf32_run_states_its_own_rounding_beside_the_error(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN_CHECKED(r, "--seqlen", "40", "--heads", "2", "--dim", "64", "--tf32", "--backward");
  assert_non_null(strstr(r->out, "head_dim 64, f32 (TF32 allowed)"));
  assert_non_null(strstr(r->out, "  tf32      rounding to TF32 alone (the reference as TF32): o "));
  at_free(r);
}

/* attn check --tf32: a column of TF32's own rounding, and the summary says
 * TF32 was allowed. */
static void check_with_tf32_prints_its_rounding_column(at_backend *b) {
  (void)b;
  char dir[4200];
  source_case(dir, sizeof dir);
  outcome *r = at_malloc(sizeof *r);
  RUN(r, QUICK_S, 0, "check", "--tf32", "--forward-only", dir);
  if (r->status != 0 || !strstr(r->out, "err/peer         tf32  result") ||
      !strstr(r->out, "(forward, TF32 allowed)") || strstr(r->out, "FAIL"))
    fail_msg("attn check --tf32: status %d (want 0), stdout:\n%s\nstderr:\n%s", r->status, r->out,
             r->err);
  at_free(r);
}

/* A float32 score overflows at scale 3e38, which the library answers with
 * NaN (attn.h) and the double reference does not: the check must fail, say
 * so on stdout and stderr, and exit 1. */
static void a_result_outside_the_tolerance_exits_1(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN(r, QUICK_S, 0, "run", "--seqlen", "16", "--heads", "1", "--repeat", "1", "--scale", "3e38",
      "--check");
  if (r->status != 1 || !strstr(r->out, ": FAIL (o, lse)") ||
      !strstr(r->err, "attn run: o, lse outside the tolerance") || count_char(r->err, '\n') != 1)
    fail_msg("status %d (want 1), stdout:\n%s\nstderr:\n%s", r->status, r->out, r->err);
  at_free(r);
}

static void bandwidth_reports_a_read_rate(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN(r, QUICK_S, 0, "bandwidth", "--size", "64", "--repeat", "3");
  if (r->status != 0 || !strstr(r->out, "  read      ") || !strstr(r->out, " GB/s median of 3 ") ||
      r->err[0])
    fail_msg("status %d, stdout:\n%s\nstderr:\n%s", r->status, r->out, r->err);
  at_free(r);
}

/* ---------------------------------------------------------------------- */
/* attn bench                                                               */
/* ---------------------------------------------------------------------- */

/* A sweep of 10 rows that takes well under a second: per mask (none,
 * causal), N = 32 and 48 forward and backward, and a decoding row over 64
 * keys; batch = 96 / keys, 2 heads of 16. */
#define BENCH_TINY                                                                                 \
  "bench", "--seqlens", "32,48", "--dims", "16", "--seqlen-k", "64", "--tokens", "96", "--hidden", \
      "32", "--budget", "0", "--repeat", "2"
enum { BENCH_TINY_ROWS = 10 };

/* Every field of a row, in order: the schema --help states. */
static const char *const bench_keys[] = {
    "schema",      "tool",          "impl",      "impl_version", "timestamp", "backend", "device",
    "device_kind", "compute_units", "timer",     "dtype",        "d",         "mask",    "causal",
    "window_left", "window_right",  "seqlen_q",  "seqlen_k",     "batch",     "heads",   "heads_kv",
    "pass",        "reps",          "median_ms", "min_ms",       "flops",     "tflops",  "gflops",
    "bytes",       "gbps",          "error"};
enum { BENCH_NKEYS = sizeof bench_keys / sizeof bench_keys[0] };

/* Row r of BENCH_TINY, as the sweep orders them. */
typedef struct bench_expect {
  const char *mask, *pass;
  int64_t nq, nk, batch;
} bench_expect;

static bench_expect bench_tiny_row(int r) {
  static const struct {
    int64_t n;
    const char *pass;
  } per_mask[5] = {{32, "fwd"}, {32, "bwd"}, {48, "fwd"}, {48, "bwd"}, {64, "fwd"}};
  bench_expect e;
  e.mask = r < 5 ? "none" : "causal";
  e.pass = per_mask[r % 5].pass;
  e.nk = per_mask[r % 5].n;
  e.nq = r % 5 == 4 ? 1 : e.nk;
  e.batch = 96 / e.nk;
  return e;
}

/* Query-key pairs a row's mask leaves visible, over its batch: causal is
 * aligned to the bottom-right corner, so a single query row sees every key. */
static double bench_pairs(const bench_expect *e) {
  int causal = !strcmp(e->mask, "causal");
  double per_seq = 0;
  for (int64_t i = 0; i < e->nq; i++)
    per_seq += causal ? (double)(i + e->nk - e->nq + 1) : (double)e->nk;
  return per_seq * (double)e->batch;
}

static const at_json *bench_get(const at_json *row, const char *key, at_json_type type, int line) {
  const at_json *v = at_json_get(row, key);
  if (!v || v->type != type)
    fail_msg("row %d: \"%s\" is %s (want JSON type %d)", line, key,
             v ? "of another type" : "missing", (int)type);
  return v;
}

static void bench_str(const at_json *row, const char *key, const char *want, int line) {
  const at_json *v = bench_get(row, key, AT_JSON_STR, line);
  if (strcmp(v->str, want) != 0)
    fail_msg("row %d: %s \"%s\" (want \"%s\")", line, key, v->str, want);
}

static double bench_num(const at_json *row, const char *key, int line) {
  return bench_get(row, key, AT_JSON_NUM, line)->num;
}

static void bench_int(const at_json *row, const char *key, int64_t want, int line) {
  int64_t got;
  if (at_json_int(bench_get(row, key, AT_JSON_NUM, line), INT64_MIN, INT64_MAX, &got) ||
      got != want)
    fail_msg("row %d: %s %g (want %lld)", line, key, at_json_get(row, key)->num, (long long)want);
}

static void assert_near(double got, double want, const char *what, int line) {
  if (!(fabs(got - want) <= 1e-4 * fabs(want)))
    fail_msg("row %d: %s %g (want %g)", line, what, got, want);
}

/* One JSON line of BENCH_TINY: every field, of its type, with the values the
 * sweep and the mask give. */
static void check_bench_json_row(const char *text, size_t len, int line) {
  char err[256];
  at_json *row = at_json_parse(text, len, err, sizeof err);
  if (!row) fail_msg("row %d is not JSON (%s): %.*s", line, err, (int)len, text);
  assert_int_equal(row->type, AT_JSON_OBJ);
  if (row->n != (int)BENCH_NKEYS)
    fail_msg("row %d has %d fields (want %d)", line, row->n, (int)BENCH_NKEYS);
  for (int k = 0; k < (int)BENCH_NKEYS; k++)
    if (strcmp(row->keys[k], bench_keys[k]) != 0)
      fail_msg("row %d: field %d is \"%s\" (want \"%s\")", line, k, row->keys[k], bench_keys[k]);
  const bench_expect e = bench_tiny_row(line - 1);
  bench_int(row, "schema", 1, line);
  bench_str(row, "tool", "attn bench", line);
  bench_str(row, "impl", "attn", line);
  bench_str(row, "backend", "cpu:0", line);
  bench_str(row, "device_kind", "cpu", line);
  bench_str(row, "timer", "host", line);
  bench_str(row, "dtype", "f32", line);
  bench_str(row, "mask", e.mask, line);
  bench_str(row, "pass", e.pass, line);
  const at_json *stamp = bench_get(row, "timestamp", AT_JSON_STR, line);
  if (strlen(stamp->str) != 20 || stamp->str[19] != 'Z' || stamp->str[10] != 'T')
    fail_msg("row %d: timestamp \"%s\" is not UTC ISO 8601", line, stamp->str);
  int causal = !strcmp(e.mask, "causal");
  if (bench_get(row, "causal", AT_JSON_BOOL, line)->boolean != causal)
    fail_msg("row %d: causal is wrong", line);
  bench_int(row, "window_left", -1, line);
  bench_int(row, "window_right", causal ? 0 : -1, line);
  bench_int(row, "d", 16, line);
  bench_int(row, "seqlen_q", e.nq, line);
  bench_int(row, "seqlen_k", e.nk, line);
  bench_int(row, "batch", e.batch, line);
  bench_int(row, "heads", 2, line);
  bench_int(row, "heads_kv", 2, line);
  bench_get(row, "error", AT_JSON_NULL, line);
  double reps = bench_num(row, "reps", line), ms = bench_num(row, "median_ms", line),
         lo = bench_num(row, "min_ms", line);
  if (reps < 1 || reps > 2 || !(ms > 0) || !(lo > 0) || lo > ms)
    fail_msg("row %d: reps %g, median_ms %g, min_ms %g", line, reps, ms, lo);
  double flops = 4.0 * 2 * bench_pairs(&e) * 16 * (!strcmp(e.pass, "bwd") ? 2.5 : 1);
  assert_near(bench_num(row, "flops", line), flops, "flops", line);
  assert_near(bench_num(row, "gflops", line), flops / ms * 1e-6, "gflops", line);
  assert_near(bench_num(row, "tflops", line), flops / ms * 1e-9, "tflops", line);
  double bytes = bench_num(row, "bytes", line);
  if (!(bytes > 0)) fail_msg("row %d: bytes %g", line, bytes);
  assert_near(bench_num(row, "gbps", line), bytes / ms * 1e-6, "gbps", line);
  at_json_free(row);
}

static void bench_writes_a_json_line_per_problem_and_pass(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN(r, QUICK_S, 0, BENCH_TINY, "--format", "json");
  if (r->status != 0 || r->err[0])
    fail_msg("status %d (want 0), stderr (want nothing):\n%s", r->status, r->err);
  int line = 0;
  for (const char *p = r->out; *p; line++) {
    const char *end = strchr(p, '\n');
    if (!end) fail_msg("the last row has no newline: %s", p);
    check_bench_json_row(p, (size_t)(end - p), line + 1);
    p = end + 1;
  }
  assert_int_equal(line, BENCH_TINY_ROWS);
  at_free(r);
}

/* The fields of one CSV line (RFC 4180: quoted fields, doubled quotes). */
static int csv_fields(const char *line, size_t len) {
  int n = 1, quoted = 0;
  for (size_t i = 0; i < len; i++) {
    if (line[i] == '"')
      quoted = !quoted;
    else if (line[i] == ',' && !quoted)
      n++;
  }
  return n;
}

static void bench_writes_csv_with_a_header_to_its_output_file(at_backend *b) {
  (void)b;
  char dir[64], path[128];
  snprintf(dir, sizeof dir, "/tmp/attn-bench-XXXXXX");
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/rows.csv", dir);
  outcome *r = at_malloc(sizeof *r);
  RUN(r, QUICK_S, 0, BENCH_TINY, "--format", "csv", "--output", path);
  if (r->status != 0 || r->err[0] || r->out[0])
    fail_msg("status %d (want 0), stdout \"%s\", stderr \"%s\" (want nothing on either)", r->status,
             r->out, r->err);
  size_t len;
  char *csv = (char *)at_read_file(path, &len);
  assert_non_null(csv);
  char header[1024] = "";
  for (int k = 0; k < (int)BENCH_NKEYS; k++) {
    size_t h = strlen(header);
    snprintf(header + h, sizeof header - h, "%s%s", k ? "," : "", bench_keys[k]);
  }
  int lines = 0;
  for (size_t at = 0; at < len; lines++) {
    const char *p = csv + at, *end = memchr(p, '\n', len - at);
    if (!end) fail_msg("line %d has no newline", lines + 1);
    size_t l = (size_t)(end - p);
    if (lines == 0 && (l != strlen(header) || strncmp(p, header, l) != 0))
      fail_msg("the header is \"%.*s\" (want \"%s\")", (int)l, p, header);
    if (csv_fields(p, l) != (int)BENCH_NKEYS)
      fail_msg("line %d has %d fields (want %d): %.*s", lines + 1, csv_fields(p, l),
               (int)BENCH_NKEYS, (int)l, p);
    /* A row's pass, and an empty error field. */
    if (lines > 0) {
      bench_expect e = bench_tiny_row(lines - 1);
      char pass[16];
      snprintf(pass, sizeof pass, ",%s,", e.pass);
      if (!strstr(p, pass) || l == 0 || p[l - 1] != ',')
        fail_msg("line %d is not a %s row without error: %.*s", lines + 1, e.pass, (int)l, p);
    }
    at = (size_t)(end - csv) + 1;
  }
  assert_int_equal(lines, 1 + BENCH_TINY_ROWS);
  at_free(csv);
  at_free(r);
  remove_tree(dir);
}

static void bench_prints_a_table_by_default(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN(r, QUICK_S, 0, BENCH_TINY);
  assert_int_equal(r->status, 0);
  const char *head = strstr(r->out, "\nbackend ");
  if (!head || !strstr(head, " median_ms ") || !strstr(head, " GFLOP/s ") || r->err[0])
    fail_msg("no table header, or stderr:\n%s\n%s", r->out, r->err);
  /* The header, then a line per row. */
  int rows = count_char(strchr(head + 1, '\n') + 1, '\n');
  assert_int_equal(rows, BENCH_TINY_ROWS);
  assert_non_null(strstr(r->out, "\ncpu:0     f32     16  causal"));
  at_free(r);
}

static void bench_progress_on_a_terminal_rewrites_one_line(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN(r, QUICK_S, 1, BENCH_TINY, "--format", "json");
  assert_int_equal(r->status, 0);
  assert_int_equal(count_char(r->out, '\n'), BENCH_TINY_ROWS);
  const char *last = strrchr(r->err, '\r');
  if (!strstr(r->err, "\rattn bench: row 1/10: cpu:0 f32 d=16 N=32 none fwd") ||
      !strstr(r->err, "\rattn bench: row 5/10: cpu:0 f32 d=16 Nq=1 Nk=64 none fwd") ||
      !strstr(r->err, "\rattn bench: row 10/10: ") || strchr(r->err, '\n') || !last ||
      strcmp(last, "\r\033[K") != 0)
    fail_msg("stderr on a terminal is not one rewritten line, cleared at the end:\n%s", r->err);
  at_free(r);
}

/* A row whose tensors cannot fit is written with its error and no times;
 * the rows after it still run, and the status is 1. The batch makes the
 * first row need terabytes and leaves the second small enough for a loaded
 * machine under the sanitizers. */
static void bench_writes_a_row_it_cannot_run_as_an_error(at_backend *b) {
  (void)b;
  outcome *r = at_malloc(sizeof *r);
  RUN(r, QUICK_S, 0, "bench", "--seqlens", "3000000,16", "--batch", "10000", "--dims", "8",
      "--heads", "1", "--masks", "none", "--passes", "fwd", "--format", "json", "--budget", "0",
      "--repeat", "1");
  if (r->status != 1 || count_char(r->out, '\n') != 2 || count_char(r->err, '\n') != 1 ||
      !strstr(r->err,
              "attn bench: row 1 (cpu:0 f32 d=8 N=3000000 none fwd): the tensors would need"))
    fail_msg("status %d (want 1), stdout:\n%s\nstderr:\n%s", r->status, r->out, r->err);
  const char *second = strchr(r->out, '\n') + 1;
  char err[256];
  at_json *bad = at_json_parse(r->out, (size_t)(second - r->out - 1), err, sizeof err),
          *good = at_json_parse(second, strlen(second) - 1, err, sizeof err);
  assert_non_null(bad);
  assert_non_null(good);
  const at_json *e = at_json_get(bad, "error");
  assert_true(e && e->type == AT_JSON_STR && strstr(e->str, "would need"));
  assert_int_equal(at_json_get(bad, "median_ms")->type, AT_JSON_NULL);
  assert_int_equal(at_json_get(bad, "gflops")->type, AT_JSON_NULL);
  assert_int_equal(at_json_get(good, "error")->type, AT_JSON_NULL);
  assert_int_equal(at_json_get(good, "median_ms")->type, AT_JSON_NUM);
  at_json_free(bad);
  at_json_free(good);
  at_free(r);
}

int main(int argc, char **argv) {
  const at_test common[] = {
      AT_TEST(absurd_sizes_are_refused_before_allocating),
      AT_TEST(malformed_values_are_refused),
      AT_TEST(missing_option_values_are_refused),
      AT_TEST(unknown_commands_and_flags_are_refused),
      AT_TEST(clashing_inference_options_are_refused),
      AT_TEST(each_damaged_case_is_refused_naming_its_file),
      AT_TEST(check_runs_the_good_case_beside_broken_ones),
      AT_TEST(missing_folders_and_files_are_refused),
      AT_TEST(seeds_use_all_64_bits),
      AT_TEST(slow_reference_shows_progress_on_stderr),
      AT_TEST(progress_on_a_terminal_rewrites_one_line),
      AT_TEST(quick_reference_shows_no_progress),
      AT_TEST(every_run_prints_gb_per_s_beside_gflop_per_s),
      AT_TEST(a_cache_with_used_lengths_passes_its_check),
      AT_TEST(a_paged_cache_passes_its_check),
      AT_TEST(appended_rows_are_checked_in_the_cache),
      AT_TEST(each_bias_form_passes_its_check),
      AT_TEST(sinks_pass_their_check),
      AT_TEST(the_backward_checks_dbias_and_dsinks),
      AT_TEST(key_splits_pass_their_check),
      AT_TEST(queued_calls_are_timed_and_checked),
      AT_TEST(a_tf32_run_states_its_own_rounding_beside_the_error),
      AT_TEST(check_with_tf32_prints_its_rounding_column),
      AT_TEST(a_result_outside_the_tolerance_exits_1),
      AT_TEST(bandwidth_reports_a_read_rate),
      AT_TEST(bench_writes_a_json_line_per_problem_and_pass),
      AT_TEST(bench_writes_csv_with_a_header_to_its_output_file),
      AT_TEST(bench_prints_a_table_by_default),
      AT_TEST(bench_progress_on_a_terminal_rewrites_one_line),
      AT_TEST(bench_writes_a_row_it_cannot_run_as_an_error),
  };
  return at_main(argc, argv, "cli", NULL, 0, common, sizeof common / sizeof common[0]);
}
