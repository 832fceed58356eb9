// Grouped Mixture-of-Experts gate/up + GLU (Gather::grouped: rows sorted by
// expert, E cumulative row ends) on fresh random cases: E from 1 to 128
// experts, routing uniform, skewed (the busiest expert 15x the mean), with
// empty experts (the first, the last, runs in the middle) and all rows on
// one expert; every fused layout the Hopper kernel takes (stacked,
// interleaved in blocks of G, separate), both halves first, bias, alpha,
// every activation, each output dtype, padded rows of x and y and padded
// expert strides; int32 and int64 offsets.
//
// The expected output is the float64 reference run expert by expert on
// that expert's rows and weights. Outputs are poisoned with NaN; padding
// must stay poison. Bad offsets write nothing and are reported. The grouped
// kernel exists on sm_90 only: elsewhere the tests check the refusal.
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gpu_util.hpp"

using namespace gatedmlp;
using namespace gatedmlp::test;

namespace {

#define SKIP_WITHOUT_HOPPER()                                                   \
  do {                                                                          \
    SKIP_WITHOUT_GPU();                                                         \
    if (!device_is_sm90()) GTEST_SKIP() << "the grouped kernel runs on sm_90 only"; \
  } while (0)

enum class Routing { uniform, skewed, empty_ends, one_expert };
const char* kRoutingName[] = {"uniform", "skewed", "empty experts", "one expert"};

struct GroupedCase {
  Problem p;
  std::vector<int64_t> counts;  // rows per expert
  Routing routing = Routing::uniform;
};

// Rows per expert summing to m.
std::vector<int64_t> route(int64_t m, int64_t experts, Routing routing, std::mt19937_64& rng) {
  std::vector<int64_t> c(size_t(experts), 0);
  switch (routing) {
    case Routing::uniform:
      for (int64_t i = 0; i < m; ++i) c[size_t(rng() % uint64_t(experts))]++;
      break;
    case Routing::skewed: {
      // The busiest expert takes 15x the mean (or all rows if that is more).
      const int64_t busy = std::min<int64_t>(m, 15 * m / experts);
      c[size_t(rng() % uint64_t(experts))] = busy;
      for (int64_t i = busy; i < m; ++i) c[size_t(rng() % uint64_t(experts))]++;
      break;
    }
    case Routing::empty_ends: {
      // The first and last experts, and a run in the middle, get nothing.
      std::vector<int64_t> live;
      for (int64_t e = 0; e < experts; ++e)
        if (e != 0 && e != experts - 1 && (e < experts / 3 || e > experts / 2)) live.push_back(e);
      if (live.empty()) live.push_back(experts / 2);
      for (int64_t i = 0; i < m; ++i) c[size_t(live[rng() % live.size()])]++;
      break;
    }
    case Routing::one_expert:
      c[size_t(rng() % uint64_t(experts))] = m;
      break;
  }
  return c;
}

GroupedCase random_grouped_case(std::mt19937_64& rng) {
  GroupedCase c;
  Problem& p = c.p;
  p.input_dtype = rng() % 2 ? DType::bf16 : DType::fp16;
  p.output_dtype = static_cast<DType>(rng() % 3);
  const int64_t experts = pick(rng, {1, 2, 3, 8, 8, 32, 128});
  p.gather.experts = experts;
  p.gather.grouped = true;
  p.gather.index_type = rng() % 2 ? IndexType::int64 : IndexType::int32;
  p.m = pick(rng, {1, 7, 64, 127, 128, 129, 300, 513, 1000, 2500});
  p.k = pick(rng, {8, 64, 136, 264, 512, 1024});
  p.u = pick(rng, {8, 64, 128, 200, 256, 328});
  if (rng() % 4 == 0) {
    p.weights.format = WeightFormat::separate;
  } else {
    // G dividing 128 or a multiple of it (the Hopper kernel's boxes), dividing U.
    p.weights.group = rng() % 2 ? 0 : pick(rng, {1, 8, 16, 32, 64, 128});
    if (p.weights.group && p.u % p.weights.group) p.weights.group = 8;
    p.weights.first = rng() % 4 == 0 ? Half::up : Half::gate;
  }
  p.activation = static_cast<Activation>(rng() % 5);
  if (rng() % 2) {
    p.has_bias = true;
    p.bias_dtype = static_cast<DType>(rng() % 3);
  }
  const float alphas[] = {1.0f, 0.5f, -1.5f};
  p.alpha = alphas[rng() % 3];
  if (rng() % 3 == 0) p.ldx = p.k + pick(rng, {8, 24});
  if (rng() % 3 == 0) p.ldy = p.u + pick(rng, {1, 3, 8});
  if (rng() % 4 == 0) p.weights.ld = p.k + 8;
  // Host memory and reference time: E x rows x K weights, m x rows x K products.
  auto rows = [&] { return p.weights.format == WeightFormat::fused ? 2 * p.u : p.u; };
  while (experts * rows() * p.k > 6'000'000 && p.u > 8) {
    p.u = std::max<int64_t>(8, p.u / 16 * 8);
    if (p.weights.group && p.u % p.weights.group) p.weights.group = 0;
    if (p.ldy) p.ldy = p.u + 3;
  }
  while (p.m * rows() * p.k > 3'000'000 && p.m > 1) p.m = std::max<int64_t>(1, p.m / 2);
  const int64_t ld = p.weights.ld ? p.weights.ld : p.k;
  if (rng() % 4 == 0) p.batch_stride_w = rows() * ld + 64;  // experts not packed
  c.routing = static_cast<Routing>(rng() % 4);
  c.counts = route(p.m, experts, c.routing, rng);
  return c;
}

struct Stats {
  int cases = 0, bad = 0, multi_tile = 0, partial_tiles = 0;
  int by_routing[4] = {0, 0, 0, 0};
};

// bad_expert >= 0: offsets[bad_expert] replaced by bad_value; the call must
// write nothing and report it.
void run_grouped_case(const GroupedCase& c, std::mt19937_64& rng, Stats* st, int64_t bad_expert = -1,
                      int64_t bad_value = 0) {
  const Problem& p = c.p;
  SCOPED_TRACE(to_string(p) + " routing=" + kRoutingName[int(c.routing)]);
  ASSERT_TRUE(check_support(p).ok()) << check_support(p).message();
  const Problem r = p.resolved();
  const int64_t E = r.gather.experts;
  const bool sep = r.weights.format == WeightFormat::separate;
  const int64_t rows = sep ? r.u : 2 * r.u;
  const float ws = 2.f / std::sqrt(float(r.k));

  Tensor x, wg, wu, b, bu, off, err;
  fill(x.host, r.input_dtype, (r.m - 1) * r.ldx + r.k, rng, -2.f, 2.f);
  fill(wg.host, r.input_dtype, (E - 1) * r.batch_stride_w + (rows - 1) * r.weights.ld + r.k, rng, -ws, ws);
  if (sep) fill(wu.host, r.input_dtype, (E - 1) * r.batch_stride_w + (rows - 1) * r.weights.ld + r.k, rng, -ws, ws);
  if (r.has_bias) fill(b.host, r.bias_dtype, (E - 1) * r.batch_stride_bias + rows, rng, -0.5f, 0.5f);
  if (r.has_bias && sep) fill(bu.host, r.bias_dtype, (E - 1) * r.batch_stride_bias + rows, rng, -0.5f, 0.5f);
  std::vector<int64_t> ends(static_cast<size_t>(E));
  int64_t acc = 0;
  for (int64_t e = 0; e < E; ++e) ends[size_t(e)] = acc += c.counts[size_t(e)];
  std::vector<int64_t> given = ends;
  if (bad_expert >= 0) given[size_t(bad_expert)] = bad_value;
  const bool i64 = r.gather.index_type == IndexType::int64;
  off.host.assign(size_t(E) * (i64 ? 8 : 4), 0);
  for (int64_t e = 0; e < E; ++e) {
    if (i64) std::memcpy(&off.host[size_t(e) * 8], &given[size_t(e)], 8);
    else {
      const int32_t v = static_cast<int32_t>(given[size_t(e)]);
      std::memcpy(&off.host[size_t(e) * 4], &v, 4);
    }
  }
  err.host.assign(16, 0x5A);
  for (Tensor* t : {&x, &wg, &wu, &b, &bu, &off, &err}) t->upload();

  const int64_t y_n = (r.m - 1) * r.ldy + r.u;
  const std::vector<unsigned char> y_poison = nan_filled(r.output_dtype, y_n);
  Tensor y;
  y.host = y_poison;
  y.upload();

  Arguments a;
  a.x = x.dev.p;
  a.w = wg.dev.p;
  a.w_up = sep ? wu.dev.p : nullptr;
  a.bias = r.has_bias ? b.dev.p : nullptr;
  a.bias_up = r.has_bias && sep ? bu.dev.p : nullptr;
  a.y = y.dev.p;
  a.indices = off.dev.p;
  const bool report = bad_expert >= 0 || rng() % 2;
  a.index_error = report ? static_cast<int64_t*>(err.dev.p) : nullptr;

  Config cfg;
  Status s = plan(p, &cfg);
  ASSERT_TRUE(s.ok()) << s.message();
  SCOPED_TRACE(to_string(cfg));
  EXPECT_EQ(cfg.path, KernelPath::sm90_wgmma) << cfg.reason;
  EXPECT_NE(cfg.reason.find("grouped over"), std::string::npos) << cfg.reason;
  // The table of row units lives in the workspace: refused without one.
  expect_refused_without_workspace(p, a, y, y_poison);
  if (::testing::Test::HasFatalFailure()) return;
  run_with_workspace(p, a, "grouped: " + to_string(p));
  if (::testing::Test::HasFatalFailure()) return;
  const std::vector<unsigned char> out = y.download();
  if (report) {
    int64_t e[2];
    std::memcpy(e, err.download().data(), 16);
    EXPECT_EQ(e[0], bad_expert) << "index_error[0]: the first bad offset's expert";
    EXPECT_EQ(e[1], bad_expert >= 0 ? bad_value : 0) << "index_error[1]: its value";
  }
  if (bad_expert >= 0) {
    ASSERT_EQ(out, y_poison) << "a call with bad offsets wrote y";
    st->bad++;
    return;
  }

  // The expected rows, expert by expert, on that expert's weights.
  const size_t ex = dtype_size(r.input_dtype);
  std::vector<double> want(size_t(r.m * r.u));
  int64_t begin = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = c.counts[size_t(e)];
    if (n > 0) {
      Problem pe = p;
      pe.gather = Gather{};
      pe.m = n;
      pe.ldy = 0;
      pe.batch_stride_w = kAuto;
      Arguments h;
      h.x = x.host.data() + size_t(begin * r.ldx) * ex;
      h.w = wg.host.data() + size_t(e * r.batch_stride_w) * ex;
      h.w_up = sep ? wu.host.data() + size_t(e * r.batch_stride_w) * ex : nullptr;
      if (r.has_bias) {
        const size_t bs = dtype_size(r.bias_dtype);
        h.bias = b.host.data() + size_t(e * r.batch_stride_bias) * bs;
        h.bias_up = sep ? bu.host.data() + size_t(e * r.batch_stride_bias) * bs : nullptr;
      }
      std::vector<double> ye;
      ref::cpu_reference(pe, h, &ye, nullptr);
      std::copy(ye.begin(), ye.end(), want.begin() + begin * r.u);
      st->multi_tile += n > 128;
      st->partial_tiles += n % 128 != 0;
    }
    begin += n;
  }

