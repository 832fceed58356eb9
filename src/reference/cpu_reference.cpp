// The float64 CPU reference: the exact function every kernel must compute,
// written as plainly as possible. Reads inputs through the same layout math
// the kernels use, but nothing else is shared with them.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "common/activation_math.hpp"
#include "common/layout_math.hpp"
#include "quant/repack_math.hpp"
#include "quant/tiled_math.hpp"
#include "reference/reference.hpp"

namespace gatedmlp::ref {

double e4m3_to_double(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? std::ldexp(double(m), -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return b & 0x80u ? -mag : mag;
}

uint8_t double_to_e4m3(double v) {
  if (std::isnan(v)) return 0x7F;
  // The 127 finite magnitudes, codes 0x00 ... 0x7E, increasing.
  static const std::array<double, 127> t = [] {
    std::array<double, 127> a{};
    for (int c = 0; c < 127; ++c) a[size_t(c)] = e4m3_to_double(uint8_t(c));
    return a;
  }();
  const double a = std::fabs(v);
  int c = 126;
  if (a < t[126]) {
    const int hi = int(std::upper_bound(t.begin(), t.end(), a) - t.begin());  // t[hi - 1] <= a < t[hi]
    const int lo = hi - 1;
    const double dl = a - t[size_t(lo)], dh = t[size_t(hi)] - a;
    c = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
  }
  return static_cast<uint8_t>((std::signbit(v) ? 0x80 : 0) | c);
}

double load_as_double(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::fp16: return fp16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::fp32: return static_cast<const float*>(base)[i];
    case DType::fp8_e4m3: return e4m3_to_double(static_cast<const uint8_t*>(base)[i]);
  }
  return NAN;
}

void store_from_double(void* base, DType dtype, int64_t i, double v) {
  switch (dtype) {
    case DType::bf16: static_cast<uint16_t*>(base)[i] = float_to_bf16(float(v)); break;
    case DType::fp16: static_cast<uint16_t*>(base)[i] = float_to_fp16(float(v)); break;
    case DType::fp32: static_cast<float*>(base)[i] = float(v); break;
    case DType::fp8_e4m3: static_cast<uint8_t*>(base)[i] = double_to_e4m3(v); break;
  }
}

double quantized_weight(const Problem& p, const void* words, const void* scales, const void* biases, int64_t row,
                        int64_t k) {
  if (p.quant.tiled) {  // affine 4-bit, the whole weight in tiles (quant/tiled_math.hpp)
    const uint32_t w = static_cast<const uint32_t*>(words)[detail::tiled_word_index(row, k / 8, detail::tiled_k_blocks(p.k))];
    // (scale, bias) pairs in one array.
    const int64_t gi = detail::tiled_scale_index(row, k / p.quant.group_size, detail::tiled_groups_per_row(p.k, p.quant.group_size));
    return double((w >> (k % 8 * 4)) & 0xFu) * load_as_double(scales, p.scale_dtype, gi) +
           load_as_double(scales, p.scale_dtype, gi + 1);
  }
  const int per_word = 32 / p.quant.bits;
  const uint32_t* row_words = static_cast<const uint32_t*>(words) + row * p.weights.ld;
  const uint32_t q = p.quant.repacked ? detail::repacked_code_at(row_words, k)
                                      : (row_words[k / per_word] >> ((k % per_word) * p.quant.bits)) &
                                            ((1u << p.quant.bits) - 1);
  if (p.quant.mode == QuantMode::fp8_e4m3) {
    const int64_t groups = p.quant.group_size ? (p.k + p.quant.group_size - 1) / p.quant.group_size : 1;
    const int64_t gi = (p.quant.row_block ? row / p.quant.row_block : 0) * groups +
                       (p.quant.group_size ? k / p.quant.group_size : 0);
    return e4m3_to_double(uint8_t(q)) * load_as_double(scales, p.scale_dtype, gi);
  }
  const int64_t gi = row * (p.k / p.quant.group_size) + k / p.quant.group_size;
  if (p.quant.mode == QuantMode::mxfp4) {
    static const double kE2m1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    const int e = static_cast<const uint8_t*>(scales)[gi];
    const double v = std::ldexp(kE2m1[q & 7], e - 127);
    return q & 8 ? -v : v;
  }
  return double(q) * load_as_double(scales, p.scale_dtype, gi) + load_as_double(biases, p.scale_dtype, gi);
}

namespace {

// Operation::down: y = alpha * h Wd^T + bd, h = x or act(x) * x_up, all in float64.
void down_reference(const Problem& p, const Arguments& h, std::vector<double>* y, const std::vector<int64_t>* rows) {
  const bool in_out = p.weights.storage == WeightStorage::in_out;
  const int64_t nrows = rows ? int64_t(rows->size()) : p.m;
  y->assign(size_t(p.batch * nrows * p.u), 0.0);
  std::vector<double> hs(size_t(nrows * p.k)), w(size_t(p.k));
  for (int64_t l = 0; l < p.batch; ++l) {
    for (int64_t ri = 0; ri < nrows; ++ri) {
      const int64_t m = rows ? (*rows)[size_t(ri)] : ri;
      for (int64_t kk = 0; kk < p.k; ++kk) {
        const int64_t off = l * p.batch_stride_x + m * p.ldx + kk;
        const double g = load_as_double(h.x, p.input_dtype, off);
        hs[size_t(ri * p.k + kk)] =
            p.glu_input ? detail::glu<double>(static_cast<int>(p.activation), g, load_as_double(h.x_up, p.input_dtype, off),
                                              double(p.act_params.clamp_alpha), double(p.act_params.clamp_limit))
                        : g;
      }
    }
    for (int64_t j = 0; j < p.u; ++j) {
      for (int64_t kk = 0; kk < p.k; ++kk)
        w[size_t(kk)] = p.quantized ? quantized_weight(p, h.w, h.w_scales, h.w_biases, j, kk)
                                    : load_as_double(h.w, p.input_dtype,
                                                     l * p.batch_stride_w + (in_out ? kk * p.weights.ld + j : j * p.weights.ld + kk));
      const double b = p.has_bias ? load_as_double(h.bias, p.bias_dtype, l * p.batch_stride_bias + j) : 0.0;
      for (int64_t ri = 0; ri < nrows; ++ri) {
        double acc = 0;
        for (int64_t kk = 0; kk < p.k; ++kk) acc += hs[size_t(ri * p.k + kk)] * w[size_t(kk)];
        (*y)[size_t((l * nrows + ri) * p.u + j)] = double(p.alpha) * acc + b;
      }
    }
  }
}

}  // namespace

void cpu_reference(const Problem& p0, const Arguments& h, std::vector<double>* y, std::vector<double>* preact,
                   const std::vector<int64_t>* rows) {
  const Problem p = p0.resolved();
  if (p.op == Operation::down) {
    if (preact) preact->clear();
    down_reference(p, h, y, rows);
    return;
  }
  const bool sep = p.weights.format == WeightFormat::separate;
  const bool in_out = p.weights.storage == WeightStorage::in_out;
  const int first = static_cast<int>(p.weights.first);
  const int64_t nrows = rows ? int64_t(rows->size()) : p.m;
  const bool want_pre = preact && p.has_preact;
  y->assign(size_t(p.batch * nrows * p.u), 0.0);
  if (want_pre) preact->assign(size_t(p.batch * nrows * 2 * p.u), 0.0);

  std::vector<double> xs(size_t(nrows * p.k)), wg(size_t(p.k)), wu(size_t(p.k));
  for (int64_t l = 0; l < p.batch; ++l) {
    for (int64_t ri = 0; ri < nrows; ++ri) {
      const int64_t m = rows ? (*rows)[size_t(ri)] : ri;
      for (int64_t kk = 0; kk < p.k; ++kk)
        xs[size_t(ri * p.k + kk)] = load_as_double(h.x, p.input_dtype, l * p.batch_stride_x + m * p.ldx + kk);
    }
    for (int64_t j = 0; j < p.u; ++j) {
      // The two weight rows of output column j, gathered into dense vectors.
      int64_t prow[2];
      const void* base[2];
      for (int half = 0; half < 2; ++half) {
        base[half] = sep ? (half == 0 ? h.w : h.w_up) : h.w;
        prow[half] = sep ? j : detail::fused_row(j, half, p.weights.group, first);
        std::vector<double>& dst = half == 0 ? wg : wu;
        if (p.quantized) {
          const bool up = sep && half == 1;
          for (int64_t kk = 0; kk < p.k; ++kk)
            dst[size_t(kk)] = quantized_weight(p, base[half], up ? h.w_up_scales : h.w_scales,
                                               up ? h.w_up_biases : h.w_biases, prow[half], kk);
          continue;
        }
        for (int64_t kk = 0; kk < p.k; ++kk) {
          const int64_t off = l * p.batch_stride_w + (in_out ? kk * p.weights.ld + prow[half] : prow[half] * p.weights.ld + kk);
          dst[size_t(kk)] = load_as_double(base[half], p.input_dtype, off);
        }
      }
      double bg = 0, bu = 0;
      if (p.has_bias) {
        const int64_t boff = l * p.batch_stride_bias;
        bg = load_as_double(h.bias, p.bias_dtype, boff + prow[0]);
        bu = sep ? load_as_double(h.bias_up, p.bias_dtype, boff + j) : load_as_double(h.bias, p.bias_dtype, boff + prow[1]);
      }
      const int64_t pcol_g = sep ? j : prow[0];
      const int64_t pcol_u = sep ? p.u + j : prow[1];
      for (int64_t ri = 0; ri < nrows; ++ri) {
        const double* xr = &xs[size_t(ri * p.k)];
        double g = 0, u = 0;
        for (int64_t kk = 0; kk < p.k; ++kk) {
          const double xv = xr[kk];
          g += xv * wg[size_t(kk)];
          u += xv * wu[size_t(kk)];
        }
        g = double(p.alpha) * g + bg;
        u = double(p.alpha) * u + bu;
        (*y)[size_t((l * nrows + ri) * p.u + j)] =
            detail::glu<double>(static_cast<int>(p.activation), g, u, double(p.act_params.clamp_alpha),
                                double(p.act_params.clamp_limit));
        if (want_pre) {
          (*preact)[size_t((l * nrows + ri) * 2 * p.u + pcol_g)] = g;
          (*preact)[size_t((l * nrows + ri) * 2 * p.u + pcol_u)] = u;
        }
      }
    }
  }
}

}  // namespace gatedmlp::ref
