// Host side of the Hopper fast path: eligibility, tensor maps, launch.
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <random>
#include <sstream>
#include <string>

#include "core/internal.hpp"
#include "sm90_gemm_glu/schedule.hpp"
#include "sm90_gemm_glu/sm90_gemm_glu.hpp"

namespace gatedmlp::sm90 {

using detail::err;

bool compiled() {
#if defined(GATEDMLP_HAS_SM90)
  return true;
#else
  return false;
#endif
}

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The weight tensor map's interleave block: U for stacked and separate
// weights, else the layout's G.
int64_t map_group(const Problem& r) {
  return r.weights.format == WeightFormat::separate ? r.u : r.weights.group;
}

// CTAs per cluster (along M). Two share the weight tile and run in step, so
// CTAs that read the same weight rows do so at the same time. That was what
// long K needed (docs/notes/hopper-kernel.md, h5): the persistent CTAs drifted apart, a wave's
// operands (128 MB at K = 16384) no longer fit L2, and DRAM reads grew to
// 100x the operands: 0.50x cuBLAS at 405B M = 16384 single, 1.02x paired.
// With today's kernel single CTAs measure the same or 0.2-0.5 % faster at
// K = 4096 and 8192 (8B and 70B, M = 256 ... 16384, H200; docs/notes/hopper-kernel.md, h42),
// so clusters of two are kept only above K = 8192, where h5's loss was
// measured. Four lose the 4 SMs that a GPC cannot fill with clusters of four
// (128 CTAs of 132) and measured 0.90x.
constexpr int kClusterM = 2;
constexpr int64_t kClusterMinK = 8193;  // clusters of kClusterM from this K on, else 1

// Y through TMA stores: 16-bit or FP8 output whose rows (and batches) start
// on 16-byte boundaries. TMA stores write whole 16-byte chunks, so U must
// be a multiple of 16 bytes too, or the last chunk of a row would spill
// into the row's padding. `a` null: y assumed 16-byte aligned.
bool y_by_tma(const Problem& r, const Arguments* a) {
  const int64_t per16 = 16 / int64_t(dtype_size(r.output_dtype));  // elements per 16 bytes
  const int64_t es = int64_t(dtype_size(r.output_dtype));
  return r.output_dtype != DType::fp32 && r.u % per16 == 0 && r.ldy % per16 == 0 &&
         (r.batch == 1 || r.batch_stride_y % per16 == 0) && (!a || aligned16(a->y)) &&
         r.ldy * es < kMaxStrideBytes && r.batch_stride_y * es < kMaxStrideBytes && r.u <= kMaxCoord;
}

}  // namespace

int cluster_size(const Problem& r) {
  int cm = r.k >= kClusterMinK ? kClusterM : 1;
  if (const char* cl = std::getenv("GATEDMLP_SM90_CLUSTER")) cm = std::atoi(cl);
  if (cm != 2 && cm != 4) cm = 1;
  const int64_t m_tiles = (r.m + kTile.tile_m - 1) / kTile.tile_m;
  while (cm > 1 && m_tiles < cm) cm /= 2;
  return cm;
}

namespace {

// What keeps any kernel of the n-column tile (88 or 96) from a call, but
// the pre-activation (which the ping-pong kernels take in part), or "".
std::string narrow_tile_blocker(const Problem& r, const Arguments* a, int64_t n) {
  std::ostringstream os;
  const int64_t g = map_group(r);
  if (!y_by_tma(r, a)) os << "y cannot be stored by TMA (fp32, or u, ldy, its batch stride or y not 16-byte aligned)";
  else if (!(g == r.u || g % n == 0 || n % g == 0 || (n == kTilePingPong96.tile_n && g % kSubBoxRows == 0)))
    os << "weights.group=" << g << " neither divides nor is a multiple of the " << n << "-column tile"
       << (n == kTilePingPong96.tile_n ? " nor of 32" : "");
  else if (cluster_size(r) > 2)
    os << "clusters of " << cluster_size(r) << " (each CTA would load " << n / 2 << " weight rows)";
  else if ((r.m + kTileNarrow.tile_m - 1) / kTileNarrow.tile_m * ((r.u + n - 1) / n) > kMaxCoord / r.batch)
    os << "batch x m x u make 2^31 or more " << n << "-column tiles";
  return os.str();
}

}  // namespace

std::string narrow_blocker(const Problem& r, const Arguments* a) {
  if (r.has_preact) return "a pre-activation output (its stores are written for 128-column tiles)";
  return narrow_tile_blocker(r, a, kTileNarrow.tile_n);
}

