// The problem descriptor: printing, stride resolution and the shape rules
// (check_support). Nothing here touches a device.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>

#include "core/internal.hpp"
#include "gatedmlp/quant.hpp"

namespace gatedmlp {

using detail::err;

const char* to_string(DType d) {
  switch (d) {
    case DType::bf16: return "bf16";
    case DType::fp16: return "fp16";
    case DType::fp32: return "fp32";
    case DType::fp8_e4m3: return "fp8_e4m3";
  }
  return "invalid";
}

const char* to_string(XScale x) {
  switch (x) {
    case XScale::tensor: return "tensor";
    case XScale::row: return "row";
    case XScale::block: return "block";
  }
  return "invalid";
}

const char* to_string(YScaleLayout l) {
  switch (l) {
    case YScaleLayout::row_major: return "row_major";
    case YScaleLayout::mn_major: return "mn_major";
  }
  return "invalid";
}

const char* to_string(Operation o) {
  switch (o) {
    case Operation::gate_up: return "gate_up";
    case Operation::down: return "down";
  }
  return "invalid";
}

const char* to_string(Activation a) {
  switch (a) {
    case Activation::silu: return "silu";
    case Activation::gelu_tanh: return "gelu_tanh";
    case Activation::gelu_erf: return "gelu_erf";
    case Activation::relu: return "relu";
    case Activation::swiglu_clamped: return "swiglu_clamped";
  }
  return "invalid";
}

const char* to_string(WeightFormat f) {
  switch (f) {
    case WeightFormat::fused: return "fused";
    case WeightFormat::separate: return "separate";
  }
  return "invalid";
}

const char* to_string(Half h) {
  switch (h) {
    case Half::gate: return "gate";
    case Half::up: return "up";
  }
  return "invalid";
}

const char* to_string(WeightStorage s) {
  switch (s) {
    case WeightStorage::out_in: return "out_in";
    case WeightStorage::in_out: return "in_out";
  }
  return "invalid";
}

const char* to_string(KernelPath k) {
  switch (k) {
    case KernelPath::none: return "none";
    case KernelPath::sm80_mma: return "sm80_mma";
    case KernelPath::sm90_wgmma: return "sm90_wgmma";
    case KernelPath::decode: return "decode";
    case KernelPath::quant_decode: return "quant_decode";
    case KernelPath::cublas: return "cublas";
  }
  return "invalid";
}

const char* to_string(StatusCode c) {
  switch (c) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid_argument";
    case StatusCode::not_supported: return "not_supported";
    case StatusCode::no_device: return "no_device";
    case StatusCode::cuda_error: return "cuda_error";
    case StatusCode::library_error: return "library_error";
  }
  return "invalid";
}

const char* to_string(IndexType t) {
  switch (t) {
    case IndexType::int32: return "int32";
    case IndexType::int64: return "int64";
  }
  return "invalid";
}

size_t dtype_size(DType d) { return d == DType::fp32 ? 4 : d == DType::fp8_e4m3 ? 1 : 2; }

std::string to_string(const WeightLayout& w) {
  std::ostringstream os;
  os << to_string(w.format);
  if (w.format == WeightFormat::fused) os << "(group=" << w.group << ", first=" << to_string(w.first) << ")";
  os << " " << to_string(w.storage) << " ld=" << w.ld;
  return os.str();
}

