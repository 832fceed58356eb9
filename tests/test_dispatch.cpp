// The dispatcher's choice of the Hopper kernel's tile (src/core/dispatch.cpp),
// on the host, for a simulated H200 (132 SMs, 227 KB of shared memory per
// block): the narrow 88-column tile where its waves fill the SMs better and
// it can run, as the ping-pong kernels where those can run and their whole
// waves cost less, the 128-column tile everywhere else.
// And the decode kernel (src/decode_glu/): every call of M <= 16 it can
// read, on any device, before the Hopper or portable kernel; the others
// with the reason why. And quantized weights (src/quant_decode/).
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/internal.hpp"
#include "decode_glu/decode_glu.hpp"
#include "decode_glu/hopper.hpp"
#include "decode_glu/params.hpp"
#include "quant_decode/hopper.hpp"
#include "gatedmlp/gatedmlp.hpp"
#include "sm90_gemm_glu/sm90_gemm_glu.hpp"
#include "scoped_env.hpp"
#include "simulated_devices.hpp"

using namespace gatedmlp;

namespace {

detail::DeviceInfo h200() { return test::simulated_h200(); }

// Llama-3 8B's gate/up at M rows: stacked weights, bf16, silu.
Problem llama8b(int64_t m) {
  Problem p;
  p.m = m;
  p.k = 4096;
  p.u = 14336;
  return p;
}

// The tile the dispatcher picks, with the knobs it reads unset, and the
// decode kernel left out (GATEDMLP_DECODE=0): M <= 16 would take it, and
// these tests are about the Hopper kernel's own choice there too.
Config pick(const Problem& p) {
  for (const char* v : {"GATEDMLP_SM90_TILE", "GATEDMLP_SM90_CLUSTER", "GATEDMLP_FORCE_PATH", "GATEDMLP_SM90_PINGPONG"})
    unsetenv(v);
  setenv("GATEDMLP_DECODE", "0", 1);
  Config c;
  const Status s = detail::select_config(p.resolved(), nullptr, h200(), &c);
  unsetenv("GATEDMLP_DECODE");
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(c.path, KernelPath::sm90_wgmma) << to_string(c);
  return c;
}

// An A100: no Hopper kernel, the portable one or the decode kernel.
detail::DeviceInfo a100() { return test::simulated_a100(); }

// The path and reason the dispatcher gives, with its knobs unset.
Config route(const Problem& p, const detail::DeviceInfo& dev, const Arguments* a = nullptr) {
  for (const char* v : {"GATEDMLP_SM90_TILE", "GATEDMLP_SM90_CLUSTER", "GATEDMLP_FORCE_PATH", "GATEDMLP_SM90_PINGPONG",
                        "GATEDMLP_DECODE"})
    unsetenv(v);
  Config c;
  const Status s = detail::select_config(p.resolved(), a, dev, &c);
  EXPECT_TRUE(s.ok()) << s.message();
  return c;
}

#define SKIP_WITHOUT_SM90_BUILD() \
  if (!sm90::compiled()) GTEST_SKIP() << "this build has no sm_90a kernel"

}  // namespace

TEST(Dispatch, NarrowTileWhereItsWavesFitBetter) {
  SKIP_WITHOUT_SM90_BUILD();
  // 8B on 132 one-CTA clusters (K <= 8192): M = 512 is 4.94 waves of 88-column tiles (run as 5)
  // against 3.39 of 128 (run as 3.69 with the split tail's cost); M = 1024
  // 9.88 (10) against 6.79 (7: there the split costs what it recovers).
  // The ping-pong kernels run the 88-column waves whole but hide the
  // per-item epilogue: they take M = 512 on (at 4096, 40 x 89 against 27.45
  // x 132 for 128 columns), but not M = 256 (3 whole waves against 2.47 split).
  // A single row-block (M <= 128) has no split, and 128 fills one wave.
  for (int64_t m : {512, 1024, 2048, 4096, 16384}) {
    const Config c = pick(llama8b(m));
    EXPECT_EQ(c.tile_n, 88) << "M = " << m << ": " << to_string(c);
    EXPECT_TRUE(c.pingpong) << "M = " << m << ": " << to_string(c);
  }
  EXPECT_EQ(pick(llama8b(256)).tile_n, 88) << to_string(pick(llama8b(256)));
  EXPECT_FALSE(pick(llama8b(256)).pingpong) << to_string(pick(llama8b(256)));
  for (int64_t m : {1, 64, 128})
    EXPECT_EQ(pick(llama8b(m)).tile_n, 128) << "M = " << m << ": " << to_string(pick(llama8b(m)));
  // The reason names every estimate.
  const std::string why = pick(llama8b(512)).reason;
  EXPECT_NE(why.find("88-column tiles, ping-pong"), std::string::npos) << why;
  EXPECT_NE(why.find("4.94 waves"), std::string::npos) << why;
  EXPECT_NE(why.find("3.39 waves"), std::string::npos) << why;
  // Separate weights, fp16, and interleaved blocks that divide 88 alike.
  Problem p = llama8b(512);
  p.weights.format = WeightFormat::separate;
  p.input_dtype = p.output_dtype = DType::fp16;
  EXPECT_EQ(pick(p).tile_n, 88);
  for (int64_t g : {1, 8}) {
    p = llama8b(512);
    p.weights.group = g;
    EXPECT_EQ(pick(p).tile_n, 88) << "G = " << g;
  }
}

TEST(Dispatch, NarrowTileOnlyWhereItCanRun) {
  SKIP_WITHOUT_SM90_BUILD();
  auto expect_128 = [](const Problem& p, const char* what) {
    const Config c = pick(p);
    EXPECT_EQ(c.tile_n, 128) << what << ": " << to_string(c);
    EXPECT_NE(c.reason.find("cannot take"), std::string::npos) << what << ": " << c.reason;
  };
  // A pre-activation: the 88-column ping-pong kernels take it for stacked,
  // separate, G = 1 and G = 8 weights; the cooperative narrow kernels never
  // do.
  Problem p = llama8b(512);
  p.has_preact = true;
  EXPECT_TRUE(pick(p).pingpong) << to_string(pick(p));
  EXPECT_NE(pick(p).reason.find("no cooperative 88-column tile"), std::string::npos) << pick(p).reason;
  for (int64_t g : {1, 8}) {
    p.weights.group = g;
    EXPECT_TRUE(pick(p).pingpong && pick(p).tile_n == 88) << "G = " << g << ": " << to_string(pick(p));
  }
  for (int64_t g : {2, 4}) {
    p.weights.group = g;
    expect_128(p, "a pre-activation of weights in blocks of 2 or 4");
    EXPECT_NE(pick(p).reason.find("interleaved in blocks of G=" + std::to_string(g)), std::string::npos)
        << pick(p).reason;
  }
  p = llama8b(512);
  p.has_preact = true;
  p.preact_dtype = DType::fp32;
  expect_128(p, "an fp32 pre-activation");
  p = llama8b(512);
  p.output_dtype = DType::fp32;
  expect_128(p, "fp32 output");
  p = llama8b(512);
  p.ldy = p.u + 4;
  expect_128(p, "ldy not a multiple of 8");
  setenv("GATEDMLP_SM90_CLUSTER", "4", 1);
  Config c;
  ASSERT_TRUE(detail::select_config(llama8b(512).resolved(), nullptr, h200(), &c).ok());
  unsetenv("GATEDMLP_SM90_CLUSTER");
  EXPECT_EQ(c.tile_n, 128) << "clusters of four: " << to_string(c);
}

