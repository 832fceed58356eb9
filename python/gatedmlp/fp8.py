"""FP8 activations on the gate/up kernel (Hopper, sm_90): e4m3 x times e4m3
weights on the tensor cores, each 128-deep k-block summed apart and added
into fp32 sums, the scales applied, in one launch with the GLU:

    g = alpha * sum_kb sx(r, kb) * sw_g(n, kb) * (xq @ wq_g^T)_kb + bg ;  u likewise ;  y = act(g) * u

(a per-tensor, per-token or per-channel scale is the same for every k-block
kb, and multiplies the whole sum).

``fp8_gate_up`` takes PyTorch tensors as FP8 checkpoints and
``torch._scaled_mm`` hold them: x float8_e4m3fn [M, K] with a per-tensor,
per-token (row-wise) or per-token-and-128-columns (1 x 128 blocks,
DeepSeek-V3's activation scales, [M, ceil(K / 128)]) fp32 scale; the
weights float8_e4m3fn [2U, K] (or gate and up [U, K] each) with a
per-tensor, per-output-channel or 128 x 128 block scale ([ceil(N / 128),
ceil(K / 128)], DeepSeek-V3's ``weight_scale_inv``). Any x scaling goes
with any weight scaling. ``quantize_fp8`` is the usual dynamic
quantization that gives such x (and weights): scale = amax / 448, per
tensor, per row, per 1 x 128 block of a row, or per 128 x 128 block.
"""

from __future__ import annotations

import collections as _collections
import sys as _sys

from . import _gatedmlp as _C

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
_AMAX_FLOOR = 1e-12  # amax is clamped to at least this: an all-zero tensor gets a tiny scale, not 0
BLOCK = 128  # the side of a block scale's block (1 x 128 for x, 128 x 128 for the weights)
_GRANULARITIES = ("tensor", "row", "block", "block128")
# The weight-scale granularities: one per tensor, per output channel (row),
# per 128 x 128 block; their QuantFormat's (group_size, row_block).
_W_TENSOR, _W_CHANNEL, _W_BLOCK = 0, 1, 2
_W_GROUP_ROW = {_W_TENSOR: (0, 0), _W_CHANNEL: (0, 1), _W_BLOCK: (BLOCK, BLOCK)}
_FORMATS = {}  # weight-scale granularity -> QuantFormat(fp8_e4m3, 8, group_size, row_block)


_LAYOUTS = {"row": _C.YScaleLayout.row_major, "mn": _C.YScaleLayout.mn_major}  # y_scale_layout's names
_PKG = {}  # names of the gatedmlp package, looked up once (it imports this module)


def _pkg(name):
    """gatedmlp.<name> (the package is initialised by the time a call runs)."""
    v = _PKG.get(name)
    if v is None:
        v = _PKG[name] = getattr(_sys.modules[__package__], name)
    return v


_TORCH = None  # torch, once a call has imported it


def _torch():
    global _TORCH
    torch = _sys.modules.get("torch")
    if torch is None:
        import torch
    _TORCH = torch
    return torch


def _invalid(message):
    return _C.InvalidArgumentError("gatedmlp: " + message)


def _not_supported(message):
    e = _C.NotSupportedError("gatedmlp: " + message)
    e.code = _C.StatusCode.not_supported
    return e


def _fmt(kind: int):
    f = _FORMATS.get(kind)
    if f is None:
        group_size, row_block = _W_GROUP_ROW[kind]
        f = _FORMATS[kind] = _C.QuantFormat(mode=_C.QuantMode.fp8_e4m3, bits=8, group_size=group_size,
                                            row_block=row_block)
    return f


def _blocks(n: int) -> int:
    """ceil(n / 128): the 128-wide blocks n columns (or rows) make, the last
    one partial."""
    return -(-n // BLOCK)


def _dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def _require_tensor(torch, t, name):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"gatedmlp: '{name}' must be a torch.Tensor, got {type(t).__module__}.{type(t).__qualname__}")


def _same_device(t, x, name):
    if t.device != x.device:
        raise _invalid(f"'{name}' is on {t.device} but 'x' is on {x.device}; every tensor of the call must be on "
                       "x's device")


