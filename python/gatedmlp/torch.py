"""PyTorch integration: gatedmlp as torch.library operators, and GatedMLP.

The operators (``torch.ops.gatedmlp.gate_up``, ``gate_up_preact``,
``gate_up_out``, ``quantized_gate_up``, ``fp8_gate_up``,
``fp8_gate_up_fp8``, ``down``, ``quantized_down``, ``moe_mlp``) have fake
(meta) implementations, so they trace into torch.compile graphs without
graph breaks and can be captured in CUDA graphs. They launch on
``torch.cuda.current_stream()``. Those that return new tensors are defined
through gatedmlp._ops (one dispatcher trip per call, see there);
``gate_up_out``, which writes into its ``out``, is a torch.library
custom_op, which takes care of in-place semantics under torch.compile.
The three gate/up operators take their options as one string
(``gate_up_options()``; see "options" below). ``mlp`` and ``quantized_mlp``
are a gate/up op followed by a down op.

``Fp8GatedMLP`` (gatedmlp.fp8_module) is the MLP of an FP8 checkpoint (e4m3
weights with per-tensor, per-channel or 128 x 128 block scales, as
transformers' FP8Linear / FbgemmFp8Linear hold them) on FP8 activations.

``MoEExperts`` (gatedmlp.moe_module) stands in for the experts module of a
Mixture-of-Experts layer (transformers' Qwen3MoeExperts, MixtralExperts,
GptOssExperts), with the op ``gatedmlp::moe_mlp`` under it.

``GatedMLP`` is a drop-in for the MLP of Llama/Qwen-style models
(gate_proj, up_proj, down_proj): it loads their state dict, stacking the gate
and up weights once into one [2U, K] tensor, and computes
``down_proj(act(gate_proj(x)) * up_proj(x))`` with the gate/up half fused.

There is no backward pass yet: a call that would need one (grad enabled and
an input or a gate/up weight requiring grad) raises instead of returning a
result without gradients.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor, nn

import gatedmlp as _g
from gatedmlp import _gatedmlp as _C
from gatedmlp._ops import operator as _operator
from gatedmlp.fp8 import _fp8_gate_up
from gatedmlp.quant import _down_format, _format_cached

__all__ = ["gate_up", "gate_up_options", "quantized_gate_up", "fp8_gate_up", "down", "quantized_down", "mlp",
           "quantized_mlp", "GatedMLP", "QuantizedGatedMLP", "MoEExperts", "Fp8GatedMLP", "activation_name",
           "patch_model"]

_ACTIVATIONS = dict(_C.Activation.__members__)
_HALVES = dict(_C.Half.__members__)
_STORAGES = dict(_C.WeightStorage.__members__)


def activation_name(activation) -> str:
    """The gatedmlp activation name for an Activation, a gatedmlp name, or a
    Hugging Face ``hidden_act`` name ("silu", "gelu_pytorch_tanh", ...)."""
    if isinstance(activation, str):
        if activation in _ACTIVATIONS:
            return activation
        if activation in _HF_ACTIVATIONS:
            return _HF_ACTIVATIONS[activation]
        names = sorted(set(_ACTIVATIONS) | set(_HF_ACTIVATIONS))
        raise _g.InvalidArgumentError(f"gatedmlp: activation {activation!r} is not one of {', '.join(names)}")
    if isinstance(activation, _C.Activation):
        return activation.name
    raise TypeError(f"gatedmlp: activation must be a name or a gatedmlp.Activation, got {type(activation).__name__}")


def _name(value, members, what) -> str:
    if isinstance(value, str):
        if value not in members:
            raise _g.InvalidArgumentError(f"gatedmlp: {what}={value!r} is not one of {', '.join(members)}")
        return value
    return value.name


def _out_features(w: Tensor, w_up: Optional[Tensor], storage: str):
    rows = w.shape[-1] if storage == "in_out" else w.shape[-2]
    return rows if w_up is not None else rows // 2


def _flatten(x: Tensor, w: Tensor) -> Tensor:
    # nn.Linear semantics: x [..., K] -> [M, K]. With batched weights
    # ([L, rows, K]) x is [L, M, K] and keeps its batch axis.
    if w.dim() == 3 or x.dim() == 2:
        return x
    return x.reshape(-1, x.shape[-1])


_to_dlpack = torch.utils.dlpack.to_dlpack


def _capsule(t: Optional[Tensor]):
    return None if t is None else _to_dlpack(t)


def _stream(x: Tensor) -> int:
    # The raw handle, without building a torch.cuda.Stream object per call.
    return torch._C._cuda_getCurrentRawStream(x.get_device()) if x.is_cuda else 0


# One allocator per device, made once: the binding calls it only when a call
# needs scratch it does not already hold (see _gatedmlp.gate_up).
_WS_ALLOC = {}


def _workspace_alloc(device: torch.device):
    fn = _WS_ALLOC.get(device)
    if fn is None:
        fn = _WS_ALLOC[device] = lambda n: _to_dlpack(torch.empty(n, dtype=torch.uint8, device=device))
    return fn


def _launch(x, w, w_up, bias, bias_up, out, preact, activation, clamp_alpha, clamp_limit, group, first, storage,
            alpha, hold=True) -> None:
    # An empty batch (M = 0) goes through too: the library checks the shapes
    # and launches nothing.
    _C.gate_up(
        _to_dlpack(x), _to_dlpack(w), _to_dlpack(out), _capsule(w_up), _capsule(bias), _capsule(bias_up),
        _capsule(preact), activation=_ACTIVATIONS[activation], clamp_alpha=clamp_alpha, clamp_limit=clamp_limit,
        group=group, first=_HALVES[first], storage=_STORAGES[storage], alpha=alpha, stream=_stream(x),
        workspace_alloc=_workspace_alloc(x.device), hold_workspace=hold)


def _traced() -> bool:
    """True when something records the call instead of running it: dynamo
    (torch.compile, export) or a dispatch mode (FakeTensor, make_fx, the
    flop counter). Then the custom op must be called; otherwise the wrappers
    below launch directly, since the dispatcher's trip through a Python op
    costs more host time than the kernel launch itself at decode sizes."""
    return torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0


_new_out = _g._new_out  # Y [..., u] for x [..., K] (gatedmlp/__init__.py)


def _gate_up_direct(x, w, w_up, bias, bias_up, activation, clamp_alpha, clamp_limit, group, first, storage, alpha,
                    out_dtype, hold=True):
    # What the gatedmlp::gate_up op computes, for real tensors only. The
    # wrappers call it directly for plain CUDA tensors (meta, CPU and fake
    # tensors go through the op). hold: keep scratch for the stream across
    # calls (eager); the ops' bodies take scratch that is freed when the call
    # returns, since torch.compile's CUDA-graph trees refuse an op that
    # leaves memory of their pool alive.
    x2 = _flatten(x, w)
    u = _out_features(w, w_up, storage)
    out = _new_out(x, u, out_dtype)
    _launch(x2, w, w_up, bias, bias_up, out if x2 is x else out.view(*x2.shape[:-1], u), None, activation,
            clamp_alpha, clamp_limit, group, first, storage, alpha, hold)
    return out


# ---------------------------------------------------------------- options
# The gate/up operators take their options as one string of name=value
# pairs, the defaults left out ("activation=gelu_tanh,group=8,first=up"; ""
# is all defaults): a Python-defined operator's call parses each argument of
# its schema, ~0.25 us apiece whatever runs the kernel (h86), and a compiled
# model passes all of them on every call. Eight options as one string save
# ~2 us a call (h88). The string is what a graph records, so it must mean
# the same in another process: names and values, never a handle.
_GATE_UP_DEFAULTS = {"activation": "silu", "clamp_alpha": 1.702, "clamp_limit": 7.0, "group": 0, "first": "gate",
                     "storage": "out_in", "alpha": 1.0, "out_dtype": None, "preact_dtype": None}
_OUT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _options_string(activation, clamp_alpha, clamp_limit, group, first, storage, alpha, out_dtype,
                    preact_dtype) -> str:
    given = {"activation": activation, "clamp_alpha": float(clamp_alpha), "clamp_limit": float(clamp_limit),
             "group": int(group), "first": first, "storage": storage, "alpha": float(alpha),
             "out_dtype": out_dtype, "preact_dtype": preact_dtype}
    parts = []
    for name, value in given.items():
        if value == _GATE_UP_DEFAULTS[name]:
            continue
        if isinstance(value, torch.dtype):
            value = str(value).replace("torch.", "")
        elif isinstance(value, float):
            value = repr(value)  # round-trips exactly
        parts.append(f"{name}={value}")
    return ",".join(parts)


def gate_up_options(activation="silu", clamp_alpha: float = 1.702, clamp_limit: float = 7.0, group: int = 0,
                    first="gate", storage="out_in", alpha: float = 1.0, out_dtype: Optional[torch.dtype] = None,
                    preact_dtype: Optional[torch.dtype] = None) -> str:
    """The ``options`` string of the gate/up operators
    (``torch.ops.gatedmlp.gate_up``, ``gate_up_preact``, ``gate_up_out``):
    gate_up's keyword options as name=value pairs, the defaults left out."""
    return _options_string(activation_name(activation), clamp_alpha, clamp_limit, group,
                           _name(first, _HALVES, "first"), _name(storage, _STORAGES, "storage"), alpha, out_dtype,
                           preact_dtype)