// Blocks of 16, 32, 64, 128 and 256 rows: an 88-row box would start inside
// a block; a 96-row one never does (16, 32), nor do three boxes of 32 rows
// (64 and more). Their ping-pong kernels compete with the 128-column tile by
// the same wave model; where the 88-column ones can run, the 96-column ones
// are not a candidate (GATEDMLP_SM90_TILE=pp96 forces them).
TEST(Dispatch, PingPong96ForInterleavedBlocks) {
  SKIP_WITHOUT_SM90_BUILD();
  for (int64_t g : {16, 32, 64, 128, 256}) {
    for (int64_t m : {4096, 16384}) {
      // 8B M = 4096: 32 x 150 items, 37 whole waves x 97 against 27.45 x 132.
      Problem p = llama8b(m);
      p.weights.group = g;
      const Config c = pick(p);
      EXPECT_TRUE(c.pingpong) << "G = " << g << ", M = " << m << ": " << to_string(c);
      EXPECT_EQ(c.tile_n, 96) << "G = " << g << ", M = " << m << ": " << to_string(c);
      EXPECT_NE(c.reason.find("ping-pong 96 columns"), std::string::npos) << c.reason;
    }
    // M = 256: 2 whole waves of 88 ... 96 columns lose to 2.0 split waves of 128.
    Problem p = llama8b(256);
    p.weights.group = g;
    EXPECT_EQ(pick(p).tile_n, 128) << "G = " << g << ": " << to_string(pick(p));
    // A pre-activation too (whole blocks per tile for 16 and 32, 32-column
    // pieces for 64 and more).
    p = llama8b(4096);
    p.weights.group = g;
    p.has_preact = true;
    EXPECT_TRUE(pick(p).pingpong && pick(p).tile_n == 96) << "G = " << g << ", a pre-activation: " << to_string(pick(p));
  }
  // Where the 88-column ping-pong kernels run, they are the candidate.
  for (int64_t g : {0, 1, 8}) {
    Problem p = llama8b(4096);
    p.weights.group = g;
    EXPECT_EQ(pick(p).tile_n, 88) << "G = " << g << ": " << to_string(pick(p));
  }
  // Forced: stacked weights too; never with their pre-activation, or M < 128.
  Config c;
  setenv("GATEDMLP_SM90_TILE", "pp96", 1);
  ASSERT_TRUE(detail::select_config(llama8b(4096).resolved(), nullptr, h200(), &c).ok());
  EXPECT_TRUE(c.pingpong && c.tile_n == 96) << to_string(c);
  EXPECT_NE(c.reason.find("GATEDMLP_SM90_TILE=pp96"), std::string::npos) << c.reason;
  Problem pre = llama8b(4096);
  pre.has_preact = true;
  ASSERT_TRUE(detail::select_config(pre.resolved(), nullptr, h200(), &c).ok());
  EXPECT_FALSE(c.tile_n == 96) << to_string(c);
  ASSERT_TRUE(detail::select_config(llama8b(64).resolved(), nullptr, h200(), &c).ok());
  EXPECT_FALSE(c.pingpong) << to_string(c);
  // pp: 88 columns where they run, else 96.
  setenv("GATEDMLP_SM90_TILE", "pp", 1);
  Problem g16 = llama8b(256);
  g16.weights.group = 16;
  ASSERT_TRUE(detail::select_config(g16.resolved(), nullptr, h200(), &c).ok());
  EXPECT_TRUE(c.pingpong && c.tile_n == 96) << to_string(c);
  unsetenv("GATEDMLP_SM90_TILE");
  // GATEDMLP_SM90_PINGPONG=0 leaves them out too.
  setenv("GATEDMLP_SM90_PINGPONG", "0", 1);
  g16 = llama8b(4096);
  g16.weights.group = 16;
  ASSERT_TRUE(detail::select_config(g16.resolved(), nullptr, h200(), &c).ok());
  unsetenv("GATEDMLP_SM90_PINGPONG");
  EXPECT_EQ(c.tile_n, 128) << to_string(c);
}

TEST(Dispatch, TileKnob) {
  SKIP_WITHOUT_SM90_BUILD();
  Config c;
  // 88 forces the cooperative narrow kernels (not the ping-pong ones).
  setenv("GATEDMLP_SM90_TILE", "88", 1);
  ASSERT_TRUE(detail::select_config(llama8b(4096).resolved(), nullptr, h200(), &c).ok());
  EXPECT_EQ(c.tile_n, 88) << to_string(c);
  EXPECT_FALSE(c.pingpong) << to_string(c);
  Problem pre = llama8b(4096);
  pre.has_preact = true;
  ASSERT_TRUE(detail::select_config(pre.resolved(), nullptr, h200(), &c).ok());
  EXPECT_EQ(c.tile_n, 128) << "forced, but the narrow tile cannot take a pre-activation: " << to_string(c);
  setenv("GATEDMLP_SM90_TILE", "128", 1);
  ASSERT_TRUE(detail::select_config(llama8b(512).resolved(), nullptr, h200(), &c).ok());
  EXPECT_EQ(c.tile_n, 128) << to_string(c);
  EXPECT_FALSE(c.pingpong) << to_string(c);
  unsetenv("GATEDMLP_SM90_TILE");
}

