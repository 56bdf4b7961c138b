/*
 * The CPU backend's private interface: what the files of cpu/ share
 * (cpu.c, cpu_tile.c, cpu_gemm.c, cpu_bf16*.c, cpu_forward.c,
 * cpu_backward.c, cpu_tune.c), and what test_products reaches. Nothing else
 * outside cpu/ includes it.
 *
 * Every pass works on tiles: Br query rows or Bc key rows of one head,
 * gathered with the problem's strides into a contiguous float32 array of
 * row length d (which also turns f16/bf16 into f32 and makes any stride
 * layout look the same; f32 rows with unit column stride are used in
 * place), multiplied on the calling thread (the library's FMA kernels or
 * OpenBLAS sgemm; a bf16 forward may keep bf16 tiles for the CPU's bf16
 * instructions or OpenBLAS sbgemm), and scattered back in the problem's
 * dtype.
 */
#ifndef ATTN_CPU_INTERNAL_H
#define ATTN_CPU_INTERNAL_H

#include "rules.h"

/* The elementwise loops over a tile are built for AVX-512, AVX2 and the
 * baseline, picked at load time (target_clones: see cpu_tile.c).
 * ThreadSanitizer instruments the ifunc's resolver, which the loader runs
 * before TSan's runtime is up (a crash at load): a TSan build takes the
 * baseline. */
#if defined(__SANITIZE_THREAD__)
#define ATTN__CPU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ATTN__CPU_TSAN 1
#endif
#endif
#if defined(__x86_64__) && defined(__ELF__) && defined(__has_attribute) && !defined(ATTN__CPU_TSAN)
#if __has_attribute(target_clones)
#define ATTN__CPU_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef ATTN__CPU_SIMD_CLONES
#define ATTN__CPU_SIMD_CLONES
#endif

/* The kernels of the plan (attn__plan.kernel) and a row of the tile
 * table in cpu.c (attn__plan.config). */
enum attn__cpu_kernel { ATTN__CPU_BLOCKWISE_FORWARD, ATTN__CPU_BLOCKWISE_BACKWARD };

/* The products of a forward of bf16 inputs (a config row's `products`;
 * which a CPU gets is cpu.c's rule, attn_tune may measure the others).
 * f16 and f32 always take the first. */
enum attn__cpu_products {
  ATTN__CPU_PRODUCTS_F32,   /* tiles converted to f32, f32 products (the config's fma) */
  ATTN__CPU_PRODUCTS_BF16,  /* bf16 tiles, the CPU's bf16 instructions (AMX, AVX512_BF16) */
  ATTN__CPU_PRODUCTS_SBGEMM /* bf16 tiles, OpenBLAS cblas_sbgemm */
};

typedef struct attn__cpu_config {
  attn_dtype dtype;
  int max_head_dim; /* the row serves head dimensions up to this one */
  int br;           /* Br: query rows per tile, at most ATTN__CPU_TILE_MAX */
  int bc;           /* Bc: key rows per tile, idem */
  /* Key splitting chosen by the plan (num_splits 0): split until there are
   * split_fill work items per thread, each part at least one key block;
   * and at most split_workspace bytes of partial results, whatever
   * num_splits asks for. */
  int split_fill;
  /* Query blocks of at most this many rows per head take the products of
   * few rows (attn__cpu_qk_few), in the forward and the backward alike. */
  int few_rows;
  size_t split_workspace;
  int products; /* enum attn__cpu_products */
  /* f32 products: 1 the library's FMA kernels (attn__cpu_sgemm_native), 0
   * OpenBLAS. */
  int fma;
  char forward_name[96], backward_name[96]; /* for attn__plan.name */
} attn__cpu_config;

/* How the forward cuts a problem into work items: tiles of `heads` query
 * heads sharing one kv head (GQA packing: each K/V block is loaded and
 * converted once for all of them) times `rows` query rows of each, and
 * each tile's keys in `splits` parts merged by their lse. One function
 * (attn__cpu_schedule, cpu.c) decides it for the plan, which sizes the
 * workspace by it, and for the forward, which runs it. */