_PARSED_OPTIONS = {}
_MAX_PARSED = 256  # a model has a few strings; past this the cache starts over


def _parse_options(options: str) -> tuple:
    """(activation, clamp_alpha, clamp_limit, group, first, storage, alpha,
    out_dtype, preact_dtype) of an options string; parsed once per string."""
    parsed = _PARSED_OPTIONS.get(options)
    if parsed is not None:
        return parsed
    values = dict(_GATE_UP_DEFAULTS)
    for part in options.split(",") if options else ():
        name, eq, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or name not in values:
            raise _g.InvalidArgumentError(
                f"gatedmlp: options {options!r}: {part!r} is not name=value with a name among "
                f"{', '.join(_GATE_UP_DEFAULTS)}")
        try:
            if name == "activation":
                value = activation_name(value)  # gatedmlp's names or Hugging Face's
            elif name == "first":
                value = _name(value, _HALVES, "first")
            elif name == "storage":
                value = _name(value, _STORAGES, "storage")
            elif name == "group":
                value = int(value)
            elif name.endswith("dtype"):
                if value not in _OUT_DTYPES:
                    raise _g.InvalidArgumentError(f"gatedmlp: {name}={value!r} is not one of {', '.join(_OUT_DTYPES)}")
                value = _OUT_DTYPES[value]
            else:
                value = float(value)
        except ValueError as e:
            raise _g.InvalidArgumentError(f"gatedmlp: options {options!r}: {part!r}: {e}") from None
        values[name] = value
    if len(_PARSED_OPTIONS) >= _MAX_PARSED:
        _PARSED_OPTIONS.clear()
    parsed = _PARSED_OPTIONS[options] = tuple(values.values())
    return parsed


# ---------------------------------------------------------------- operators
@_operator("gate_up")
def _gate_up_op(x: Tensor, w: Tensor, w_up: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                bias_up: Optional[Tensor] = None, options: str = "") -> Tensor:
    act, clamp_alpha, clamp_limit, group, first, storage, alpha, out_dtype, _ = _parse_options(options)
    return _gate_up_direct(x, w, w_up, bias, bias_up, act, clamp_alpha, clamp_limit, group, first, storage, alpha,
                           out_dtype, hold=False)


@_gate_up_op.register_fake
def _gate_up_fake(x, w, w_up=None, bias=None, bias_up=None, options=""):
    o = _parse_options(options)
    return x.new_empty((*x.shape[:-1], _out_features(w, w_up, o[5])), dtype=o[7] or x.dtype)


