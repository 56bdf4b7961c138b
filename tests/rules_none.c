/* The rules evaluators of the languages whose backend was not built: each
 * says so, and tests/test_rules.c skips that language. CMake defines
 * ATTN_RULES_HAVE_OPENCL or ATTN_RULES_HAVE_CUDA when it links the real
 * evaluator (tests/rules_opencl.c, tests/rules_cuda.cu) instead. */
#include "rules_table.h"

#include <stdio.h>

#ifndef ATTN_RULES_HAVE_OPENCL
int rules_eval_opencl(const rules_in *in, int n, rules_out *out, char *why, size_t why_len) {
  (void)in;
  (void)n;
  (void)out;
  snprintf(why, why_len, "attn was built without OpenCL");
  return -1;
}
#endif

#ifndef ATTN_RULES_HAVE_CUDA
int rules_eval_cuda(const rules_in *in, int n, rules_out *out, char *why, size_t why_len) {
  (void)in;
  (void)n;
  (void)out;
  snprintf(why, why_len, "attn was built without CUDA");
  return -1;
}
#endif