def _x_scale_kind(t, m, k):
    """x_scale as the binding takes it: 1 value (any shape of one element:
    per tensor), m ([m] or [m, 1]: per token) or [m, ceil(k / 128)] (per
    token and 128 columns of K; with ceil(k / 128) = 1 that is [m, 1], per
    token, the same scaling); raises naming it otherwise. Returns 0
    (tensor), 1 (row) or 2 (block); the launch passes x_scale as it is
    (contiguous), which the binding reads by its element count."""
    shape = tuple(t.shape)
    kb = _blocks(k)
    if t.numel() == 1 and len(shape) <= 2:
        return 0
    if shape in ((m,), (m, 1)):
        return 1
    if shape == (m, kb):
        return 2
    raise _invalid(f"'x_scale' must hold 1 value (per tensor: [], [1] or [1, 1]), {m} (per token, one per row of x: "
                   f"[{m}] or [{m}, 1]) or [M, ceil(K / 128)] = [{m}, {kb}] (per token and 128 columns of K, 1 x 128 "
                   f"blocks), got shape {shape}")


def _w_scale_kind(t, rows, k, name):
    """A weight scale as the binding takes it, for a weight tensor of `rows`
    rows: 1 value (per tensor), [ceil(rows / 128), ceil(k / 128)] (128 x 128
    blocks; a 2-D tensor of that shape that is not [rows, 1]) or `rows`
    values ([rows] or [rows, 1]: per output channel), in that order of
    precedence; raises naming `name` otherwise. Returns _W_TENSOR,
    _W_CHANNEL or _W_BLOCK (_w_scale_as puts the tensor in the form the
    binding takes)."""
    shape = tuple(t.shape)
    blocks = (_blocks(rows), _blocks(k))
    if t.numel() == 1 and len(shape) <= 2:
        return _W_TENSOR
    if shape == blocks and shape != (rows, 1):
        return _W_BLOCK
    if shape in ((rows,), (rows, 1)):
        return _W_CHANNEL
    raise _invalid(f"'{name}' must hold 1 value (per tensor: [], [1] or [1, 1]), {rows} (per output channel, one per "
                   f"row of w: [{rows}] or [{rows}, 1]) or [ceil(N / 128), ceil(K / 128)] = [{blocks[0]}, "
                   f"{blocks[1]}] (128 x 128 blocks of w's {rows} rows and K = {k}), got shape {shape}")



