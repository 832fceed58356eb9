// The fused kernel against the float64 CPU reference, on fresh random inputs
// for every case: every layout, activation, dtype and option, odd shapes,
// padded strides and batches. Outputs are poisoned with NaN first; every
// element must be written, padding must stay untouched, and the fused error
// must be at most 2x the unfused (cuBLASLt + GLU kernel) error plus a tiny atol.
//
// The FastPath* tests run each case with GATEDMLP_FORCE_PATH unset (the
// Hopper kernel where the problem allows it) and with it set to portable, and
// on a compute capability 9.0 device check through plan() that the eligible
// cases really took the Hopper kernel and the others fell back. They run with
// GATEDMLP_DECODE=0: their M = 1 and 7 would otherwise take the decode
// kernel (tests/test_gpu_decode.cpp). The random and edge-shape suites run
// their M <= 16 cases both ways (kAsIs, kNoDecode).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_util.hpp"

using namespace gatedmlp;
using namespace gatedmlp::test;

namespace {

const Variant kAutoPath{"fused, GATEDMLP_FORCE_PATH unset, split tail forced", true, nullptr, true, "force"};
const Variant kAutoNoWorkspace{"fused, GATEDMLP_FORCE_PATH unset, no workspace", true, nullptr, false};
const Variant kPortablePath{"fused, GATEDMLP_FORCE_PATH=portable", true, "portable"};
// The Hopper kernel on one cluster: every item but the last is followed by
// another, so the persistent loop, the ring's phases across items and each
// item's Y stores in flight under the next item's main loop all run (the
// small test shapes otherwise give each cluster one item).
const Variant kOneCluster{"fused, GATEDMLP_FORCE_PATH unset, one cluster", true, nullptr, true, nullptr, "1"};
// The Hopper kernel's narrow tiles (88 output columns) wherever they can run
// (the dispatcher picks them only where they fill the waves better): split
// tail forced, and on one cluster.
const Variant kNarrow{"fused, GATEDMLP_SM90_TILE=88, split tail forced", true, nullptr, true, "force", nullptr, "88"};
const Variant kNarrowOneCluster{"fused, GATEDMLP_SM90_TILE=88, one cluster", true, nullptr, true, nullptr, "1", "88"};
// The ping-pong kernels (the narrow tile, each consumer warpgroup running
// whole items in turn) wherever they can run, and on one CTA, where every
// item follows another and the two warpgroups take turns through them.
const Variant kPingPong{"fused, GATEDMLP_SM90_TILE=pp", true, nullptr, true, nullptr, nullptr, "pp"};
const Variant kPingPongOneCta{"fused, GATEDMLP_SM90_TILE=pp, one CTA", true, nullptr, true, nullptr, "1", "pp"};
// Their 96-column tile (the library's pick only for blocks of 16 and 32
// rows) wherever it can run, stacked and separate weights included, on one
// CTA.
const Variant kPingPong96OneCta{"fused, GATEDMLP_SM90_TILE=pp96, one CTA", true, nullptr, true, nullptr, "1", "pp96"};
// Clusters of two CTAs (weight multicast, column pairs for an odd row-block
// count), which the library picks only above K = 8192, larger than the test
// shapes: both tiles, split tail forced.
const Variant kPairs{"fused, GATEDMLP_SM90_CLUSTER=2, split tail forced", true, nullptr, true, "force", nullptr,
                     nullptr, "2"};
const Variant kNarrowPairs{"fused, GATEDMLP_SM90_TILE=88, GATEDMLP_SM90_CLUSTER=2, split tail forced", true, nullptr,
                           true, "force", nullptr, "88", "2"};

// ---------------------------------------------------------------- generators


// A random size: often an edge around the tile sizes (16, 64, 128), otherwise anything.
int64_t random_size(std::mt19937_64& rng, int64_t max) {
  if (rng() % 2) return pick(rng, {1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129, 200});
  return 1 + int64_t(rng() % uint64_t(max));
}


Problem random_problem(std::mt19937_64& rng, DType in) {
  Problem p;
  p.input_dtype = in;
  p.m = random_size(rng, 300);
  // Half the cases keep K a multiple of 8 so the 16-byte loader runs too.
  p.k = rng() % 2 ? 8 * (1 + int64_t(rng() % 40)) : random_size(rng, 300);
  p.u = random_size(rng, 260);
  p.activation = static_cast<Activation>(rng() % 5);
  if (p.activation == Activation::swiglu_clamped && rng() % 2) {
    p.act_params.clamp_limit = 0.5f + float(rng() % 40) / 10.f;  // small limits: the clamp really bites
    p.act_params.clamp_alpha = 1.0f + float(rng() % 10) / 10.f;
  }
  const int fmt = int(rng() % 6);
  if (fmt == 0) {
    p.weights.format = WeightFormat::separate;
  } else {
    const int64_t g = fmt == 1 ? 1 : fmt == 2 ? 8 : fmt == 3 ? 32 : fmt == 4 ? 0 : pick(rng, {2, 3, 5, 16});
    if (g > 1) p.u = g * ((p.u + g - 1) / g);
    p.weights.group = g;
    p.weights.first = rng() % 2 ? Half::up : Half::gate;
  }
  if (rng() % 5 == 0) p.weights.storage = WeightStorage::in_out;
  if (rng() % 5 == 0) p.weights.ld = (p.weights.storage == WeightStorage::out_in ? p.k : (fmt == 0 ? p.u : 2 * p.u)) + pick(rng, {1, 8, 13});
  p.output_dtype = static_cast<DType>(rng() % 3);
  random_bias_and_preact(p, rng);
  p.alpha = float(pick(rng, {1, 1, 2, -3})) * 0.5f;
  if (rng() % 3 == 0) p.ldx = p.k + pick(rng, {1, 8, 24});
  if (rng() % 3 == 0) p.ldy = p.u + pick(rng, {1, 2, 7});
  if (rng() % 4 == 0) {
    p.batch = pick(rng, {2, 3});
    p.m = std::min<int64_t>(p.m, 100);
    if (rng() % 2) p.batch_stride_w = 0;  // one set of weights for all batches
    if (rng() % 2) p.batch_stride_x = (p.m) * (p.ldx ? p.ldx : p.k) + pick(rng, {8, 16, 40});
    if (rng() % 2) p.batch_stride_y = (p.m) * (p.ldy ? p.ldy : p.u) + pick(rng, {2, 6});
    if (p.has_bias && rng() % 2) p.batch_stride_bias = 0;
  }
  return p;
}


void run_random(DType in, int n) {
  SKIP_WITHOUT_GPU();
  n = cases(n);
  std::mt19937_64 rng(fresh_seed());
  CaseStats st;
  for (int i = 0; i < n; ++i) {
    const Problem p = random_problem(rng, in);
    CaseOptions opt;
    if (p.m <= 16) opt.variants = {kAsIs, kNoDecode};  // the decode kernel, then the kernel it stands in for
    run_case(p, rng, &st, opt);
    if (::testing::Test::HasFailure()) return;
  }
  std::printf("[ cases ] %d passed; worst fused/unfused relative-error ratio %.3f\n", st.cases, st.worst_ratio);
}

}  // namespace

