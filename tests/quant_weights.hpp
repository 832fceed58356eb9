// Quantized weights for the GPU tests: drawn, quantized on the host
// (quantize_host: MLX's bits; FP8 drawn as e4m3 bytes and scales), laid out
// in rows of the problem's ld, and dequantized to X's dtype for the
// yardsticks. Shared by the gate/up and the down projection suites.
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gatedmlp/quant.hpp"
#include "gpu_util.hpp"

namespace gatedmlp::test {

// A random quantized format for p (p.input_dtype set): affine 4 bits
// (`int4_weight` draws of 5, the format the bars are about), affine 8,
// MXFP4 and FP8 (per tensor, per channel, 128 x 128 blocks and the other
// mixes); half the affine cases with scales of X's dtype (the packed
// dequantization), half the 4-bit ones repacked.
inline void random_quant_format(Problem& p, std::mt19937_64& rng, int int4_weight = 2) {
  p.quantized = true;
  const int fmt = int(rng() % uint64_t(3 + int4_weight));
  if (fmt == 0) {
    p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, int(pick(rng, {0, 128})), int(pick(rng, {0, 1, 128}))};
    p.scale_dtype = rng() % 3 ? DType::fp32 : static_cast<DType>(rng() % 3);
  } else if (fmt == 1) {
    p.quant = QuantFormat{QuantMode::mxfp4, 4, 32};
  } else {
    p.quant.bits = fmt == 2 ? 8 : 4;
    p.quant.group_size = int(pick(rng, {32, 64, 128}));
    p.quant.repacked = p.quant.bits == 4 && rng() % 2;  // the kernels' streaming order (repack_quantized)
    p.scale_dtype = rng() % 2 ? p.input_dtype : static_cast<DType>(rng() % 3);
  }
}

// One quantized weight tensor: the host arrays (words with the problem's ld,
// scales, biases) and the same weights dequantized to X's dtype, dense.
struct QuantWeights {
  Tensor words, scales, biases;
  std::vector<unsigned char> dequantized;
};

inline void make_weights(const Problem& r, int64_t rows, std::mt19937_64& rng, QuantWeights* qw) {
  const bool mx = r.quant.mode == QuantMode::mxfp4, fp8 = r.quant.mode == QuantMode::fp8_e4m3;
  const int64_t words = quant_words_per_row(r.quant, r.k), groups = quant_groups_per_row(r.quant, r.k);
  std::vector<uint32_t> dense(size_t(rows * words));
  if (fp8) {
    // FP8 comes quantized: e4m3 bytes of magnitude below 4 (exponent fields
    // 0 ... 8, subnormals included; never 0x7F, e4m3fn's NaN) and scales
    // around 2 / sqrt(K) / 2 per block.
    unsigned char* bytes = reinterpret_cast<unsigned char*>(dense.data());
    for (int64_t i = 0; i < rows * r.k; ++i) {
      const uint32_t e = uint32_t(rng() % 9), m = uint32_t(rng() % 8), sgn = uint32_t(rng() % 2);
      bytes[i] = static_cast<unsigned char>(sgn << 7 | e << 3 | m);
    }
    const int64_t n = quant_scale_rows(r.quant, rows) * groups;
    std::vector<unsigned char> sc;
    fill(sc, r.scale_dtype, n, rng, 0.5f / std::sqrt(float(r.k)), 1.5f / std::sqrt(float(r.k)));
    qw->scales.host = sc;
  }
  if (!fp8) {
    // Weights of the scales' dtype (MLX's scales are the weights' dtype).
    const DType wdt = mx ? DType::fp32 : r.scale_dtype;
    const float wscale = 2.0f / std::sqrt(float(r.k));
    std::vector<unsigned char> w;
    fill(w, wdt, rows * r.k, rng, -wscale, wscale);
    // A few groups with a constant value (MLX's edge case) and zeros.
    for (int i = 0; i < 3 && rows * r.k >= 64; ++i) {
      const int64_t row = int64_t(rng() % uint64_t(rows)), g0 = int64_t(rng() % uint64_t(r.k / r.quant.group_size));
      const double v = i == 0 ? 0.0 : 0.01 * double(i);
      for (int j = 0; j < r.quant.group_size; ++j)
        ref::store_from_double(w.data(), wdt, row * r.k + g0 * r.quant.group_size + j, v);
    }
    const size_t ssize = mx ? 1 : dtype_size(r.scale_dtype);
    const bool no_biases = mx || r.quant.tiled;  // tiled: (scale, bias) pairs in the scales
    qw->scales.host.assign(size_t(rows * groups) * ssize, 0);
    if (!no_biases) qw->biases.host.assign(size_t(rows * groups) * ssize, 0);
    const Status s = quantize_host(r.quant, wdt, rows, r.k, w.data(), dense.data(), qw->scales.host.data(),
                                   no_biases ? nullptr : qw->biases.host.data());
    ASSERT_TRUE(s.ok()) << s.message();
  }
  // Into rows of ld words; the padding holds words that would be wrong weights.
  qw->words.host.assign(size_t((rows - 1) * r.weights.ld + words) * 4, 0xA5);
  for (int64_t row = 0; row < rows; ++row)
    std::memcpy(&qw->words.host[size_t(row * r.weights.ld) * 4], &dense[size_t(row * words)], size_t(words) * 4);
  qw->dequantized.assign(size_t(rows * r.k) * dtype_size(r.input_dtype), 0);
  const Status s = dequantize_host(r.quant, r.scale_dtype, r.input_dtype, rows, r.k, dense.data(),
                                   qw->scales.host.data(), mx || fp8 || r.quant.tiled ? nullptr : qw->biases.host.data(),
                                   qw->dequantized.data());
  ASSERT_TRUE(s.ok()) << s.message();
  for (Tensor* t : {&qw->words, &qw->scales, &qw->biases}) t->upload();
}

}  // namespace gatedmlp::test