typedef struct attn__cpu_schedule {
  int heads;     /* 1: no packing */
  int rows;      /* heads * rows <= Br */
  int splits;    /* 1: no splitting */
  int products;  /* the row's, where the problem can take them (bf16, even d) */
  int64_t tiles; /* tiles over all sequences and heads */
  /* The f32 products (attn__cpu_row_gemm). */
  void (*gemm)(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
               const float *b, int ldb, float beta, float *c, int ldc);
} attn__cpu_schedule;

/* The largest Br or Bc of the table and of attn_tune's variations: small
 * per-row arrays of the tile functions live on the stack with this size. */
#define ATTN__CPU_TILE_MAX 128

/* Aligned host memory for tiles and buffers (64 bytes: one cache line, one
 * AVX-512 register). NULL on failure; free with attn__cpu_free. */
void *attn__cpu_alloc(size_t bytes);
void attn__cpu_free(void *p);

/* C = alpha * op(A) op(B) + beta * C, row-major, never spawning OpenBLAS
 * threads (see cpu_tile.c for why and how). ta/tb: 0 = as stored, 1 =
 * transposed. */
void attn__cpu_gemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                    const float *b, int ldb, float beta, float *c, int ldc);

/* The same through the library's own FMA kernels (cpu_gemm.c), never with
 * tb = 1: the function for this CPU, or NULL where it has no FMA units the
 * build has code for. A config's `fma` picks between the two
 * (attn__cpu_row_gemm). */
typedef void attn__cpu_sgemm_fn(int ta, int tb, int m, int n, int k, float alpha, const float *a,
                                int lda, const float *b, int ldb, float beta, float *c, int ldc);
attn__cpu_sgemm_fn *attn__cpu_sgemm_native(void);
attn__cpu_sgemm_fn *attn__cpu_row_gemm(const attn__cpu_config *cfg);

/* Rows [row, row + nr) of head h of sequence b of tensor t into dst (row
 * length ld >= d, f32). row counts from the tensor's first row, so it
 * already includes attn__row0_q/attn__row0_k of a varlen sequence. */
void attn__cpu_load(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t row,
                    int64_t nr, int64_t h, float *dst, int64_t ld);
/* Like attn__cpu_load, transposed: element c of row r goes to dst[c * ld +
 * r]. Both operands of S = Q K^T have d contiguous, which makes it an "NT"
 * product, and OpenBLAS 0.3.21 runs a 64x64x64 NT sgemm at 85 GFLOP/s but
 * NN and TN at 111-112 (its small-matrix kernels, no packing; measured on
 * one core of the build host). So Q is stored transposed (once per forward
 * unit; once per problem in the backward, with dO) and every product of
 * the inner loops is NN or TN. */
void attn__cpu_load_t(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t row,
                      int64_t nr, int64_t h, float *dst, int64_t ld);
/* Rows of an input tile for the products: a pointer straight into t's
 * memory when t is f32 with unit column stride (nothing to convert or
 * gather: sgemm takes the row stride as its leading dimension), otherwise
 * attn__cpu_load into scratch (row length d). *ld receives the row stride. */
const float *attn__cpu_view(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t row,
                            int64_t nr, int64_t h, float *scratch, int *ld);
/* The same for key rows of k or v (and of dk, dv): j0 is sequence-local,
 * and each row's address comes from attn__key_row, so bshd, varlen and
 * paged caches share these. A view is in place when the rows are f32 with
 * unit column stride on one page (or unpaged). */
void attn__cpu_load_keys(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t j0,
                         int64_t nr, int64_t h, float *dst, int64_t ld);
/* Whether nr rows ss elements of size bytes apart alias in L1 (cpu_tile.c),
 * and are then copied rather than read in place. */
int attn__cpu_rows_alias(int64_t ss, int size, int64_t nr);
/* Whether attn__cpu_view_keys copies blocks of nr key rows of t (pages
 * aside: a block across two pages is copied whatever this says). */
int attn__cpu_keys_copied(const attn__problem *pb, const attn__tensor *t, int64_t nr);
const float *attn__cpu_view_keys(const attn__problem *pb, const attn__tensor *t, int64_t b,
                                 int64_t j0, int64_t nr, int64_t h, float *scratch, int *ld);