def fp8_gate_up(x, x_scale, w, w_scale, *, w_up=None, w_up_scale=None, bias=None, bias_up=None, out=None,
                out_dtype=None, preact=None, activation="silu", act_params=None, group=None, first="gate",
                alpha: float = 1.0, promote: bool = False, y_scale=None, y_scale_layout=None,
                amax=None, stream=None, workspace=None, _hold_workspace=True):
    """gate_up on FP8 activations and FP8 weights (sm_90 only), for PyTorch
    tensors:

        g = alpha * sum_kb sx(r, kb) * sw_g(n, kb) * (x @ Wg^T)_kb + bg ;  u likewise with sw_u, bu ;
        out = act(g) * u

    kb the 128-deep k-blocks (the last one partial): the e4m3 products of a
    k-block summed on the tensor cores, each k-block's sum added into fp32
    sums, times its block scales where x or w has them (calls without block
    scales sum all of K on the tensor cores, whose FP8 accumulation keeps
    fewer bits: mean error 1.5-2x torch._scaled_mm's, unless promote=True,
    which gives _scaled_mm's at 1.2-1.5x the time); scales per tensor,
    token or channel multiply the whole sum (as torch._scaled_mm does);
    then alpha, the bias and the activation in fp32; rounded once, to out's
    dtype.

    x:          float8_e4m3fn [M, K], rows contiguous; K a multiple of 16.
    x_scale:    float32, x = x_e4m3 * x_scale, one of
                  1 value: per tensor ([], [1] or [1, 1]);
                  M values: per token ([M] or [M, 1], torch._scaled_mm's
                    row-wise scale_a and quantize_fp8(x, "row")'s);
                  [M, ceil(K / 128)]: per token and 128 columns of K (1 x
                    128 blocks, DeepSeek-V3's activation scales,
                    quantize_fp8(x, "block")'s), x[r, c] = x_e4m3[r, c] *
                    x_scale[r, c // 128]. With K <= 128 that is [M, 1]: per
                    token, the same thing.
    w:          float8_e4m3fn [2U, K], the fused gate and up rows (stacked,
                group None or 0: the gate rows then the up rows, as vLLM's
                gate_up_proj; or interleaved in blocks of `group` rows,
                `first` half first); or, with w_up, the gate weights [U, K].
                Rows contiguous (read as 4-byte words, no copy).
    w_scale:    float32, bfloat16 or float16, w = w_e4m3 * w_scale, N the
                rows of w (2U fused, U separate), one of
                  1 value: per tensor ([], [1] or [1, 1]);
                  [ceil(N / 128), ceil(K / 128)]: per 128 x 128 block of w in
                    its own row order (DeepSeek-V3's `weight_scale_inv`, a
                    multiplier despite its name; quantize_fp8(w,
                    "block128")'s), w[n, c] = w_e4m3[n, c] * w_scale[n //
                    128, c // 128];
                  N values: per output channel ([N] or [N, 1], in w's row
                    order: a checkpoint's `weight_scale` [N, 1]);
                in that order: one element is per tensor, and a 2-D scale of
                the block shape is blocks unless it is [N, 1]. Fused
                weights with block scales need the interleave block (group,
                or U when stacked) to be a multiple of 128, so that each
                128-row block is all gate or all up rows
                (gatedmlp.NotSupportedError otherwise: pass gate and up
                separately).
    w_up:       float8_e4m3fn [U, K], the up weights (separate weights), with
    w_up_scale: its scale, of w_scale's granularity and dtype (a
                checkpoint's per-tensor gate and up scales stay separate).
    bias:       [2U] in w's row order (fused) or the gate bias [U], with
                bias_up [U] (separate); bf16, fp16 or fp32. Optional.
    out:        [M, U], bf16, fp16 or fp32; allocated on x's device when None,
                of out_dtype (default torch.bfloat16). Or an FP8 Y:
                float8_e4m3fn (out_dtype=torch.float8_e4m3fn), quantized
                in 1 x 128 groups of each row as the tile is finished:
                scale = max(amax of the group, 1e-10) / 448, out = e4m3(y *
                448 / amax) (round to nearest even, saturated), so y ~ out *
                scale; what an FP8 down projection with per-token-group
                activation scales reads.
    y_scale:    the FP8 Y's float32 scales, [M, ceil(U / 128)] (allocated
                when None): y_scale[r, c] scales out[r, 128 c : 128 c +
                128]. y_scale_layout "row": row-major; "mn": each group's
                column of M scales contiguous, M rounded up to a multiple
                of 4, strides (1, align4(M)) (the MN-major, TMA-aligned
                layout of DeepGEMM-style kernels; the storage is
                [ceil(U / 128), align4(M)], the last align4(M) - M of each
                column unwritten). None (default): a given y_scale's own
                (its strides), else "row".
    amax:       with an FP8 Y: True (allocated) or a float32 tensor of one
                element, set to max |y| over all of Y (before quantization).
    preact:     optional [M, 2U] output of the scaled GEMM results plus bias,
                before the activation (columns in weight-row order; separate
                weights: [gate | up]).
    promote:    True: without block scales too, each 128-deep k-block
                summed apart and added into fp32 (Problem.fp8_promote);
                block-scaled calls always are.
    activation, act_params, first, alpha, stream, workspace: as for
                gatedmlp.gate_up. (gatedmlp.torch.fp8_gate_up is the same
                call as a PyTorch operator, for torch.compile and export.)

    Every argument is checked, naming it and its values (ValueError:
    gatedmlp.InvalidArgumentError), before anything is launched: in Python
    once per signature of the call (the tensors' shapes, dtypes and devices,
    a given y_scale's strides, the options), by the library on every call.
    Returns out; with an FP8 Y, (out, y_scale), or (out, y_scale, amax) when
    amax is asked for.
    """
    return _fp8_gate_up(x, x_scale, w, w_scale, w_up, w_up_scale, bias, bias_up, out, out_dtype, preact, activation,
                        act_params, group, first, alpha, promote, y_scale, y_scale_layout, amax, stream, workspace,
                        _hold_workspace)


