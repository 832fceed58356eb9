// Quantized weights: the formats, and their host-side quantizer and
// dequantizer. The kernels read them through the same Problem and run() as
// 16-bit weights: set Problem::quantized, quant and scale_dtype, and pass the
// scales and biases in Arguments::w_scales / w_biases (gatedmlp.hpp).
//
// Affine (MLX's format, mlx.core.quantize(w, group_size, bits)): each row of a
// [rows, K] weight is cut into groups of `group_size` consecutive elements
// along K, and every group has its own scale and bias:
//
//     w[r, k] = q[r, k] * scales[r, k / group_size] + biases[r, k / group_size]
//
// with q an unsigned `bits`-bit integer. q is packed 32 / bits per uint32 word,
// the first element of K in the lowest bits: row r's words are
// wq[r, 0 .. K * bits / 32). scales and biases are [rows, K / group_size], in
// the dtype of the weights they came from.
//
// MXFP4 (OCP microscaling, as gpt-oss ships its experts and MLX's "mxfp4"
// mode): 4-bit e2m1 values (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives),
// packed as above (two per byte, the even element in the low nibble: the
// bytes of gpt-oss's `*_blocks`), and one e8m0 scale byte per group of 32
// along K (w = value * 2^(scale - 127); gpt-oss's `*_scales`). No biases.
//
// Repacked affine 4-bit (QuantFormat::repacked): the same codes, scales and
// biases, with the words in an order in which every k16 step of the decode
// kernel's mma lies in one group (repack_quantized below). Each row's K is cut into chunks of 128
// elements, 16 words, the last padded with zero words: a row holds
// ceil(K / 128) * 16 words. Inside a chunk, word 4 wd + t of the
// checkpoint's order (elements 32 wd + 8 t ... 32 wd + 8 t + 7) moves to
// word 4 t + wd, and its nibbles are reordered so that nibble i holds
// element 2i and nibble i + 4 element 2i + 1 (i = 0 ... 3). On this order
// the kernel applies the scales and biases to its fp32 sums, so the weights
// enter exactly (q * scale + bias is not rounded to X's type).
//
// Tiled affine 4-bit (QuantFormat::tiled): the same codes, scales and
// biases, ordered for the decode kernel's loads (tile_quantized below). A
// [rows, K] weight (rows a multiple of 16; K padded with zero codes, scales
// and biases to whole k-blocks of 128) is cut into tiles of 16 rows x 128
// elements: tile (c, kb) is rows 16c ... 16c + 15, each its 16
// checkpoint-order words of k-block kb (1 KB), the tiles in the order
// (c, kb). The scales and biases are one array of (scale, bias) pairs (no
// biases array: Arguments::w_biases is null), ordered (c, group, row % 8,
// row / 8 % 2). A gate/up weight must first be in the fused order with
// group 8, gate first (row 16c + h * 8 + j: half h of column 8c + j), so that
// a tile is 8 columns' gate and up rows; a down projection's rows are tiled
// as they are (a tile: 16 output columns). Words per row: ceil(K / 128) * 16;
// quant_groups_per_row, the pair array's elements per row: 2 * ceil(K / 128)
// * 128 / group_size.
//
// FP8 e4m3fn weights, as FP8 checkpoints store them: one byte per weight
// (packed four to a word, the first element of K in the lowest byte: the
// bytes of a [rows, K] float8_e4m3fn tensor), times a float scale per block
// of row_block rows x group_size elements of K: per tensor (0, 0), per
// output channel (row_block 1, group_size 0: `weight_scale` [N, 1]) or
// DeepSeek-V3's 128 x 128 blocks (`weight_scale_inv` [ceil(N / 128),
// ceil(K / 128)], a multiplier despite its name). The kernels multiply the
// exact e4m3 values and apply the scales to fp32 sums. No biases.
#pragma once

#include <cstdint>
#include <string>

#include "gatedmlp/gatedmlp.hpp"

