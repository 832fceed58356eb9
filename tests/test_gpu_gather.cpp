// Mixture-of-experts gather (Problem::gather) on fresh random cases: the
// gate/up + GLU and the down projection (with the GLU fused into its input
// or not), 16-bit and every quantized format, E from 1 to 300 experts, rows
// routed as vLLM does (T tokens x top k, rows_per_x = k) and as MLX's
// gather_qmm does (B batches of M rows, rows_per_index = M), int32 and
// int64 indices, and routing uniform, skewed (most rows on a few experts),
// with empty experts and with duplicate ids within a token.
//
// The expected output is computed on the host without the library's
// routing: the rows are grouped by expert here, each group's rows of X
// gathered into a dense problem on that expert's weights, and the float64
// reference run on it. Every element is held to it on what the kernels
// multiply (the weights rounded to X's type where the kernel dequantizes to
// it, the input's GLU rounded to X's type); outputs are poisoned with NaN,
// padding must stay poison, and a bad index writes nothing and is reported.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/activation_math.hpp"
#include "gatedmlp/quant.hpp"
#include "gpu_util.hpp"
#include "quant_weights.hpp"
#include "scoped_env.hpp"

using namespace gatedmlp;
using namespace gatedmlp::test;

namespace {

enum class Routing { uniform, skewed, distinct_per_token };

struct GatherCase {
  Problem p;
  std::vector<int64_t> idx;  // m / rows_per_index expert ids
  Routing routing = Routing::uniform;
};

GatherCase random_gather_case(std::mt19937_64& rng) {
  GatherCase c;
  Problem& p = c.p;
  p.op = rng() % 3 == 0 ? Operation::down : Operation::gate_up;
  p.input_dtype = rng() % 2 ? DType::bf16 : DType::fp16;
  if (rng() % 3) random_quant_format(p, rng, 3);
  const int64_t experts = pick(rng, {1, 2, 3, 8, 8, 32, 128, 128, 256, 300});
  p.gather.experts = experts;
  p.gather.index_type = rng() % 2 ? IndexType::int64 : IndexType::int32;
  const int shape = int(rng() % 5);
  if (shape < 3) {  // vLLM: T tokens, top k
    const int64_t t = pick(rng, {1, 1, 2, 4, 16, 33, 64}), k = pick(rng, {1, 2, 4, 8});
    p.m = t * k;
    p.gather.rows_per_x = k;
  } else if (shape == 3) {  // MLX: B batches of M rows, an index each
    const int64_t b = pick(rng, {1, 2, 4, 8, 16}), mm = pick(rng, {1, 2, 3, 8, 17, 40});
    p.m = b * mm;
    p.gather.rows_per_index = mm;
  } else {  // both
    const int64_t rx = pick(rng, {1, 2, 4}), ri = pick(rng, {1, 2, 3});
    p.m = rx * ri * pick(rng, {1, 3, 7, 20});
    p.gather.rows_per_x = rx;
    p.gather.rows_per_index = ri;
  }
  const int64_t gs = p.quantized ? std::max(p.quant.group_size, 16) : 8;
  p.k = gs * pick(rng, {1, 2, 3, 5, 8, 17, 36});
  p.u = pick(rng, {1, 3, 8, 15, 16, 17, 40, 77, 129, 200});
  if (p.op == Operation::gate_up) {
    if (rng() % 3 == 0) {
      p.weights.format = WeightFormat::separate;
    } else {
      p.weights.group = rng() % 2 ? 0 : pick(rng, {1, 8, 16});
      if (p.weights.group && p.u % p.weights.group) p.weights.group = 1;
      p.weights.first = rng() % 4 == 0 ? Half::up : Half::gate;
    }
    p.activation = static_cast<Activation>(rng() % 5);
    random_bias_and_preact(p, rng);
    // Tiled int4 experts (tile_quantized per expert): the fused group-8,
    // gate-first order, dense, scales of X's dtype (no gathered fallback).
    if (p.quantized && p.quant.mode == QuantMode::affine && p.quant.bits == 4 && !p.quant.repacked && rng() % 3 == 0) {
      p.quant.tiled = true;
      p.scale_dtype = p.input_dtype;
      p.weights = WeightLayout{};
      p.weights.group = 8;
      p.u = 8 * pick(rng, {1, 2, 5, 16, 25});
      if (p.ldpre) p.ldpre = 2 * p.u + 1;  // random_bias_and_preact's padding, for the new U
    }
  } else {
    if (rng() % 2) {
      p.glu_input = true;
      p.activation = static_cast<Activation>(rng() % 5);
    }
    if (rng() % 2) {
      p.has_bias = true;
      p.bias_dtype = static_cast<DType>(rng() % 3);
    }
    if (rng() % 2) {  // the routing weight of each row, after the bias
      p.has_row_scale = true;
      p.row_scale_dtype = static_cast<DType>(rng() % 3);
    }
    // Tiled int4 experts, the rows as they are: U a multiple of 16, dense,
    // scales of X's dtype.
    if (p.quantized && p.quant.mode == QuantMode::affine && p.quant.bits == 4 && !p.quant.repacked && rng() % 3 == 0) {
      p.quant.tiled = true;
      p.scale_dtype = p.input_dtype;
      p.u = 16 * pick(rng, {1, 2, 5, 13});
    }
  }
  p.output_dtype = static_cast<DType>(rng() % 3);
  const float alphas[] = {1.0f, 0.5f, -1.5f};
  p.alpha = alphas[rng() % 3];
  if (rng() % 3 == 0) p.ldx = p.k + pick(rng, {8, 24});
  if (rng() % 3 == 0) p.ldy = p.u + pick(rng, {1, 3, 8});
  if (rng() % 4 == 0 && !p.quant.tiled) {
    if (p.quantized) p.weights.ld = (quant_words_per_row(p.quant, p.k) + 3) / 4 * 4 + 4;
    else p.weights.ld = p.k + 8;
  }
  // Host memory and reference time: E x rows x K weights, m x rows x K products.
  const int64_t rows = p.op == Operation::gate_up && p.weights.format == WeightFormat::fused ? 2 * p.u : p.u;
  const int64_t tile_u = p.op == Operation::down ? 16 : 8;  // tiled: U in whole tiles
  while ((experts * rows * p.k > 6'000'000 || p.m * rows * p.k > 3'000'000) && p.u > (p.quant.tiled ? tile_u : 1)) {
    p.u = p.quant.tiled ? std::max<int64_t>(tile_u, p.u / (2 * tile_u) * tile_u) : std::max<int64_t>(1, p.u / 2);
    if (p.weights.group && p.u % p.weights.group) p.weights.group = 0;
    if (p.ldy) p.ldy = p.u + 3;
    if (p.ldpre) p.ldpre = 2 * p.u + 1;
  }

  // The routing.
  const int64_t n = p.m / p.gather.rows_per_index;
  c.routing = static_cast<Routing>(rng() % 3);
  c.idx.resize(size_t(n));
  const int64_t per_token = p.gather.rows_per_x;  // vLLM's k when rows_per_index = 1
  for (int64_t i = 0; i < n; ++i) {
    if (c.routing == Routing::skewed && rng() % 8 != 0) c.idx[size_t(i)] = int64_t(rng() % std::min<int64_t>(experts, 3));
    else c.idx[size_t(i)] = int64_t(rng() % uint64_t(experts));
  }
  if (c.routing == Routing::distinct_per_token && p.gather.rows_per_index == 1 && per_token <= experts) {
    for (int64_t t = 0; t < n / per_token; ++t) {  // k distinct experts per token, as a top-k router picks
      std::vector<int64_t> pool(static_cast<size_t>(experts));
      for (int64_t e = 0; e < experts; ++e) pool[size_t(e)] = e;
      std::shuffle(pool.begin(), pool.end(), rng);
      for (int64_t j = 0; j < per_token; ++j) c.idx[size_t(t * per_token + j)] = pool[size_t(j)];
    }
  }
  return c;
}

struct GatherStats {
  int cases = 0, quantized = 0, tiled = 0, down = 0, bad = 0, multi_tile = 0, row_scale = 0;
  int by_routing[3] = {0, 0, 0};
};

// The arrays of all E experts, one after another as the call takes them
// (words at e * batch_stride_w, scales and biases dense per expert, bias at
// e * batch_stride_bias), on the host and the device; quantized, also each
// expert's weights dequantized to X's type, dense [E][rows, K].
struct ExpertTensor {
  Tensor w, scales, biases;
  std::vector<unsigned char> deq;
  int64_t scale_elems = 0;  // per expert
};

void make_expert_tensor(const Problem& r, int64_t rows, std::mt19937_64& rng, ExpertTensor* t) {
  const int64_t E = r.gather.experts;
  if (!r.quantized) {
    const float s = 2.f / std::sqrt(float(r.k));
    fill(t->w.host, r.input_dtype, (E - 1) * r.batch_stride_w + (rows - 1) * r.weights.ld + r.k, rng, -s, s);
    t->w.upload();
    return;
  }
  t->w.host.assign(size_t(E * r.batch_stride_w) * 4, 0xA5);
  for (int64_t e = 0; e < E; ++e) {
    QuantWeights qw;
    make_weights(r, rows, rng, &qw);
    if (::testing::Test::HasFatalFailure()) return;
    std::copy(qw.words.host.begin(), qw.words.host.end(), t->w.host.begin() + e * r.batch_stride_w * 4);
    t->scale_elems = quant_scale_rows(r.quant, rows) * quant_groups_per_row(r.quant, r.k);
    t->scales.host.insert(t->scales.host.end(), qw.scales.host.begin(), qw.scales.host.end());
    t->biases.host.insert(t->biases.host.end(), qw.biases.host.begin(), qw.biases.host.end());
    t->deq.insert(t->deq.end(), qw.dequantized.begin(), qw.dequantized.end());
  }
  for (Tensor* d : {&t->w, &t->scales, &t->biases}) d->upload();
}

// Host pointer to expert e's part of a tensor of `esize`-byte elements.
const void* at(const std::vector<unsigned char>& v, int64_t elems, size_t esize) {
  return v.empty() ? nullptr : v.data() + size_t(elems) * esize;
}

void run_gather_case(const GatherCase& c, std::mt19937_64& rng, GatherStats* st, int64_t bad_pos = -1,
                     int64_t bad_value = 0) {
  const Problem& p = c.p;
  SCOPED_TRACE(to_string(p));
  ASSERT_TRUE(check_support(p).ok()) << check_support(p).message();
  const Problem r = p.resolved();
  const int64_t E = r.gather.experts;
  const bool down = r.op == Operation::down, sep = !down && r.weights.format == WeightFormat::separate;
  const bool fp8 = r.quantized && r.quant.mode == QuantMode::fp8_e4m3;
  // A biases array: affine, but not tiled (its biases are in the scales, (scale, bias) pairs).
  const bool affine = r.quantized && r.quant.mode == QuantMode::affine && !r.quant.tiled;
  const int64_t rows = down || sep ? r.u : 2 * r.u;
  const int64_t xr = r.m / r.gather.rows_per_x;

  ExpertTensor wg, wu;
  make_expert_tensor(r, rows, rng, &wg);
  if (sep) make_expert_tensor(r, rows, rng, &wu);
  if (::testing::Test::HasFatalFailure()) return;
  Tensor x, xu, b, bu, idx, err, rs;
  fill(x.host, r.input_dtype, (xr - 1) * r.ldx + r.k, rng, -2.f, 2.f);
  if (r.glu_input) fill(xu.host, r.input_dtype, (xr - 1) * r.ldx + r.k, rng, -2.f, 2.f);
  if (r.has_bias) fill(b.host, r.bias_dtype, (E - 1) * r.batch_stride_bias + rows, rng, -0.5f, 0.5f);
  if (r.has_bias && sep) fill(bu.host, r.bias_dtype, (E - 1) * r.batch_stride_bias + rows, rng, -0.5f, 0.5f);
  if (r.has_row_scale) fill(rs.host, r.row_scale_dtype, r.m, rng, -1.f, 1.f);
  const bool i64 = r.gather.index_type == IndexType::int64;
  std::vector<int64_t> ids = c.idx;
  if (bad_pos >= 0) ids[size_t(bad_pos)] = bad_value;
  idx.host.assign(ids.size() * (i64 ? 8 : 4), 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i64) std::memcpy(&idx.host[i * 8], &ids[i], 8);
    else {
      const int32_t v = static_cast<int32_t>(ids[i]);
      std::memcpy(&idx.host[i * 4], &v, 4);
    }
  }
  err.host.assign(16, 0x5A);
  for (Tensor* t : {&x, &xu, &b, &bu, &idx, &err, &rs}) t->upload();

