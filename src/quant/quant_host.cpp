// The quantized formats' host side: format checks, and the quantizer and
// dequantizer of MLX's affine format (quant.hpp says what they compute).
//
// The quantizer must give MLX's bits, so its arithmetic is MLX's CPU
// backend's, step by step in fp32: the same operations in the same order,
// rint (round to nearest even) where MLX rounds, and no contraction of a
// multiply and an add into one rounding (the file is built with
// -ffp-contract=off). The tests compare against the mlx package itself.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>
#include <limits>
#include <sstream>

#include "common/host_float16.hpp"
#include "core/internal.hpp"
#include "gatedmlp/quant.hpp"
#include "quant/repack_math.hpp"
#include "quant/tiled_math.hpp"
#include "quant_decode/quant_decode.hpp"

namespace gatedmlp {

namespace {

using detail::err;

bool float_dtype(DType t) { return t == DType::bf16 || t == DType::fp16 || t == DType::fp32; }

float load(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::bf16: return detail::bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::fp16: return detail::fp16_to_float(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

void store(void* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::bf16: static_cast<uint16_t*>(base)[i] = detail::float_to_bf16(v); break;
    case DType::fp16: static_cast<uint16_t*>(base)[i] = detail::float_to_fp16(v); break;
    default: static_cast<float*>(base)[i] = v; break;
  }
}

// MXFP4's e2m1 magnitudes by code.
constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// The e8m0 scale byte of a group whose largest magnitude is `amax`: the
// smallest e with 2^e >= amax / 6 (ceil(log2), taken exactly from the
// binary exponent rather than through log2), clamped to [-127, 127]; 0 for
// an all-zero group; 0xFF (NaN) for a non-finite one.
uint8_t e8m0_of(float amax) {
  if (!std::isfinite(amax)) return 0xFF;
  if (amax == 0.0f) return 127;
  int e2 = 0;
  const float m = std::frexp(amax / 6.0f, &e2);  // amax / 6 = m * 2^e2, m in [0.5, 1)
  int e = m == 0.5f ? e2 - 1 : e2;
  e = std::min(std::max(e, -127), 127);
  return static_cast<uint8_t>(e + 127);
}

// The e2m1 code of x: the nearest value, a tie to the smaller magnitude, the
// sign only on a non-zero code.
uint32_t e2m1_of(float x) {
  const float a = std::fabs(x);
  uint32_t code = 0;
  for (uint32_t c = 1; c < 8; ++c)
    if (a > 0.5f * (kE2m1[c - 1] + kE2m1[c])) code = c;
  return code != 0 && std::signbit(x) ? code | 8u : code;
}

float e8m0_value(uint8_t s) { return std::ldexp(1.0f, int(s) - 127); }

// What both host calls check after the format: a float `dtype` where the
// mode reads one, rows >= 0, biases exactly where the mode has them (mxfp4
// has none; the tiled order keeps them in the scales array), and, when there
// is work, every array present.
Status check_arrays(const char* op, const QuantFormat& f, DType dtype, bool dtype_used, int64_t rows,
                    const void* biases, std::initializer_list<std::pair<const void*, const char*>> arrays) {
  const bool mx = f.mode != QuantMode::affine || f.tiled;  // no biases array
  if (dtype_used && !float_dtype(dtype))
    return err(StatusCode::invalid_argument, op, ": dtype ", to_string(dtype), " is not a float type");
  if (rows < 0) return err(StatusCode::invalid_argument, op, ": rows must be >= 0, got ", rows);
  if (mx && biases != nullptr)
    return err(StatusCode::invalid_argument, op, ": argument 'biases' is set (", biases, ") but ",
               f.tiled ? "tiled weights keep their biases in 'scales' ((scale, bias) pairs)"
                       : std::string(to_string(f.mode)) + " has no biases");
  if (rows == 0) return Status::Ok();
  for (auto [p, name] : arrays)
    if (p == nullptr) return err(StatusCode::invalid_argument, op, ": argument '", name, "' is null");
  if (!mx && biases == nullptr) return err(StatusCode::invalid_argument, op, ": argument 'biases' is null");
  return Status::Ok();
}

// quantize_host's affine half: MLX's CPU steps, in its order (quant.hpp).
void quantize_affine(const QuantFormat& f, DType dtype, int64_t rows, int64_t k, const void* w, uint32_t* wq,
                     void* scales, void* biases) {
  const float n_bins = float((1 << f.bits) - 1);
  const float eps = 1e-7f;
  const int per_word = 32 / f.bits;
  const int64_t groups = quant_groups_per_row(f, k), words = quant_words_per_row(f, k);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t i0 = r * k + g * f.group_size;
      float lo = std::numeric_limits<float>::infinity(), hi = -lo;
      for (int j = 0; j < f.group_size; ++j) {
        const float v = load(w, dtype, i0 + j);
        hi = std::max(hi, v);
        lo = std::min(lo, v);
      }
      // The edge of larger magnitude is represented exactly: the scale is
      // negative when it is the max, so that q = 0 lands on it either way.
      const bool min_edge = std::fabs(lo) > std::fabs(hi);
      float scale = std::max((hi - lo) / n_bins, eps);
      scale = min_edge ? scale : -scale;
      const float edge = min_edge ? lo : hi;
      const float q0 = std::rint(edge / scale);
      float bias = 0;
      if (q0 != 0) {
        scale = edge / q0;
        bias = edge;
      }
      uint32_t* out = wq + r * words + g * (f.group_size / per_word);
      for (int wd = 0; wd < f.group_size / per_word; ++wd) {
        uint32_t word = 0;
        for (int e = 0; e < per_word; ++e) {
          float q = std::rint((load(w, dtype, i0 + wd * per_word + e) - bias) / scale);
          q = std::min(std::max(q, 0.0f), n_bins);
          word |= uint32_t(q) << (e * f.bits);
        }
        out[wd] = word;
      }
      store(scales, dtype, r * groups + g, scale);
      store(biases, dtype, r * groups + g, bias);
    }
}

// quantize_host's MXFP4 half: an e8m0 scale and 32 e2m1 codes per group.
void quantize_mxfp4(const QuantFormat& f, DType dtype, int64_t rows, int64_t k, const void* w, uint32_t* wq,
                    uint8_t* scales) {
  const int64_t groups = quant_groups_per_row(f, k), words = quant_words_per_row(f, k);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t i0 = r * k + g * 32;
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(load(w, dtype, i0 + j)));
      const uint8_t sb = e8m0_of(amax);
      const float scale = e8m0_value(sb);
      for (int wd = 0; wd < 4; ++wd) {
        uint32_t word = 0;
        for (int e = 0; e < 8; ++e) word |= e2m1_of(load(w, dtype, i0 + wd * 8 + e) / scale) << (4 * e);
        wq[r * words + g * 4 + wd] = word;
      }
      scales[r * groups + g] = sb;
    }
}

