// The one place that picks the kernel path and its config for a problem.
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <sstream>

#include "core/internal.hpp"
#include "gatedmlp/quant.hpp"
#include "decode_glu/decode_glu.hpp"
#include "decode_glu/hopper.hpp"
#include "quant_decode/hopper.hpp"
#include "down/down.hpp"
#include "quant_decode/quant_decode.hpp"
#include "sm80_gemm_glu/sm80_gemm_glu.hpp"
#include "sm90_gemm_glu/schedule.hpp"
#include "sm90_gemm_glu/sm90_gemm_glu.hpp"

namespace gatedmlp::detail {

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Why 16-byte loads cannot be used, or "" if they can. cp.async moves 8
// elements at a time, so every row start must be a multiple of 8 elements.
std::string vector_blocker(const Problem& r, const Arguments* a) {
  std::ostringstream os;
  if (r.k % 8) os << "k=" << r.k << " is not a multiple of 8";
  else if (r.ldx % 8) os << "ldx=" << r.ldx << " is not a multiple of 8";
  else if (r.weights.storage == WeightStorage::in_out) os << "weights stored in_out ([K, out])";
  else if (r.weights.ld % 8) os << "weights.ld=" << r.weights.ld << " is not a multiple of 8";
  else if (r.batch > 1 && r.batch_stride_x % 8) os << "batch_stride_x=" << r.batch_stride_x << " is not a multiple of 8";
  else if (r.batch > 1 && r.batch_stride_w % 8) os << "batch_stride_w=" << r.batch_stride_w << " is not a multiple of 8";
  else if (a && !aligned16(a->x)) os << "x is not 16-byte aligned";
  else if (a && !aligned16(a->w)) os << "w is not 16-byte aligned";
  else if (a && a->w_up && !aligned16(a->w_up)) os << "w_up is not 16-byte aligned";
  return os.str();
}

// GATEDMLP_FORCE_PATH=portable keeps every call on the mma.sync kernel (for
// tests and for benchmarking it on a Hopper GPU); unset or "hopper" lets the
// fast path take what it can.
bool portable_forced() {
  const char* v = std::getenv("GATEDMLP_FORCE_PATH");
  return v && std::string(v) == "portable";
}

// Why the decode kernel does not take this call, or "" if it does. It takes
// every call it can run (M <= decode::kMaxM): at so few rows a call streams
// the weights once and the GEMM kernels' 128-row tiles are mostly empty.
// GATEDMLP_DECODE=0 leaves it out (tests of the other kernels at small M,
// timing); GATEDMLP_FORCE_PATH=portable does too.
std::string decode_blocker(const Problem& r, const Arguments* a) {
  if (portable_forced()) return "GATEDMLP_FORCE_PATH=portable";
  if (const char* v = std::getenv("GATEDMLP_DECODE"); v && std::string(v) == "0") return "GATEDMLP_DECODE=0";
  return decode::blocker(r, a);
}

// Why the decode kernel's Hopper form (decode_glu/hopper.hpp) does not take
// a call the decode kernel takes, or "" if it does: what it can run
// (decode::hopper_blocker), then where it was measured faster than the
// register form (decode::hopper_grid_blocker, h76, h77).
// GATEDMLP_DECODE_HOPPER=0 leaves it out, =1 takes it wherever it can run
// (tests and timing of either form).
std::string decode_hopper_blocker(const Problem& r, const Arguments* a, const DeviceInfo& dev) {
  if (dev.major != 9 || dev.minor != 0) return "not an sm_90 device";
  const char* v = std::getenv("GATEDMLP_DECODE_HOPPER");
  const std::string knob = v ? v : "";
  if (knob == "0") return "GATEDMLP_DECODE_HOPPER=0";
  if (std::string no = decode::hopper_blocker(r, a); !no.empty()) return no;
  return knob == "1" ? std::string() : decode::hopper_grid_blocker(r, dev.sms);
}

// Why the Hopper kernel does not take this call, or "" if it does.
std::string hopper_blocker(const Problem& r, const Arguments* a, const DeviceInfo& dev) {
  if (dev.major != 9 || dev.minor != 0) return "not an sm_90 device";
  if (portable_forced()) return "GATEDMLP_FORCE_PATH=portable";
  if (size_t(sm90::kTile.smem_bytes) > dev.smem_optin) return "too little shared memory per block";
  return sm90::blocker(r, a);
}

// Which Hopper tile: the 128-column one, or the narrow 88-column one where
// its waves fill the SMs enough better to pay for its 45 % more tiles. The
// model: a persistent kernel's time is the waves it runs x (columns per item
// + a fixed per-item cost). Without a split tail that is the whole waves,
// ceil(items / clusters); with one (schedule.hpp), the exact waves plus a
// fixed cost of the split, kSplitCostItems of an item's time (at most the
// whole waves). Measured: the split costs ~11 us over its share of the work
// at 8B, about 0.27 of a 128-column item (docs/notes/split-tail-and-schedule.md h29), and at 8B M = 1024
// (6.79 waves) it recovered nothing (h8). Fitted to both tiles forced at 8B,
// 70B and 405B, M = 256 ... 16384 (docs/notes/hopper-kernel.md h33); by it 8B M = 256 ... 1536,
// 70B M = 256 ... 512 and 768, and 405B M <= 128 take the narrow tile (405B
// M = 1 / 64 / 128 measured 0.965 / 1.057 / 0.938 of cuBLAS with it against
// 0.939 / 1.011 / 0.837 with 128 columns). The model before
// (a split giving back half of an idle last wave) kept 128 at 8B M = 1024,
// where 88 measured 1-2 % faster in every run.
// The ping-pong kernels (the narrow tile, each warpgroup running whole items
// in turn) hide the per-item epilogue under the other warpgroup's main loop,
// so their per-item cost is smaller (kPingPongOverheadColumns), but they
// have no split tail: their waves are always whole.
// Their 96-column tile is a candidate only where the 88-column one cannot
// run: weights in blocks of 16, 32, 64, 128, ... rows (an 88-row box would
// start inside a block), which otherwise take the 128-column tile (8B M =
// 4096: 2.8-3.0 % behind stacked weights, 0.8-0.9 % on 96 columns; docs/notes/ping-pong-96-columns.md
// h56, h57), with or without a pre-activation (h58). Where both can run,
// a probe measured the two within 0.5 % of each other (docs/notes/ping-pong.md, h55), and
// the 88-column kernels are the ones the bars were measured with.
// GATEDMLP_SM90_TILE=88|128|pp|pp96 forces one (tests; 88, pp and pp96
// only where they can run; pp: 88 columns, else 96);
// GATEDMLP_SM90_PINGPONG=0 leaves the ping-pong kernels out of the pick
// (timing knob).
constexpr int kItemOverheadColumns = 4;  // per-item fixed cost, in columns' worth of main loop
constexpr int kPingPongOverheadColumns = 1;
constexpr double kSplitCostItems = 0.3;  // a split tail's fixed cost, in items

struct TileEstimate {
  int64_t items = 0, clusters = 0;
  double waves = 0, waves_run = 0, cost = 0;
  bool split = false;
};

bool is_pingpong(const sm90::Tile& t) { return &t == &sm90::kTilePingPong || &t == &sm90::kTilePingPong96; }

// A Hopper path's config for one of its tiles (the reason is the caller's).
Config hopper_config(const sm90::Tile& t) {
  Config c;
  c.path = KernelPath::sm90_wgmma;
  c.tile_m = t.tile_m;
  c.tile_n = t.tile_n;
  c.tile_k = t.tile_k;
  c.stages = t.stages;
  c.threads = t.threads;
  c.pingpong = is_pingpong(t);
  c.vector_loads = true;
  return c;
}

// t: kTile, kTileNarrow, kTilePingPong or kTilePingPong96 (the last two:
// one-CTA clusters, never split).
TileEstimate estimate(const Problem& r, const sm90::Tile& t, int sms) {
  const bool pingpong = is_pingpong(t);
  const int cm = pingpong ? 1 : sm90::cluster_size(r);
  sm90::Params p{};
  p.m_tiles = static_cast<int>((r.m + t.tile_m - 1) / t.tile_m);
  p.n_tiles = static_cast<int>((r.u + t.tile_n - 1) / t.tile_n);
  p.k_blocks = static_cast<int>((r.k + t.tile_k - 1) / t.tile_k);
  sm90::plan_items(p, cm, r.batch, true);  // (the item count does not depend on p.group_m)
  p.sk_ctas = sms;  // as with workspace_size()'s workspace
  TileEstimate e;
  e.items = p.tiles;
  e.clusters = std::max(1, sms / cm);
  e.split = !pingpong && sm90::plan_split_tail(p, e.clusters, cm, true);
  e.waves = double(e.items) / double(e.clusters);
  e.waves_run = double((e.items + e.clusters - 1) / e.clusters);
  if (e.split) e.waves_run = std::min(e.waves_run, e.waves + kSplitCostItems);
  e.cost = e.waves_run * (t.tile_n + (pingpong ? kPingPongOverheadColumns : kItemOverheadColumns));
  return e;
}

const sm90::Tile& pick_hopper_tile(const Problem& r, const Arguments* a, const DeviceInfo& dev, std::string* why) {
  std::ostringstream os;
  const std::string no = sm90::narrow_blocker(r, a);
  const std::string pp_no = sm90::pingpong_blocker(r, a, sm90::kTilePingPong.tile_n);
  const std::string pp96_no = sm90::pingpong_blocker(r, a, sm90::kTilePingPong96.tile_n);
  const char* force = std::getenv("GATEDMLP_SM90_TILE");
  const std::string f = force ? force : "";
  const char* pp_knob = std::getenv("GATEDMLP_SM90_PINGPONG");
  const bool pp_off = pp_knob && std::string(pp_knob) == "0";
  const auto fits = [&](const sm90::Tile& t) { return size_t(t.smem_bytes) <= dev.smem_optin; };
  const bool narrow_ok = no.empty() && fits(sm90::kTileNarrow);
  const bool pp88_ok = pp_no.empty() && fits(sm90::kTilePingPong) && !pp_off;
  const bool pp96_ok = pp96_no.empty() && fits(sm90::kTilePingPong96) && !pp_off;
  // The ping-pong candidate: 88 columns where they run, else 96 (see above);
  // GATEDMLP_SM90_TILE=pp96 makes it 96 wherever those run.
  const sm90::Tile* pp_tile = pp88_ok ? &sm90::kTilePingPong : pp96_ok ? &sm90::kTilePingPong96 : nullptr;
  if (f == "pp96" && pp96_ok) pp_tile = &sm90::kTilePingPong96;
  const bool pp_ok = pp_tile != nullptr;
  // Why there is no ping-pong candidate.
  auto no_pingpong = [&]() -> std::string {
    if (pp_no.empty() || pp96_no.empty()) return "GATEDMLP_SM90_PINGPONG=0 or too little shared memory";
    return pp_no == pp96_no ? pp_no : pp_no + " (96 columns: " + pp96_no + ")";
  };
  if ((!narrow_ok && !pp_ok) || f == "128") {
    os << sm90::kTile.tile_n << "-column tiles";
    if (f == "128") os << " (GATEDMLP_SM90_TILE=128)";
    else if (!no.empty())
      os << " (the " << sm90::kTileNarrow.tile_n << "-column tile cannot take " << no
         << (pp_no.empty() && pp96_no.empty() ? "" : "; the ping-pong kernels: " + no_pingpong()) << ")";
    *why = os.str();
    return sm90::kTile;
  }
  const TileEstimate wide = estimate(r, sm90::kTile, dev.sms), narrow = estimate(r, sm90::kTileNarrow, dev.sms);
  const TileEstimate pp = pp_ok ? estimate(r, *pp_tile, dev.sms) : TileEstimate{};
  const sm90::Tile* pick = narrow_ok && narrow.cost < wide.cost ? &sm90::kTileNarrow : &sm90::kTile;
  if (pp_ok && pp.cost < (narrow_ok ? std::min(narrow.cost, wide.cost) : wide.cost)) pick = pp_tile;
  if (f == "88") pick = narrow_ok ? &sm90::kTileNarrow : &sm90::kTile;
  if (f == "pp" && pp_ok) pick = pp_tile;
  if (f == "pp96" && pp96_ok) pick = &sm90::kTilePingPong96;
  auto show = [&](const TileEstimate& e, const char* name) {
    os << name << " " << e.items << " items, " << e.waves << " waves (run as " << e.waves_run
       << (e.split ? ", split tail" : "") << ")";
  };
  os << pick->tile_n << "-column tiles" << (is_pingpong(*pick) ? ", ping-pong" : "")
     << (f == "88" || f == "pp" || f == "pp96" ? " (GATEDMLP_SM90_TILE=" + f + ")" : "") << " on " << wide.clusters
     << " clusters: ";
  os.precision(3);
  if (pp_ok) {
    show(pp, pp_tile == &sm90::kTilePingPong ? "ping-pong 88 columns" : "ping-pong 96 columns");
    os << " against ";
  }
  if (narrow_ok) {
    show(narrow, "88 columns");
    os << " against ";
  }
  show(wide, "128 columns");
  if (!pp_ok) os << "; no ping-pong: " << no_pingpong();
  if (!narrow_ok) os << "; no cooperative 88-column tile: " << no;
  *why = os.str();
  return *pick;
}

}  // namespace

