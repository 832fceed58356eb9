// Host side of the decode kernel: which calls it takes, and its launch shape.
//
// Measured on an H100 (SXM, 132 SMs), bf16, stacked weights, silu, in
// CUDA-graph replay; "cold": the weights rotate over copies totalling 3x the
// L2, as in a model whose layers each bring their own; "hot": the same
// weights every call (11-17 MB shapes then stay in L2). us, decode kernel
// against cuBLAS (cublasGemmEx, the [M, 2U] GEMM alone):
//   K x U         M=1 cold       M=1 hot       M=8 cold      M=16 cold
//   896 x 4864    8.31 / 8.34    6.04 / 5.44   8.32 / 8.35   9.88 / 8.30
//   1024 x 2816   6.26 / 6.19    4.62 / 4.29   6.44 / 6.18   7.10 / 6.22
//   2048 x 8192   23.9 / 24.8    23.9 / 24.8   24.3 / 25.3   26.6 / 25.5
//   3072 x 8192   34.9 / 36.5    34.9 / 36.6   35.7 / 37.1   38.1 / 37.3
//   4096 x 14336  78.2 / 81.2    78.2 / 81.2   79.3 / 82.1   82.1 / 82.6
// (8B: 235 MB of weights at 3.00 TB/s.) At M > 8 the second n-tile's X
// costs registers: grids that fit in one wave at 3 CTAs per SM (1024 x
// 2816) take 3 chunks per warp, larger ones 4 chunks at 2 CTAs per SM,
// each the faster of the two there.
// Warps per CTA (warps_per_cta): on an H200 in the same replay, grids of
// 1.5-3.9 waves ran 5-15 % faster with fewer warps each taking more
// k-blocks where that made the whole grid resident (h75): Qwen2.5-0.5B
// M = 1 8.01 -> 7.03 us (4 warps), M = 16 10.05 -> 8.53 (2); Llama-3.2-1B
// M = 16 22.02 -> 19.57, 3B 30.37 -> 28.01 (2). Grids already resident
// (1024 x 2816) and those still not resident with fewer (8B) keep one warp
// per k-block.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <sstream>

#include "decode_glu/decode_glu.hpp"
#include "decode_glu/params.hpp"

