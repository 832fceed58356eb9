// The helpers the binding's tensor entry points share (calls.hpp).
#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>

#include "calls.hpp"
#include "stage_timers.hpp"

namespace gatedmlp::py {

void fp8_bytes_as_words(TensorView& t) {
  if (t.bits != 8 || t.lanes != 1 || !(t.is_fp8_e4m3() || t.is_byte()) || t.ndim < 1) return;
  bool ok = t.stride(-1) == 1 && t.size(-1) % 4 == 0 && reinterpret_cast<uintptr_t>(t.data) % 4 == 0;
  for (int i = 0; i + 1 < t.ndim; ++i) ok = ok && t.stride(i) % 4 == 0;
  if (!ok)
    raise_invalid("'" + t.name + "' holds FP8 weights as bytes, shape " + t.shape_str() + " and strides " +
                  t.strides_str() + ", which cannot be read as rows of 4-byte words: K must be a multiple of 4, " +
                  "rows contiguous and 4-byte aligned (w.contiguous())");
  t.shape[static_cast<size_t>(t.ndim - 1)] /= 4;
  for (int i = 0; i + 1 < t.ndim; ++i) t.strides[static_cast<size_t>(i)] /= 4;
  t.code = static_cast<uint8_t>(nb::dlpack::dtype_code::UInt);
  t.bits = 32;
}

void wait_for_producers(const std::vector<const TensorView*>& views, cudaStream_t stream) {
  for (const TensorView* t : views) {
    if (!t || t->producer_stream == 0) continue;
    cudaStream_t producer = t->producer_stream == 1   ? cudaStreamLegacy
                            : t->producer_stream == 2 ? cudaStreamPerThread
                                                      : reinterpret_cast<cudaStream_t>(t->producer_stream);
    if (producer == stream) continue;
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) {
      e = cudaEventRecord(ev, producer);
      if (e == cudaSuccess) e = cudaStreamWaitEvent(stream, ev, 0);
      cudaEventDestroy(ev);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      raise(StatusCode::cuda_error, "gatedmlp: ordering the stream after the producer stream of '" + t->name +
                                        "' failed: " + cudaGetErrorString(e));
    }
  }
}

namespace {

// No elements: its strides mean nothing (NumPy gives an empty array zeros).
bool is_empty(const TensorView& t) {
  for (int i = 0; i < t.ndim; ++i)
    if (t.size(i) == 0) return true;
  return false;
}

int64_t numel(const TensorView& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.size(i);
  return n;
}

// Dense in row-major order (axes of one element may have any stride).
bool is_contiguous(const TensorView& t) {
  if (is_empty(t)) return true;
  int64_t expected = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.size(i) != 1 && t.stride(i) != expected) return false;
    expected *= t.size(i);
  }
  return true;
}

}  // namespace

int64_t row_stride(const TensorView& t, const char* hint) {
  if (is_empty(t)) return 0;
  if (t.size(-1) > 1 && t.stride(-1) != 1) {
    std::string msg = "'" + t.name + "' must have a contiguous last dimension (stride 1); got shape " + t.shape_str() +
                      " with strides " + t.strides_str();
    if (t.size(-2) > 1 && t.stride(-2) == 1)
      msg += std::string(" (a transposed view? pass the tensor it views") + hint + ")";
    raise_invalid(msg);
  }
  if (t.size(-2) <= 1) return 0;
  if (t.stride(-2) == 0)
    raise_invalid("'" + t.name + "' has row stride 0 (a broadcast view), which the descriptor cannot express; " +
                  "got shape " + t.shape_str() + " with strides " + t.strides_str());
  return t.stride(-2);
}

int64_t batch_stride(const TensorView& t, int base, int64_t batch, bool shareable, const char* form) {
  if (t.ndim == base) {
    if (batch == 1) return kAuto;
    if (shareable) return 0;
    raise_invalid("'" + t.name + "' must be " + form + " with a leading batch axis of " + str(batch) +
                  " (x is batched), got shape " + t.shape_str());
  }
  if (t.ndim == base + 1) {
    if (t.size(0) != batch)
      raise_invalid("'" + t.name + "' has a batch axis of " + str(t.size(0)) + " but x has batch " + str(batch) +
                    "; got shape " + t.shape_str());
    return batch > 1 && !is_empty(t) ? t.stride(0) : kAuto;
  }
  raise_invalid("'" + t.name + "' must be " + form + (shareable ? " or batched" : "") + ", got shape " + t.shape_str());
}

