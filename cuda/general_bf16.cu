/* The general kernels (general.cuh) for bf16 storage: their rows of the
 * tuning table. */
#include "general.cuh"

extern "C" const attn__cuda_rows attn__cuda_general_rows_bf16 =
    attn_general::table<__nv_bfloat16>();