  const DType dt = r.output_dtype;
  const double ulp = dt == DType::fp32 ? 1e-5 : dt == DType::bf16 ? 0x1p-7 : 0x1p-9;
  double max_ref = 1.0;
  for (double v : want) max_ref = std::max(max_ref, std::fabs(v));
  for (int64_t row = 0; row < r.m; ++row)
    for (int64_t j = 0; j < r.ldy; ++j) {
      const int64_t o = row * r.ldy + j;
      if (o >= y_n) break;
      if (j >= r.u) {  // padding: still poison
        ASSERT_EQ(std::memcmp(&out[size_t(o) * dtype_size(dt)], &y_poison[size_t(o) * dtype_size(dt)], dtype_size(dt)), 0)
            << "y padding [" << row << "][" << j << "] was written";
        continue;
      }
      const double got = ref::load_as_double(out.data(), dt, o), w = want[size_t(row * r.u + j)];
      ASSERT_LE(std::fabs(got - w), ulp * std::fabs(w) + 1e-4 * max_ref)
          << "y[" << row << "][" << j << "] = " << got << ", expected " << w;
    }
  st->cases++;
  st->by_routing[int(c.routing)]++;
}

}  // namespace

TEST(GpuGrouped, RandomLayoutsAndRoutings) {
  SKIP_WITHOUT_HOPPER();
  const int n = cases(300);
  std::mt19937_64 rng(fresh_seed());
  Stats st;
  for (int i = 0; i < n; ++i) {
    const GroupedCase c = random_grouped_case(rng);
    SCOPED_TRACE("case " + std::to_string(i));
    run_grouped_case(c, rng, &st);
    if (HasFailure()) return;
  }
  std::printf("[ cases ] %d passed (routing uniform %d, skewed %d, empty experts %d, one expert %d; %d experts over "
              "more than one 128-row tile, %d ending inside one)\n",
              st.cases, st.by_routing[0], st.by_routing[1], st.by_routing[2], st.by_routing[3], st.multi_tile,
              st.partial_tiles);
}