void require_same_dtype(const TensorView& t, const TensorView& ref) {
  if (t.code != ref.code || t.bits != ref.bits || t.lanes != ref.lanes)
    raise_invalid("'" + t.name + "' has dtype " + t.dtype_name() + " but '" + ref.name + "' has " + ref.dtype_name() +
                  "; the descriptor has one dtype for both");
}

// ---------------------------------------------------------------- descriptor parts
void describe_input(const TensorView& x, Problem* p, bool fp8) {
  if (fp8 && x.ndim != 2)
    raise(StatusCode::not_supported,
          "gatedmlp: FP8 activations take 'x' [M, K] (batch 1), got shape " + x.shape_str());
  if (x.ndim != 2 && x.ndim != 3) raise_invalid("'x' must be [M, K] or [batch, M, K], got shape " + x.shape_str());
  const bool batched = x.ndim == 3;
  p->batch = batched ? x.size(0) : 1;
  p->m = x.size(-2);
  p->k = x.size(-1);
  p->input_dtype = fp8 ? DType::fp8_e4m3 : dtype_of(x, "input");
  p->ldx = row_stride(x);
  p->batch_stride_x = batched ? batch_stride(x, 2, p->batch, false, "[M, K]") : kAuto;
}

bool fp8_input(const TensorView& x, bool x_fp8, const std::optional<TensorView>& x_scales) {
  if (x_fp8 && !x.is_fp8_e4m3() && !x.is_byte())
    raise_invalid("x_fp8=True reads 'x' as float8_e4m3fn bytes, so 'x' must be float8_e4m3fn, uint8 or int8 (the "
                  "bytes: x.view(torch.uint8)), got " + x.dtype_name());
  const bool fp8 = x_fp8 || x.is_fp8_e4m3();
  if (fp8 && !x_scales)
    raise_invalid("'x_scales' is required with FP8 activations ('x' " + x.dtype_name() +
                  (x_fp8 ? " with x_fp8=True" : "") +
                  "): float32, 1 value (per tensor), M values (one per row of x) or M * ceil(K / 128) (one per row and "
                  "128 columns of K, [M, ceil(K / 128)])");
  if (!fp8 && x_scales) {
    if (x.is_byte())
      raise_invalid("'x_scales' goes with FP8 activations; 'x' is " + x.dtype_name() +
                    ": pass x_fp8=True to read its bytes as float8_e4m3fn");
    raise_invalid("'x_scales' goes with FP8 activations ('x' float8_e4m3fn, or its bytes as uint8 with "
                  "x_fp8=True); 'x' has dtype " + x.dtype_name());
  }
  return fp8;
}

void describe_x_scales(const TensorView& s, Problem* p) {
  if (s.code != static_cast<uint8_t>(nb::dlpack::dtype_code::Float) || s.bits != 32 || s.lanes != 1)
    raise_invalid("'x_scales' (the scales of FP8 x) must be float32, got " + s.dtype_name());
  const int64_t n = numel(s);
  const int64_t groups = (p->k + 127) / 128;  // ceil(K / 128): the 1 x 128 blocks of a row
  // One value is per tensor and M values per row, whatever else they could
  // mean (M = 1; K <= 128, where a row is one block): the same scaling.
  if (n == 1) p->x_scale = XScale::tensor;
  else if (n == p->m) p->x_scale = XScale::row;
  else if (n == p->m * groups) {
    // [M, ceil(K / 128)] row-major (or its M * ceil(K / 128) values flat):
    // another 2-D shape of that size is most likely the transpose.
    if (s.ndim >= 2 && (s.ndim != 2 || s.size(0) != p->m || s.size(1) != groups))
      raise_invalid("'x_scales' holds M * ceil(K / 128) = " + str(n) + " values (per row and 128 columns of K), " +
                    "so must be [M, ceil(K / 128)] = (" + str(p->m) + ", " + str(groups) + ") or (" + str(n) +
                    ",), got shape " + s.shape_str());
    p->x_scale = XScale::block;
  } else {
    raise_invalid("'x_scales' must hold 1 value (per tensor), M = " + str(p->m) +
                  " (one per row of x: [M] or [M, 1]) or M * ceil(K / 128) = " + str(p->m * groups) +
                  " (one per row and 128 columns of K: [M, ceil(K / 128)] = (" + str(p->m) + ", " + str(groups) +
                  "), row-major), got shape " + s.shape_str());
  }
  if (!is_contiguous(s))
    raise_invalid("'x_scales' must be contiguous, got shape " + s.shape_str() + " with strides " + s.strides_str() +
                  (p->x_scale == XScale::block ? " (block scales are read row-major, [M, ceil(K / 128)])" : ""));
}