  const int64_t y_n = (r.m - 1) * r.ldy + r.u, pre_n = r.has_preact ? (r.m - 1) * r.ldpre + 2 * r.u : 0;
  const std::vector<unsigned char> y_poison = nan_filled(r.output_dtype, y_n), pre_poison = nan_filled(r.preact_dtype, pre_n);
  Tensor y, pre;
  y.host = y_poison;
  pre.host = pre_poison;
  y.upload();
  pre.upload();

  Arguments a;
  a.x = x.dev.p;
  a.x_up = r.glu_input ? xu.dev.p : nullptr;
  a.w = wg.w.dev.p;
  a.w_up = sep ? wu.w.dev.p : nullptr;
  a.w_scales = r.quantized ? wg.scales.dev.p : nullptr;
  a.w_biases = affine ? wg.biases.dev.p : nullptr;
  a.w_up_scales = r.quantized && sep ? wu.scales.dev.p : nullptr;
  a.w_up_biases = affine && sep ? wu.biases.dev.p : nullptr;
  a.bias = r.has_bias ? b.dev.p : nullptr;
  a.bias_up = r.has_bias && sep ? bu.dev.p : nullptr;
  a.y = y.dev.p;
  a.preact = r.has_preact ? pre.dev.p : nullptr;
  a.indices = idx.dev.p;
  a.row_scale = r.has_row_scale ? rs.dev.p : nullptr;
  const bool report = bad_pos >= 0 || rng() % 2;
  a.index_error = report ? static_cast<int64_t*>(err.dev.p) : nullptr;

