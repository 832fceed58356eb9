// The public entry points: plan() and run().
#include <unistd.h>  // environ

#include <cstdint>
#include <cstdio>
#include <memory>

#include "core/internal.hpp"
#include "decode_glu/decode_glu.hpp"
#include "decode_glu/hopper.hpp"
#include "quant_decode/hopper.hpp"
#include "down/down.hpp"
#include "quant_decode/quant_decode.hpp"
#include "sm80_gemm_glu/sm80_gemm_glu.hpp"
#include "sm90_gemm_glu/sm90_gemm_glu.hpp"

namespace gatedmlp {

using detail::err;

Status plan(const Problem& p, Config* config, int device) {
  if (config == nullptr) return err(StatusCode::invalid_argument, "argument 'config' is null");
  if (Status s = check_support(p); !s) return s;
  if (detail::empty(p)) {
    *config = Config{};
    config->reason = "empty problem (m = 0 or batch = 0): nothing to launch";
    return Status::Ok();
  }
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

// The pointers whose alignment is part of a plan's key.
constexpr int kKeyPointers = 12;
void key_pointers(const Arguments& a, const void* (&out)[kKeyPointers]) {
  const void* ptrs[kKeyPointers] = {a.x,        a.w,        a.w_up,      a.bias,        a.bias_up,     a.y,
                                    a.preact,   a.w_scales, a.w_biases,  a.w_up_scales, a.w_up_biases, a.x_up};
  for (int i = 0; i < kKeyPointers; ++i) out[i] = ptrs[i];
}

// A call planned once and reused: run() of the same problem, on the same
// device, with pointers of the same alignment, a workspace as large (or as
// absent) and the same environment (the knobs) skips check_support, the
// dispatcher and the Hopper kernel's set-up (tensor maps and all), and does
// only the pointer checks and the launch. The cache is per thread, so it
// needs no lock, and small: a model has few distinct gate/up calls.
struct Planned {
  bool valid = false;
  // The key.
  Problem p;
  int device = -1;
  uint8_t align[kKeyPointers] = {};
  uint64_t env = 0;
  bool ws_enough = false;  // the workspace held at least ws_threshold bytes
  size_t ws_threshold = 0;
  // The plan.
  Problem r;
  Config cfg;
  int sms = 0;
  sm90::Prepared sm90;
  decode::HopperPrepared decode_hopper;  // the decode kernel's Hopper form
  quant_decode::HopperPrepared quant_hopper;  // the quantized decode kernel's
  std::shared_ptr<down::CublasLinear> linear;  // down projection on the cublas path
};

constexpr int kPlanCacheSize = 8;

// log2 of the largest power of two dividing p, at most 8 (256 bytes, more
// than any kernel asks); 9 for null.
uint8_t align_class(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  if (v == 0) return 9;
  int c = 0;
  while (c < 8 && !(v & (uintptr_t{1} << c))) ++c;
  return static_cast<uint8_t>(c);
}

// The knobs are environment variables read when a call is planned. setenv,
// unsetenv and putenv replace entries of environ, so a hash of the entries'
// addresses changes with them (a few dozen loads, not a getenv per knob).
uint64_t env_fingerprint() {
  uint64_t h = 1469598103934665603ull;
  for (char** e = environ; e && *e; ++e) h = (h ^ reinterpret_cast<uintptr_t>(*e)) * 1099511628211ull;
  return h;
}

void fill_key(Planned* k, const Problem& p, int device, const Arguments& a, uint64_t env) {
  k->p = p;
  k->device = device;
  const void* ptrs[kKeyPointers];
  key_pointers(a, ptrs);
  for (int i = 0; i < kKeyPointers; ++i) k->align[i] = align_class(ptrs[i]);
  k->env = env;
}

bool matches(const Planned& e, const Problem& p, int device, const Arguments& a, uint64_t env, const void* ws,
             size_t ws_bytes) {
  if (!e.valid || e.device != device || e.env != env || !detail::same_problem(e.p, p)) return false;
  const void* ptrs[kKeyPointers];
  key_pointers(a, ptrs);
  for (int i = 0; i < kKeyPointers; ++i)
    if (e.align[i] != align_class(ptrs[i])) return false;
  return e.ws_enough == (ws != nullptr && ws_bytes >= e.ws_threshold);
}

struct PlanCache {
  Planned entries[kPlanCacheSize];
  int next = 0;
};
thread_local PlanCache t_plans;

// Plans a call that is not in the cache: the whole of validate(), the
// dispatcher, and for the Hopper path the tensor maps and kernel set-up.
Status plan_call(const Problem& p, const Arguments& a, void* ws, size_t ws_bytes, int device, uint64_t env,
                 Planned** out) {
  if (Status s = validate(p, a); !s) return s;
  const Problem r = p.resolved();
  if (Status s = detail::validate_workspace(r, a, ws, ws_bytes); !s) return s;
  detail::DeviceInfo dev;
  if (Status s = detail::device_info(device, &dev); !s) return s;
  Config cfg;
  if (Status s = detail::select_config(r, &a, dev, &cfg); !s) return s;
  Planned& e = t_plans.entries[t_plans.next];
  e.valid = false;
  e.linear.reset();
  if (cfg.path == KernelPath::sm90_wgmma && !detail::dequantized_first(r, cfg.path)) {  // else the 16-bit call plans its own
    if (Status s = sm90::prepare(r, a, cfg.tile_n, cfg.pingpong, dev.sms, ws, ws_bytes, &e.sm90); !s) return s;
  }
  if (decode::is_hopper_form(cfg))
    if (Status s = decode::hopper_prepare(r, a, &e.decode_hopper); !s) return s;
  if (quant_decode::is_hopper_form(cfg))
    if (Status s = quant_decode::hopper_prepare(r, a, cfg.tile_n / quant_decode::kHopperColumns, &e.quant_hopper); !s)
      return s;
  // The down projection's cuBLASLt plan: its workspace is what the passes
  // leave, all of kCublasBytes or none (the key's ws_enough tells which).
  const down::WorkspaceLayout dl = detail::is_down(r) ? down::workspace_layout(r, cfg.path) : down::WorkspaceLayout{};
  if (cfg.path == KernelPath::cublas) {
    const bool full = ws != nullptr && ws_bytes >= dl.total();
    const Arguments ka = down::kernel_args(r, cfg.path, dl, a, ws ? ws : reinterpret_cast<void*>(uintptr_t(256)));
    if (Status s = down::CublasLinear::create(down::kernel_problem(r, cfg.path), ka, full ? dl.cublas : 0, &e.linear);
        !s)
      return s;
    cfg.reason += "; " + e.linear->describe();
  }
  t_plans.next = (t_plans.next + 1) % kPlanCacheSize;
  fill_key(&e, p, device, a, env);
  e.ws_threshold = r.gather.grouped                                   ? sm90::grouped_workspace_bytes(r)
                   : cfg.path == KernelPath::sm90_wgmma && !cfg.pingpong ? sm90::workspace_bytes(dev.sms)
                   : cfg.path == KernelPath::cublas                    ? dl.total()
                                                                        : 0;
  e.ws_enough = ws != nullptr && ws_bytes >= e.ws_threshold;
  e.r = r;
  e.cfg = std::move(cfg);
  e.sms = dev.sms;
  e.valid = true;
  *out = &e;
  return Status::Ok();
}

// Quantized weights past the decode kernel's rows: dequantize them into the
// workspace, then run the 16-bit problem on them with the rest of it.
Status run_dequantized(const Problem& r, const Arguments& a, void* ws, size_t ws_bytes, cudaStream_t stream) {
  const size_t need = quant_decode::dequantized_bytes(r);
  if (ws == nullptr || ws_bytes < need)
    return err(StatusCode::invalid_argument, "this call's quantized weights (m=", r.m,
               ") are dequantized into the workspace, which needs at least ", need,
               " bytes (workspace_size() gives the fastest size); got ", ws_bytes);
  const bool sep = r.weights.format == WeightFormat::separate;
  const int64_t rows = sep ? r.u : 2 * r.u;
  char* base = static_cast<char*>(ws);
  for (int h = 0; h < (sep ? 2 : 1); ++h) {
    const quant_decode::DequantizeArgs d =
        quant_decode::dequantize_args(r, rows, h ? a.w_up : a.w, h ? a.w_up_scales : a.w_scales,
                                      h ? a.w_up_biases : a.w_biases, base + h * (need / 2));
    if (const cudaError_t ce = quant_decode::dequantize_device(d, stream); ce != cudaSuccess)
      return err(StatusCode::cuda_error, "dequantizing the weights into the workspace failed: ", cudaGetErrorString(ce));
  }
  Arguments ad = a;
  ad.w = base;
  ad.w_up = sep ? base + need / 2 : nullptr;
  ad.w_scales = ad.w_biases = ad.w_up_scales = ad.w_up_biases = nullptr;
  const size_t rest = ws_bytes - need;
  return run(quant_decode::dequantized_problem(r), ad, rest ? base + need : nullptr, rest, stream);
}

}  // namespace

// The Hopper path's split tail (and its tickets) is the only user of
// workspace: a flag and an fp32 partial tile per CTA and consumer
// warpgroup. Other paths, the ping-pong kernels (no split tail), and devices
// without one, need none. The answer is cached per thread like run()'s
// plans: bindings ask for it on every call.
size_t workspace_size(const Problem& p) {
  struct Sized {
    bool valid = false;
    Problem p;
    int device = -1;
    uint64_t env = 0;
    size_t bytes = 0;
  };
  thread_local Sized cache[kPlanCacheSize];
  thread_local int next = 0;
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const uint64_t env = env_fingerprint();
  for (const Sized& c : cache)
    if (c.valid && c.device == device && c.env == env && detail::same_problem(c.p, p)) return c.bytes;
  size_t bytes = 0;
  detail::DeviceInfo dev;
  Config cfg;
  const Problem r = p.resolved();
  if (check_support(p) && !detail::empty(p) && detail::device_info(device, &dev) &&
      detail::select_config(r, nullptr, dev, &cfg)) {
    if (detail::is_down(r))  // the passes' scratch and cuBLASLt's
      bytes = down::workspace_layout(r, cfg.path).total();
    else if (detail::dequantized_first(r, cfg.path))  // the weights, then the 16-bit call's
      bytes = quant_decode::dequantized_bytes(r) + workspace_size(quant_decode::dequantized_problem(r));
    else if (r.gather.grouped)  // the table of row units
      bytes = sm90::grouped_workspace_bytes(r);
    else if (cfg.path == KernelPath::sm90_wgmma && !cfg.pingpong && r.k > cfg.tile_k)  // one k-block: nothing to split
      bytes = sm90::workspace_bytes(dev.sms);
  }
  cache[next] = {true, p, device, env, bytes};
  next = (next + 1) % kPlanCacheSize;
  return bytes;
}

Status run(const Problem& p, const Arguments& a, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (detail::empty(p)) {  // nothing to launch
    if (Status s = check_support(p); !s) return s;
    // But an empty FP8 Y's amax is 0, and the caller may read it.
    if (p.output_dtype == DType::fp8_e4m3 && p.has_y_amax && a.y_amax)
      if (const cudaError_t ce = cudaMemsetAsync(a.y_amax, 0, sizeof(float), stream); ce != cudaSuccess) {
        cudaGetLastError();
        return err(StatusCode::invalid_argument, "argument 'y_amax' (empty problem: set to 0) could not be written: ",
                   cudaGetErrorString(ce));
      }
    return Status::Ok();
  }
  int device = -1;
  const uint64_t env = env_fingerprint();
  Planned* e = nullptr;
  if (cudaGetDevice(&device) == cudaSuccess) {
    for (Planned& c : t_plans.entries)
      if (matches(c, p, device, a, env, workspace, workspace_bytes)) {
        e = &c;
        break;
      }
  } else {
    cudaGetLastError();  // validate() reports it, after the problem's own errors
  }
  if (e) {
    // check_support passed for this very problem; the pointers are new.
    if (Status s = detail::validate_pointers(e->r, a); !s) return s;
    if (Status s = detail::validate_workspace(e->r, a, workspace, workspace_bytes); !s) return s;
  } else if (Status s = plan_call(p, a, workspace, workspace_bytes, device, env, &e); !s) {
    return s;
  }
  const Problem& r = e->r;
  const Config& cfg = e->cfg;
  if (detail::log_enabled())
    std::fprintf(stderr, "[gatedmlp] %s -> %s\n", to_string(p).c_str(), to_string(cfg).c_str());

  if (detail::is_down(r)) return down::run(r, cfg, a, e->linear.get(), e->sms, workspace, workspace_bytes, stream);
  if (detail::dequantized_first(r, cfg.path)) return run_dequantized(r, a, workspace, workspace_bytes, stream);
  if (cfg.path == KernelPath::sm90_wgmma) return sm90::launch_prepared(e->sm90, a, workspace, workspace_bytes, stream);
  if (decode::is_hopper_form(cfg)) return decode::hopper_launch(e->decode_hopper, a, stream);
  if (quant_decode::is_hopper_form(cfg)) return quant_decode::hopper_launch(e->quant_hopper, a, stream);
  if (cfg.path == KernelPath::decode || cfg.path == KernelPath::quant_decode) {
    const cudaError_t ce = cfg.path == KernelPath::decode
                               ? decode::launch(r, a, e->sms, stream)
                               : quant_decode::launch(r, a, stream, {}, nullptr, cfg.tile_n / 8, 0, cfg.ahead);
    if (ce != cudaSuccess)
      return err(StatusCode::cuda_error, "kernel launch failed (", to_string(cfg), "): ", cudaGetErrorString(ce));
    return Status::Ok();
  }
  const sm80::Params k = make_params(r, a);
  const cudaError_t ce = r.input_dtype == DType::bf16 ? sm80::launch_bf16(k, cfg, stream)
                                                      : sm80::launch_fp16(k, cfg, stream);
  if (ce != cudaSuccess)
    return err(StatusCode::cuda_error, "kernel launch failed (", to_string(cfg), "): ", cudaGetErrorString(ce));
  return Status::Ok();
}

}  // namespace gatedmlp