void describe_output(const TensorView& y, bool batched, Problem* p, bool fp8) {
  if (y.ndim != (batched ? 3 : 2) || y.size(-2) != p->m || y.size(-1) != p->u)
    raise_invalid("'out' must be " + std::string(batched ? "[batch, M, U] = (" + str(p->batch) + ", " : "[M, U] = (") +
                  str(p->m) + ", " + str(p->u) + "), got shape " + y.shape_str());
  if (fp8 && !y.is_fp8_e4m3() && !y.is_byte())
    raise_invalid("'y_scales' is given, so 'out' holds an FP8 Y and must be float8_e4m3fn (or its bytes as uint8 / "
                  "int8), got " + y.dtype_name());
  if (!fp8 && y.is_fp8_e4m3())
    raise_invalid("'out' is float8_e4m3fn: an FP8 Y needs 'y_scales' for its scales (float32 [M, ceil(U / 128)])");
  p->output_dtype = fp8 ? DType::fp8_e4m3 : dtype_of(y, "output");
  p->ldy = row_stride(y);
  p->batch_stride_y = batched ? batch_stride(y, 2, p->batch, false, "[M, U]") : kAuto;
}

void describe_y_scales(const TensorView& s, const std::optional<TensorView>& amax, Problem* p) {
  if (s.code != static_cast<uint8_t>(nb::dlpack::dtype_code::Float) || s.bits != 32 || s.lanes != 1)
    raise_invalid("'y_scales' (the scales of an FP8 Y) must be float32, got " + s.dtype_name());
  const int64_t groups = (p->u + 127) / 128, ld = (p->m + 3) / 4 * 4;
  if (s.ndim != 2 || s.size(0) != p->m || s.size(1) != groups)
    raise_invalid("'y_scales' must be [M, ceil(U / 128)] = (" + str(p->m) + ", " + str(groups) + "), got shape " +
                  s.shape_str());
  const bool mn = p->y_scale_layout == YScaleLayout::mn_major;
  // Strides of axes of one element, or of an empty tensor, mean nothing.
  const bool rows_ok = p->m <= 1 || s.stride(0) == (mn ? 1 : groups);
  const bool groups_ok = p->m == 0 || groups == 1 || s.stride(1) == (mn ? ld : 1);
  if (!rows_ok || !groups_ok)
    raise_invalid("'y_scales' " + s.shape_str() + " must have strides " +
                  (mn ? "(1, " + str(ld) + ") (y_scale_layout=mn_major: each group's column of M scales contiguous, "
                        "M rounded up to a multiple of 4)"
                      : "(" + str(groups) + ", 1) (y_scale_layout=row_major)") +
                  ", got strides " + s.strides_str());
  if (amax) {
    if (amax->code != static_cast<uint8_t>(nb::dlpack::dtype_code::Float) || amax->bits != 32 || amax->lanes != 1 ||
        numel(*amax) != 1)
      raise_invalid("'y_amax' must be one float32, got " + amax->dtype_name() + " of shape " + amax->shape_str());
    p->has_y_amax = true;
  }
}

int64_t bias_batch_stride(const TensorView& b, int64_t n, const char* form, int64_t batch) {
  if ((b.ndim != 1 && b.ndim != 2) || b.size(-1) != n)
    raise_invalid("'" + b.name + "' must be " + form + " = (" + str(n) + ",) (or batched), got shape " +
                  b.shape_str());
  if (n > 1 && b.stride(-1) != 1)
    raise_invalid("'" + b.name + "' must be contiguous (stride 1), got strides " + b.strides_str());
  return batch_stride(b, 1, batch, true, form);
}