std::string to_string(const Problem& p) {
  std::ostringstream os;
  const bool down = p.op == Operation::down;
  os << "Problem{" << (down ? "down " : "") << "m=" << p.m << " k=" << p.k << " u=" << p.u << " batch=" << p.batch
     << " in=" << to_string(p.input_dtype);
  if (p.input_dtype == DType::fp8_e4m3)
    os << "(x_scale=" << to_string(p.x_scale) << (p.fp8_promote ? ", fp8_promote" : "") << ")";
  os << " out=" << to_string(p.output_dtype);
  if (p.output_dtype == DType::fp8_e4m3)
    os << "(y_scales=" << to_string(p.y_scale_layout) << (p.has_y_amax ? ", amax" : "") << ")";
  if (!down || p.glu_input) {
    os << (down ? " glu_input=" : " act=") << to_string(p.activation);
    if (p.activation == Activation::swiglu_clamped)
      os << "(alpha=" << p.act_params.clamp_alpha << ", limit=" << p.act_params.clamp_limit << ")";
  }
  if (down) os << " weights=" << to_string(p.weights.storage) << " ld=" << p.weights.ld;
  else os << " weights=" << to_string(p.weights);
  if (p.quantized) {
    os << " quant=" << to_string(p.quant);
    if (p.quant.mode != QuantMode::mxfp4) os << " scales=" << to_string(p.scale_dtype);
  }
  if (p.gather.experts > 0)
    os << " gather(experts=" << p.gather.experts << " rows_per_x=" << p.gather.rows_per_x
       << " rows_per_index=" << p.gather.rows_per_index << " indices=" << to_string(p.gather.index_type)
       << (p.gather.grouped ? " grouped" : "") << ")";
  os << " alpha=" << p.alpha;
  if (p.has_bias) os << " bias=" << to_string(p.bias_dtype);
  if (p.has_row_scale) os << " row_scale=" << to_string(p.row_scale_dtype);
  if (p.has_preact) os << " preact=" << to_string(p.preact_dtype) << " ldpre=" << p.ldpre;
  os << " ldx=" << p.ldx << " ldy=" << p.ldy;
  if (p.batch > 1)
    os << " batch_strides(x=" << p.batch_stride_x << " w=" << p.batch_stride_w << " bias=" << p.batch_stride_bias
       << " y=" << p.batch_stride_y << " preact=" << p.batch_stride_preact << ")";
  os << "}";
  return os.str();
}

std::string to_string(const Config& c) {
  std::ostringstream os;
  os << "Config{path=" << to_string(c.path) << " tile=" << c.tile_m << "x" << c.tile_n << "x" << c.tile_k
     << " stages=" << c.stages << " threads=" << c.threads << " loads=" << (c.vector_loads ? "16B" : "element");
  if (c.ahead) os << " ahead=" << c.ahead;
  if (c.pingpong) os << " pingpong";
  if (!c.reason.empty()) os << " reason=\"" << c.reason << "\"";
  os << "}";
  return os.str();
}

Problem Problem::resolved() const {
  Problem p = *this;
  const int64_t rows = detail::weight_rows(p);
  if (p.op == Operation::gate_up && p.weights.format == WeightFormat::fused && p.weights.group == 0)
    p.weights.group = p.u;
  if (p.ldx == 0) p.ldx = p.k;
  if (p.weights.ld == 0)
    p.weights.ld = p.quantized ? quant_words_per_row(p.quant, p.k)
                               : p.weights.storage == WeightStorage::out_in ? p.k : rows;
  if (p.ldy == 0) p.ldy = p.u;
  if (p.ldpre == 0) p.ldpre = 2 * p.u;
  if (p.batch_stride_x == kAuto) p.batch_stride_x = p.m * p.ldx;
  if (p.batch_stride_w == kAuto)
    p.batch_stride_w = p.weights.storage == WeightStorage::out_in ? rows * p.weights.ld : p.k * p.weights.ld;
  if (p.batch_stride_bias == kAuto) p.batch_stride_bias = rows;
  if (p.batch_stride_y == kAuto) p.batch_stride_y = p.m * p.ldy;
  if (p.batch_stride_preact == kAuto) p.batch_stride_preact = p.m * p.ldpre;
  return p;
}

