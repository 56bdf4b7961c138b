/* The general kernels (general.cuh) and the f32 forward's wide kernel
 * (general_fwd32.cuh) for f32 storage: their rows of the tuning table. */
#include "general.cuh"
#include "general_fwd32.cuh"

extern "C" const attn__cuda_rows attn__cuda_general_rows_f32 = attn_general::table<float>();
extern "C" const attn__cuda_rows attn__cuda_f32_forward_rows = attn_general::f32_table();