TEST(Dispatch, PingPongKnobsAndLimits) {
  SKIP_WITHOUT_SM90_BUILD();
  Config c;
  // pp forces the ping-pong kernels (TileKnob: 88 the cooperative ones).
  setenv("GATEDMLP_SM90_TILE", "pp", 1);
  ASSERT_TRUE(detail::select_config(llama8b(256).resolved(), nullptr, h200(), &c).ok());
  EXPECT_TRUE(c.pingpong) << to_string(c);
  EXPECT_NE(c.reason.find("GATEDMLP_SM90_TILE=pp"), std::string::npos) << c.reason;
  // Forced, but M < 128 (no whole row-block) and a pre-activation of
  // weights in blocks of 4 are not theirs; one of stacked weights is.
  ASSERT_TRUE(detail::select_config(llama8b(64).resolved(), nullptr, h200(), &c).ok());
  EXPECT_FALSE(c.pingpong) << to_string(c);
  Problem pre = llama8b(4096);
  pre.has_preact = true;
  ASSERT_TRUE(detail::select_config(pre.resolved(), nullptr, h200(), &c).ok());
  EXPECT_TRUE(c.pingpong) << to_string(c);
  pre.weights.group = 4;
  ASSERT_TRUE(detail::select_config(pre.resolved(), nullptr, h200(), &c).ok());
  EXPECT_FALSE(c.pingpong) << to_string(c);
  EXPECT_EQ(c.tile_n, 128) << to_string(c);
  unsetenv("GATEDMLP_SM90_TILE");
  // GATEDMLP_SM90_PINGPONG=0 leaves them out of the pick.
  setenv("GATEDMLP_SM90_PINGPONG", "0", 1);
  ASSERT_TRUE(detail::select_config(llama8b(4096).resolved(), nullptr, h200(), &c).ok());
  unsetenv("GATEDMLP_SM90_PINGPONG");
  EXPECT_FALSE(c.pingpong) << to_string(c);
  EXPECT_EQ(c.tile_n, 128) << to_string(c);
  EXPECT_NE(c.reason.find("no ping-pong"), std::string::npos) << c.reason;
  // K > 8192 runs in clusters of two, which the ping-pong kernels do not.
  Problem big = llama8b(4096);
  big.k = 16384;
  c = pick(big);
  EXPECT_FALSE(c.pingpong) << to_string(c);
  EXPECT_NE(c.reason.find("clusters of 2"), std::string::npos) << c.reason;
}

// ---------------------------------------------------------------- the decode kernel

TEST(Dispatch, DecodeTakesEveryReadableCallOfFewRows) {
  for (const detail::DeviceInfo& dev : {h200(), a100()}) {
    SCOPED_TRACE(dev.name);
    for (int64_t m : {1, 2, 7, 8, 9, 15, 16}) {
      const Config c = route(llama8b(m), dev);
      EXPECT_EQ(c.path, KernelPath::decode) << "M = " << m << ": " << to_string(c);
      EXPECT_EQ(c.tile_m, m) << to_string(c);
      EXPECT_NE(c.reason.find("decode kernel"), std::string::npos) << c.reason;
    }
    // M = 17: the GEMM kernels, which do not mention the decode kernel.
    const Config c17 = route(llama8b(17), dev);
    EXPECT_EQ(c17.path, dev.major == 9 && sm90::compiled() ? KernelPath::sm90_wgmma : KernelPath::sm80_mma)
        << to_string(c17);
    EXPECT_EQ(c17.reason.find("decode"), std::string::npos) << c17.reason;
    // Every layout it can read: separate, stacked, interleaved by any G,
    // up first, padded rows, batches (shared weights), any output, bias and
    // pre-activation.
    std::vector<Problem> ok;
    for (int64_t g : {int64_t(1), int64_t(2), int64_t(7), int64_t(16), int64_t(28), int64_t(448), int64_t(14336)}) {
      Problem p = llama8b(4);
      p.weights.group = g;
      p.weights.first = g % 2 ? Half::up : Half::gate;
      ok.push_back(p);
    }
    Problem p = llama8b(16);
    p.weights.format = WeightFormat::separate;
    p.weights.ld = p.k + 8;
    p.ldx = p.k + 24;
    p.ldy = p.u + 3;
    p.output_dtype = DType::fp32;
    p.has_bias = true;
    p.bias_dtype = DType::fp16;
    p.has_preact = true;
    p.preact_dtype = DType::fp32;
    p.ldpre = 2 * p.u + 1;
    ok.push_back(p);
    p = llama8b(3);
    p.k = 8;
    p.batch = 3;
    p.batch_stride_w = 0;
    p.batch_stride_x = 3 * 8 + 8;
    p.batch_stride_y = 3 * p.u + 1;
    ok.push_back(p);
    for (const Problem& q : ok) {
      const Config c = route(q, dev);
      EXPECT_EQ(c.path, KernelPath::decode) << to_string(q) << ": " << to_string(c);
    }
  }
}

TEST(Dispatch, DecodeRefusesWhatItCannotReadAndSaysWhy) {
  for (const detail::DeviceInfo& dev : {h200(), a100()}) {
    SCOPED_TRACE(dev.name);
    struct Case {
      const char* why;
      Problem p;
    };
    std::vector<Case> cases;
    Problem p = llama8b(4);
    p.k = 4100;
    cases.push_back({"k=4100 is not a multiple of 8", p});
    p = llama8b(4);
    p.weights.storage = WeightStorage::in_out;
    cases.push_back({"weights stored in_out", p});
    p = llama8b(4);
    p.ldx = p.k + 4;
    cases.push_back({"ldx=4100 is not a multiple of 8", p});
    p = llama8b(4);
    p.weights.ld = p.k + 2;
    cases.push_back({"weights.ld=4098 is not a multiple of 8", p});
    p = llama8b(4);
    p.batch = 2;
    p.batch_stride_x = 4 * 4096 + 2;
    cases.push_back({"batch_stride_x=16386 is not a multiple of 8", p});
    p = llama8b(4);
    p.batch = 2;
    p.batch_stride_w = 2 * int64_t(14336) * 4096 + 4;
    cases.push_back({"batch_stride_w=117440516 is not a multiple of 8", p});
    for (const Case& c : cases) {
      const Config cfg = route(c.p, dev);
      EXPECT_NE(cfg.path, KernelPath::decode) << c.why << ": " << to_string(cfg);
      EXPECT_NE(cfg.reason.find(std::string("decode kernel not taken: ") + c.why), std::string::npos)
          << c.why << ": " << cfg.reason;
      // The decode kernel's own word, without the dispatcher.
      EXPECT_NE(decode::blocker(c.p.resolved(), nullptr).find(c.why), std::string::npos)
          << decode::blocker(c.p.resolved(), nullptr);
    }
    // Pointers the kernel cannot load 16 bytes at a time from.
    alignas(16) static unsigned char buf[64];
    for (int which = 0; which < 3; ++which) {
      Problem q = llama8b(2);
      Arguments a;
      a.x = buf;
      a.w = buf;
      a.y = buf;
      if (which == 2) {
        q.weights.format = WeightFormat::separate;
        a.w_up = buf + 8;
      } else if (which == 1) {
        a.w = buf + 2;
      } else {
        a.x = buf + 6;
      }
      const char* name = which == 0 ? "x (" : which == 1 ? "w (" : "w_up (";
      const Config cfg = route(q, dev, &a);
      EXPECT_NE(cfg.path, KernelPath::decode) << name << ": " << to_string(cfg);
      EXPECT_NE(cfg.reason.find(std::string("decode kernel not taken: ") + name), std::string::npos) << cfg.reason;
      EXPECT_NE(cfg.reason.find("is not 16-byte aligned"), std::string::npos) << cfg.reason;
      // The same problem with aligned pointers (and plan() with none) takes it.
      a.x = a.w = buf;
      if (which == 2) a.w_up = buf + 16;
      EXPECT_EQ(route(q, dev, &a).path, KernelPath::decode);
      EXPECT_EQ(route(q, dev).path, KernelPath::decode);
    }
  }
  // Sizes past its 32-bit row index, and M past kMaxM, named by the kernel.
  Problem big = llama8b(1);
  big.u = int64_t(1) << 30;
  EXPECT_NE(decode::blocker(big.resolved(), nullptr).find("u=1073741824"), std::string::npos)
      << decode::blocker(big.resolved(), nullptr);
  EXPECT_NE(decode::blocker(llama8b(17).resolved(), nullptr).find("m=17"), std::string::npos);
  EXPECT_EQ(decode::blocker(llama8b(16).resolved(), nullptr), "");
}

