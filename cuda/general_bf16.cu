/* The general kernels (general.cuh) instantiated for bf16 storage. */
#include "general.cuh"

namespace attn_general {
template int launch_forward<__nv_bfloat16>(const attn__cuda_launch *, const gparams &, int);
template int launch_backward<__nv_bfloat16>(const attn__cuda_launch *, const gparams &);
}  // namespace attn_general
