// The public entry points: plan() and run().
#include <cstdio>

#include "core/internal.hpp"
#include "sm80_gemm_glu/sm80_gemm_glu.hpp"
#include "sm90_gemm_glu/sm90_gemm_glu.hpp"

namespace gatedmlp {

using detail::err;

Status plan(const Problem& p, Config* config, int device) {
  if (config == nullptr) return err(StatusCode::invalid_argument, "argument 'config' is null");
  if (Status s = check_support(p); !s) return s;
  detail::DeviceInfo dev;
  if (Status s = detail::device_info(device, &dev); !s) return s;
  return detail::select_config(p.resolved(), nullptr, dev, config);
}

namespace {

int dtype_id(DType d) { return static_cast<int>(d); }

sm80::Params make_params(const Problem& r, const Arguments& a) {
  sm80::Params k{};
  k.x = a.x;
  k.w = a.w;
  k.w_up = a.w_up;
  k.bias = a.bias;
  k.bias_up = a.bias_up;
  k.y = a.y;
  k.pre = a.preact;
  k.m = r.m;
  k.k = r.k;
  k.u = r.u;
  k.batch = static_cast<int>(r.batch);
  k.ldx = r.ldx;
  k.ldw = r.weights.ld;
  k.ldy = r.ldy;
  k.ldpre = r.ldpre;
  k.sx = r.batch_stride_x;
  k.sw = r.batch_stride_w;
  k.sb = r.batch_stride_bias;
  k.sy = r.batch_stride_y;
  k.spre = r.batch_stride_preact;
  k.group = r.weights.format == WeightFormat::fused ? r.weights.group : r.u;
  k.first = static_cast<int>(r.weights.first);
  k.separate = r.weights.format == WeightFormat::separate;
  k.in_out = r.weights.storage == WeightStorage::in_out;
  k.act = static_cast<int>(r.activation);
  k.alpha = r.alpha;
  k.clamp_alpha = r.act_params.clamp_alpha;
  k.clamp_limit = r.act_params.clamp_limit;
  k.out_dtype = dtype_id(r.output_dtype);
  k.bias_dtype = dtype_id(r.bias_dtype);
  k.pre_dtype = dtype_id(r.preact_dtype);
  k.has_bias = r.has_bias;
  k.has_pre = r.has_preact;
  // Tiles start at multiples of 8 columns, so 8-element vectors are aligned
  // when every row (and batch) starts on a multiple of 8 elements.
  k.y_vec_stores = r.ldy % 8 == 0 && (r.batch == 1 || r.batch_stride_y % 8 == 0) &&
                   reinterpret_cast<uintptr_t>(a.y) % 16 == 0;
  return k;
}

}  // namespace

// The Hopper path's split tail is the only user of workspace: a flag and an
// fp32 partial tile per CTA and consumer warpgroup. Other paths, the
// ping-pong kernels (no split tail), and devices without one, need none.
size_t workspace_size(const Problem& p) {
  if (!check_support(p)) return 0;
  detail::DeviceInfo dev;
  if (!detail::device_info(-1, &dev)) return 0;
  Config cfg;
  const Problem r = p.resolved();
  if (!detail::select_config(r, nullptr, dev, &cfg) || cfg.path != KernelPath::sm90_wgmma || cfg.pingpong) return 0;
  if (r.k <= sm90::kTile.tile_k) return 0;  // one k-block: nothing to split
  return sm90::workspace_bytes(dev.sms);
}

Status run(const Problem& p, const Arguments& a, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (Status s = validate(p, a); !s) return s;
  if (Status s = detail::validate_workspace(p, a, workspace, workspace_bytes); !s) return s;
  const Problem r = p.resolved();
  detail::DeviceInfo dev;
  if (Status s = detail::device_info(-1, &dev); !s) return s;
  Config cfg;
  if (Status s = detail::select_config(r, &a, dev, &cfg); !s) return s;
  if (detail::log_enabled())
    std::fprintf(stderr, "[gatedmlp] %s -> %s\n", to_string(p).c_str(), to_string(cfg).c_str());

  if (cfg.path == KernelPath::sm90_wgmma)
    return sm90::launch(r, a, cfg.tile_n, cfg.pingpong, dev.sms, workspace, workspace_bytes, stream);

  const sm80::Params k = make_params(r, a);
  const cudaError_t e = r.input_dtype == DType::bf16 ? sm80::launch_bf16(k, cfg, stream)
                                                     : sm80::launch_fp16(k, cfg, stream);
  if (e != cudaSuccess)
    return err(StatusCode::cuda_error, "kernel launch failed (", to_string(cfg), "): ", cudaGetErrorString(e));
  return Status::Ok();
}

}  // namespace gatedmlp