TEST(GpuFused, RandomBf16) { run_random(DType::bf16, 220); }
TEST(GpuFused, RandomFp16) { run_random(DType::fp16, 160); }

// Every layout x activation x storage on one odd shape, so none is left to chance.
TEST(GpuFused, EveryLayoutAndActivation) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  CaseStats st;
  for (int fmt = 0; fmt < 6; ++fmt)
    for (int act = 0; act < 5; ++act)
      for (int io = 0; io < 2; ++io) {
        Problem p;
        p.m = 77;
        p.k = io ? 72 : 136;
        p.u = 96;
        p.activation = static_cast<Activation>(act);
        if (fmt == 0) p.weights.format = WeightFormat::separate;
        else {
          p.weights.group = fmt == 1 ? 1 : fmt == 2 ? 8 : fmt == 3 ? 32 : fmt == 4 ? 0 : 48;
          p.weights.first = act % 2 ? Half::up : Half::gate;
        }
        p.weights.storage = io ? WeightStorage::in_out : WeightStorage::out_in;
        p.has_bias = (act + fmt) % 2;
        p.has_preact = (act + io) % 2;
        run_case(p, rng, &st);
        if (HasFailure()) return;
      }
  std::printf("[ cases ] %d passed; worst ratio %.3f\n", st.cases, st.worst_ratio);
}

// Tiny and tile-edge shapes in every combination.
TEST(GpuFused, EdgeShapes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  CaseStats st;
  for (int64_t m : {1, 5, 64, 65, 129})
    for (int64_t k : {1, 7, 8, 33, 64})
      for (int64_t u : {1, 3, 64, 65}) {
        Problem p;
        p.m = m;
        p.k = k;
        p.u = u;
        p.activation = static_cast<Activation>(rng() % 5);
        CaseOptions opt;
        if (m <= 16) opt.variants = {kAsIs, kNoDecode};
        run_case(p, rng, &st, opt);
        if (HasFailure()) return;
      }
  std::printf("[ cases ] %d passed; worst ratio %.3f\n", st.cases, st.worst_ratio);
}

// Larger shapes on the 16-byte path: many K tiles, several CTAs in M and N.
TEST(GpuFused, LargerVectorShapes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  CaseStats st;
  for (int i = 0; i < 12; ++i) {
    Problem p;
    p.m = pick(rng, {257, 300, 513});
    p.k = pick(rng, {1024, 1032, 2056});
    p.u = pick(rng, {192, 320, 264});
    p.weights.group = pick(rng, {0, 1, 8});
    if (p.u % (p.weights.group ? p.weights.group : 1)) p.weights.group = 0;
    p.weights.first = rng() % 2 ? Half::up : Half::gate;
    p.input_dtype = rng() % 2 ? DType::bf16 : DType::fp16;
    p.activation = static_cast<Activation>(rng() % 5);
    p.has_bias = rng() % 2;
    run_case(p, rng, &st);
    if (HasFailure()) return;
  }
  std::printf("[ cases ] %d passed; worst ratio %.3f\n", st.cases, st.worst_ratio);
}