TEST(Dispatch, DecodeKnobs) {
  Config c;
  setenv("GATEDMLP_DECODE", "0", 1);
  ASSERT_TRUE(detail::select_config(llama8b(1).resolved(), nullptr, a100(), &c).ok());
  unsetenv("GATEDMLP_DECODE");
  EXPECT_EQ(c.path, KernelPath::sm80_mma) << to_string(c);
  EXPECT_NE(c.reason.find("decode kernel not taken: GATEDMLP_DECODE=0"), std::string::npos) << c.reason;
  setenv("GATEDMLP_FORCE_PATH", "portable", 1);
  ASSERT_TRUE(detail::select_config(llama8b(1).resolved(), nullptr, h200(), &c).ok());
  unsetenv("GATEDMLP_FORCE_PATH");
  EXPECT_EQ(c.path, KernelPath::sm80_mma) << to_string(c);
  EXPECT_NE(c.reason.find("decode kernel not taken: GATEDMLP_FORCE_PATH=portable"), std::string::npos) << c.reason;
  // Any other value leaves it on.
  setenv("GATEDMLP_DECODE", "1", 1);
  ASSERT_TRUE(detail::select_config(llama8b(1).resolved(), nullptr, a100(), &c).ok());
  unsetenv("GATEDMLP_DECODE");
  EXPECT_EQ(c.path, KernelPath::decode) << to_string(c);
}

// The decode kernel's Hopper form (decode_glu/hopper.hpp, h76): on sm_90,
// for the fused one-batch layouts its tensor map can view (stacked, blocks
// of G % 8 == 0 rows, either half first), where its grid was measured
// faster than the register form's; the register form elsewhere, the reason
// saying why.
TEST(Dispatch, DecodeHopperForm) {
  const bool built = sm90::compiled();
  auto shape = [](int64_t m, int64_t k, int64_t u) {
    Problem p = llama8b(m);
    p.k = k;
    p.u = u;
    return p;
  };
  // Taken: 8B (448 CTAs of 32 columns on 132 SMs) at m > 8; at any m where
  // the grid is at most 2 CTAs per SM and at least half the SMs: Llama-3.2-1B
  // (256 CTAs), Qwen2.5-0.5B (152), 1024 x 2816 (88).
  for (const Problem& p : {llama8b(9), llama8b(16), shape(1, 2048, 8192), shape(8, 3072, 8192), shape(1, 896, 4864),
                           shape(4, 896, 4864), shape(16, 896, 4864), shape(1, 1024, 2816), shape(16, 1024, 2816),
                           shape(8, 4096, 264 * 32), shape(16, 1024, 66 * 32)}) {
    const Config c = route(p, h200());
    EXPECT_EQ(c.path, KernelPath::decode) << to_string(c);
    EXPECT_EQ(decode::is_hopper_form(c), built) << to_string(p) << ": " << to_string(c);
    if (built) {
      EXPECT_EQ(c.tile_n, decode::kHopperColumns) << to_string(c);
      EXPECT_EQ(c.stages, decode::kHopperStages) << to_string(c);
      EXPECT_NE(c.reason.find("Hopper form: a TMA ring"), std::string::npos) << c.reason;
    }
  }
  // Left to the register form by its grid, the reason saying so.
  struct Case {
    const char* why;
    Problem p;
  };
  std::vector<Case> grids = {
      {"its 65 CTAs of 32 columns leave over half of the 132 SMs idle", shape(16, 1024, 65 * 32)},
      {"m=1 <= 8 and its 448 CTAs are more than 2 per SM", llama8b(1)},
      {"m=8 <= 8 and its 448 CTAs are more than 2 per SM", llama8b(8)},
      {"m=8 <= 8 and its 265 CTAs are more than 2 per SM", shape(8, 4096, 265 * 32)},
  };
  for (const Case& k : grids) {
    const Config c = route(k.p, h200());
    EXPECT_EQ(c.path, KernelPath::decode) << to_string(c);
    EXPECT_FALSE(decode::is_hopper_form(c)) << to_string(c);
    if (built) {
      EXPECT_NE(c.reason.find(std::string("Hopper form not taken: ") + k.why), std::string::npos) << c.reason;
    }
  }
  // Blocks of 16 or 448 rows, up first: taken too.
  for (int64_t g : {16, 448}) {
    Problem p = llama8b(16);
    p.weights.group = g;
    p.weights.first = Half::up;
    EXPECT_EQ(decode::is_hopper_form(route(p, h200())), built) << g;
  }
  // Never off sm_90.
  const Config ampere = route(llama8b(16), a100());
  EXPECT_FALSE(decode::is_hopper_form(ampere)) << to_string(ampere);
  EXPECT_EQ(ampere.reason.find("Hopper form"), std::string::npos) << ampere.reason;
  // What it cannot run: the register form runs it, and says why.
  std::vector<Case> cases;
  Problem p = llama8b(16);
  p.weights.format = WeightFormat::separate;
  cases.push_back({"separate gate and up weights", p});
  p = llama8b(16);
  p.weights.group = 4;
  cases.push_back({"weights.group=4 is not a multiple of 8", p});
  p = llama8b(16);
  p.u = 14340;  // stacked: G = U
  cases.push_back({"weights.group=14340 is not a multiple of 8", p});
  p = llama8b(16);
  p.batch = 2;
  cases.push_back({"batch=2 (the Hopper form takes one batch)", p});
  for (const Case& k : cases) {
    const Config c = route(k.p, h200());
    EXPECT_EQ(c.path, KernelPath::decode) << k.why << ": " << to_string(c);
    EXPECT_FALSE(decode::is_hopper_form(c)) << k.why << ": " << to_string(c);
    const std::string why = built ? k.why : "this build has no sm_90a kernel";
    EXPECT_NE(c.reason.find("Hopper form not taken: " + why), std::string::npos) << c.reason;
  }
  // GATEDMLP_DECODE_HOPPER=0 leaves it out; =1 takes it wherever it can run.
  setenv("GATEDMLP_DECODE_HOPPER", "0", 1);
  const Config off = route(llama8b(16), h200());
  setenv("GATEDMLP_DECODE_HOPPER", "1", 1);
  const Config on = route(shape(1, 1024, 2816), h200());
  const Config cannot = route(cases[0].p, h200());
  unsetenv("GATEDMLP_DECODE_HOPPER");
  EXPECT_EQ(off.path, KernelPath::decode) << to_string(off);
  EXPECT_FALSE(decode::is_hopper_form(off)) << to_string(off);
  EXPECT_NE(off.reason.find("Hopper form not taken: GATEDMLP_DECODE_HOPPER=0"), std::string::npos) << off.reason;
  EXPECT_EQ(decode::is_hopper_form(on), built) << to_string(on);
  EXPECT_FALSE(decode::is_hopper_form(cannot)) << to_string(cannot);
}