@_operator("gate_up_preact")
def _gate_up_preact_op(x: Tensor, w: Tensor, w_up: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                       bias_up: Optional[Tensor] = None, options: str = "") -> Tuple[Tensor, Tensor]:
    act, clamp_alpha, clamp_limit, group, first, storage, alpha, out_dtype, preact_dtype = _parse_options(options)
    x2 = _flatten(x, w)
    u = _out_features(w, w_up, storage)
    out = torch.empty((*x.shape[:-1], u), dtype=out_dtype or x.dtype, device=x.device)
    pre = torch.empty((*x.shape[:-1], 2 * u), dtype=preact_dtype or x.dtype, device=x.device)
    lead = x2.shape[:-1]
    _launch(x2, w, w_up, bias, bias_up, out.view(*lead, u), pre.view(*lead, 2 * u), act, clamp_alpha, clamp_limit,
            group, first, storage, alpha, hold=False)
    return out, pre


@_gate_up_preact_op.register_fake
def _gate_up_preact_fake(x, w, w_up=None, bias=None, bias_up=None, options=""):
    o = _parse_options(options)
    u = _out_features(w, w_up, o[5])
    return (x.new_empty((*x.shape[:-1], u), dtype=o[7] or x.dtype),
            x.new_empty((*x.shape[:-1], 2 * u), dtype=o[8] or x.dtype))


@torch.library.custom_op("gatedmlp::gate_up_out", mutates_args=("out",))
def _gate_up_out_op(x: Tensor, w: Tensor, w_up: Optional[Tensor], bias: Optional[Tensor],
                    bias_up: Optional[Tensor], out: Tensor, options: str = "") -> None:
    act, clamp_alpha, clamp_limit, group, first, storage, alpha, out_dtype, preact_dtype = _parse_options(options)
    if out_dtype is not None or preact_dtype is not None:
        raise _g.InvalidArgumentError(f"gatedmlp: gate_up_out writes into out, in out's dtype; options {options!r} "
                                      "must not set out_dtype or preact_dtype")
    _gate_up_out_impl(x, w, w_up, bias, bias_up, out, act, clamp_alpha, clamp_limit, group, first, storage, alpha)


def _gate_up_out_impl(x, w, w_up, bias, bias_up, out, activation, clamp_alpha, clamp_limit, group, first, storage,
                      alpha) -> None:
    x2 = _flatten(x, w)
    # A view, never a copy: the kernel must write into `out` itself.
    out2 = out if x2 is x else out.view(-1, out.shape[-1])
    _launch(x2, w, w_up, bias, bias_up, out2, None, activation, clamp_alpha, clamp_limit, group, first, storage,
            alpha, hold=False)


@_gate_up_out_op.register_fake
def _gate_up_out_fake(x, w, w_up, bias, bias_up, out, options=""):
    _parse_options(options)
    return None


# ---------------------------------------------------------------- quantized weights
_QUANT_MODES = {"affine": (_C.QuantMode.affine, 64, 4, 1), "mxfp4": (_C.QuantMode.mxfp4, 32, 4, 1),
                "fp8_e4m3": (_C.QuantMode.fp8_e4m3, 128, 8, 128)}


def _quant_format(mode: str, bits: int, group_size: int, row_block: int):
    # The package's formats, each made once (the operators' calls pass the
    # same few on every call). "affine_tiled": affine words and (scale, bias)
    # pairs in gatedmlp.tile's order (the operator's schema carries the
    # order in its mode string).
    if mode == "affine_tiled":
        return _format_cached(group_size, bits, "affine", row_block, False, True)
    return _format_cached(group_size, bits, mode, row_block, False)


def _quantized_rows(wq: Tensor, wq_up: Optional[Tensor]) -> int:
    return wq.shape[0] if wq_up is not None else wq.shape[0] // 2


def _quantized_direct(x, wq, scales, biases, wq_up, scales_up, biases_up, bias, bias_up, mode, bits, group_size,
                      row_block, activation, clamp_alpha, clamp_limit, group, first, alpha, out_dtype, hold=True):
    # What gatedmlp::quantized_gate_up computes, for real tensors only (hold: as _gate_up_direct's).
    u = _quantized_rows(wq, wq_up)
    out = _new_out(x, u, out_dtype)
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    out2 = out if x2 is x else out.view(-1, u)
    _C.gate_up(
        _to_dlpack(x2), _to_dlpack(wq), _to_dlpack(out2), _capsule(wq_up), _capsule(bias), _capsule(bias_up), None,
        activation=_ACTIVATIONS[activation], clamp_alpha=clamp_alpha, clamp_limit=clamp_limit, group=group,
        first=_HALVES[first], alpha=alpha, stream=_stream(x), workspace_alloc=_workspace_alloc(x.device),
        scales=_to_dlpack(scales), biases=_capsule(biases), scales_up=_capsule(scales_up),
        biases_up=_capsule(biases_up), quant=_quant_format(mode, bits, group_size, row_block), hold_workspace=hold)
    return out


@_operator("quantized_gate_up")
def _quantized_gate_up_op(x: Tensor, wq: Tensor, scales: Tensor, biases: Optional[Tensor], wq_up: Optional[Tensor],
                          scales_up: Optional[Tensor], biases_up: Optional[Tensor], bias: Optional[Tensor],
                          bias_up: Optional[Tensor], mode: str, bits: int, group_size: int, row_block: int,
                          activation: str, clamp_alpha: float, clamp_limit: float, group: int, first: str,
                          alpha: float, out_dtype: Optional[torch.dtype]) -> Tensor:
    return _quantized_direct(x, wq, scales, biases, wq_up, scales_up, biases_up, bias, bias_up, mode, bits,
                             group_size, row_block, activation, clamp_alpha, clamp_limit, group, first, alpha,
                             out_dtype, hold=False)


@_quantized_gate_up_op.register_fake
def _quantized_gate_up_fake(x, wq, scales, biases, wq_up, scales_up, biases_up, bias, bias_up, mode, bits,
                            group_size, row_block, activation, clamp_alpha, clamp_limit, group, first, alpha,
                            out_dtype):
    return x.new_empty((*x.shape[:-1], _quantized_rows(wq, wq_up)), dtype=out_dtype or x.dtype)


