/*
 * Which devices a CUDA build has code for (cuda/archs.c): CMake's
 * architecture lists against compute capabilities. A device the list does
 * not cover is not counted by the CUDA backend, so `auto` moves on. And
 * which kernels the plan (cuda/plan.c) gives the code a device runs. These
 * cases need no GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "attn_cuda.h"

/* A toolkit before CUDA 12 builds no Hopper kernels, and the plan has no
 * rows for them: what the cases below ask of sm_90a code does not apply. */
static void needs_hopper_rows(void) {
#if !ATTN_CUDA_HOPPER
  print_message("skipped: this build has no Hopper kernels (its CUDA toolkit is older than 12)\n");
  skip();
#endif
}

static void sass_runs_on_later_minors_of_its_major(void **state) {
  (void)state;
  const char *l = "80-real 90-real";
  assert_true(attn__cuda_arch_covers(l, 80));
  assert_true(attn__cuda_arch_covers(l, 86));
  assert_true(attn__cuda_arch_covers(l, 89));
  assert_true(attn__cuda_arch_covers(l, 90));
  assert_false(attn__cuda_arch_covers(l, 75));  /* an earlier GPU: no code */
  assert_false(attn__cuda_arch_covers(l, 100)); /* a later major, and no PTX */
  assert_false(attn__cuda_arch_covers("86-real", 80));
}

static void ptx_runs_on_every_later_device(void **state) {
  (void)state;
  const char *l = "80-real;90-real;90-virtual"; /* the default list */
  assert_true(attn__cuda_arch_covers(l, 100));
  assert_true(attn__cuda_arch_covers(l, 120));
  assert_false(attn__cuda_arch_covers(l, 75));
  assert_false(attn__cuda_arch_covers(l, 61));
  /* A bare number is both. */
  assert_true(attn__cuda_arch_covers("75", 75));
  assert_true(attn__cuda_arch_covers("75", 90));
  assert_false(attn__cuda_arch_covers("75", 70));
  assert_true(attn__cuda_arch_covers("60-virtual", 61));
  assert_false(attn__cuda_arch_covers("60-real", 70));
}

static void arch_specific_targets_run_only_there(void **state) {
  (void)state;
  assert_true(attn__cuda_arch_covers("90a-real", 90));
  assert_false(attn__cuda_arch_covers("90a-real", 100));
  assert_false(attn__cuda_arch_covers("90a-virtual", 100));
  assert_true(attn__cuda_arch_covers("100f-virtual", 103));
  assert_false(attn__cuda_arch_covers("100f-virtual", 120));
}

static void cmake_keywords_are_trusted_and_nonsense_is_not(void **state) {
  (void)state;
  assert_true(attn__cuda_arch_covers("all", 50));
  assert_true(attn__cuda_arch_covers("all-major", 75));
  assert_true(attn__cuda_arch_covers("native", 90));
  assert_false(attn__cuda_arch_covers("", 90));
  assert_false(attn__cuda_arch_covers(NULL, 90));
  assert_false(attn__cuda_arch_covers("sm_90", 90));
  assert_false(attn__cuda_arch_covers("90-rea", 90));
  assert_false(attn__cuda_arch_covers("90x", 90));
  assert_true(attn__cuda_arch_covers("bogus 90", 90)); /* one good entry is enough */
}

static void the_library_knows_its_own_list(void **state) {
  (void)state;
  const char *l = attn__cuda_archs();
  assert_non_null(l);
  assert_true(l[0] != '\0');
}

/* A 1024 x 1024 problem of 8 heads of d, its tensors 16-byte aligned in
 * device memory; tf32: ATTN_ALLOW_TF32. */
static void problem_of(attn__problem *pb, attn_dtype dt, int d, int tf32) {
  memset(pb, 0, sizeof *pb);
  pb->dtype = dt;
  pb->batch = 1;
  pb->heads_q = pb->heads_kv = 8;
  pb->head_dim = d;
  pb->seqlen_q = pb->seqlen_k = pb->total_q = pb->total_k = 1024;
  pb->scale = 0.125f;
  pb->window_left = pb->window_right = -1;
  pb->has_lse = 1;
  pb->allow_tf32 = tf32;
  attn__tensor *ts[] = {&pb->q, &pb->k, &pb->v, &pb->o, &pb->dout, &pb->dq, &pb->dk, &pb->dv};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
    ts[i]->native = (void *)(uintptr_t)4096;
    ts[i]->dtype = dt;
    ts[i]->sd = 1;
    ts[i]->sh = d;
    ts[i]->ss = 8 * d;
    ts[i]->sb = 1024 * 8 * d;
  }
  pb->lse.native = (void *)(uintptr_t)4096;
  pb->lse.dtype = ATTN_F32;
}

