"""Fp8GatedMLP: a gated MLP on FP8 activations and FP8 weights (Hopper,
sm_90), holding an FP8 checkpoint's tensors under the checkpoint's own names.

    y = down_proj(act(gate_proj(x)) * up_proj(x))

gate/up is one :func:`gatedmlp.fp8_gate_up` launch: x (bf16 or fp16) is
quantized to float8_e4m3fn, then the e4m3 gate and up weights multiply it on
the tensor cores with their scales applied to the fp32 sums, and the GLU is
applied before anything is written. The weights and scales are used as they
are: gate and up stay two tensors, each with its own scale (per tensor, per
output channel, or DeepSeek-V3's 128 x 128 blocks), never stacked or
requantized.

How x is quantized (what the checkpoint's own forward does):

- a static per-tensor input scale (``activation_scale`` of transformers'
  ``FP8Linear`` with ``activation_scheme="static"``, ``input_scale`` of
  compressed-tensors): x_e4m3 = clamp(x / s, +-448). Where gate and up carry
  different input scales, the larger is used for both (as vLLM does for its
  fused gate_up), so no value clips that either scale would have kept;
- otherwise dynamically, with :func:`gatedmlp.quantize_fp8`: per 1 x 128
  group of a row (``"block"``, DeepSeek-V3's activation scales) for 128 x 128
  block weights, per token (``"row"``) for per-tensor and per-channel
  weights. fbgemm's ``input_scale_ub`` (the upper bound its per-row
  quantization puts on a row's amax) is honoured by clamping x to it first.

The down projection keeps h = act(g) * u in x's dtype: where down_proj holds
FP8 e4m3 weights with per-tensor, per-channel or 128 x 128 block scales, it
is :func:`gatedmlp.torch.quantized_down` with mode "fp8_e4m3" (the FP8
weight-only kernel QuantizedGatedMLP runs: the e4m3 weights streamed as they
are, 16-bit activations, fp32 sums); anything else (a down_proj left in
bf16 by the checkpoint's modules_to_not_convert, or FP8 in a form that kernel
does not take) is the original module, called as it is. The library has no
FP8-activation down projection (FP8 activations are gate_up only), so h is
not rounded to e4m3 a second time: the result is, if anything, closer to the
exact one than the checkpoint's own all-FP8 forward. A static input scale on
down_proj is kept (state_dict) but unused, for that reason.

``Fp8GatedMLP.from_module`` builds one from a transformers MLP whose
gate_proj and up_proj are transformers' ``FP8Linear``
(transformers.integrations.finegrained_fp8: ``weight`` e4m3 with
``weight_scale_inv`` [ceil(out / 128), ceil(in / 128)] for block_size
(128, 128), or one value for block_size None; ``activation_scale`` when
static) or ``FbgemmFp8Linear`` (transformers.integrations.fbgemm_fp8:
``weight_scale`` [out, 1]), taking their tensors over (no copy).
``gatedmlp.hf.patch_model`` swaps such MLPs in a model, when their forward
is one it knows (as for 16-bit MLPs). ``state_dict()`` writes the
checkpoint's keys (gate_proj.weight, gate_proj.weight_scale_inv, ...), in
its order, dtypes and shapes.

Inference only, like the other modules: forward raises where a gradient
would be needed (grad enabled and x, a weight or a bias requiring grad).
gate/up goes through the ``gatedmlp::fp8_gate_up`` operator
(:func:`gatedmlp.torch.fp8_gate_up`), so torch.compile traces it without a
graph break.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor, nn

import gatedmlp as _g
from gatedmlp.fp8 import fp8_bytes

__all__ = ["Fp8GatedMLP"]

BLOCK = 128  # the side of a weight block scale's block, and the width of x's dynamic groups
E4M3_MAX = 448.0
_FP8 = torch.float8_e4m3fn
_SCALE_KINDS = ("block", "channel", "tensor")
_SCALE_NAMES = ("weight_scale_inv", "weight_scale")
_INPUT_SCALE_NAMES = ("input_scale", "activation_scale")
_SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_BIAS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The down projection's QuantFormat (group_size, row_block) per weight-scale kind.
_DOWN_FORMAT = {"block": (BLOCK, BLOCK), "channel": (0, 1), "tensor": (0, 0)}

# transformers' FP8 linear classes gatedmlp reads, by module and name (so
# that transformers need not be imported): exactly these classes (not
# subclasses such as FP8GroupedLinear, which computes something else).
_FP8_LINEARS: Dict[Tuple[str, str], str] = {
    ("transformers.integrations.finegrained_fp8", "FP8Linear"): "finegrained",
    ("transformers.integrations.fbgemm_fp8", "FbgemmFp8Linear"): "fbgemm",
}
_KNOWN = "transformers' FP8Linear or FbgemmFp8Linear"


def _blocks(n: int) -> int:
    return -(-n // BLOCK)


def _dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def _invalid(message: str) -> Exception:
    return _g.InvalidArgumentError("gatedmlp: " + message)


def _not_supported(message: str) -> Exception:
    e = _g.NotSupportedError(message)
    e.code = _g.StatusCode.not_supported
    return e


# ---------------------------------------------------------------- one projection
class _Fp8Projection(nn.Module):
    """One FP8 projection's tensors, named as the checkpoint names them:
    ``weight`` float8_e4m3fn [out, in], ``bias`` (optional), the weight scale
    (``scale_name``: block [ceil(out / 128), ceil(in / 128)], channel
    [out, 1] or tensor []) and the static input scale (``input_scale_name``,
    one value; None: dynamic). Parameters (requires_grad False when built
    here), as transformers' FP8 linears hold them; from_module takes the
    source module's over, in its order."""

    def __init__(self, out_features: int, in_features: int, *, scales: str = "block",
                 scale_name: str = "weight_scale_inv", input_scale_name: Optional[str] = None, bias: bool = False,
                 bias_dtype=torch.float32, device=None):
        super().__init__()
        self.out_features, self.in_features = out_features, in_features
        self.scales, self.scale_name, self.input_scale_name = scales, scale_name, input_scale_name

        def param(shape, dtype):
            return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)

        # FP8Linear's order: weight, bias, weight_scale_inv, activation_scale.
        self.weight = param((out_features, in_features), _FP8)
        self.register_parameter("bias", param((out_features,), bias_dtype) if bias else None)
        shape = {"block": (_blocks(out_features), _blocks(in_features)), "channel": (out_features, 1),
                 "tensor": ()}[scales]
        self.register_parameter(scale_name, param(shape, torch.float32))
        if input_scale_name is not None:
            self.register_parameter(input_scale_name, param((), torch.float32))

    @classmethod
    def _take(cls, src: nn.Module, scales: str, scale_name: str, input_scale_name: Optional[str]):
        """A projection holding src's parameters and buffers themselves (the
        same objects, in src's order: state_dict() writes src's entries)."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.out_features, self.in_features = src.weight.shape
        self.scales, self.scale_name, self.input_scale_name = scales, scale_name, input_scale_name
        for name, p in src._parameters.items():
            self._parameters[name] = p
        for name, b in src._buffers.items():
            self._buffers[name] = b
        self._non_persistent_buffers_set = set(src._non_persistent_buffers_set)
        self.train(src.training)
        return self

    # (Not properties named like the tensors: "input_scale" is a checkpoint's name.)
    def w_scale(self) -> Tensor:
        """The weight scale, whatever the checkpoint calls it."""
        return getattr(self, self.scale_name)

    def x_scale(self) -> Optional[Tensor]:
        """The static input scale, or None (dynamic)."""
        return None if self.input_scale_name is None else getattr(self, self.input_scale_name)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # A one-value scale comes as [] or [1] (or [1, 1]): kept in the
        # checkpoint's shape, so that state_dict() gives it back as it came.
        for name in (self.scale_name, self.input_scale_name):
            if name is None:
                continue
            key, own = prefix + name, self._parameters.get(name)
            if own is not None and key in state_dict and own.numel() == 1 and state_dict[key].numel() == 1 \
                    and own.shape != state_dict[key].shape:
                self._parameters[name] = nn.Parameter(own.detach().reshape(state_dict[key].shape),
                                                      requires_grad=own.requires_grad)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def extra_repr(self) -> str:
        s = f"in_features={self.in_features}, out_features={self.out_features}, scales={self.scales}"
        if self.input_scale_name is not None:
            s += f", {self.input_scale_name} (static)"
        return s + f", bias={self.bias is not None}"


# ---------------------------------------------------------------- the module
class Fp8GatedMLP(nn.Module):
    """down_proj(act(gate_proj(x)) * up_proj(x)) on FP8 activations and FP8
    weights; gate/up in one gatedmlp.fp8_gate_up launch (sm_90 only).

    hidden_size (a multiple of 16: x's e4m3 rows are read in 16-byte boxes)
    and intermediate_size (a multiple of 4: the down projection reads FP8
    weights four to a word). fp8_scales: the weights' scale granularity,
    "block" (128 x 128: [ceil(out / 128), ceil(in / 128)]), "channel"
    ([out, 1]) or "tensor" (one value); fp8_scale_name: the checkpoint's name
    for it ("weight_scale_inv" or "weight_scale"; a multiplier whatever its
    name). input_scale_name: the checkpoint's name for a static per-tensor
    activation scale ("input_scale", "activation_scale"), or None: x is
    quantized dynamically (see the module docstring). bias: biases on all
    three projections, of bias_dtype (float32, as transformers' FP8 linears
    make them). activation: as for GatedMLP ("silu", "gelu_tanh",
    "gelu_erf", "relu", "swiglu_clamped" with clamp_alpha and clamp_limit,
    or a Hugging Face hidden_act name).

    Build it and load_state_dict() the checkpoint's MLP tensors
    (gate_proj.weight, gate_proj.<fp8_scale_name>, ...), or take a
    transformers FP8 MLP's with from_module(). forward(x [..., hidden_size],
    bf16 or fp16) returns [..., hidden_size] in x's dtype; an empty batch
    returns an empty result without a launch. Inference only.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, *, fp8_scales: str = "block",
                 fp8_scale_name: str = "weight_scale_inv", input_scale_name: Optional[str] = None,
                 bias: bool = False, activation="silu", clamp_alpha: float = 1.702, clamp_limit: float = 7.0,
                 bias_dtype=torch.float32, device=None):
        super().__init__()
        from gatedmlp.torch import activation_name  # the one table of activation names

        if fp8_scales not in _SCALE_KINDS:
            raise _invalid(f"fp8_scales={fp8_scales!r} is not one of " + ", ".join(map(repr, _SCALE_KINDS)))
        if fp8_scale_name not in _SCALE_NAMES:
            raise _invalid(f"fp8_scale_name={fp8_scale_name!r} is not one of " + ", ".join(map(repr, _SCALE_NAMES)))
        if input_scale_name is not None and input_scale_name not in _INPUT_SCALE_NAMES:
            raise _invalid(f"input_scale_name={input_scale_name!r} is not None or one of "
                           + ", ".join(map(repr, _INPUT_SCALE_NAMES)))
        for name, n, mult, why in (("hidden_size", hidden_size, 16, "x's e4m3 rows are read in 16-byte boxes"),
                                   ("intermediate_size", intermediate_size, 4,
                                    "the down projection reads FP8 weights four to a word")):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1 or n % mult:
                raise _invalid(f"{name}={n!r} is not a positive multiple of {mult} ({why})")
        if bias_dtype not in _BIAS_DTYPES:
            raise _invalid(f"bias_dtype={bias_dtype} is not torch.float32, torch.bfloat16 or torch.float16")
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.fp8_scales = fp8_scales
        self.activation = activation_name(activation)
        self.clamp_alpha, self.clamp_limit = float(clamp_alpha), float(clamp_limit)
        # fp8_gate_up's promote: per-tensor / per-channel weights with each
        # 128-deep k-block's sums promoted to fp32 (torch._scaled_mm's
        # accuracy, at 1.2-1.5x the time); block weights always are.
        self.promote = False
        self.replaces = ""
        proj = dict(scales=fp8_scales, scale_name=fp8_scale_name, input_scale_name=input_scale_name, bias=bias,
                    bias_dtype=bias_dtype, device=device)
        self.gate_proj = _Fp8Projection(intermediate_size, hidden_size, **proj)
        self.up_proj = _Fp8Projection(intermediate_size, hidden_size, **proj)
        self.down_proj = _Fp8Projection(hidden_size, intermediate_size, **proj)

    # ------------------------------------------------------------ building from transformers
    @classmethod
    def from_module(cls, mlp: nn.Module, activation=None) -> "Fp8GatedMLP":
        """An Fp8GatedMLP computing what the transformers MLP `mlp` does,
        holding its tensors (the same parameters, no copy): mlp.gate_proj and
        mlp.up_proj must be transformers' FP8Linear (block_size (128, 128) or
        None, float scales, activation_scheme "dynamic" or "static" with one
        activation_scale) or FbgemmFp8Linear, both of one kind and format,
        with or without biases alike; mlp.down_proj is taken over likewise
        when it is such a module, else used as it is (see the module
        docstring). The activation is read from mlp.act_fn unless given.
        Raises gatedmlp.NotSupportedError naming the projection and why
        otherwise. mlp's forward is not checked here (patch_model checks it)."""
        plan, why = _plan(mlp, activation=activation, check_forward=False)
        if plan is None:
            raise _not_supported(f"gatedmlp: cannot build an Fp8GatedMLP from {type(mlp).__qualname__}: {why}")
        return cls._from_plan(mlp, plan)

    @classmethod
    def _from_plan(cls, old: nn.Module, plan: "_Fp8Plan") -> "Fp8GatedMLP":
        # Built on meta (nothing allocated), then given old's tensors.
        new = cls(plan.hidden_size, plan.intermediate_size, fp8_scales=plan.fp8_scales,
                  fp8_scale_name=plan.scale_name, input_scale_name=plan.input_scale_name, bias=plan.bias,
                  activation=plan.activation, device="meta")
        new.gate_proj = _Fp8Projection._take(old.gate_proj, plan.fp8_scales, plan.scale_name, plan.input_scale_name)
        new.up_proj = _Fp8Projection._take(old.up_proj, plan.fp8_scales, plan.scale_name, plan.input_scale_name)
        if plan.down is None:
            new.down_proj = old.down_proj
        else:
            new.down_proj = _Fp8Projection._take(old.down_proj, *plan.down)
        new.replaces = plan.replaces
        new.train(old.training)
        return new

    # ------------------------------------------------------------ forward
    def _quantize_x(self, x2: Tensor) -> Tuple[Tensor, Tensor]:
        """(x_e4m3 [M, K], x_scale) as the checkpoint's forward quantizes x."""
        sg, su = self.gate_proj.x_scale(), self.up_proj.x_scale()
        if sg is not None:  # static, per tensor: one x for both halves, the larger scale
            s = sg if su is None or su is sg else torch.maximum(sg.detach(), su.detach())
            s = s.detach().reshape(1).float()
            q = (x2.float() / s).clamp(-E4M3_MAX, E4M3_MAX).to(_FP8)
            return q, s
        ub = self.gate_proj._buffers.get("input_scale_ub")
        if ub is not None:  # fbgemm: a row's amax is at most input_scale_ub
            x2 = torch.clamp(x2, min=-ub, max=ub)
        return _g.quantize_fp8(x2, "block" if self.fp8_scales == "block" else "row")

    def forward(self, x: Tensor) -> Tensor:
        from gatedmlp.torch import quantized_down

        hidden = self.hidden_size
        if not isinstance(x, Tensor):
            raise TypeError(f"gatedmlp: 'x' must be a torch.Tensor, got {type(x).__module__}.{type(x).__qualname__}")
        if torch.is_grad_enabled() and x.requires_grad:  # quantizing x would drop its gradient silently
            raise RuntimeError(_g._NO_BACKWARD)
        if x.dtype not in (torch.bfloat16, torch.float16):
            raise _invalid(f"'x' must be bfloat16 or float16 (it is quantized to float8_e4m3fn here), got "
                           f"{_dtype_name(x.dtype)}")
        if x.dim() < 1 or x.shape[-1] != hidden:
            raise _invalid(f"'x' must be [..., hidden_size] = [..., {hidden}], got shape {tuple(x.shape)}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, hidden)
        if x2.shape[0] == 0 or x.device.type == "meta":  # nothing to compute (or only shapes to trace)
            return x.new_empty((*lead, hidden))
        g, u = self.gate_proj, self.up_proj
        xq, xs = self._quantize_x(x2)
        from gatedmlp.torch import fp8_gate_up  # the operator: no graph break under torch.compile

        h = fp8_gate_up(xq, xs, g.weight, g.w_scale(), w_up=u.weight, w_up_scale=u.w_scale(), bias=g.bias,
                        bias_up=u.bias, out_dtype=x.dtype, activation=self.activation, clamp_alpha=self.clamp_alpha,
                        clamp_limit=self.clamp_limit, promote=self.promote)
        # The down projection: FP8 e4m3 weights go to the library's FP8
        # weight-only kernel (quantized_down, what QuantizedGatedMLP runs; it
        # takes 128 x 128 block, per-channel and per-tensor scales) with h in
        # x's dtype, since FP8 activations are gate_up only; anything else
        # is the checkpoint's own module, called as it is (no dequantized
        # copy is ever made).
        d = self.down_proj
        if isinstance(d, _Fp8Projection):
            group_size, row_block = _DOWN_FORMAT[d.scales]
            s = d.w_scale()  # as the kernel takes it: [1], [H, 1] or the blocks
            s = s.reshape(1) if d.scales == "tensor" else s.reshape(-1, 1) if d.scales == "channel" else s
            y = quantized_down(h, fp8_bytes(torch, d.weight), s, bias=d.bias, mode="fp8_e4m3", bits=8,
                               group_size=group_size, row_block=row_block)
        else:
            y = d(h)
        return y.reshape(*lead, y.shape[-1])

    def extra_repr(self) -> str:
        g = self.gate_proj
        x = (f"static {g.input_scale_name}" if g.input_scale_name is not None
             else "dynamic per 1x128 group" if self.fp8_scales == "block" else "dynamic per token")
        down = "fp8" if isinstance(self.down_proj, _Fp8Projection) else type(self.down_proj).__name__
        s = (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
             f"fp8_scales={self.fp8_scales}, x={x}, down={down}, activation={self.activation}")
        if self.activation == "swiglu_clamped":
            s += f", clamp_alpha={self.clamp_alpha}, clamp_limit={self.clamp_limit}"
        if self.replaces:
            s += f", replaces={self.replaces}"
        return s


# ---------------------------------------------------------------- recognition (patch_model, from_module)
@dataclass
class _Fp8Plan:
    family: str                    # "finegrained" (FP8Linear) or "fbgemm" (FbgemmFp8Linear)
    activation: str                # gatedmlp name
    hidden_size: int
    intermediate_size: int
    fp8_scales: str                # "block", "channel", "tensor" (gate and up)
    scale_name: str
    input_scale_name: Optional[str]
    bias: bool                     # gate/up biases
    # An FP8 down_proj's (scales, scale_name, input_scale_name); None: called as is.
    down: Optional[Tuple[str, str, Optional[str]]]
    replaces: str                  # the class swapped out, for repr


def _family(m) -> Optional[str]:
    return _FP8_LINEARS.get((type(m).__module__, type(m).__qualname__))


def _is_fp8_mlp(m: nn.Module) -> bool:
    """A module with gate_proj, up_proj and down_proj of which gate_proj or
    up_proj is one of transformers' FP8 linears: patch_model plans these
    here, swapping or refusing them."""
    mods = m._modules
    return ({"gate_proj", "up_proj", "down_proj"} <= set(mods)
            and (_family(mods["gate_proj"]) is not None or _family(mods["up_proj"]) is not None))


def _linear_format(name: str, m) -> Tuple[Optional[Tuple[str, str, str, Optional[str]]], str]:
    """((family, scales, scale_name, input_scale_name), "") for one of
    transformers' FP8 linears gatedmlp reads as it is, else (None, why)."""
    family = _family(m)
    if family is None:
        return None, f"{name} is a {type(m).__name__}, not {_KNOWN}"
    w = m._parameters.get("weight")
    if not isinstance(w, Tensor) or w.dtype != _FP8:
        what = _dtype_name(w.dtype) if isinstance(w, Tensor) else type(w).__name__
        return None, (f"{name}.weight is {what}, not float8_e4m3fn (a dequantized or FP4 checkpoint; "
                      "gatedmlp's FP8 path takes e4m3 weights)")
    if w.dim() != 2 or tuple(w.shape) != (m.out_features, m.in_features):
        return None, (f"{name}.weight has shape {tuple(w.shape)}, not [out_features, in_features] = "
                      f"[{m.out_features}, {m.in_features}]")
    out, k = w.shape
    if family == "finegrained":
        bs = getattr(m, "block_size", None)
        if bs is None:
            scales = "tensor"
        elif tuple(int(b) for b in bs) == (BLOCK, BLOCK):
            scales = "block"
        else:
            return None, (f"{name} has block_size {tuple(bs)}; gatedmlp takes 128 x 128 block scales "
                          "(block_size (128, 128)) or one per tensor (block_size None)")
        scale_name = "weight_scale_inv"
        scheme = getattr(m, "activation_scheme", None)
        a = m._parameters.get("activation_scale", getattr(m, "activation_scale", None))
        if scheme == "dynamic":
            if a is not None:
                return None, f"{name} has activation_scheme 'dynamic' but holds an activation_scale"
            input_name = None
        elif scheme == "static":
            if not isinstance(a, Tensor) or a.numel() != 1:
                what = "none" if a is None else f"shape {tuple(a.shape)}" if isinstance(a, Tensor) else type(a).__name__
                return None, (f"{name} has activation_scheme 'static' with activation_scale of {what}; gatedmlp "
                              "honours one static scale per tensor")
            if a.dtype not in _SCALE_DTYPES:
                return None, f"{name}.activation_scale is {_dtype_name(a.dtype)}, not float32, bfloat16 or float16"
            input_name = "activation_scale"
        else:
            return None, f"{name} has activation_scheme {scheme!r}; gatedmlp takes 'dynamic' or 'static'"
    else:
        scales, scale_name, input_name = "channel", "weight_scale", None
        ub = m._buffers.get("input_scale_ub")
        if ub is not None and ub.numel() != 1:
            return None, f"{name}.input_scale_ub has shape {tuple(ub.shape)}, not one value"
        if ub is not None and not ub.is_meta and not float(ub.reshape(())) > 0:
            return None, (f"{name}.input_scale_ub is {float(ub.reshape(()))}: not set (transformers' fbgemm "
                          "quantizer sets it to activation_scale_ub when it loads the model)")
    s = m._parameters.get(scale_name, getattr(m, scale_name, None))
    if not isinstance(s, Tensor):
        return None, f"{name} has no {scale_name} tensor"
    if s.dtype not in _SCALE_DTYPES:
        extra = " (scale_fmt='ue8m0' is not supported)" if "e8m0" in str(s.dtype) else ""
        return None, f"{name}.{scale_name} is {_dtype_name(s.dtype)}, not float32, bfloat16 or float16{extra}"
    ok = {"block": tuple(s.shape) == (_blocks(out), _blocks(k)),
          "channel": tuple(s.shape) in ((out, 1), (out,)),
          "tensor": s.numel() == 1 and s.dim() <= 2}[scales]
    if not ok:
        want = {"block": f"[ceil(out / 128), ceil(in / 128)] = [{_blocks(out)}, {_blocks(k)}]",
                "channel": f"[out, 1] = [{out}, 1]", "tensor": "one value"}[scales]
        return None, f"{name}.{scale_name} has shape {tuple(s.shape)}, not {want} ({scales} scales)"
    b = m._parameters.get("bias")
    if b is not None and (tuple(b.shape) != (out,) or b.dtype not in _BIAS_DTYPES):
        return None, f"{name}.bias is {_dtype_name(b.dtype)} {tuple(b.shape)}, not [{out}] of a float dtype"
    return (family, scales, scale_name, input_name), ""


def _describe(fmt) -> str:
    family, scales, scale_name, input_name = fmt
    x = f"static {input_name}" if input_name else "dynamic activations"
    return f"{'FbgemmFp8Linear' if family == 'fbgemm' else 'FP8Linear'} with {scales} {scale_name}, {x}"


def _plan(mlp: nn.Module, *, activation=None, check_forward: bool = True) -> Tuple[Optional[_Fp8Plan], str]:
    """How to build an Fp8GatedMLP from mlp, or (None, why not). With
    check_forward (patch_model): also mlp's forward, hooks, own state and
    activation module, as for 16-bit MLPs."""
    from gatedmlp.hf import _identify_activation, _match_forward, _state_or_hooks

    children = dict(mlp.named_children())
    for p in ("gate_proj", "up_proj", "down_proj"):
        if p not in children:
            return None, f"it has no {p}"
    gate, up, down = children["gate_proj"], children["up_proj"], children["down_proj"]
    fg, why = _linear_format("gate_proj", gate)
    if fg is None:
        return None, why
    fu, why = _linear_format("up_proj", up)
    if fu is None:
        return None, why
    if fg != fu:
        return None, f"gate_proj and up_proj differ in format (gate_proj: {_describe(fg)}; up_proj: {_describe(fu)})"
    family, scales, scale_name, input_name = fg
    u, k = gate.weight.shape
    if tuple(up.weight.shape) != (u, k):
        return None, f"gate_proj is [{u}, {k}] but up_proj is [{up.weight.shape[0]}, {up.weight.shape[1]}]"
    bg, bu = gate._parameters.get("bias"), up._parameters.get("bias")
    if (bg is None) != (bu is None):
        return None, "gate_proj and up_proj differ in having a bias"
    if bg is not None and bg.dtype != bu.dtype:
        return None, (f"gate_proj.bias is {_dtype_name(bg.dtype)} but up_proj.bias is {_dtype_name(bu.dtype)}; "
                      "the kernel reads both in one dtype")
    if family == "fbgemm":
        ubg, ubu = gate._buffers.get("input_scale_ub"), up._buffers.get("input_scale_ub")
        if (ubg is None) != (ubu is None) or (
                ubg is not None and not ubg.is_meta and not ubu.is_meta and not torch.equal(ubg.cpu(), ubu.cpu())):
            return None, "gate_proj and up_proj have different input_scale_ub (x is quantized once for both)"
    if k % 16:
        return None, f"its hidden size {k} is not a multiple of 16 (FP8 activations are read in 16-byte rows)"
    if u % 4:
        return None, f"its intermediate size {u} is not a multiple of 4 (FP8 weights are read four to a word)"

    d_in, d_out = getattr(down, "in_features", None), getattr(down, "out_features", None)
    if (d_in, d_out) != (u, k):
        return None, (f"down_proj maps {d_in} features to {d_out}; the gate/up half gives {u} and the MLP "
                      f"returns {k}")
    fd, _ = _linear_format("down_proj", down)
    down_plan = None if fd is None else fd[1:]  # not one the FP8 weight-only down kernel takes: called as is

    tensors = [t for m in (gate, up, down) for t in list(m.parameters()) + list(m.buffers())]
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        return None, f"its tensors are on several devices ({', '.join(sorted(map(str, devices)))})"

    if check_forward:
        why = _state_or_hooks(mlp, children)
        if why:
            return None, why
        match, why = _match_forward(mlp, "separate")
        if match is None:
            return None, why
        act_attr, drop_attr = match
        if drop_attr is not None:
            return None, f"its forward applies {drop_attr}, a dropout gatedmlp's FP8 path does not take"
        name, why = _identify_activation(children[act_attr])
        if name is None:
            return None, why
        if activation is None:
            activation = name
        for n in children:
            if n not in ("gate_proj", "up_proj", "down_proj", act_attr) and (
                    any(True for _ in children[n].parameters()) or any(True for _ in children[n].buffers())):
                return None, f"its child {n} ({type(children[n]).__name__}) has parameters or buffers"
    if activation is None:
        act = children.get("act_fn")
        if act is None:
            return None, "it has no act_fn to read the activation from; pass activation="
        activation, why = _identify_activation(act)
        if activation is None:
            return None, f"cannot tell which activation act_fn is ({why}); pass activation="
    from gatedmlp.torch import activation_name

    return _Fp8Plan(family, activation_name(activation), k, u, scales, scale_name, input_name, bg is not None,
                    down_plan, type(mlp).__qualname__), ""
