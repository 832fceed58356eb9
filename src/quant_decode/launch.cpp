// Host side of the quantized decode kernel: which calls it takes, and its
// launch shape.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <sstream>

#include "core/internal.hpp"
#include "decode_glu/decode_glu.hpp"
#include "gatedmlp/quant.hpp"
#include "quant_decode/params.hpp"
#include "quant_decode/quant_decode.hpp"

namespace gatedmlp::quant_decode {

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int log2_exact(int v) {
  int s = 0;
  while ((1 << s) < v) ++s;
  return s;
}

}  // namespace

std::string blocker(const Problem& r, const Arguments* a) {
  std::ostringstream os;
  // Each lane reads 16 bytes of a row's words and 16 (or 8) bytes of X: rows
  // of words must start on 16 bytes (ld a multiple of 4 words), rows of X on
  // 16 bytes too (8 elements).
  // A gathered call runs any m: each slot's rows in tiles (decode_glu/gather.cuh).
  if (r.m > kMaxM && r.gather.experts == 0)
    os << "m=" << r.m << " is more than the quantized decode kernel's " << kMaxM << " rows";
  else if (r.input_dtype != DType::bf16 && r.input_dtype != DType::fp16)
    os << "input_dtype " << to_string(r.input_dtype) << " (the quantized decode kernel takes bf16 and fp16 X)";
  else if (r.ldx % 8) os << "ldx=" << r.ldx << " is not a multiple of 8 (16-byte rows of x)";
  else if (r.k % 16) os << "k=" << r.k << " is not a multiple of 16 (each lane reads 16 bytes of a row)";
  else if (r.weights.ld % 4) os << "weights.ld=" << r.weights.ld << " words is not a multiple of 4 (16-byte rows)";
  else if (r.gather.experts > 1 && r.batch_stride_w % 4)
    os << "batch_stride_w=" << r.batch_stride_w << " words (between experts) is not a multiple of 4 (16-byte rows)";
  else if (r.quant.tiled && r.m > kTiledMaxM && r.gather.experts == 0)
    os << "m=" << r.m << " with tiled words: the tiled kernels take up to " << kTiledMaxM << " rows";
  else if (r.quant.tiled && r.scale_dtype != r.input_dtype)
    os << "tiled words with " << to_string(r.scale_dtype) << " scales: the tiled kernels take scales of x's dtype ("
       << to_string(r.input_dtype) << ")";
  else if (r.quant.tiled && a && reinterpret_cast<uintptr_t>(a->w_scales) % 8)
    os << "tiled words with w_scales (" << a->w_scales
       << ") not 8-byte aligned (each lane loads two rows' (scale, bias) pairs as one 8-byte word)";
  else if (r.u >= (int64_t(1) << 30))
    os << "u=" << r.u << " is 2^30 or more (the kernel indexes the 2u weight rows in 32 bits)";
  else if (a && !aligned16(a->x)) os << "x (" << a->x << ") is not 16-byte aligned";
  else if (a && !aligned16(a->w)) os << "w (" << a->w << ") is not 16-byte aligned";
  else if (a && a->w_up && !aligned16(a->w_up)) os << "w_up (" << a->w_up << ") is not 16-byte aligned";
  return os.str();
}

DequantizeArgs dequantize_args(const Problem& r, int64_t rows, const void* words, const void* scales,
                               const void* biases, void* out) {
  DequantizeArgs d;
  d.format = r.quant;
  d.scale_dtype = r.scale_dtype;
  d.out_dtype = r.input_dtype;
  d.rows = rows;
  d.k = r.k;
  d.words = words;
  d.ldw = r.weights.ld;
  d.scales = scales;
  d.biases = biases;
  d.out = out;
  return d;
}

Problem dequantized_problem(const Problem& r) {
  Problem d = r;
  d.quantized = false;
  d.weights.ld = 0;  // dense [rows, K]
  d.batch_stride_w = kAuto;
  return d;
}

size_t dequantized_bytes(const Problem& r) {
  const int64_t rows = r.weights.format == WeightFormat::separate ? r.u : 2 * r.u;
  const size_t one = (size_t(rows) * size_t(r.k) * 2 + 255) / 256 * 256;
  return r.weights.format == WeightFormat::separate ? 2 * one : one;
}