void attn__cpu_store_keys(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t j0,
                          int64_t nr, int64_t h, const float *src, int64_t ld);
/* Row `row` of head h of sequence b of an f32 tensor with unit column
 * stride and row stride ss in [d, INT_MAX] (so that sgemm can address its
 * rows in place, *ld = ss), else NULL. Whether it is NULL depends on the
 * tensor only, not on b, row or h. */
float *attn__cpu_inplace(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t row,
                         int64_t h, int *ld);
/* The inverse of attn__cpu_load: src (f32, row length ld) into t's dtype, rounding to
 * nearest even. */
void attn__cpu_store(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t row,
                     int64_t nr, int64_t h, const float *src, int64_t ld);
/* lse (f32, no column) of rows [row, row + nr) of head h of sequence b, as
 * (hi, lo) pairs: lo is 0 when the tensor has plain lse, and is not stored
 * there. */
void attn__cpu_load_lse(const attn__problem *pb, int64_t b, int64_t row, int64_t nr, int64_t h,
                        float *hi, float *lo);
void attn__cpu_store_lse(const attn__problem *pb, int64_t b, int64_t row, int64_t nr, int64_t h,
                         const float *hi, const float *lo);

/* S^T = scale K Q^T for a tile of few query rows per head, read straight
 * from k: keys [j0, j0 + bc) of sequence b down; across, the nr rows of
 * each query head of [h0, h0 + nh) (column x * nr + r: row r of head h0 +
 * x, whichever kv head it reads), row stride ldq in q (f32); at st[key * ld
 * + column]. Each element is one dot product taken in the same steps
 * whatever the tile holds; sgemm's are not (an element of a 64 x n x 128
 * product changes with n in a third of the elements, measured with
 * OpenBLAS 0.3.21), so the forward can compute the scores of many heads at
 * once and the backward those of one, and agree to the bit. Which query
 * blocks take this path is the config's few_rows, in both passes. v, when
 * not NULL, is the values the caller reads next (attn__cpu_pv_few), which
 * may be fetched meanwhile. Keys are
 * converted row by row in L1, with no tile gathered, and a tile that spans
 * every kv head reads k's rows whole, in address order: a decoding step
 * streams the cache at memory speed. */
void attn__cpu_qk_few(const attn__problem *pb, const attn__tensor *t, const attn__tensor *v,
                      int64_t b, int64_t j0, int bc, int64_t h0, int nh, int nr, const float *q,
                      int64_t ldq, float *st, int ld);
/* O += P V, the same way: P^T (keys down, the tile's columns across, row
 * stride ld), V read straight from v, O f32 with a row of d per column.
 * Where attn__cpu_few_pairs says so, P comes as the softmax's pairs
 * instead (pairs, not NULL, row stride ld; pt unread), rounded to bf16. */
void attn__cpu_pv_few(const attn__problem *pb, const attn__tensor *t, int64_t b, int64_t j0, int bc,
                      int64_t h0, int nh, int nr, const float *pt, const uint32_t *pairs, int ld,
                      float *o);
int attn__cpu_few_pairs(const attn__problem *pb);
/* Those products on AMX's tiles (cpu_few_amx.c), bf16 with d a multiple
 * of 32. S^T: nkv kv heads, head i's key rows k[a] + i hstep (a < bc, at
 * any addresses) against columns [cols[i], cols[i + 1]): st[a ld + c] =
 * scale k.q[c], Q^T in pairs (qp[p ldq + c], 16 columns readable from
 * each column a tile starts at); the value rows v (laid out as k), when
 * not NULL, and the key rows k[bc..kn), the sequence's next, fetched
 * meanwhile. O += P V: one kv head, n columns, P in the
 * softmax's pairs (pairs[p ldp + c]), V's rows v[0..bc), O n rows of d.
 * attn__cpu_amx: whether this process may use the tiles (cpu_bf16.c). */