// Warps per CTA of a gate/up decode launch (decode::warps_per_cta, h75):
// fewer where that makes the whole grid resident at once, else one per
// k-block (0). 132 SMs: 3 CTAs of 8 warps per SM at m <= 8 (396), 6 of 4
// (792); the bigger m <= 16 instantiation 2 of 8, 8 of 2 (1056).
TEST(Dispatch, DecodeWarpsPerCta) {
  decode::Shape one;  // m <= 8
  EXPECT_EQ(decode::warps_per_cta(one, 352, 132), 0);   // 1024 x 2816: one wave already
  EXPECT_EQ(decode::warps_per_cta(one, 396, 132), 0);
  EXPECT_EQ(decode::warps_per_cta(one, 397, 132), 4);
  EXPECT_EQ(decode::warps_per_cta(one, 608, 132), 4);   // Qwen2.5-0.5B: 1.54 waves -> 0.77
  EXPECT_EQ(decode::warps_per_cta(one, 792, 132), 4);
  EXPECT_EQ(decode::warps_per_cta(one, 1024, 132), 0);  // Llama-3.2-1B/3B: not resident at 4 either
  EXPECT_EQ(decode::warps_per_cta(one, 1792, 132), 0);  // 8B
  decode::Shape two;  // m <= 16
  two.nt = 2;
  two.one_wave = true;  // 1024 x 2816: its own 3-chunk instantiation, 8 warps
  EXPECT_EQ(decode::warps_per_cta(two, 352, 132), 0);
  two.one_wave = false;
  EXPECT_EQ(decode::warps_per_cta(two, 608, 132), 2);
  EXPECT_EQ(decode::warps_per_cta(two, 1024, 132), 2);
  EXPECT_EQ(decode::warps_per_cta(two, 1056, 132), 2);
  EXPECT_EQ(decode::warps_per_cta(two, 1057, 132), 0);
  EXPECT_EQ(decode::warps_per_cta(two, 1792, 132), 0);  // 8B: as before, not measured otherwise
  EXPECT_EQ(decode::warps_per_cta(two, 1024, 78), 0);   // fewer SMs: not resident at 2 either
}

// Quantized weights: the quantized decode kernel up to 64 rows, on any
// device; past that, and for what it cannot read, the dequantized 16-bit
// problem's own path, with the reason saying so.
TEST(Dispatch, QuantizedWeights) {
  for (const char* v : {"GATEDMLP_SM90_TILE", "GATEDMLP_SM90_CLUSTER", "GATEDMLP_FORCE_PATH", "GATEDMLP_SM90_PINGPONG",
                        "GATEDMLP_DECODE"})
    unsetenv(v);
  detail::DeviceInfo a100 = h200();
  a100.major = 8;
  a100.name = "simulated A100";
  for (const detail::DeviceInfo& dev : {h200(), a100}) {
    for (int64_t m : {1, 16, 17, 64}) {
      Problem p = llama8b(m);
      p.quantized = true;
      Config c;
      ASSERT_TRUE(detail::select_config(p.resolved(), nullptr, dev, &c).ok());
      EXPECT_EQ(c.path, KernelPath::quant_decode) << dev.name << " m=" << m << ": " << to_string(c);
      EXPECT_NE(c.reason.find("in registers"), std::string::npos) << c.reason;
    }
    Problem p = llama8b(129);  // past the Hopper form's 128 rows too
    p.quantized = true;
    Config c;
    ASSERT_TRUE(detail::select_config(p.resolved(), nullptr, dev, &c).ok());
    EXPECT_EQ(c.path, dev.major == 9 ? KernelPath::sm90_wgmma : KernelPath::sm80_mma) << to_string(c);
    EXPECT_NE(c.reason.find("dequantized to bf16 in the workspace"), std::string::npos) << c.reason;
    EXPECT_NE(c.reason.find("m=129 is more than"), std::string::npos) << c.reason;
    // Rows of X off 16 bytes: the decode kernel cannot read them, the
    // dequantized call can.
    p.m = 8;
    p.ldx = 4100;
    ASSERT_TRUE(detail::select_config(p.resolved(), nullptr, dev, &c).ok());
    EXPECT_NE(c.path, KernelPath::quant_decode) << to_string(c);
    EXPECT_NE(c.reason.find("ldx=4100"), std::string::npos) << c.reason;
  }
}