namespace {

// Warps per CTA and chunks per k-block (see launch()).
void launch_shape(const Problem& r, int* warps, int* unroll) {
  // Warps per CTA and chunks per k-block: 4 and 1 were the fastest of
  // {2, 4, 8} x {1, 2, 4} at 8B and 70B, M = 1 (H100, docs/notes/quantized-decode.md h66).
  // GATEDMLP_QDECODE=W,U overrides them (tuning knob, docs/tuning.md). The
  // down projection has a few thousand rows of long K (8B: 256 CTAs of 16
  // rows, 14336 of K), so a CTA needs more bytes in flight than gate/up's:
  // GATEDMLP_QDECODE_DOWN=W,U sets its own (h67).
  // A gathered gate/up (MoE experts: a few thousand rows of short K each)
  // takes 2 warps: 38-51 % of the read rate at gpt-oss-20b and Qwen3-30B-A3B
  // shapes against 29-45 % with 4 and 24-32 % with 8 (H100, docs/notes/moe.md h68).
  // With affine 4-bit words, k-blocks of two chunks (twice the bytes each
  // warp has in flight) ran 1.00-1.10x faster at T = 1-64 on gpt-oss-20b,
  // Qwen3-30B-A3B and Mixtral shapes; MXFP4's 0.93-1.12x, so they keep one
  // (H200, docs/notes/moe.md h97). A gathered down projection keeps one.
  const bool down = r.op == Operation::down, gather = r.gather.experts > 0;
  const bool int4 = r.quant.mode == QuantMode::affine && r.quant.bits == 4;
  *warps = down ? 8 : gather ? 2 : 4;
  *unroll = down ? (gather ? 1 : 2) : gather && int4 ? 2 : 1;
  if (const char* v = std::getenv(down ? "GATEDMLP_QDECODE_DOWN" : "GATEDMLP_QDECODE")) {
    int w = 0, u = 0;
    if (std::sscanf(v, "%d,%d", &w, &u) == 2 && w >= 1 && w <= 8 && (u == 1 || u == 2)) {
      *warps = w;
      *unroll = u;
    }
  }
}

}  // namespace

int column_groups(const Problem& r, int sms, std::string* why) {
  if (why) why->clear();
  if (r.op == Operation::down || r.gather.experts > 0 || r.quant.repacked || r.m > 16) return 1;
  // 4-bit weights only: the 8-bit ones (int8, FP8) carry twice the weight
  // bytes per byte of X, and ran 0.69-0.98x as fast grouped at 8B, 70B and
  // Qwen3-32B (H200, h81). MXFP4 with fp16 X: not instantiated (it spilled).
  if (r.quant.bits != 4 || (r.quant.mode == QuantMode::mxfp4 && r.input_dtype != DType::bf16)) return 1;
  int warps = 0, unroll = 0;
  launch_shape(r, &warps, &unroll);
  if (unroll != 1) return 1;
  const int want = r.m <= 8 ? 2 : 4;  // the instantiated groups at each n-tile count
  if (const char* v = std::getenv("GATEDMLP_QDECODE_CG")) {
    const int cg = std::atoi(v);
    if (cg == 1 || cg == want) {
      if (why && cg > 1) *why = std::to_string(cg) + " groups of 8 columns per warp, set by GATEDMLP_QDECODE_CG";
      return cg;
    }
  }
  // More columns per CTA means fewer CTAs: grouped only while the grid
  // still fills the SMs twice over (M <= 8) or once (M 9-16). On the H200
  // (int4 g64, docs/notes/quantized-decode.md, h81): 1024 x 2816 (176 or 88
  // CTAs) ran 1.1-1.3x slower grouped; 8B, 70B, Qwen3-32B and 2048 x 8192
  // 1.01-1.29x faster at M = 1, 1.12-1.49x at M = 8 and 1.24-1.40x with 4
  // groups at M = 16.
  const int64_t ctas = (r.u + 8 * want - 1) / (8 * want);
  if (ctas < int64_t(r.m <= 8 ? 2 : 1) * sms) return 1;
  if (why) {
    std::ostringstream os;
    os << want << " groups of 8 columns per warp (each X fragment loaded once for " << want << "; " << ctas
       << " CTAs on " << sms << " SMs)";
    *why = os.str();
  }
  return want;
}

