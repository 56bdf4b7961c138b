/*
 * Faults a context must survive: memory the device does not have, and
 * buffers that are not what the caller says. Each failure is a status with a
 * sentence naming the argument, and the same context then computes a small
 * problem right.
 */
#define _DEFAULT_SOURCE /* MAP_NORESERVE */

#include "testutil.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

/* The small problem that shows the context still works. */
static void context_still_computes(at_backend *b) {
  at_shape s = {.dtype = ATTN_F32, .B = 1, .Nq = 32, .Nk = 32, .Hq = 2, .Hkv = 2, .d = 16};
  assert_int_equal(at_check_forward(b, &s), 1);
}

static void expect(at_backend *b, int rc, int status, const char *word, const char *what) {
  const char *msg = attn_errmsg(b->ctx);
  if (rc != status)
    fail_msg("%s gave %s (\"%s\"), expected %s", what, attn_status_name(rc), msg,
             attn_status_name(status));
  if (!at_mentions(msg, word)) fail_msg("%s: the message should name %s: \"%s\"", what, word, msg);
}

static uint64_t device_memory(at_backend *b) {
  attn_device_info info;
  assert_int_equal(attn_context_device_info(b->ctx, &info), ATTN_OK);
  return info.memory_bytes;
}

static void buffer_of_size_max_is_enomem(at_backend *b) {
  attn_buffer *buf = (attn_buffer *)&buf;
  int rc = attn_buffer_create(b->ctx, SIZE_MAX, &buf);
  expect(b, rc, ATTN_ENOMEM, "bytes", "attn_buffer_create(SIZE_MAX)");
  assert_null(buf);
  context_still_computes(b);
}

static void buffer_larger_than_the_device_memory_is_enomem(at_backend *b) {
  if (b->kind == ATTN_BACKEND_CPU)
    at_skip("the CPU's memory is the process's: the system may overcommit it");
  uint64_t mem = device_memory(b);
  if (mem == 0 || mem >= SIZE_MAX) at_skip("the device does not say how much memory it has");
  attn_buffer *buf = NULL;
  int rc = attn_buffer_create(b->ctx, (size_t)mem + 1, &buf);
  expect(b, rc, ATTN_ENOMEM, "bytes", "attn_buffer_create(device memory + 1)");
  assert_null(buf);
  context_still_computes(b);
}

/* Host memory of `bytes` that reads as zeros and costs nothing until it is
 * read: address space, no memory (MAP_NORESERVE). */
static void *reserve(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) at_skip("cannot reserve %zu bytes of address space", bytes);
  return p;
}

/* q's rows lie `bytes / rows` apart in host memory, so that staging q needs
 * a device buffer of about `bytes`; k, v and o are small. */
static int forward_with_q_spanning(at_backend *b, void *big, size_t bytes) {
  enum { N = 64, H = 1, D = 16 };
  static float k[N * H * D], v[N * H * D], o[N * H * D];
  for (int i = 0; i < N * H * D; i++)
    k[i] = v[i] = (float)(i % 7) * 0.125f;
  attn_params p;
  attn_params_init(&p);
  attn_tensor q = attn_tensor_bshd(big, ATTN_F32, 1, N, H, D);
  q.stride[1] = (int64_t)(bytes / sizeof(float) / (N - 1));
  q.stride[0] = q.stride[1] * N;
  attn_tensor tk = attn_tensor_bshd(k, ATTN_F32, 1, N, H, D);
  attn_tensor tv = attn_tensor_bshd(v, ATTN_F32, 1, N, H, D);
  attn_tensor to = attn_tensor_bshd(o, ATTN_F32, 1, N, H, D);
  memset(o, 0x7f, sizeof o);
  return attn_forward(b->ctx, &p, &q, &tk, &tv, &to, NULL);
}

static void forward_staging_more_than_the_device_memory_is_enomem(at_backend *b) {
  if (b->kind == ATTN_BACKEND_CPU)
    at_skip("the CPU reads host tensors in place: nothing is staged");
  uint64_t mem = device_memory(b);
  if (mem == 0 || mem > SIZE_MAX / 2) at_skip("the device does not say how much memory it has");
  size_t bytes = (size_t)mem + ((size_t)1 << 30);
  void *big = reserve(bytes);
  int rc = forward_with_q_spanning(b, big, bytes);
  munmap(big, bytes);
  expect(b, rc, ATTN_ENOMEM, "q", "a forward whose q spans more than the device memory");
  context_still_computes(b);
}

/* Where allocations the library does not refuse beforehand run out: three
 * staged tensors of 45 % of the device memory each. Only on a GPU, whose
 * memory is its own: copying 90 % of the host's memory would be no test. */
static void forward_running_out_of_device_memory_midway_is_enomem(at_backend *b) {
  attn_device_info info;
  assert_int_equal(attn_context_device_info(b->ctx, &info), ATTN_OK);
  if (!info.is_gpu) at_skip("the device's memory is the host's");
  /* A multiple of 16 bytes, so that every tensor starts aligned. */
  size_t part = (size_t)(info.memory_bytes / 100 * 45) / 16 * 16;
  enum { N = 64, H = 1, D = 16 };
  void *big = reserve(3 * part);
  static float o[N * H * D];
  attn_params p;
  attn_params_init(&p);
  attn_tensor t[3];
  for (int i = 0; i < 3; i++) {
    t[i] = attn_tensor_bshd((char *)big + (size_t)i * part, ATTN_F32, 1, N, H, D);
    t[i].stride[1] = (int64_t)(part / sizeof(float) / (N - 1)) - D;
    t[i].stride[0] = t[i].stride[1] * N;
  }
  attn_tensor to = attn_tensor_bshd(o, ATTN_F32, 1, N, H, D);
  int rc = attn_forward(b->ctx, &p, &t[0], &t[1], &t[2], &to, NULL);
  munmap(big, 3 * part);
  if (rc != ATTN_ENOMEM)
    fail_msg(
        "three staged tensors of 45 %% of the device memory gave %s (\"%s\"), expected "
        "ATTN_ENOMEM",
        attn_status_name(rc), attn_errmsg(b->ctx));
  if (!attn_errmsg(b->ctx)[0]) fail_msg("ATTN_ENOMEM without a sentence");
  context_still_computes(b);
}

