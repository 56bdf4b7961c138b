/*
 * The OpenCL backend's private interface between its files:
 *   loader.c   dlopen()s the OpenCL ICD loader and fills attn__cl, the table
 *              of entry points (the library has no link-time dependency on
 *              libOpenCL, so it loads on a machine without one);
 *   program.c  builds programs from the embedded sources, through an on-disk
 *              cache of device binaries;
 *   device.c   devices, contexts, queues, buffers and the self-test, and the
 *              attn__backend table;
 *   plan.c     the one decision of what runs: the tuning table, fitted to
 *              the device, and the workspace a call needs;
 *   launch.c   the attention programs, kernel arguments and the forward
 *              and backward launches.
 */
#ifndef ATTN_CL_H
#define ATTN_CL_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

#include "attn_internal.h"

/* X(name): every OpenCL entry point the backend calls. */
#define ATTN__CL_FUNCS(X)      \
  X(clGetPlatformIDs)          \
  X(clGetPlatformInfo)         \
  X(clGetDeviceIDs)            \
  X(clGetDeviceInfo)           \
  X(clCreateContext)           \
  X(clRetainContext)           \
  X(clReleaseContext)          \
  X(clCreateCommandQueue)      \
  X(clRetainCommandQueue)      \
  X(clReleaseCommandQueue)     \
  X(clGetCommandQueueInfo)     \
  X(clCreateBuffer)            \
  X(clReleaseMemObject)        \
  X(clGetMemObjectInfo)        \
  X(clEnqueueReadBuffer)       \
  X(clEnqueueWriteBuffer)      \
  X(clEnqueueCopyBuffer)       \
  X(clCreateProgramWithSource) \
  X(clCreateProgramWithBinary) \
  X(clBuildProgram)            \
  X(clGetProgramInfo)          \
  X(clGetProgramBuildInfo)     \
  X(clReleaseProgram)          \
  X(clCreateKernel)            \
  X(clReleaseKernel)           \
  X(clSetKernelArg)            \
  X(clGetKernelWorkGroupInfo)  \
  X(clEnqueueNDRangeKernel)    \
  X(clFlush)                   \
  X(clFinish)

typedef struct attn__cl_api {
#define ATTN__CL_MEMBER(name) __typeof__(&name) name;
  ATTN__CL_FUNCS(ATTN__CL_MEMBER)
#undef ATTN__CL_MEMBER
} attn__cl_api;

/* The table, or NULL with a sentence in why when no usable OpenCL library
 * was found. Thread-safe; the library is loaded once per process. */
const attn__cl_api *attn__cl_load(const char **why);

/* "CL_OUT_OF_RESOURCES" for -5, and so on. */
const char *attn__cl_errname(cl_int err);

/* The embedded kernel sources (generated at build time from cl/ *.cl). */
extern const char attn__cl_src_common[];
extern const char attn__cl_src_fwd[];
extern const char attn__cl_src_fwd_rows[];
extern const char attn__cl_src_mma[];
extern const char attn__cl_src_fwd_mma[];
extern const char attn__cl_src_bwd_mma[];
extern const char attn__cl_src_bwd[];
extern const char attn__cl_src_bwd_rows[];
extern const char attn__cl_src_decode[];
extern const char attn__cl_src_decode_mma[];
extern const char attn__cl_src_append[];
extern const char attn__cl_src_merge[];
extern const char attn__cl_src_meta[];
extern const char attn__cl_src_split[];
extern const char attn__cl_src_selftest[];

/* What identifies a device's compiled code: a hash of its platform's name
 * and version, its name, its driver version and its OpenCL version. The
 * program cache's keys start from it, and the stored tunings are kept by
 * it (tune.c). */
uint64_t attn__cl_device_key(const attn__cl_api *cl, cl_device_id dev);
/* mkdir -p; a failure surfaces later as a failed write, which is ignored. */
void attn__cl_make_dirs(const char *dir);

/* Builds a program for one device from sources concatenated in order, with
 * options, through the disk cache (ATTN_CL_CACHE_DIR, ATTN_CL_CACHE=0), and
 * creates its kernels names[0..nk) into kernels. A cached binary that fails
 * anywhere up to the kernels is rebuilt from source and replaced. On failure
 * reports on ctx (ATTN_EBUILD with the build log, ATTN_EDEVICE or
 * ATTN_ENOMEM) and returns the status, with nothing left to release. */