int down_warps(const Problem& r, int sms, std::string* why) {
  if (why) why->clear();
  if (r.op != Operation::down || !r.quant.tiled || r.gather.experts > 0 || sms <= 0 ||
      std::getenv("GATEDMLP_QDECODE_DOWN"))
    return 0;
  // Resident 8-warp CTAs per SM by the tiled kernels' registers (sm_90a,
  // ptxas): one row of X staged, 63 (4 per SM, shared memory allowing);
  // up to 8 rows, 73-87 (3; 2 with a K tail, not counted); up to 16, 95-109
  // (2). With 4 warps: 6 and 5. On an H200 (whole-MLP bench, int4 g64, the
  // same run; docs/notes/down-projection.md, h96) 4 warps ran 1.10x faster
  // for Qwen3-32B's 320 CTAs at M = 16 (8-warp CTAs: a second wave 21 %
  // full) and 1.01x for 70B's 512 at M = 1 (29 %), 0.98x for 70B's 512 at
  // M = 16 (94 %: two nearly full waves); grids that fit one wave of 8-warp
  // CTAs (8B at M = 1 and 16, Qwen3-32B at M = 1) ran 1.06-1.19x faster
  // with 8. So 4 warps where they make one wave of a grid whose 8-warp
  // form ends in a last wave less than half full.
  const int64_t ctas = (r.u + 15) / 16;
  const bool x_staged = tiled_stages_x(r.m, r.k, dtype_size(r.input_dtype), false);
  const int per_sm8 = x_staged ? 4 : r.m <= 8 ? 3 : 2;
  const int per_sm4 = r.m <= 8 ? 6 : 5;
  const int64_t slots8 = int64_t(per_sm8) * sms, last = ctas % slots8;  // CTAs in the last wave of 8-warp ones
  if (ctas <= slots8 || ctas > int64_t(per_sm4) * sms || last == 0 || 2 * last >= slots8) return 0;
  if (why) {
    std::ostringstream os;
    os << "4 warps per CTA (" << ctas << " CTAs: one wave of " << per_sm4 << " per SM on " << sms
       << " SMs, where 8-warp CTAs would end in a wave " << 100 * last / slots8 << " % full)";
    *why = os.str();
  }
  return 4;
}

int tiled_ahead(const Problem& r, int sms, std::string* why) {
  if (why) why->clear();
  if (!r.quant.tiled) return 0;
  const bool gather = r.gather.experts > 0, down = r.op == Operation::down;
  const int nt = gather ? decode::gathered_tile_rows(r, int(kTiledMaxM)) / 8 : r.m <= 8 ? 1 : 2;
  const int cg = gather || down ? 1 : column_groups(r, sms);
  // Where K has a tail (X not staged) the kernels built go less deep (tiled.cuh).
  const bool whole = r.k % kTiledBlockK == 0 || tiled_stages_x(r.m, r.k, dtype_size(r.input_dtype), gather);
  const int most = whole ? tiled_max_depth(nt, cg, gather) : tiled_max_depth_tail(nt, cg, gather);
  if (const char* v = std::getenv("GATEDMLP_QDECODE_AHEAD")) {
    const int asked = std::atoi(v), n = asked < 1 ? 1 : asked > most ? most : asked;
    if (why && n > 1) *why = std::to_string(n) + " k-blocks requested ahead per warp, set by GATEDMLP_QDECODE_AHEAD";
    return n;
  }
  // Two ahead for gathered gate/up calls only. Their CTAs of 2 warps leave
  // each SM few loads in flight: on an H200 (int4 g64, docs/notes/moe.md,
  // h97) two ran 1.12-1.16x faster on Qwen3-30B-A3B's experts and
  // 1.19-1.22x on Mixtral's at T = 1-16, three no faster than one. The
  // dense kernels (8 warps, up to 4 CTAs per SM) ran 1-24 % slower with two
  // or three (whole MLP and gate/up on 8B, 70B, Qwen3-32B and the small
  // shapes): they are not waiting on bytes in flight, and the registers of
  // three cost CTAs per SM. A gathered down projection runs 8-warp CTAs as
  // they do, and keeps one (not timed deeper). Where K has a tail
  // (gpt-oss's 2880) two ran 1.04-1.14x faster than one (h98).
  if (!gather || down || most < 2) return 1;
  if (why) *why = "2 k-blocks requested ahead per warp (2-warp gathered CTAs)";
  return 2;
}