namespace gatedmlp::decode {

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

std::string blocker(const Problem& r, const Arguments* a) {
  std::ostringstream os;
  // The kernel reads 16-byte pieces of 8 elements of K-contiguous rows: every
  // row and batch start must be a multiple of 8 elements from a 16-byte
  // aligned base.
  // A gathered call runs any m: each slot's rows in tiles (gather.cuh).
  if (r.m > kMaxM && r.gather.experts == 0) os << "m=" << r.m << " is more than the decode kernel's " << kMaxM << " rows";
  else if (r.input_dtype != DType::bf16 && r.input_dtype != DType::fp16)
    os << "input_dtype " << to_string(r.input_dtype) << " (the decode kernel takes bf16 and fp16)";
  else if (r.weights.storage != WeightStorage::out_in)
    os << "weights stored in_out ([K, out]): the decode kernel reads K-contiguous rows (out_in)";
  else if (r.k % 8) os << "k=" << r.k << " is not a multiple of 8 (the decode kernel loads 8 elements at a time)";
  else if (r.ldx % 8) os << "ldx=" << r.ldx << " is not a multiple of 8 (16-byte rows of x)";
  else if (r.weights.ld % 8) os << "weights.ld=" << r.weights.ld << " is not a multiple of 8 (16-byte weight rows)";
  else if (r.batch > 1 && r.batch_stride_x % 8)
    os << "batch_stride_x=" << r.batch_stride_x << " is not a multiple of 8 (16-byte rows of x)";
  else if ((r.batch > 1 || r.gather.experts > 1) && r.batch_stride_w % 8)
    os << "batch_stride_w=" << r.batch_stride_w << " is not a multiple of 8 (16-byte weight rows)";
  // Index math: offsets along K, row x ld and batch x stride are int64
  // (extents past 2^56 elements were refused by check_support); a weight row
  // index within a fused tensor is 32-bit (2U < 2^31), the batch index an
  // int (grid y loops over batches past 65535), and the grid has one CTA
  // per 8 columns (u / 8 < 2^27 in x).
  else if (r.u >= (int64_t(1) << 30))
    os << "u=" << r.u << " is 2^30 or more (the decode kernel indexes the 2u weight rows in 32 bits)";
  else if (r.batch > INT_MAX) os << "batch=" << r.batch << " is more than the decode kernel takes (2^31-1)";
  else if (a && !aligned16(a->x)) os << "x (" << a->x << ") is not 16-byte aligned";
  else if (a && !aligned16(a->w)) os << "w (" << a->w << ") is not 16-byte aligned";
  else if (a && a->w_up && !aligned16(a->w_up)) os << "w_up (" << a->w_up << ") is not 16-byte aligned";
  return os.str();
}

Params make_params(const Problem& r, const Arguments& a) {
  Params p{};
  p.x = a.x;
  p.w = a.w;
  p.w_up = a.w_up;
  p.bias = a.bias;
  p.bias_up = a.bias_up;
  p.y = a.y;
  p.pre = a.preact;
  p.m = static_cast<int>(r.m);
  p.batch = static_cast<int>(r.batch);
  p.k = r.k;
  p.u = r.u;
  p.ldx = r.ldx;
  p.ldw = r.weights.ld;
  p.ldy = r.ldy;
  p.ldpre = r.ldpre;
  p.sx = r.batch_stride_x;
  p.sw = r.batch_stride_w;
  p.sb = r.batch_stride_bias;
  p.sy = r.batch_stride_y;
  p.spre = r.batch_stride_preact;
  p.separate = r.weights.format == WeightFormat::separate;
  p.down = r.op == Operation::down;
  p.group = p.separate ? r.u : r.weights.group;
  p.first = static_cast<int>(r.weights.first);
  p.act = static_cast<int>(r.activation);
  p.alpha = r.alpha;
  p.clamp_alpha = r.act_params.clamp_alpha;
  p.clamp_limit = r.act_params.clamp_limit;
  p.out_dtype = static_cast<int>(r.output_dtype);
  p.bias_dtype = static_cast<int>(r.bias_dtype);
  p.pre_dtype = static_cast<int>(r.preact_dtype);
  p.has_bias = r.has_bias;
  p.has_pre = r.has_preact;
  if (r.gather.experts > 0) {
    // The expert takes the batch's place in the weights' and bias' strides;
    // the rows of x, y and pre come from the row map.
    p.indices = a.indices;
    p.index_error = a.index_error;
    p.index_trap = a.index_trap;
    p.index_64 = r.gather.index_type == IndexType::int64;
    p.n_indices = static_cast<int>(r.m / r.gather.rows_per_index);
    p.experts = static_cast<int>(r.gather.experts);
    p.x_repeat = static_cast<int>(r.gather.rows_per_x);
    p.index_repeat = static_cast<int>(r.gather.rows_per_index);
    p.sx = p.sy = p.spre = 0;
    p.row_scale = r.has_row_scale ? a.row_scale : nullptr;
    p.row_scale_dtype = static_cast<int>(r.row_scale_dtype);
  }
  return p;
}

int gathered_tile_rows(const Problem& r, int max_rows) {
  // The rows a distinct expert gets when n indices choose uniformly among E:
  // n / E(1 - (1 - 1/E)^n) per index, times rows_per_index; a tile a
  // quarter larger, so that most slots take one tile. Skewed routing runs
  // more tiles for its popular experts (gather.cuh).
  const double n = double(r.m / r.gather.rows_per_index), e = double(r.gather.experts);
  const double distinct = e * (1.0 - std::pow(1.0 - 1.0 / e, n));
  const double rows = n / std::max(1.0, distinct) * double(r.gather.rows_per_index);
  int tile = 8;
  while (tile < max_rows && tile < 1.25 * rows && tile < r.m) tile *= 2;
  return tile;
}

int warps_per_cta(const Shape& s, int64_t ctas, int sms) {
  // Resident CTAs per SM by registers: the m <= 8 and one-wave m <= 16
  // instantiations (<= 80 registers) fit 3 CTAs of 8 warps, 6 of 4; the
  // bigger m <= 16 one (<= 128) 2 of 8, 8 of 2.
  if (s.nt == 1) return ctas > 3 * int64_t(sms) && ctas <= 6 * int64_t(sms) ? 4 : 0;
  if (!s.one_wave && ctas <= 8 * int64_t(sms)) return 2;
  return 0;
}

cudaError_t launch(const Problem& r, const Arguments& a, int sms, cudaStream_t stream) {
  Params p = make_params(r, a);

  Shape s;
  s.nt = r.m <= 8 ? 1 : 2;
  s.gather = r.gather.experts > 0;
  if (s.gather) s.nt = gathered_tile_rows(r, 8 * 2) / 8;
  const int64_t cols = columns_per_cta(p);
  const int64_t ctas = (r.u + cols - 1) / cols * r.batch;
  s.one_wave = ctas <= 3 * int64_t(sms);
  // GATEDMLP_DECODE_WARPS=w (1 ... 8): at most w warps per CTA instead of
  // the rule's, a tuning knob read once per process (h75).
  static const int max_warps = [] {
    const char* v = std::getenv("GATEDMLP_DECODE_WARPS");
    const int w = v ? std::atoi(v) : 0;
    return w >= 1 && w <= kMaxWarps ? w : 0;
  }();
  const int w = s.gather || p.down ? 0 : max_warps ? max_warps : warps_per_cta(s, ctas, sms);
  p.warps = w ? std::min(warps_for(r.k), w) : 0;  // 0: one per k-block, at most kMaxWarps
  return r.input_dtype == DType::bf16 ? launch_bf16(p, s, stream) : launch_fp16(p, s, stream);
}

}  // namespace gatedmlp::decode
