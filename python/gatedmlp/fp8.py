"""FP8 activations on the gate/up kernel (Hopper, sm_90): e4m3 x times e4m3
weights on the tensor cores, both scales applied to the fp32 sums, in one
launch with the GLU:

    g = alpha * sx * sw_g * (xq @ wq_g^T) + bg ;  u likewise ;  y = act(g) * u

``fp8_gate_up`` takes PyTorch tensors as FP8 checkpoints and
``torch._scaled_mm`` hold them: x float8_e4m3fn [M, K] with a per-tensor or
per-token (row-wise) fp32 scale, the weights float8_e4m3fn [2U, K] (or gate
and up [U, K] each) with a per-tensor or per-output-channel scale.
``quantize_fp8`` is the usual dynamic quantization that gives such x (and
weights): scale = amax / 448, per tensor or per row.
"""

from __future__ import annotations

import sys as _sys

from . import _gatedmlp as _C

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
_AMAX_FLOOR = 1e-12  # amax is clamped to at least this: an all-zero tensor gets a tiny scale, not 0
_GRANULARITIES = ("tensor", "row")
_FORMATS = {}  # row_block -> QuantFormat(fp8_e4m3, 8, group_size 0, row_block)


def _torch():
    torch = _sys.modules.get("torch")
    if torch is None:
        import torch
    return torch


def _invalid(message):
    return _C.InvalidArgumentError("gatedmlp: " + message)


def _fmt(row_block: int):
    f = _FORMATS.get(row_block)
    if f is None:
        f = _FORMATS[row_block] = _C.QuantFormat(mode=_C.QuantMode.fp8_e4m3, bits=8, group_size=0,
                                                 row_block=row_block)
    return f


def _dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def _require_tensor(torch, t, name):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"gatedmlp: '{name}' must be a torch.Tensor, got {type(t).__module__}.{type(t).__qualname__}")


def _same_device(t, x, name):
    if t.device != x.device:
        raise _invalid(f"'{name}' is on {t.device} but 'x' is on {x.device}; every tensor of the call must be on "
                       "x's device")


def _one_or_rows(t, rows, name, what):
    """t's values as the binding takes them: 1 (any shape of one element) or
    `rows` ([rows] or [rows, 1]); raises naming `name` otherwise. Returns
    (granularity 0 = one value / 1 = per row, the tensor to pass)."""
    shape = tuple(t.shape)
    if t.numel() == 1 and len(shape) <= 2:
        return 0, t.reshape(1)
    if shape in ((rows,), (rows, 1)):
        return 1, t.reshape(rows, 1).contiguous()
    raise _invalid(f"'{name}' must hold 1 value (per tensor: [], [1] or [1, 1]) or {rows} ({what}: [{rows}] or "
                   f"[{rows}, 1]), got shape {shape}")


def _as_words(torch, w, name):
    """The e4m3 bytes of w [rows, K] as the int32 words [rows, K / 4] the
    binding reads FP8 weights as (a view, no copy)."""
    try:
        return w.view(torch.int32)
    except RuntimeError:
        raise _invalid(f"'{name}' of shape {tuple(w.shape)} and strides {tuple(w.stride())} cannot be read as "
                       "rows of 4-byte words: pass a tensor with contiguous rows (w.contiguous())") from None