// Element i of row r's packed codes (wq: all of the weight's words).
uint32_t code_at(const uint32_t* wq, const QuantFormat& f, int64_t r, int64_t k, int64_t i) {
  if (f.tiled)
    return (wq[detail::tiled_word_index(r, i / 8, detail::tiled_k_blocks(k))] >> ((i % 8) * 4)) & 0xFu;
  const uint32_t* row_words = wq + r * quant_words_per_row(f, k);
  if (f.repacked) return detail::repacked_code_at(row_words, i);
  const int bits = f.bits;
  const int per_word = 32 / bits;
  return (row_words[i / per_word] >> ((i % per_word) * bits)) & ((1u << bits) - 1u);
}

}  // namespace

Status check_quant_format(const QuantFormat& f, int64_t k) {
  if (f.mode != QuantMode::affine && f.mode != QuantMode::mxfp4 && f.mode != QuantMode::fp8_e4m3)
    return err(StatusCode::invalid_argument, "quant format: mode ", static_cast<int>(f.mode), " is not a QuantMode");
  if (f.mode == QuantMode::fp8_e4m3) {
    if (f.bits != 8) return err(StatusCode::not_supported, "quant format: fp8_e4m3 takes bits=8, got bits=", f.bits);
    if (f.group_size != 0 && f.group_size != 128)
      return err(StatusCode::not_supported, "quant format: fp8_e4m3 takes group_size=128 (blocks along K) or 0 (one ",
                 "scale for all of K), got group_size=", f.group_size);
    if (f.row_block != 0 && f.row_block != 1 && f.row_block != 128)
      return err(StatusCode::not_supported, "quant format: fp8_e4m3 takes row_block=1, 128 or 0 (one scale for all ",
                 "rows), got row_block=", f.row_block);
    if (k <= 0 || k % 4)
      return err(StatusCode::invalid_argument, "quant format: k=", k, " is not a positive multiple of 4 (fp8_e4m3 ",
                 "packs four values to a word)");
    return Status::Ok();
  }
  if (f.repacked && (f.mode != QuantMode::affine || f.bits != 4))
    return err(StatusCode::not_supported, "quant format: repacked words are affine 4-bit only, got mode=",
               to_string(f.mode), " bits=", f.bits);
  if (f.tiled && (f.mode != QuantMode::affine || f.bits != 4 || f.repacked))
    return err(StatusCode::not_supported, "quant format: the tiled order is for affine 4-bit words in the ",
               "checkpoint's order, got mode=", to_string(f.mode), " bits=", f.bits, f.repacked ? " repacked" : "");
  if (f.row_block != 1)
    return err(StatusCode::not_supported, "quant format: row_block=", f.row_block, " (", to_string(f.mode),
               " has a scale per row: 1)");
  if (f.mode == QuantMode::mxfp4 && (f.bits != 4 || f.group_size != 32))
    return err(StatusCode::not_supported, "quant format: mxfp4 takes bits=4 and group_size=32, got bits=", f.bits,
               " group_size=", f.group_size);
  if (f.bits != 4 && f.bits != 8)
    return err(StatusCode::not_supported, "quant format: bits=", f.bits, " (affine takes 4 or 8)");
  if (f.group_size != 32 && f.group_size != 64 && f.group_size != 128)
    return err(StatusCode::not_supported, "quant format: group_size=", f.group_size, " (affine takes 32, 64 or 128)");
  if (k <= 0 || k % f.group_size)
    return err(StatusCode::invalid_argument, "quant format: k=", k, " is not a positive multiple of group_size=",
               f.group_size);
  return Status::Ok();
}