namespace detail {

// A field added to Problem must be added to same_problem too, or run()
// would reuse a plan made for another call (this size is the x86-64 one).
static_assert(sizeof(void*) != 8 || sizeof(Problem) == 272, "Problem changed: update same_problem");

bool same_problem(const Problem& a, const Problem& b) {
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  };
  const WeightLayout &wa = a.weights, &wb = b.weights;
  return a.op == b.op && a.glu_input == b.glu_input && a.m == b.m && a.k == b.k && a.u == b.u && a.batch == b.batch && a.input_dtype == b.input_dtype &&
         a.output_dtype == b.output_dtype && a.activation == b.activation &&
         bits(a.act_params.clamp_alpha) == bits(b.act_params.clamp_alpha) &&
         bits(a.act_params.clamp_limit) == bits(b.act_params.clamp_limit) && wa.format == wb.format &&
         wa.group == wb.group && wa.first == wb.first && wa.storage == wb.storage && wa.ld == wb.ld &&
         bits(a.alpha) == bits(b.alpha) && a.has_bias == b.has_bias && a.bias_dtype == b.bias_dtype &&
         a.has_preact == b.has_preact && a.preact_dtype == b.preact_dtype && a.ldx == b.ldx && a.ldy == b.ldy &&
         a.ldpre == b.ldpre && a.batch_stride_x == b.batch_stride_x && a.batch_stride_w == b.batch_stride_w &&
         a.batch_stride_bias == b.batch_stride_bias && a.batch_stride_y == b.batch_stride_y &&
         a.batch_stride_preact == b.batch_stride_preact && a.quantized == b.quantized &&
         (!a.quantized || (a.quant.mode == b.quant.mode && a.quant.bits == b.quant.bits &&
                           a.quant.group_size == b.quant.group_size && a.quant.row_block == b.quant.row_block &&
                           a.quant.repacked == b.quant.repacked && a.quant.tiled == b.quant.tiled &&
                           a.scale_dtype == b.scale_dtype)) &&
         (a.input_dtype != DType::fp8_e4m3 || (a.x_scale == b.x_scale && a.fp8_promote == b.fp8_promote)) &&
         (a.output_dtype != DType::fp8_e4m3 ||
          (a.y_scale_layout == b.y_scale_layout && a.has_y_amax == b.has_y_amax)) &&
         a.gather.experts == b.gather.experts && a.has_row_scale == b.has_row_scale &&
         (!a.has_row_scale || a.row_scale_dtype == b.row_scale_dtype) &&
         (a.gather.experts == 0 ||
          (a.gather.rows_per_x == b.gather.rows_per_x && a.gather.rows_per_index == b.gather.rows_per_index &&
           a.gather.index_type == b.gather.index_type && a.gather.grouped == b.gather.grouped));
}

Status extents(const Problem& p, Extents* e) {
  // Computed in 128 bits: strides are caller-supplied and may be absurd.
  using I = __int128;
  const I L1 = p.batch - 1;
  const I rows = weight_rows(p);
  // Gathered: the weights, bias and scales of E experts; x has m / rows_per_x rows.
  const bool g = p.gather.experts > 0;
  const I E1 = g ? I(p.gather.experts - 1) : L1;
  const I x_rows = g ? I(p.m / p.gather.rows_per_x) : I(p.m);
  // Quantized rows: ld and the row length in uint32 words.
  const I row_len = p.quantized ? quant_words_per_row(p.quant, p.k) : p.k;
  const I ew = p.weights.storage == WeightStorage::out_in ? (rows - 1) * p.weights.ld + row_len
                                                          : I(p.k - 1) * p.weights.ld + rows;
  const I vals[5] = {
      L1 * p.batch_stride_x + (x_rows - 1) * p.ldx + p.k,
      E1 * p.batch_stride_w + ew,
      E1 * p.batch_stride_bias + rows,
      L1 * p.batch_stride_y + I(p.m - 1) * p.ldy + p.u,
      p.has_preact ? L1 * p.batch_stride_preact + I(p.m - 1) * p.ldpre + 2 * I(p.u) : I(0),
  };
  const char* names[5] = {"x", "w", "bias", "y", "preact"};
  constexpr I kMax = I(1) << 56;  // bytes of any real address space, with room for the element size
  for (int i = 0; i < 5; ++i)
    if (vals[i] > kMax)
      return err(StatusCode::invalid_argument, "tensor '", names[i], "' would span ", static_cast<double>(vals[i]),
                 " elements, more than any device can address: check the sizes and strides");
  const I scales = p.quantized ? (E1 + 1) * quant_scale_rows(p.quant, int64_t(rows)) * quant_groups_per_row(p.quant, p.k) : 0;
  *e = {int64_t(vals[0]), int64_t(vals[1]), int64_t(vals[2]), int64_t(vals[3]), int64_t(vals[4]), int64_t(scales)};
  return Status::Ok();
}

}  // namespace detail