DownSplit down_split(const Problem& r) {
  // Unsplit unless asked: a rule aiming at ~1024 CTAs measured 14 % slower
  // at 8B, 3 % at 70B and 7 % faster at Qwen3-32B (H100, whole MLP, h67),
  // so the split is not where the down projection's time goes.
  DownSplit d;
  if (r.gather.experts > 0) return d;  // gridDim.y holds the experts
  if (r.quant.tiled) return d;         // the tiled kernels take all of K (tiled.cuh)
  const char* v = r.op == Operation::down ? std::getenv("GATEDMLP_QDECODE_DOWN_SPLIT") : nullptr;
  const int n = v ? std::atoi(v) : 1;
  if (n <= 1 || n > 64) return d;
  int warps = 0, unroll = 0;
  launch_shape(r, &warps, &unroll);
  const bool bytes8 = r.quant.mode == QuantMode::fp8_e4m3 || (r.quant.mode == QuantMode::affine && r.quant.bits == 8);
  // The repacked kernel's k-blocks are single chunks of 128, whatever the unroll.
  const int64_t block_k = r.quant.repacked ? 128 : 4 * (bytes8 ? 16 : 32) * unroll;
  const int64_t k_blocks = (r.k + block_k - 1) / block_k;
  const int64_t s = std::min<int64_t>(n, k_blocks);
  d.k_blocks_per_split = (k_blocks + s - 1) / s;
  d.splits = static_cast<int>((k_blocks + d.k_blocks_per_split - 1) / d.k_blocks_per_split);
  if (d.splits <= 1) return DownSplit{};
  return d;
}

Params make_params(const Problem& r, const Arguments& a) {
  Params q{};
  q.d = decode::make_params(r, a);  // batch 1: check_support refuses more
  q.scales = a.w_scales;
  q.biases = a.w_biases;
  q.scales_up = a.w_up_scales;
  q.biases_up = a.w_up_biases;
  q.groups = quant_groups_per_row(r.quant, r.k);
  q.group_shift = r.quant.group_size ? log2_exact(r.quant.group_size) : 63;
  q.row_shift = r.quant.row_block ? log2_exact(r.quant.row_block) : 31;
  q.scale_dtype = static_cast<int>(r.scale_dtype);
  q.expert_scales = quant_scale_rows(r.quant, detail::weight_rows(r)) * q.groups;
  return q;
}

cudaError_t launch(const Problem& r, const Arguments& a, cudaStream_t stream, const DownSplit& split,
                   float* partials, int groups, int warps, int ahead) {
  Params q = make_params(r, a);
  decode::Params& p = q.d;

  Shape s;
  s.nt = r.m <= 8 ? 1 : r.m <= 16 ? 2 : r.m <= 32 ? 4 : 8;
  s.gather = r.gather.experts > 0;
  if (s.gather) s.nt = decode::gathered_tile_rows(r, int(max_tile_rows(r))) / 8;
  const bool mx = r.quant.mode == QuantMode::mxfp4, fp8 = r.quant.mode == QuantMode::fp8_e4m3;
  s.format = fp8 ? kFp8 : mx ? kMxfp4 : r.quant.bits == 8 ? kInt8 : kInt4;
  s.packed_math = mx || fp8 || r.scale_dtype == r.input_dtype;
  launch_shape(r, &p.warps, &s.unroll);
  if (warps > 0) p.warps = warps;
  s.cg = groups;
  s.depth = ahead > 1 ? ahead : 1;
  if (partials && split.splits > 1 && !s.gather) {
    p.split_k_blocks = split.k_blocks_per_split;
    p.partials = partials;
  }
  const bool bf = r.input_dtype == DType::bf16;
  if (r.quant.tiled)  // affine 4-bit, scales of X's dtype, m <= 16 (blocker)
    return bf ? launch_tiled_bf16(q, s, stream) : launch_tiled_fp16(q, s, stream);
  if (r.quant.repacked) {  // affine 4-bit (check_quant_format)
    const int gs = r.quant.group_size;
    if (gs == 32) return bf ? launch_repacked_bf16_g32(q, s, stream) : launch_repacked_fp16_g32(q, s, stream);
    if (gs == 64) return bf ? launch_repacked_bf16_g64(q, s, stream) : launch_repacked_fp16_g64(q, s, stream);
    return bf ? launch_repacked_bf16_g128(q, s, stream) : launch_repacked_fp16_g128(q, s, stream);
  }
  switch (s.format) {
    case kInt4: return bf ? launch_bf16_int4(q, s, stream) : launch_fp16_int4(q, s, stream);
    case kInt8: return bf ? launch_bf16_int8(q, s, stream) : launch_fp16_int8(q, s, stream);
    case kFp8: return bf ? launch_bf16_fp8(q, s, stream) : launch_fp16_fp8(q, s, stream);
    default: return bf ? launch_bf16_mxfp4(q, s, stream) : launch_fp16_mxfp4(q, s, stream);
  }
}

}  // namespace gatedmlp::quant_decode
