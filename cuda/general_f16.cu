/* The general kernels (general.cuh) for f16 storage: their rows of the
 * tuning table. */
#include "general.cuh"

extern "C" const attn__cuda_rows attn__cuda_general_rows_f16 = attn_general::table<__half>();
