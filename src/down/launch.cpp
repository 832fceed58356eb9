// Host side of the down projection: the workspace's passes, then the kernel
// the dispatcher picked (down.hpp).
#include <cstdint>

#include "core/internal.hpp"
#include "decode_glu/decode_glu.hpp"
#include "down/down.hpp"
#include "quant_decode/quant_decode.hpp"

namespace gatedmlp::down {

using detail::err;

namespace {

size_t round256(size_t b) { return (b + 255) / 256 * 256; }

bool dequantizes(const Problem& r, KernelPath path) { return r.quantized && path != KernelPath::quant_decode; }

bool output_via_fp32(const Problem& r, KernelPath path) {
  return path == KernelPath::cublas &&
         (r.has_bias || (r.output_dtype != DType::fp32 && r.output_dtype != r.input_dtype));
}

}  // namespace

WorkspaceLayout workspace_layout(const Problem& r, KernelPath path) {
  WorkspaceLayout l;
  const size_t ex = dtype_size(r.input_dtype);
  if (r.glu_input) l.glu = round256(size_t(r.batch) * size_t(detail::x_rows(r)) * size_t(r.k) * ex);
  if (dequantizes(r, path)) l.weights = round256(size_t(r.u) * size_t(r.k) * ex);
  if (path == KernelPath::cublas) {
    if (output_via_fp32(r, path)) l.out32 = round256(size_t(r.batch) * size_t(r.m) * size_t(r.u) * 4);
    l.cublas = kCublasBytes;
  }
  if (path == KernelPath::quant_decode) {
    l.split = quant_decode::down_split(r);
    if (l.split.splits > 1) l.partials = round256(size_t(l.split.splits) * size_t(r.m) * size_t(r.u) * 4);
  }
  return l;
}

Problem kernel_problem(const Problem& r, KernelPath path) {
  Problem k = r;
  if (r.glu_input) {
    k.glu_input = false;
    k.ldx = r.k;
    k.batch_stride_x = detail::x_rows(r) * r.k;
  }
  if (dequantizes(r, path)) {
    k.quantized = false;
    k.weights.ld = r.k;
    k.batch_stride_w = r.u * r.k;
  }
  if (output_via_fp32(r, path)) {
    k.output_dtype = DType::fp32;
    k.ldy = r.u;
    k.batch_stride_y = r.m * r.u;
  }
  return k;
}

Arguments kernel_args(const Problem& r, KernelPath path, const WorkspaceLayout& l, const Arguments& a,
                      void* workspace) {
  char* base = static_cast<char*>(workspace);
  Arguments k = a;
  if (r.glu_input) {
    k.x = base;
    k.x_up = nullptr;
  }
  if (dequantizes(r, path)) {
    k.w = base + l.glu;
    k.w_scales = k.w_biases = nullptr;
  }
  if (output_via_fp32(r, path)) k.y = base + l.glu + l.weights;
  return k;
}

Status run(const Problem& r, const Config& cfg, const Arguments& a, CublasLinear* linear, int sms, void* ws,
           size_t bytes, cudaStream_t stream) {
  const WorkspaceLayout l = workspace_layout(r, cfg.path);
  if (l.required() > 0 && (ws == nullptr || bytes < l.required()))
    return err(StatusCode::invalid_argument, "this down projection writes ",
               r.glu_input ? "the GLU of its input" : "", r.glu_input && dequantizes(r, cfg.path) ? " and " : "",
               dequantizes(r, cfg.path) ? "its dequantized weights" : "",
               l.out32 ? (l.glu || l.weights ? " and its fp32 result" : "its fp32 result") : "",
               " into the workspace, which needs at least ", l.required(),
               " bytes (workspace_size() gives the fastest size); got ", bytes);
  char* base = static_cast<char*>(ws);
  auto cuda = [&](cudaError_t ce, const char* what) {
    return ce == cudaSuccess ? Status::Ok()
                             : err(StatusCode::cuda_error, what, " failed (", to_string(cfg), "): ", cudaGetErrorString(ce));
  };
  if (r.glu_input) {
    Problem rx = r;  // a gathered call's GLU: of its rows of x
    rx.m = detail::x_rows(r);
    if (Status s = cuda(glu_input(rx, a.x, a.x_up, base, stream), "the GLU of the input"); !s) return s;
  }
  if (dequantizes(r, cfg.path)) {
    const quant_decode::DequantizeArgs d =
        quant_decode::dequantize_args(r, r.u, a.w, a.w_scales, a.w_biases, base + l.glu);
    if (Status s = cuda(quant_decode::dequantize_device(d, stream), "dequantizing the weights"); !s) return s;
  }
  const Problem kp = kernel_problem(r, cfg.path);
  const Arguments ka = kernel_args(r, cfg.path, l, a, ws);
  switch (cfg.path) {
    case KernelPath::decode: return cuda(decode::launch(kp, ka, sms, stream), "kernel launch");
    case KernelPath::quant_decode: {
      // The split of K where the workspace has room for its partial sums.
      const bool split = l.partials && bytes >= l.required() + l.partials;
      float* partials = split ? reinterpret_cast<float*>(base + l.required()) : nullptr;
      const int warps = cfg.threads / 32;  // the plan's down_warps(); 0: the kernel's own
      const cudaError_t ce = quant_decode::launch(kp, ka, stream, l.split, partials, 1, warps, cfg.ahead);
      if (Status s = cuda(ce, "kernel launch"); !s)
        return s;
      if (!split) return Status::Ok();
      return cuda(reduce_splits(r, partials, l.split.splits, a.bias, a.y, stream),
                  "the sum of the split's partials");
    }
    case KernelPath::cublas: {
      const size_t rest = bytes > l.required() ? bytes - l.required() : 0;
      if (Status s = linear->run(ka, rest ? base + l.required() : nullptr, rest, stream); !s) return s;
      if (output_via_fp32(r, cfg.path))
        return cuda(finish_output(r, static_cast<const float*>(ka.y), a.bias, a.y, stream), "the bias and rounding of Y");
      return Status::Ok();
    }
    default:
      return err(StatusCode::not_supported, "no down projection kernel for ", to_string(cfg));
  }
}

}  // namespace gatedmlp::down