namespace {

// Packed words: uint32, or int32 holding the same bits (frameworks without
// an unsigned 32-bit type).
void require_words(const TensorView& t) {
  if ((t.code != 0 && t.code != 1) || t.bits != 32 || t.lanes != 1)  // DLPack kDLInt, kDLUInt
    raise_invalid("'" + t.name + "' holds quantized weights, so must be uint32 (or int32) packed words, got " +
                  t.dtype_name());
}

}  // namespace

void describe_quantized(const QuantFormat& f, int64_t rows, const std::vector<QuantTensors>& tensors, Problem* p,
                        int64_t experts) {
  p->quantized = true;
  p->quant = f;
  if (Status s = check_quant_format(f, p->k); !s.ok()) check(s);
  const bool mx = f.mode == QuantMode::mxfp4, fp8 = f.mode == QuantMode::fp8_e4m3;
  const int64_t words = quant_words_per_row(f, p->k), groups = quant_groups_per_row(f, p->k);
  const int64_t scale_rows = quant_scale_rows(f, rows);
  const bool ex = experts > 0;  // a leading expert axis on every array
  const std::string E = ex ? "E, " : "", e = ex ? str(experts) + ", " : "";
  for (const QuantTensors& o : tensors) {
    require_words(*o.words);
    const TensorView& wq = *o.words;
    if (ex ? wq.ndim != 3 || wq.size(0) != experts || wq.size(1) != rows || wq.size(2) != words
           : wq.ndim != 2 || wq.size(1) != words)
      raise_invalid("'" + wq.name + "' must be [" + E + "rows, " +
                    (f.repacked || f.tiled ? "ceil(K / 128) * 16" : "K * bits / 32") + "] = (" + e + str(rows) + ", " +
                    str(words) + ") uint32 words for K = " + str(p->k) + " and " + to_string(f) + ", got shape " +
                    wq.shape_str());
    if (!*o.scales) raise_invalid("'" + std::string(o.scales_name) + "' is required with quantized weights");
    const TensorView& sc = **o.scales;
    // A per-tensor FP8 scale is one number (per expert); checkpoints store
    // it as [] or [1] ([E] or [E, 1] for experts).
    const int lead = ex ? 1 : 0;
    bool one_number = scale_rows == 1 && groups == 1 && sc.ndim >= lead && sc.ndim <= 2 + lead &&
                      (!ex || sc.size(0) == experts);
    for (int i = lead; i < sc.ndim; ++i) one_number = one_number && sc.size(i) == 1;
    if (!one_number && (sc.ndim != 2 + lead || (ex && sc.size(0) != experts) || sc.size(lead) != scale_rows ||
                        sc.size(lead + 1) != groups))
      raise_invalid("'" + sc.name + "' must be [" + E + (fp8 ? "scale rows, scale columns" : f.tiled ? "rows, 2 * ceil(K / 128) * 128 / group_size" : "rows, K / group_size") +
                    "] = (" + e + str(scale_rows) + ", " + str(groups) + ") for " + to_string(f) + ", got shape " +
                    sc.shape_str());
    if (ex ? !is_contiguous(sc)
           : (groups > 1 && sc.stride(1) != 1) || (scale_rows > 1 && sc.stride(0) != groups))
      raise_invalid("'" + sc.name + "' must be contiguous" + (ex ? " (the experts' scales one after another)" : "") +
                    ", got strides " + sc.strides_str());
    if (mx) {
      if (sc.code != 1 || sc.bits != 8 || sc.lanes != 1)
        raise_invalid("'" + sc.name + "' must be uint8 (e8m0 scale bytes) for mxfp4, got " + sc.dtype_name());
      if (*o.biases) raise_invalid("'" + std::string(o.biases_name) + "' is given, but mxfp4 has no biases");
      continue;
    }
    p->scale_dtype = dtype_of(sc, "scale");
    if (f.tiled) {  // (scale, bias) pairs in the scales
      if (*o.biases)
        raise_invalid("'" + std::string(o.biases_name) + "' is given, but tiled weights keep their biases in '" +
                      sc.name + "' ((scale, bias) pairs, from gatedmlp.tile)");
      continue;
    }
    if (fp8) {
      if (*o.biases) raise_invalid("'" + std::string(o.biases_name) + "' is given, but fp8_e4m3 has no biases");
      continue;
    }
    if (!*o.biases) raise_invalid("'" + std::string(o.biases_name) + "' is required with affine quantized weights");
    const TensorView& b = **o.biases;
    bool same_shape = b.ndim == sc.ndim;
    for (int i = 0; same_shape && i < b.ndim; ++i) same_shape = b.size(i) == sc.size(i);
    if (ex ? !same_shape : b.ndim != 2 || b.size(0) != rows || b.size(1) != groups)
      raise_invalid("'" + b.name + "' must have the shape of '" + sc.name + "' " + sc.shape_str() + ", got " +
                    b.shape_str());
    if (ex ? !is_contiguous(b) : (groups > 1 && b.stride(1) != 1) || (rows > 1 && b.stride(0) != groups))
      raise_invalid("'" + b.name + "' must be contiguous" + (ex ? " (the experts' biases one after another)" : "") +
                    ", got strides " + b.strides_str());
    require_same_dtype(b, sc);
  }
}