// Offsets that are not nondecreasing cumulative row ends in [0, m] ending at
// m: nothing written, the first bad expert and its offset reported.
TEST(GpuGrouped, BadOffsetsWriteNothing) {
  SKIP_WITHOUT_HOPPER();
  std::mt19937_64 rng(fresh_seed());
  Stats st;
  for (int i = 0; i < cases(40); ++i) {
    GroupedCase c = random_grouped_case(rng);
    SCOPED_TRACE("case " + std::to_string(i));
    const int64_t E = c.p.gather.experts, m = c.p.m;
    int64_t e = int64_t(rng() % uint64_t(E)), v = 0;
    int64_t prev = 0, end = 0;
    for (int64_t j = 0; j <= e; ++j) {
      prev = end;
      end += c.counts[size_t(j)];
    }
    switch (rng() % 4) {
      case 0: v = -1 - int64_t(rng() % 5); break;        // negative
      case 1: v = m + 1 + int64_t(rng() % 100); break;   // past m
      case 2:                                            // below the previous end (or, for the last, not m)
        if (prev > 0) v = prev - 1;
        else if (e == E - 1) v = m - 1;
        else v = -3;
        break;
      default:  // the last offset short of m
        e = E - 1;
        v = m - 1;
        break;
    }
    (void)end;
    run_grouped_case(c, rng, &st, e, v);
    if (HasFailure()) return;
  }
  std::printf("[ cases ] %d calls with bad offsets refused on the device, nothing written\n", st.bad);
}