void attn__cpu_qk_few_amx(const uint16_t *const *k, const uint16_t *const *v, ptrdiff_t hstep,
                          int nkv, const int *cols, int bc, int kn, int d, const uint32_t *qp,
                          int ldq, float scale, float *st, int ld);
void attn__cpu_pv_few_amx(const uint16_t *const *v, int bc, int d, const uint32_t *pairs, int ldp,
                          int n, float *o);
int attn__cpu_amx(void);

/* Turns s = scale * q.k of a transposed tile (keys [j0, j0 + bc) down,
 * query rows [i0, i0 + br) of query head h of sequence b across, element
 * (r, c) at st[c * ld + r]) into the final scores: attn__score_scaled and
 * then the bias where the key is visible, -inf where not. Forward and
 * backward both call this, so the backward recomputes the forward's scores
 * the same way. When tanh_out is not NULL (backward with softcap), it
 * receives tanh(s / softcap), laid out like st, for attn__score_grad. nq,
 * nk are the sequence's lengths. */
void attn__cpu_scores(const attn__problem *pb, int64_t b, int64_t h, int64_t i0, int br, int64_t j0,
                      int bc, int64_t nq, int64_t nk, float *st, int ld, float *tanh_out);

/* One step of the online softmax on a transposed score tile st (bc rows of
 * keys x br columns of queries, row stride ld): with m, l the running row
 * max and sum of each query, sets m = max(m, column max), alpha = exp(m_old
 * - m), P = exp(st - m) and l = alpha l + column sum of P. A query that has
 * seen no key keeps m = -inf, l = 0 and gets P = 0, alpha = 0. P goes to st
 * itself, or with pairs (bf16 products: the CPU's instructions) straight
 * into the P V product's operand, rounded to bf16 in pairs of keys as
 * attn__cpu_bf16_kernel takes it (pairs[p * ldp + r] = (P^T[2p][r],
 * P^T[2p + 1][r]), zero past the last key), st left as it was. */
void attn__cpu_softmax_cols(float *st, int bc, int br, int ld, float *m, float *l, float *alpha,
                            uint32_t *pairs, int ldp);
/* O's correction by each query row's alpha after a softmax step: O^T (ot:
 * d rows of br, ld apart) column by column, else O (o: br rows of d) row
 * by row, rows whose alpha is 1 left as they are. */
void attn__cpu_rescale_o(float *ot, float *o, int d, int br, int ld, const float *alpha);

/* Round to nearest even, NaN kept NaN, without a branch (loops over it
 * vectorize): attn__f32_to_bf16's result, in the low 16 bits. */
static inline uint32_t attn__cpu_bf16_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
  return (u & 0x7fffffffu) > 0x7f800000u ? q : r;
}

/* P^T = exp((S^T - hi) - lo) in place, for a transposed tile (rows of keys
 * x cols of queries, lse = hi + lo per column); queries with lse = -inf (no
 * visible key) get P = 0. */
void attn__cpu_exp_cols(float *st, int rows, int cols, int ld, const float *hi, const float *lo);

/* dS^T = P^T * (dP^T - D) in place of dP^T, on a transposed tile (D per
 * column), through attn__score_grad with th (tanh from attn__cpu_scores)
 * when th is not NULL (softcap). */
void attn__cpu_dsoftmax_cols(const float *p, float *dp, const float *th, float softcap, int rows,
                             int cols, int ld, const float *dd);

/* dP^T times softcap's derivative in place (attn__score_grad, th from
 * attn__cpu_scores): attn__cpu_dsoftmax_cols's last step, for when dS is
 * wanted before it (dbias). */
void attn__cpu_score_grad_cols(float *dp, const float *th, float softcap, int rows, int cols,
                               int ld);

/* dst[c * rs + a * cs] += st[a * ld + c] for a transposed tile (rows of
 * keys a, cols of queries c): a dbias tile. rs = 0 (the bias broadcasts
 * over query rows) sums each key's column first, in row order. */
void attn__cpu_add_cols(const float *st, int rows, int cols, int ld, float *dst, int64_t rs,
                        int64_t cs);