/* On Hopper an f32 forward allowed TF32 runs over rounded copies of q, k and
 * v in the backend's workspace; where the device has no room left for them
 * it runs on rows that need none (cuda.c), not into ATTN_ENOMEM. A buffer
 * takes the device's memory but for the call's staging (q, k, v, o and lse
 * from host memory) and half the copies, which a buffer of both then
 * confirms by failing. Only on CUDA, the one backend with TF32 rows. */
static void tf32_forward_without_room_for_its_copies_still_runs(at_backend *b) {
  if (b->kind != ATTN_BACKEND_CUDA) at_skip("TF32 copies are the CUDA backend's");
  /* 32 MB a tensor: staging takes 128 MB and lse, the copies 96 MB. */
  at_shape s = {.dtype = ATTN_F32, .B = 64, .Nq = 128, .Nk = 128, .Hq = 8, .Hkv = 8, .d = 128};
  const size_t mb = (size_t)1 << 20, staged = 129 * mb, copies = 96 * mb;
  /* What the device has free, to 2 MB: buffers down to that size. */
  enum { MAX_HELD = 4096 };
  static attn_buffer *held[MAX_HELD];
  int n = 0;
  size_t free_bytes = 0;
  for (size_t chunk = (size_t)1 << 30; chunk >= 2 * mb && n < MAX_HELD;) {
    if (attn_buffer_create(b->ctx, chunk, &held[n]) == ATTN_OK)
      free_bytes += attn_buffer_size(held[n++]);
    else
      chunk /= 2;
  }
  while (n > 0)
    attn_buffer_free(held[--n]);
  if (free_bytes < staged + copies)
    at_skip("the device has less than %zu bytes free", staged + copies);
  attn_buffer *taken = NULL, *both = NULL;
  assert_int_equal(attn_buffer_create(b->ctx, free_bytes - staged - copies / 2, &taken), ATTN_OK);
  const int room = attn_buffer_create(b->ctx, staged + copies, &both);
  if (room == ATTN_OK) attn_buffer_free(both);
  s.flags = ATTN_ALLOW_TF32;
  const int ran = room != ATTN_OK ? at_check_forward(b, &s) : -1;
  attn_buffer_free(taken);
  if (room == ATTN_OK) fail_msg("the staging and the copies still fit: the test proves nothing");
  assert_int_equal(ran, 1);
  context_still_computes(b);
}

static void wrapping_more_bytes_than_the_buffer_holds_is_ebuffer(at_backend *b) {
  if (b->kind != ATTN_BACKEND_OPENCL) at_skip("only a cl_mem says how large it is");
  attn_buffer *buf = NULL, *wrap = (attn_buffer *)&wrap;
  assert_int_equal(attn_buffer_create(b->ctx, 1024, &buf), ATTN_OK);
  int rc = attn_buffer_wrap(b->ctx, attn_buffer_native(buf), 1025, &wrap);
  expect(b, rc, ATTN_EBUFFER, "bytes", "wrapping 1025 bytes of a 1024-byte cl_mem");
  assert_null(wrap);
  assert_int_equal(attn_buffer_wrap(b->ctx, attn_buffer_native(buf), 1024, &wrap), ATTN_OK);
  attn_buffer_free(wrap);
  attn_buffer_free(buf);
}

static void wrapping_a_buffer_of_another_cl_context_is_ebuffer(at_backend *b) {
  if (b->kind != ATTN_BACKEND_OPENCL) at_skip("only a cl_mem says which context it is in");
  attn_context *other = NULL;
  attn_buffer *buf = NULL, *wrap = (attn_buffer *)&wrap;
  assert_int_equal(attn_context_create("opencl", &other), ATTN_OK);
  assert_int_equal(attn_buffer_create(other, 1024, &buf), ATTN_OK);
  int rc = attn_buffer_wrap(b->ctx, attn_buffer_native(buf), 1024, &wrap);
  attn_buffer_free(buf);
  attn_context_free(other);
  expect(b, rc, ATTN_EBUFFER, "native", "wrapping a cl_mem of another context");
  assert_null(wrap);
}

int main(int argc, char **argv) {
  const at_test tests[] = {
      AT_TEST(buffer_of_size_max_is_enomem),
      AT_TEST(buffer_larger_than_the_device_memory_is_enomem),
      AT_TEST(forward_staging_more_than_the_device_memory_is_enomem),
      AT_TEST(forward_running_out_of_device_memory_midway_is_enomem),
      AT_TEST(tf32_forward_without_room_for_its_copies_still_runs),
      AT_TEST(wrapping_more_bytes_than_the_buffer_holds_is_ebuffer),
      AT_TEST(wrapping_a_buffer_of_another_cl_context_is_ebuffer),
  };
  return at_main(argc, argv, "faults", tests, sizeof tests / sizeof tests[0], NULL, 0);
}
