// The helpers the binding's tensor entry points share (calls.hpp).
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

int64_t row_stride(const TensorView& t, const char* hint) {
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
    return batch > 1 ? t.stride(0) : kAuto;
  }
  raise_invalid("'" + t.name + "' must be " + form + (shareable ? " or batched" : "") + ", got shape " + t.shape_str());
}

void require_same_dtype(const TensorView& t, const TensorView& ref) {
  if (t.code != ref.code || t.bits != ref.bits || t.lanes != ref.lanes)
    raise_invalid("'" + t.name + "' has dtype " + t.dtype_name() + " but '" + ref.name + "' has " + ref.dtype_name() +
                  "; the descriptor has one dtype for both");
}

}  // namespace gatedmlp::py