/* The plan for a device running code for `arch` (and its specific code,
 * sm_90a, where `specific`) with `kb` KB of shared memory a block (48 on a
 * P100, 64 on a T4, 96 on a V100, 163 on an A100, 227 on an H200); NULL
 * when no row fits. */
static const attn__cuda_config *plan_on(int arch, int kb, int specific, const attn__problem *pb,
                                        int backward) {
  attn__cuda_device dev = {.sm_count = 40,
                           .cc = arch,
                           .smem_optin = (size_t)kb * 1024,
                           .arch = arch,
                           .arch_specific = specific};
  char why[256];
  return attn__cuda_plan(&dev, pb, backward, why, sizeof why);
}

static const attn__cuda_config *planned(int arch, int kb, attn_dtype dt, int d, int backward,
                                        int tf32) {
  attn__problem pb;
  problem_of(&pb, dt, d, tf32);
  return plan_on(arch, kb, 0, &pb, backward);
}

static attn__cuda_kernel planned_kernel(int arch, int kb, attn_dtype dt, int backward) {
  const attn__cuda_config *c = planned(arch, kb, dt, 64, backward, 0);
  if (!c) fail_msg("no row for arch %d with %d KB", arch, kb);
  return c->kernel;
}

static void f16_takes_the_tensor_cores_from_turing_on(void **state) {
  (void)state;
  assert_int_equal(planned_kernel(75, 64, ATTN_F16, 0), ATTN__CUDA_MMA_FORWARD);
  /* The backward's tiles need more than a T4's 64 KB; compute_75 code on a
   * larger device runs them. */
  assert_int_equal(planned_kernel(75, 64, ATTN_F16, 1), ATTN__CUDA_GENERAL_BACKWARD);
  assert_int_equal(planned_kernel(75, 227, ATTN_F16, 1), ATTN__CUDA_MMA_BACKWARD);
  /* Volta's and Pascal's code has no mma.sync of this shape. */
  assert_int_equal(planned_kernel(70, 96, ATTN_F16, 0), ATTN__CUDA_GENERAL_FORWARD);
  assert_int_equal(planned_kernel(60, 48, ATTN_F16, 1), ATTN__CUDA_GENERAL_BACKWARD);
}

static void bf16_and_tf32_take_them_from_ampere_on(void **state) {
  (void)state;
  assert_int_equal(planned_kernel(75, 64, ATTN_BF16, 0), ATTN__CUDA_GENERAL_FORWARD);
  assert_int_equal(planned_kernel(75, 64, ATTN_BF16, 1), ATTN__CUDA_GENERAL_BACKWARD);
  assert_int_equal(planned_kernel(80, 163, ATTN_BF16, 0), ATTN__CUDA_MMA_FORWARD);
  assert_int_equal(planned_kernel(80, 163, ATTN_BF16, 1), ATTN__CUDA_MMA_BACKWARD);
  const attn__cuda_config *c = planned(75, 227, ATTN_F32, 64, 0, 1);
  assert_non_null(c);
  assert_int_not_equal(c->kernel, ATTN__CUDA_MMA_FORWARD);
  c = planned(80, 163, ATTN_F32, 64, 0, 1);
  assert_non_null(c);
  assert_int_equal(c->kernel, ATTN__CUDA_MMA_FORWARD);
  c = planned(80, 163, ATTN_F32, 64, 0, 0);
  assert_non_null(c);
  assert_int_not_equal(c->kernel, ATTN__CUDA_MMA_FORWARD);
}

/* A bias whose rows are not whole 16-byte chunks (197 keys of bf16, at an
 * odd element) stays on the tensor cores: the Hopper forward (its cp.async
 * kernel, as no tensor map describes such rows) and the mma.sync forward
 * and backward, not the general kernels. */