std::string pingpong_blocker(const Problem& r, const Arguments* a, int tile_n) {
  std::ostringstream os;
  if (tile_n != kTilePingPong.tile_n && tile_n != kTilePingPong96.tile_n)
    return "no ping-pong kernels with " + std::to_string(tile_n) + "-column tiles";
  if (const std::string no = narrow_tile_blocker(r, a, tile_n); !no.empty()) return no;
  if (cluster_size(r) > 1) {
    os << "clusters of " << cluster_size(r) << " (the ping-pong kernels run one CTA per cluster)";
  } else if (r.m < kTilePingPong.tile_m) {
    os << "m=" << r.m << " is less than one " << kTilePingPong.tile_m << "-row tile";
  } else if (r.has_preact) {
    // The pre-activation as Y is stored (store_pre_pingpong): two runs of U
    // columns (stacked or separate weights; the 88-column kernels), one run
    // of 2N per tile (interleaved blocks the tile holds whole: G = 1, or G
    // >= 8 dividing N), or 32-column pieces (the 96-column kernels' blocks of
    // 64 or more); the input's 16-bit dtype, 16-byte rows.
    const int64_t g = map_group(r);
    const bool n96 = tile_n == kTilePingPong96.tile_n;
    if (g == r.u && n96)
      os << "a pre-activation of stacked or separate weights (the " << tile_n
         << "-column ping-pong kernels store it only for interleaved blocks)";
    else if (g != r.u && g != 1 && (g < 8 || tile_n % g != 0) && !(n96 && g % kSubBoxRows == 0))
      os << "a pre-activation with weights interleaved in blocks of G=" << g << " (the " << tile_n
         << "-column ping-pong kernels store it for G = 1 and for blocks of 8 or more rows that divide the tile"
         << (n96 ? " or are a multiple of 32" : "") << ")";
    else if (r.preact_dtype != r.input_dtype) os << "a pre-activation of another dtype than the input's";
    else if (r.ldpre % 8 || (r.batch > 1 && r.batch_stride_preact % 8))
      os << "a pre-activation whose ldpre or batch stride is not a multiple of 8";
    else if (a && !aligned16(a->preact)) os << "a pre-activation not 16-byte aligned";
    else if (r.m * r.ldpre * 2 >= kMaxStrideBytes || r.batch_stride_preact * 2 >= kMaxStrideBytes)
      os << "a pre-activation stride exceeds the tensor map's 2^40-byte limit";
  }
  return os.str();
}

std::string blocker(const Problem& r, const Arguments* a) {
  std::ostringstream os;
  const int64_t g = map_group(r);
  const int64_t halves = r.weights.format == WeightFormat::separate ? 1 : 2;
  // Bytes per X element (1 for FP8), and per weight row (FP8 weights: ld
  // counts uint32 words); TMA rows and strides must be 16-byte multiples.
  const int64_t xe = int64_t(dtype_size(r.input_dtype));
  const bool words = r.quantized;
  const int64_t ldw_bytes = r.weights.ld * (words ? 4 : 2);
  const int64_t per16 = 16 / xe;  // elements of X per 16 bytes
  if (!compiled()) os << "this build has no sm_90a kernel";
  else if (r.weights.storage != WeightStorage::out_in) os << "weights stored in_out ([K, out]); convert_weights() to out_in";
  else if (r.k % per16) os << "k=" << r.k << " is not a multiple of " << per16 << " (TMA rows must be 16-byte multiples)";
  else if (r.ldx % per16) os << "ldx=" << r.ldx << " is not a multiple of " << per16;
  else if (ldw_bytes % 16) os << "weights.ld=" << r.weights.ld << " is not a multiple of " << (words ? "4 words" : "8");
  else if (r.batch > 1 && r.batch_stride_x % per16) os << "batch_stride_x=" << r.batch_stride_x << " is not a multiple of " << per16;
  else if (r.batch > 1 && r.batch_stride_w % 8) os << "batch_stride_w=" << r.batch_stride_w << " is not a multiple of 8";
  else if (!(g == r.u || g % 128 == 0 || 128 % g == 0))
    os << "weights.group=" << g << " neither divides nor is a multiple of the 128-column tile";
  else if (r.m > kMaxCoord || r.k > kMaxCoord || 2 * r.u > kMaxCoord || r.batch > kMaxCoord)
    os << "m, k or 2u exceeds 2^31-1 (TMA coordinates)";
  else if ((r.m + kTile.tile_m - 1) / kTile.tile_m * ((r.u + kTile.tile_n - 1) / kTile.tile_n) > kMaxCoord / r.batch)
    os << "batch x m x u make 2^31 or more tiles (the kernel's schedule counts them in 32 bits)";
  else if (halves * g * ldw_bytes * (r.u / g) >= kMaxStrideBytes || r.batch_stride_w * 2 >= kMaxStrideBytes ||
           r.batch_stride_x * xe >= kMaxStrideBytes || r.m * r.ldx * xe >= kMaxStrideBytes)
    os << "a stride exceeds the tensor map's 2^40-byte limit";
  else if (a && !aligned16(a->x)) os << "x is not 16-byte aligned";
  else if (a && !aligned16(a->w)) os << "w is not 16-byte aligned";
  else if (a && a->w_up && !aligned16(a->w_up)) os << "w_up is not 16-byte aligned";
  return os.str();
}

std::string fp8_blocker(const Problem& r, const Arguments* a) {
  if (r.input_dtype != DType::fp8_e4m3 || !r.quantized || r.quant.mode != QuantMode::fp8_e4m3)
    return "not an FP8 call (fp8_e4m3 X and weights)";
  // The kernel indexes block scales in 32 bits (PromoScaleRows).
  if (r.x_scale == XScale::block && r.m * ((r.k + 127) / 128) > kMaxCoord)
    return "m * ceil(k / 128) X block scales exceed 2^31-1";
  return blocker(r, a);
}