/* Work is split into units (sequence, head, block of rows, or of keys when
 * by_keys). units[b] is the first unit of sequence b for a given block size
 * and head count; the array has batch + 1 entries. attn__cpu_unit finds unit
 * u's sequence *b, head *h and first row *i0 of its block, and returns the
 * block's length. */
int64_t *attn__cpu_units(const attn__problem *pb, int by_keys, int64_t heads, int64_t block);
int attn__cpu_unit(const attn__problem *pb, const int64_t *units, int by_keys, int64_t block,
                   int64_t u, int64_t *b, int64_t *h, int64_t *i0);

/* The OpenMP threads a pass may use on the calling thread: omp_get_max_threads(),
 * or fewer when the system would not create that many (see cpu.c). */
int attn__cpu_threads(void);

/* The forward's schedule for a problem, with nthreads threads. */
attn__cpu_schedule attn__cpu_schedule_forward(const attn__problem *pb, const attn__cpu_config *cfg,
                                              int nthreads);

/* The passes, with the tiles of a row of the table, and the memory each
 * allocates (bytes: the plan's workspace). */
int attn__cpu_forward(attn_context *ctx, const attn__problem *pb, const attn__cpu_config *cfg,
                      const attn__cpu_schedule *sc);
int attn__cpu_backward(attn_context *ctx, const attn__problem *pb, const attn__cpu_config *cfg);
size_t attn__cpu_forward_workspace(const attn__problem *pb, const attn__cpu_config *cfg,
                                   const attn__cpu_schedule *sc, int nthreads);
size_t attn__cpu_backward_scratch(const attn__problem *pb, const attn__cpu_config *cfg);

/* The context's tile table (cpu.c): the built-in rows, or the tiles attn_tune
 * measured fastest on this machine (cpu_tune.c). Rows run from the f32
 * ones to the bf16 ones, each dtype's by growing head dimension. */
#define ATTN__CPU_ROWS 9
/* C = alpha A B + beta C (beta 0 or 1), C f32 m x n (row stride ldc), A
 * bf16 m x 2 kp (row stride lda, even), and B kp x n pairs: element (p, j)
 * holds B's (2p, j) in its low 16 bits and (2p + 1, j) in its high ones
 * (row stride ldb). An odd inner dimension is padded with a zero. */
typedef void attn__cpu_bf16_kernel(int m, int n, int kp, float alpha, const uint16_t *a, int lda,
                                   const uint32_t *b, int ldb, float beta, float *c, int ldc);
typedef struct attn__cpu_impl {
  attn__cpu_config rows[ATTN__CPU_ROWS];
  /* ATTN__CPU_PRODUCTS_BF16's kernel: the CPU's (attn__cpu_bf16_kernel_native), or
   * the one attn__cpu_products_force put in its place; NULL for none. */
  attn__cpu_bf16_kernel *bf16_kernel;
  /* The passes' scratch, kept from call to call (attn__cpu_workspace). */
  void *ws;
  size_t ws_bytes;
} attn__cpu_impl;
/* At least `bytes` of 64-byte aligned scratch for one call on ctx (calls on
 * a context never overlap), kept for the next call and freed with the
 * context; NULL when memory runs out. */
void *attn__cpu_workspace(attn_context *ctx, size_t bytes);
/* The row for (dtype, head_dim) of ctx's table. */
attn__cpu_config *attn__cpu_row(attn_context *ctx, attn_dtype dtype, int64_t head_dim);
/* Sets a row's tiles and products, and the names the plan reports. */
void attn__cpu_row_set(attn_context *ctx, attn__cpu_config *row, int br, int bc, int products,
                       int fma);

/* Makes ctx's bf16 rows take `products`, through `kernel` for
 * ATTN__CPU_PRODUCTS_BF16 (NULL: the CPU's own): the tests run a path this
 * CPU would not be given, and attn_tune measures the ones it has.
 * ATTN_EUNSUPPORTED, with a sentence, for products this build or CPU
 * cannot run. */
int attn__cpu_products_force(attn_context *ctx, int products, attn__cpu_bf16_kernel *kernel);
/* The products ctx's CPU and build can run, as bits (1 << products). */
unsigned attn__cpu_products_usable(attn_context *ctx);