namespace {

bool valid_dtype(DType d) { return d == DType::bf16 || d == DType::fp16 || d == DType::fp32; }

Status check_ld(const char* name, int64_t ld, int64_t min) {
  if (ld != 0 && ld < min)
    return err(StatusCode::invalid_argument, name, " must be 0 (dense) or >= ", min, ", got ", ld);
  return Status::Ok();
}

// The gather's own rules (Gather in gatedmlp.hpp).
Status check_gather(const Problem& p) {
  const StatusCode inv = StatusCode::invalid_argument;
  const Gather& g = p.gather;
  if (g.experts < 0) return err(inv, "gather.experts must be >= 0 (0: no gather), got ", g.experts);
  if (p.has_row_scale) {
    if (p.op != Operation::down || g.experts == 0)
      return err(inv, "has_row_scale applies to a gathered down projection (op=down, gather.experts > 0: the "
                 "routing weight of each row), got op=", to_string(p.op), " gather.experts=", g.experts);
    if (!valid_dtype(p.row_scale_dtype)) return err(inv, "row_scale_dtype has invalid value ", int(p.row_scale_dtype));
  }
  if (g.experts == 0) return Status::Ok();
  if (g.index_type != IndexType::int32 && g.index_type != IndexType::int64)
    return err(inv, "gather.index_type has invalid value ", int(g.index_type));
  if (g.rows_per_x < 1) return err(inv, "gather.rows_per_x must be >= 1, got ", g.rows_per_x);
  if (g.rows_per_index < 1) return err(inv, "gather.rows_per_index must be >= 1, got ", g.rows_per_index);
  if (p.m % g.rows_per_x)
    return err(inv, "m=", p.m, " must be a multiple of gather.rows_per_x=", g.rows_per_x,
               " (each row of x feeds that many output rows)");
  if (p.m % g.rows_per_index)
    return err(inv, "m=", p.m, " must be a multiple of gather.rows_per_index=", g.rows_per_index,
               " (each index picks the expert of that many output rows)");
  if (p.batch > 1) return err(inv, "a gathered call takes batch = 1 (the experts take the batch's place), got batch=", p.batch);
  if (p.m > INT32_MAX) return err(StatusCode::not_supported, "a gathered call takes at most 2^31-1 rows, got m=", p.m);
  if (g.experts > kMaxGatherExperts)
    return err(StatusCode::not_supported, "gather.experts=", g.experts, " is more than the ", kMaxGatherExperts,
               " experts a gathered call takes");
  if (p.weights.storage != WeightStorage::out_in)
    return err(StatusCode::not_supported, "a gathered call reads K-contiguous expert weights (storage out_in); got ",
               to_string(p.weights.storage), ": convert them once with convert_weights");
  if (g.grouped) {
    // Rows sorted by expert, E offsets: the Hopper GEMM kernel's form of the
    // gather (prefill), which has no down projection, no quantized weights
    // and no pre-activation yet.
    const StatusCode ns = StatusCode::not_supported;
    if (g.rows_per_x != 1 || g.rows_per_index != 1)
      return err(inv, "a grouped call (gather.grouped) takes rows_per_x = rows_per_index = 1 (x holds the sorted "
                 "rows themselves), got rows_per_x=", g.rows_per_x, " rows_per_index=", g.rows_per_index);
    if (p.op != Operation::gate_up)
      return err(ns, "a grouped call (gather.grouped) is gate_up only; a grouped down projection is not built "
                 "(gathered down projections run with per-row ids)");
    if (p.quantized) return err(ns, "a grouped call (gather.grouped) takes 16-bit weights, not quantized ones");
    if (p.has_preact) return err(ns, "a grouped call (gather.grouped) writes no pre-activation");
  }
  return Status::Ok();
}

// FP8 activations (input_dtype = fp8_e4m3): the Hopper kernel's e4m3 form,
// with FP8 weights scaled per tensor, per output channel or per 128 x 128
// block (gatedmlp.hpp).
Status check_fp8_input(const Problem& p) {
  if (p.input_dtype != DType::fp8_e4m3) return Status::Ok();
  const StatusCode inv = StatusCode::invalid_argument, ns = StatusCode::not_supported;
  if (p.x_scale != XScale::tensor && p.x_scale != XScale::row && p.x_scale != XScale::block)
    return err(inv, "x_scale has invalid value ", int(p.x_scale));
  if (p.op != Operation::gate_up)
    return err(ns, "input_dtype=fp8_e4m3 (FP8 activations) is gate_up only; the down projection takes 16-bit input");
  if (!p.quantized || p.quant.mode != QuantMode::fp8_e4m3)
    return err(inv, "input_dtype=fp8_e4m3 (FP8 activations) needs FP8 weights: quantized=true with "
               "quant.mode=fp8_e4m3, got ", p.quantized ? "quant=" + to_string(p.quant) : std::string("quantized=false"));
  const bool per_tensor_or_channel = p.quant.group_size == 0 && (p.quant.row_block == 0 || p.quant.row_block == 1);
  const bool blocked = p.quant.group_size == 128 && p.quant.row_block == 128;
  if (!per_tensor_or_channel && !blocked)
    return err(ns, "FP8 activations take weight scales per tensor (quant.group_size=0, row_block=0), per output "
               "channel (0, 1) or per 128 x 128 block (128, 128); got group_size=", p.quant.group_size,
               " row_block=", p.quant.row_block);
  if (blocked && p.weights.format == WeightFormat::fused) {
    // The kernel reads one block scale per k-block for each half of a tile
    // (128 gate rows, 128 up rows): those rows must lie in one 128-row block.
    const int64_t g = p.weights.group > 0 ? p.weights.group : p.u;
    if (g % 128)
      return err(ns, "FP8 weights with 128 x 128 block scales, fused: the interleave block (weights.group, or u "
                 "when stacked) must be a multiple of 128 so that each 128 gate rows and 128 up rows share a "
                 "scale block; got ", p.weights.group > 0 ? "group=" : "u=", g,
                 " (pass gate and up as separate weights, or a fused tensor with such a block)");
  }
  if (p.gather.experts > 0) return err(ns, "FP8 activations take no gather (gather.experts=", p.gather.experts, ")");
  return Status::Ok();
}

// FP8 Y (output_dtype = fp8_e4m3): written with its 1 x 128 group scales
// by the FP8 kernel's epilogue, so only in an FP8 call.
Status check_fp8_output(const Problem& p) {
  const StatusCode inv = StatusCode::invalid_argument;
  if (p.output_dtype != DType::fp8_e4m3) {
    if (p.has_y_amax)
      return err(inv, "has_y_amax applies to output_dtype=fp8_e4m3 (the amax of an FP8 Y), got output_dtype=",
                 to_string(p.output_dtype));
    return Status::Ok();
  }
  if (p.y_scale_layout != YScaleLayout::row_major && p.y_scale_layout != YScaleLayout::mn_major)
    return err(inv, "y_scale_layout has invalid value ", int(p.y_scale_layout));
  if (p.input_dtype != DType::fp8_e4m3)
    return err(StatusCode::not_supported, "output_dtype=fp8_e4m3 (FP8 Y with 1 x 128 scales) is written by the FP8 "
               "gate_up kernel only: input_dtype must be fp8_e4m3, got ", to_string(p.input_dtype),
               p.op == Operation::down ? " (op=down)" : "");
  return Status::Ok();
}

}  // namespace