std::string grouped_blocker(const Problem& r, const Arguments* a) {
  if (std::string no = blocker(r, a); !no.empty()) return no;
  std::ostringstream os;
  const int64_t units = grouped_units(r.m, r.gather.experts, kTile.tile_m);
  if (r.batch_stride_w % 8 || r.batch_stride_w == 0)
    os << "the expert stride batch_stride_w=" << r.batch_stride_w << " is not a nonzero multiple of 8";
  else if (r.gather.experts > kMaxCoord) os << "gather.experts exceeds 2^31-1 (TMA coordinates)";
  else if (units * ((r.u + kTile.tile_n - 1) / kTile.tile_n) > kMaxCoord)
    os << "m and u make 2^31 or more tiles (the kernel's schedule counts them in 32 bits)";
  return os.str();
}

size_t grouped_workspace_bytes(const Problem& r) {
  return size_t(grouped_units(r.m, r.gather.experts, kTile.tile_m)) * 4 * sizeof(int32_t);
}

namespace {

// A driver entry point, looked up once per process (no driver library is
// linked: the runtime hands out the driver's functions).
template <typename Fn>
Fn driver_entry(const char* name, Status* s) {
  static Fn fn = nullptr;
  static cudaError_t e = cudaSuccess;
  static std::once_flag once;
  std::call_once(once, [name] {
    cudaDriverEntryPointQueryResult q{};
    void* f = nullptr;
    e = cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q);
    if (e == cudaSuccess && q == cudaDriverEntryPointSuccess) fn = reinterpret_cast<Fn>(f);
  });
  if (!fn)
    *s = err(StatusCode::cuda_error, "the driver has no ", name, " (", cudaGetErrorString(e),
             "); the Hopper path needs a CUDA 12 driver");
  return fn;
}

PFN_cuTensorMapReplaceAddress_v12000 replace_fn(Status* s) {
  return driver_entry<PFN_cuTensorMapReplaceAddress_v12000>("cuTensorMapReplaceAddress", s);
}

}  // namespace

PFN_cuTensorMapEncodeTiled_v12000 encode_fn(Status* s) {
  return driver_entry<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled", s);
}

Status replace_address(CUtensorMap* map, const void* addr, const char* what) {
  Status s;
  auto replace = replace_fn(&s);
  if (!replace) return s;
  if (const CUresult res = replace(map, const_cast<void*>(addr)); res != CUDA_SUCCESS)
    return err(StatusCode::cuda_error, "cuTensorMapReplaceAddress failed for ", what, " (error ", int(res), ")");
  return Status::Ok();
}

Status encode(PFN_cuTensorMapEncodeTiled_v12000 fn, CUtensorMap* map, DType dt, const void* base, int rank,
              const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box, const char* what,
              CUtensorMapSwizzle swizzle) {
  cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  const CUtensorMapDataType type = dt == DType::bf16       ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : dt == DType::fp8_e4m3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8  // bytes, read as e4m3 by wgmma
                                                           : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult res = fn(map, type,
                          static_cast<cuuint32_t>(rank), const_cast<void*>(base), dims, strides, box, elem_strides,
                          CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS) {
    std::ostringstream os;
    os << "dims (";
    for (int i = 0; i < rank; ++i) os << (i ? ", " : "") << dims[i];
    os << ") strides (";
    for (int i = 0; i < rank - 1; ++i) os << (i ? ", " : "") << strides[i];
    os << ") box (";
    for (int i = 0; i < rank; ++i) os << (i ? ", " : "") << box[i];
    os << ")";
    return err(StatusCode::cuda_error, "cuTensorMapEncodeTiled failed for ", what, " (error ", int(res), "): ",
               os.str());
  }
  return Status::Ok();
}

namespace {
// A fresh, nonzero 64-bit token per launch (splitmix64 of a counter seeded
// per process): the split tail's flags compare against it.
uint64_t next_token() {
  static std::atomic<uint64_t> counter{(uint64_t(std::random_device{}()) << 32) ^ std::random_device{}()};
  uint64_t z = counter.fetch_add(0x9e3779b97f4a7c15ull) + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z ? z : 1;
}

constexpr size_t kFlagBytesAlign = 256;

// A timing knob set to "0": the default behaviour turned off.
bool env_off(const char* name) {
  const char* v = std::getenv(name);
  return v && std::string(v) == "0";
}
}  // namespace

bool fp8_promotes() {
  const char* v = std::getenv("GATEDMLP_FP8_PROMOTE");
  return v && std::string(v) == "1";
}

namespace {

size_t flag_bytes(int ctas) {
  return (size_t(ctas) * 2 * sizeof(uint64_t) + kFlagBytesAlign - 1) / kFlagBytesAlign * kFlagBytesAlign;
}
size_t partial_bytes(int ctas) { return size_t(ctas) * 2 * 64 * 256 * sizeof(float); }
// The ticket counter, then kTicketRingSlots slots per CTA (enough for any cluster size).
size_t ticket_bytes(int ctas) { return (kTicketSlotsOffset + size_t(ctas) * kTicketRingSlots) * sizeof(uint32_t); }

// Whole items handed out at run time (Params::tickets): where the static
// order thrashes L2, a long K (each item streams a long run of k-blocks,
// over which the clusters drift apart; docs/notes/split-tail-and-schedule.md, h59).
// GATEDMLP_SM90_TICKETS=1 or =0 says so instead (timing knob, tests).
constexpr int kTicketMinKBlocks = 256;
bool use_tickets(int k_blocks) {
  if (const char* v = std::getenv("GATEDMLP_SM90_TICKETS")) return std::string(v) == "1";
  return k_blocks >= kTicketMinKBlocks;
}
}  // namespace