static void bias_rows_of_any_length_take_the_tensor_cores(void **state) {
  (void)state;
  attn__problem pb;
  problem_of(&pb, ATTN_BF16, 64, 0);
  pb.seqlen_k = pb.total_k = 197;
  pb.has_bias = 1;
  pb.bias.native = (void *)(uintptr_t)(4096 + 2);
  pb.bias.dtype = ATTN_BF16;
  pb.bias.sd = 1;
  pb.bias.ss = 197;
  pb.bias.sh = 1024 * 197;
  pb.bias.sb = 8 * 1024 * 197;
  const attn__cuda_config *c = plan_on(90, 227, 1, &pb, 0);
  assert_non_null(c);
  assert_int_equal(c->kernel,
                   ATTN_CUDA_HOPPER ? ATTN__CUDA_HOPPER_FORWARD : ATTN__CUDA_MMA_FORWARD);
  c = plan_on(80, 163, 0, &pb, 0);
  assert_non_null(c);
  assert_int_equal(c->kernel, ATTN__CUDA_MMA_FORWARD);
  c = plan_on(80, 163, 0, &pb, 1);
  assert_non_null(c);
  assert_int_equal(c->kernel, ATTN__CUDA_MMA_BACKWARD);
  /* An element split across two (an odd byte address) is still refused. */
  pb.bias.native = (void *)(uintptr_t)(4096 + 1);
  c = plan_on(80, 163, 0, &pb, 0);
  assert_non_null(c);
  assert_int_equal(c->kernel, ATTN__CUDA_GENERAL_FORWARD);
}

/* A full [B, H, N, N] bias of dtype dt, N up to 1024 (its address only:
 * the plan reads shapes). */
static void full_bias(attn__problem *pb, attn_dtype dt) {
  pb->has_bias = 1;
  pb->bias.native = (void *)(uintptr_t)4096;
  pb->bias.dtype = dt;
  pb->bias.sd = 1;
  pb->bias.ss = 1024;
  pb->bias.sh = 1024 * 1024;
  pb->bias.sb = 8 * 1024 * 1024;
}

/* f32 with TF32 allowed on sm_90a code: the Hopper forward's TF32 rows at
 * d = 64, 96, 128 and 256 for dense problems; varlen, a bias, a KV cache,
 * other head dims and sm_90 code without the specific image take the
 * mma.sync rows, and without the flag neither runs. */
static void tf32_on_hopper_takes_the_warpgroup_rows(void **state) {
  (void)state;
  needs_hopper_rows();
  const int dims[] = {64, 96, 128, 256};
  for (int i = 0; i < 4; i++) {
    attn__problem pb;
    problem_of(&pb, ATTN_F32, dims[i], 1);
    const attn__cuda_config *c = plan_on(90, 227, 1, &pb, 0);
    assert_non_null(c);
    assert_int_equal(c->kernel, ATTN__CUDA_HOPPER_FORWARD);
    assert_true(c->tf32);
    size_t k_at, v_at;
    assert_true(attn__cuda_workspace(c->kernel, &pb) == attn__cuda_tf32_staged(&pb, &k_at, &v_at));
    assert_true(k_at == (size_t)4 * 8 * 1024 * dims[i] && v_at == 2 * k_at);
    /* Where the copies have no room, the mma.sync row, with no workspace. */
    attn__cuda_device dev = {.cc = 90, .smem_optin = 227 * 1024, .arch = 90, .arch_specific = 1};
    const attn__cuda_config *u = attn__cuda_plan_unstaged(&dev, &pb);
    assert_non_null(u);
    assert_int_equal(u->kernel, ATTN__CUDA_MMA_FORWARD);
    assert_true(u->tf32);
    assert_true(attn__cuda_workspace(u->kernel, &pb) == 0);
    c = plan_on(90, 227, 0, &pb, 0);
    assert_non_null(c);
    assert_int_equal(c->kernel, ATTN__CUDA_MMA_FORWARD);
    pb.varlen = 1;
    c = plan_on(90, 227, 1, &pb, 0);
    assert_non_null(c);
    assert_int_equal(c->kernel, ATTN__CUDA_MMA_FORWARD);
    pb.varlen = 0;
    full_bias(&pb, ATTN_F32);
    c = plan_on(90, 227, 1, &pb, 0);
    assert_non_null(c);
    assert_int_equal(c->kernel, ATTN__CUDA_MMA_FORWARD);
    problem_of(&pb, ATTN_F32, dims[i], 0);
    c = plan_on(90, 227, 1, &pb, 0);
    assert_non_null(c);
    assert_int_not_equal(c->kernel, ATTN__CUDA_HOPPER_FORWARD);
    assert_int_not_equal(c->kernel, ATTN__CUDA_MMA_FORWARD);
  }
  attn__problem pb;
  problem_of(&pb, ATTN_F32, 32, 1);
  const attn__cuda_config *c = plan_on(90, 227, 1, &pb, 0);
  assert_non_null(c);
  assert_int_equal(c->kernel, ATTN__CUDA_MMA_FORWARD);
  assert_true(c->tf32);
}

/* d = 128 on an H200 takes 176-key blocks where no mask pads them, and
 * where one does only from kMinKeysMaskedWide keys on; a bias keeps 128. */