// ---------------------------------------------------------------- gathered calls
GatherTensors import_gather(const GatherArgs& g) {
  GatherTensors t;
  t.indices = import_optional(g.indices, "indices", false);
  t.index_error = import_optional(g.index_error, "index_error", true);
  t.rows_per_x = g.rows_per_x;
  t.rows_per_index = g.rows_per_index;
  t.grouped = g.grouped;
  t.index_trap = g.index_trap;
  return t;
}

void require_no_gather(const GatherTensors& g) {
  if (g.on()) return;
  if (g.rows_per_x != 1)
    raise_invalid("'rows_per_x' = " + str(g.rows_per_x) + " goes with 'indices' (a gathered call); none was given");
  if (g.rows_per_index != 1)
    raise_invalid("'rows_per_index' = " + str(g.rows_per_index) +
                  " goes with 'indices' (a gathered call); none was given");
  if (g.index_error) raise_invalid("'index_error' goes with 'indices' (a gathered call); none was given");
  if (g.index_trap) raise_invalid("'index_trap' = True goes with 'indices' (a gathered call); none was given");
  if (g.grouped) raise_invalid("'grouped' = True goes with 'indices' (the experts' row offsets); none was given");
}

void describe_gathered_input(const TensorView& x, const GatherTensors& g, Problem* p) {
  if (g.rows_per_x < 1) raise_invalid("'rows_per_x' must be >= 1, got " + str(g.rows_per_x));
  if (g.rows_per_index < 1) raise_invalid("'rows_per_index' must be >= 1, got " + str(g.rows_per_index));
  if (x.ndim != 2)
    raise_invalid("'x' must be [m / rows_per_x, K] (2-D) in a gathered call (with 'indices'), got shape " +
                  x.shape_str());
  p->batch = 1;
  p->m = x.size(0) * g.rows_per_x;
  p->k = x.size(1);
  p->input_dtype = dtype_of(x, "input");
  p->ldx = row_stride(x);
}

namespace {

// The stride of a gathered call's expert axis: kAuto (packed) where it
// means nothing (one expert, or no element).
int64_t expert_stride(const TensorView& t, int64_t experts) {
  return experts > 1 && !is_empty(t) ? t.stride(0) : kAuto;
}

}  // namespace