// Flags, partials, then the tickets.
size_t workspace_bytes(int ctas) { return flag_bytes(ctas) + partial_bytes(ctas) + ticket_bytes(ctas); }

Status prepare(const Problem& r, const Arguments& a, int tile_n, bool pingpong, int sms, void* workspace,
               size_t ws_bytes, Prepared* out) {
  Status s;
  auto fn = encode_fn(&s);
  if (!fn) return s;
  if (!replace_fn(&s)) return s;
  // narrow: 88 or 96 columns, Y's columns from 64 on in a box of their own.
  const bool narrow = tile_n == kTileNarrow.tile_n || tile_n == kTilePingPong96.tile_n;
  if (tile_n != kTile.tile_n && !narrow)
    return err(StatusCode::not_supported, "sm90::launch: no kernel with ", tile_n, "-column tiles");
  if (pingpong) {
    if (!narrow)
      return err(StatusCode::not_supported, "sm90::launch: the ping-pong kernels have 88- or 96-column tiles, not ",
                 tile_n);
    if (const std::string no = pingpong_blocker(r, &a, tile_n); !no.empty())
      return err(StatusCode::not_supported, "sm90::launch: the ping-pong kernels cannot take this call: ", no);
  } else if (tile_n == kTilePingPong96.tile_n) {
    return err(StatusCode::not_supported, "sm90::launch: only the ping-pong kernels have 96-column tiles");
  } else if (narrow) {
    if (const std::string no = narrow_blocker(r, &a); !no.empty())
      return err(StatusCode::not_supported, "sm90::launch: the narrow tile cannot take this call: ", no);
  }

  // A grouped call: the GROUPED kernels, one CTA, 128 columns (grouped_blocker).
  const bool grouped = r.gather.grouped;
  if (grouped && (tile_n != kTile.tile_n || pingpong))
    return err(StatusCode::not_supported, "sm90::launch: a grouped call runs on the ", kTile.tile_n,
               "-column cooperative kernels");
  // FP8: the e4m3 kernels, cooperative with 128-column tiles and 128-deep
  // k-blocks (a stage's rows are 128 bytes either way).
  const bool fp8 = r.input_dtype == DType::fp8_e4m3;
  if (fp8 && (tile_n != kTileFp8.tile_n || pingpong))
    return err(StatusCode::not_supported, "sm90::launch: an FP8 call runs on the ", kTileFp8.tile_n,
               "-column cooperative e4m3 kernels");
  if (fp8)
    if (const std::string no = fp8_blocker(r, &a); !no.empty())
      return err(StatusCode::not_supported, "sm90::launch: the e4m3 kernels cannot take this call: ", no);
  const int64_t xe = int64_t(dtype_size(r.input_dtype));  // bytes per X element
  Params& p = out->p;
  p = Params{};
  constexpr int BM = kTile.tile_m;
  const int BK = fp8 ? kTileFp8.tile_k : kTile.tile_k;
  const int BN = tile_n;
  p.tile_n = tile_n;
  p.pingpong = pingpong;
  p.m = r.m;
  p.k = r.k;
  p.u = r.u;
  p.batch = static_cast<int>(r.batch);
  p.m_tiles = static_cast<int>((r.m + BM - 1) / BM);
  p.n_tiles = static_cast<int>((r.u + BN - 1) / BN);
  p.k_blocks = static_cast<int>((r.k + BK - 1) / BK);
  // Clusters of CTAs sharing the weight tile through multicast: see
  // kClusterM.
  // (The e4m3 kernels come in clusters of one and two.)
  const int cluster_m = grouped ? 1 : fp8 ? std::min(cluster_size(r), 2) : cluster_size(r);
  // Items handed out at run time need the workspace's counter. Only the
  // cooperative kernels in clusters of two have them (the kernel says why);
  // the ping-pong ones, whose warpgroups take a CTA's items in turn, keep
  // the static order.
  const bool tickets =
      !pingpong && !grouped && cluster_m == 2 && workspace && ws_bytes >= workspace_bytes(sms) && use_tickets(p.k_blocks);
  // Tuning knob: GATEDMLP_SM90_GROUP_M row units per raster group (default
  // 16; 4 with tickets, where the items that share a column-block's weights
  // start together and those that share X rows only 4 items apart: docs/notes/split-tail-and-schedule.md,
  // h59).
  // Grouped calls with few column-blocks (Qwen3-30B-A3B's 6, gpt-oss-20b's
  // 23) run faster in groups of 4 as well: -9 % / -4 % on their skewed
  // routings, -1 to -2 % uniform, where Mixtral's 112 columns lost 1-1.5 %
  // (H100, docs/notes/moe.md, h69).
  const char* gm = std::getenv("GATEDMLP_SM90_GROUP_M");
  p.group_m = gm ? std::max(1, std::atoi(gm)) : (tickets || (grouped && p.n_tiles <= 32)) ? 4 : 16;
  // GATEDMLP_SM90_PAIR_COLS=0: an odd row-block count rounded up to whole
  // units of two, as before the column pairs (timing knob).
  // Grouped: the schedule walks the table's upper bound of row units;
  // those past the last expert's are empty and skipped.
  if (grouped) p.m_tiles = static_cast<int>(grouped_units(r.m, r.gather.experts, BM));
  plan_items(p, cluster_m, r.batch, !env_off("GATEDMLP_SM90_PAIR_COLS"));

  // X: (K, M, L).
  p.x_batched = r.batch > 1 && r.batch_stride_x != 0;
  {
    const cuuint64_t dims[3] = {cuuint64_t(r.k), cuuint64_t(r.m), cuuint64_t(p.x_batched ? r.batch : 1)};
    const cuuint64_t strides[2] = {cuuint64_t(r.ldx * xe),
                                   cuuint64_t(p.x_batched ? r.batch_stride_x * xe : r.m * r.ldx * xe)};
    // M < BM: boxes of only the rows there are (rounded up to 8, the
    // swizzle's period), not boxes mostly past the tensor's edge: with those,
    // 8B M = 1 and 16 took 16 % longer than M = 128 (docs/notes/hopper-kernel.md, h16).
    // GATEDMLP_SM90_NARROW_X=0: always BM rows.
    p.x_rows = (r.m < BM && !env_off("GATEDMLP_SM90_NARROW_X")) ? static_cast<int>((r.m + 7) / 8 * 8) : BM;
    const cuuint32_t box[3] = {cuuint32_t(BK), cuuint32_t(p.x_rows), 1};
    if (Status e = encode(fn, &p.tma_x, r.input_dtype, a.x, 3, dims, strides, box, "x"); !e) return e;
  }

  // Weights: (K, G, H, U/G, L).
  const bool sep = r.weights.format == WeightFormat::separate;
  const int64_t g = map_group(r);
  const int64_t halves = sep ? 1 : 2;
  const int64_t blocks = r.u / g;
  const int64_t row_bytes = r.weights.ld * (r.quantized ? 4 : 2);  // FP8 weights: ld counts uint32 words
  p.w_group = g;
  // Grouped: the experts take the batch's place (the weights' L coordinate).
  p.w_batched = grouped || (r.batch > 1 && r.batch_stride_w != 0);
  const int64_t w_l = grouped ? r.gather.experts : r.batch;
  p.gate_half = sep ? 0 : (r.weights.first == Half::gate ? 0 : 1);
  p.up_half = sep ? 0 : 1 - p.gate_half;
  {
    // Blocks of at least a tile: the box is `rows` consecutive rows of one
    // block. Smaller blocks: the box takes rows/G blocks of G rows. `rows` is
    // a whole half of the tile (128), or the part one CTA of a cluster loads.
    // 96 columns of G = 64, 128, ... (neither): three boxes of 32 rows of
    // one block each (w_sub_boxes; narrow_tile_blocker has G % 32 == 0).
    const bool big = g == r.u || g % BN == 0;
    const bool sub = !big && BN % g != 0;
    const int64_t rows = BN / std::max(1, cluster_m / 2);
    p.w_part_c1 = big ? static_cast<int>(rows) : 0;
    p.w_part_c3 = big ? 0 : static_cast<int>(rows / g);
    p.w_sub_boxes = sub ? BN / kSubBoxRows : 0;
    if (sub && (!pingpong || g % kSubBoxRows != 0))
      return err(StatusCode::not_supported, "sm90::launch: ", BN, "-column tiles cannot gather weights in blocks of G=", g);
    const cuuint64_t dims[5] = {cuuint64_t(r.k), cuuint64_t(g), cuuint64_t(halves), cuuint64_t(blocks),
                                cuuint64_t(p.w_batched ? w_l : 1)};
    const cuuint64_t strides[4] = {cuuint64_t(row_bytes), cuuint64_t(g * row_bytes),
                                   cuuint64_t(halves * g * row_bytes),
                                   cuuint64_t(p.w_batched ? r.batch_stride_w * 2 : blocks * halves * g * row_bytes)};
    const cuuint32_t box[5] = {cuuint32_t(BK), cuuint32_t(sub ? kSubBoxRows : big ? rows : g), 1,
                               cuuint32_t(big || sub ? 1 : rows / g), 1};
    if (Status e = encode(fn, &p.tma_wg, r.input_dtype, a.w, 5, dims, strides, box, sep ? "w (gate)" : "w"); !e)
      return e;
    if (sep) {
      if (Status e = encode(fn, &p.tma_wu, r.input_dtype, a.w_up, 5, dims, strides, box, "w_up"); !e) return e;
    } else {
      p.tma_wu = p.tma_wg;
    }
  }

  p.bias = a.bias;
  p.bias_up = a.bias_up;
  p.y = a.y;
  p.pre = a.preact;
  p.ldy = r.ldy;
  p.ldpre = r.ldpre;
  p.sb = r.batch_stride_bias;
  p.sy = r.batch_stride_y;
  p.spre = r.batch_stride_preact;
  p.group = sep ? r.u : r.weights.group;
  p.first = static_cast<int>(r.weights.first);
  p.separate = sep;
  p.alpha = r.alpha;
  p.clamp_alpha = r.act_params.clamp_alpha;
  p.clamp_limit = r.act_params.clamp_limit;
  p.out_dtype = static_cast<int>(r.output_dtype);
  p.bias_dtype = static_cast<int>(r.bias_dtype);
  p.pre_dtype = static_cast<int>(r.preact_dtype);
  p.has_bias = r.has_bias;
  p.has_pre = r.has_preact;
  // Pre-activation columns (see store_pre): runs per half, interleaved
  // blocks of G (a power of two dividing 128), or G = 1 pairs.
  // (The pre-activation runs only with 128-column tiles: narrow_blocker.)
  if (sep || r.weights.group == r.u || r.weights.group % kTile.tile_n == 0) {
    p.pre_mode = 0;
  } else {
    p.pre_mode = r.weights.group == 1 ? 2 : 1;
    while ((int64_t{1} << p.pre_log2g) < r.weights.group) ++p.pre_log2g;
  }
  if (r.has_preact) {
    // Pairs start at even columns of even runs: every run start (U for the
    // up half of stacked weights) and stride must be even too.
    const size_t pre_size = dtype_size(r.preact_dtype);
    p.pre_vec2 = r.ldpre % 2 == 0 && (r.batch == 1 || r.batch_stride_preact % 2 == 0) &&
                 (p.pre_mode != 0 || r.u % 2 == 0) && reinterpret_cast<uintptr_t>(a.preact) % (2 * pre_size) == 0;
  }
  const size_t out_size = dtype_size(r.output_dtype);
  p.y_vec4 = r.ldy % 4 == 0 && (r.batch == 1 || r.batch_stride_y % 4 == 0) &&
             reinterpret_cast<uintptr_t>(a.y) % (4 * out_size) == 0;

  p.y_tma = y_by_tma(r, &a);
  if (p.y_tma) {
    const bool batched = r.batch > 1;
    const int64_t es = int64_t(out_size);
    const cuuint64_t dims[3] = {cuuint64_t(r.u), cuuint64_t(r.m), cuuint64_t(r.batch)};
    const cuuint64_t strides[2] = {cuuint64_t(r.ldy * es),
                                   cuuint64_t(batched ? r.batch_stride_y * es : r.m * r.ldy * es)};
    // 128-byte rows either way: 64 16-bit columns, or an FP8 tile's 128.
    const cuuint32_t box[3] = {cuuint32_t(128 / es), 64, 1};
    if (Status e = encode(fn, &p.tma_y, r.output_dtype, a.y, 3, dims, strides, box, "y"); !e) return e;
    if (narrow) {
      // The tile's columns 64 ... 87: 48-byte rows, no swizzle; 64 ... 95:
      // 64-byte rows with the 64-byte swizzle (park_y_swizzled).
      const cuuint32_t tail[3] = {cuuint32_t(BN - 64), 64, 1};
      const bool w96 = BN == kTilePingPong96.tile_n;
      if (Status e = encode(fn, &p.tma_y_tail, r.output_dtype, a.y, 3, dims, strides, tail,
                            w96 ? "y (last 32 columns)" : "y (last 24 columns)",
                            w96 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_NONE);
          !e)
        return e;
    }
  }

  // The pre-activation through TMA stores, like Y, in kernels of their own
  // (PRE = 1): the input's dtype, rows and batches on 16-byte boundaries, U
  // whole tiles (so no box reaches past a run of columns), cluster size 1 or
  // 2, any activation but gelu_erf (launch.cuh). Stored from registers
  // instead, its 4-byte stores fill half of each 32-byte sector and cost
  // 7-13 % of the time rather than 2-5 % (docs/notes/pre-activation.md, h13).
  // GATEDMLP_SM90_PRE_TMA=0 turns it off (for timing comparisons). Y must
  // go by TMA too: these kernels compute Y in the 16-bit output's form of
  // the activation (glu_out16), so they never feed an fp32 Y.
  p.pre_tma = !pingpong && !fp8 && r.has_preact && p.y_tma && !env_off("GATEDMLP_SM90_PRE_TMA") &&
              r.preact_dtype == r.input_dtype && r.u % kTile.tile_n == 0 && cluster_m <= 2 &&
              r.activation != Activation::gelu_erf &&
              r.ldpre % 8 == 0 && (r.batch == 1 || r.batch_stride_preact % 8 == 0) && aligned16(a.preact) &&
              r.m * r.ldpre * 2 < kMaxStrideBytes && r.batch_stride_preact * 2 < kMaxStrideBytes;
  // The pre-activation's tensor maps. As (2U, M, L): for the PRE = 1
  // cooperative kernels (64 x 64 swizzled boxes), and for the ping-pong
  // kernels with interleaved weights (G = 1, or blocks of 8 or more rows
  // dividing the tile: one unswizzled box of BN columns per round).
  // As (U, 2 runs, M, L): for the ping-pong kernels with stacked or separate
  // weights (pingpong_blocker takes no others), so that a box stops at the
  // end of its run; tma_pre_tail is the tile's last 24 columns, as for Y.
  const bool pp_pre = pingpong && r.has_preact;
  const cuuint64_t pre_batch_stride =
      cuuint64_t(r.batch > 1 ? r.batch_stride_preact * 2 : r.m * r.ldpre * 2);
  if (pp_pre && p.w_sub_boxes) {
    // The 96-column kernels with weights in blocks of 64 or more: a 64 x 32
    // box per weight sub-box, with the 64-byte swizzle (park_y_swizzled's
    // BOX32).
    const cuuint64_t dims[3] = {cuuint64_t(2 * r.u), cuuint64_t(r.m), cuuint64_t(r.batch)};
    const cuuint64_t strides[2] = {cuuint64_t(r.ldpre * 2), pre_batch_stride};
    const cuuint32_t box[3] = {cuuint32_t(kSubBoxRows), 64, 1};
    if (Status e = encode(fn, &p.tma_pre, r.preact_dtype, a.preact, 3, dims, strides, box, "preact (32-column pieces)",
                          CU_TENSOR_MAP_SWIZZLE_64B);
        !e)
      return e;
  } else if (p.pre_tma || (pp_pre && p.pre_mode != 0)) {
    const bool g1 = pp_pre;  // interleaved blocks the tile holds whole (store_pre_pingpong)
    const cuuint64_t dims[3] = {cuuint64_t(2 * r.u), cuuint64_t(r.m), cuuint64_t(r.batch)};
    const cuuint64_t strides[2] = {cuuint64_t(r.ldpre * 2), pre_batch_stride};
    const cuuint32_t box[3] = {cuuint32_t(g1 ? BN : 64), 64, 1};
    if (Status e = encode(fn, &p.tma_pre, r.preact_dtype, a.preact, 3, dims, strides, box,
                          g1 ? "preact (interleaved)" : "preact", g1 ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B);
        !e)
      return e;
  } else if (pp_pre) {
    const cuuint64_t dims[4] = {cuuint64_t(r.u), 2, cuuint64_t(r.m), cuuint64_t(r.batch)};
    const cuuint64_t strides[3] = {cuuint64_t(r.u * 2), cuuint64_t(r.ldpre * 2), pre_batch_stride};
    const cuuint32_t box[4] = {64, 1, 64, 1}, tail[4] = {cuuint32_t(BN - 64), 1, 64, 1};
    if (Status e = encode(fn, &p.tma_pre, r.preact_dtype, a.preact, 4, dims, strides, box, "preact"); !e) return e;
    if (Status e = encode(fn, &p.tma_pre_tail, r.preact_dtype, a.preact, 4, dims, strides, tail,
                          "preact (last 24 columns)", CU_TENSOR_MAP_SWIZZLE_NONE);
        !e)
      return e;
  }

  // Split-tail workspace: flags first, then the partial tiles. (The
  // ping-pong kernels run every item whole.) launch_prepared points them at
  // each call's workspace.
  const bool ws_ok = !pingpong && !grouped && workspace && ws_bytes >= workspace_bytes(sms);
  if (ws_ok) {
    p.sk_flag = static_cast<uint64_t*>(workspace);
    p.sk_part = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) + flag_bytes(sms));
    p.sk_ctas = sms;
  }
  if (tickets)
    p.tickets = reinterpret_cast<uint32_t*>(static_cast<unsigned char*>(workspace) + flag_bytes(sms) + partial_bytes(sms));

  p.grouped = grouped;
  if (fp8) {
    p.fp8 = 1;
    p.x_scale = a.x_scales;
    p.w_scale = a.w_scales;
    p.w_scale_up = a.w_up_scales;
    p.x_scale_row = r.x_scale == XScale::row;
    p.w_scale_col = r.quant.row_block == 1;
    p.x_scale_block = r.x_scale == XScale::block;
    p.w_scale_block = r.quant.row_block == 128;
    p.k_groups = static_cast<int>((r.k + 127) / 128);
    p.fp8_promote = p.x_scale_block || p.w_scale_block || r.fp8_promote || fp8_promotes();
    p.scale_dtype = static_cast<int>(r.scale_dtype);
    if (r.output_dtype == DType::fp8_e4m3) {
      p.y_fp8 = 1;
      p.y_scales = a.y_scales;
      p.ys_row = detail::y_scale_row_stride(r);
      p.ys_group = detail::y_scale_group_stride(r);
      p.y_amax = r.has_y_amax ? a.y_amax : nullptr;
    }
  }
  const int act = static_cast<int>(r.activation);
  const cudaError_t e = fp8                            ? setup_fp8(p, act, cluster_m, sms, &out->k)
                        : r.input_dtype == DType::bf16 ? setup_bf16(p, act, cluster_m, sms, &out->k)
                                                       : setup_fp16(p, act, cluster_m, sms, &out->k);
  if (e != cudaSuccess) return err(StatusCode::cuda_error, "Hopper kernel set-up failed: ", cudaGetErrorString(e));
  out->uses_workspace = out->k.split || p.tickets != nullptr || grouped;
  out->sms = sms;
  if (grouped) {
    out->experts = r.gather.experts;
    out->index64 = r.gather.index_type == IndexType::int64;
    out->units = p.m_tiles;
  }
  out->x = a.x;
  out->w = a.w;
  out->w_up = a.w_up;
  out->y = p.y_tma ? a.y : nullptr;
  out->pre = a.preact;
  return Status::Ok();
}