int attn__cl_build(attn_context *ctx, const attn__cl_api *cl, cl_context clctx, cl_device_id dev,
                   const char *const *srcs, int nsrc, const char *options, const char *const *names,
                   int nk, cl_program *out, cl_kernel *kernels);

/* ---------------------------------------------------------------------- */
/* A context's state, shared by device.c, plan.c and launch.c             */
/* ---------------------------------------------------------------------- */

typedef struct attn__cl_device {
  cl_device_id id;
  attn_device_info info;
  cl_ulong local_mem;
  cl_ulong max_alloc; /* CL_DEVICE_MAX_MEM_ALLOC_SIZE */
  size_t max_wg;
  int nv_cc;       /* NVIDIA's compute capability, major * 10 + minor; 0 on other devices */
  int simd_floats; /* CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT: 16 on AVX-512 CPUs */
} attn__cl_device;

/* The shape of the forward kernel (attn__cl_tiles.fwd). */
enum attn__cl_fwd_shape {
  ATTN__CL_FWD_TILES, /* attn_fwd (fwd.cl): work-groups of 16 * Br / TM items over local tiles */
  ATTN__CL_FWD_ROWS,  /* attn_fwd_rows (fwd_rows.cl): one item per group, RB rows, for CPUs */
  ATTN__CL_FWD_MMA    /* attn_fwd_mma (fwd_mma.cl): NVIDIA's tensor cores through inline PTX,
                       * f16 and bf16, 128 items over 64 rows and 64-key tiles; its configs
                       * decode on them too (attn_decode_mma, decode_mma.cl) */
};

/* The shape of the backward's dK/dV and dQ kernels (attn__cl_tiles.bwd). */
enum attn__cl_bwd_shape {
  ATTN__CL_BWD_TILES, /* attn_bwd_dkdv, attn_bwd_dq (bwd.cl): 16 * bq / btm items over
                       * register tiles of bq x bk tiles */
  ATTN__CL_BWD_ROWS,  /* attn_bwd_dkdv_rows, attn_bwd_dq_rows (bwd_rows.cl): one item per
                       * group, KB keys or RB rows, for CPUs */
  ATTN__CL_BWD_MMA    /* attn_bwd_dkdv_mma, attn_bwd_dq_mma (bwd_mma.cl): both on
                       * NVIDIA's tensor cores, 128 items over 64 keys or query rows */
};

/* The query rows (or keys) of a work-group of fwd_mma.cl and bwd_mma.cl
 * (their MR, QR and KR, but KR is 32 for f32 above HD 64:
 * attn__cl_mma_key_rows; 128 items, MMA_ITEMS), which the host's grids and
 * sizes follow. */
#define ATTN__CL_MMA_ROWS 64
/* decode_mma.cl's rows a work-group (its DR: the M of m16n8k16). */
#define ATTN__CL_MMA_DECODE_ROWS 16

/* Whether a config decodes on the tensor cores (decode_mma.cl): where its
 * forward runs on them, on 16-bit data (f32 decodes read twice the bytes
 * for the same products: decode.cl keeps up with them). */
#define ATTN__CL_DECODES_MMA(c) ((c)->t.fwd == ATTN__CL_FWD_MMA && (c)->dtype != ATTN_F32)

/* The tiles one program is built with (fwd.cl's, fwd_rows.cl's and bwd.cl's
 * -D parameters). */
typedef struct attn__cl_tiles {
  int br, bc; /* forward: Br query rows per work-group, Bc keys per tile */
  int tm;     /* forward: query rows per work-item (16 * Br / TM work-items) */
  int dk, jk; /* forward: Q/K columns and V rows per staging step */
  int bq, bk; /* backward (bwd.cl): query rows and keys per tile */
  int btm;    /* backward: query rows per work-item in S, dP and dQ (16 * bq / btm work-items) */
  int bdk;    /* backward: Q, dO, K, V columns per staging step of S and dP */
  int bjk;    /* backward: rows per staging step of the dK/dV and dQ sums */
  int dr;     /* decode: query rows per work-group (DR); 0: no decode kernel fits */
  int ntd;    /* decode: work-items and keys per tile (NTD) */
  int fwd;    /* the forward kernel's shape (attn__cl_fwd_shape) */
  int bwd;    /* the backward's dK/dV and dQ kernels' shape (attn__cl_bwd_shape) */
  int rb, kb; /* attn_fwd_rows, bwd_rows.cl: query rows per work-item (RB), keys per tile (KB) */
  int vw;     /* their products' vector width (VW), 8 or 16: set by plan.c's fit() */
} attn__cl_tiles;