def _fp8_gate_up(x, x_scale, w, w_scale, w_up, w_up_scale, bias, bias_up, out, out_dtype, preact, activation,
                 act_params, group, first, alpha, promote, y_scale, y_scale_layout, amax, stream, workspace,
                 _hold_workspace):
    # fp8_gate_up with every argument positional: gatedmlp.torch's direct
    # calls pass them so (keyword arguments cost host time on every call).
    torch = _TORCH or _torch()
    try:
        # The checks' inputs, flat (the common tensors written out: a call
        # per tensor costs as much as reading it).
        # No devices: the library checks every pointer's device on each call,
        # naming the argument; reading them here cost ~0.8 us a call.
        key = (x.shape, x.dtype, x_scale.shape, x_scale.dtype, w.shape, w.dtype, w_scale.shape, w_scale.dtype,
               None if out is None else _meta(torch, out),
               None if w_up is None else (_meta(torch, w_up), _meta(torch, w_up_scale)),
               None if bias is None else (_meta(torch, bias), _meta(torch, bias_up)),
               None if preact is None else _meta(torch, preact),
               None if y_scale is None else _meta(torch, y_scale, strides=True),
               amax if amax is None or type(amax) is bool else _meta(torch, amax),
               out_dtype, activation, group, first, y_scale_layout, w_up_scale is None, bias_up is None)
        plan = _PLANS.get(key)
    except (AttributeError, TypeError):  # not tensors, or an unhashable option: checked (and refused) every time
        plan, key = None, None
    if plan is None:
        plan = _check_call(torch, x, x_scale, w, w_scale, w_up, w_up_scale, bias, bias_up, out, out_dtype, preact,
                           activation, group, first, y_scale, y_scale_layout, amax)
        if key is not None:
            if len(_PLANS) >= _MAX_PLANS:
                _PLANS.clear()
            _PLANS[key] = plan
    return _launch(torch, plan, x, x_scale, w, w_scale, w_up, w_up_scale, bias, bias_up, out, preact, act_params,
                   alpha, promote, y_scale, amax, stream, workspace, _hold_workspace)


# A call's reading by _check_call, kept per signature (fp8_gate_up's key):
# what the launch needs and nothing that depends on the tensors' data.
_Plan = _collections.namedtuple("_Plan", "m u rows sep w_kind w_as_is w_up_as_is fp8_y layout groups ld "
                                         "alloc_dtype kw")
_PLANS = {}
_MAX_PLANS = 256  # a model has a few signatures; past this the cache starts over