Status check_support(const Problem& p) {
  const StatusCode inv = StatusCode::invalid_argument;
  // m = 0 or batch = 0 is empty work (an empty batch, an expert no token
  // chose): valid, and run() launches nothing.
  if (p.m < 0) return err(inv, "m must be >= 0, got ", p.m);
  if (p.k < 1) return err(inv, "k must be >= 1, got ", p.k);
  if (p.u < 1) return err(inv, "u must be >= 1, got ", p.u);
  if (p.batch < 0) return err(inv, "batch must be >= 0, got ", p.batch);

  if (!valid_dtype(p.input_dtype) && p.input_dtype != DType::fp8_e4m3)
    return err(inv, "input_dtype has invalid value ", int(p.input_dtype));
  if (p.input_dtype == DType::fp32)
    return err(StatusCode::not_supported, "input_dtype must be bf16 or fp16 (X and W), or fp8_e4m3 (X), got fp32");
  if (!valid_dtype(p.output_dtype) && p.output_dtype != DType::fp8_e4m3)
    return err(inv, "output_dtype has invalid value ", int(p.output_dtype));
  if (p.has_bias && !valid_dtype(p.bias_dtype)) return err(inv, "bias_dtype has invalid value ", int(p.bias_dtype));
  if (p.has_preact && !valid_dtype(p.preact_dtype))
    return err(inv, "preact_dtype has invalid value ", int(p.preact_dtype));

  const int act = static_cast<int>(p.activation);
  if (act < 0 || act > static_cast<int>(Activation::swiglu_clamped))
    return err(inv, "activation has invalid value ", act);
  if (p.activation == Activation::swiglu_clamped) {
    if (!std::isfinite(p.act_params.clamp_alpha))
      return err(inv, "act_params.clamp_alpha must be finite, got ", p.act_params.clamp_alpha);
    if (!(p.act_params.clamp_limit > 0.f) || !std::isfinite(p.act_params.clamp_limit))
      return err(inv, "act_params.clamp_limit must be finite and > 0, got ", p.act_params.clamp_limit);
  }
  if (!std::isfinite(p.alpha)) return err(inv, "alpha must be finite, got ", p.alpha);

  const WeightLayout& w = p.weights;
  if (w.format != WeightFormat::fused && w.format != WeightFormat::separate)
    return err(inv, "weights.format has invalid value ", int(w.format));
  if (w.storage != WeightStorage::out_in && w.storage != WeightStorage::in_out)
    return err(inv, "weights.storage has invalid value ", int(w.storage));
  if (w.first != Half::gate && w.first != Half::up) return err(inv, "weights.first has invalid value ", int(w.first));
  if (p.op != Operation::gate_up && p.op != Operation::down) return err(inv, "op has invalid value ", int(p.op));
  if (p.op == Operation::down) {
    // One [U, K] weight tensor: nothing to interleave, no gate/up halves.
    if (w.format != WeightFormat::fused || w.group != 0 || w.first != Half::gate)
      return err(inv, "op=down takes one weight tensor: weights.format, group and first must keep their defaults "
                 "(fused, 0, gate), got ", to_string(w));
    if (p.has_preact) return err(inv, "has_preact applies to op=gate_up; the down projection has no pre-activation");
  } else if (p.glu_input) {
    return err(inv, "glu_input applies to op=down (the GLU fused into the down projection's input); op=gate_up "
               "applies its activation to its own output");
  } else if (w.format == WeightFormat::fused) {
    if (w.group < 0 || w.group > p.u)
      return err(inv, "weights.group must be in [0, u=", p.u, "] (0 means u, stacked), got ", w.group);
    if (w.group > 0 && p.u % w.group != 0)
      return err(inv, "weights.group=", w.group, " must divide u=", p.u, " (u % group = ", p.u % w.group, ")");
  } else {
    if (w.group != 0) return err(inv, "weights.group applies to fused weights only; separate weights need 0, got ", w.group);
    if (w.first != Half::gate)
      return err(inv, "weights.first applies to fused weights only; separate weights need gate, got ", to_string(w.first));
  }

  const int64_t rows = detail::weight_rows(p);
  if (Status s = check_ld("ldx", p.ldx, p.k); !s) return s;
  if (p.quantized) {
    // Quantized along K, so the rows must be K-contiguous; their ld counts words.
    if (Status s = check_quant_format(p.quant, p.k); !s) return s;
    if (p.quant.mode != QuantMode::mxfp4 && !valid_dtype(p.scale_dtype))
      return err(inv, "scale_dtype has invalid value ", int(p.scale_dtype));
    if (w.storage != WeightStorage::out_in)
      return err(inv, "weights.storage must be out_in ([out, K], quantized along K) for quantized weights, got ",
                 to_string(w.storage));
    if (Status s = check_ld("weights.ld (quantized: uint32 words per row, >= k * bits / 32)", w.ld,
                            quant_words_per_row(p.quant, p.k));
        !s)
      return s;
    if (p.batch > 1)
      return err(StatusCode::not_supported, "quantized weights take batch = 1, got batch=", p.batch);
    if (p.quant.tiled) {
      // A gate/up tile is 8 columns' gate and up rows, a down projection's
      // 16 output columns' rows (quant.hpp), dense.
      const bool group8 = w.group == 8 || (w.group == 0 && p.u == 8);
      if (p.op == Operation::gate_up && (w.format != WeightFormat::fused || !group8 || w.first != Half::gate))
        return err(StatusCode::not_supported, "tiled quantized gate/up weights are in the fused order with ",
                   "group 8, gate first (quant.hpp); got weights=", to_string(w));
      if (p.op == Operation::down && p.u % 16)
        return err(StatusCode::not_supported, "u=", p.u, " with tiled down projection weights: the tiles are 16 ",
                   "rows, so u must be a multiple of 16 (quant.hpp)");
      if (w.ld != 0 && w.ld != quant_words_per_row(p.quant, p.k))
        return err(inv, "weights.ld=", w.ld, " with tiled weights: the tiles are dense, ld must be 0 or ",
                   quant_words_per_row(p.quant, p.k), " words");
    }
  } else if (Status s = check_ld(w.storage == WeightStorage::out_in
                                     ? "weights.ld (out_in storage: >= k)"
                                     : "weights.ld (in_out storage: >= number of weight rows)",
                                 w.ld, w.storage == WeightStorage::out_in ? p.k : rows);
             !s) {
    return s;
  }
  if (Status s = check_ld("ldy", p.ldy, p.u); !s) return s;
  if (p.has_preact) {
    if (Status s = check_ld("ldpre", p.ldpre, 2 * p.u); !s) return s;
  }

  if (Status s = check_gather(p); !s) return s;
  if (Status s = check_fp8_input(p); !s) return s;
  if (Status s = check_fp8_output(p); !s) return s;

  struct Stride { const char* name; int64_t v; };
  const Stride strides[] = {{"batch_stride_x", p.batch_stride_x},     {"batch_stride_w", p.batch_stride_w},
                            {"batch_stride_bias", p.batch_stride_bias}, {"batch_stride_y", p.batch_stride_y},
                            {"batch_stride_preact", p.batch_stride_preact}};
  for (const Stride& s : strides)
    if (s.v < 0 && s.v != kAuto) return err(inv, s.name, " must be kAuto (-1) or >= 0, got ", s.v);

  if (detail::empty(p)) return Status::Ok();  // no element is addressed: strides cannot overflow or overlap

  const Problem r = p.resolved();
  detail::Extents e;
  if (Status s = detail::extents(r, &e); !s) return s;
  if (r.batch > 1) {
    // Batches of an output must not overlap, or two CTAs would race on one element.
    const int64_t y_one = (r.m - 1) * r.ldy + r.u;
    if (r.batch_stride_y < y_one)
      return err(inv, "batch_stride_y=", r.batch_stride_y, " makes the batches of y overlap; need >= ", y_one,
                 " ((m-1)*ldy + u)");
    if (r.has_preact) {
      const int64_t p_one = (r.m - 1) * r.ldpre + 2 * r.u;
      if (r.batch_stride_preact < p_one)
        return err(inv, "batch_stride_preact=", r.batch_stride_preact, " makes the batches of preact overlap; need >= ",
                   p_one, " ((m-1)*ldpre + 2u)");
    }
  }
  return Status::Ok();
}


}  // namespace gatedmlp
