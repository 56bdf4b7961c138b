/* The general kernels (general.cuh) instantiated for f16 storage. */
#include "general.cuh"

namespace attn_general {
template int launch_forward<__half>(const attn__cuda_launch *, const gparams &, int);
template int launch_backward<__half>(const attn__cuda_launch *, const gparams &);
}  // namespace attn_general