// The quantized decode kernel's column groups (quant_decode::column_groups):
// 2 per warp at M <= 8 and 4 at M 9-16 where the grid still fills the SMs
// (twice, once), one otherwise; 4-bit weights only; never for more rows,
// the down projection, gathered calls or repacked words; the knob sets them.
TEST(Dispatch, QuantizedColumnGroups) {
  for (const char* v : {"GATEDMLP_FORCE_PATH", "GATEDMLP_QDECODE_CG", "GATEDMLP_QDECODE"}) unsetenv(v);
  auto groups = [](const Problem& p) {
    Config c;
    EXPECT_TRUE(detail::select_config(p.resolved(), nullptr, h200(), &c).ok());
    EXPECT_EQ(c.path, KernelPath::quant_decode) << to_string(c);
    if (quant_decode::is_hopper_form(c)) return 1;  // the Hopper form: no column groups (QuantizedHopperForm)
    const bool said = c.reason.find("groups of 8 columns per warp") != std::string::npos;
    EXPECT_EQ(said, c.tile_n > 8) << c.reason;
    return c.tile_n / 8;
  };
  for (int64_t m : {1, 8, 9, 16, 17, 64}) {
    Problem p = llama8b(m);  // 896 CTAs of 16 columns, 448 of 32, on 132 SMs
    p.quantized = true;
    EXPECT_EQ(groups(p), m <= 8 ? 2 : m <= 16 ? 4 : 1) << "8B, m=" << m;
    p.u = 2816;  // 176 CTAs of 16 columns, 88 of 32: too few
    EXPECT_EQ(groups(p), 1) << "1024 x 2816, m=" << m;
    p.u = 8192;  // 512 and 256
    EXPECT_EQ(groups(p), m <= 8 ? 2 : m <= 16 ? 4 : 1) << "2048 x 8192, m=" << m;
  }
  Problem p = llama8b(4);
  p.quantized = true;
  p.quant.bits = 4;
  p.quant.repacked = true;
  EXPECT_EQ(groups(p), 1) << "repacked";
  p.quant.repacked = false;
  p.quant = QuantFormat{QuantMode::mxfp4, 4, 32};
  EXPECT_EQ(groups(p), 2) << "mxfp4, bf16 x";
  p.input_dtype = DType::fp16;
  EXPECT_EQ(groups(p), 1) << "mxfp4, fp16 x (not instantiated)";
  p.input_dtype = DType::bf16;
  p.quant = QuantFormat{QuantMode::affine, 8, 64};
  EXPECT_EQ(groups(p), 1) << "int8";
  p.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 128, 128};
  EXPECT_EQ(groups(p), 1) << "fp8";
  p = llama8b(4);
  p.quantized = true;
  p.u = 64;
  {
    test::ScopedEnv knob("GATEDMLP_QDECODE_CG", "2");
    EXPECT_EQ(groups(p), 2) << "knob";
  }
  {
    test::ScopedEnv knob("GATEDMLP_QDECODE_CG", "4");  // not instantiated at one n-tile
    EXPECT_EQ(groups(p), 1) << "knob, 4 groups at m=4";
  }
  {
    test::ScopedEnv knob("GATEDMLP_QDECODE", "4,2");  // two chunks per k-block: no groups
    p.u = 14336;
    EXPECT_EQ(groups(p), 1) << "unroll 2";
  }
}

