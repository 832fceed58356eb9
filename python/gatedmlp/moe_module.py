"""MoEExperts: the experts of a Mixture-of-Experts layer on gatedmlp's
gathered kernels, and its recognition of transformers' experts modules.

``MoEExperts`` holds every expert's weights stacked, ``w13`` [E, 2I, H]
(the fused gate/up rows, interleaved by ``group``, ``first`` half first) and
``w2`` [E, H, I], with optional biases ``b13`` [E, 2I] and ``b2`` [E, H],
and has the call signature of transformers' experts modules::

    experts(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H]
        = sum_j top_k_weights[:, j] * down_e(act(gate_e(x)) * up_e(x)),  e = top_k_index[:, j]

computed by :func:`gatedmlp.moe_mlp` (the gathered decode path, or the grouped
prefill path from 32 rows per expert; see there). The
router stays the model's.

``MoEExperts.from_module`` builds one from transformers'
``Qwen3MoeExperts`` and ``MixtralExperts`` (``gate_up_proj`` [E, 2I, H]
stacked gate-first and ``down_proj`` [E, H, I]: their parameters are taken
over as they are, no copy) and ``GptOssExperts`` (``gate_up_proj``
[E, H, 2I] with gate and up in the even and odd columns, ``down_proj``
[E, I, H]: copied once into [E, 2I, H] with group=1 and [E, H, I]; the
biases as they are; swiglu_clamped with the module's alpha and limit).
``gatedmlp.hf.patch_model`` swaps these modules in a model. State dicts keep
the transformers checkpoint's keys and shapes for a module built this way.

Inference only, like the other modules: forward raises when a gradient
would be needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor, nn

import gatedmlp as _g
from gatedmlp._ops import operator as _operator

__all__ = ["MoEExperts"]

_HALVES = ("gate", "up")

# transformers' experts classes gatedmlp computes, by module and name (so
# that transformers need not be imported), and how their weights are laid
# out: "stacked" (gate_up_proj [E, 2I, H] = [gate; up] per expert, down_proj
# [E, H, I]) or "gpt_oss" (gate_up_proj [E, H, 2I] with gate/up in the even
# and odd columns, down_proj [E, I, H], biases, a clamped SwiGLU).
_EXPERTS_CLASSES: Dict[Tuple[str, str], str] = {
    ("transformers.models.qwen3_moe.modeling_qwen3_moe", "Qwen3MoeExperts"): "stacked",
    ("transformers.models.mixtral.modeling_mixtral", "MixtralExperts"): "stacked",
    ("transformers.models.gpt_oss.modeling_gpt_oss", "GptOssExperts"): "gpt_oss",
}

# The flags transformers' use_experts_implementation decorator sets on each
# kind (its other implementations of forward read them): any other value
# means a class that stores its weights otherwise.
_DECORATOR_FLAGS = {
    "stacked": dict(is_concatenated=True, is_transposed=False, has_bias=False, has_gate=True),
    "gpt_oss": dict(is_concatenated=False, is_transposed=True, has_bias=True, has_gate=True),
}

# What each kind's parameters are, in the checkpoint's names and order:
# (checkpoint name, MoEExperts name, transposed: the checkpoint holds the
# transpose of MoEExperts' tensor in its last two axes).
_CHECKPOINT_NAMES = {
    "stacked": (("gate_up_proj", "w13", False), ("down_proj", "w2", False)),
    "gpt_oss": (("gate_up_proj", "w13", True), ("gate_up_proj_bias", "b13", False), ("down_proj", "w2", True),
                ("down_proj_bias", "b2", False)),
}
_LAYOUTS = {"stacked": (0, "gate"), "gpt_oss": (1, "gate")}  # (group, first) of w13



def _not_supported(message: str) -> Exception:
    e = _g.NotSupportedError(message)
    e.code = _g.StatusCode.not_supported
    return e


# ---------------------------------------------------------------- the operator
def _moe_direct(x, topk_ids, topk_weights, w13, w2, b13, b2, activation, clamp_alpha, clamp_limit, group, first,
                check_indices):
    # check_indices: 0 off, 1 read back (IndexError), 2 on the device
    # (moe_mlp's "async": a device-side assertion, no synchronisation).
    # The read back cannot run while a stream is being captured into a CUDA
    # graph: there it checks on the device instead.
    check = _CHECKS.get(check_indices, _g._ASYNC)
    if check is True and x.is_cuda and torch.cuda.is_current_stream_capturing():
        check = _g._ASYNC
    params = _act_params(clamp_alpha, clamp_limit) if activation == "swiglu_clamped" else None
    return _g.moe_mlp(x, topk_ids, topk_weights, w13, w2, b13, b2, activation=activation, act_params=params,
                      group=group, first=first, check_indices=check)


_CHECKS = {0: False, 1: True, 2: "async"}  # the op's check_indices code -> moe_mlp's (_g._ASYNC is "async")


@_operator("moe_mlp")
def _moe_op(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, w13: Tensor, w2: Tensor, b13: Optional[Tensor],
            b2: Optional[Tensor], activation: str, clamp_alpha: float, clamp_limit: float, group: int, first: str,
            check_indices: int) -> Tensor:
    return _moe_direct(x, topk_ids, topk_weights, w13, w2, b13, b2, activation, clamp_alpha, clamp_limit, group,
                       first, check_indices)


@_moe_op.register_fake
def _moe_fake(x, topk_ids, topk_weights, w13, w2, b13, b2, activation, clamp_alpha, clamp_limit, group, first,
              check_indices):
    return x.new_empty(x.shape)


def _check_code(check) -> int:
    """The op's check_indices: 0 off, 1 read back, 2 on the device."""
    if isinstance(check, str):
        if check != _g._ASYNC:
            raise ValueError(f"gatedmlp: check_indices must be True, False or 'async', got {check!r}")
        return 2
    return 1 if check else 0