  Config cfg;
  Status s = plan(p, &cfg);
  ASSERT_TRUE(s.ok()) << s.message();
  SCOPED_TRACE(to_string(cfg));
  EXPECT_EQ(cfg.path, r.quantized ? KernelPath::quant_decode : KernelPath::decode) << cfg.reason;
  EXPECT_NE(cfg.reason.find("gathered over"), std::string::npos) << cfg.reason;
  if (r.glu_input) expect_refused_without_workspace(p, a, y, y_poison);
  if (::testing::Test::HasFatalFailure()) return;
  run_with_workspace(p, a, "gather: " + to_string(p));
  if (::testing::Test::HasFatalFailure()) return;
  const std::vector<unsigned char> out = y.download(), out_pre = pre.download();
  if (report) {
    int64_t e[2];
    std::memcpy(e, err.download().data(), 16);
    EXPECT_EQ(e[0], bad_pos) << "index_error[0]: the first bad position";
    EXPECT_EQ(e[1], bad_pos >= 0 ? bad_value : 0) << "index_error[1]: its value";
  }
  if (bad_pos >= 0) {
    ASSERT_EQ(out, y_poison) << "a call with a bad index wrote y";
    ASSERT_EQ(out_pre, pre_poison) << "a call with a bad index wrote preact";
    st->bad++;
    return;
  }