static void wide_key_blocks_only_where_the_diagonal_pays(void **state) {
  (void)state;
  needs_hopper_rows();
  attn__problem pb;
  problem_of(&pb, ATTN_BF16, 128, 0);
  const attn__cuda_config *c = plan_on(90, 227, 1, &pb, 0);
  assert_non_null(c);
  assert_int_equal(c->kernel, ATTN__CUDA_HOPPER_FORWARD);
  assert_int_equal(c->bc, 176);
  pb.window_right = 0; /* causal */
  c = plan_on(90, 227, 1, &pb, 0);
  assert_non_null(c);
  assert_int_equal(c->bc, 128);
  pb.seqlen_k = pb.total_k = 8192;
  c = plan_on(90, 227, 1, &pb, 0);
  assert_non_null(c);
  assert_int_equal(c->bc, 176);
  pb.window_right = -1;
  pb.window_left = 256; /* a window pads like the diagonal */
  pb.seqlen_k = pb.total_k = 1024;
  c = plan_on(90, 227, 1, &pb, 0);
  assert_non_null(c);
  assert_int_equal(c->bc, 128);
  pb.window_left = -1;
  full_bias(&pb, ATTN_BF16);
  c = plan_on(90, 227, 1, &pb, 0);
  assert_non_null(c);
  assert_int_equal(c->kernel, ATTN__CUDA_HOPPER_FORWARD);
  assert_int_equal(c->bc, 128);
}

/* d = 64 on an H200 below 2048 query rows takes 208-key blocks where no
 * mask pads them (ViT's 197 tokens one block, a partial one), and where one
 * does only from kMinKeysMaskedWide keys on; a bias keeps 128, and from
 * 2048 query rows on three consumers' 192-row tiles come first. */
static void short_d64_rows_take_208_key_blocks(void **state) {
  (void)state;
  needs_hopper_rows();
  const attn_dtype dts[] = {ATTN_F16, ATTN_BF16};
  for (int i = 0; i < 2; i++) {
    attn__problem pb;
    problem_of(&pb, dts[i], 64, 0);
    const attn__cuda_config *c = plan_on(90, 227, 1, &pb, 0);
    assert_non_null(c);
    assert_int_equal(c->kernel, ATTN__CUDA_HOPPER_FORWARD);
    assert_int_equal(c->br, 128);
    assert_int_equal(c->bc, 208);
    pb.seqlen_q = pb.seqlen_k = pb.total_q = pb.total_k = 197;
    c = plan_on(90, 227, 1, &pb, 0);
    assert_non_null(c);
    assert_int_equal(c->kernel, ATTN__CUDA_HOPPER_FORWARD);
    assert_int_equal(c->br, 128);
    assert_int_equal(c->bc, 208);
    pb.seqlen_q = pb.seqlen_k = pb.total_q = pb.total_k = 1024;
    pb.window_right = 0; /* causal */
    c = plan_on(90, 227, 1, &pb, 0);
    assert_non_null(c);
    assert_int_equal(c->br, 128);
    assert_int_equal(c->bc, 128);
    pb.seqlen_k = pb.total_k = 8192;
    c = plan_on(90, 227, 1, &pb, 0);
    assert_non_null(c);
    assert_int_equal(c->br, 128);
    assert_int_equal(c->bc, 208);
    pb.window_right = -1;
    pb.seqlen_k = pb.total_k = 1024;
    pb.seqlen_q = pb.total_q = 4096;
    c = plan_on(90, 227, 1, &pb, 0);
    assert_non_null(c);
    assert_int_equal(c->kernel, ATTN__CUDA_HOPPER_FORWARD);
    assert_int_equal(c->br, 192);
    assert_int_equal(c->bc, 128);
    pb.seqlen_q = pb.total_q = 1024;
    full_bias(&pb, dts[i]);
    c = plan_on(90, 227, 1, &pb, 0);
    assert_non_null(c);
    assert_int_equal(c->kernel, ATTN__CUDA_HOPPER_FORWARD);
    assert_int_equal(c->br, 128);
    assert_int_equal(c->bc, 128);
  }
}

/* Every dtype has a row in the shared memory a block of older GPUs: a
 * P100's 48 KB forward up to d = 192 and backward up to 128, a T4's 64 KB
 * forward at every d and backward up to 192, a V100's 96 KB both at every
 * d. */
