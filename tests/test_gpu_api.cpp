// API behaviour that needs a device: pointer checks that leave the output
// untouched, routing (plan), misaligned pointers taking the element loader,
// the device layout converter, and sizes that need 64-bit indexing. Also the
// kernels' activation functions on their own, against float64.
#include <cmath>
#include <random>

#include "common/activation_math.hpp"
#include "gatedmlp/layout.hpp"
#include "gpu_util.hpp"

using namespace gatedmlp;
using namespace gatedmlp::test;

namespace {

Problem small() {
  Problem p;
  p.m = 40;
  p.k = 64;
  p.u = 48;
  return p;
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937_64& rng, float scale) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = ref::float_to_bf16(d(rng));
  return v;
}

}  // namespace

TEST(GpuApi, BadPointersWriteNothing) {
  SKIP_WITHOUT_GPU();
  const Problem p = small();
  DeviceBuffer x(p.m * p.k * 2), w(2 * p.u * p.k * 2), y(p.m * p.u * 2);
  ASSERT_TRUE(x.p && w.p && y.p);
  CUDA_OK(cudaMemset(y.p, 0x5A, y.bytes));
  std::vector<uint16_t> host_x(p.m * p.k, 0x3F80);

  auto y_untouched = [&] {
    std::vector<unsigned char> out(y.bytes);
    cudaMemcpy(out.data(), y.p, y.bytes, cudaMemcpyDeviceToHost);
    for (unsigned char c : out)
      if (c != 0x5A) return false;
    return true;
  };

  Arguments a;
  a.x = host_x.data();  // host memory
  a.w = w.p;
  a.y = y.p;
  Status s = run(p, a, nullptr, 0, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("'x'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("host memory"), std::string::npos) << s.message();
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(y_untouched());

  // Pinned host memory is refused too: it is reachable, but almost surely a mistake.
  void* pinned = nullptr;
  CUDA_OK(cudaMallocHost(&pinned, x.bytes));
  a.x = pinned;
  s = run(p, a, nullptr, 0, nullptr);
  EXPECT_NE(s.message().find("pinned host memory"), std::string::npos) << s.message();
  cudaFreeHost(pinned);

  // Output overlapping the weights, on real device memory.
  a.x = x.p;
  a.y = static_cast<char*>(w.p) + 128;
  s = run(p, a, nullptr, 0, nullptr);
  EXPECT_NE(s.message().find("overlaps 'w'"), std::string::npos) << s.message();
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_TRUE(y_untouched());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the checks leave no sticky error behind
}

// Arguments::devices_checked (a binding that knows every tensor's device)
// skips only the driver's per-pointer query: the call computes what an
// unflagged one does, bit for bit, and presence, alignment and overlap are
// still refused by name with nothing written.
TEST(GpuApi, DevicesCheckedSkipsOnlyTheDeviceQuery) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const Problem p = small();
  const auto hx = random_bf16(p.m * p.k, rng, 1.f), hw = random_bf16(2 * p.u * p.k, rng, 0.125f);
  DeviceBuffer x(hx.size() * 2), w(hw.size() * 2), y(p.m * p.u * 2), y2(p.m * p.u * 2);
  ASSERT_TRUE(x.p && w.p && y.p && y2.p);
  CUDA_OK(cudaMemcpy(x.p, hx.data(), x.bytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(w.p, hw.data(), w.bytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(y.p, 0x5A, y.bytes));
  CUDA_OK(cudaMemset(y2.p, 0xA5, y2.bytes));
  Arguments a;
  a.x = x.p;
  a.w = w.p;
  a.y = y.p;
  ASSERT_TRUE(run(p, a, nullptr, 0, nullptr).ok());
  Arguments b = a;
  b.y = y2.p;
  b.devices_checked = true;
  ASSERT_TRUE(run(p, b, nullptr, 0, nullptr).ok());
  std::vector<unsigned char> r1(y.bytes), r2(y2.bytes);
  CUDA_OK(cudaMemcpy(r1.data(), y.p, y.bytes, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(r2.data(), y2.p, y2.bytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(r1, r2);

  CUDA_OK(cudaMemset(y2.p, 0xA5, y2.bytes));
  Arguments bad = b;
  bad.y = static_cast<char*>(w.p) + 128;  // overlaps the weights
  Status s = run(p, bad, nullptr, 0, nullptr);
  EXPECT_NE(s.message().find("overlaps 'w'"), std::string::npos) << s.message();
  bad = b;
  bad.x = static_cast<const char*>(x.p) + 1;  // not bf16-aligned
  s = run(p, bad, nullptr, 0, nullptr);
  EXPECT_NE(s.message().find("'x'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("aligned"), std::string::npos) << s.message();
  bad = b;
  bad.w = nullptr;
  s = run(p, bad, nullptr, 0, nullptr);
  EXPECT_NE(s.message().find("'w' is null"), std::string::npos) << s.message();
  DeviceBuffer ws(4096);
  ASSERT_TRUE(ws.p);
  s = run(p, b, static_cast<char*>(ws.p) + 8, 64, nullptr);  // the workspace keeps its alignment check
  EXPECT_NE(s.message().find("'workspace'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("16-byte aligned"), std::string::npos) << s.message();
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(r2.data(), y2.p, y2.bytes, cudaMemcpyDeviceToHost));
  for (unsigned char c : r2) ASSERT_EQ(c, 0xA5);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// The workspace is checked like a tensor: present with its size, aligned,
// device memory, overlapping nothing. Each bad one is refused by name and
// nothing is written.
TEST(GpuApi, BadWorkspaceWritesNothing) {
  SKIP_WITHOUT_GPU();
  Problem p = small();
  p.k = 256;  // several k-blocks: the split tail may use the workspace
  DeviceBuffer x(p.m * p.k * 2), w(2 * p.u * p.k * 2), y(p.m * p.u * 2), ws(1 << 20);
  ASSERT_TRUE(x.p && w.p && y.p && ws.p);
  CUDA_OK(cudaMemset(y.p, 0x5A, y.bytes));
  Arguments a;
  a.x = x.p;
  a.w = w.p;
  a.y = y.p;
  std::vector<unsigned char> host_ws(4096);
  struct Bad {
    void* ptr;
    size_t bytes;
    const char* says;
  };
  const Bad bad[] = {
      {nullptr, 4096, "'workspace' is null but workspace_bytes=4096"},
      {ws.p, 0, "workspace_bytes=0"},
      {static_cast<char*>(ws.p) + 8, 4096, "16-byte aligned"},
      {host_ws.data(), host_ws.size(), "host memory"},
      {static_cast<char*>(y.p) + 16, 64, "overlaps 'y'"},
      {x.p, 64, "overlaps 'x'"},
  };
  for (const Bad& b : bad) {
    const Status s = run(p, a, b.ptr, b.bytes, nullptr);
    ASSERT_FALSE(s.ok()) << b.says;
    EXPECT_EQ(s.code(), StatusCode::invalid_argument);
    EXPECT_NE(s.message().find("workspace"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(b.says), std::string::npos) << s.message();
  }
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<unsigned char> out(y.bytes);
  CUDA_OK(cudaMemcpy(out.data(), y.p, y.bytes, cudaMemcpyDeviceToHost));
  for (unsigned char c : out) ASSERT_EQ(c, 0x5A);
  // Less workspace than workspace_size() is fine: the call runs unsplit.
  ASSERT_TRUE(run(p, a, ws.p, 256, nullptr).ok());
  ASSERT_TRUE(run(p, a, nullptr, 0, nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());
}

TEST(GpuApi, PlanNamesThePathAndWhy) {
  SKIP_WITHOUT_GPU();
  Config c;
  Problem p = small();
  ASSERT_TRUE(plan(p, &c).ok());
  int dev = 0, major = 0, minor = 0;
  CUDA_OK(cudaGetDevice(&dev));
  CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  // sm_90 (H100/H200) takes the Hopper kernel; everything else the portable
  // one (40 rows: more than the decode kernel takes).
  EXPECT_EQ(c.path, major == 9 && minor == 0 ? KernelPath::sm90_wgmma : KernelPath::sm80_mma) << c.reason;
  EXPECT_TRUE(c.vector_loads);
  EXPECT_FALSE(c.reason.empty());
  p.k = 63;  // not a multiple of 8: neither TMA nor 16-byte cp.async
  ASSERT_TRUE(plan(p, &c).ok());
  EXPECT_EQ(c.path, KernelPath::sm80_mma);
  EXPECT_FALSE(c.vector_loads);
  EXPECT_NE(c.reason.find("k=63"), std::string::npos) << c.reason;
  p.k = 0;
  EXPECT_FALSE(plan(p, &c).ok());
}

// x and w one element past a 16-byte boundary: the 16-byte loader cannot be
// used, the element loader must give the same answer as the reference.
TEST(GpuApi, MisalignedPointersStillCorrect) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(std::random_device{}());
  Problem p = small();
  p.k = 128;
  auto hx = random_bf16(p.m * p.k, rng, 1.f), hw = random_bf16(2 * p.u * p.k, rng, 0.2f);
  DeviceBuffer x((hx.size() + 1) * 2), w((hw.size() + 1) * 2), y(p.m * p.u * 4);
  uint16_t* dx = static_cast<uint16_t*>(x.p) + 1;
  uint16_t* dw = static_cast<uint16_t*>(w.p) + 1;
  CUDA_OK(cudaMemcpy(dx, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dw, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
  p.output_dtype = DType::fp32;
  Arguments a;
  a.x = dx;
  a.w = dw;
  a.y = y.p;
  CUDA_OK(cudaMemset(y.p, 0xFF, y.bytes));  // NaN
  const Status s = run(p, a, nullptr, 0, nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  expect_y_matches_cpu(p, hx.data(), hw.data(), y.p, 1e-4, "misaligned x and w");
}

// run() plans a call once and reuses the plan (on Hopper: the tensor maps,
// with the new addresses put in) for calls of the same problem. Each call
// here has new buffers, and alternates between pointer sets of different
// alignment (16-byte and 2-byte: another plan) and a workspace and none;
// every output must match the float64 reference. Shapes: the Hopper split
// tail (K = 1024), the ping-pong kernels, separate weights with a bias and
// the pre-activation, and few rows (the decode kernel).
TEST(GpuApi, RepeatedCallsFollowNewPointers) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(std::random_device{}());
  struct Shape {
    int64_t m, k, u;
    bool separate;
  };
  for (const Shape sh : {Shape{300, 1024, 1300, false}, Shape{256, 512, 704, false}, Shape{97, 256, 80, true},
                         Shape{3, 512, 136, false}}) {
    Problem p;
    p.m = sh.m;
    p.k = sh.k;
    p.u = sh.u;
    p.output_dtype = DType::fp32;
    if (sh.separate) {
      p.weights.format = WeightFormat::separate;
      p.has_bias = true;
      p.has_preact = true;
      p.preact_dtype = DType::fp32;
    }
    const size_t ws_bytes = workspace_size(p);
    DeviceBuffer ws(ws_bytes ? ws_bytes : 1);
    for (int call = 0; call < 6; ++call) {
      const int64_t shift = call % 3 == 2 ? 1 : 0;  // 2-byte aligned x and w on every third call
      const int64_t nx = p.m * p.k, nw = (sh.separate ? 1 : 2) * p.u * p.k;
      auto hx = random_bf16(nx, rng, 1.f), hw = random_bf16(nw, rng, 0.1f), hwu = random_bf16(nw, rng, 0.1f);
      std::vector<float> hb(2 * p.u);
      for (float& b : hb) b = std::uniform_real_distribution<float>(-1, 1)(rng);
      DeviceBuffer x((nx + shift) * 2), w((nw + shift) * 2), wu((nw + shift) * 2), b(hb.size() * 4),
          y(p.m * p.u * 4), pre(p.m * 2 * p.u * 4);
      uint16_t* dx = static_cast<uint16_t*>(x.p) + shift;
      uint16_t* dw = static_cast<uint16_t*>(w.p) + shift;
      uint16_t* dwu = static_cast<uint16_t*>(wu.p) + shift;
      CUDA_OK(cudaMemcpy(dx, hx.data(), nx * 2, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(dw, hw.data(), nw * 2, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(dwu, hwu.data(), nw * 2, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(b.p, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemset(y.p, 0xFF, y.bytes));  // NaN
      CUDA_OK(cudaMemset(pre.p, 0xFF, pre.bytes));
      Arguments a;
      a.x = dx;
      a.w = dw;
      a.y = y.p;
      if (sh.separate) {
        a.w_up = dwu;
        a.bias = b.p;
        a.bias_up = static_cast<float*>(b.p) + p.u;
        a.preact = pre.p;
      }
      const bool with_ws = call % 2 == 0 && ws_bytes > 0;
      const Status s = run(p, a, with_ws ? ws.p : nullptr, with_ws ? ws_bytes : 0, nullptr);
      ASSERT_TRUE(s.ok()) << s.message();
      CUDA_OK(sync_within("RepeatedCallsFollowNewPointers"));
      std::vector<float> out(p.m * p.u), out_pre(p.m * 2 * p.u);
      CUDA_OK(cudaMemcpy(out.data(), y.p, out.size() * 4, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(out_pre.data(), pre.p, out_pre.size() * 4, cudaMemcpyDeviceToHost));
      Arguments h;
      h.x = hx.data();
      h.w = hw.data();
      if (sh.separate) {
        h.w_up = hwu.data();
        h.bias = hb.data();
        h.bias_up = hb.data() + p.u;
      }
      std::vector<double> want, want_pre;
      ref::cpu_reference(p, h, &want, sh.separate ? &want_pre : nullptr);
      for (size_t i = 0; i < out.size(); ++i)
        ASSERT_NEAR(out[i], want[i], 2e-3 * (1 + std::fabs(want[i])))
            << "m=" << p.m << " k=" << p.k << " u=" << p.u << " call " << call << " element " << i;
      if (sh.separate) {
        for (size_t i = 0; i < out_pre.size(); ++i)
          ASSERT_NEAR(out_pre[i], want_pre[i], 2e-3 * (1 + std::fabs(want_pre[i]))) << "preact, call " << call;
      }
    }
  }
}

// A Hopper call with a split tail captured into a CUDA graph and replayed:
// each replay must wait for its own partial sums, not take the flags the
// previous replay left (the token is the captured one). On other devices
// the same capture runs the portable kernel.
TEST(GpuApi, SplitTailInCudaGraphReplays) {
  SKIP_WITHOUT_GPU();
  setenv("GATEDMLP_SM90_SPLIT_TAIL", "force", 1);
  std::mt19937_64 rng(std::random_device{}());
  Problem p;
  p.m = 300;
  p.k = 1024;
  p.u = 1300;
  p.output_dtype = DType::fp32;  // the 128-column cooperative kernels: the ones with a split tail
  const size_t ws_bytes = workspace_size(p);
  DeviceBuffer x(p.m * p.k * 2), w(2 * p.u * p.k * 2), y(p.m * p.u * 4), ws(ws_bytes ? ws_bytes : 1);
  auto hw = random_bf16(2 * p.u * p.k, rng, 0.05f);
  CUDA_OK(cudaMemcpy(w.p, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
  Arguments a;
  a.x = x.p;
  a.w = w.p;
  a.y = y.p;
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ASSERT_TRUE(run(p, a, ws.p, ws_bytes, stream).ok());  // planned outside the capture
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const Status s = run(p, a, ws.p, ws_bytes, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(s.ok()) << s.message();
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 4; ++replay) {
    auto hx = random_bf16(p.m * p.k, rng, 1.f);
    CUDA_OK(cudaMemcpy(x.p, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(y.p, 0xFF, y.bytes));  // NaN
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    expect_y_matches_cpu(p, hx.data(), hw.data(), y.p, 2e-3, "replay " + std::to_string(replay));
    if (::testing::Test::HasFatalFailure()) break;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  unsetenv("GATEDMLP_SM90_SPLIT_TAIL");
}

// Empty work on a device: nothing launched, nothing written, any pointers.
TEST(GpuApi, EmptyWorkLaunchesNothing) {
  SKIP_WITHOUT_GPU();
  Problem p = small();
  DeviceBuffer y(p.m * p.u * 2);
  CUDA_OK(cudaMemset(y.p, 0x5A, y.bytes));
  for (int which = 0; which < 2; ++which) {
    Problem q = p;
    (which ? q.batch : q.m) = 0;
    Arguments a;
    a.y = y.p;  // x and w null
    const Status s = run(q, a, nullptr, 0, nullptr);
    EXPECT_TRUE(s.ok()) << s.message();
  }
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<unsigned char> out(y.bytes);
  CUDA_OK(cudaMemcpy(out.data(), y.p, y.bytes, cudaMemcpyDeviceToHost));
  for (unsigned char c : out) ASSERT_EQ(c, 0x5A);
}

TEST(GpuApi, DeviceConverterMatchesHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const int64_t u = 96, k = 40;
  auto src = random_bf16(2 * u * k, rng, 1.f);
  WeightLayout from;  // stacked
  WeightLayout to;
  to.group = 32;
  to.first = Half::up;
  to.storage = WeightStorage::in_out;
  std::vector<uint16_t> want(2 * u * k);
  ASSERT_TRUE(convert_weights(u, k, DType::bf16, from, src.data(), nullptr, to, want.data(), nullptr).ok());
  DeviceBuffer ds(src.size() * 2), dd(src.size() * 2);
  CUDA_OK(cudaMemcpy(ds.p, src.data(), ds.bytes, cudaMemcpyHostToDevice));
  ASSERT_TRUE(convert_weights_device(u, k, DType::bf16, from, ds.p, nullptr, to, dd.p, nullptr, nullptr).ok());
  std::vector<uint16_t> got(src.size());
  CUDA_OK(cudaMemcpy(got.data(), dd.p, dd.bytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, want);
}

// X and Y each hold more than 2^31 elements: every offset must be 64-bit.
// Checked on rows at the start, around 2^31 / ldx and at the very end.
TEST(GpuApi, SixtyFourBitIndexing) {
  SKIP_WITHOUT_GPU();
  size_t free_b = 0, total_b = 0;
  CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
  Problem p;
  p.k = 16;
  p.u = 16;
  p.m = (int64_t(1) << 31) / p.k + 1000;  // x: 2^31 + 16000 elements
  const size_t need = size_t(p.m) * (p.k + p.u) * 2 + (1u << 20);
  if (free_b < need + (size_t(2) << 30)) GTEST_SKIP() << "needs " << need / (1 << 30) << " GiB of free device memory";
  std::mt19937_64 rng(std::random_device{}());
  DeviceBuffer x(size_t(p.m) * p.k * 2), w(2 * p.u * p.k * 2), y(size_t(p.m) * p.u * 2);
  ASSERT_TRUE(x.p && w.p && y.p);
  ASSERT_TRUE(ref::fill_random(x.p, DType::bf16, p.m * p.k, rng(), -1.f, 1.f, false, nullptr).ok());
  ASSERT_TRUE(ref::fill_random(w.p, DType::bf16, 2 * p.u * p.k, rng(), -0.5f, 0.5f, false, nullptr).ok());
  ASSERT_TRUE(ref::fill_nan(y.p, DType::bf16, p.m * p.u, nullptr).ok());
  Arguments a;
  a.x = x.p;
  a.w = w.p;
  a.y = y.p;
  const Status s = run(p, a, nullptr, 0, nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  CUDA_OK(cudaDeviceSynchronize());

  const std::vector<int64_t> rows = {0, 1, (int64_t(1) << 31) / p.k - 1, (int64_t(1) << 31) / p.k, p.m - 2, p.m - 1};
  std::vector<uint16_t> hw(2 * p.u * p.k), hx(rows.size() * p.k), hy(rows.size() * p.u);
  CUDA_OK(cudaMemcpy(hw.data(), w.p, hw.size() * 2, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < rows.size(); ++i) {
    CUDA_OK(cudaMemcpy(&hx[i * p.k], static_cast<uint16_t*>(x.p) + rows[i] * p.k, p.k * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(&hy[i * p.u], static_cast<uint16_t*>(y.p) + rows[i] * p.u, p.u * 2, cudaMemcpyDeviceToHost));
  }
  Problem hp = p;
  hp.m = int64_t(rows.size());  // the sampled rows, packed
  Arguments h;
  h.x = hx.data();
  h.w = hw.data();
  std::vector<double> want;
  ref::cpu_reference(hp, h, &want, nullptr);
  for (size_t i = 0; i < hy.size(); ++i) {
    const double got = ref::bf16_to_float(hy[i]);
    ASSERT_TRUE(std::isfinite(got)) << "row " << rows[i / p.u] << " not written";
    ASSERT_NEAR(got, want[i], 1e-2 * (1 + std::fabs(want[i]))) << "row " << rows[i / p.u] << " col " << i % p.u;
  }
}

// The activation as the kernels compute it, element by element, against the
// float64 formula: glu (fp32 outputs; exp2 and reciprocal) and glu_out16
// (16-bit outputs; silu, gelu_tanh and the clamped SwiGLU by one tanh), over
// a dense sweep of g in [-120, 120], random g and u, and huge, tiny and NaN
// inputs. Bounds, with s = |g| |u| (the clamped g and u + 1 for swiglu_clamped):
// glu within 1e-6 s + 1e-30; glu_out16 within 3e-5 s + 1e-30, and within
// 3e-5 of the value itself where g >= 0 (no cancellation there). A NaN g or
// u gives NaN.
TEST(GpuActivation, KernelFormsAgainstFloat64) {
  SKIP_WITHOUT_GPU();
  std::vector<float> g, u;
  for (int i = -120 * 256; i <= 120 * 256; ++i) {
    g.push_back(float(i) / 256.f);
    u.push_back(1.f);
  }
  const uint64_t seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  std::printf("[ seed ] %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 4.f);
  for (int i = 0; i < 200000; ++i) {
    g.push_back(nd(rng));
    u.push_back(nd(rng));
  }
  for (float v : {1e30f, -1e30f, 1e-30f, -1e-30f, 0.f, -0.f, 3e38f, -3e38f}) {
    g.push_back(v);
    u.push_back(1.5f);
  }
  const int64_t n_finite = static_cast<int64_t>(g.size());
  g.push_back(NAN), u.push_back(1.f);
  g.push_back(1.f), u.push_back(NAN);
  const int64_t n = static_cast<int64_t>(g.size());
  DeviceBuffer dg(n * 4), du(n * 4), dy(n * 4);
  ASSERT_TRUE(dg.p && du.p && dy.p);
  CUDA_OK(cudaMemcpy(dg.p, g.data(), n * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(du.p, u.data(), n * 4, cudaMemcpyHostToDevice));
  const float ca = 1.702f, cl = 7.f;  // gpt-oss's alpha and limit
  for (int act = 0; act < 5; ++act) {
    for (bool out16 : {false, true}) {
      SCOPED_TRACE("activation " + std::to_string(act) + (out16 ? ", glu_out16" : ", glu"));
      CUDA_OK(cudaMemset(dy.p, 0xff, n * 4));  // NaN poison
      const Status st = ref::glu_on_device(act, out16, static_cast<const float*>(dg.p), static_cast<const float*>(du.p),
                                           static_cast<float*>(dy.p), n, ca, cl, nullptr);
      ASSERT_TRUE(st.ok()) << st.message();
      std::vector<float> y(n);
      CUDA_OK(cudaMemcpy(y.data(), dy.p, n * 4, cudaMemcpyDeviceToHost));
      const double tol = out16 ? 3e-5 : 1e-6;
      double worst = 0;  // largest |error| / (s + 1e-30) seen
      int64_t fails = 0;
      for (int64_t i = 0; i < n_finite; ++i) {
        double gd = g[i], ud = u[i];
        const double ref = detail::glu<double>(act, gd, ud, ca, cl);
        if (act == detail::kSwigluClamped) detail::clamp_swiglu(gd, ud, double(cl)), ud += 1;
        const double s = std::fabs(gd) * std::fabs(ud);
        const double err = std::fabs(double(y[i]) - ref);
        if (std::fabs(ref) > 3.4028234663852886e38) {
          // 3e38 x 1.5 overflows float: the kernels must say infinity.
          if (!(std::isinf(y[i]) && (y[i] > 0) == (ref > 0)) && ++fails <= 5)
            ADD_FAILURE() << "g " << g[i] << " u " << u[i] << ": " << y[i] << ", float64 " << ref;
          continue;
        }
        worst = std::max(worst, err / (s + 1e-30));
        const bool ok = err <= tol * s + 1e-30 && (!out16 || g[i] < 0 || err <= tol * std::fabs(ref) + 1e-30);
        if (!ok && ++fails <= 5)
          ADD_FAILURE() << "g " << g[i] << " u " << u[i] << ": " << y[i] << ", float64 " << ref << " (error " << err
                        << ")";
      }
      EXPECT_EQ(fails, 0);
      for (int64_t i = n_finite; i < n; ++i) EXPECT_TRUE(std::isnan(y[i])) << "g " << g[i] << " u " << u[i];
      std::printf("[ act %d %s ] worst |error| / (|g| |u|) %.3g over %lld values\n", act, out16 ? "out16" : "fp32 ",
                  worst, static_cast<long long>(n_finite));
    }
  }
}