int64_t quant_words_per_row(const QuantFormat& f, int64_t k) {
  if (f.repacked) return detail::repacked_words_per_row(k);
  if (f.tiled) return detail::tiled_words_per_row(k);
  return k * f.bits / 32;
}
int64_t quant_groups_per_row(const QuantFormat& f, int64_t k) {
  if (f.group_size == 0) return 1;  // fp8_e4m3: one scale along all of K
  if (f.tiled) return detail::tiled_scale_elems_per_row(k, f.group_size);  // (scale, bias) pairs
  return (k + f.group_size - 1) / f.group_size;
}
int64_t quant_scale_rows(const QuantFormat& f, int64_t rows) {
  if (f.row_block == 0) return 1;  // fp8_e4m3: one scale for all rows
  return (rows + f.row_block - 1) / f.row_block;
}

static float e4m3_value(uint32_t b) {
  const int e = int(b >> 3) & 15, m = int(b) & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();  // e4m3fn has no infinities
  const float mag = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.0f + float(m) / 8.0f, e - 7);
  return (b & 0x80u) ? -mag : mag;
}

Status quantize_host(const QuantFormat& f, DType dtype, int64_t rows, int64_t k, const void* w, uint32_t* wq,
                     void* scales, void* biases) {
  if (Status s = check_quant_format(f, k); !s.ok()) return s;
  if (Status s = check_arrays("quantize_host", f, dtype, true, rows, biases, {{w, "w"}, {wq, "wq"}, {scales, "scales"}});
      !s.ok())
    return s;
  if (f.mode == QuantMode::fp8_e4m3)
    return err(StatusCode::not_supported, "quantize_host: fp8_e4m3 weights come quantized (from checkpoints); ",
               "quantize_host takes affine and mxfp4");
  if (f.mode == QuantMode::mxfp4) {
    quantize_mxfp4(f, dtype, rows, k, w, wq, static_cast<uint8_t*>(scales));
  } else if (f.tiled) {  // MLX's arrays, then the tiled order
    QuantFormat plain = f;
    plain.tiled = false;
    if (rows % detail::kTileRows)
      return err(StatusCode::invalid_argument, "quantize_host: the tiled order takes rows in tiles of 16, got rows=",
                 rows);
    const size_t n = size_t(rows) * size_t(quant_groups_per_row(plain, k)) * (dtype == DType::fp32 ? 4 : 2);
    std::vector<uint32_t> words(size_t(rows * quant_words_per_row(plain, k)));
    std::vector<unsigned char> s(n), b(n);
    quantize_affine(plain, dtype, rows, k, w, words.data(), s.data(), b.data());
    return tile_quantized(plain, dtype, rows, k, words.data(), s.data(), b.data(), wq, scales);
  } else if (f.repacked) {  // MLX's words, then the repacked order
    QuantFormat plain = f;
    plain.repacked = false;
    std::vector<uint32_t> words(size_t(rows * quant_words_per_row(plain, k)));
    quantize_affine(plain, dtype, rows, k, w, words.data(), scales, biases);
    return repack_quantized(plain, f, rows, k, words.data(), wq);
  } else {
    quantize_affine(f, dtype, rows, k, w, wq, scales, biases);
  }
  return Status::Ok();
}