def _meta(torch, t, strides=False):
    """What fp8_gate_up's checks read of a tensor argument: shape, dtype and
    device (and strides if asked); the type of anything else (None: None)."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        return type(t)
    return (t.shape, t.dtype, t.device, t.stride()) if strides else (t.shape, t.dtype, t.device)


def _check_call(torch, x, x_scale, w, w_scale, w_up, w_up_scale, bias, bias_up, out, out_dtype, preact, activation,
                group, first, y_scale, y_scale_layout, amax):
    """Every check of fp8_gate_up's arguments that does not read their data,
    each refusal naming the argument and its values; returns the _Plan."""
    Activation, Half, _enum = _pkg("Activation"), _pkg("Half"), _pkg("_enum")
    activation = activation if type(activation) is Activation else _enum(Activation, activation, "activation")
    first = first if type(first) is Half else _enum(Half, first, "first")
    f8 = torch.float8_e4m3fn
    sep = w_up is not None

    # x and its scale.
    _require_tensor(torch, x, "x")
    if x.dtype != f8:
        raise _invalid(f"'x' must be float8_e4m3fn (FP8 activations), got {_dtype_name(x.dtype)}")
    if x.dim() != 2:
        raise _invalid(f"'x' must be [M, K] (2-D), got shape {tuple(x.shape)}")
    m, k = x.shape
    if k % 16:
        raise _invalid(f"'x' must have K a multiple of 16 (rows of 16-byte TMA boxes), got K = {k}")
    _require_tensor(torch, x_scale, "x_scale")
    if x_scale.dtype != torch.float32:
        raise _invalid(f"'x_scale' must be float32, got {_dtype_name(x_scale.dtype)}")
    _x_scale_kind(x_scale, m, k)
    _same_device(x_scale, x, "x_scale")

    # The weights and their scales.
    _require_tensor(torch, w, "w")
    wform = "[U, K]" if sep else "[2U, K]"
    if w.dtype != f8:
        raise _invalid(f"'w' must be float8_e4m3fn (FP8 weights), got {_dtype_name(w.dtype)}")
    if w.dim() != 2 or w.shape[1] != k:
        raise _invalid(f"'w' must be {wform} with K = {k} (x.shape[1]), got shape {tuple(w.shape)}")
    rows = w.shape[0]
    if not sep and rows % 2:
        raise _invalid(f"'w' holds fused gate and up weights, [2U, K], so needs an even number of rows; got shape "
                       f"{tuple(w.shape)} (pass w_up for separate gate and up weights)")
    u = rows if sep else rows // 2
    _same_device(w, x, "w")
    if sep:
        _require_tensor(torch, w_up, "w_up")
        if w_up.dtype != f8:
            raise _invalid(f"'w_up' must be float8_e4m3fn (FP8 weights), got {_dtype_name(w_up.dtype)}")
        if tuple(w_up.shape) != tuple(w.shape):
            raise _invalid(f"'w_up' must have the shape of 'w' {tuple(w.shape)}, got {tuple(w_up.shape)}")
        _same_device(w_up, x, "w_up")
        if w_up_scale is None:
            raise _invalid("'w_up_scale' is required with separate weights (w_up)")
    else:
        if w_up_scale is not None:
            raise _invalid("'w_up_scale' goes with separate weights (w_up); fused 'w' takes one 'w_scale' for both "
                           "halves (1 value, one per row, or 128 x 128 blocks)")
        if bias_up is not None:
            raise _invalid("'bias_up' goes with separate weights (w_up); fused 'w' takes one 'bias' [2U]")
    scales = [("w_scale", w_scale)] + ([("w_up_scale", w_up_scale)] if sep else [])
    w_kinds = []
    for name, s in scales:
        _require_tensor(torch, s, name)
        if s.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise _invalid(f"'{name}' must be float32, bfloat16 or float16, got {_dtype_name(s.dtype)}")
        w_kinds.append(_w_scale_kind(s, rows, k, name))
        _same_device(s, x, name)
    if sep:
        if w_kinds[0] != w_kinds[1]:
            kinds = [{_W_TENSOR: "1 value", _W_CHANNEL: f"{rows} values",
                      _W_BLOCK: f"{tuple(s.shape)} block scales"}[g] for (_, s), g in zip(scales, w_kinds)]
            raise _invalid(f"'w_scale' and 'w_up_scale' must have one granularity, both 1 value, both one per row "
                           f"or both 128 x 128 blocks (the call has one weight-scale format), got {kinds[0]} and "
                           f"{kinds[1]}")
        if w_scale.dtype != w_up_scale.dtype:
            raise _invalid(f"'w_up_scale' must have the dtype of 'w_scale' ({_dtype_name(w_scale.dtype)}), got "
                           f"{_dtype_name(w_up_scale.dtype)}")

    if w_kinds[0] == _W_BLOCK and not sep:
        # Each 128 gate rows and 128 up rows a tile reads must lie in one
        # 128-row scale block (the C++ check_support refuses it too; here it
        # is refused before anything is allocated). A group the C++ check
        # refuses on its own (not dividing U) is left to its message.
        g = 0 if group is None else int(group)
        if 0 <= g <= u and (g == 0 or u % g == 0) and (g or u) % BLOCK:
            what = f"group = {g}" if g else f"U = {u} (stacked: the gate rows, then the up rows)"
            raise _not_supported(
                f"'w_scale' holds 128 x 128 block scales of fused 'w' {tuple(w.shape)}, whose gate and up rows "
                f"interleave in blocks of {what}: that block must be a multiple of 128 so that each 128-row scale "
                "block is all gate or all up rows; pass gate and up as separate weights (w, w_up with their own "
                "block scales) instead")

    # Bias, outputs.
    float_types = (torch.bfloat16, torch.float16, torch.float32)
    for name, b, n in (("bias", bias, u if sep else 2 * u), ("bias_up", bias_up, u)):
        if b is None:
            continue
        _require_tensor(torch, b, name)
        if tuple(b.shape) != (n,):
            raise _invalid(f"'{name}' must be [{'U' if sep else '2U'}] = ({n},), got shape {tuple(b.shape)}")
        if b.dtype not in float_types:
            raise _invalid(f"'{name}' must be bfloat16, float16 or float32, got {_dtype_name(b.dtype)}")
        _same_device(b, x, name)
    if sep and (bias is None) != (bias_up is None):
        raise _invalid("'bias' and 'bias_up' go together with separate weights: pass both or neither")
    out_types = float_types + (f8,)
    if out_dtype is not None and out_dtype not in out_types:
        raise _invalid(f"'out_dtype' must be torch.bfloat16, torch.float16, torch.float32 or torch.float8_e4m3fn, "
                       f"got {out_dtype}")
    if out is not None:
        _require_tensor(torch, out, "out")
        if tuple(out.shape) != (m, u):
            raise _invalid(f"'out' must be [M, U] = ({m}, {u}), got shape {tuple(out.shape)}")
        if out.dtype not in out_types:
            raise _invalid(f"'out' must be bfloat16, float16, float32 or float8_e4m3fn, got {_dtype_name(out.dtype)}")
        if out_dtype is not None and out.dtype != out_dtype:
            raise _invalid(f"'out' has dtype {_dtype_name(out.dtype)} but out_dtype is {_dtype_name(out_dtype)}")
        _same_device(out, x, "out")
    fp8_y = (out.dtype if out is not None else out_dtype) == f8
    if y_scale_layout is not None and y_scale_layout not in _LAYOUTS:
        raise _invalid(f"'y_scale_layout' must be 'row' or 'mn', got {y_scale_layout!r}")
    groups, ld = _blocks(u), -(-m // 4) * 4
    if not fp8_y:
        for name, v in (("y_scale", y_scale), ("amax", amax)):
            if v is not None and v is not False:
                raise _invalid(f"'{name}' goes with an FP8 Y (out_dtype=torch.float8_e4m3fn)")
    else:
        if y_scale is not None:
            _require_tensor(torch, y_scale, "y_scale")
            if y_scale.dtype != torch.float32 or tuple(y_scale.shape) != (m, groups):
                raise _invalid(f"'y_scale' must be float32 [M, ceil(U / 128)] = ({m}, {groups}), got "
                               f"{_dtype_name(y_scale.dtype)} of shape {tuple(y_scale.shape)}")
            _same_device(y_scale, x, "y_scale")
    if y_scale_layout is None:
        # A given y_scale's layout is its strides': MN-major when a group's
        # scales are the contiguous ones (the binding checks the rest).
        mn = fp8_y and y_scale is not None and m > 1 and groups > 1 and y_scale.stride(0) == 1
        y_scale_layout = "mn" if mn else "row"
    if fp8_y:
        if amax is not None and amax is not False and amax is not True:
            _require_tensor(torch, amax, "amax")
            if amax.dtype != torch.float32 or amax.numel() != 1:
                raise _invalid(f"'amax' must be True or one float32, got {_dtype_name(amax.dtype)} of shape "
                               f"{tuple(amax.shape)}")
            _same_device(amax, x, "amax")
    if preact is not None:
        _require_tensor(torch, preact, "preact")
        if tuple(preact.shape) != (m, 2 * u):
            raise _invalid(f"'preact' must be [M, 2U] = ({m}, {2 * u}), got shape {tuple(preact.shape)}")
        if preact.dtype not in float_types:
            raise _invalid(f"'preact' must be bfloat16, float16 or float32, got {_dtype_name(preact.dtype)}")
        _same_device(preact, x, "preact")
    alloc = out.dtype if out is not None else (out_dtype or torch.bfloat16)
    # A weight scale already in its granularity's shape goes as it is (it
    # is contiguous then or the binding says so, naming it).
    shape = {_W_TENSOR: None, _W_CHANNEL: (rows, 1), _W_BLOCK: (_blocks(rows), _blocks(k))}[w_kinds[0]]
    as_is = [shape is not None and tuple(t.shape) == shape for t in (w_scale, w_up_scale) if t is not None]
    # The binding's keywords that are the same on every call of this
    # signature, where they differ from its defaults.
    kw = {"quant": _fmt(w_kinds[0]), "x_fp8": True}
    if activation != Activation.silu:
        kw["activation"] = activation
    if group:
        kw["group"] = int(group)
    if first != Half.gate:
        kw["first"] = first
    if y_scale_layout != "row":
        kw["y_scale_layout"] = _LAYOUTS[y_scale_layout]
    return _Plan(m, u, rows, sep, w_kinds[0], as_is[0], sep and as_is[1], fp8_y, y_scale_layout, groups, ld, alloc,
                 kw)


def _launch(torch, plan, x, x_scale, w, w_scale, w_up, w_up_scale, bias, bias_up, out, preact, act_params, alpha,
            promote, y_scale, amax, stream, workspace, hold):
    """fp8_gate_up's call once _check_call has read its signature: the
    scales in the forms the binding takes, the outputs allocated, the
    launch. Kept short: every line is host time on every call."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (x, w, w_up, bias, bias_up, out, preact)):
        raise RuntimeError(_pkg("_NO_BACKWARD"))
    m, sep, fp8_y = plan.m, plan.sep, plan.fp8_y
    # x's scale as it is: the binding reads it by its element count (1, M or
    # M * ceil(K / 128), contiguous); the weights' in the shape the
    # granularity needs, where they are not already.
    xs = x_scale.contiguous()
    ws = w_scale if plan.w_as_is else _w_scale_as(w_scale, plan.w_kind, plan.rows)
    wus = (w_up_scale if plan.w_up_as_is else _w_scale_as(w_up_scale, plan.w_kind, plan.rows)) if sep else None
    stream_and_alloc, export, bytes_ = _HOT or _hot(torch)
    # The weights as their e4m3 bytes (the binding reads them as 4-byte
    # words itself; an int32 view here cost ~1 us a call).
    wq = w.view(torch.uint8) if bytes_ else w
    wq_up = (w_up.view(torch.uint8) if bytes_ else w_up) if sep else None
    # new_empty: x's device without building a torch.device per call.
    if out is None:
        out = x.new_empty(m, plan.u, dtype=plan.alloc_dtype)
    amax_t = None
    if fp8_y:
        if y_scale is None:
            y_scale = (x.new_empty(plan.groups, plan.ld, dtype=torch.float32).t()[:m]
                       if plan.layout == "mn" else x.new_empty(m, plan.groups, dtype=torch.float32))
        if amax is True:
            amax_t = x.new_empty((), dtype=torch.float32)
        elif amax is not None and amax is not False:
            amax_t = amax
    handle, alloc = stream_and_alloc(torch, x, stream, workspace)
    to = torch.utils.dlpack.to_dlpack
    # Only what differs from the binding's defaults: each keyword costs its
    # parsing (a call with all of them spent ~1 us more).
    kw = plan.kw.copy()
    if act_params is not None:
        kw["act_params"] = act_params
    if alpha != 1.0:
        kw["alpha"] = alpha
    if promote:
        kw["fp8_promote"] = True
    if workspace is not None:
        kw["workspace"] = export(workspace)
    if not hold:
        kw["hold_workspace"] = False
    if wus is not None:
        kw["scales_up"] = to(wus)
    if fp8_y:
        kw["y_scales"] = to(y_scale)
        if amax_t is not None:
            kw["y_amax"] = to(amax_t)
    _C.gate_up(to(x.view(torch.uint8) if bytes_ else x), to(wq),
               to(out.view(torch.uint8) if fp8_y and bytes_ else out),
               None if wq_up is None else to(wq_up), None if bias is None else to(bias),
               None if bias_up is None else to(bias_up), None if preact is None else to(preact),
               stream=handle, workspace_alloc=alloc, scales=to(ws), x_scales=to(xs), **kw)
    if not fp8_y:
        return out
    return (out, y_scale) if amax_t is None else (out, y_scale, amax_t)


