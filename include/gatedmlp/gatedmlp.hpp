// gatedmlp: fused gated-MLP (GLU family) kernels.
//
// Two operations, picked by Problem::op:
//
// gate_up (the default) computes the gate/up half of a gated MLP in one launch:
//
//     g = alpha * (X @ Wg^T) + bg ;  u = alpha * (X @ Wu^T) + bu ;  Y = act(g) * u
//
// with X [M, K], Y [M, U], and only Y written (plus, if asked, the
// pre-activation [M, 2U] for training). Accumulation and the activation are
// fp32; the result is rounded once, on the output.
//
// down computes the down projection, the MLP's second half:
//
//     Y = alpha * (H @ Wd^T) + bd,   H = X, or act(X) * X_up (glu_input)
//
// with H [M, K], Wd [U, K] (U output features), Y [M, U]. With glu_input the
// call takes the GLU's two halves, X (gate) and Arguments::x_up (up), [M, K]
// each (MLX's fused_swiglu_gather_qmv without the gather): the GLU runs as a
// pass into the workspace, once per call, and the kernel reads its result
// (src/down/down.hpp says why not in the kernel's loads).
//
// Usage:
//     gatedmlp::Problem p;  p.m = M; p.k = K; p.u = U;        // fill the descriptor
//     if (auto s = gatedmlp::check_support(p); !s.ok()) ...    // shape rules only
//     gatedmlp::Arguments a; a.x = X; a.w = W; a.y = Y;
//     auto s = gatedmlp::run(p, a, nullptr, 0, stream);        // validates, then launches
//
// Every error names the argument and gives the expected and actual values;
// when run() returns an error nothing has been written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

