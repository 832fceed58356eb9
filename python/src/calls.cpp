// The helpers the binding's tensor entry points share (calls.hpp).
#include <tuple>
#include <utility>

#include "calls.hpp"

namespace gatedmlp::py {

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
void describe_input(const TensorView& x, Problem* p) {
  if (x.ndim != 2 && x.ndim != 3) raise_invalid("'x' must be [M, K] or [batch, M, K], got shape " + x.shape_str());
  const bool batched = x.ndim == 3;
  p->batch = batched ? x.size(0) : 1;
  p->m = x.size(-2);
  p->k = x.size(-1);
  p->input_dtype = dtype_of(x, "input");
  p->ldx = row_stride(x);
  p->batch_stride_x = batched ? batch_stride(x, 2, p->batch, false, "[M, K]") : kAuto;
}

void describe_output(const TensorView& y, bool batched, Problem* p) {
  if (y.ndim != (batched ? 3 : 2) || y.size(-2) != p->m || y.size(-1) != p->u)
    raise_invalid("'out' must be " + std::string(batched ? "[batch, M, U] = (" + str(p->batch) + ", " : "[M, U] = (") +
                  str(p->m) + ", " + str(p->u) + "), got shape " + y.shape_str());
  p->output_dtype = dtype_of(y, "output");
  p->ldy = row_stride(y);
  p->batch_stride_y = batched ? batch_stride(y, 2, p->batch, false, "[M, U]") : kAuto;
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

void describe_quantized(const QuantFormat& f, int64_t rows, const std::vector<QuantTensors>& tensors, Problem* p) {
  p->quantized = true;
  p->quant = f;
  if (Status s = check_quant_format(f, p->k); !s.ok()) check(s);
  const bool mx = f.mode == QuantMode::mxfp4, fp8 = f.mode == QuantMode::fp8_e4m3;
  const int64_t words = quant_words_per_row(f, p->k), groups = quant_groups_per_row(f, p->k);
  const int64_t scale_rows = quant_scale_rows(f, rows);
  for (const QuantTensors& o : tensors) {
    require_words(*o.words);
    if (o.words->ndim != 2 || o.words->size(1) != words)
      raise_invalid("'" + o.words->name + "' must be [rows, K * bits / 32] = (" + str(rows) + ", " + str(words) +
                    ") uint32 words for K = " + str(p->k) + " and " + to_string(f) + ", got shape " +
                    o.words->shape_str());
    if (!*o.scales) raise_invalid("'" + std::string(o.scales_name) + "' is required with quantized weights");
    const TensorView& sc = **o.scales;
    if (sc.ndim != 2 || sc.size(0) != scale_rows || sc.size(1) != groups)
      raise_invalid("'" + sc.name + "' must be [" + (fp8 ? "scale rows, scale columns" : "rows, K / group_size") +
                    "] = (" + str(scale_rows) + ", " + str(groups) + ") for " + to_string(f) + ", got shape " +
                    sc.shape_str());
    if ((groups > 1 && sc.stride(1) != 1) || (scale_rows > 1 && sc.stride(0) != groups))
      raise_invalid("'" + sc.name + "' must be contiguous, got strides " + sc.strides_str());
    if (mx) {
      if (sc.code != 1 || sc.bits != 8 || sc.lanes != 1)
        raise_invalid("'" + sc.name + "' must be uint8 (e8m0 scale bytes) for mxfp4, got " + sc.dtype_name());
      if (*o.biases) raise_invalid("'" + std::string(o.biases_name) + "' is given, but mxfp4 has no biases");
      continue;
    }
    p->scale_dtype = dtype_of(sc, "scale");
    if (fp8) {
      if (*o.biases) raise_invalid("'" + std::string(o.biases_name) + "' is given, but fp8_e4m3 has no biases");
      continue;
    }
    if (!*o.biases) raise_invalid("'" + std::string(o.biases_name) + "' is required with affine quantized weights");
    const TensorView& b = **o.biases;
    if (b.ndim != 2 || b.size(0) != rows || b.size(1) != groups)
      raise_invalid("'" + b.name + "' must have the shape of '" + sc.name + "' " + sc.shape_str() + ", got " +
                    b.shape_str());
    if ((groups > 1 && b.stride(1) != 1) || (rows > 1 && b.stride(0) != groups))
      raise_invalid("'" + b.name + "' must be contiguous, got strides " + b.strides_str());
    require_same_dtype(b, sc);
  }
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
                                       TensorView* fresh, bool hold) {
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
      if (w.device == device && w.stream == s && w.bytes >= n) return {w.owner->data, w.bytes};
  TensorView v = import_tensor(alloc(n), "workspace", true);
  const size_t bytes = bytes_of(v);
  if (capture != cudaStreamCaptureStatusNone) {
    *fresh = std::move(v);
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
  return {g_workspaces.back().owner->data, bytes};
}

}  // namespace

void launch(const Problem& p, const Arguments& a, const TensorView& x, uintptr_t stream_handle, nb::handle workspace,
            nb::handle workspace_alloc, const std::vector<const TensorView*>& views, bool hold_workspace) {
  const cudaStream_t stream = as_stream(stream_handle);
  const int device = x.device_type == kDeviceCUDA ? x.device_id : -1;
  // Before the workspace: workspace_size() reads the current device.
  DeviceGuard guard(device);

  // Workspace: the caller's, or scratch held for this device and stream
  // (workspace_alloc allocates it); without either, the call runs without.
  void* ws = nullptr;
  size_t ws_bytes = 0;
  TensorView ws_view;  // owns the caller's workspace, or fresh scratch, until the call is queued
  if (!workspace.is_none()) {
    ws_view = import_tensor(workspace, "workspace", true);
    ws = ws_view.data;
    ws_bytes = bytes_of(ws_view);
  } else if (!workspace_alloc.is_none() && p.m > 0 && p.batch > 0) {
    std::tie(ws, ws_bytes) = workspace_for(p, device, stream, workspace_alloc, &ws_view, hold_workspace);
  }

  wait_for_producers(views, stream);
  Status s;
  {
    nb::gil_scoped_release release;
    s = run(p, a, ws, ws_bytes, stream);
  }
  check(s);
}

}  // namespace gatedmlp::py