  // The expected rows, expert by expert: each expert's rows of X gathered
  // into a dense problem on its own weights.
  std::map<int64_t, std::vector<int64_t>> by_expert;
  for (int64_t row = 0; row < r.m; ++row) by_expert[c.idx[size_t(row / r.gather.rows_per_index)]].push_back(row);
  const size_t ex = dtype_size(r.input_dtype);
  std::vector<double> want(size_t(r.m * r.u)), want_pre(r.has_preact ? size_t(r.m * 2 * r.u) : 0);
  int64_t most = 0;
  for (const auto& [e, rlist] : by_expert) {
    const int64_t n = int64_t(rlist.size());
    most = std::max(most, n);
    // X's rows (the GLU of the input rounded to X's type: what the kernel reads).
    std::vector<unsigned char> xe(size_t(n * r.k) * ex);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t kk = 0; kk < r.k; ++kk) {
        const int64_t off = (rlist[size_t(i)] / r.gather.rows_per_x) * r.ldx + kk;
        double v = ref::load_as_double(x.host.data(), r.input_dtype, off);
        if (r.glu_input)
          v = detail::glu<double>(static_cast<int>(r.activation), v, ref::load_as_double(xu.host.data(), r.input_dtype, off),
                                  double(r.act_params.clamp_alpha), double(r.act_params.clamp_limit));
        ref::store_from_double(xe.data(), r.input_dtype, i * r.k + kk, v);
      }
    Problem pe = p;
    pe.gather = Gather{};
    pe.glu_input = false;
    pe.m = n;
    pe.ldx = pe.ldy = pe.ldpre = 0;
    Arguments h;
    h.x = xe.data();
    // FP8 and repacked int4 on the decode kernel: exact weights, scaled sums.
    const bool exact = fp8 || r.quant.repacked;
    if (r.quantized && !exact) {
      pe.quantized = false;
      pe.weights.ld = 0;
      h.w = at(wg.deq, e * rows * r.k, ex);
      h.w_up = sep ? at(wu.deq, e * rows * r.k, ex) : nullptr;
    } else if (r.quantized) {
      h.w = at(wg.w.host, e * r.batch_stride_w, 4);
      h.w_up = sep ? at(wu.w.host, e * r.batch_stride_w, 4) : nullptr;
      const size_t ss = dtype_size(r.scale_dtype);
      h.w_scales = at(wg.scales.host, e * wg.scale_elems, ss);
      h.w_up_scales = sep ? at(wu.scales.host, e * wu.scale_elems, ss) : nullptr;
      if (r.quant.mode == QuantMode::affine) {  // repacked int4: its biases too
        h.w_biases = at(wg.biases.host, e * wg.scale_elems, ss);
        h.w_up_biases = sep ? at(wu.biases.host, e * wu.scale_elems, ss) : nullptr;
      }
    } else {
      h.w = at(wg.w.host, e * r.batch_stride_w, ex);
      h.w_up = sep ? at(wu.w.host, e * r.batch_stride_w, ex) : nullptr;
    }
    if (r.has_bias) {
      h.bias = at(b.host, e * r.batch_stride_bias, dtype_size(r.bias_dtype));
      h.bias_up = sep ? at(bu.host, e * r.batch_stride_bias, dtype_size(r.bias_dtype)) : nullptr;
    }
    std::vector<double> ye, pree;
    ref::cpu_reference(pe, h, &ye, r.has_preact ? &pree : nullptr);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = rlist[size_t(i)];
      const double scale = r.has_row_scale ? ref::load_as_double(rs.host.data(), r.row_scale_dtype, row) : 1.0;
      for (int64_t j = 0; j < r.u; ++j) want[size_t(row * r.u + j)] = scale * ye[size_t(i * r.u + j)];
      if (r.has_preact)
        std::copy(pree.begin() + i * 2 * r.u, pree.begin() + (i + 1) * 2 * r.u, want_pre.begin() + row * 2 * r.u);
    }
  }

  auto check = [&](const char* name, const std::vector<unsigned char>& got_v, const std::vector<unsigned char>& poison,
                   DType dt, int64_t ld, int64_t cols, const std::vector<double>& w) {
    const double ulp = dt == DType::fp32 ? 1e-5 : dt == DType::bf16 ? 0x1p-7 : 0x1p-9;
    double max_ref = 1.0;
    for (double v : w) max_ref = std::max(max_ref, std::fabs(v));
    // Down with the GLU fused into its input: the kernels' fp32 activation
    // and the reference's float64 one round an element of H differently
    // near a rounding edge (test_gpu_down.cpp's bound).
    const double slack = r.glu_input ? (0x1p-8 + 4 * std::sqrt(double(r.k)) * 0x1p-12) * 6.0 * max_ref : 0;
    for (int64_t row = 0; row < r.m; ++row)
      for (int64_t j = 0; j < ld; ++j) {
        const int64_t off = row * ld + j;
        if (off >= int64_t(got_v.size() / dtype_size(dt))) break;
        if (j >= cols) {  // padding: still poison
          ASSERT_EQ(std::memcmp(&got_v[size_t(off) * dtype_size(dt)], &poison[size_t(off) * dtype_size(dt)], dtype_size(dt)), 0)
              << name << " padding [" << row << "][" << j << "] was written";
          continue;
        }
        const double got = ref::load_as_double(got_v.data(), dt, off), e = w[size_t(row * cols + j)];
        ASSERT_LE(std::fabs(got - e), ulp * std::fabs(e) + 1e-4 * max_ref + slack)
            << name << "[" << row << "][" << j << "] = " << got << ", expected " << e << " (expert "
            << c.idx[size_t(row / r.gather.rows_per_index)] << ")";
      }
  };
  check("y", out, y_poison, r.output_dtype, r.ldy, r.u, want);
  if (::testing::Test::HasFatalFailure()) return;
  if (r.has_preact) check("preact", out_pre, pre_poison, r.preact_dtype, r.ldpre, 2 * r.u, want_pre);
  if (::testing::Test::HasFatalFailure()) return;
  st->cases++;
  st->quantized += r.quantized;
  st->tiled += r.quantized && r.quant.tiled;
  st->down += down;
  st->row_scale += r.has_row_scale;
  st->multi_tile += most > cfg.tile_m;
  st->by_routing[int(c.routing)]++;
}

}  // namespace