// The quantized decode kernel's Hopper form (quant_decode/hopper.hpp): affine
// int4 / int8 with scales of X's dtype, MXFP4 with bf16 x, or FP8 with any of
// its scales, on fused weights on sm_90 from M = 17 (int8: 9, FP8: 16, where
// the grid covers the SMs) to 128 (past 64 one pass of 128 tokens, FP8 with
// two warpgroups two of 64), with 2 warpgroups per CTA where U / 64 CTAs
// cover half the SMs, else 1; the register kernel for everything else, the
// reason saying why.
TEST(Dispatch, QuantizedHopperForm) {
  for (const char* v : {"GATEDMLP_FORCE_PATH", "GATEDMLP_QDECODE_CG", "GATEDMLP_QDECODE", "GATEDMLP_QDECODE_HOPPER",
                        "GATEDMLP_QDECODE_HOPPER_N128"})
    unsetenv(v);
  const bool built = sm90::compiled();
  auto pick = [](const Problem& p, const detail::DeviceInfo& dev) {
    Config c;
    EXPECT_TRUE(detail::select_config(p.resolved(), nullptr, dev, &c).ok());
    EXPECT_EQ(c.path, KernelPath::quant_decode) << to_string(c);
    return c;
  };
  for (int64_t m : {1, 16, 17, 32, 33, 64, 65, 128}) {
    Problem p = llama8b(m);
    p.quantized = true;  // affine int4 g64, bf16 scales: the default format
    Config c = pick(p, h200());
    EXPECT_EQ(quant_decode::is_hopper_form(c), built && m >= 17) << m << ": " << to_string(c);
    if (m > 64 && built) {
      EXPECT_NE(c.reason.find("in one pass of 128 tokens per wgmma"), std::string::npos) << c.reason;
      test::ScopedEnv two("GATEDMLP_QDECODE_HOPPER_N128", "0");  // the 64-token form in two passes
      const Config c2 = pick(p, h200());
      EXPECT_NE(c2.reason.find("in 2 passes of 64 rows"), std::string::npos) << c2.reason;
      EXPECT_EQ(c2.stages, quant_decode::hopper_stages(64, 2, 128)) << to_string(c2);
    }
    if (quant_decode::is_hopper_form(c)) {
      EXPECT_EQ(c.tile_n, 64) << "8B: 224 CTAs of 64 columns";
      EXPECT_EQ(c.threads, 2 * 128 + 32);
      EXPECT_EQ(c.stages, quant_decode::hopper_stages(m <= 32 ? 32 : m <= 64 ? 64 : 128, 2, 128));
      EXPECT_NE(c.reason.find("Hopper form: "), std::string::npos) << c.reason;
    }
    p.u = 2816;  // 44 CTAs of 64 columns on 132 SMs: 32 columns per CTA
    c = pick(p, h200());
    if (quant_decode::is_hopper_form(c)) {
      EXPECT_EQ(c.tile_n, 32) << to_string(c);
    }
    if (m <= 64) {
      EXPECT_FALSE(quant_decode::is_hopper_form(pick(p, a100()))) << "sm_80";
    }
  }
  {
    Problem p = llama8b(129);  // past 128 rows: dequantized into the workspace
    p.quantized = true;
    Config c;
    ASSERT_TRUE(detail::select_config(p.resolved(), nullptr, h200(), &c).ok());
    EXPECT_NE(c.path, KernelPath::quant_decode) << to_string(c);
  }
  if (!built) return;
  // What it does not take, by its reason.
  struct Case {
    const char* why;
    std::function<void(Problem&)> set;
  };
  const Case cases[] = {
      {"scales of fp32 with bf16 x", [](Problem& p) {
         p.quant = QuantFormat{QuantMode::affine, 8, 64};
         p.scale_dtype = DType::fp32;
       }},
      {"MXFP4 with fp16 x", [](Problem& p) {
         p.quant = QuantFormat{QuantMode::mxfp4, 4, 32};
         p.input_dtype = DType::fp16;
       }},
      {"repacked words", [](Problem& p) { p.quant.repacked = true; }},
      {"scales of fp32", [](Problem& p) { p.scale_dtype = DType::fp32; }},
      {"separate gate and up", [](Problem& p) { p.weights.format = WeightFormat::separate; }},
      {"weights.group=12", [](Problem& p) { p.weights.group = 12; p.u = 1200; }},
      {"batch=2", [](Problem& p) { p.batch = 2; }},
      {"k=4160 is not a multiple of 256", [](Problem& p) { p.k = 4160; }},
  };
  for (const Case& k : cases) {
    Problem p = llama8b(40);
    p.quantized = true;
    k.set(p);
    const Config c = pick(p, h200());
    EXPECT_FALSE(quant_decode::is_hopper_form(c)) << k.why << ": " << to_string(c);
    EXPECT_NE(c.reason.find(std::string("Hopper form not taken: ")), std::string::npos) << c.reason;
    EXPECT_NE(c.reason.find(k.why), std::string::npos) << c.reason;
  }
  Problem p = llama8b(40);
  p.quantized = true;
  p.quant = QuantFormat{QuantMode::mxfp4, 4, 32};  // MXFP4 with bf16 x: taken
  EXPECT_TRUE(quant_decode::is_hopper_form(pick(p, h200()))) << "mxfp4";
  // 8-bit words: 256 bytes of each row per stage, so fewer stages fit.
  for (const QuantFormat& f : {QuantFormat{QuantMode::affine, 8, 32}, QuantFormat{QuantMode::fp8_e4m3, 8, 128, 128},
                               QuantFormat{QuantMode::fp8_e4m3, 8, 0, 1}, QuantFormat{QuantMode::fp8_e4m3, 8, 0, 0}}) {
    p.quant = f;
    p.scale_dtype = f.mode == QuantMode::fp8_e4m3 ? DType::fp32 : DType::bf16;  // FP8: any float scales
    const Config c = pick(p, h200());
    EXPECT_TRUE(quant_decode::is_hopper_form(c)) << to_string(c);
    EXPECT_EQ(c.stages, quant_decode::hopper_stages(64, 2, 256)) << to_string(c);
    EXPECT_LT(c.stages, quant_decode::hopper_stages(64, 2, 128));
  }
  p.scale_dtype = DType::bf16;
  // Past 64 rows: 128 tokens per wgmma in one pass, but FP8 with two
  // consumer warpgroups (8B) in two passes of 64 (registers, h84); with one
  // (1024 x 2816) in one pass.
  {
    Problem q = llama8b(100);
    q.quantized = true;
    q.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 128, 128};
    q.scale_dtype = DType::fp32;
    const Config c8 = pick(q, h200());
    EXPECT_NE(c8.reason.find("in 2 passes of 64 rows"), std::string::npos) << c8.reason;
    q.k = 1024;
    q.u = 2816;
    const Config cs = pick(q, h200());
    EXPECT_EQ(cs.tile_n, 32) << to_string(cs);
    EXPECT_NE(cs.reason.find("in one pass of 128 tokens"), std::string::npos) << cs.reason;
  }
  // Where each format's form starts (hopper_min_m(): measured, h83).
  for (const auto& [f, first] : {std::pair{QuantFormat{}, 17}, std::pair{QuantFormat{QuantMode::mxfp4, 4, 32}, 17},
                                 std::pair{QuantFormat{QuantMode::affine, 8, 64}, 9},
                                 std::pair{QuantFormat{QuantMode::fp8_e4m3, 8, 128, 128}, 16}}) {
    Problem q = llama8b(first);
    q.quantized = true;
    q.quant = f;
    q.scale_dtype = f.mode == QuantMode::fp8_e4m3 ? DType::fp32 : DType::bf16;
    EXPECT_TRUE(quant_decode::is_hopper_form(pick(q, h200()))) << "m=" << first;
    q.m = first - 1;
    const Config below = pick(q, h200());
    EXPECT_FALSE(quant_decode::is_hopper_form(below)) << to_string(below);
    EXPECT_EQ(below.path, KernelPath::quant_decode) << "the register kernel: " << below.reason;
    // Below 17 rows only where the form's grid covers the SMs: 1024 x 2816
    // is 88 CTAs of 32 columns on 132 SMs.
    q.m = 16;
    q.k = 1024;
    q.u = 2816;
    const Config small = pick(q, h200());
    EXPECT_FALSE(quant_decode::is_hopper_form(small)) << to_string(small);
    if (first < 17) {
      EXPECT_NE(small.reason.find("88 CTAs of 32 columns do not cover the 132 SMs"), std::string::npos)
          << small.reason;
    }
    q.m = 17;
    EXPECT_TRUE(quant_decode::is_hopper_form(pick(q, h200()))) << "1024 x 2816, m=17";
    // 2048 x 8192: 256 such CTAs (the form then runs 128 of 64 columns).
    q.m = 16;
    q.k = 2048;
    q.u = 8192;
    const Config wide = pick(q, h200());
    EXPECT_EQ(quant_decode::is_hopper_form(wide), first < 17) << to_string(wide);
  }
  p.quant = QuantFormat{};
  test::ScopedEnv knob("GATEDMLP_QDECODE_HOPPER", "0");
  const Config off = pick(p, h200());
  EXPECT_FALSE(quant_decode::is_hopper_form(off)) << to_string(off);
  EXPECT_NE(off.reason.find("GATEDMLP_QDECODE_HOPPER=0"), std::string::npos) << off.reason;
  {
    test::ScopedEnv all("GATEDMLP_QDECODE_HOPPER", "all");  // the measuring knob: from M = 1
    Problem q = llama8b(1);
    q.quantized = true;
    EXPECT_TRUE(quant_decode::is_hopper_form(pick(q, h200()))) << "m=1 under GATEDMLP_QDECODE_HOPPER=all";
  }
}