def fp8_gate_up(x, x_scale, w, w_scale, *, w_up=None, w_up_scale=None, bias=None, bias_up=None, out=None,
                out_dtype=None, preact=None, activation="silu", act_params=None, group=None, first="gate",
                alpha: float = 1.0, stream=None, workspace=None):
    """gate_up on FP8 activations and FP8 weights (sm_90 only), for PyTorch
    tensors:

        g = alpha * sx * sw_g * (x @ Wg^T) + bg ;  u = alpha * sx * sw_u * (x @ Wu^T) + bu ;  out = act(g) * u

    the e4m3 products summed exactly in fp32 on the tensor cores, the scales
    applied to the sums (as torch._scaled_mm does), then alpha, the bias and
    the activation in fp32; rounded once, to out's dtype.

    x:          float8_e4m3fn [M, K], rows contiguous; K a multiple of 16.
    x_scale:    float32, x = x_e4m3 * x_scale: 1 value (per tensor: [], [1])
                or M values (per token: [M] or [M, 1], torch._scaled_mm's
                row-wise scale_a and quantize_fp8(x, "row")'s).
    w:          float8_e4m3fn [2U, K], the fused gate and up rows (stacked,
                group None or 0: the gate rows then the up rows, as vLLM's
                gate_up_proj; or interleaved in blocks of `group` rows,
                `first` half first); or, with w_up, the gate weights [U, K].
                Rows contiguous (read as 4-byte words, no copy).
    w_scale:    float32, bfloat16 or float16, w = w_e4m3 * w_scale: 1 value
                (per tensor) or one per row of w (per output channel: [2U]
                or [2U, 1] fused, [U] or [U, 1] separate, in w's row order:
                a checkpoint's `weight_scale` [N, 1]).
    w_up:       float8_e4m3fn [U, K], the up weights (separate weights), with
    w_up_scale: its scale, of w_scale's granularity and dtype (a
                checkpoint's per-tensor gate and up scales stay separate).
    bias:       [2U] in w's row order (fused) or the gate bias [U], with
                bias_up [U] (separate); bf16, fp16 or fp32. Optional.
    out:        [M, U], bf16, fp16 or fp32; allocated on x's device when None,
                of out_dtype (default torch.bfloat16).
    preact:     optional [M, 2U] output of the scaled GEMM results plus bias,
                before the activation (columns in weight-row order; separate
                weights: [gate | up]).
    activation, act_params, first, alpha, stream, workspace: as for
                gatedmlp.gate_up.

    Every argument is checked, naming it and its values (ValueError:
    gatedmlp.InvalidArgumentError), before anything is allocated or launched.
    Returns out.
    """
    torch = _torch()
    from . import _NO_BACKWARD, Activation, Half, _enum, _export, _torch_stream_and_alloc

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
    _, xs = _one_or_rows(x_scale, m, "x_scale", "per token, one per row of x")
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
                           "halves (1 value, or one per row)")
        if bias_up is not None:
            raise _invalid("'bias_up' goes with separate weights (w_up); fused 'w' takes one 'bias' [2U]")
    scales = [("w_scale", w_scale)] + ([("w_up_scale", w_up_scale)] if sep else [])
    per_row = []
    passed = []
    for name, s in scales:
        _require_tensor(torch, s, name)
        if s.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise _invalid(f"'{name}' must be float32, bfloat16 or float16, got {_dtype_name(s.dtype)}")
        g, v = _one_or_rows(s, rows, name, "per output channel, one per row of w")
        _same_device(s, x, name)
        per_row.append(g)
        passed.append(v)
    if sep:
        if per_row[0] != per_row[1]:
            kinds = ["1 value" if g == 0 else f"{rows} values" for g in per_row]
            raise _invalid(f"'w_scale' and 'w_up_scale' must both hold 1 value or both one per row (the call has "
                           f"one weight-scale granularity), got {kinds[0]} and {kinds[1]}")
        if w_scale.dtype != w_up_scale.dtype:
            raise _invalid(f"'w_up_scale' must have the dtype of 'w_scale' ({_dtype_name(w_scale.dtype)}), got "
                           f"{_dtype_name(w_up_scale.dtype)}")

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
    if out_dtype is not None and out_dtype not in float_types:
        raise _invalid(f"'out_dtype' must be torch.bfloat16, torch.float16 or torch.float32, got {out_dtype}")
    if out is not None:
        _require_tensor(torch, out, "out")
        if tuple(out.shape) != (m, u):
            raise _invalid(f"'out' must be [M, U] = ({m}, {u}), got shape {tuple(out.shape)}")
        if out.dtype not in float_types:
            raise _invalid(f"'out' must be bfloat16, float16 or float32, got {_dtype_name(out.dtype)}")
        if out_dtype is not None and out.dtype != out_dtype:
            raise _invalid(f"'out' has dtype {_dtype_name(out.dtype)} but out_dtype is {_dtype_name(out_dtype)}")
        _same_device(out, x, "out")
    if preact is not None:
        _require_tensor(torch, preact, "preact")
        if tuple(preact.shape) != (m, 2 * u):
            raise _invalid(f"'preact' must be [M, 2U] = ({m}, {2 * u}), got shape {tuple(preact.shape)}")
        if preact.dtype not in float_types:
            raise _invalid(f"'preact' must be bfloat16, float16 or float32, got {_dtype_name(preact.dtype)}")
        _same_device(preact, x, "preact")
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (x, w, w_up, bias, bias_up, out, preact)):
        raise RuntimeError(_NO_BACKWARD)
    wq = _as_words(torch, w, "w")
    wq_up = _as_words(torch, w_up, "w_up") if sep else None

    if out is None:
        out = torch.empty((m, u), dtype=out_dtype or torch.bfloat16, device=x.device)
    handle, alloc = _torch_stream_and_alloc(torch, x, stream, workspace)
    to = torch.utils.dlpack.to_dlpack
    opt = lambda t: None if t is None else to(t)  # noqa: E731
    # x goes as its bytes (uint8) with x_fp8: DLPack has float8 only in recent
    # PyTorch releases, and the bytes are the same.
    _C.gate_up(to(x.view(torch.uint8)), to(wq), to(out), opt(wq_up), opt(bias), opt(bias_up), opt(preact),
               activation=activation, act_params=act_params, group=0 if group is None else int(group), first=first,
               alpha=alpha, stream=handle, workspace=_export(workspace),
               workspace_alloc=alloc, scales=to(passed[0]), scales_up=to(passed[1]) if sep else None,
               quant=_fmt(per_row[0]), x_scales=to(xs), x_fp8=True)
    return out


