/*
 * The suites' way to run the OpenCL backend's GPU-class kernels (attn_fwd,
 * bwd.cl's dK/dV and dQ) on a CPU device, which plans the CPU-shaped ones
 * (fwd_rows.cl, bwd_rows.cl): with ATTN_TEST_CL_TILES=1, testutil.c calls
 * at_cl_force_tiles on the suite's OpenCL context, which switches every
 * config of the context to the tiled kernels through the backend's own
 * fallback (attn__cl_config_tiles, what runs when the device's compiler
 * cannot build the CPU shape), at the CPU class's tiles. The library itself
 * has no test switch. Returns how many configs it switched: 0 on a GPU,
 * whose configs run those kernels already.
 */
#include "testutil.h"

#ifdef ATTN_TEST_HAVE_OPENCL
#include "attn_cl.h"

int at_cl_force_tiles(attn_context *ctx) {
  int n = 0;
  for (int dt = ATTN_F32; dt <= ATTN_BF16; ++dt)
    for (int hd = 32; hd <= ATTN_MAX_HEAD_DIM; hd += 32) {
      attn__cl_config *c = attn__cl_config_for(ctx, (attn_dtype)dt, hd);
      if (c) n += attn__cl_config_tiles(c);
    }
  ctx->errmsg[0] = 0;
  return n;
}
#else
int at_cl_force_tiles(attn_context *ctx) {
  (void)ctx;
  return 0;
}
#endif