Status dequantize_host(const QuantFormat& f, DType dtype, DType out_dtype, int64_t rows, int64_t k,
                       const uint32_t* wq, const void* scales, const void* biases, void* w) {
  if (Status s = check_quant_format(f, k); !s.ok()) return s;
  if (!float_dtype(out_dtype))
    return err(StatusCode::invalid_argument, "dequantize_host: out_dtype ", to_string(out_dtype), " is not a float type");
  const bool mx = f.mode == QuantMode::mxfp4, fp8 = f.mode == QuantMode::fp8_e4m3;
  if (Status s = check_arrays("dequantize_host", f, dtype, !mx, rows, biases, {{wq, "wq"}, {scales, "scales"}, {w, "w"}});
      !s.ok())
    return s;
  if (f.tiled && rows % detail::kTileRows)
    return err(StatusCode::invalid_argument, "dequantize_host: the tiled order takes rows in tiles of 16, got rows=",
               rows);
  const int64_t groups = quant_groups_per_row(f, k), tgroups = f.tiled ? detail::tiled_groups_per_row(k, f.group_size) : 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < k; ++i) {
      const uint32_t q = code_at(wq, f, r, k, i);
      float v;
      if (fp8) {
        const int64_t g = (f.row_block ? r / f.row_block : 0) * groups + (f.group_size ? i / f.group_size : 0);
        store(w, out_dtype, r * k + i, e4m3_value(q) * load(scales, dtype, g));
        continue;
      }
      if (f.tiled) {  // (scale, bias) pairs in one array
        const int64_t g = detail::tiled_scale_index(r, i / f.group_size, tgroups);
        store(w, out_dtype, r * k + i, std::fma(float(q), load(scales, dtype, g), load(scales, dtype, g + 1)));
        continue;
      }
      const int64_t g = r * groups + i / f.group_size;
      if (mx)
        v = ((q & 8u) ? -kE2m1[q & 7u] : kE2m1[q & 7u]) * e8m0_value(static_cast<const uint8_t*>(scales)[g]);
      else
        v = std::fma(float(q), load(scales, dtype, g), load(biases, dtype, g));  // the kernels' one rounding
      store(w, out_dtype, r * k + i, v);
    }
  return Status::Ok();
}