namespace gatedmlp {

// QuantMode and QuantFormat live in gatedmlp.hpp: a Problem carries them.

// The format's own rules (bits, group size), and K against them: K must be a
// positive multiple of the group size. Names the argument and the values.
Status check_quant_format(const QuantFormat& format, int64_t k);

// Sizes of one quantized row of K elements: uint32 words (repacked and
// tiled: whole chunks of 128 elements), and groups (tiled: of whole chunks; the
// scales and biases per row of the scale arrays); and the rows of the scale
// arrays for `rows` weight rows (rows, except FP8's row blocks).
int64_t quant_words_per_row(const QuantFormat& format, int64_t k);
int64_t quant_groups_per_row(const QuantFormat& format, int64_t k);
int64_t quant_scale_rows(const QuantFormat& format, int64_t rows);

// Quantizes a [rows, K] row-major host array `w` of `dtype` (bf16, fp16, fp32)
// into wq [rows, quant_words_per_row] and scales, biases [rows,
// quant_groups_per_row], all host memory: scales and biases of `dtype`
// (affine), or scales as e8m0 bytes (uint8_t) and biases null (mxfp4), or
// (tiled) the tiled words and (scale, bias) pairs in scales, biases null.
// Bit for bit what mlx.core.quantize returns on MLX's CPU backend.
// Affine: the group's min and max in
// fp32; the scale (max - min) / (2^bits - 1), at least 1e-7, negative unless
// the min has the larger magnitude; the edge of larger magnitude kept exact
// (scale = edge / round(edge / scale), bias = edge) unless it rounds to 0
// (then bias = 0); q = clamp(round((w - bias) / scale), 0, 2^bits - 1), every
// rounding to nearest even. MXFP4: the scale is the smallest power of two
// 2^e >= amax / 6 (e clamped to [-127, 127]; 2^0 for an all-zero group), and
// each w / 2^e goes to the e2m1 value nearest it, a tie to the one of smaller
// magnitude (MLX's choice), a value that rounds to zero to +0. Empty input
// (rows = 0) is not an error.
Status quantize_host(const QuantFormat& format, DType dtype, int64_t rows, int64_t k, const void* w, uint32_t* wq,
                     void* scales, void* biases);

// The inverse map: w [rows, K] of out_dtype = q * scale + bias (affine; scales
// and biases of `dtype`; tiled: the pairs in scales, biases null), value *
// 2^(scale - 127) (mxfp4; `dtype` unused,
// biases null) or e4m3 value * scale (fp8_e4m3; scales of `dtype`, biases
// null), computed in fp32 (affine: one fused multiply-add) and rounded to
// out_dtype: for affine and mxfp4 exactly the weights the kernels multiply
// with (the FP8 kernels multiply the e4m3 values and scale the sums).
// quantize_host takes affine and mxfp4 (FP8 weights come quantized).
Status dequantize_host(const QuantFormat& format, DType dtype, DType out_dtype, int64_t rows, int64_t k,
                       const uint32_t* wq, const void* scales, const void* biases, void* w);

// Converts the words of `rows` quantized rows of K elements between the
// checkpoint's order and the repacked one: `from` and `to` must be the same
// affine 4-bit format but for `repacked` (equal: a copy). src and dst are
// dense, quant_words_per_row(from, k) and quant_words_per_row(to, k) words
// per row, and must not overlap. Repacking then unrepacking gives the words
// back bit for bit. repack_quantized works on host memory,
// repack_quantized_device on device memory, asynchronously on `stream`.
// Empty input (rows = 0) is not an error.
Status repack_quantized(const QuantFormat& from, const QuantFormat& to, int64_t rows, int64_t k, const uint32_t* src,
                        uint32_t* dst);
Status repack_quantized_device(const QuantFormat& from, const QuantFormat& to, int64_t rows, int64_t k,
                               const uint32_t* src, uint32_t* dst, cudaStream_t stream);

// Converts affine 4-bit weights ([rows, K] words, scales and biases of
// `dtype`, the checkpoint's order: `format` has tiled = false) into the
// tiled order (words and (scale, bias) pairs: rows x quant_words_per_row and
// rows x quant_groups_per_row of the tiled format, padding zero), and back.
// rows must be a multiple of 16. Host memory, no overlap. Tiling then
// untiling gives the arrays back bit for bit. Empty input (rows = 0) is not
// an error.
Status tile_quantized(const QuantFormat& format, DType dtype, int64_t rows, int64_t k, const uint32_t* wq,
                      const void* scales, const void* biases, uint32_t* tiled_wq, void* tiled_scales);
Status untile_quantized(const QuantFormat& format, DType dtype, int64_t rows, int64_t k, const uint32_t* tiled_wq,
                        const void* tiled_scales, uint32_t* wq, void* scales, void* biases);

const char* to_string(QuantMode);
std::string to_string(const QuantFormat&);

}  // namespace gatedmlp