def quantized_gate_up(x: Tensor, wq: Tensor, scales: Tensor, biases: Optional[Tensor] = None, *,
                      wq_up: Optional[Tensor] = None, scales_up: Optional[Tensor] = None,
                      biases_up: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                      bias_up: Optional[Tensor] = None, mode: str = "affine", bits: Optional[int] = None,
                      group_size: Optional[int] = None, row_block: Optional[int] = None, activation="silu",
                      clamp_alpha: float = 1.702,
                      clamp_limit: float = 7.0, group: int = 0, first="gate", alpha: float = 1.0,
                      out_dtype: Optional[torch.dtype] = None, tiled: bool = False) -> Tensor:
    """gate_up with quantized weights as a PyTorch op (gatedmlp.quantized_gate_up's arrays: wq uint32 or int32
    [2U or U, K * bits / 32], scales / biases [rows, K / group_size]; mode "affine" (bits 4 or 8, groups of
    32 / 64 / 128; default 4 and 64), "mxfp4" (no biases) or "fp8_e4m3" (float8_e4m3fn bytes viewed as int32,
    float scales per row_block x group_size block, default 128 x 128; no biases)). tiled=True: affine 4-bit
    words and (scale, bias) pairs from gatedmlp.tile as wq and scales, no biases. x is [..., K]; returns
    y [..., U]."""
    _check_no_grad(x, bias, bias_up)
    if mode not in _QUANT_MODES:
        raise _g.InvalidArgumentError(f"gatedmlp: mode {mode!r} is not one of {', '.join(_QUANT_MODES)}")
    if tiled and mode != "affine":
        raise _g.InvalidArgumentError(f"gatedmlp: tiled=True takes mode='affine' (gatedmlp.tile's arrays), got {mode!r}")
    bits = int(bits if bits is not None else _QUANT_MODES[mode][2])
    group_size = int(group_size if group_size is not None else _QUANT_MODES[mode][1])
    row_block = int(row_block if row_block is not None else _QUANT_MODES[mode][3])
    act = activation if activation in _ACTIVATIONS else activation_name(activation)
    first = first if first in _HALVES else _name(first, _HALVES, "first")
    if tiled:
        mode, group = "affine_tiled", group or 8  # tile()'s order: group 8, gate first
    args = (x, wq, scales, biases, wq_up, scales_up, biases_up, bias, bias_up, mode, bits, group_size, row_block, act,
            float(clamp_alpha), float(clamp_limit), int(group), first, float(alpha), out_dtype)
    if x.is_cuda and type(x) is Tensor and not _traced():
        return _quantized_direct(*args)
    return torch.ops.gatedmlp.quantized_gate_up(*args)


# ---------------------------------------------------------------- FP8 activations
_ACT_PARAMS = {}  # (clamp_alpha, clamp_limit) -> ActivationParams: one built per pair, not per call


def _act_params(clamp_alpha, clamp_limit):
    ap = _ACT_PARAMS.get((clamp_alpha, clamp_limit))
    if ap is None:
        if len(_ACT_PARAMS) > 64:
            _ACT_PARAMS.clear()
        ap = _ACT_PARAMS[(clamp_alpha, clamp_limit)] = _C.ActivationParams(clamp_alpha=clamp_alpha,
                                                                            clamp_limit=clamp_limit)
    return ap


def _fp8_direct(x, x_scale, w, w_scale, w_up, w_up_scale, bias, bias_up, activation, clamp_alpha, clamp_limit, group,
                first, alpha, promote, out_dtype, hold=True):
    # What the gatedmlp::fp8_gate_up op computes, for real tensors only
    # (hold: as _gate_up_direct's).
    ap = _act_params(clamp_alpha, clamp_limit) if activation == "swiglu_clamped" else None
    return _fp8_gate_up(x, x_scale, w, w_scale, w_up, w_up_scale, bias, bias_up, None, out_dtype, None, activation, ap,
                        group or None, first, alpha, promote, None, None, None, None, None, hold)


@_operator("fp8_gate_up")
def _fp8_gate_up_op(x: Tensor, x_scale: Tensor, w: Tensor, w_scale: Tensor, w_up: Optional[Tensor],
                    w_up_scale: Optional[Tensor], bias: Optional[Tensor], bias_up: Optional[Tensor], activation: str,
                    clamp_alpha: float, clamp_limit: float, group: int, first: str, alpha: float, promote: bool,
                    out_dtype: Optional[torch.dtype]) -> Tensor:
    return _fp8_direct(x, x_scale, w, w_scale, w_up, w_up_scale, bias, bias_up, activation, clamp_alpha, clamp_limit,
                       group, first, alpha, promote, out_dtype, hold=False)


@_fp8_gate_up_op.register_fake
def _fp8_gate_up_fake(x, x_scale, w, w_scale, w_up, w_up_scale, bias, bias_up, activation, clamp_alpha, clamp_limit,
                      group, first, alpha, promote, out_dtype):
    u = w.shape[0] if w_up is not None else w.shape[0] // 2
    return x.new_empty((x.shape[0], u), dtype=out_dtype or torch.bfloat16)