_F8_DLPACK = None  # whether this torch's DLPack export takes float8 tensors (PyTorch 2.8 and later)
# What every launch looks up, looked up once: the package's stream and
# workspace helpers, and whether x (and an FP8 Y) go as their bytes (uint8,
# which x_fp8 and y_scales make the binding read as e4m3 all the same)
# because this torch's DLPack does not carry float8.
_HOT = None


def _hot(torch):
    global _HOT
    _HOT = (_pkg("_torch_stream_and_alloc"), _pkg("_export"),
            not (_F8_DLPACK if _F8_DLPACK is not None else _float8_dlpack(torch)))
    return _HOT


def fp8_bytes(torch, w):
    """FP8 weights as the binding takes them: the float8_e4m3fn tensor
    itself, or its uint8 view where this torch's DLPack has no float8."""
    return w if (_F8_DLPACK if _F8_DLPACK is not None else _float8_dlpack(torch)) else w.view(torch.uint8)


def _float8_dlpack(torch):
    global _F8_DLPACK
    try:
        torch.utils.dlpack.to_dlpack(torch.empty(1, dtype=torch.float8_e4m3fn))
        _F8_DLPACK = True
    except Exception:  # noqa: BLE001 - any refusal means: pass the bytes
        _F8_DLPACK = False
    return _F8_DLPACK