ExpertWeights describe_expert_weights(const TensorView& w, const TensorView* w_up, const char* form, bool quantized,
                                      WeightStorage storage, Problem* p) {
  if (storage != WeightStorage::out_in)
    raise_invalid("a gathered call (with 'indices') reads the experts' weights as " + std::string(form) +
                  ", K contiguous (storage=out_in); got storage=" + to_string(storage) +
                  ": convert them once with convert_weights");
  if (w.ndim != 3)
    raise_invalid("'w' must be " + std::string(form) + " (the experts' weights one after another, with 'indices')" +
                  ", got shape " + w.shape_str());
  const int64_t experts = w.size(0), rows = w.size(1);
  if (experts == 0) raise_invalid("'w' holds no experts (E = 0), got shape " + w.shape_str());
  if (!quantized && w.size(2) != p->k)
    raise_invalid("'w' must be " + std::string(form) + " with K = " + str(p->k) + " (x.shape[-1]), got shape " +
                  w.shape_str());
  p->weights.storage = storage;
  p->weights.ld = row_stride(w);
  p->batch_stride_w = expert_stride(w, experts);
  if (w_up) {
    const TensorView& wu = *w_up;
    if (wu.ndim != 3 || wu.size(0) != experts || wu.size(1) != rows || wu.size(2) != w.size(2))
      raise_invalid("'" + wu.name + "' must have the shape of '" + w.name + "' " + w.shape_str() + ", got " +
                    wu.shape_str());
    if (row_stride(wu) != p->weights.ld)
      raise_invalid("'" + wu.name + "' must have the row stride of '" + w.name + "' (weights.ld = " +
                    str(p->weights.ld) + "), got strides " + wu.strides_str());
    if (expert_stride(wu, experts) != p->batch_stride_w)
      raise_invalid("'" + wu.name + "' must have the expert stride of '" + w.name + "', got strides " +
                    wu.strides_str() + " and " + w.strides_str());
  }
  return {experts, rows};
}

int64_t expert_bias_stride(const TensorView& b, int64_t n, const char* form, int64_t experts) {
  if (b.ndim != 2 || b.size(0) != experts || b.size(1) != n)
    raise_invalid("'" + b.name + "' must be " + form + " = (" + str(experts) + ", " + str(n) +
                  ") (one bias per expert, with 'indices'), got shape " + b.shape_str());
  if (n > 1 && b.stride(1) != 1)
    raise_invalid("'" + b.name + "' must have a contiguous last dimension (stride 1), got strides " +
                  b.strides_str());
  return expert_stride(b, experts);
}

void describe_gather(const GatherTensors& g, int64_t experts, Problem* p) {
  const TensorView& idx = *g.indices;
  if (idx.code != 0 || (idx.bits != 32 && idx.bits != 64) || idx.lanes != 1)  // DLPack kDLInt
    raise_invalid("'indices' must be int32 or int64 expert ids, got " + idx.dtype_name());
  if (!is_contiguous(idx))
    raise_invalid("'indices' must be contiguous, got shape " + idx.shape_str() + " with strides " +
                  idx.strides_str());
  if (g.grouped) {
    // Rows sorted by expert: indices are the E cumulative row ends.
    if (g.rows_per_x != 1 || g.rows_per_index != 1)
      raise_invalid("a grouped call ('grouped' = True) takes rows_per_x = rows_per_index = 1, got " +
                    str(g.rows_per_x) + " and " + str(g.rows_per_index));
    if (numel(idx) != experts)
      raise_invalid("'indices' of a grouped call must hold the E = " + str(experts) +
                    " experts' cumulative row ends (w.shape[0]), got shape " + idx.shape_str());
  } else if (p->m % g.rows_per_index != 0)
    raise_invalid("m = " + str(p->m) + " output rows (x's " + str(p->m / g.rows_per_x) + " rows x rows_per_x = " +
                  str(g.rows_per_x) + ") must be a multiple of rows_per_index = " + str(g.rows_per_index));
  if (!g.grouped && numel(idx) != p->m / g.rows_per_index)
    raise_invalid("'indices' must hold m / rows_per_index = " + str(p->m / g.rows_per_index) +
                  " expert ids (m = " + str(p->m) + ": x's " + str(p->m / g.rows_per_x) + " rows x rows_per_x = " +
                  str(g.rows_per_x) + ", rows_per_index = " + str(g.rows_per_index) + "), got shape " +
                  idx.shape_str());
  if (g.index_error) {
    const TensorView& e = *g.index_error;
    if (e.code != 0 || e.bits != 64 || e.lanes != 1)
      raise_invalid("'index_error' must be int64, got " + e.dtype_name());
    if (numel(e) != 2 || !is_contiguous(e))
      raise_invalid("'index_error' must be 2 contiguous int64, got shape " + e.shape_str() + " with strides " +
                    e.strides_str());
  }
  p->gather.experts = experts;
  p->gather.rows_per_x = g.rows_per_x;
  p->gather.rows_per_index = g.rows_per_index;
  p->gather.index_type = idx.bits == 64 ? IndexType::int64 : IndexType::int32;
  p->gather.grouped = g.grouped;
}