namespace {

// The checks repack_quantized and repack_quantized_device share.
Status check_repack(const char* fn, const QuantFormat& from, const QuantFormat& to, int64_t rows, int64_t k,
                    const void* src, const void* dst) {
  QuantFormat a = from, b = to;
  a.repacked = b.repacked = false;
  if (a.mode != QuantMode::affine || a.bits != 4)
    return err(StatusCode::not_supported, fn, ": only affine 4-bit words have a repacked order, got from=",
               to_string(from));
  if (a.mode != b.mode || a.bits != b.bits || a.group_size != b.group_size || a.row_block != b.row_block)
    return err(StatusCode::invalid_argument, fn, ": from and to must be one format but for `repacked`, got from=",
               to_string(from), " to=", to_string(to));
  if (Status s = check_quant_format(from, k); !s.ok()) return s;
  if (rows < 0) return err(StatusCode::invalid_argument, fn, ": rows=", rows, " is negative");
  if (rows > 0 && (!src || !dst))
    return err(StatusCode::invalid_argument, fn, ": ", !src ? "src" : "dst", " is null with rows=", rows);
  return Status::Ok();
}

}  // namespace

Status repack_quantized(const QuantFormat& from, const QuantFormat& to, int64_t rows, int64_t k, const uint32_t* src,
                        uint32_t* dst) {
  if (Status s = check_repack("repack_quantized", from, to, rows, k, src, dst); !s.ok()) return s;
  const int64_t wf = quant_words_per_row(from, k), wt = quant_words_per_row(to, k), words = k / 8;
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t* in = src + r * wf;
    uint32_t* out = dst + r * wt;
    if (from.repacked == to.repacked) {
      std::copy(in, in + wf, out);
    } else if (to.repacked) {
      std::fill(out, out + wt, 0u);
      for (int64_t i = 0; i < words; ++i) out[detail::repacked_word_pos(i)] = detail::repack_nibbles(in[i]);
    } else {
      for (int64_t i = 0; i < words; ++i) out[i] = detail::unrepack_nibbles(in[detail::repacked_word_pos(i)]);
    }
  }
  return Status::Ok();
}

Status repack_quantized_device(const QuantFormat& from, const QuantFormat& to, int64_t rows, int64_t k,
                               const uint32_t* src, uint32_t* dst, cudaStream_t stream) {
  if (Status s = check_repack("repack_quantized_device", from, to, rows, k, src, dst); !s.ok()) return s;
  if (rows == 0) return Status::Ok();
  const cudaError_t e = quant_decode::repack_words_device(from.repacked, to.repacked, rows, k, src, dst, stream);
  if (e != cudaSuccess)
    return err(StatusCode::cuda_error, "repack_quantized_device: ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
  return Status::Ok();
}

namespace {

// The checks tile_quantized and untile_quantized share.
Status check_tile(const char* fn, const QuantFormat& f, DType dtype, int64_t rows, int64_t k,
                  std::initializer_list<std::pair<const void*, const char*>> arrays) {
  if (f.tiled)
    return err(StatusCode::invalid_argument, fn, ": pass the checkpoint's format (tiled=false), got ", to_string(f));
  QuantFormat t = f;
  t.tiled = true;
  if (Status s = check_quant_format(t, k); !s.ok()) return s;
  if (!float_dtype(dtype)) return err(StatusCode::invalid_argument, fn, ": dtype ", to_string(dtype), " is not a float type");
  if (rows < 0 || rows % detail::kTileRows)
    return err(StatusCode::invalid_argument, fn, ": rows must be a multiple of 16 (the tiles' rows), got rows=", rows);
  if (rows == 0) return Status::Ok();
  for (auto [p, name] : arrays)
    if (p == nullptr) return err(StatusCode::invalid_argument, fn, ": argument '", name, "' is null");
  return Status::Ok();
}

// Copies each word, scale and bias of the checkpoint's arrays (words, scales,
// biases) to its tiled place (words, (scale, bias) pairs) and back
// (TO_TILED false); the tiled padding (K to whole k-blocks) is zero.
template <bool TO_TILED>
void tile_copy(const QuantFormat& f, size_t esize, int64_t rows, int64_t k, uint32_t* words, unsigned char* scales,
               unsigned char* biases, uint32_t* tiled_words, unsigned char* pairs) {
  const int64_t kb = detail::tiled_k_blocks(k), nw = k / 8;
  const int64_t groups = k / f.group_size, tgroups = detail::tiled_groups_per_row(k, f.group_size);
  if (TO_TILED) {
    std::fill(tiled_words, tiled_words + rows * detail::tiled_words_per_row(k), 0u);
    std::memset(pairs, 0, size_t(rows * 2 * tgroups) * esize);
  }
  // One element between the two places, in the direction asked.
  auto move = [](unsigned char* plain, unsigned char* tiled, size_t n) {
    if (TO_TILED) std::memcpy(tiled, plain, n);
    else std::memcpy(plain, tiled, n);
  };
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t wi = 0; wi < nw; ++wi)
      move(reinterpret_cast<unsigned char*>(words + r * nw + wi),
           reinterpret_cast<unsigned char*>(tiled_words + detail::tiled_word_index(r, wi, kb)), 4);
    for (int64_t gi = 0; gi < groups; ++gi) {
      const size_t plain = size_t(r * groups + gi) * esize;
      const size_t tiled = size_t(detail::tiled_scale_index(r, gi, tgroups)) * esize;
      move(scales + plain, pairs + tiled, esize);
      move(biases + plain, pairs + tiled + esize, esize);
    }
  }
}

}  // namespace

