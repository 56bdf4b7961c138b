/*
 * The Hopper forward's f16 and bf16 rows (the kernels: hopper_fwd.cuh; f32
 * as TF32: hopper_fwd_tf32.cu).
 */
#include "hopper_fwd.cuh"

namespace attn_hopper {

/* The rows, <head dim, Bc, STAGES (K/V slots), QS (Q slots), NC (consumer
 * warpgroups, 64 query rows each)>, the first whose shared memory fits
 * taken. Bc = 128 for d <= 128 (FlashAttention-3's tile for these dims)
 * and 64 at d = 256, where O alone holds 128 registers a thread. At d = 64
 * and from kMinRows3 query rows on, three consumers share each K/V block
 * (192 query rows, FlashAttention-3's tile there): the block's bytes and
 * the producer's work spread over half as many rows again, and the softmax
 * of one consumer has two others' GEMMs to hide under. Two Q slots let a
 * tile's loads run under the previous tile (short sequences, persistent
 * blocks): at d = 64 with four K/V slots, two tiles of two blocks; at
 * d <= 128 two K/V slots (192 KB of the H200's 227). A bias's tiles (64 KB
 * at two slots, 96 KB at d = 64's 192 rows) leave d = 64 two K/V slots and
 * d <= 128 one Q slot; d = 256 has one (193 KB). d = 96 runs d = 128's
 * tiles (its P V computes the padding's columns too). d = 128 tries
 * FlashAttention-3's 176-key blocks first (208 KB with one Q slot; 3-8 %
 * faster than 128 unmasked on the H200). d = 64 below kMinRows3 query rows
 * tries 208-key blocks (137 KB with two Q and two K/V slots; four do not
 * fit, and two hold two tiles of one block): a short sequence such as
 * ViT's 197 tokens is then one key block instead of two, a fifth fewer key
 * columns through both products and one softmax pass a tile instead of
 * two. Neither takes a bias (its tiles are whole 64-key blocks); both fall
 * back to 128 where they do not fit or the mask's padding costs more
 * (kMinKeysMaskedWide). */
/* Each shape a row for f16 and one for bf16, in this order. */
/* clang-format off */
#define ATTN_HOPPER_FWD_ROWS(T, dtype) \
  fwd_row<T, 64, 128, 4, 2, 3>("Hopper forward (wgmma), " dtype ", d = 64, 192 x 128 tiles, 4 K/V + 2 Q slots"), \
  fwd_row<T, 64, 128, 2, 2, 3>("Hopper forward (wgmma), " dtype ", d = 64, 192 x 128 tiles, 2 K/V + 2 Q slots"), \
  fwd_row<T, 64, 208, 2, 2, 2>("Hopper forward (wgmma), " dtype ", d = 64, 128 x 208 tiles, 2 K/V + 2 Q slots"), \
  fwd_row<T, 64, 128, 4, 2, 2>("Hopper forward (wgmma), " dtype ", d = 64, 128 x 128 tiles, 4 K/V + 2 Q slots"), \
  fwd_row<T, 64, 128, 2, 2, 2>("Hopper forward (wgmma), " dtype ", d = 64, 128 x 128 tiles, 2 K/V + 2 Q slots"), \
  fwd_row<T, 96, 128, 2, 2, 2>("Hopper forward (wgmma), " dtype ", d = 96, 128 x 128 tiles, 2 K/V + 2 Q slots"), \
  fwd_row<T, 96, 128, 2, 1, 2>("Hopper forward (wgmma), " dtype ", d = 96, 128 x 128 tiles, 2 K/V + 1 Q slot"), \
  fwd_row<T, 128, 176, 2, 1, 2>("Hopper forward (wgmma), " dtype ", d = 128, 128 x 176 tiles, 2 K/V + 1 Q slot"), \
  fwd_row<T, 128, 128, 2, 2, 2>("Hopper forward (wgmma), " dtype ", d = 128, 128 x 128 tiles, 2 K/V + 2 Q slots"), \
  fwd_row<T, 128, 128, 2, 1, 2>("Hopper forward (wgmma), " dtype ", d = 128, 128 x 128 tiles, 2 K/V + 1 Q slot"), \
  fwd_row<T, 256, 64, 2, 1, 2>("Hopper forward (wgmma), " dtype ", d = 256, 128 x 64 tiles, 2 K/V + 1 Q slot")
/* clang-format on */
constexpr attn__cuda_config fwd_rows[] = {ATTN_HOPPER_FWD_ROWS(__half, "f16"),
                                          ATTN_HOPPER_FWD_ROWS(__nv_bfloat16, "bf16")};
#undef ATTN_HOPPER_FWD_ROWS

}  // namespace attn_hopper

extern "C" size_t attn__cuda_hopper_fwd_bias_smem(const attn__cuda_config *c) {
  return attn_hopper::bias_smem(c->bc, c->stages, c->br);
}

extern "C" const attn__cuda_rows attn__cuda_hopper_forward_rows = {
    attn_hopper::fwd_rows, (int)(sizeof attn_hopper::fwd_rows / sizeof attn_hopper::fwd_rows[0])};