// Shapes big enough for the dispatcher to pick the 128-row tile (two CTAs
// per SM), with K tails, the element loader, [K, out] storage and batches, so
// that tile sees every path too.
TEST(GpuFused, LargeTileShapes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  CaseStats st;
  for (int i = 0; i < 6; ++i) {
    Problem p;
    p.m = 1536 + 7 * i;
    p.u = 1408 + 96 * i;  // 22+ column tiles of 64, the last one partial; divisible by every group below
    p.k = pick(rng, {72, 136, 100, 264});
    p.weights.group = i % 3 == 0 ? 0 : (i % 3 == 1 ? 1 : 32);
    p.weights.first = i % 2 ? Half::up : Half::gate;
    if (i == 4) p.weights.storage = WeightStorage::in_out;
    if (i == 5) {
      p.weights.format = WeightFormat::separate;
      p.weights.group = 0;
      p.weights.first = Half::gate;
      p.batch = 2;
      p.m = 1000;
    }
    p.input_dtype = i % 2 ? DType::fp16 : DType::bf16;
    p.activation = static_cast<Activation>(i % 5);
    p.has_bias = i % 2 == 0;
    p.has_preact = i == 2;
    Config c;
    const Status s = plan(p, &c);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(c.tile_m, 128) << to_string(c);
    run_case(p, rng, &st);
    if (HasFailure()) return;
  }
  std::printf("[ cases ] %d passed; worst ratio %.3f\n", st.cases, st.worst_ratio);
}

// ---------------------------------------------------------------- the Hopper fast path
//
// On a compute capability 9.0 device (with the library built for sm_90a) the
// dispatcher takes the TMA + wgmma kernel when the problem allows it; on any
// other device these tests run the portable kernel twice and still check it.