/* attn__plan.kernel: the kernel family that runs. */
enum attn__cl_kernel {
  ATTN__CL_FWD,    /* attn_fwd */
  ATTN__CL_BWD,    /* attn_bwd_pre, then attn_bwd_dkdv and attn_bwd_dq */
  ATTN__CL_DECODE, /* attn_decode, then attn_decode_merge when the keys are split */
  ATTN__CL_FAMILIES
};

/* The programs a config is built into: which sources, which kernels. The
 * plain attention program holds the forward and backward kernels together;
 * a problem using an optional feature gets a program of its pass alone,
 * built with the feature's -D values (attn__cl_features). */
enum attn__cl_prog_kind {
  ATTN__CL_PROG_ATTN, /* common.cl fwd.cl (or fwd_rows.cl, fwd_mma.cl) bwd.cl (and bwd_rows.cl), no
                       * feature */
  ATTN__CL_PROG_FWD,  /* common.cl fwd.cl (or fwd_rows.cl, fwd_mma.cl), and split.cl when split */
  ATTN__CL_PROG_BWD,  /* common.cl bwd.cl (and bwd_rows.cl) */
  ATTN__CL_PROG_DECODE, /* common.cl decode.cl (or mma.cl decode_mma.cl) split.cl */
  ATTN__CL_PROG_APPEND, /* common.cl append.cl */
  ATTN__CL_PROG_MERGE,  /* common.cl merge.cl */
  ATTN__CL_PROG_META    /* common.cl meta.cl */
};

/* The optional features a program is built with (common.cl's and bwd.cl's
 * -D values). */
enum {
  ATTN__CL_F_USED = 1u << 0,   /* KV_USED */
  ATTN__CL_F_PAGED = 1u << 1,  /* PAGED */
  ATTN__CL_F_BIAS = 1u << 2,   /* HAS_BIAS, with the dtype in ATTN__CL_F_BIAS_DTYPE */
  ATTN__CL_F_SINKS = 1u << 3,  /* HAS_SINKS (backward: the dsinks kernel) */
  ATTN__CL_F_DBIAS1 = 1u << 4, /* DBIAS 1: added tile by tile, launches in order */
  ATTN__CL_F_DBIAS2 = 1u << 5, /* DBIAS 2: through row-block sums */
  ATTN__CL_F_BIAS_SHIFT = 6,   /* the bias's attn_dtype, 2 bits */
  ATTN__CL_F_DR_SHIFT = 8,     /* decode: log2 of its DR, 3 bits */
  ATTN__CL_F_SPLIT = 1u << 11  /* forward: SPLIT, each row's keys split */
};

/* Every kernel of every program, by slot; a program has those of its kind
 * and features, NULL elsewhere. */
enum attn__cl_kernel_slot {
  ATTN__CL_K_FWD,
  ATTN__CL_K_FWD_ROWS,
  ATTN__CL_K_FWD_MMA,
  ATTN__CL_K_PRE,
  ATTN__CL_K_DKDV,
  ATTN__CL_K_DQ,
  ATTN__CL_K_DKDV_ROWS,
  ATTN__CL_K_DQ_ROWS,
  ATTN__CL_K_DQ_PARTS,
  ATTN__CL_K_DKDV_MMA,
  ATTN__CL_K_DQ_MMA,
  ATTN__CL_K_ZERO,
  ATTN__CL_K_DBIAS_SUM,
  ATTN__CL_K_DSINKS,
  ATTN__CL_K_DECODE,
  ATTN__CL_K_DECODE_MMA,
  ATTN__CL_K_SPLIT_MERGE,
  ATTN__CL_K_APPEND,
  ATTN__CL_K_MERGE_MAX,
  ATTN__CL_K_MERGE_ADD,
  ATTN__CL_K_OFFSETS,
  ATTN__CL_K_NAN_SCAN,
  ATTN__CL_K_COUNT
};

