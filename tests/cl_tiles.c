/*
 * The suites' way to run the OpenCL backend's GPU-class kernels (attn_fwd,
 * bwd.cl's dK/dV and dQ) on a CPU device, which plans the CPU-shaped ones
 * (fwd_rows.cl, bwd_rows.cl): with ATTN_TEST_CL_TILES set, testutil.c calls
 * at_cl_force_tiles on the suite's OpenCL context, which switches every
 * config of the context to the tiled kernels through the backend's own
 * fallback (attn__cl_config_tiles, what runs when the device's compiler
 * cannot build the CPU shape). ATTN_TEST_CL_TILES=1 keeps the CPU class's
 * tiles (those of the fallback); "BQ,BK,BTM,BDK,BJK" gives bwd.cl other
 * ones (the GPU rows' or attn tune's variations, cl/plan.c and cl/tune.c),
 * fitted to the device as the table's are. The library itself has no test
 * switch.
 */
#include "testutil.h"

#include <stdio.h>

#ifdef ATTN_TEST_HAVE_OPENCL
#include "attn_cl.h"

int at_cl_force_tiles(attn_context *ctx, const char *spec) {
  int v[5], n = 0;
  const int given = sscanf(spec, "%d,%d,%d,%d,%d", &v[0], &v[1], &v[2], &v[3], &v[4]) == 5;
  for (int dt = ATTN_F32; dt <= ATTN_BF16; ++dt)
    for (int hd = 32; hd <= ATTN_MAX_HEAD_DIM; hd += 32) {
      attn__cl_config *c = attn__cl_config_for(ctx, (attn_dtype)dt, hd);
      if (!c) continue;
      if (given) {
        attn__cl_tiles t = c->t;
        t.bq = v[0];
        t.bk = v[1];
        t.btm = v[2];
        t.bdk = v[3];
        t.bjk = v[4];
        if (attn__cl_config_use(ctx, c, &t)) continue;
      }
      n += attn__cl_config_tiles(c);
    }
  ctx->errmsg[0] = 0;
  return n;
}

int at_cl_nv_cc(attn_context *ctx) {
  return attn_context_backend(ctx) == ATTN_BACKEND_OPENCL ? attn__cl_impl_of(ctx)->dev->nv_cc : 0;
}

int at_cl_fwd_mma(attn_context *ctx, attn_dtype dtype, int64_t head_dim) {
  const attn__cl_config *c = attn__cl_config_for(ctx, dtype, head_dim);
  ctx->errmsg[0] = 0;
  return c ? c->t.fwd == ATTN__CL_FWD_MMA : -1;
}

int at_cl_portable(attn_context *ctx) {
  int n = 0;
  for (int dt = ATTN_F32; dt <= ATTN_BF16; ++dt)
    for (int hd = 32; hd <= ATTN_MAX_HEAD_DIM; hd += 32) {
      attn__cl_config *c = attn__cl_config_for(ctx, (attn_dtype)dt, hd);
      if (c) n += attn__cl_config_portable(ctx, c);
    }
  ctx->errmsg[0] = 0;
  return n;
}
#else
int at_cl_force_tiles(attn_context *ctx, const char *spec) {
  (void)ctx;
  (void)spec;
  return 0;
}

int at_cl_nv_cc(attn_context *ctx) {
  (void)ctx;
  return 0;
}

int at_cl_fwd_mma(attn_context *ctx, attn_dtype dtype, int64_t head_dim) {
  (void)ctx;
  (void)dtype;
  (void)head_dim;
  return -1;
}

int at_cl_portable(attn_context *ctx) {
  (void)ctx;
  return 0;
}
#endif