// Rows whose element offsets in y pass 2^31 (m x ldy > 2^31): the last
// experts' rows are checked against the reference row by row.
TEST(GpuGrouped, RowsPast32BitOffsets) {
  SKIP_WITHOUT_HOPPER();
  Problem p;
  p.m = 70000;
  p.k = 64;
  p.u = 32768 + 128;
  p.gather.experts = 3;
  p.gather.grouped = true;
  ASSERT_TRUE(check_support(p).ok()) << check_support(p).message();
  const Problem r = p.resolved();
  std::mt19937_64 rng(fresh_seed());
  const std::vector<int64_t> counts = {30000, 1, 39999};
  Tensor x, w, off;
  fill(x.host, DType::bf16, r.m * r.k, rng, -2.f, 2.f);
  fill(w.host, DType::bf16, 3 * 2 * r.u * r.k, rng, -0.25f, 0.25f);
  const int32_t ends[3] = {30000, 30001, 70000};
  off.host.assign(12, 0);
  std::memcpy(off.host.data(), ends, 12);
  for (Tensor* t : {&x, &w, &off}) t->upload();
  DeviceBuffer y(size_t(r.m * r.u) * 2);
  CUDA_OK(cudaMemset(y.p, 0xff, size_t(r.m * r.u) * 2));  // bf16 NaN
  Arguments a;
  a.x = x.dev.p;
  a.w = w.dev.p;
  a.y = y.p;
  a.indices = off.dev.p;
  run_with_workspace(p, a, "grouped, y past 2^31 elements");
  if (HasFatalFailure()) return;
  // Rows: the first, the one-row expert, either side of each boundary and the last.
  for (int64_t row : {int64_t(0), int64_t(29999), int64_t(30000), int64_t(30001), int64_t(50000), int64_t(69999)}) {
    const int64_t e = row < 30000 ? 0 : row < 30001 ? 1 : 2;
    std::vector<unsigned char> got(size_t(r.u) * 2);
    CUDA_OK(cudaMemcpy(got.data(), static_cast<unsigned char*>(y.p) + size_t(row * r.u) * 2, got.size(),
                       cudaMemcpyDeviceToHost));
    Problem pe = p;
    pe.gather = Gather{};
    pe.m = 1;
    Arguments h;
    h.x = x.host.data() + size_t(row * r.k) * 2;
    h.w = w.host.data() + size_t(e * 2 * r.u * r.k) * 2;
    std::vector<double> want;
    ref::cpu_reference(pe, h, &want, nullptr);
    double max_ref = 1.0;
    for (double v : want) max_ref = std::max(max_ref, std::fabs(v));
    for (int64_t j = 0; j < r.u; ++j) {
      const double g = ref::load_as_double(got.data(), DType::bf16, j), wv = want[size_t(j)];
      ASSERT_LE(std::fabs(g - wv), 0x1p-7 * std::fabs(wv) + 1e-4 * max_ref)
          << "y[" << row << "][" << j << "] = " << g << ", expected " << wv << " (expert " << e << ")";
    }
  }
  (void)counts;
}

// Where the grouped kernel cannot run: refused by name, nothing written.
TEST(GpuGrouped, RefusedOffHopperOrUnsupported) {
  SKIP_WITHOUT_GPU();
  Problem p;
  p.m = 64;
  p.k = 64;
  p.u = 64;
  p.gather.experts = 4;
  p.gather.grouped = true;
  Config cfg;
  const Status s = plan(p, &cfg);
  if (!device_is_sm90()) {
    EXPECT_EQ(s.code(), StatusCode::not_supported) << s.message();
    EXPECT_NE(s.message().find("Hopper"), std::string::npos) << s.message();
    return;
  }
  ASSERT_TRUE(s.ok()) << s.message();
  // k not a multiple of 8: no TMA rows.
  Problem q = p;
  q.k = 60;
  const Status t = plan(q, &cfg);
  EXPECT_EQ(t.code(), StatusCode::not_supported) << t.message();
  EXPECT_NE(t.message().find("k=60"), std::string::npos) << t.message();
}