void set_gather_arguments(const GatherTensors& g, Arguments* a) {
  a->indices = g.indices ? g.indices->data : nullptr;
  a->index_error = g.index_error ? static_cast<int64_t*>(g.index_error->data) : nullptr;
  a->index_trap = g.index_trap;
}

void describe_row_scale(const TensorView& s, Problem* p) {
  if (p->gather.experts == 0)
    raise_invalid("'row_scale' (a per-row scale, the MoE routing weight) goes with a gathered down projection "
                  "(pass 'indices'); none was given");
  const std::optional<DType> dtype = s.dtype();
  if (!dtype) raise_invalid("'row_scale' must be float32, bfloat16 or float16, got " + s.dtype_name());
  if (numel(s) != p->m)
    raise_invalid("'row_scale' must hold m = " + str(p->m) + " values, one per output row, got shape " +
                  s.shape_str());
  if (!is_contiguous(s))
    raise_invalid("'row_scale' must be contiguous, got shape " + s.shape_str() + " with strides " +
                  s.strides_str());
  p->has_row_scale = true;
  p->row_scale_dtype = *dtype;
}

std::pair<int64_t, int64_t> read_index_error(nb::handle index_error, uintptr_t stream_handle) {
  const TensorView e = import_tensor(index_error, "index_error", false);
  if (e.code != 0 || e.bits != 64 || e.lanes != 1 || numel(e) != 2 || !is_contiguous(e))
    raise_invalid("'index_error' must be 2 contiguous int64, got " + e.dtype_name() + " of shape " + e.shape_str());
  int64_t v[2] = {-1, 0};
  if (e.device_type == kDeviceCPU) {  // nothing a kernel writes (the library refuses it): read as it is
    std::memcpy(v, e.data, sizeof v);
    return {v[0], v[1]};
  }
  const cudaStream_t stream = as_stream(stream_handle);
  DeviceGuard guard(e.device_type == kDeviceCUDA ? e.device_id : -1);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) cudaGetLastError();
  if (capture != cudaStreamCaptureStatusNone)
    raise_invalid("the index check reads its result back to the host, which a stream being captured into a CUDA "
                  "graph cannot do: pass check_indices=False (a bad index then leaves the output unwritten)");
  cudaError_t ce;
  {
    nb::gil_scoped_release release;
    ce = cudaMemcpyAsync(v, e.data, sizeof v, cudaMemcpyDefault, stream);
    if (ce == cudaSuccess) ce = cudaStreamSynchronize(stream);
  }
  if (ce != cudaSuccess) {
    cudaGetLastError();
    raise(StatusCode::cuda_error, std::string("gatedmlp: reading 'index_error' back failed: ") +
                                      cudaGetErrorString(ce));
  }
  return {v[0], v[1]};
}

