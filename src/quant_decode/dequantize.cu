// Dequantization of packed weights into 16-bit rows on the device: the
// large-M path (M > quant_decode::kMaxM) dequantizes into the workspace and
// runs the 16-bit kernels on the result. Each weight is q * s + b (or e2m1 *
// 2^(s - 127)) in fp32, rounded once to X's type: the quantized decode
// kernel's own numbers (dequant.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/device_dtype.cuh"
#include "gatedmlp/quant.hpp"
#include "quant/repack_math.hpp"
#include "quant/tiled_math.hpp"
#include "quant_decode/quant_decode.hpp"

namespace gatedmlp::quant_decode {

namespace {

// One thread per packed word: 32 / bits weights out. MODE: 0 affine, 1
// MXFP4, 2 FP8 (its scales per row_shift-block of rows and group of K, the
// e4m3 value times the scale). ORDER 1: 4-bit affine words in the
// repacked order, read back into the checkpoint's; 2: words and (scale,
// bias) pairs in the tiled order (quant/tiled_math.hpp; groups: the pair
// array's elements per row, two per group).
template <typename T, int BITS, int MODE, int ORDER = 0>
__global__ void dequantize_kernel(const uint32_t* __restrict__ words, int64_t ldw, const void* scales,
                                  const void* biases, int scale_dtype, int64_t rows, int64_t k, int group_shift,
                                  int row_shift, int64_t groups, T* __restrict__ out) {
  constexpr bool MX = MODE == 1;
  constexpr int kPer = 32 / BITS;
  const int64_t words_per_row = k / kPer;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * words_per_row;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / words_per_row, wi = i % words_per_row;
    const int64_t k0 = wi * kPer;
    uint32_t w;
    int64_t gi;
    if constexpr (ORDER == 2) {
      w = __ldg(words + gatedmlp::detail::tiled_word_index(r, wi, gatedmlp::detail::tiled_k_blocks(k)));
      gi = gatedmlp::detail::tiled_scale_index(r, k0 >> group_shift, groups / 2);
    } else {
      w = ORDER == 1 ? gatedmlp::detail::unrepack_nibbles(__ldg(words + r * ldw + gatedmlp::detail::repacked_word_pos(wi)))
                     : __ldg(words + r * ldw + wi);
      gi = (r >> row_shift) * groups + (k0 >> group_shift);
    }
    float s, b = 0.f;
    if constexpr (MODE == 2) {
      s = gatedmlp::detail::load_float(scales, scale_dtype, gi);
    } else if constexpr (MX) {
      const uint32_t e = __ldg(static_cast<const unsigned char*>(scales) + gi);
      s = __uint_as_float(e == 0 ? 0x00400000u : e << 23);  // 2^(e - 127)
    } else {
      s = gatedmlp::detail::load_float(scales, scale_dtype, gi);
      b = ORDER == 2 ? gatedmlp::detail::load_float(scales, scale_dtype, gi + 1)  // the pair's bias
                     : gatedmlp::detail::load_float(biases, scale_dtype, gi);
    }
    T* o = out + r * k + k0;
#pragma unroll
    for (int j = 0; j < kPer; j += 2) {
      float v[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t q = (w >> ((j + h) * BITS)) & ((1u << BITS) - 1);
        if constexpr (MODE == 2) {
          // e4m3's exponent and mantissa to float bits 20-26 (a subnormal
          // for exponent 0), its sign to 31: times 2^120 the e4m3 value.
          const float f = __uint_as_float(((q & 0x7Fu) << 20) | ((q & 0x80u) << 24));
          v[h] = __fmul_rn(__fmul_rn(f, 0x1p120f), s);
        } else if constexpr (MX) {
          const float mag = (q & 7u) == 0 ? 0.f : (q & 7u) == 1 ? 0.5f : __uint_as_float((((q & 7u) >> 1) + 126u) << 23) * (1.f + 0.5f * float(q & 1u));
          v[h] = (q & 8u) ? -(mag * s) : mag * s;
        } else {
          v[h] = fmaf(float(q), s, b);
        }
      }
      const uint32_t pair = gatedmlp::detail::pack2<T>(v[0], v[1]);
      *reinterpret_cast<uint32_t*>(o + j) = pair;
    }
  }
}

template <typename T>
cudaError_t launch_t(const DequantizeArgs& d, cudaStream_t stream) {
  const int64_t n = d.rows * (d.k * d.format.bits / 32);
  const int threads = 256;
  const int64_t blocks = (n + threads - 1) / threads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
  auto log2_of = [](int v) {
    int s = 0;
    while ((1 << s) < v) ++s;
    return s;
  };
  const int gshift = d.format.group_size ? log2_of(d.format.group_size) : 63;
  const int rshift = d.format.row_block ? log2_of(d.format.row_block) : 31;
  const int64_t groups = quant_groups_per_row(d.format, d.k);
  const uint32_t* w = static_cast<const uint32_t*>(d.words);
  T* out = static_cast<T*>(d.out);
  const int sd = static_cast<int>(d.scale_dtype);
  if (d.format.mode == QuantMode::fp8_e4m3)
    dequantize_kernel<T, 8, 2><<<grid, threads, 0, stream>>>(w, d.ldw, d.scales, nullptr, sd, d.rows, d.k, gshift,
                                                             rshift, groups, out);
  else if (d.format.mode == QuantMode::mxfp4)
    dequantize_kernel<T, 4, 1><<<grid, threads, 0, stream>>>(w, d.ldw, d.scales, nullptr, sd, d.rows, d.k, gshift,
                                                             rshift, groups, out);
  else if (d.format.bits == 8)
    dequantize_kernel<T, 8, 0><<<grid, threads, 0, stream>>>(w, d.ldw, d.scales, d.biases, sd, d.rows, d.k, gshift,
                                                             rshift, groups, out);
  else if (d.format.tiled)
    dequantize_kernel<T, 4, 0, 2><<<grid, threads, 0, stream>>>(w, d.ldw, d.scales, d.biases, sd, d.rows, d.k,
                                                                gshift, rshift, groups, out);
  else if (d.format.repacked)
    dequantize_kernel<T, 4, 0, 1><<<grid, threads, 0, stream>>>(w, d.ldw, d.scales, d.biases, sd, d.rows, d.k,
                                                                   gshift, rshift, groups, out);
  else
    dequantize_kernel<T, 4, 0><<<grid, threads, 0, stream>>>(w, d.ldw, d.scales, d.biases, sd, d.rows, d.k, gshift,
                                                             rshift, groups, out);
  return cudaGetLastError();
}

// One thread per word of the destination row: repacking reads the word it
// came from (zero past K), unrepacking the word it goes to.
__global__ void repack_kernel(bool to_repacked, int64_t rows, int64_t k, const uint32_t* __restrict__ src,
                              uint32_t* __restrict__ dst) {
  const int64_t plain = k / 8, packed = gatedmlp::detail::repacked_words_per_row(k);
  const int64_t wf = to_repacked ? plain : packed, wt = to_repacked ? packed : plain;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * wt; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / wt, wi = i % wt;
    const int64_t from = gatedmlp::detail::repacked_word_pos(wi);  // its own inverse
    if (to_repacked)
      dst[i] = from < plain ? gatedmlp::detail::repack_nibbles(src[r * wf + from]) : 0u;
    else
      dst[i] = gatedmlp::detail::unrepack_nibbles(src[r * wf + from]);
  }
}

}  // namespace

cudaError_t repack_words_device(bool from_repacked, bool to_repacked, int64_t rows, int64_t k, const uint32_t* src,
                                uint32_t* dst, cudaStream_t stream) {
  auto words = [k](bool repacked) { return repacked ? gatedmlp::detail::repacked_words_per_row(k) : k / 8; };
  if (from_repacked == to_repacked)
    return cudaMemcpyAsync(dst, src, size_t(rows * words(from_repacked)) * 4, cudaMemcpyDeviceToDevice, stream);
  const int64_t n = rows * words(to_repacked);
  const int threads = 256;
  const int64_t blocks = (n + threads - 1) / threads;
  repack_kernel<<<static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16), threads, 0, stream>>>(
      to_repacked, rows, k, src, dst);
  return cudaGetLastError();
}

cudaError_t dequantize_device(const DequantizeArgs& d, cudaStream_t stream) {
  if (d.rows == 0) return cudaSuccess;
  return d.out_dtype == DType::bf16 ? launch_t<__nv_bfloat16>(d, stream) : launch_t<__half>(d, stream);
}

}  // namespace gatedmlp::quant_decode