TEST(GpuGather, RandomEveryFormatLayoutAndRouting) {
  SKIP_WITHOUT_GPU();
  const int n = cases(1000);
  std::mt19937_64 rng(fresh_seed());
  GatherStats st;
  for (int i = 0; i < n; ++i) {
    const GatherCase c = random_gather_case(rng);
    SCOPED_TRACE("case " + std::to_string(i));
    run_gather_case(c, rng, &st);
    if (HasFailure()) return;
  }
  std::printf("[ cases ] %d passed (%d quantized, %d of them tiled, %d down projections, %d with a row scale; routing uniform %d, "
              "skewed %d, distinct per token %d; %d with an expert over more than one tile)\n",
              st.cases, st.quantized, st.tiled, st.down, st.row_scale, st.by_routing[0], st.by_routing[1], st.by_routing[2],
              st.multi_tile);
}

// An index outside [0, E), anywhere in the list: nothing written, and the
// first one's position and value reported.
TEST(GpuGather, BadIndexWritesNothing) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  GatherStats st;
  for (int i = 0; i < cases(60); ++i) {
    GatherCase c = random_gather_case(rng);
    SCOPED_TRACE("case " + std::to_string(i));
    const int64_t n = int64_t(c.idx.size());
    const int64_t pos = int64_t(rng() % uint64_t(n));
    const bool i64 = c.p.gather.index_type == IndexType::int64;
    const int64_t value = pick(rng, {-1, c.p.gather.experts, c.p.gather.experts + 7, i64 ? (int64_t(1) << 40) : INT32_MAX,
                                     i64 ? INT64_MIN : INT32_MIN});
    // A second bad index later must not hide the first.
    if (pos + 1 < n && rng() % 2) c.idx[size_t(pos + 1 + int64_t(rng() % uint64_t(n - pos - 1)))] = -5;
    run_gather_case(c, rng, &st, pos, value);
    if (HasFailure()) return;
  }
  std::printf("[ cases ] %d calls with a bad index refused on the device, nothing written\n", st.bad);
}