namespace {

// A gathered (MoE) call: the decode kernels only, which read each distinct
// expert's weights once for all its rows; none of the GEMM paths gathers,
// and dequantizing every expert would read them all. Knobs that keep
// calls off the decode kernel do not apply. `kp`: the problem the kernel
// reads (the down projection's after its passes).
Status select_gathered(const Problem& r, const Problem& kp, const Arguments* a, Config* cfg) {
  const bool down = is_down(r);
  const std::string no = kp.quantized ? quant_decode::blocker(kp, a) : decode::blocker(kp, a);
  if (!no.empty())
    return err(StatusCode::not_supported, "a gathered call runs on the ", kp.quantized ? "quantized " : "",
               "decode kernel, which cannot take ", no);
  Config c;
  c.path = kp.quantized ? KernelPath::quant_decode : KernelPath::decode;
  c.tile_m = kp.quantized ? decode::gathered_tile_rows(kp, int(quant_decode::max_tile_rows(kp)))
                          : decode::gathered_tile_rows(kp, int(decode::kMaxM));
  c.tile_n = down ? 16 : 8;
  c.vector_loads = true;
  std::string ahead_why;
  c.ahead = kp.quantized ? quant_decode::tiled_ahead(kp, 0, &ahead_why) : 0;  // one column group: no SMs needed
  std::ostringstream os;
  os << (down ? "down projection, " : "") << "gathered over " << r.gather.experts << " experts on the "
     << (kp.quantized ? "quantized decode kernel (" + to_string(r.quant) + " weights)" : std::string("decode kernel"))
     << ": each distinct expert's weights streamed once for its rows, " << c.tile_m << " rows per tile";
  if (!ahead_why.empty()) os << "; " << ahead_why;
  if (r.glu_input) os << "; the GLU of its input computed into the workspace first";
  c.reason = os.str();
  *cfg = c;
  return Status::Ok();
}

// A grouped call (rows sorted by expert, E offsets; prefill): the Hopper
// kernel's grouped form only, which runs each expert's rows as GEMM tiles
// against that expert's weights. No other kernel reads the offsets.
Status select_grouped(const Problem& r, const Arguments* a, const DeviceInfo& dev, Config* cfg) {
  std::string no;
  if (dev.major != 9 || dev.minor != 0) no = "not an sm_90 device";
  else if (size_t(sm90::kTile.smem_bytes) > dev.smem_optin) no = "too little shared memory per block";
  else no = sm90::grouped_blocker(r, a);
  if (!no.empty())
    return err(StatusCode::not_supported, "a grouped call (gather.grouped) runs on the Hopper TMA + wgmma kernel "
               "only, which cannot take it: ", no, " (device ", dev.device, ": ", dev.name, ")");
  Config c = hopper_config(sm90::kTile);
  std::ostringstream os;
  os << "grouped over " << r.gather.experts << " experts on the Hopper TMA + wgmma path: rows sorted by expert, "
     << "each expert's rows in " << c.tile_m << "-row tiles of its own against its weights; " << c.tile_n
     << "-column tiles, one CTA per SM, a table of at most " << sm90::grouped_units(r.m, r.gather.experts, c.tile_m)
     << " row units written from the offsets first";
  c.reason = os.str();
  *cfg = c;
  return Status::Ok();
}

// FP8 activations and weights: the Hopper kernel's e4m3 form only (wgmma
// reads FP8 operands as they are, K-major); no other kernel takes FP8 X.
Status select_fp8(const Problem& r, const Arguments* a, const DeviceInfo& dev, Config* cfg) {
  std::string no;
  if (dev.major != 9 || dev.minor != 0) no = "not an sm_90 device";
  else if (portable_forced()) no = "GATEDMLP_FORCE_PATH=portable (the portable kernel has no FP8 form)";
  else if (size_t(sm90::kTileFp8.smem_bytes) > dev.smem_optin) no = "too little shared memory per block";
  else no = sm90::fp8_blocker(r, a);
  if (!no.empty())
    return err(StatusCode::not_supported, "FP8 activations (input_dtype=fp8_e4m3) run on the Hopper TMA + wgmma "
               "kernel only, which cannot take this call: ", no, " (device ", dev.device, ": ", dev.name, ")");
  const sm90::Tile& t = sm90::kTileFp8;
  Config c = hopper_config(t);
  std::ostringstream os;
  const bool blocked = r.quant.row_block == 128;
  const bool promote = blocked || r.x_scale == XScale::block || r.fp8_promote || sm90::fp8_promotes();
  os << "FP8 e4m3 on the Hopper TMA + wgmma path: x scaled per "
     << (r.x_scale == XScale::row ? "row" : r.x_scale == XScale::block ? "row and 128 of K" : "tensor")
     << ", weights per " << (blocked ? "128 x 128 block" : r.quant.row_block == 1 ? "output channel" : "tensor")
     << (promote ? "; each 128-deep k-block summed in its own accumulator (m64n64k32 wgmmas, a quarter of the "
                   "tile at a time) and added into fp32 sums (block scales applied there)"
                 : "; m64n256k32 wgmmas accumulating all of K in the tensor cores (fp8_promote: each k-block "
                   "promoted to fp32)")
     << ", the other scales applied to the sums in the epilogue"
     << (r.output_dtype == DType::fp8_e4m3
             ? std::string("; Y quantized to e4m3 there in 1 x 128 groups, a scale per row of each 128-column tile (") +
                   to_string(r.y_scale_layout) + (r.has_y_amax ? ", and the amax" : "") + ")"
             : std::string())
     << "; persistent, one CTA per SM, " << t.tile_n
     << "-column cooperative tiles, " << t.tile_k << "-deep k-blocks, clusters of "
     << std::min(sm90::cluster_size(r), 2);
  c.reason = os.str();
  *cfg = c;
  return Status::Ok();
}

// The down projection: the decode kernels where they can read it (the
// quantized one up to its 64 rows, the 16-bit one up to 16), else a
// cuBLASLt GEMM, which takes any shape. Each decision is made on the
// problem the kernel reads after down::run's passes: the GLU of the input
// dense in the workspace, and weights that no quantized kernel reads
// dequantized there (so a 16-bit kernel can still take them).
Status select_down(const Problem& r, const Arguments* a, const DeviceInfo& dev, Config* cfg) {
  Arguments ka;
  if (a) {  // what the passes write sits in the 256-byte aligned workspace
    ka = *a;
    if (r.glu_input) ka.x = reinterpret_cast<const void*>(uintptr_t(256));
  }
  if (r.gather.experts > 0)
    return select_gathered(r, down::kernel_problem(r, r.quantized ? KernelPath::quant_decode : KernelPath::decode),
                           a ? &ka : nullptr, cfg);
  const char* glu = r.glu_input ? "; the GLU of its input computed into the workspace first" : "";
  Config c;
  c.vector_loads = true;
  c.tile_m = static_cast<int>(r.m);
  std::string quant_no;
  if (r.quantized) {
    quant_no = quant_decode::blocker(down::kernel_problem(r, KernelPath::quant_decode), a ? &ka : nullptr);
    if (quant_no.empty()) {
      c.path = KernelPath::quant_decode;
      c.tile_n = 16;
      std::string warps_why, ahead_why;
      c.threads = 32 * quant_decode::down_warps(r, dev.sms, &warps_why);  // 0: the kernel's own
      c.ahead = quant_decode::tiled_ahead(r, dev.sms, &ahead_why);
      c.reason = "down projection, quantized decode kernel: " + to_string(r.quant) + " weights, m=" +
                 std::to_string(r.m) + " <= " + std::to_string(quant_decode::max_tile_rows(r)) +
                 " rows stream them once" + (warps_why.empty() ? "" : "; " + warps_why) +
                 (ahead_why.empty() ? "" : "; " + ahead_why) + glu;
      *cfg = c;
      return Status::Ok();
    }
    if (a) ka.w = reinterpret_cast<const void*>(uintptr_t(256));
  }
  const std::string dequant = r.quantized ? " (weights dequantized to " + std::string(to_string(r.input_dtype)) +
                                                " in the workspace: the quantized decode kernel cannot take " +
                                                quant_no + ")"
                                          : "";
  const std::string no = decode_blocker(down::kernel_problem(r, KernelPath::decode), a ? &ka : nullptr);
  if (no.empty()) {
    c.path = KernelPath::decode;
    c.tile_n = 16;
    c.reason = "down projection, decode kernel: m=" + std::to_string(r.m) + " <= " + std::to_string(decode::kMaxM) +
               " rows stream the weights once" + dequant + glu;
  } else {
    c = Config{};
    c.path = KernelPath::cublas;
    c.reason = "down projection, cuBLASLt GEMM (the decode kernel cannot take " + no + ")" + dequant + glu;
  }
  *cfg = c;
  return Status::Ok();
}

}  // namespace

