/* The general kernels (general.cuh) instantiated for f32 storage, and the
 * f32 forward's wide kernel (general_fwd32.cuh). */
#include "general.cuh"
#include "general_fwd32.cuh"

namespace attn_general {
template int launch_forward<float>(const attn__cuda_launch *, const gparams &, int);
template int launch_backward<float>(const attn__cuda_launch *, const gparams &);
}  // namespace attn_general