// What the decode kernels cannot read is refused by name, not routed to a
// path that would read every expert.
TEST(GpuGather, RefusedWhereNoKernelReads) {
  SKIP_WITHOUT_GPU();
  Problem p;
  p.m = 4;
  p.k = 100;  // not a multiple of 8
  p.u = 64;
  p.gather.experts = 8;
  Config cfg;
  Status s = plan(p, &cfg);
  EXPECT_EQ(s.code(), StatusCode::not_supported) << s.message();
  EXPECT_NE(s.message().find("k=100"), std::string::npos) << s.message();
  p.k = 128;
  p.weights.storage = WeightStorage::in_out;
  s = check_support(p);
  EXPECT_EQ(s.code(), StatusCode::not_supported) << s.message();
  EXPECT_NE(s.message().find("convert_weights"), std::string::npos) << s.message();
}

// Deeper register pipelines for tiled experts (GATEDMLP_QDECODE_AHEAD = 2,
// 3; 16-row tiles, and K with a tail of the k-blocks of 128, take at most 2).
TEST(GpuGather, TiledAhead) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(fresh_seed());
  GatherStats st;
  int tail_deeper = 0;
  for (const char* v : {"2", "3"}) {
    ScopedEnv env("GATEDMLP_QDECODE_AHEAD", v);
    for (int i = 0, n = 0; n < cases(60) && i < 100000 && !HasFailure(); ++i) {
      const GatherCase c = random_gather_case(rng);
      if (!c.p.quantized || !c.p.quant.tiled) continue;
      SCOPED_TRACE("case " + std::to_string(i) + ", GATEDMLP_QDECODE_AHEAD=" + v);
      Config cfg;
      ASSERT_TRUE(plan(c.p, &cfg).ok());
      if (cfg.path == KernelPath::quant_decode) {
        EXPECT_GE(cfg.ahead, 2) << to_string(cfg);
        EXPECT_LE(cfg.ahead, c.p.k % 128 ? 2 : std::atoi(v)) << to_string(cfg);
        tail_deeper += c.p.k % 128 != 0;
      }
      run_gather_case(c, rng, &st);
      ++n;
    }
  }
  std::printf("[ cases ] %d tiled passed (%d down projections, %d with a K tail two deep)\n", st.cases, st.down,
              tail_deeper);
  EXPECT_GT(tail_deeper, 0) << "no case had a K tail";
}