namespace gatedmlp {

// ---------------------------------------------------------------- status
enum class StatusCode : int {
  ok = 0,
  invalid_argument,  // the call is malformed (bad shape, pointer, stride...)
  not_supported,     // well-formed, but no kernel in this build takes it
  no_device,         // no usable CUDA device
  cuda_error,        // a CUDA runtime call failed
  library_error,     // a dependency (cuBLAS) failed
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }
  bool ok() const { return code_ == StatusCode::ok; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  explicit operator bool() const { return ok(); }

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

// ---------------------------------------------------------------- enums
// fp8_e4m3 (OCP e4m3fn, one byte) is X of an FP8 gate_up call
// (Problem::x_scale says how it is scaled) and, in such a call only, may be
// Y too, with its scales (Problem::y_scale_layout).
enum class DType : int { bf16 = 0, fp16 = 1, fp32 = 2, fp8_e4m3 = 3 };

// How the fp32 scales in Arguments::x_scales dequantize FP8 activations:
// x = e4m3 value * scale.
enum class XScale : int {
  tensor = 0,  // one scale for all of X: x_scales[0]
  row = 1,     // one per row of X (per token): x_scales[r], m of them
  // One per row of X and 128 columns of K (1 x 128 groups, DeepSeek-V3's
  // activation scales): x_scales[r * ceil(k / 128) + c / 128] for
  // column c, row-major.
  block = 2,
};

// Where an FP8 Y's fp32 scales lie (output_dtype = fp8_e4m3): one per row
// and 128 columns of U (1 x 128 groups, what an FP8 down projection with
// DeepSeek-V3-style activation scales reads), for column j of row r:
enum class YScaleLayout : int {
  // y_scales[r * ceil(u / 128) + j / 128], [m, ceil(u / 128)] row-major
  // (the per-token-group layout, as XScale::block takes them back).
  row_major = 0,
  // y_scales[(j / 128) * align4(m) + r], align4(m) = m rounded up to a
  // multiple of 4: [ceil(u / 128), align4(m)], each group's column of
  // scales contiguous and starting on 16 bytes (the MN-major, TMA-aligned
  // layout of DeepGEMM-style kernels). The align4(m) - m entries at the end
  // of each column are not written.
  mn_major = 1,
};

enum class Activation : int {
  silu = 0,       // SwiGLU:  silu(g) * u
  gelu_tanh = 1,  // GeGLU, tanh approximation
  gelu_erf = 2,   // GeGLU, exact erf
  relu = 3,       // ReGLU
  swiglu_clamped = 4,  // gpt-oss: g=min(g,limit); u=clamp(u,-limit,limit); g*sigmoid(a*g)*(u+1)
};

// Parameters of Activation::swiglu_clamped (gpt-oss uses a = 1.702, limit = 7).
struct ActivationParams {
  float clamp_alpha = 1.702f;
  float clamp_limit = 7.0f;
};

// How the gate and up weights are stored. Rows are output features.
enum class WeightFormat : int {
  // One [2U, K] tensor whose rows alternate in blocks of `group` rows:
  // block 2b is half `first`, block 2b+1 the other half. group = U is the
  // stacked layout (vLLM/HF gate_up_proj), group = 1 even/odd, group = 32 cuDNN.
  fused = 0,
  // Two [U, K] tensors, Arguments::w (gate) and Arguments::w_up.
  separate = 1,
};

enum class Half : int { gate = 0, up = 1 };

enum class WeightStorage : int {
  out_in = 0,  // [out, K], K contiguous (nn.Linear). Element (f, k) at f*ld + k.
  in_out = 1,  // [K, out], out contiguous.          Element (f, k) at k*ld + f.
};

struct WeightLayout {
  WeightFormat format = WeightFormat::fused;
  int64_t group = 0;              // interleave block G; 0 means U (stacked). Fused only.
  Half first = Half::gate;        // which half block 0 holds. Fused only.
  WeightStorage storage = WeightStorage::out_in;
  int64_t ld = 0;                 // leading dimension in elements; 0 = dense
};

// Quantized weights (gatedmlp/quant.hpp says what each format stores).
enum class QuantMode : int {
  affine = 0,    // MLX: w = q * scale + bias per group along K
  mxfp4 = 1,     // e2m1 values, an e8m0 scale per 32 along K
  fp8_e4m3 = 2,  // e4m3fn values times a float scale per block of rows x K
};

struct QuantFormat {
  QuantMode mode = QuantMode::affine;
  int bits = 4;         // affine: 4 or 8; mxfp4: 4; fp8_e4m3: 8
  int group_size = 64;  // elements along K per scale: affine 32, 64 or 128; mxfp4 32; fp8_e4m3 128 or 0 (all of K)
  int row_block = 1;    // weight rows per scale: 1, except fp8_e4m3: 1, 128 or 0 (all rows)
  // affine 4-bit only: the words are in the repacked order
  // (repack_quantized, quant.hpp), not the checkpoint's; the scales and
  // biases are the checkpoint's own. The decode kernel then applies them to
  // its fp32 sums (the weights enter exactly). Not yet faster: on an H200 it
  // takes 1.11-1.16x the checkpoint order's time at M = 1, 0.98-1.02x at
  // M = 16 (docs/notes/quantized-decode.md, h79).
  bool repacked = false;
  // affine 4-bit only: words, scales and biases in the tiled order
  // (tile_quantized, quant.hpp), for the decode kernel's loads: 1 KB tiles of
  // 16 rows x 128 of K, and (scale, bias) pairs in w_scales (w_biases null),
  // a lane's two rows' four values in one 8-byte word. Gate/up weights in
  // the fused order with group 8, gate first, or a down projection's rows
  // as they are (u a multiple of 16); also gathered (each expert's arrays
  // tiled); scales of X's dtype for the tiled kernels. 1.12-1.23x the
  // checkpoint order's speed at M = 1-16 on an H200 (gate/up; the whole MLP
  // 1.22-1.36x: docs/notes/quantized-decode.md h95, down-projection.md h96);
  // past 16 rows the weights are dequantized (no Hopper form).
  bool tiled = false;
};

// Mixture-of-experts gather (Problem::gather, experts > 0). The weights, bias
// and quantized scales/biases hold E experts' tensors one after another:
// expert e's weights at e * batch_stride_w, its bias at e * batch_stride_bias,
// its scales and biases dense ([E][scale rows, groups]). Output row r of the
// m rows is computed from
//     input row r / rows_per_x of x (and x_up), with the weights of
//     expert indices[r / rows_per_index]
// so that vLLM's routing (x [T, K], topk_ids [T, k], Y [T, k, U]) is m = T*k,
// rows_per_x = k, rows_per_index = 1, and MLX's gather_qmm (x [B, M, K],
// rhs_indices [B], Y [B, M, U]) is m = B*M, rows_per_x = 1, rows_per_index =
// M. Each distinct expert's weights are read once per call, however many rows
// chose it. An index outside [0, E) is never read through: the call writes no
// output, and Arguments::index_error (if set) says where it was.
enum class IndexType : int { int32 = 0, int64 = 1 };

// The most experts a gathered call takes (each CTA keeps a bitmap of the
// chosen ones in shared memory).
inline constexpr int64_t kMaxGatherExperts = 8192;

// Grouped (Gather::grouped, prefill): the m rows of x are already sorted by
// expert, and Arguments::indices holds E cumulative row ends instead of
// per-row ids, as torch._grouped_mm's `offs`: expert e owns rows
// [offsets[e-1], offsets[e]) (offsets[-1] read as 0), and offsets[E-1] must
// be m. Output row r is x row r through its expert's weights. gate_up only,
// 16-bit weights, no pre-activation, rows_per_x = rows_per_index = 1; it
// runs on the Hopper TMA + wgmma kernel (sm_90), which needs a workspace
// (workspace_size) for its table of tiles. Offsets that are not
// nondecreasing in [0, m] ending at m write nothing; index_error then holds
// the first bad expert e and offsets[e]. The caller sorts: from vLLM-style
// [T, k] top-k ids, Python's gatedmlp.moe_sort gives the order of the rows,
// the offsets and the inverse permutation (a stable sort on the device, no
// read back); this API takes the rows already sorted.
struct Gather {
  int64_t experts = 0;  // E; 0: no gather (the weights are one tensor)
  int64_t rows_per_x = 1;
  int64_t rows_per_index = 1;
  IndexType index_type = IndexType::int32;
  bool grouped = false;  // rows sorted by expert, indices = E cumulative row ends (above)
};

// Strides left at kAuto are packed (dense). Batch stride 0 on weights or bias
// shares them across the batch.
inline constexpr int64_t kAuto = -1;

// ---------------------------------------------------------------- problem
enum class Operation : int {
  gate_up = 0,  // Y [M, U] = act(X Wg^T + bg) * (X Wu^T + bu)
  down = 1,     // Y [M, U] = alpha * (H Wd^T) + bd, H = X or act(X) * X_up
};

struct Problem {
  Operation op = Operation::gate_up;
  int64_t m = 0, k = 0, u = 0;  // down: k input features (the MLP's intermediate), u output features
  int64_t batch = 1;

  DType input_dtype = DType::bf16;   // X and W: bf16 or fp16; or X FP8 (fp8_e4m3, below)
  DType output_dtype = DType::bf16;  // Y: bf16, fp16 or fp32; or FP8 (fp8_e4m3, below)

  Activation activation = Activation::silu;
  ActivationParams act_params;

  // down: one [U, K] (out_in) or [K, U] (in_out) tensor in w; format,
  // group and first keep their defaults (fused, 0, gate).
  WeightLayout weights;

  float alpha = 1.0f;  // scales both GEMM results, before the bias

  bool has_bias = false;             // gate and up bias; down: [U]
  DType bias_dtype = DType::fp32;

  bool has_preact = false;           // also write [g | u] (the [M, 2U] GEMM result + bias); gate_up only
  DType preact_dtype = DType::bf16;

  // down only: the input is act(X) * X_up, the gate and up halves in
  // Arguments::x and x_up, both [M, ldx] with batch_stride_x (activation
  // and act_params say which GLU).
  bool glu_input = false;

  int64_t ldx = 0;       // X row stride; 0 = K
  int64_t ldy = 0;       // Y row stride; 0 = U (write into a slice by setting it larger)
  int64_t ldpre = 0;     // pre-activation row stride; 0 = 2U

  int64_t batch_stride_x = kAuto;
  int64_t batch_stride_w = kAuto;     // per weight tensor
  int64_t batch_stride_bias = kAuto;  // per bias tensor
  int64_t batch_stride_y = kAuto;
  int64_t batch_stride_preact = kAuto;

  // Quantized weights. With `quantized` set, w (and w_up) hold packed uint32
  // words, one weight row per row of weights.ld words (0: dense, K * bits /
  // 32), stored out_in; Arguments::w_scales / w_biases (and the _up pair for
  // separate weights) hold the scales and biases, [scale rows, groups] dense
  // (quant_scale_rows, quant_groups_per_row: [rows, K / group_size] but for
  // FP8's blocks), in the row order of the words. X stays input_dtype. Rows
  // are grouped into gate and up exactly as 16-bit weights are
  // (weights.format, group, first). Batch 1 only.
  bool quantized = false;
  QuantFormat quant;
  DType scale_dtype = DType::bf16;  // affine and fp8_e4m3 scales (and affine biases); mxfp4's are e8m0 bytes

  // FP8 activations (input_dtype = fp8_e4m3; gate_up, sm_90a): X holds
  // e4m3fn bytes [M, ldx] and Arguments::x_scales its fp32 scales (x_scale
  // says which); the weights must be FP8 too: quantized with quant =
  // {fp8_e4m3, 8, group_size, row_block}, w_scales of scale_dtype, one of
  //   group_size 0, row_block 0: one scale per weight tensor;
  //   group_size 0, row_block 1: one per output channel (`weight_scale`
  //     [N, 1]);
  //   group_size 128, row_block 128: one per 128 x 128 block, [ceil(N /
  //     128), ceil(K / 128)] (DeepSeek-V3's `weight_scale_inv`, a
  //     multiplier despite its name). N is the rows of the tensor (2U
  //     fused, U each separate); each 128 gate rows and 128 up rows of a
  //     tile must share a block: separate weights, or fused ones whose
  //     interleave block (group, or U when stacked) is a multiple of 128.
  // Any X scaling goes with any weight scaling. The kernel multiplies the
  // e4m3 values on the tensor cores. With a block scale on either side it
  // sums each 128-deep k-block in an accumulator of its own and adds it into
  // fp32 sums times the block's scales (promotion, as DeepGEMM does);
  // otherwise the tensor cores sum all of K, whose FP8 accumulation keeps
  // fewer bits (mean error ~1.5-2x torch._scaled_mm's) unless fp8_promote
  // asks for promotion (_scaled_mm's error, at 1.25-1.4x the time; the
  // environment's GATEDMLP_FP8_PROMOTE=1 sets it for every call).
  // Per-tensor/row/channel scales multiply the total (or, promoting, each
  // k-block's sums: the same product); then
  // alpha, the bias and the activation:
  //   g = alpha * sum_kb sx(r, kb) * sw_g(n, kb) * (Xq Wgq^T)_kb + bg, u likewise.
  // A checkpoint whose gate and up carry different per-tensor scales keeps
  // them: separate weights (w_scales, w_up_scales), or per-channel scales
  // of the fused tensor. Batch 1, weights out_in, no gather; K a multiple
  // of 16 (TMA rows of 16 bytes).
  XScale x_scale = XScale::tensor;
  bool fp8_promote = false;  // FP8 without block scales: promote each k-block's sums to fp32 (see above)
  // FP8 Y (output_dtype = fp8_e4m3; FP8 calls only): Y quantized in 1 x
  // 128 groups along U as the epilogue finishes each tile. Each group of
  // row r, columns [128 c, 128 c + 128) (fewer at the end of U), gets
  //   amax = max(max |y_j|, 1e-10),  scale = amax * fp32(1 / 448),
  //   q_j = e4m3(y_j * (448 / amax))  (round to nearest even, saturated;
  //         448 / amax to 2 ulp),
  // y_j the fp32 value; q goes to Arguments::y (one byte per element, row
  // stride ldy) and the scale to Arguments::y_scales (fp32, laid out as
  // y_scale_layout says), so y_j ~ q_j * scale (scale * 448 / amax is 1
  // within 2^-21). A NaN in a group makes its scale NaN. With has_y_amax,
  // Arguments::y_amax receives max |y| over all of Y (fp32, before
  // quantization; zeroed by the call first, 0 for an empty Y). The
  // pre-activation, if asked, is written as for a 16-bit Y.
  YScaleLayout y_scale_layout = YScaleLayout::row_major;
  bool has_y_amax = false;

  // Mixture-of-experts gather (see Gather above): batch 1, weights stored
  // out_in; runs on the decode kernels (16-bit or quantized), whatever m.
  Gather gather;

  // A gathered down projection only: output row r is multiplied by
  // Arguments::row_scale[r] after alpha and the bias (the MoE routing
  // weight, applied where models apply it: to the expert's whole output).
  bool has_row_scale = false;
  DType row_scale_dtype = DType::fp32;

  // A copy with every 0/kAuto stride and group replaced by its value. Only
  // meaningful for a problem that passed check_support.
  Problem resolved() const;
};

// Layout of the pre-activation output: column f of a row is weight row f for
// fused weights (the GEMM result in weight order, cuDNN's AB12); for separate
// weights it is [gate (U) | up (U)].

// ---------------------------------------------------------------- arguments
struct Arguments {
  const void* x = nullptr;        // [L][M, ldx]
  const void* x_up = nullptr;     // down with glu_input only: the up half of the input, [L][M, ldx]
  const void* w = nullptr;        // fused [2U] weights, or the gate weights if separate
  const void* w_up = nullptr;     // separate only: up weights
  const void* bias = nullptr;     // fused: [2U] in weight-row order; separate: gate bias [U]
  const void* bias_up = nullptr;  // separate only: up bias [U]
  void* y = nullptr;              // [L][M, ldy]
  void* preact = nullptr;         // [L][M, ldpre], if has_preact
  // Quantized weights only (Problem::quantized): scales and biases of w,
  // and of w_up if separate. mxfp4 has no biases (null).
  const void* w_scales = nullptr;
  const void* w_biases = nullptr;
  const void* w_up_scales = nullptr;
  const void* w_up_biases = nullptr;
  // Gather only (Problem::gather.experts > 0): m / rows_per_index expert
  // indices (int32 or int64, Problem::gather.index_type), or for a grouped
  // call the E cumulative row ends; and optionally two int64 the call
  // writes: {-1, 0} when every index is in [0, E) (grouped: the offsets are
  // good), else the first position of one that is not and its value
  // (nothing else written).
  const void* indices = nullptr;
  int64_t* index_error = nullptr;
  // Gather only: true makes a bad index (a grouped call: a bad offset) also
  // a device-side assertion: the kernel stops with cudaErrorAssert, which
  // the stream reports at its next synchronisation and which ends the CUDA
  // context, as an out-of-range index in a PyTorch kernel does. A check
  // with no read back and no launch of its own; nothing is written either
  // way.
  bool index_trap = false;
  const void* row_scale = nullptr;  // has_row_scale: m values of row_scale_dtype
  // FP8 activations only (input_dtype = fp8_e4m3): fp32 scales of X, one
  // (XScale::tensor), m (XScale::row) or m * ceil(k / 128) (XScale::block).
  const void* x_scales = nullptr;
  // FP8 Y only (output_dtype = fp8_e4m3): its fp32 scales, ceil(u / 128)
  // per row (Problem::y_scale_layout says where), and with has_y_amax one
  // fp32 amax.
  float* y_scales = nullptr;
  float* y_amax = nullptr;
  // Set by a caller that already knows every pointer above, and the
  // workspace, to be device memory of the current device (a binding that
  // imported framework tensors with their devices, as gatedmlp's Python
  // package does). run() then skips its per-pointer query of the driver
  // (cudaPointerGetAttributes, ~0.2-0.25 us a pointer from Python on an
  // H200 host, h88); presence, alignment and overlap are checked either
  // way. A pointer that is not what the flag says is undefined behaviour,
  // as for any kernel argument: leave it false when in doubt.
  bool devices_checked = false;
};

// ---------------------------------------------------------------- config
enum class KernelPath : int {
  none = 0,
  sm80_mma = 1,    // portable: mma.sync tensor cores, sm_80 and newer
  sm90_wgmma = 2,  // Hopper fast path: TMA + wgmma, sm_90 (H100/H200) only
  decode = 3,      // few rows (M <= 16): weight streaming, mma.sync with the tokens as the narrow side; sm_80+
  quant_decode = 4,  // the decode kernel's design on quantized weights, dequantized in registers; sm_80+
  cublas = 5,        // down projection past the decode kernels' rows: a cuBLASLt GEMM
};

struct Config {
  KernelPath path = KernelPath::none;
  int tile_m = 0;      // rows of X per CTA
  int tile_n = 0;      // output columns of Y per CTA (the CTA computes 2x that many GEMM columns)
  int tile_k = 0;
  int stages = 0;      // shared-memory pipeline depth
  int threads = 0;
  // Quantized decode kernel on tiled words: k-blocks each warp has requested
  // ahead of the one it multiplies (a pipeline in registers); 0 elsewhere.
  int ahead = 0;
  bool vector_loads = false;  // 16-byte cp.async loads (K, strides and pointers aligned)
  // Hopper path: each consumer warpgroup runs whole tiles in turn
  // (ping-pong), one's epilogue under the other's main loop, instead of both
  // sharing each tile.
  bool pingpong = false;
  std::string reason;         // why this path and these loads were chosen
};

// ---------------------------------------------------------------- API
// Shape, dtype, stride and layout rules. Needs no device and no pointers.
Status check_support(const Problem& problem);

// Bytes of device workspace with which run() is fastest on the current
// device: on H100/H200, 128 KB per SM (16.5 MB on 132 SMs) for the split
// tail, where the last partial wave of tiles is shared out over every SM
// along K, and cuBLASLt's for the down projection's GEMM; 0 on other
// paths, other devices, and with no device. Those calls also work with less
// or none (nullptr, 0), without the split or with cuBLASLt's algorithms that
// need no workspace. The workspace may
// be reused by any later call on the same stream; its contents need no
// initialisation and are not preserved. Some calls need workspace and are
// refused without enough (the error names the bytes): quantized weights
// past the quantized decode kernel (dequantized into it), and the down
// projection's passes (the GLU of its input; dequantized weights; cuBLASLt's
// fp32 result where a pass adds the bias or rounds to the other 16-bit type),
// and grouped calls (their table of row units, 16 bytes per unit).
// workspace_size() covers them.
size_t workspace_size(const Problem& problem);

// The kernel and config run() would use on `device` (-1: the current device).
Status plan(const Problem& problem, Config* config, int device = -1);

// check_support, then the pointer checks (null, host memory, misalignment,
// output overlapping an input). run() calls it, checks the workspace
// (device memory, 16-byte aligned, overlapping no tensor), then launches on
// `stream`.
Status validate(const Problem& problem, const Arguments& args);
Status run(const Problem& problem, const Arguments& args, void* workspace, size_t workspace_bytes,
           cudaStream_t stream);

// ---------------------------------------------------------------- printing
const char* to_string(DType);
const char* to_string(Operation);
const char* to_string(Activation);
const char* to_string(WeightFormat);
const char* to_string(Half);
const char* to_string(WeightStorage);
const char* to_string(KernelPath);
const char* to_string(StatusCode);
const char* to_string(IndexType);
const char* to_string(XScale);
const char* to_string(YScaleLayout);
std::string to_string(const WeightLayout&);
std::string to_string(const Problem&);
std::string to_string(const Config&);

size_t dtype_size(DType);

}  // namespace gatedmlp