/* What plan() decided for one (dtype, head-dim bucket) on a context's
 * device: a row of the tuning table fitted to the device. Kept in the
 * context for its life, so attn__plan.config may point at it. */
typedef struct attn__cl_config {
  int valid;
  int dtype, hd;
  int cls;    /* the tiles table's device class of the row (cl/plan.c) */
  int narrow; /* the device's 128-work-item row rather than its GPU row */
  attn__cl_tiles t;
  char name[ATTN__CL_FAMILIES][96]; /* by kernel family, for attn__plan.name */
} attn__cl_config;

/* The head-dim buckets a context plans for: 32, 64, 96, .. */
#define ATTN__CL_BUCKETS (ATTN_MAX_HEAD_DIM / 32)
#define ATTN__CL_MAX_PROGRAMS 256

typedef struct attn__cl_program {
  cl_context clctx;
  const attn__cl_config *config;
  int kind;          /* attn__cl_prog_kind */
  unsigned features; /* ATTN__CL_F_* */
  cl_program prog;
  cl_kernel k[ATTN__CL_K_COUNT];
} attn__cl_program;

typedef struct attn__cl_scratch {
  cl_mem mem;
  size_t bytes;
} attn__cl_scratch;

typedef struct attn__cl_impl {
  const attn__cl_api *cl;
  const attn__cl_device *dev;
  cl_context own_ctx;
  cl_command_queue own_queue;
  cl_context ctx;                               /* the one kernels and buffers use now */
  cl_command_queue queue;                       /* own_queue, or the caller's (retained) */
  attn__cl_config configs[3][ATTN__CL_BUCKETS]; /* by dtype and bucket */
  attn__cl_program progs[ATTN__CL_MAX_PROGRAMS];
  int nprog;
  attn__cl_scratch cu_q, cu_k, alibi, delta;
  attn__cl_scratch nans;        /* attn_nan_scan's flag */
  attn__cl_scratch work, work2; /* partial results: the decode's splits, dbias's row blocks,
                                 * attn_merge's sums */
} attn__cl_impl;

static inline attn__cl_impl *attn__cl_impl_of(attn_context *ctx) {
  return (attn__cl_impl *)ctx->impl;
}

/* Reports a failed OpenCL call on ctx: ATTN_ENOMEM for the out-of-memory
 * codes, else ATTN_EDEVICE. */
int attn__cl_fail(attn_context *ctx, const char *what, cl_int err);
int attn__cl_buffer_alloc(attn_context *ctx, size_t bytes, void **native);
int attn__cl_buffer_write(attn_context *ctx, void *native, size_t offset, const void *src,
                          size_t bytes);
/* A scratch buffer of at least bytes, holding src when given. */
int attn__cl_scratch_put(attn_context *ctx, attn__cl_scratch *s, size_t bytes, const void *src);

/* ---------------------------------------------------------------------- */
/* The plan (plan.c) and the launches (launch.c)                            */
/* ---------------------------------------------------------------------- */

/* Device scratch a call takes beyond its operands. */
typedef struct attn__cl_workspace {
  size_t cu;    /* each of cu_seqlens_q and _k, uploaded */
  size_t alibi; /* the slopes, uploaded */
  int64_t tq;   /* rows of delta per head: every query row of every sequence */
  size_t delta; /* backward: delta = rowsum(dO * O) of every row and head */
  size_t work;  /* forward: the splits' O parts; backward: dbias's row-block sums, or dQ's parts */
  size_t work2; /* forward: the splits' m_i and l_i */
  int dq_chunks, dq_kpc; /* backward: dQ's parts and key blocks a part (plan.c), 0 without */
} attn__cl_workspace;

/* How a forward pass runs its rows and keys: nsplit parts of each row's
 * keys; nrb blocks of dr rows (attn_decode: per key/value head, dr its DR;
 * attn_fwd: per head, dr = Br). */
typedef struct attn__cl_split {
  int nsplit, nrb, dr;
} attn__cl_split;

/* The features of a plan's program (ATTN__CL_F_*): the problem's, and a
 * decode's DR. */
unsigned attn__cl_features(attn_context *ctx, const attn__problem *pb, const attn__plan *plan);
/* The splits and row blocks of a forward plan (none for the backward). */
void attn__cl_split_of(attn_context *ctx, const attn__problem *pb, const attn__plan *plan,
                       attn__cl_split *sp);