// ---------------------------------------------------------------- workspace
namespace {

// The scratch a call uses (workspace_size(): the Hopper path's split tail,
// dequantized weights, the down projection's GLU input or cuBLASLt's
// workspace), allocated through the caller's framework (workspace_alloc)
// the first time a stream needs it and kept for that device and stream:
// calls on one stream run in order, so they can share it, and a call then
// costs no allocation. A call being captured into a CUDA graph gets scratch
// of its own instead, which the framework's graph pool keeps for the
// graph's lifetime: a graph may be replayed on another stream, alongside
// eager calls on this one.
struct HeldWorkspace {
  int device;
  uintptr_t stream;
  // The imported scratch: its view owns the framework's memory (a consumed
  // DLPack capsule gives the memory to the importer, so holding the capsule
  // would not keep it). Deleted only when a bigger one replaces it, and
  // never at exit, when the framework may be gone.
  TensorView* owner;
  size_t bytes;
};
std::vector<HeldWorkspace> g_workspaces;  // guarded by the GIL

size_t bytes_of(const TensorView& v) {
  size_t n = 1;
  for (int i = 0; i < v.ndim; ++i) n *= static_cast<size_t>(v.shape[static_cast<size_t>(i)]);
  return n * (v.bits / 8u);
}

// Scratch for a call: a held one, or a new one from `alloc`, which `fresh`
// owns until the call has been queued when it is not held (during capture).
std::pair<void*, size_t> workspace_for(const Problem& p, int device, cudaStream_t stream, nb::handle alloc,
                                       TensorView* fresh, bool hold, const TensorView** source) {
  const size_t n = workspace_size(p);
  if (n == 0) return {nullptr, 0};
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();
    capture = cudaStreamCaptureStatusActive;  // unknown: take fresh scratch, which is always safe
  }
  if (!hold) capture = cudaStreamCaptureStatusActive;  // fresh, as while capturing
  const uintptr_t s = reinterpret_cast<uintptr_t>(stream);
  if (capture == cudaStreamCaptureStatusNone)
    for (const HeldWorkspace& w : g_workspaces)
      if (w.device == device && w.stream == s && w.bytes >= n) {
        *source = w.owner;
        return {w.owner->data, w.bytes};
      }
  TensorView v = import_tensor(alloc(n), "workspace", true);
  const size_t bytes = bytes_of(v);
  if (capture != cudaStreamCaptureStatusNone) {
    *fresh = std::move(v);
    *source = fresh;
    return {fresh->data, bytes};
  }
  for (auto it = g_workspaces.begin(); it != g_workspaces.end(); ++it)
    if (it->device == device && it->stream == s) {
      // Too small: replaced. Its memory goes back to the framework, whose
      // allocator orders any reuse after the work already queued on it.
      delete it->owner;
      g_workspaces.erase(it);
      break;
    }
  g_workspaces.push_back({device, s, new TensorView(std::move(v)), bytes});
  *source = g_workspaces.back().owner;
  return {g_workspaces.back().owner->data, bytes};
}

// CUDA memory of `device`, as its producer described it (null: nothing to check).
bool on_device(const TensorView* t, int device) {
  return !t || (t->device_type == kDeviceCUDA && t->device_id == device);
}

}  // namespace

void launch(const Problem& p, const Arguments& a, const TensorView& x, uintptr_t stream_handle, nb::handle workspace,
            nb::handle workspace_alloc, const std::vector<const TensorView*>& views, bool hold_workspace) {
  GATEDMLP_LAP(kViews);
  const cudaStream_t stream = as_stream(stream_handle);
  const int device = x.device_type == kDeviceCUDA ? x.device_id : -1;
  // Before the workspace: workspace_size() reads the current device.
  DeviceGuard guard(device);
  GATEDMLP_LAP(kGuard);

  // Workspace: the caller's, or scratch held for this device and stream
  // (workspace_alloc allocates it); without either, the call runs without.
  void* ws = nullptr;
  size_t ws_bytes = 0;
  TensorView ws_view;  // owns the caller's workspace, or fresh scratch, until the call is queued
  const TensorView* ws_source = nullptr;
  if (!workspace.is_none()) {
    ws_view = import_tensor(workspace, "workspace", true);
    ws = ws_view.data;
    ws_bytes = bytes_of(ws_view);
    ws_source = &ws_view;
  } else if (!workspace_alloc.is_none() && p.m > 0 && p.batch > 0) {
    std::tie(ws, ws_bytes) = workspace_for(p, device, stream, workspace_alloc, &ws_view, hold_workspace, &ws_source);
  }

  GATEDMLP_LAP(kWorkspace);
  wait_for_producers(views, stream);
  GATEDMLP_LAP(kProducers);
  // Each tensor came with its device: when all are CUDA memory of this one,
  // run() need not ask the driver about each pointer again (h88). Anything
  // else (host memory, another device, a producer that did not say) keeps
  // the library's own check and its message.
  Arguments ka = a;
  ka.devices_checked = device >= 0 && on_device(ws_source, device) &&
                       std::all_of(views.begin(), views.end(),
                                   [&](const TensorView* t) { return on_device(t, device); });
  Status s;
  {
    nb::gil_scoped_release release;
    s = run(p, ka, ws, ws_bytes, stream);
  }
  GATEDMLP_LAP(kRun);
  check(s);
  GATEDMLP_LAP(kCheck);
}

}  // namespace gatedmlp::py
