/*
 * Which devices a CUDA build has code for (cuda/archs.c): CMake's
 * architecture lists against compute capabilities. A device the list does
 * not cover is not counted by the CUDA backend, so `auto` moves on; these
 * cases need no GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "attn_cuda.h"

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(sass_runs_on_later_minors_of_its_major),
      cmocka_unit_test(ptx_runs_on_every_later_device),
      cmocka_unit_test(arch_specific_targets_run_only_there),
      cmocka_unit_test(cmake_keywords_are_trusted_and_nonsense_is_not),
      cmocka_unit_test(the_library_knows_its_own_list),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