Status tile_quantized(const QuantFormat& f, DType dtype, int64_t rows, int64_t k, const uint32_t* wq,
                      const void* scales, const void* biases, uint32_t* tiled_wq, void* tiled_scales) {
  if (Status s = check_tile("tile_quantized", f, dtype, rows, k,
                            {{wq, "wq"}, {scales, "scales"}, {biases, "biases"}, {tiled_wq, "tiled_wq"},
                             {tiled_scales, "tiled_scales"}});
      !s.ok() || rows == 0)
    return s;
  // TO_TILED only reads the checkpoint's arrays.
  tile_copy<true>(f, dtype == DType::fp32 ? 4 : 2, rows, k, const_cast<uint32_t*>(wq),
                  static_cast<unsigned char*>(const_cast<void*>(scales)),
                  static_cast<unsigned char*>(const_cast<void*>(biases)), tiled_wq,
                  static_cast<unsigned char*>(tiled_scales));
  return Status::Ok();
}

Status untile_quantized(const QuantFormat& f, DType dtype, int64_t rows, int64_t k, const uint32_t* tiled_wq,
                        const void* tiled_scales, uint32_t* wq, void* scales, void* biases) {
  if (Status s = check_tile("untile_quantized", f, dtype, rows, k,
                            {{tiled_wq, "tiled_wq"}, {tiled_scales, "tiled_scales"}, {wq, "wq"}, {scales, "scales"},
                             {biases, "biases"}});
      !s.ok() || rows == 0)
    return s;
  // !TO_TILED only reads the tiled arrays.
  tile_copy<false>(f, dtype == DType::fp32 ? 4 : 2, rows, k, wq, static_cast<unsigned char*>(scales),
                   static_cast<unsigned char*>(biases), const_cast<uint32_t*>(tiled_wq),
                   static_cast<unsigned char*>(const_cast<void*>(tiled_scales)));
  return Status::Ok();
}

const char* to_string(QuantMode m) {
  switch (m) {
    case QuantMode::affine: return "affine";
    case QuantMode::mxfp4: return "mxfp4";
    case QuantMode::fp8_e4m3: return "fp8_e4m3";
  }
  return "?";
}

std::string to_string(const QuantFormat& f) {
  std::ostringstream os;
  os << "QuantFormat{mode=" << to_string(f.mode) << " bits=" << f.bits << " group_size=" << f.group_size;
  if (f.row_block != 1) os << " row_block=" << f.row_block;
  if (f.repacked) os << " repacked";
  if (f.tiled) os << " tiled";
  os << "}";
  return os.str();
}

}  // namespace gatedmlp