Status launch_prepared(Prepared& pr, const Arguments& a, void* workspace, size_t ws_bytes, cudaStream_t stream) {
  Params& p = pr.p;
  // New addresses into the tensor maps that hold the old ones.
  if (a.x != pr.x || a.w != pr.w || a.w_up != pr.w_up || (p.y_tma && a.y != pr.y) || a.preact != pr.pre) {
    if (a.x != pr.x)
      if (Status e = replace_address(&p.tma_x, a.x, "x"); !e) return e;
    if (a.w != pr.w)
      if (Status e = replace_address(&p.tma_wg, a.w, "w"); !e) return e;
    if (p.separate ? a.w_up != pr.w_up : a.w != pr.w)
      if (Status e = replace_address(&p.tma_wu, p.separate ? a.w_up : a.w, "w_up"); !e) return e;
    if (p.y_tma && a.y != pr.y) {
      if (Status e = replace_address(&p.tma_y, a.y, "y"); !e) return e;
      if (p.tile_n != kTile.tile_n)
        if (Status e = replace_address(&p.tma_y_tail, a.y, "y"); !e) return e;
    }
    if (a.preact != pr.pre) {
      // Only the maps encoded for it (prepare): a zeroed map has no address to replace.
      const bool pp = p.pingpong && p.has_pre;
      if (p.pre_tma || pp)
        if (Status e = replace_address(&p.tma_pre, a.preact, "preact"); !e) return e;
      if (pp && !p.w_sub_boxes && p.pre_mode == 0)
        if (Status e = replace_address(&p.tma_pre_tail, a.preact, "preact"); !e) return e;
    }
    pr.x = a.x;
    pr.w = a.w;
    pr.w_up = a.w_up;
    if (p.y_tma) pr.y = a.y;
    pr.pre = a.preact;
  }
  p.bias = a.bias;
  p.bias_up = a.bias_up;
  p.y = a.y;
  p.pre = a.preact;
  if (p.fp8) {
    p.x_scale = a.x_scales;
    p.w_scale = a.w_scales;
    p.w_scale_up = a.w_up_scales;
    if (p.y_fp8) {
      p.y_scales = a.y_scales;
      if (p.y_amax) p.y_amax = a.y_amax;  // set at prepare() iff has_y_amax
      // The kernel folds each tile's amax in with atomicMax: it starts from 0.
      if (p.y_amax)
        if (const cudaError_t e = cudaMemsetAsync(p.y_amax, 0, sizeof(float), stream); e != cudaSuccess)
          return err(StatusCode::cuda_error, "zeroing y_amax failed: ", cudaGetErrorString(e));
    }
  }
  if (p.grouped) {
    // The plan kernel writes the table of row units from this call's
    // offsets (and checks them), then the kernel walks it.
    const size_t need = size_t(pr.units) * 4 * sizeof(int32_t);
    if (!workspace || ws_bytes < need)
      return err(StatusCode::invalid_argument, "a grouped call needs ", need,
                 " bytes of workspace for its table of row units (workspace_size()), got ", ws_bytes);
    p.items = static_cast<const int32_t*>(workspace);
    if (const cudaError_t e = launch_grouped_plan(a.indices, pr.index64, pr.experts, p.m, pr.units, kTile.tile_m,
                                                  static_cast<int32_t*>(workspace), a.index_error, a.index_trap, stream);
        e != cudaSuccess)
      return err(StatusCode::cuda_error, "the grouped call's plan kernel failed to launch: ", cudaGetErrorString(e));
  } else if (pr.uses_workspace) {
    if (!workspace || ws_bytes < workspace_bytes(pr.sms))
      return err(StatusCode::invalid_argument, "sm90: this call was prepared with a workspace of ",
                 workspace_bytes(pr.sms), " bytes, got ", ws_bytes);
    unsigned char* w = static_cast<unsigned char*>(workspace);
    if (p.sk_ctas) {
      p.sk_flag = reinterpret_cast<uint64_t*>(w);
      p.sk_part = reinterpret_cast<float*>(w + flag_bytes(pr.sms));
    }
    if (p.tickets) p.tickets = reinterpret_cast<uint32_t*>(w + flag_bytes(pr.sms) + partial_bytes(pr.sms));
  }
  if (pr.k.split) {
    p.sk_token = next_token();
    // A CUDA graph replays the token it captured, and the flags keep the
    // last replay's: an owner would take them as raised and add partials
    // not yet written. Captured calls therefore zero the flags first (a
    // memset node in the graph); no token is zero.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
      (void)cudaGetLastError();
      capture = cudaStreamCaptureStatusActive;  // unknown: zeroing is always correct
    }
    if (capture != cudaStreamCaptureStatusNone)
      if (const cudaError_t e = cudaMemsetAsync(p.sk_flag, 0, flag_bytes(pr.sms), stream); e != cudaSuccess)
        return err(StatusCode::cuda_error, "zeroing the split tail's flags failed: ", cudaGetErrorString(e));
  }
  const cudaError_t e = pr.k.launch(pr.k, p, stream);
  if (e != cudaSuccess) return err(StatusCode::cuda_error, "Hopper kernel launch failed: ", cudaGetErrorString(e));
  return Status::Ok();
}

Status launch(const Problem& r, const Arguments& a, int tile_n, bool pingpong, int sms, void* workspace,
              size_t ws_bytes, cudaStream_t stream) {
  Prepared pr;
  if (Status s = prepare(r, a, tile_n, pingpong, sms, workspace, ws_bytes, &pr); !s) return s;
  return launch_prepared(pr, a, workspace, ws_bytes, stream);
}

}  // namespace gatedmlp::sm90