def _fp8_y_direct(x, x_scale, w, w_scale, w_up, w_up_scale, bias, bias_up, activation, clamp_alpha, clamp_limit,
                  group, first, alpha, promote, mn_scales, hold=True):
    # What the gatedmlp::fp8_gate_up_fp8 op computes: the FP8 Y, its scales
    # and its amax (always: one memset and a few atomics). MN-major scales
    # come back as their storage, [G, align4(M)] (an op's outputs are whole
    # tensors, not views); fp8_gate_up takes the [M, G] view of it.
    ap = _act_params(clamp_alpha, clamp_limit)
    m = x.shape[0]
    u = w.shape[0] if w_up is not None else w.shape[0] // 2
    groups = -(-u // 128)
    store = (torch.empty((groups, -(-m // 4) * 4), dtype=torch.float32, device=x.device) if mn_scales
             else torch.empty((m, groups), dtype=torch.float32, device=x.device))
    y, _, am = _fp8_gate_up(x, x_scale, w, w_scale, w_up, w_up_scale, bias, bias_up, None, torch.float8_e4m3fn, None,
                            activation, ap, group or None, first, alpha, promote,
                            store.t()[:m] if mn_scales else store, "mn" if mn_scales else "row", True, None, None,
                            hold)
    return y, store, am


@_operator("fp8_gate_up_fp8")
def _fp8_gate_up_fp8_op(x: Tensor, x_scale: Tensor, w: Tensor, w_scale: Tensor, w_up: Optional[Tensor],
                        w_up_scale: Optional[Tensor], bias: Optional[Tensor], bias_up: Optional[Tensor],
                        activation: str, clamp_alpha: float, clamp_limit: float, group: int, first: str, alpha: float,
                        promote: bool, mn_scales: bool) -> Tuple[Tensor, Tensor, Tensor]:
    return _fp8_y_direct(x, x_scale, w, w_scale, w_up, w_up_scale, bias, bias_up, activation, clamp_alpha,
                         clamp_limit, group, first, alpha, promote, mn_scales, hold=False)


@_fp8_gate_up_fp8_op.register_fake
def _fp8_gate_up_fp8_fake(x, x_scale, w, w_scale, w_up, w_up_scale, bias, bias_up, activation, clamp_alpha,
                          clamp_limit, group, first, alpha, promote, mn_scales):
    m = x.shape[0]
    u = w.shape[0] if w_up is not None else w.shape[0] // 2
    groups = -(-u // 128)
    y = x.new_empty((m, u), dtype=torch.float8_e4m3fn)
    shape = (groups, -(-m // 4) * 4) if mn_scales else (m, groups)  # MN-major: the storage
    return y, x.new_empty(shape, dtype=torch.float32), x.new_empty((), dtype=torch.float32)


def fp8_gate_up(x: Tensor, x_scale: Tensor, w: Tensor, w_scale: Tensor, *, w_up: Optional[Tensor] = None,
                w_up_scale: Optional[Tensor] = None, bias: Optional[Tensor] = None, bias_up: Optional[Tensor] = None,
                activation="silu", clamp_alpha: float = 1.702, clamp_limit: float = 7.0, group: int = 0,
                first="gate", alpha: float = 1.0, promote: bool = False,
                out_dtype: Optional[torch.dtype] = None, y_scale_layout: str = "row", amax: bool = False):
    """gatedmlp.fp8_gate_up as a PyTorch op (FP8 x [M, K] with its scales,
    FP8 weights with theirs; per tensor, per row / channel, or 1 x 128 / 128 x
    128 blocks): returns y [M, U] of out_dtype (default bfloat16). With
    out_dtype=torch.float8_e4m3fn, an FP8 Y with its 1 x 128 group scales:
    (y, y_scale), or (y, y_scale, amax) with amax=True; y_scale [M, ceil(U
    / 128)] float32, row-major, or MN-major with y_scale_layout="mn"
    (strides (1, align4(M))), as gatedmlp.fp8_gate_up gives them. The
    arguments are fp8_gate_up's; a traced call (torch.compile, export) is the
    gatedmlp::fp8_gate_up operator (gatedmlp::fp8_gate_up_fp8 for an FP8
    Y), a plain CUDA call runs directly."""
    act = activation if activation in _ACTIVATIONS else activation_name(activation)
    first = first if first in _HALVES else _name(first, _HALVES, "first")
    direct = x.is_cuda and type(x) is Tensor and not _traced()
    if not direct:  # (a direct call's launch checks them itself)
        _check_no_grad(x, bias, bias_up)
    if out_dtype == torch.float8_e4m3fn:
        if y_scale_layout not in ("row", "mn"):
            raise _C.InvalidArgumentError(f"gatedmlp: 'y_scale_layout' must be 'row' or 'mn', got {y_scale_layout!r}")
        args = (x, x_scale, w, w_scale, w_up, w_up_scale, bias, bias_up, act, float(clamp_alpha), float(clamp_limit),
                int(group), first, float(alpha), bool(promote), y_scale_layout == "mn")
        y, ys, am = _fp8_y_direct(*args) if direct else torch.ops.gatedmlp.fp8_gate_up_fp8(*args)
        if y_scale_layout == "mn":
            ys = ys.t()[:x.shape[0]]
        return (y, ys, am) if amax else (y, ys)
    if amax or y_scale_layout != "row":
        raise _C.InvalidArgumentError("gatedmlp: 'amax' and 'y_scale_layout' go with an FP8 Y "
                                      "(out_dtype=torch.float8_e4m3fn)")
    if direct:  # the caller's values as they are: the operator's conversions are for its schema
        return _fp8_direct(x, x_scale, w, w_scale, w_up, w_up_scale, bias, bias_up, act, clamp_alpha, clamp_limit,
                           group, first, alpha, promote, out_dtype)
    return torch.ops.gatedmlp.fp8_gate_up(x, x_scale, w, w_scale, w_up, w_up_scale, bias, bias_up, act,
                                          float(clamp_alpha), float(clamp_limit), int(group), first, float(alpha),
                                          bool(promote), out_dtype)


# ---------------------------------------------------------------- the down projection
def _down_features(w: Tensor, storage: str) -> int:
    return w.shape[-1] if storage == "in_out" else w.shape[-2]


def _down_inputs(h: Tensor, up: Optional[Tensor], batched_weights: bool):
    # nn.Linear semantics: h [..., K] -> [M, K] (kept [L, M, K] with batched
    # weights). The library reads both halves of a GLU input with one row
    # and batch stride; where flattening left them with different ones (a
    # reshape that had to copy one of them), both are made contiguous.
    h2 = h if batched_weights or h.dim() == 2 else h.reshape(-1, h.shape[-1])
    if up is None:
        return h2, None
    up2 = up if batched_weights or up.dim() == 2 else up.reshape(-1, up.shape[-1])
    if h2.shape == up2.shape and h2.stride() != up2.stride():
        h2, up2 = h2.contiguous(), up2.contiguous()
    return h2, up2


def _down_direct(h, w, up, bias, activation, clamp_alpha, clamp_limit, storage, alpha, out_dtype, hold=True):
    # What the gatedmlp::down op computes, for real tensors only (the
    # wrappers call it directly for plain CUDA tensors; hold: as _gate_up_direct's).
    u = _down_features(w, storage)
    out = h.new_empty(*h.shape[:-1], u, dtype=out_dtype)  # None: h's dtype
    h2, up2 = _down_inputs(h, up, w.dim() == 3)
    _C.down(_to_dlpack(h2), _to_dlpack(w), _to_dlpack(out if h2.dim() == h.dim() else out.view(-1, u)),
            _capsule(up2), _capsule(bias), activation=_ACTIVATIONS[activation], clamp_alpha=clamp_alpha,
            clamp_limit=clamp_limit, storage=_STORAGES[storage], alpha=alpha, stream=_stream(h),
            workspace_alloc=_workspace_alloc(h.device), hold_workspace=hold)
    return out


@_operator("down")
def _down_op(h: Tensor, w: Tensor, up: Optional[Tensor], bias: Optional[Tensor], activation: str,
             clamp_alpha: float, clamp_limit: float, storage: str, alpha: float,
             out_dtype: Optional[torch.dtype]) -> Tensor:
    return _down_direct(h, w, up, bias, activation, clamp_alpha, clamp_limit, storage, alpha, out_dtype, hold=False)


@_down_op.register_fake
def _down_fake(h, w, up, bias, activation, clamp_alpha, clamp_limit, storage, alpha, out_dtype):
    return h.new_empty((*h.shape[:-1], _down_features(w, storage)), dtype=out_dtype or h.dtype)


def _quantized_down_direct(h, wq, scales, biases, up, bias, mode, bits, group_size, row_block, activation,
                           clamp_alpha, clamp_limit, alpha, out_dtype, hold=True):
    # What gatedmlp::quantized_down computes, for real tensors only (hold: as _gate_up_direct's).
    u = wq.shape[0]
    out = h.new_empty(*h.shape[:-1], u, dtype=out_dtype)  # None: h's dtype
    h2, up2 = _down_inputs(h, up, False)
    _C.down(_to_dlpack(h2), _to_dlpack(wq), _to_dlpack(out if h2.dim() == h.dim() else out.view(-1, u)),
            _capsule(up2), _capsule(bias), activation=_ACTIVATIONS[activation], clamp_alpha=clamp_alpha,
            clamp_limit=clamp_limit, alpha=alpha, stream=_stream(h), workspace_alloc=_workspace_alloc(h.device),
            scales=_to_dlpack(scales), biases=_capsule(biases),
            quant=_quant_format(mode, bits, group_size, row_block), hold_workspace=hold)
    return out


@_operator("quantized_down")
def _quantized_down_op(h: Tensor, wq: Tensor, scales: Tensor, biases: Optional[Tensor], up: Optional[Tensor],
                       bias: Optional[Tensor], mode: str, bits: int, group_size: int, row_block: int,
                       activation: str, clamp_alpha: float, clamp_limit: float, alpha: float,
                       out_dtype: Optional[torch.dtype]) -> Tensor:
    return _quantized_down_direct(h, wq, scales, biases, up, bias, mode, bits, group_size, row_block, activation,
                                  clamp_alpha, clamp_limit, alpha, out_dtype, hold=False)


@_quantized_down_op.register_fake
def _quantized_down_fake(h, wq, scales, biases, up, bias, mode, bits, group_size, row_block, activation,
                         clamp_alpha, clamp_limit, alpha, out_dtype):
    return h.new_empty((*h.shape[:-1], wq.shape[0]), dtype=out_dtype or h.dtype)


def down(h: Tensor, w: Tensor, bias: Optional[Tensor] = None, *, up: Optional[Tensor] = None, activation="silu",
         clamp_alpha: float = 1.702, clamp_limit: float = 7.0, storage="out_in", alpha: float = 1.0,
         out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """The down projection as a PyTorch op: alpha * h @ W^T + bias, or with
    `up` the GLU act(h) * up as its input (computed by the call).

    h is [..., K] (nn.Linear style; with batched [L, ...] weights, [L, M,
    K]), up h's shape; w [U, K] (storage "out_in", nn.Linear's) or [K, U]
    ("in_out"); bias [U]. activation, clamp_alpha, clamp_limit: the GLU of
    the input, used only with `up`. Returns y [..., U].
    """
    _check_no_grad(h, w, up, bias)
    act = activation if activation in _ACTIVATIONS else activation_name(activation)
    storage = storage if storage in _STORAGES else _name(storage, _STORAGES, "storage")
    args = (h, w, up, bias, act, float(clamp_alpha), float(clamp_limit), storage, float(alpha), out_dtype)
    if h.is_cuda and type(h) is Tensor and not _traced():
        return _down_direct(*args)
    return torch.ops.gatedmlp.down(*args)


def _quant_args(mode, bits, group_size, row_block):
    # The format's fields with the mode's defaults (gatedmlp.quant's table).
    if mode not in _QUANT_MODES:
        raise _g.InvalidArgumentError(f"gatedmlp: mode {mode!r} is not one of {', '.join(_QUANT_MODES)}")
    d = _QUANT_MODES[mode]
    return (mode, int(bits if bits is not None else d[2]), int(group_size if group_size is not None else d[1]),
            int(row_block if row_block is not None else d[3]))


def quantized_down(h: Tensor, wq: Tensor, scales: Tensor, biases: Optional[Tensor] = None, *,
                   up: Optional[Tensor] = None, bias: Optional[Tensor] = None, mode: str = "affine",
                   bits: Optional[int] = None, group_size: Optional[int] = None, row_block: Optional[int] = None,
                   activation="silu", clamp_alpha: float = 1.702, clamp_limit: float = 7.0, alpha: float = 1.0,
                   out_dtype: Optional[torch.dtype] = None, tiled: bool = False) -> Tensor:
    """The down projection on quantized weights as a PyTorch op
    (gatedmlp.quantized_down's arrays: wq [U, K * bits / 32] uint32 or
    int32 words, scales / biases [U, K / group_size]; modes and defaults as
    quantized_gate_up). tiled=True: affine 4-bit words and (scale, bias)
    pairs from gatedmlp.tile(..., down=True) as wq and scales, no biases.
    h is [..., K], up h's shape; returns y [..., U]."""
    _check_no_grad(h, up, bias)
    if tiled and mode != "affine":
        raise _g.InvalidArgumentError(f"gatedmlp: tiled=True takes mode='affine' (gatedmlp.tile's arrays), "
                                      f"got {mode!r}")
    act = activation if activation in _ACTIVATIONS else activation_name(activation)
    mode, bits, group_size, row_block = _quant_args(mode, bits, group_size, row_block)
    args = (h, wq, scales, biases, up, bias, "affine_tiled" if tiled else mode, bits, group_size, row_block, act,
            float(clamp_alpha), float(clamp_limit), float(alpha), out_dtype)
    if h.is_cuda and type(h) is Tensor and not _traced():
        return _quantized_down_direct(*args)
    return torch.ops.gatedmlp.quantized_down(*args)


def mlp(x: Tensor, w: Tensor, w_down: Tensor, w_up: Optional[Tensor] = None, bias: Optional[Tensor] = None,
        bias_up: Optional[Tensor] = None, bias_down: Optional[Tensor] = None, *, activation="silu",
        clamp_alpha: float = 1.702, clamp_limit: float = 7.0, group: int = 0, first="gate", storage="out_in",
        out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """The whole gated MLP, down(gate_up(x, w, ...), w_down, bias_down), as
    two PyTorch ops (gatedmlp::gate_up, then gatedmlp::down on its result).
    Arguments as for gate_up and down; `storage` applies to every weight;
    out_dtype is the output's (the intermediate is x's dtype)."""
    h = gate_up(x, w, w_up, bias, bias_up, activation=activation, clamp_alpha=clamp_alpha, clamp_limit=clamp_limit,
                group=group, first=first, storage=storage)
    return down(h, w_down, bias_down, storage=storage, out_dtype=out_dtype)


def quantized_mlp(x: Tensor, wq: Tensor, scales: Tensor, biases: Optional[Tensor] = None, *, wq_down: Tensor,
                  scales_down: Tensor, biases_down: Optional[Tensor] = None, wq_up: Optional[Tensor] = None,
                  scales_up: Optional[Tensor] = None, biases_up: Optional[Tensor] = None,
                  bias: Optional[Tensor] = None, bias_up: Optional[Tensor] = None,
                  bias_down: Optional[Tensor] = None, mode: str = "affine", bits: Optional[int] = None,
                  group_size: Optional[int] = None, row_block: Optional[int] = None, mode_down: Optional[str] = None,
                  bits_down: Optional[int] = None, group_size_down: Optional[int] = None,
                  row_block_down: Optional[int] = None, activation="silu", clamp_alpha: float = 1.702,
                  clamp_limit: float = 7.0, group: int = 0, first="gate",
                  out_dtype: Optional[torch.dtype] = None, tiled: bool = False) -> Tensor:
    """The whole gated MLP on quantized weights as two PyTorch ops
    (gatedmlp::quantized_gate_up, then gatedmlp::quantized_down). The down
    projection's arrays are wq_down / scales_down / biases_down, in the
    gate/up format unless mode_down, bits_down, group_size_down or
    row_block_down say otherwise (gatedmlp.quantized_mlp's rule). tiled=True:
    both weights in gatedmlp.tile's order (the down one tiled with
    down=True)."""
    h = quantized_gate_up(x, wq, scales, biases, wq_up=wq_up, scales_up=scales_up, biases_up=biases_up, bias=bias,
                          bias_up=bias_up, mode=mode, bits=bits, group_size=group_size, row_block=row_block,
                          activation=activation, clamp_alpha=clamp_alpha, clamp_limit=clamp_limit, group=group,
                          first=first, tiled=tiled)
    gd, bd, md, rd = _down_format(group_size, bits, mode, row_block, group_size_down, bits_down, mode_down,
                                  row_block_down)
    return quantized_down(h, wq_down, scales_down, biases_down, bias=bias_down, mode=md, bits=bd, group_size=gd,
                          row_block=rd, out_dtype=out_dtype, tiled=tiled)


def _check_no_grad(*tensors) -> None:
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise RuntimeError(_g._NO_BACKWARD)


def gate_up(x: Tensor, w: Tensor, w_up: Optional[Tensor] = None, bias: Optional[Tensor] = None,
            bias_up: Optional[Tensor] = None, *, activation="silu", clamp_alpha: float = 1.702,
            clamp_limit: float = 7.0, group: int = 0, first="gate", storage="out_in", alpha: float = 1.0,
            out_dtype: Optional[torch.dtype] = None, out: Optional[Tensor] = None, return_preact: bool = False,
            preact_dtype: Optional[torch.dtype] = None):
    """act(alpha * x @ Wg^T + bg) * (alpha * x @ Wu^T + bu) as a PyTorch op.

    x is [..., K] (nn.Linear style; with batched [L, rows, K] weights, x is
    [L, M, K]). w is the fused [2U, K] gate/up weight (stacked when group=0),
    or with w_up the gate weight, w_up the up weight. Names as in gatedmlp:
    activation ("silu", "gelu_tanh", "gelu_erf", "relu", "swiglu_clamped" with
    clamp_alpha and clamp_limit), first ("gate" / "up"), storage ("out_in" /
    "in_out"). Returns y [..., U], or (y, preact) with return_preact; with
    out= it writes into out and returns it.
    """
    _check_no_grad(x, w, w_up, bias, bias_up)
    act = activation if activation in _ACTIVATIONS else activation_name(activation)
    first = first if first in _HALVES else _name(first, _HALVES, "first")
    storage = storage if storage in _STORAGES else _name(storage, _STORAGES, "storage")
    clamp_alpha = float(clamp_alpha)
    clamp_limit = float(clamp_limit)
    alpha = float(alpha)
    if not return_preact and x.is_cuda and type(x) is Tensor and not _traced():
        if out is None:
            return _gate_up_direct(x, w, w_up, bias, bias_up, act, clamp_alpha, clamp_limit, group, first, storage,
                                   alpha, out_dtype)
        _gate_up_out_impl(x, w, w_up, bias, bias_up, out, act, clamp_alpha, clamp_limit, group, first, storage,
                          alpha)
        return out
    if out is not None:
        if return_preact:
            raise TypeError("gatedmlp: return_preact is not available with out=")
        torch.ops.gatedmlp.gate_up_out(x, w, w_up, bias, bias_up, out,
                                       _options_string(act, clamp_alpha, clamp_limit, group, first, storage, alpha,
                                                       None, None))
        return out
    if return_preact:
        return torch.ops.gatedmlp.gate_up_preact(x, w, w_up, bias, bias_up,
                                                 _options_string(act, clamp_alpha, clamp_limit, group, first, storage,
                                                                 alpha, out_dtype, preact_dtype))
    return torch.ops.gatedmlp.gate_up(x, w, w_up, bias, bias_up,
                                      _options_string(act, clamp_alpha, clamp_limit, group, first, storage, alpha,
                                                      out_dtype, None))


# ---------------------------------------------------------------- the module
def _activation_of_module(act: nn.Module) -> str:
    # Imported here: gatedmlp.hf imports this module.
    from gatedmlp.hf import activation_of_module

    return activation_of_module(act)


class GatedMLP(nn.Module):
    """down_proj(act(gate_proj(x)) * up_proj(x)) with the gate/up half fused.

    A drop-in for the MLP of Llama, Qwen, Mistral, Gemma and similar models.
    The gate and up projections live stacked in ``gate_up_proj`` (an
    nn.Linear of [2U, K]: rows [0, U) are the gate, [U, 2U) the up). Loading
    a Hugging Face state dict (gate_proj.weight, up_proj.weight,
    down_proj.weight and optional biases) stacks them once, at load time; a
    state dict with gate_up_proj.* loads as is.

    activation: "silu" (SwiGLU), "gelu_tanh", "gelu_erf", "relu",
    "swiglu_clamped" (gpt-oss, with clamp_alpha and clamp_limit), or a
    Hugging Face hidden_act name. bias: biases on all three projections
    (Llama's mlp_bias, gpt-oss).

    Inference only for now: forward raises when a gradient would be needed
    (grad enabled and x or the gate/up weights requiring grad). Use
    torch.no_grad() / torch.inference_mode(), or requires_grad_(False).
    """

    def __init__(self, hidden_size: int, intermediate_size: int, *, bias: bool = False, activation="silu",
                 clamp_alpha: float = 1.702, clamp_limit: float = 7.0, device=None, dtype=None):
        super().__init__()
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.activation = activation_name(activation)
        self.clamp_alpha = float(clamp_alpha)
        self.clamp_limit = float(clamp_limit)
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias, device=device, dtype=dtype)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias, device=device, dtype=dtype)

    @classmethod
    def from_module(cls, mlp: nn.Module, activation=None, **kwargs) -> "GatedMLP":
        """A GatedMLP with the weights of a module that has gate_proj, up_proj
        and down_proj (nn.Linear) and act_fn. The activation is read from
        act_fn unless given."""
        gate = mlp.gate_proj
        if activation is None:
            activation = _activation_of_module(mlp.act_fn)
        self = cls(gate.in_features, gate.out_features, bias=gate.bias is not None, activation=activation,
                   device=gate.weight.device, dtype=gate.weight.dtype, **kwargs)
        self.load_state_dict({k: v for k, v in mlp.state_dict().items()
                              if k.split(".", 1)[0] in ("gate_proj", "up_proj", "down_proj")})
        return self

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # Hugging Face layout -> stacked [gate; up], once, here.
        for kind in ("weight", "bias"):
            g, u = f"{prefix}gate_proj.{kind}", f"{prefix}up_proj.{kind}"
            if g not in state_dict and u not in state_dict:
                continue
            if g not in state_dict or u not in state_dict:
                error_msgs.append(f"gatedmlp: {g} and {u} must be given together")
                continue
            gate, up = state_dict.pop(g), state_dict.pop(u)
            if gate.shape != up.shape:
                error_msgs.append(f"gatedmlp: {g} {tuple(gate.shape)} and {u} {tuple(up.shape)} differ in shape")
                continue
            state_dict[f"{prefix}gate_up_proj.{kind}"] = torch.cat([gate, up], dim=0)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def forward(self, x: Tensor) -> Tensor:
        w, b = self.gate_up_proj.weight, self.gate_up_proj.bias
        _check_no_grad(x, w, b)
        if not x.is_cuda or type(x) is not Tensor or _traced():
            h = torch.ops.gatedmlp.gate_up(x, w, None, b, None,
                                           _options_string(self.activation, self.clamp_alpha, self.clamp_limit, 0,
                                                           "gate", "out_in", 1.0, None, None))
        else:
            h = _gate_up_direct(x, w, None, b, None, self.activation, self.clamp_alpha, self.clamp_limit, 0, "gate",
                                "out_in", 1.0, None)
        return self.down_proj(h)

    def extra_repr(self) -> str:
        s = f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, activation={self.activation}"
        if self.activation == "swiglu_clamped":
            s += f", clamp_alpha={self.clamp_alpha}, clamp_limit={self.clamp_limit}"
        return s


# Last: gatedmlp.hf imports this module. Its table of Hugging Face
# `hidden_act` names is activation_name's too.
from gatedmlp.hf import HF_ACTIVATIONS as _HF_ACTIVATIONS, patch_model  # noqa: E402
from gatedmlp.quantized_module import QuantizedGatedMLP  # noqa: E402,F401
from gatedmlp.moe_module import MoEExperts  # noqa: E402,F401
from gatedmlp.fp8_module import Fp8GatedMLP  # noqa: E402,F401