TEST(Dispatch, DownProjection) {
  for (const char* v : {"GATEDMLP_SM90_TILE", "GATEDMLP_SM90_CLUSTER", "GATEDMLP_FORCE_PATH", "GATEDMLP_SM90_PINGPONG",
                        "GATEDMLP_DECODE"})
    unsetenv(v);
  auto down = [](int64_t m) {
    Problem p;
    p.op = Operation::down;
    p.m = m;
    p.k = 14336;
    p.u = 4096;
    return p;
  };
  auto pick_down = [](const Problem& p) {
    Config c;
    const Status s = detail::select_config(p.resolved(), nullptr, h200(), &c);
    EXPECT_TRUE(s.ok()) << s.message();
    return c;
  };
  // 16-bit: the decode kernel up to its 16 rows, cuBLASLt past them.
  for (int64_t m : {1, 16}) EXPECT_EQ(pick_down(down(m)).path, KernelPath::decode) << m;
  Config c = pick_down(down(17));
  EXPECT_EQ(c.path, KernelPath::cublas);
  EXPECT_NE(c.reason.find("m=17 is more than"), std::string::npos) << c.reason;
  // Quantized: its decode kernel up to 64 rows; past them dequantized, then cuBLASLt.
  Problem q = down(64);
  q.quantized = true;
  c = pick_down(q);
  EXPECT_EQ(c.path, KernelPath::quant_decode) << to_string(c);
  EXPECT_EQ(c.tile_n, 16);
  q.m = 65;
  c = pick_down(q);
  EXPECT_EQ(c.path, KernelPath::cublas) << to_string(c);
  EXPECT_NE(c.reason.find("dequantized to bf16 in the workspace"), std::string::npos) << c.reason;
  // Quantized, K not a multiple of 16 (FP8): dequantized; at m <= 16 the 16-bit decode kernel takes it.
  q.m = 4;
  q.k = 200;
  q.quant = QuantFormat{QuantMode::fp8_e4m3, 8, 128, 128};
  q.scale_dtype = DType::fp32;
  c = pick_down(q);
  EXPECT_EQ(c.path, KernelPath::decode) << to_string(c);
  EXPECT_NE(c.reason.find("k=200"), std::string::npos) << c.reason;
  // The GLU of the input: computed into the workspace, so rows of X off 16
  // bytes do not keep the decode kernel from the call.
  Problem g = down(8);
  g.glu_input = true;
  g.ldx = 14337;
  c = pick_down(g);
  EXPECT_EQ(c.path, KernelPath::decode) << to_string(c);
  EXPECT_NE(c.reason.find("GLU of its input"), std::string::npos) << c.reason;
  g.glu_input = false;
  EXPECT_EQ(pick_down(g).path, KernelPath::cublas);
  // in_out weights: only cuBLASLt reads them.
  Problem io = down(1);
  io.weights.storage = WeightStorage::in_out;
  c = pick_down(io);
  EXPECT_EQ(c.path, KernelPath::cublas);
  EXPECT_NE(c.reason.find("in_out"), std::string::npos) << c.reason;
}

TEST(Dispatch, Gather) {
  for (const char* v : {"GATEDMLP_FORCE_PATH", "GATEDMLP_DECODE"}) unsetenv(v);
  auto pick = [](const Problem& p) {
    Config c;
    const Status s = detail::select_config(p.resolved(), nullptr, h200(), &c);
    EXPECT_TRUE(s.ok()) << s.message();
    return c;
  };
  // Qwen3-30B-A3B's experts at 64 tokens x top 8: the decode kernel, whatever m.
  Problem p;
  p.m = 512;
  p.k = 2048;
  p.u = 768;
  p.gather.experts = 128;
  p.gather.rows_per_x = 8;
  Config c = pick(p);
  EXPECT_EQ(c.path, KernelPath::decode) << to_string(c);
  EXPECT_NE(c.reason.find("gathered over 128 experts"), std::string::npos) << c.reason;
  EXPECT_EQ(c.tile_m, 8);  // ~4 rows per distinct expert
  // Mixtral's 8 experts at 64 tokens x top 2: 16 rows each, the 16-row tile.
  p.gather.experts = 8;
  p.m = 128;
  p.gather.rows_per_x = 2;
  EXPECT_EQ(pick(p).tile_m, 16);
  // Quantized: its decode kernel, tiles up to 64 rows; the down projection too.
  p.quantized = true;
  c = pick(p);
  EXPECT_EQ(c.path, KernelPath::quant_decode) << to_string(c);
  EXPECT_EQ(c.tile_m, 32);
  p.op = Operation::down;
  p.glu_input = true;
  c = pick(p);
  EXPECT_EQ(c.path, KernelPath::quant_decode) << to_string(c);
  EXPECT_NE(c.reason.find("down projection, gathered"), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("GLU of its input"), std::string::npos) << c.reason;
  // The knobs that keep dense calls off the decode kernel do not apply.
  setenv("GATEDMLP_DECODE", "0", 1);
  p = Problem{};
  p.m = 4;
  p.k = 256;
  p.u = 64;
  p.gather.experts = 4;
  EXPECT_EQ(pick(p).path, KernelPath::decode);
  unsetenv("GATEDMLP_DECODE");
  // What no decode kernel reads is refused, not dequantized or sent to a GEMM.
  p.k = 100;
  Config none;
  const Status s = detail::select_config(p.resolved(), nullptr, h200(), &none);
  EXPECT_EQ(s.code(), StatusCode::not_supported) << s.message();
  EXPECT_NE(s.message().find("k=100 is not a multiple of 8"), std::string::npos) << s.message();
}

// Grouped calls: the Hopper kernel's grouped form on sm_90 (at any m), and
// refused by name where it cannot run.
TEST(Dispatch, Grouped) {
  Problem p;
  p.m = 65536;  // Qwen3-30B-A3B's experts, 512 rows each
  p.k = 2048;
  p.u = 768;
  p.gather.experts = 128;
  p.gather.grouped = true;
  Config c;
  Status s = detail::select_config(p.resolved(), nullptr, h200(), &c);
  if (!sm90::compiled()) {
    EXPECT_EQ(s.code(), StatusCode::not_supported) << s.message();
    return;
  }
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(c.path, KernelPath::sm90_wgmma) << to_string(c);
  EXPECT_EQ(c.tile_n, 128);
  EXPECT_FALSE(c.pingpong);
  EXPECT_NE(c.reason.find("grouped over 128 experts"), std::string::npos) << c.reason;
  // 512 + 128 units of at most 128 rows: the table's bound.
  EXPECT_NE(c.reason.find("at most 640 row units"), std::string::npos) << c.reason;
  EXPECT_EQ(sm90::grouped_workspace_bytes(p.resolved()), size_t(640 * 16));
  // One row: still the grouped kernel (no decode kernel reads offsets).
  p.m = 1;
  ASSERT_TRUE(detail::select_config(p.resolved(), nullptr, h200(), &c).ok());
  EXPECT_EQ(c.path, KernelPath::sm90_wgmma);
  // Not Hopper: refused, naming why.
  s = detail::select_config(p.resolved(), nullptr, a100(), &c);
  EXPECT_EQ(s.code(), StatusCode::not_supported) << s.message();
  EXPECT_NE(s.message().find("Hopper"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("not an sm_90 device"), std::string::npos) << s.message();
  // An expert stride the copy engine cannot step.
  p.batch_stride_w = 2 * 768 * 2048 + 4;
  s = detail::select_config(p.resolved(), nullptr, h200(), &c);
  EXPECT_EQ(s.code(), StatusCode::not_supported) << s.message();
  EXPECT_NE(s.message().find("batch_stride_w=3145732"), std::string::npos) << s.message();
}