static void older_gpus_shared_memory_holds_a_row(void **state) {
  (void)state;
  const attn_dtype dts[] = {ATTN_F32, ATTN_F16, ATTN_BF16};
  const int dims[] = {32, 64, 96, 128, 160, 192, 256};
  static const struct {
    const char *name;
    int arch, kb, fwd_max, bwd_max;
  } gpus[] = {{"P100", 60, 48, 192, 128}, {"T4", 75, 64, 256, 192}, {"V100", 70, 96, 256, 256}};
  for (int g = 0; g < 3; g++)
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 7; j++)
        for (int bwd = 0; bwd < 2; bwd++)
          if (dims[j] <= (bwd ? gpus[g].bwd_max : gpus[g].fwd_max) &&
              !planned(gpus[g].arch, gpus[g].kb, dts[i], dims[j], bwd, 0))
            fail_msg("%s: no %s row for dtype %d, d = %d", gpus[g].name,
                     bwd ? "backward" : "forward", dts[i], dims[j]);
}

/* Key blocks wider than 128 only where they pad the keys at most an eighth
 * beyond 128-key blocks: 256 keys take 128 at d = 64 and 128, 300 keys (416
 * or 352 columns against 384) the wide ones, 197 keys 208 at d = 64 (one
 * block) but 128 at d = 128 (two of 176 against two of 128). */
static void wide_key_blocks_only_where_they_pad_little(void **state) {
  (void)state;
  needs_hopper_rows();
  static const struct {
    int d, keys, bc;
  } cases[] = {{64, 256, 128},  {64, 300, 208},  {64, 197, 208},
               {128, 256, 128}, {128, 300, 176}, {128, 197, 128}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    attn__problem pb;
    problem_of(&pb, ATTN_BF16, cases[i].d, 0);
    pb.seqlen_q = pb.seqlen_k = pb.total_q = pb.total_k = cases[i].keys;
    const attn__cuda_config *c = plan_on(90, 227, 1, &pb, 0);
    assert_non_null(c);
    assert_int_equal(c->kernel, ATTN__CUDA_HOPPER_FORWARD);
    assert_int_equal(c->bc, cases[i].bc);
  }
}

/* The 16-bit backward on Hopper's specific code takes the warpgroup rows at
 * every head dim they have, d = 256 (dK and dV apart, 64 x 64 tiles)
 * included; a deterministic call and one with a bias go to the families
 * that have them, and sm_80 code to the mma.sync or general rows. */
static void hopper_backward_rows_cover_d256(void **state) {
  (void)state;
  needs_hopper_rows();
  const attn_dtype dts[] = {ATTN_F16, ATTN_BF16};
  const int dims[] = {64, 96, 128, 256};
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++) {
      attn__problem pb;
      problem_of(&pb, dts[i], dims[j], 0);
      const attn__cuda_config *c = plan_on(90, 227, 1, &pb, 1);
      assert_non_null(c);
      assert_int_equal(c->kernel, ATTN__CUDA_HOPPER_BACKWARD);
      assert_int_equal(c->dim, dims[j]);
      assert_true(c->smem <= 227 * 1024);
      if (dims[j] == 256) {
        assert_int_equal(c->bc, 64);
        pb.deterministic = 1;
        c = plan_on(90, 227, 1, &pb, 1);
        assert_non_null(c);
        assert_int_equal(c->kernel, ATTN__CUDA_GENERAL_BACKWARD);
        pb.deterministic = 0;
        full_bias(&pb, dts[i]);
        c = plan_on(90, 227, 1, &pb, 1);
        assert_non_null(c);
        assert_int_equal(c->kernel, ATTN__CUDA_GENERAL_BACKWARD);
        pb.has_bias = 0;
        c = plan_on(80, 163, 0, &pb, 1);
        assert_non_null(c);
        assert_int_equal(c->kernel, ATTN__CUDA_GENERAL_BACKWARD);
      }
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sass_runs_on_later_minors_of_its_major),
      cmocka_unit_test(ptx_runs_on_every_later_device),
      cmocka_unit_test(arch_specific_targets_run_only_there),
      cmocka_unit_test(cmake_keywords_are_trusted_and_nonsense_is_not),
      cmocka_unit_test(the_library_knows_its_own_list),
      cmocka_unit_test(f16_takes_the_tensor_cores_from_turing_on),
      cmocka_unit_test(bf16_and_tf32_take_them_from_ampere_on),
      cmocka_unit_test(bias_rows_of_any_length_take_the_tensor_cores),
      cmocka_unit_test(tf32_on_hopper_takes_the_warpgroup_rows),
      cmocka_unit_test(wide_key_blocks_only_where_the_diagonal_pays),
      cmocka_unit_test(short_d64_rows_take_208_key_blocks),
      cmocka_unit_test(wide_key_blocks_only_where_they_pad_little),
      cmocka_unit_test(older_gpus_shared_memory_holds_a_row),
      cmocka_unit_test(hopper_backward_rows_cover_d256),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