namespace {

// The fast path's rules, from the problem alone (the tests' buffers are each
// their own cudaMalloc, so x, w and w_up are always 16-byte aligned).
bool fast_path_eligible(const Problem& p) {
  const Problem r = p.resolved();
  if (r.input_dtype != DType::bf16 && r.input_dtype != DType::fp16) return false;
  if (r.weights.storage != WeightStorage::out_in) return false;
  if (r.k % 8 || r.ldx % 8 || r.weights.ld % 8) return false;
  if (r.batch_stride_x % 8 || (r.batch_stride_w != 0 && r.batch_stride_w % 8)) return false;
  if (r.weights.format == WeightFormat::fused) {
    const int64_t g = r.weights.group;
    if (!(g == r.u || 128 % g == 0 || g % 128 == 0)) return false;
  }
  return true;
}

// Whether the fast path's narrow tile (n = 88 output columns; or the
// 96-column ping-pong tile's, n = 96) can take a case the fast path takes:
// no pre-activation, Y stored by TMA (16-bit, U, ldy and the batch stride
// multiples of 8; y is its own cudaMalloc), and weight blocks that a box of
// n rows can gather (stacked, separate, G dividing n or a multiple of it).
bool narrow_eligible(const Problem& p, int64_t n = 88) {
  const Problem r = p.resolved();
  const int64_t g = r.weights.format == WeightFormat::separate ? r.u : r.weights.group;
  return fast_path_eligible(p) && !r.has_preact && r.output_dtype != DType::fp32 && r.u % 8 == 0 && r.ldy % 8 == 0 &&
         (r.batch == 1 || r.batch_stride_y % 8 == 0) &&
         (g == r.u || g % n == 0 || n % g == 0 || (n == 96 && g % 32 == 0));
}

// The tile a kNarrow variant ran with on a 9.0 device: 88 columns where the
// narrow tile can run, else 128; never the ping-pong kernels.
void check_narrow_plan(const Problem& p, const Config& c, bool sm90) {
  if (!sm90) return;
  EXPECT_EQ(c.tile_n, narrow_eligible(p) ? 88 : 128) << "GATEDMLP_SM90_TILE=88: " << to_string(c);
  EXPECT_FALSE(c.pingpong) << "GATEDMLP_SM90_TILE=88: " << to_string(c);
}

// Whether the ping-pong kernels of n columns store a case's pre-activation
// (or it has none): stacked or separate weights (88 columns only), G = 1,
// blocks of 8 or more rows that divide n, or (96 columns) blocks of a
// multiple of 32 rows; in the input's dtype, with rows and batches on
// 16-byte boundaries.
bool pingpong_preact_ok(const Problem& r, int64_t n) {
  if (!r.has_preact) return true;
  const int64_t g = r.weights.format == WeightFormat::separate ? r.u : r.weights.group;
  const bool layout_ok = g == r.u ? n == 88 : (g == 1 || (g >= 8 && n % g == 0) || (n == 96 && g % 32 == 0));
  return layout_ok && r.preact_dtype == r.input_dtype && r.ldpre % 8 == 0 &&
         (r.batch == 1 || r.batch_stride_preact % 8 == 0);
}

// Whether the ping-pong kernels of n columns (88, or 96: blocks that a box
// of 96 rows, or three of 32, can gather) can take a case: the narrow
// tile's but for the pre-activation, in one-CTA clusters (K <= 8192 unless
// GATEDMLP_SM90_CLUSTER says otherwise), with at least one whole 128-row
// tile, and a pre-activation as pingpong_preact_ok says.
bool pingpong_eligible(const Problem& p, int64_t n = 88) {
  Problem q = p;
  q.has_preact = false;
  return narrow_eligible(q, n) && pingpong_preact_ok(p.resolved(), n) && p.m >= 128 && p.k <= 8192 &&
         !std::getenv("GATEDMLP_SM90_CLUSTER");
}

bool pingpong96_eligible(const Problem& p) { return pingpong_eligible(p, 96); }

// The kernels a kPingPong variant ran with on a 9.0 device: 88 columns
// where they can run, else 96 where those can.
void check_pingpong_plan(const Problem& p, const Config& c, bool sm90) {
  if (!sm90) return;
  EXPECT_EQ(c.pingpong, pingpong_eligible(p) || pingpong96_eligible(p)) << "GATEDMLP_SM90_TILE=pp: " << to_string(c);
  if (c.pingpong) {
    EXPECT_EQ(c.tile_n, pingpong_eligible(p) ? 88 : 96) << to_string(c);
  }
}

// The kernels a kPingPong96OneCta variant ran with on a 9.0 device: 96
// columns wherever they can run (else the wave model's pick, never them).
void check_pingpong96_plan(const Problem& p, const Config& c, bool sm90) {
  if (!sm90) return;
  const bool pp96 = pingpong96_eligible(p);
  EXPECT_EQ(c.pingpong && c.tile_n == 96, pp96) << "GATEDMLP_SM90_TILE=pp96: " << to_string(c);
}

// The path a case took with GATEDMLP_FORCE_PATH unset (plans[0]) and with it
// set to portable (plans[1]); `eligible` says what the first must be on 9.0.
void check_paths(const std::vector<Config>& plans, bool eligible, bool sm90) {
  ASSERT_GE(plans.size(), 2u);
  EXPECT_FALSE(plans[0].reason.empty()) << "plan() gave no reason for " << to_string(plans[0].path);
  if (sm90 && eligible) {
    EXPECT_EQ(plans[0].path, KernelPath::sm90_wgmma)
        << "an eligible case fell back on a 9.0 device: " << to_string(plans[0]);
  } else if (sm90) {
    EXPECT_EQ(plans[0].path, KernelPath::sm80_mma) << "an ineligible case took " << to_string(plans[0]);
  } else {
    EXPECT_NE(plans[0].path, KernelPath::sm90_wgmma) << "the sm_90a kernel on a device other than 9.0";
  }
  EXPECT_EQ(plans[1].path, KernelPath::sm80_mma)
      << "GATEDMLP_FORCE_PATH=portable did not force the portable path: " << to_string(plans[1]);
}

struct PathCount {
  int wgmma = 0, mma = 0;
  void add(const Config& c) { (c.path == KernelPath::sm90_wgmma ? wgmma : mma)++; }
};

// Layouts fast_path_problem cycles through.
constexpr int kFastLayouts = 21;

// Case i of FastPathEveryLayoutActivationOption: the layout and activation
// cycle with i so every pair shows up; everything else is drawn at random
// within the fast path's rules (K a multiple of 8 but not of 64, padded
// strides that are multiples of 8, odd M and U).
Problem fast_path_problem(std::mt19937_64& rng, int i) {
  Problem p;
  // 0: separate; 1, 2: stacked, gate/up first; 3..20: G in {1, 2, 4, 8, 16, 32, 64, 128, 256} x {gate, up} first.
  const int layout = i % kFastLayouts;
  int64_t g = 0;
  if (layout == 0) {
    p.weights.format = WeightFormat::separate;
  } else {
    p.weights.format = WeightFormat::fused;
    p.weights.first = layout % 2 ? Half::gate : Half::up;
    if (layout >= 3) {
      const int64_t groups[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
      g = groups[(layout - 3) / 2];
    }
    p.weights.group = g;
  }
  if (g == 0) p.u = pick(rng, {1, 17, 72, 129, 200, 264});  // separate and stacked: any U
  else if (g == 1) p.u = pick(rng, {37, 95, 129, 251});
  else if (g == 2 || g == 4) p.u = g * pick(rng, {3, 35, 66});
  else if (g == 8) p.u = 8 * pick(rng, {1, 3, 13, 25});
  else if (g == 16 || g == 32 || g == 64) p.u = g * pick(rng, {1, 3, 5, 7, 12});
  else if (g == 128) p.u = 128 * pick(rng, {1, 2, 3});
  else p.u = 256 * pick(rng, {1, 2});

  p.activation = static_cast<Activation>((i / kFastLayouts) % 5);
  if (p.activation == Activation::swiglu_clamped && rng() % 2) {
    p.act_params.clamp_limit = 0.5f + float(rng() % 40) / 10.f;
    p.act_params.clamp_alpha = 1.0f + float(rng() % 10) / 10.f;
  }
  p.input_dtype = rng() % 2 ? DType::bf16 : DType::fp16;
  p.output_dtype = static_cast<DType>(rng() % 3);
  // M < 128: X boxes of M rows rounded up to 8 (1, 7: 8 rows; 60: 64; 100:
  // 104), the other A rows zeroed once; then row tails.
  p.m = pick(rng, {1, 7, 60, 100, 129, 300});
  p.k = pick(rng, {8, 72, 136, 520});
  const float alphas[] = {1.0f, 0.5f, -1.5f, 1.25f};
  p.alpha = alphas[rng() % 4];
  random_bias_and_preact(p, rng);
  if (rng() % 4 == 0) p.ldx = p.k + 8 * pick(rng, {1, 3});
  if (rng() % 5 == 0) p.weights.ld = p.k + 8 * pick(rng, {1, 2});
  if (rng() % 4 == 0) p.ldy = p.u + pick(rng, {1, 3, 8});
  if (rng() % 3 == 0) {
    p.batch = 3;
    const int64_t ldx = p.ldx ? p.ldx : p.k;
    if (rng() % 2) p.batch_stride_w = 0;  // shared weights
    if (rng() % 3 == 0) p.batch_stride_x = p.m * ldx + 8 * pick(rng, {1, 5});
    if (rng() % 3 == 0) p.batch_stride_y = p.m * (p.ldy ? p.ldy : p.u) + pick(rng, {2, 7});
    if (p.has_bias && rng() % 2) p.batch_stride_bias = 0;
  }
  // Keep the float64 CPU reference quick: shrink M until the case is under ~80M multiply-adds.
  while (p.m > 1 && p.batch * p.m * 2 * p.u * p.k > 80'000'000) p.m = p.m == 300 ? 129 : p.m == 129 ? 7 : 1;
  return p;
}

// One row per 64-row block (random within it), the tile edges and the last
// row: the rows the float64 reference is computed for in the large shapes.
std::vector<int64_t> sample_rows(int64_t m, std::mt19937_64& rng) {
  std::vector<int64_t> rows = {0, m - 1};
  for (int64_t b = 0; b < m; b += 64) rows.push_back(b + int64_t(rng() % uint64_t(std::min<int64_t>(64, m - b))));
  for (int64_t e : {63, 64, 127, 128, 255, 256})
    if (e < m) rows.push_back(e);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

// A case the fast path must take, run with GATEDMLP_FORCE_PATH unset, =portable,
// unset on one cluster, with the narrow tile forced (split, and on one
// cluster), in clusters of two CTAs with either tile (split), and without a
// workspace if asked, each checked against the
// reference; on a 9.0 device the unset run must have taken the fast path,
// and printed log_must_contain if given. *taken: the unset run's plan.
void run_fast_path_case(const Problem& p, std::mt19937_64& rng, CaseStats* st, bool sm90, Config* taken,
                        bool also_without_workspace = false, const char* log_must_contain = nullptr) {
  const ScopedEnv no_decode("GATEDMLP_DECODE", "0");  // the Hopper kernel's own small M (M = 1, 7)
  ASSERT_TRUE(fast_path_eligible(p)) << "the generator made a case the fast path does not take";
  std::vector<Config> plans;
  CaseOptions opt;
  if (log_must_contain) opt.log_must_contain = log_must_contain;
  opt.variants = {kAutoPath, kPortablePath, kOneCluster, kNarrow, kNarrowOneCluster, kPairs, kNarrowPairs,
                  kPingPong, kPingPongOneCta, kPingPong96OneCta};
  if (also_without_workspace) opt.variants.push_back(kAutoNoWorkspace);
  opt.plans = &plans;
  run_case(p, rng, st, opt);
  if (::testing::Test::HasFailure()) return;
  check_paths(plans, true, sm90);
  check_narrow_plan(p, plans[3], sm90);
  check_narrow_plan(p, plans[4], sm90);
  check_pingpong_plan(p, plans[7], sm90);
  check_pingpong_plan(p, plans[8], sm90);
  check_pingpong96_plan(p, plans[9], sm90);
  if (::testing::Test::HasFailure()) return;
  *taken = plans[0];
}

}  // namespace

// Every layout the fast path takes x every activation, with random options,
// dtypes and odd shapes; each case run with GATEDMLP_FORCE_PATH unset and =portable.
TEST(GpuFused, FastPathEveryLayoutActivationOption) {
  SKIP_WITHOUT_GPU();
  const bool sm90 = device_is_sm90();
  std::mt19937_64 rng(fresh_seed());
  const int n = cases(12 * kFastLayouts);  // 12 rounds of the layouts
  CaseStats st;
  PathCount auto_paths;
  for (int i = 0; i < n; ++i) {
    const Problem p = fast_path_problem(rng, i);
    SCOPED_TRACE("case " + std::to_string(i) + ": " + to_string(p));
    Config taken;
    run_fast_path_case(p, rng, &st, sm90, &taken, i % 3 == 0);
    if (HasFailure()) return;
    auto_paths.add(taken);
  }
  std::printf("[ cases ] %d passed, on each variant; worst ratio %.3f; unset: %d sm90_wgmma, %d sm80_mma%s\n", st.cases,
              st.worst_ratio, auto_paths.wgmma, auto_paths.mma, sm90 ? "" : " (not a 9.0 device)");
}

// For a case whose U was redrawn: the strides that depended on it back to
// their defaults (shared weights in every other case), and a pre-activation
// of dtype dt with row stride ldpre, batches `pad` elements past M rows apart.
namespace {
void ask_preact(Problem& p, int i, DType dt, int64_t ldpre, int64_t pad) {
  p.ldy = 0;
  p.batch_stride_x = p.batch_stride_w = p.batch_stride_bias = p.batch_stride_y = kAuto;
  if (p.batch > 1 && i % 2) p.batch_stride_w = 0;  // shared weights
  p.has_preact = true;
  p.preact_dtype = dt;
  p.ldpre = ldpre;
  p.batch_stride_preact = p.batch > 1 ? p.m * ldpre + pad : kAuto;
}

// Two rounds of the fast-path layouts, each case drawn by fast_path_problem,
// then given its pre-activation (and a new U) by ask(p, i, rng); both paths
// against the reference, every other case also without a workspace if
// asked. expect_log(p), if given, names what GATEDMLP_LOG=1 must print for
// the first (fast-path) run of case p on a 9.0 device.
template <typename Ask>
void run_preact_suite(Ask ask, bool also_without_workspace,
                      const char* (*expect_log)(const Problem&) = nullptr) {
  const ScopedEnv no_decode("GATEDMLP_DECODE", "0");  // as run_fast_path_case; expect_log's plan() too
  const bool sm90 = device_is_sm90();
  std::mt19937_64 rng(fresh_seed());
  CaseStats st;
  for (int i = 0; i < 2 * kFastLayouts; ++i) {
    Problem p = fast_path_problem(rng, i);
    ask(p, i, rng);
    SCOPED_TRACE("case " + std::to_string(i) + ": " + to_string(p));
    Config taken;
    run_fast_path_case(p, rng, &st, sm90, &taken, also_without_workspace && i % 2 == 0,
                       sm90 && expect_log ? expect_log(p) : nullptr);
    if (::testing::Test::HasFailure()) return;
  }
  std::printf("[ cases ] %d passed, on each variant; worst ratio %.3f\n", st.cases, st.worst_ratio);
}
}  // namespace

// The pre-activation output on the fast path, every layout: 16-bit with
// 16-byte rows (paired stores), and fp32 or an odd row stride (fp32 pairs,
// single stores), M and U with tails. Both paths against the reference.
TEST(GpuFused, FastPathPreactEveryLayout) {
  SKIP_WITHOUT_GPU();
  run_preact_suite(
      [](Problem& p, int i, std::mt19937_64& rng) {
        // Redraw U as a multiple of 4 (2U rows of 16-bit values are then
        // 16-byte multiples), keeping it a multiple of G.
        const int64_t g = p.weights.format == WeightFormat::fused ? p.weights.group : 0;
        if (g <= 1) p.u = pick(rng, {4, 36, 92, 132, 260});
        else if (g == 2) p.u = 2 * pick(rng, {2, 18, 66});
        const bool aligned = i < kFastLayouts;
        // Aligned cases get at least one whole 128-column tile (the compact
        // store path) and usually a partial one (the general path).
        if (aligned && p.u < 128) p.u += 128;
        ask_preact(p, i, aligned ? (i % 2 ? DType::bf16 : DType::fp16) : (i % 2 ? DType::fp32 : DType::bf16),
                   aligned ? 2 * p.u + 8 * (i % 3) : 2 * p.u + 1 + 2 * (i % 2), aligned ? 8 : 3);
      },
      false);
}

// The pre-activation through TMA stores (the fast path's PRE = 1 kernels):
// every layout with U a multiple of the 128-column tile, the pre-activation
// in the input's dtype with 16-byte rows and batch strides, M with row
// tails (the stores clip them), batches, and the split tail with and
// without a workspace. Both paths against the reference, and the launcher's
// log must name the TMA pre-activation (gelu_erf, or an fp32 Y, which the
// PRE = 1 kernels never feed: from registers; where the wave model picks
// the ping-pong kernels, they must have run).
TEST(GpuFused, FastPathPreactTma) {
  SKIP_WITHOUT_GPU();
  run_preact_suite(
      [](Problem& p, int i, std::mt19937_64& rng) {
        // Every activation (gelu_erf takes the register-direct store), over
        // the layouts in turn.
        p.activation = static_cast<Activation>(i % 5);
        const int64_t g = p.weights.format == WeightFormat::fused ? p.weights.group : 0;
        p.u = g == 256 ? 256 * pick(rng, {1, 2}) : 128 * pick(rng, {1, 2, 3});
        ask_preact(p, i, p.input_dtype, 2 * p.u + 8 * (i % 3), 8 * (1 + i % 2));
      },
      true,
      // The kernel that ran, in the launcher's words (launch.cuh).
      [](const Problem& p) {
        const ScopedEnv unset(kForcePathEnv, nullptr);  // as the first variant runs
        Config c;
        if (plan(p, &c).ok() && c.pingpong) return "ping-pong";
        return p.activation == Activation::gelu_erf || p.output_dtype == DType::fp32
                   ? "pre-activation stored from registers"
                   : "pre-activation by TMA stores";
      });
}

// For the clusters-of-two suites below: M drawn from `ms` and K from {72,
// 136} (the padded row strides follow), kept under ~80M multiply-adds (the
// float64 reference) by M down through `smaller` (each only where it is below
// the M drawn), then one batch; odd cases get the pre-activation, even ones
// packed strides for the new M. (A loop that only shrank M never ended for 3
// batches of M = 257, U = 512, K = 136; the test looked like a hanging
// kernel.)
namespace {
void redraw_m_k(Problem& p, int i, std::mt19937_64& rng, std::initializer_list<int64_t> ms,
                std::initializer_list<int64_t> smaller) {
  p.m = pick(rng, ms);
  p.k = pick(rng, {72, 136});
  if (p.ldx) p.ldx = p.k + 8;
  if (p.weights.ld) p.weights.ld = p.k + 16;
  const auto macs = [&] { return p.batch * p.m * 2 * p.u * p.k; };
  for (int64_t m : smaller)
    if (macs() > 80'000'000 && m < p.m) p.m = m;
  if (macs() > 80'000'000) {
    p.batch = 1;
    p.batch_stride_w = p.batch_stride_bias = kAuto;
  }
  if (i % 2) {
    ask_preact(p, i, p.input_dtype, 2 * p.u + 8, 8);
  } else {
    p.batch_stride_x = p.batch_stride_y = p.batch_stride_preact = kAuto;
    p.has_preact = false;
  }
}
}  // namespace

// An odd number of 128-row blocks (3 or 5): in clusters of two, the last
// row-block's CTAs take two column-blocks each (the second past U when the
// column-block count is odd), each loading its own X and weight tiles.
// Every layout and activation, with or without a pre-activation, split tail
// forced and on one cluster; the launcher's log must say the pairs ran.
// Clusters of two throughout (the library's choice only above K = 8192).
TEST(GpuFused, FastPathOddRowBlocks) {
  SKIP_WITHOUT_GPU();
  const ScopedEnv pairs("GATEDMLP_SM90_CLUSTER", "2");
  run_preact_suite(
      [](Problem& p, int i, std::mt19937_64& rng) {
        redraw_m_k(p, i, rng, {257, 300, 384, 640}, {384, 257});
      },
      true, [](const Problem&) {
        // With the pairs turned off (a timing knob), the same shapes on
        // rounded-up row units.
        const char* off = std::getenv("GATEDMLP_SM90_PAIR_COLS");
        return off && std::string(off) == "0" ? "items on" : "last row-block in column pairs";
      });
}

// Whole items drawn from a counter at run time (the kernel's ticket ring; the
// library's own choice only for K >= 16384, in clusters of two): every
// layout, activation and option, in clusters of two with the tickets
// forced, under every variant of run_fast_path_case (one cluster draws every
// item, the ring's slots wrapping; the split tail forced after the drawn
// items). The launcher's log must say the items were drawn.
TEST(GpuFused, FastPathTickets) {
  SKIP_WITHOUT_GPU();
  const ScopedEnv pairs("GATEDMLP_SM90_CLUSTER", "2"), tickets("GATEDMLP_SM90_TICKETS", "1");
  run_preact_suite(
      [](Problem& p, int i, std::mt19937_64& rng) {
        // One to three row units: on the default cluster count each cluster
        // runs its first item and draws past the end; on one cluster
        // (kOneCluster) it draws every item after its first.
        redraw_m_k(p, i, rng, {256, 385, 640}, {256});
      },
      true, [](const Problem&) { return "whole items drawn from a counter"; });
}

// Problems the fast path must refuse: they fall back to the portable kernel,
// with a reason, and are still right.
TEST(GpuFused, FastPathFallbacks) {
  SKIP_WITHOUT_GPU();
  const bool sm90 = device_is_sm90();
  std::mt19937_64 rng(fresh_seed());
  auto base = [](int64_t k, Activation act, DType in) {
    Problem p;
    p.m = 77;
    p.k = k;
    p.u = 96;
    p.activation = act;
    p.input_dtype = in;
    return p;
  };
  std::vector<std::pair<const char*, Problem>> cases_;
  for (DType in : {DType::bf16, DType::fp16}) {
    const Activation a0 = in == DType::bf16 ? Activation::silu : Activation::gelu_tanh;
    const Activation a1 = in == DType::bf16 ? Activation::relu : Activation::swiglu_clamped;
    {
      Problem p = base(100, a0, in);  // K % 8 != 0
      p.has_bias = true;
      cases_.push_back({"k=100, not a multiple of 8", p});
    }
    {
      Problem p = base(136, a1, in);
      p.weights.storage = WeightStorage::in_out;
      p.weights.group = 8;
      cases_.push_back({"weights stored in_out", p});
    }
    {
      Problem p = base(72, a0, in);
      p.u = 384;
      p.weights.group = 192;  // more than 128 and not a multiple of it
      p.weights.first = in == DType::bf16 ? Half::gate : Half::up;
      p.has_preact = true;
      cases_.push_back({"group 192 with u=384", p});
    }
    {
      Problem p = base(136, a1, in);
      p.ldx = p.k + 4;
      cases_.push_back({"ldx=k+4", p});
    }
    {
      Problem p = base(72, a0, in);
      p.weights.ld = p.k + 4;
      p.weights.format = WeightFormat::separate;
      cases_.push_back({"weights.ld=k+4", p});
    }
    {
      Problem p = base(136, a1, in);
      p.batch = 2;
      p.batch_stride_x = p.m * p.k + 4;
      cases_.push_back({"batch_stride_x not a multiple of 8", p});
    }
    {
      Problem p = base(136, a0, in);
      p.batch = 2;
      p.batch_stride_w = 2 * p.u * p.k + 4;
      cases_.push_back({"batch_stride_w not a multiple of 8", p});
    }
  }
  CaseStats st;
  for (const auto& [why, p] : cases_) {
    SCOPED_TRACE(std::string(why) + ": " + to_string(p));
    ASSERT_FALSE(fast_path_eligible(p)) << "not a fallback case";
    std::vector<Config> plans;
    CaseOptions opt;
    opt.variants = {kAutoPath};
    opt.plans = &plans;
    run_case(p, rng, &st, opt);
    if (HasFailure()) return;
    ASSERT_EQ(plans.size(), 1u);
    EXPECT_EQ(plans[0].path, KernelPath::sm80_mma) << to_string(plans[0]);
    EXPECT_FALSE(plans[0].reason.empty()) << "a fallback without a reason";
    if (HasFailure()) return;
  }
  std::printf("[ cases ] %d passed on sm80_mma%s; worst ratio %.3f\n", st.cases,
              sm90 ? " (a 9.0 device: each one a fallback)" : "", st.worst_ratio);
}

// Bigger shapes, many output tiles per CTA of the persistent kernel. The
// float64 reference is sampled (one row per 64-row block and the tile edges);
// every element must be written, and every row must agree with unfused.
TEST(GpuFused, FastPathLargeShapes) {
  SKIP_WITHOUT_GPU();
  const bool sm90 = device_is_sm90();
  std::mt19937_64 rng(fresh_seed());
  struct Shape {
    int64_t m, k, u, group;  // group -1: separate weights
    Half first;
    DType in, out;
    Activation act;
    bool bias, preact;
    int64_t batch;
  };
  const Shape shapes[] = {
      {1000, 1024, 1024, 0, Half::gate, DType::bf16, DType::bf16, Activation::silu, false, false, 1},
      {2053, 1536, 2048, 1, Half::up, DType::fp16, DType::fp16, Activation::gelu_tanh, true, false, 1},
      {3000, 2048, 3072, -1, Half::gate, DType::bf16, DType::fp32, Activation::relu, true, false, 1},
      {1536, 1032, 1536, 0, Half::up, DType::fp16, DType::bf16, Activation::swiglu_clamped, false, true, 1},
      {1000, 1024, 1024, 1, Half::gate, DType::bf16, DType::bf16, Activation::gelu_erf, true, false, 2},
      {2500, 1032, 2560, -1, Half::gate, DType::fp16, DType::fp32, Activation::silu, false, false, 1},
      // Llama-3 8B's U at M = 512 (short K): the dispatcher's own pick is the
      // narrow tile (4.94 waves of it on 132 SMs against 3.39 of 128 columns).
      {512, 264, 14336, 0, Half::gate, DType::bf16, DType::bf16, Activation::silu, true, false, 1},
      {512, 1032, 14336, -1, Half::gate, DType::fp16, DType::fp16, Activation::gelu_tanh, false, false, 1},
      // Blocks of 32 and 64 rows (an 88-row box cannot gather them: the
      // 96-column ping-pong tile or the 128-column one), U not a whole
      // number of tiles.
      {1100, 1024, 2848, 32, Half::up, DType::bf16, DType::bf16, Activation::silu, true, false, 1},
      {700, 520, 1216, 64, Half::gate, DType::fp16, DType::fp16, Activation::gelu_tanh, false, false, 2},
      // The pre-activation of interleaved weights on the ping-pong kernels:
      // blocks of 32 (96 columns), of 8 (88 columns).
      {2048, 1024, 3072, 32, Half::gate, DType::bf16, DType::bf16, Activation::silu, true, true, 1},
      {1100, 520, 2048, 8, Half::up, DType::fp16, DType::fp16, Activation::gelu_erf, true, true, 1},
      // Blocks of 128 (the 96-column tile as three 32-row boxes per half,
      // wrapping into the next block), U not a whole number of 96 columns,
      // and its pre-activation (32-column pieces).
      {2048, 264, 12160, 128, Half::up, DType::bf16, DType::bf16, Activation::relu, true, true, 1},
      // Llama-3 8B's U at M = 4096 in blocks of 16 (short K): the
      // dispatcher's own pick is the 96-column ping-pong tile (37 whole
      // waves of it against 27.45 of 128 columns with the split tail).
      {4096, 136, 14336, 16, Half::up, DType::fp16, DType::bf16, Activation::swiglu_clamped, true, false, 1},
      // 405B's K: clusters of two drawing whole items from a counter (72
      // items on at most 66 clusters), 18 column-blocks.
      {1024, 16384, 2304, 0, Half::gate, DType::bf16, DType::bf16, Activation::silu, true, false, 1},
  };
  CaseStats st;
  PathCount auto_paths;
  for (const Shape& sh : shapes) {
    Problem p;
    p.m = sh.m;
    p.k = sh.k;
    p.u = sh.u;
    if (sh.group < 0) {
      p.weights.format = WeightFormat::separate;
    } else {
      p.weights.group = sh.group;
      p.weights.first = sh.first;
    }
    p.input_dtype = sh.in;
    p.output_dtype = sh.out;
    p.activation = sh.act;
    p.has_bias = sh.bias;
    p.has_preact = sh.preact;
    p.batch = sh.batch;
    if (sh.batch > 1) {
      p.batch_stride_w = 0;
      p.batch_stride_bias = 0;
    }
    SCOPED_TRACE(to_string(p));
    ASSERT_TRUE(fast_path_eligible(p));
    std::vector<Config> plans;
    CaseOptions opt;
    opt.variants = {kAutoPath, kPortablePath, kAutoNoWorkspace, kOneCluster, kNarrow, kNarrowOneCluster, kPairs,
                    kNarrowPairs, kPingPong, kPingPongOneCta, kPingPong96OneCta};
    opt.plans = &plans;
    opt.ref_rows = sample_rows(p.m, rng);
    run_case(p, rng, &st, opt);
    if (HasFailure()) return;
    check_paths(plans, true, sm90);
    check_narrow_plan(p, plans[4], sm90);
    check_narrow_plan(p, plans[5], sm90);
    check_pingpong_plan(p, plans[8], sm90);
    check_pingpong_plan(p, plans[9], sm90);
    check_pingpong96_plan(p, plans[10], sm90);
    // On an H100 / H200 (132 SMs) the dispatcher's own pick for the 8B-like
    // shapes is a ping-pong kernel: the narrow tile's at M = 512, the
    // 96-column one for blocks of 16 at M = 4096 (the others go by the wave
    // model).
    int dev = 0, sms = 0;
    if (sm90 && sh.u == 14336 && cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && sms == 132) {
      EXPECT_EQ(plans[0].tile_n, sh.group == 16 ? 96 : 88) << to_string(plans[0]);
      EXPECT_TRUE(plans[0].pingpong) << to_string(plans[0]);
    }
    if (HasFailure()) return;
    auto_paths.add(plans[0]);
  }
  std::printf("[ cases ] %d passed, on each variant; worst ratio %.3f; unset: %d sm90_wgmma, %d sm80_mma%s\n", st.cases,
              st.worst_ratio, auto_paths.wgmma, auto_paths.mma, sm90 ? "" : " (not a 9.0 device)");
}