# ---------------------------------------------------------------- the module
class MoEExperts(nn.Module):
    """The experts of a Mixture-of-Experts layer, as transformers' experts
    modules are called: forward(hidden_states [T, H], top_k_index [T, k],
    top_k_weights [T, k]) -> [T, H], the routing weights applied to each
    expert's output (after its down bias) and the top-k summed.

    num_experts, hidden_size, intermediate_size: E, H, I. Parameters w13
    [E, 2I, H] (each expert's gate and up rows interleaved in blocks of
    `group` rows, `first` half first: group 0 is the stacked [gate; up]),
    w2 [E, H, I], and with bias=True b13 [E, 2I] (w13's row order) and b2
    [E, H]. activation: as for GatedMLP ("silu", "gelu_tanh", "gelu_erf",
    "relu", "swiglu_clamped" with clamp_alpha and clamp_limit, or a Hugging
    Face hidden_act name).

    checkpoint_layout: None (the state dict holds w13, w2, b13, b2), or the
    transformers layout the module stands in for, whose keys, shapes and
    row order its state dict then has and which it loads: "stacked"
    (Qwen3-MoE, Mixtral: gate_up_proj = w13, down_proj = w2; group 0, first
    gate) or "gpt_oss" (gate_up_proj [E, H, 2I], gate_up_proj_bias,
    down_proj [E, I, H], down_proj_bias; group 1, first gate). from_module
    sets it.

    Every expert id must be in [0, E). By default (check_indices =
    "async", an attribute) each forward checks on the device, with no
    synchronisation: a bad id -- such as the "masking index" E that
    transformers' eager forwards skip -- fails the stream with a
    device-side assertion, as an out-of-range index does in PyTorch's own
    kernels (reported at the next synchronisation; the CUDA context is
    lost). check_indices = True reads the check back instead (one
    synchronisation per forward, ~0.1 ms at one token) and raises
    IndexError, a recoverable error (on the device, as "async", while a CUDA
    graph is being captured); False drops the check, and a bad id then
    leaves the result undefined.

    Inference only: forward raises when a gradient would be needed (grad
    enabled and the input, the routing weights or a parameter requiring
    grad). Use torch.no_grad() / torch.inference_mode().
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *, bias: bool = False,
                 activation="silu", clamp_alpha: float = 1.702, clamp_limit: float = 7.0, group: int = 0,
                 first: str = "gate", checkpoint_layout: Optional[str] = None, replaces: str = "", device=None,
                 dtype=None):
        super().__init__()
        if min(num_experts, hidden_size, intermediate_size) < 1:
            raise _g.InvalidArgumentError(
                f"gatedmlp: MoEExperts needs num_experts, hidden_size and intermediate_size >= 1, got "
                f"{num_experts}, {hidden_size}, {intermediate_size}")
        if first not in _HALVES:
            raise _g.InvalidArgumentError(f"gatedmlp: first={first!r} is not one of {', '.join(_HALVES)}")
        group = int(group)
        if group < 0 or (group and intermediate_size % group):
            raise _g.InvalidArgumentError(
                f"gatedmlp: group={group} must be 0 (stacked) or divide intermediate_size={intermediate_size}")
        if checkpoint_layout is not None:
            if checkpoint_layout not in _CHECKPOINT_NAMES:
                raise _g.InvalidArgumentError(
                    f"gatedmlp: checkpoint_layout={checkpoint_layout!r} is not one of None, "
                    f"{', '.join(map(repr, _CHECKPOINT_NAMES))}")
            want = _LAYOUTS[checkpoint_layout]
            if ((group or intermediate_size), first) != ((want[0] or intermediate_size), want[1]):
                raise _g.InvalidArgumentError(
                    f"gatedmlp: checkpoint_layout={checkpoint_layout!r} stores w13 with group={want[0]}, "
                    f"first={want[1]!r}; got group={group}, first={first!r}")
            if (checkpoint_layout == "gpt_oss") != bool(bias):
                raise _g.InvalidArgumentError(f"gatedmlp: checkpoint_layout={checkpoint_layout!r} "
                                              f"{'has' if checkpoint_layout == 'gpt_oss' else 'has no'} biases")
        self.num_experts = int(num_experts)
        self.hidden_size = int(hidden_size)
        self.intermediate_size = int(intermediate_size)
        self.activation = activation_name(activation)
        self.clamp_alpha = float(clamp_alpha)
        self.clamp_limit = float(clamp_limit)
        self.group = group
        self.first = first
        self.checkpoint_layout = checkpoint_layout
        self.replaces = replaces
        self.check_indices = "async"
        e, h, i = self.num_experts, self.hidden_size, self.intermediate_size
        kw = dict(device=device, dtype=dtype)
        self.w13 = nn.Parameter(torch.empty(e, 2 * i, h, **kw))
        self.register_parameter("b13", nn.Parameter(torch.empty(e, 2 * i, **kw)) if bias else None)
        self.w2 = nn.Parameter(torch.empty(e, h, i, **kw))
        self.register_parameter("b2", nn.Parameter(torch.empty(e, h, **kw)) if bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Linear's initialisation, expert by expert."""
        if self.w13.is_meta:
            return
        with torch.no_grad():
            for w, b in ((self.w13, self.b13), (self.w2, self.b2)):
                bound = 1 / math.sqrt(w.shape[-1])
                w.uniform_(-bound, bound)
                if b is not None:
                    b.uniform_(-bound, bound)

    # ---------------------------------------------------------------- from transformers
    @classmethod
    def from_module(cls, experts: nn.Module, activation=None) -> "MoEExperts":
        """A MoEExperts computing what a transformers experts module
        (Qwen3MoeExperts, MixtralExperts, GptOssExperts) computes. Qwen3-MoE's
        and Mixtral's parameters are taken over as they are (the same
        nn.Parameter objects: no copy, tied to the original); gpt-oss's
        weights are copied once into MoEExperts' layout, its biases taken
        over. The activation is read from the module's act_fn (verified on a
        probe, as patch_model does) unless given. Raises
        gatedmlp.NotSupportedError saying why for anything else."""
        plan, why = _plan(experts, activation=activation, require_16bit=False)
        if plan is None:
            raise _not_supported(f"gatedmlp: cannot build MoEExperts from {type(experts).__qualname__}: {why}")
        return cls._from_plan(experts, plan)

    @classmethod
    def _from_plan(cls, old: nn.Module, plan: "_Plan") -> "MoEExperts":
        # Built on meta, then given the real tensors: no throwaway init.
        group, first = _LAYOUTS[plan.kind]
        new = cls(plan.num_experts, plan.hidden_size, plan.intermediate_size, bias=plan.kind == "gpt_oss",
                  activation=plan.activation, clamp_alpha=plan.clamp_alpha, clamp_limit=plan.clamp_limit,
                  group=group, first=first, checkpoint_layout=plan.kind, replaces=plan.replaces, device="meta")
        with torch.no_grad():
            if plan.kind == "stacked":
                new.w13 = _rows_contiguous(old.gate_up_proj)
                new.w2 = _rows_contiguous(old.down_proj)
            else:
                new.w13 = _transposed_copy(old.gate_up_proj)
                new.w2 = _transposed_copy(old.down_proj)
                new.b13 = _rows_contiguous(old.gate_up_proj_bias)
                new.b2 = _rows_contiguous(old.down_proj_bias)
        new.train(old.training)
        return new

    # ---------------------------------------------------------------- forward
    def forward(self, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
        w13, w2, b13, b2 = self.w13, self.w2, self.b13, self.b2
        _check_no_grad(hidden_states, top_k_weights, w13, w2, b13, b2)
        shape = hidden_states.shape
        x = hidden_states if hidden_states.dim() == 2 else hidden_states.reshape(-1, shape[-1])
        k = top_k_index.shape[-1] if top_k_index.dim() else 1
        ids = top_k_index if top_k_index.dim() == 2 else top_k_index.reshape(-1, k)
        weights = top_k_weights if top_k_weights.dim() == 2 else top_k_weights.reshape(-1, k)
        args = (x, ids, weights, w13, w2, b13, b2, self.activation, self.clamp_alpha, self.clamp_limit, self.group,
                self.first, _check_code(self.check_indices))
        if x.is_cuda and type(x) is Tensor and not _traced():
            y = _moe_direct(*args)
        else:
            y = torch.ops.gatedmlp.moe_mlp(*args)
        return y if x is hidden_states else y.reshape(shape)

    # ---------------------------------------------------------------- checkpoints
    def _checkpoint_names(self):
        return _CHECKPOINT_NAMES.get(self.checkpoint_layout, ())

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        if self.checkpoint_layout is None:
            return super()._save_to_state_dict(destination, prefix, keep_vars)
        # The transformers module's keys, order and shapes; gpt-oss's
        # weights as transposed views of w13 / w2 (no copy).
        for ckpt, own, transposed in self._checkpoint_names():
            p = getattr(self, own)
            if p is None:
                continue
            v = p if keep_vars else p.detach()
            destination[prefix + ckpt] = v.transpose(-1, -2) if transposed else v

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # The checkpoint's keys -> MoEExperts' names (gpt-oss's weights
        # transposed into w13 / w2's layout, a copy). A state dict with the
        # own names (w13, ...) loads as it is.
        for ckpt, own, transposed in self._checkpoint_names():
            key = prefix + ckpt
            if key in state_dict and prefix + own not in state_dict:
                v = state_dict.pop(key)
                state_dict[prefix + own] = v.transpose(-1, -2).contiguous() if transposed and v.dim() >= 2 else v
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def extra_repr(self) -> str:
        s = (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
             f"intermediate_size={self.intermediate_size}, activation={self.activation}")
        if self.activation == "swiglu_clamped":
            s += f", clamp_alpha={self.clamp_alpha}, clamp_limit={self.clamp_limit}"
        s += f", group={self.group}, first={self.first}, bias={self.b13 is not None}"
        if self.replaces:
            s += f", replaces={self.replaces}"
        return s


def _rows_contiguous(p: nn.Parameter) -> nn.Parameter:
    """p itself when its last axis is contiguous (what the kernels read);
    else a contiguous copy."""
    if p.dim() == 0 or p.shape[-1] <= 1 or p.stride(-1) == 1:
        return p
    return nn.Parameter(p.contiguous(), requires_grad=p.requires_grad)


def _transposed_copy(p: nn.Parameter) -> nn.Parameter:
    """[E, A, B] -> a new [E, B, A] contiguous parameter."""
    return nn.Parameter(p.detach().transpose(1, 2).contiguous(), requires_grad=p.requires_grad)


# ---------------------------------------------------------------- recognition
@dataclass
class _Plan:
    kind: str               # "stacked" or "gpt_oss"
    num_experts: int
    hidden_size: int
    intermediate_size: int
    activation: str         # gatedmlp name
    clamp_alpha: float
    clamp_limit: float
    replaces: str           # the class swapped out, for repr


def _experts_kind(m: nn.Module) -> Optional[str]:
    """The kind of a module whose class is (or derives from) one of
    transformers' experts classes gatedmlp knows, else None."""
    for c in type(m).__mro__:
        kind = _EXPERTS_CLASSES.get((c.__module__, c.__qualname__))
        if kind is not None:
            return kind
    return None


def _own_function(cls, name: str):
    """The function `name` of cls as its own module defines it: through
    transformers' use_experts_implementation wrapper (forward), which must
    wrap a function of cls itself. None if it is anything else."""
    f = cls.__dict__.get(name)
    if f is None:
        return None
    inner = getattr(f, "__wrapped__", None)
    if inner is not None:
        # functools.wraps copies the names: the wrapper's own globals tell.
        if getattr(f, "__globals__", {}).get("__name__") != "transformers.integrations.moe":
            return None
        f = inner
    if getattr(f, "__module__", None) == cls.__module__ and getattr(f, "__qualname__", None) == \
            f"{cls.__qualname__}.{name}":
        return f
    return None


def _plan(m: nn.Module, owners: Optional[Dict[int, set]] = None, activation=None,
          require_16bit: bool = True) -> Tuple[Optional[_Plan], str]:
    """How to build a MoEExperts from m, or (None, why it cannot be done
    faithfully). owners: id(parameter) -> ids of the modules holding it
    (patch_model's), to refuse untying a shared weight by copying it."""
    # Imported here: gatedmlp.hf imports gatedmlp.torch, which imports this module.
    from gatedmlp.hf import _hooks, _identify_activation

    kind = _experts_kind(m)
    cls = type(m)
    if kind is None:
        names = ", ".join(name for _, name in _EXPERTS_CLASSES)
        return None, f"it is not one of the experts classes gatedmlp knows ({names})"
    if (cls.__module__, cls.__qualname__) not in _EXPERTS_CLASSES:
        return None, (f"its class {cls.__qualname__} derives from a transformers experts class; gatedmlp knows "
                      "the classes themselves, not what a subclass changes")
    if cls.__call__ is not nn.Module.__call__ or cls._call_impl is not nn.Module._call_impl:
        return None, "its class overrides __call__"
    if _own_function(cls, "forward") is None:
        return None, "its forward is not the one transformers defines for it"
    gate_fn = cls.__dict__.get("_apply_gate") if kind == "gpt_oss" else getattr(cls, "_apply_gate", None)
    if kind == "gpt_oss":
        if _own_function(cls, "_apply_gate") is None:
            return None, "its _apply_gate is not the one transformers defines for it"
    elif gate_fn is not None and (getattr(gate_fn, "__module__", None) != "transformers.integrations.moe"
                                  or getattr(gate_fn, "__name__", None) != "_default_apply_gate"):
        return None, "its _apply_gate is not transformers' default (act_fn(gate) * up)"
    replaced = [n for n in ("forward", "_apply_gate") if n in vars(m)]
    if replaced:
        return None, f"{', '.join(replaced)} replaced on the instance"
    hooks = _hooks(m)
    if hooks:
        return None, f"the module has {', '.join(hooks)}, which a swap would drop"
    for flag, want in _DECORATOR_FLAGS[kind].items():
        got = getattr(m, flag, want)
        if got != want:
            return None, f"its {flag} is {got!r}, not {want!r} as the class stores its weights"

    names = [ckpt for ckpt, _, _ in _CHECKPOINT_NAMES[kind]]
    own = dict(m.named_parameters(recurse=False))
    if sorted(own) != sorted(names):
        return None, f"its parameters are ({', '.join(own)}), not ({', '.join(names)})"
    buffers = [n for n, _ in m.named_buffers(recurse=False)]
    if buffers:
        return None, f"it has buffers ({', '.join(buffers)})"
    for n, p in own.items():
        if type(p) is not nn.Parameter:
            return None, (f"{n} is a {type(p).__name__}, not a plain nn.Parameter (quantized, parametrized or "
                          "tensor-parallel weights are not handled)")
    children = dict(m.named_children())
    act_attr = "act_fn" if kind == "stacked" else None
    for n, c in children.items():
        if n != act_attr and (any(True for _ in c.parameters()) or any(True for _ in c.buffers())):
            return None, f"its child {n} ({type(c).__name__}) has parameters or buffers"

    gu, down = own["gate_up_proj"], own["down_proj"]
    if gu.dim() != 3 or down.dim() != 3:
        return None, f"gate_up_proj {tuple(gu.shape)} and down_proj {tuple(down.shape)} are not 3-D"
    e = gu.shape[0]
    if kind == "stacked":
        two_i, h = gu.shape[1], gu.shape[2]
        want_down = (e, h, two_i // 2)
        form = "gate_up_proj [E, 2I, H] and down_proj [E, H, I]"
    else:
        h, two_i = gu.shape[1], gu.shape[2]
        want_down = (e, two_i // 2, h)
        form = "gate_up_proj [E, H, 2I] and down_proj [E, I, H]"
    if two_i % 2 or two_i == 0 or h == 0 or e == 0 or tuple(down.shape) != want_down:
        return None, f"its weights are not {form}: got {tuple(gu.shape)} and {tuple(down.shape)}"
    i = two_i // 2
    if getattr(m, "num_experts", e) != e:
        return None, f"num_experts is {m.num_experts} but gate_up_proj holds {e} experts"
    if kind == "gpt_oss":
        gb, db = own["gate_up_proj_bias"], own["down_proj_bias"]
        if tuple(gb.shape) != (e, two_i) or tuple(db.shape) != (e, h):
            return None, (f"its biases are not gate_up_proj_bias [E, 2I] = {(e, two_i)} and down_proj_bias [E, H] "
                          f"= {(e, h)}: got {tuple(gb.shape)} and {tuple(db.shape)}")

    clamp_alpha, clamp_limit = 1.702, 7.0
    if kind == "stacked":
        if activation is not None:
            act = activation_name(activation)
        else:
            if not isinstance(children.get("act_fn"), nn.Module):
                return None, "its act_fn is not a submodule gatedmlp can inspect"
            act, why = _identify_activation(children["act_fn"])
            if act is None:
                return None, why + " (pass activation= to MoEExperts.from_module if you know what it computes)"
    else:
        if activation is not None and activation_name(activation) != "swiglu_clamped":
            return None, "gpt-oss experts compute swiglu_clamped (their own alpha and limit)"
        act = "swiglu_clamped"
        a, lim = getattr(m, "alpha", None), getattr(m, "limit", None)
        ok = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)  # noqa: E731
        if not ok(a) or not ok(lim) or lim <= 0:
            return None, f"its alpha ({a!r}) and limit ({lim!r}) are not finite numbers with limit > 0"
        clamp_alpha, clamp_limit = float(a), float(lim)

    from gatedmlp.hf import _weights_dtype  # (gatedmlp.hf imports this module)

    dtype, why = _weights_dtype(list(own.values()), require_16bit)
    if dtype is None:
        return None, why
    if not dtype.is_floating_point:
        return None, f"its weights are {dtype}, not floating point"
    if kind == "gpt_oss" and owners is not None:
        for n in ("gate_up_proj", "down_proj"):
            if owners.get(id(own[n]), set()) - {id(m)}:
                return None, f"its {n} is shared with another module; copying it into gatedmlp's layout would untie it"
    return _Plan(kind, int(e), int(h), int(i), act, clamp_alpha, clamp_limit, cls.__qualname__), ""


# Last, as gatedmlp.hf does: gatedmlp.torch imports this module at its end,
# so whichever of the two is imported first, the other finds what it needs.
from gatedmlp.torch import _act_params, _check_no_grad, _traced, activation_name  # noqa: E402