def _w_scale_as(s, kind, rows):
    """A weight scale in the form the binding takes for its granularity
    (_w_scale_kind's): [1], [rows, 1] or the blocks, contiguous."""
    if kind == _W_TENSOR:
        return s.reshape(1)
    if kind == _W_CHANNEL:
        return s.reshape(rows, 1).contiguous()
    return s.contiguous()


def quantize_fp8(t, granularity: str = "tensor"):
    """(q, scale): t (a floating PyTorch tensor, [..., K]) quantized to
    float8_e4m3fn the usual dynamic way, t ~= q.float() * scale (scale
    repeated over the elements it covers):

        scale = max(amax, 1e-12) / 448       (448: e4m3fn's largest value)
        q     = (t / scale).clamp(-448, 448).to(torch.float8_e4m3fn)

    with amax the largest |t| over what one scale covers, by granularity:

      "tensor":   the whole tensor; scale float32 [1].
      "row":      each row along the last axis (per token); scale float32
                  [..., 1] ([rows, 1] for a 2-D t: torch._scaled_mm's
                  row-wise scale_a).
      "block":    each 1 x 128 group of a row along the last axis (columns
                  128 j to 128 j + 127, the last group partial when K is not a
                  multiple of 128; DeepSeek-V3's activation scales); scale
                  float32 [..., ceil(K / 128)], t[..., c] ~= q[..., c] *
                  scale[..., c // 128]: fp8_gate_up's block x_scale.
      "block128": a 2-D t [N, K] only, each 128 x 128 block (rows 128 i..,
                  columns 128 j..; the last row and column blocks partial);
                  scale float32 [ceil(N / 128), ceil(K / 128)], t[n, c] ~=
                  q[n, c] * scale[n // 128, c // 128]: the block weight
                  format (DeepSeek-V3's weight / weight_scale_inv).

    Computed in float32 on t's device. NaN stays NaN (and makes its scale,
    so all of what that scale covers, NaN).
    """
    torch = _torch()
    _require_tensor(torch, t, "t")
    if granularity not in _GRANULARITIES:
        raise _invalid(f"granularity={granularity!r} is not one of " + ", ".join(repr(g) for g in _GRANULARITIES))
    if not t.dtype.is_floating_point or t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise _invalid(f"'t' must be float32, bfloat16 or float16 (or another float to quantize), got "
                       f"{_dtype_name(t.dtype)}")
    if t.dim() < 1:
        raise _invalid("'t' must have at least one axis, got a scalar")
    if granularity in ("row", "block") and t.shape[-1] == 0:
        raise _invalid(f"'t' has rows of 0 elements (shape {tuple(t.shape)}): no {granularity}-wise amax")
    if granularity == "block128" and t.dim() != 2:
        raise _invalid(f"granularity='block128' (128 x 128 blocks) takes a 2-D 't' [N, K], got shape "
                       f"{tuple(t.shape)}")
    tf = t.detach().float()
    if granularity == "tensor":
        amax = tf.abs().amax().reshape(1) if tf.numel() else tf.new_zeros(1)
    elif granularity == "row":
        amax = tf.abs().amax(dim=-1, keepdim=True)
    elif granularity == "block":
        return _quantize_blocks(torch, tf, (tf.shape[-1],))
    else:
        if 0 in tf.shape:  # no element: no block to take an amax of
            scale = tf.new_zeros(_blocks(tf.shape[0]), _blocks(tf.shape[1]))
            return tf.to(torch.float8_e4m3fn), scale
        return _quantize_blocks(torch, tf, tuple(tf.shape))
    scale = amax.clamp_min(_AMAX_FLOOR) / E4M3_MAX
    q = (tf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def _quantize_blocks(torch, tf, dims):
    """quantize_fp8 of float32 tf in blocks of 128 along its last len(dims)
    axes (sizes dims: (K,) for 1 x 128 groups, (N, K) for 128 x 128
    blocks), the last block of each axis partial. Zero padding to whole
    blocks leaves each amax as it is; the quotient is taken blockwise
    (broadcast, no scale expanded to t's size) and the padding cut off."""
    lead = tuple(tf.shape[:tf.dim() - len(dims)])
    nblk = tuple(_blocks(d) for d in dims)
    pad = []
    for d, nb in zip(reversed(dims), reversed(nblk)):
        pad += [0, nb * BLOCK - d]
    tp = torch.nn.functional.pad(tf, pad) if any(pad) else tf
    # [..., nb0, 128, nb1, 128] (or [..., nb, 128]): the block axes, each
    # followed by its 128 positions.
    shaped = tp.reshape(lead + tuple(x for nb in nblk for x in (nb, BLOCK)))
    inner = tuple(range(len(lead) + 1, shaped.dim(), 2))  # the 128-position axes
    amax = shaped.abs().amax(dim=inner, keepdim=True)
    scale = amax.clamp_min(_AMAX_FLOOR) / E4M3_MAX
    q = (shaped / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    q = q.reshape(tp.shape)
    for axis, d in enumerate(dims):
        q = q.narrow(len(lead) + axis, 0, d)
    return q.contiguous(), scale.reshape(lead + nblk)