def quantize_fp8(t, granularity: str = "tensor"):
    """(q, scale): t (a floating PyTorch tensor, [..., K]) quantized to
    float8_e4m3fn the usual dynamic way, t ~= q.float() * scale:

        scale = max(amax, 1e-12) / 448       (448: e4m3fn's largest value)
        q     = (t / scale).clamp(-448, 448).to(torch.float8_e4m3fn)

    with amax the largest |t| of the whole tensor (granularity "tensor":
    scale float32 [1]) or of each row along the last axis ("row", per
    token: scale float32 [..., 1], [rows, 1] for a 2-D t, torch._scaled_mm's
    row-wise scale_a). Computed in float32 on t's device. NaN stays NaN.
    """
    torch = _torch()
    _require_tensor(torch, t, "t")
    if granularity not in _GRANULARITIES:
        raise _invalid(f"granularity={granularity!r} is not one of 'tensor', 'row'")
    if not t.dtype.is_floating_point or t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise _invalid(f"'t' must be float32, bfloat16 or float16 (or another float to quantize), got "
                       f"{_dtype_name(t.dtype)}")
    if t.dim() < 1:
        raise _invalid("'t' must have at least one axis, got a scalar")
    if granularity == "row" and t.shape[-1] == 0:
        raise _invalid(f"'t' has rows of 0 elements (shape {tuple(t.shape)}): no row-wise amax")
    tf = t.detach().float()
    if granularity == "tensor":
        amax = tf.abs().amax().reshape(1) if tf.numel() else tf.new_zeros(1)
    else:
        amax = tf.abs().amax(dim=-1, keepdim=True)
    scale = amax.clamp_min(_AMAX_FLOOR) / E4M3_MAX
    q = (tf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale
