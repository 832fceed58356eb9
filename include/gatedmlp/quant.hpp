// Quantized weights: the formats, and their host-side quantizer and
// dequantizer. The kernels that read them arrive as siblings of the dense
// ones, through the same dispatcher.
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
#pragma once

#include <cstdint>
#include <string>

#include "gatedmlp/gatedmlp.hpp"

namespace gatedmlp {

enum class QuantMode : int {
  affine = 0,  // MLX: w = q * scale + bias per group along K
};

struct QuantFormat {
  QuantMode mode = QuantMode::affine;
  int bits = 4;         // 4 or 8
  int group_size = 64;  // 32, 64 or 128 elements along K
};

// The format's own rules (bits, group size), and K against them: K must be a
// positive multiple of the group size. Names the argument and the values.
Status check_quant_format(const QuantFormat& format, int64_t k);

// Sizes of one quantized row of K elements: uint32 words, and groups (the
// scales and biases per row).
int64_t quant_words_per_row(const QuantFormat& format, int64_t k);
int64_t quant_groups_per_row(const QuantFormat& format, int64_t k);

// Quantizes a [rows, K] row-major host array `w` of `dtype` (bf16, fp16, fp32)
// into wq [rows, quant_words_per_row] and scales, biases [rows,
// quant_groups_per_row] of `dtype`, all host memory. Bit for bit what
// mlx.core.quantize returns on MLX's CPU backend: the group's min and max in
// fp32; the scale (max - min) / (2^bits - 1), at least 1e-7, negative unless
// the min has the larger magnitude; the edge of larger magnitude kept exact
// (scale = edge / round(edge / scale), bias = edge) unless it rounds to 0
// (then bias = 0); q = clamp(round((w - bias) / scale), 0, 2^bits - 1), every
// rounding to nearest even. Empty input (rows = 0) is not an error.
Status quantize_host(const QuantFormat& format, DType dtype, int64_t rows, int64_t k, const void* w, uint32_t* wq,
                     void* scales, void* biases);

// The inverse map: w [rows, K] of out_dtype = q * scale + bias, computed in
// fp32 and rounded once to out_dtype. scales and biases are of `dtype`.
Status dequantize_host(const QuantFormat& format, DType dtype, DType out_dtype, int64_t rows, int64_t k,
                       const uint32_t* wq, const void* scales, const void* biases, void* w);

const char* to_string(QuantMode);
std::string to_string(const QuantFormat&);

}  // namespace gatedmlp