Status select_config(const Problem& r, const Arguments* a, const DeviceInfo& dev, Config* cfg) {
  if (dev.major < 8)
    return err(StatusCode::not_supported, "device ", dev.device, " (", dev.name, ") has compute capability ", dev.major,
               ".", dev.minor, "; gatedmlp needs 8.0 or newer");
  if (is_down(r)) return select_down(r, a, dev, cfg);
  if (r.gather.grouped) return select_grouped(r, a, dev, cfg);
  if (r.gather.experts > 0) return select_gathered(r, r, a, cfg);
  if (fp8_input(r)) return select_fp8(r, a, dev, cfg);
  // Quantized weights: the quantized decode kernel up to its kMaxM rows (on
  // sm_90 its Hopper form from hopper_min_m() rows up to kHopperMaxM, past
  // 64 in one pass of 128 tokens or two of 64: hopper_n()); past them (where the weights are reused across enough
  // rows for the 16-bit kernels' tiles to pay), and for what it cannot read, the weights are
  // dequantized into the workspace and the 16-bit problem takes whatever
  // path it would take. Config::path is then that path's, and run()
  // dequantizes first (core/api.cpp).
  if (r.quantized) {
    const std::string no = quant_decode::blocker(r, a);
    const bool sm90_device = dev.major == 9 && dev.minor == 0;
    // The Hopper form: from hopper_min_m() rows to 64, and 65-128 (the
    // register kernel stops at 64: what it reads is checked at 64).
    std::string hopper_no;
    const int hopper_min_m = quant_decode::hopper_min_m(r);
    if (sm90_device && r.m >= hopper_min_m) {
      if (r.m <= quant_decode::kMaxM) {
        hopper_no = no;
      } else {
        Problem per_pass = r;
        per_pass.m = quant_decode::kMaxM;
        hopper_no = quant_decode::blocker(per_pass, a);
      }
      if (hopper_no.empty()) hopper_no = quant_decode::hopper_blocker(r, a);
      // Below 17 rows (8-bit words) the register kernel's grid is the finer:
      // the form only where its CTAs of 32 columns cover the SMs (h83: FP8
      // at M = 16 on 1024 x 2816, 88 of them, ran 0.92x the register
      // kernel's speed; int8 on 2048 x 8192, 256, 1.54x).
      if (hopper_no.empty() && r.m < quant_decode::kHopperMinM && !quant_decode::hopper_forced()) {
        const int64_t ctas = quant_decode::hopper_ctas(r, 1);
        if (ctas < dev.sms)
          hopper_no = "m=" + std::to_string(r.m) + " < " + std::to_string(quant_decode::kHopperMinM) + " and its " +
                      std::to_string(ctas) + " CTAs of 32 columns do not cover the " + std::to_string(dev.sms) +
                      " SMs";
      }
    }
    auto hopper_form = [&](Config* c) {
      const int wgs = quant_decode::hopper_warpgroups(r, dev.sms);
      c->tile_n = quant_decode::kHopperColumns * wgs;
      c->tile_k = quant_decode::kHopperBk;
      c->stages = quant_decode::hopper_stages(quant_decode::hopper_n(r, wgs), wgs,
                                              quant_decode::hopper_row_bytes(r.quant.bits));
      c->threads = 128 * wgs + 32;
      return "Hopper form: words and x by TMA, the words dequantized in registers as wgmma's A operand, x its B "
             "operand from shared memory, " +
             std::to_string(wgs) + " warpgroup(s) of 32 columns per CTA";
    };
    if (no.empty()) {
      Config c;
      c.path = KernelPath::quant_decode;
      c.tile_m = static_cast<int>(r.m);
      std::string groups, ahead_why;
      c.tile_n = 8 * quant_decode::column_groups(r, dev.sms, &groups);
      c.ahead = quant_decode::tiled_ahead(r, dev.sms, &ahead_why);
      c.vector_loads = true;
      c.reason = "quantized decode kernel: " + to_string(r.quant) + " weights dequantized in registers, m=" +
                 std::to_string(r.m) + " <= " + std::to_string(quant_decode::kMaxM) + " rows stream them once; " +
                 (r.quant.mode == QuantMode::fp8_e4m3 ? "exact e4m3 values in 16-bit pairs, the scales on the fp32 sums"
                  : r.quant.mode == QuantMode::mxfp4  ? (r.input_dtype == DType::bf16 ? "bf16 pair dequantization"
                                                                                      : "fp32 dequantization")
                  : r.quant.bits == 4 && r.scale_dtype == r.input_dtype ? "16-bit pair dequantization"
                                                                         : "fp32 dequantization") +
                 (groups.empty() ? "" : "; " + groups) + (ahead_why.empty() ? "" : "; " + ahead_why);
      if (sm90_device && r.m >= hopper_min_m)
        c.reason += hopper_no.empty() ? "; " + hopper_form(&c) : "; Hopper form not taken: " + hopper_no;
      *cfg = c;
      return Status::Ok();
    }
    if (sm90_device && r.m > quant_decode::kMaxM && hopper_no.empty()) {
      Config c;
      c.path = KernelPath::quant_decode;
      const int n = quant_decode::hopper_n(r, quant_decode::hopper_warpgroups(r, dev.sms));
      const int64_t passes = quant_decode::hopper_passes(r.m, n);
      c.tile_m = n;
      c.vector_loads = true;
      const std::string form = hopper_form(&c);
      c.reason = "quantized decode kernel's " + form + ": " + to_string(r.quant) + " weights, m=" + std::to_string(r.m) +
                 (passes == 1 ? " in one pass of " + std::to_string(n) + " tokens per wgmma (it streams the weights once"
                              : " in " + std::to_string(passes) + " passes of " + std::to_string(n) +
                                    " rows (each streams the weights once") +
                 "; dequantizing them into the workspace costs more up to m=" +
                 std::to_string(quant_decode::kHopperMaxM) + ")";
      *cfg = c;
      return Status::Ok();
    }
    // Past its rows, or what it cannot read (rows of X off 16 bytes, FP8's K
    // not a multiple of 16, ...): the dequantized 16-bit problem takes any.
    const Problem d = quant_decode::dequantized_problem(r).resolved();
    Arguments ad;
    if (a) {  // the dequantized weights sit in the 256-byte aligned workspace
      ad = *a;
      ad.w = reinterpret_cast<const void*>(uintptr_t(256));
      ad.w_up = d.weights.format == WeightFormat::separate ? ad.w : nullptr;
    }
    if (Status s = select_config(d, a ? &ad : nullptr, dev, cfg); !s) return s;
    cfg->reason = "quantized weights dequantized to " + std::string(to_string(r.input_dtype)) +
                  " in the workspace (the quantized decode kernel cannot take " + no + "), then " + cfg->reason;
    return Status::Ok();
  }
  const std::string decode_no = decode_blocker(r, a);
  if (decode_no.empty()) {
    Config c;
    c.path = KernelPath::decode;
    c.tile_m = static_cast<int>(r.m);
    c.vector_loads = true;
    c.reason = "decode kernel: m=" + std::to_string(r.m) + " <= " + std::to_string(decode::kMaxM) +
               " rows stream the weights once";
    const std::string hopper_no = decode_hopper_blocker(r, a, dev);
    if (hopper_no.empty()) {
      c.tile_n = decode::kHopperColumns;
      c.tile_k = decode::kHopperBk;
      c.stages = decode::kHopperStages;
      c.threads = decode::kHopperThreads;
      c.reason += "; Hopper form: a TMA ring, wgmma with the weights as the A operand";
    } else if (dev.major == 9 && dev.minor == 0) {
      c.reason += "; Hopper form not taken: " + hopper_no;
    }
    *cfg = c;
    return Status::Ok();
  }
  const std::string hopper_no = hopper_blocker(r, a, dev);
  if (hopper_no.empty()) {
    std::string tile_why;
    const sm90::Tile& t = pick_hopper_tile(r, a, dev, &tile_why);
    Config c = hopper_config(t);
    c.reason = "Hopper TMA + wgmma path; persistent, one CTA per SM; " + tile_why;
    if (r.m <= decode::kMaxM) c.reason += "; decode kernel not taken: " + decode_no;
    *cfg = c;
    return Status::Ok();
  }

  Config c;
  c.path = KernelPath::sm80_mma;
  const std::string blocker = vector_blocker(r, a);
  c.vector_loads = blocker.empty();

  // Bigger tiles reuse each loaded byte more but leave SMs idle when there
  // are few of them.
  auto ctas = [&](const sm80::Tile& t) {
    return (r.m + t.tile_m - 1) / t.tile_m * ((r.u + t.tile_n - 1) / t.tile_n) * r.batch;
  };
  // Measured on H100 (docs/notes/portable-kernel.md): 128x64 tiles with two CTAs per SM beat the
  // 128x128 tile, because one CTA's epilogue overlaps the other's main loop.
  const sm80::Tile* pick = &sm80::kTileSmall;
  const char* tile_why = "64-row tiles: too few bigger tiles for the SMs";
  if (r.m > sm80::kTileSmall.tile_m && ctas(sm80::kTileLarge) >= 2 * dev.sms) {
    pick = &sm80::kTileLarge;
    tile_why = "128x64 tiles";
  }
  // Tuning and test knob: GATEDMLP_FORCE_TILE=large|small overrides the
  // heuristic (any tile is correct for any shape; only speed differs).
  if (const char* f = std::getenv("GATEDMLP_FORCE_TILE")) {
    const std::string v = f;
    if (v == "large") pick = &sm80::kTileLarge;
    else if (v == "small") pick = &sm80::kTileSmall;
    if (v == "large" || v == "small") tile_why = "tile forced by GATEDMLP_FORCE_TILE";
  }
  // A device with less shared memory per block (sm_86/89 allow ~99 KB) still
  // gets the small tile rather than a refusal.
  if (size_t(pick->smem_bytes) > dev.smem_optin && pick != &sm80::kTileSmall) {
    pick = &sm80::kTileSmall;
    tile_why = "64-row tiles: the device's shared memory per block is too small for bigger ones";
  }
  const sm80::Tile& t = *pick;
  c.tile_m = t.tile_m;
  c.tile_n = t.tile_n;
  c.tile_k = t.tile_k;
  c.stages = t.stages;
  c.threads = t.threads;

  if (size_t(t.smem_bytes) > dev.smem_optin)
    return err(StatusCode::not_supported, "tile ", t.tile_m, "x", t.tile_n, " needs ", t.smem_bytes,
               " bytes of shared memory; device ", dev.device, " allows ", dev.smem_optin);
  const int64_t m_tiles = (r.m + t.tile_m - 1) / t.tile_m;
  const int64_t tiles = m_tiles * ((r.u + t.tile_n - 1) / t.tile_n);
  if (r.batch > INT_MAX)
    return err(StatusCode::not_supported, "batch=", r.batch, " is more than one launch takes (2^31-1)");
  if (tiles > INT_MAX)
    return err(StatusCode::not_supported, "m=", r.m, ", u=", r.u, " need ", tiles,
               " tiles, more than one launch takes (2^31-1); split the call along m");

  std::ostringstream why;
  why << "portable mma.sync path (Hopper path not taken: " << hopper_no << "); "
      << (r.m <= decode::kMaxM ? "decode kernel not taken: " + decode_no + "; " : std::string())
      << tile_why << "; "
      << (c.vector_loads ? "16-byte loads" : "element loads: " + blocker);
  c.reason = why.str();
  *cfg = c;
  return Status::Ok();
}

bool log_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("GATEDMLP_LOG");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}

}  // namespace gatedmlp::detail