void attn__cl_workspace_of(attn_context *ctx, const attn__problem *pb, const attn__plan *plan,
                           attn__cl_workspace *ws);

/* The backend's plan(): the config for the problem's dtype and head-dim
 * bucket, chosen once per context. */
int attn__cl_plan(attn_context *ctx, const attn__problem *pb, int backward, attn__plan *out);

/* A config of the tensor-core forward (fwd_mma.cl) whose program the
 * device's compiler did not build: the device's GPU row in its place (or
 * its own tiles for attn_fwd where none fits). 0 for other configs. */
int attn__cl_config_portable(attn_context *ctx, attn__cl_config *config);
/* The query rows a work-group of the config's dQ kernel takes (RB, BQ, or
 * bwd_mma.cl's 64): its grid, and DBIAS 2's row-block sums. */
int attn__cl_dq_rows(const attn__cl_tiles *t);
/* attn_bwd_dkdv_mma's query rows a block (its MQ) at head dim hd, with a
 * bias of bias_bytes an element (0: none). */
int attn__cl_mma_query_rows(int dtype, int hd, int bias_bytes);
/* attn_bwd_dkdv_mma's keys a work-group (its KR) at head dim hd. */
int attn__cl_mma_key_rows(int dtype, int hd);
/* Replaces a GPU config by the device's 128-work-item row, where the
 * compiled forward kernel cannot run the GPU row's work-group: the plan's
 * config pointer then names what runs. 0 when no narrower row fits. */
int attn__cl_config_narrow(attn_context *ctx, attn__cl_config *config);

/* Replaces attn_fwd_rows by attn_fwd and bwd_rows.cl's kernels by bwd.cl's
 * in a config, where the device's compiler cannot build the former. 0 when
 * the config has no other kernels. */
int attn__cl_config_tiles(attn__cl_config *config);

/* The program of (config, kind, features) in the context's cl_context,
 * built on first use (a GPU config whose forward kernel cannot run its
 * work-group narrowed once, in place); called by the plan, so that
 * launches only find it. */
int attn__cl_program_of(attn_context *ctx, attn__cl_config *config, int kind, unsigned features,
                        attn__cl_program **out);
/* The program kind of a plan's family and features. */
int attn__cl_prog_kind(int family, unsigned features);
/* The context's config for (dtype, head_dim), chosen on first use; NULL
 * with a sentence on ctx when the device can run no row. */
attn__cl_config *attn__cl_config_for(attn_context *ctx, attn_dtype dtype, int64_t head_dim);

int attn__cl_forward(attn_context *ctx, const attn__problem *pb, const attn__plan *plan);
int attn__cl_backward(attn_context *ctx, const attn__problem *pb, const attn__plan *plan);
int attn__cl_append(attn_context *ctx, const attn__problem *pb);
int attn__cl_merge(attn_context *ctx, const attn__merge *m);
void attn__cl_release_programs(attn__cl_impl *im);
/* Releases the programs built for config c, whose tiles are changing. */
void attn__cl_drop_programs(attn__cl_impl *im, const attn__cl_config *c);

/* The tiles table's row for config c's device class, dtype and bucket. */
const attn__cl_tiles *attn__cl_table_row(const attn__cl_config *c);
/* Makes t, fitted to the device, config c's tiles (its programs go):
 * ATTN_OK, or ATTN_EUNSUPPORTED when t does not fit the device. */
int attn__cl_config_use(attn_context *ctx, attn__cl_config *c, const attn__cl_tiles *t);

/* attn_tune (tune.c): the variations of the table row that attn_tune
 * measures for (dtype, head_dim); making variation i the context's tiles;
 * storing it for the device beside the program cache. */
int attn__cl_tune_count(attn_context *ctx, attn_dtype dtype, int64_t head_dim);
int attn__cl_tune_use(attn_context *ctx, attn_dtype dtype, int64_t head_dim, int i);
int attn__cl_tune_keep(attn_context *ctx, attn_dtype dtype, int64_t head_dim, int i);
/* The tiles stored for (dtype, bucket hd) on the context's device over t,
 * where their kernels' shapes are t's (the table's row of the device's
 * class); t unchanged when none are stored. */
void attn__cl_tuned_tiles(attn_context *ctx, int dtype, int hd, attn__cl_tiles *t);

#endif /* ATTN_CL_H */