/* bf16 tiles (cpu_bf16.c). load/view: as attn__cpu_load and
 * attn__cpu_view_keys, for bf16 tensors, without conversion (keys: j0
 * sequence-local, through attn__key_row). */
void attn__cpu_load_bf16(const attn__problem *pb, const attn__tensor *t, int keys, int64_t b,
                         int64_t row, int64_t nr, int64_t h, uint16_t *dst, int64_t ld);
/* Whether attn__cpu_view_keys_bf16 copies blocks of nr key rows of t
 * (pages aside, as attn__cpu_keys_copied). */
int attn__cpu_keys_copied_bf16(const attn__problem *pb, const attn__tensor *t, int64_t nr);
const uint16_t *attn__cpu_view_keys_bf16(const attn__problem *pb, const attn__tensor *t, int64_t b,
                                         int64_t j0, int64_t nr, int64_t h, uint16_t *scratch,
                                         int *ld);
/* The B operand in pairs (attn__cpu_bf16_kernel) of Q^T, from nr rows of q
 * (d even): qp[p * ldp + r] = (q[r][2p], q[r][2p + 1]). */
void attn__cpu_bf16_pairs_t(const uint16_t *q, int64_t ldq, int nr, int d, uint32_t *qp, int ldp);
/* The P V product of the bf16 products is taken as O^T += V^T P^T, whose
 * operands need no transposing per tile: P^T (rows of keys, row stride ld,
 * f32) rounded to bf16 as it is (out[a * ldo + r]) for sbgemm, or in pairs
 * of rows for the CPU's instructions by the softmax itself
 * (attn__cpu_softmax_cols); and V^T of `rows` rows of v (vt[c * ldt + a],
 * zero for a in [rows, ldt)), made once per call. */
void attn__cpu_bf16_round(const float *pt, int rows, int cols, int ld, uint16_t *out, int ldo);
void attn__cpu_bf16_transpose(const uint16_t *v, int64_t ldv, int rows, int d, uint16_t *vt,
                              int ldt);
/* The kernel of the CPU's bf16 instructions (AMX's tiles where the CPU has
 * them and Linux lets the process use them, else AVX512_BF16), NULL where
 * it has none or the build has no code for it; whether the CPU has bf16 dot products at all
 * (AVX512_BF16 or AMX-BF16), which OpenBLAS's sbgemm needs to pay; whether
 * the library was linked with an OpenBLAS that has cblas_sbgemm. */
attn__cpu_bf16_kernel *attn__cpu_bf16_kernel_native(void);
/* "AMX", "vdpbf16ps": for the plan's name. */
const char *attn__cpu_bf16_kernel_name(attn__cpu_bf16_kernel *k);
int attn__cpu_bf16_hardware(void);
int attn__cpu_sbgemm_built(void);
/* cblas_sbgemm(RowMajor, ta ? Trans : NoTrans, tb ? Trans : NoTrans, ...)
 * on the calling thread (as attn__cpu_gemm); only where ATTN_HAVE_SBGEMM is
 * defined. */
void attn__cpu_sbgemm(int ta, int tb, int m, int n, int k, float alpha, const uint16_t *a, int lda,
                      const uint16_t *b, int ldb, float beta, float *c, int ldc);

/* attn_tune (cpu_tune.c): the tile variations, and the tuned rows read at
 * context creation from the file attn__cpu_tune_keep writes. */
int attn__cpu_tune_count(attn_context *ctx, attn_dtype dtype, int64_t head_dim);
int attn__cpu_tune_use(attn_context *ctx, attn_dtype dtype, int64_t head_dim, int i);
int attn__cpu_tune_keep(attn_context *ctx, attn_dtype dtype, int64_t head_dim, int i);
void attn__cpu_tuned_rows(attn_context *ctx);

/* The cache append (cpu_cache.c) and attn_merge (cpu_merge.c). */
int attn__cpu_append(attn_context *ctx, const attn__problem *pb);
int attn__cpu_merge(attn_context *ctx, const attn__merge *m);

#endif /* ATTN_CPU_INTERNAL_H */
