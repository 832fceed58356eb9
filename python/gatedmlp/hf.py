"""Swap the gated MLPs of a Hugging Face transformers model for gatedmlp modules.

``patch_model(model)`` finds every module that is a gated MLP -- child
``nn.Linear`` modules ``gate_proj``, ``up_proj`` and ``down_proj`` (Llama, Mistral,
Qwen2/3, Gemma 1-3, Granite, OLMo2 and most other decoder models), or a fused
``gate_up_proj`` with ``down_proj`` (Phi-3, GLM) -- and replaces it with a
:class:`HFGatedMLP`, which computes the same function with the gate/up half
fused into one kernel launch.

A module is swapped only when it is shown to compute
``down_proj(act(gate_proj(x)) * up_proj(x))``:

- its ``forward`` is, up to the names of its argument and local variables,
  one of the forwards below (read from transformers' model sources), so a
  class that adds anything (a clamp, a norm, a scale, activation sparsity)
  is refused, whatever it is called;
- the projections are plain ``nn.Linear`` modules with plain parameters, of
  consistent shapes, bf16 or fp16, on one device; the module has no other
  parameters or buffers, no hooks and no accelerate wrapper, and a dropout
  (T5Gemma) only when it is inactive;
- the activation is one gatedmlp computes (silu, gelu_tanh, gelu_erf, relu):
  a known torch or transformers activation class, checked by evaluating it
  against the formula.

FP8 checkpoints: an MLP whose gate_proj and up_proj are transformers' FP8
linears (``FP8Linear`` of the fine-grained FP8 integration, ``FbgemmFp8Linear``)
is swapped for a :class:`gatedmlp.fp8_module.Fp8GatedMLP`, which holds
their tensors as they are (gatedmlp.fp8_module says what it computes and
what it refuses), when its forward and activation pass the checks above.

Mixture-of-Experts layers: transformers' experts modules ``Qwen3MoeExperts``,
``MixtralExperts`` and ``GptOssExperts`` (every expert's weights in 3-D
parameters, called with the router's top-k ids and weights) are swapped for
a :class:`gatedmlp.torch.MoEExperts` (``MoEExperts.from_module``), when
they are those classes themselves with transformers' own forward, the
parameters (and nothing else) of their layout, a known activation (act_fn,
as above; gpt-oss: its clamped SwiGLU with the module's alpha and limit),
no hooks, bf16 or fp16 on one device. The router stays the model's. Other
experts classes are left alone.

Nothing here imports transformers: recognition is by structure and source
(MoE experts: by class name and attributes), so it works for any
transformers version whose modules keep these forms.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import math
import textwrap
import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

import gatedmlp as _g

__all__ = ["patch_model", "HFGatedMLP", "activation_of_module", "HF_ACTIVATIONS"]

# Every `hidden_act` spelling of transformers' ACT2CLS that is a gated-MLP
# activation gatedmlp computes, and which one it is. gelu_new, gelu_fast and
# gelu_accurate are all the tanh approximation (same formula, differently
# written); gelu_python is the exact erf form. Spellings not listed
# (quick_gelu, gelu_10, relu2, relu6, mish, linear, ...) compute something
# else and are refused.
HF_ACTIVATIONS: Dict[str, str] = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu_erf",
    "gelu_python": "gelu_erf",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_accurate": "gelu_tanh",
    "relu": "relu",
}

_SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)


def _weights_dtype(tensors, require_16bit: bool = True):
    """(the one dtype of a module's weights, "") if they share a device and a
    dtype (bf16 or fp16 unless require_16bit is off), else (None, why)."""
    devices = {t.device for t in tensors}
    dtypes = {t.dtype for t in tensors}
    if len(devices) > 1:
        return None, f"its weights are on several devices ({', '.join(sorted(map(str, devices)))})"
    if len(dtypes) > 1:
        return None, f"its weights differ in dtype ({', '.join(sorted(map(str, dtypes)))})"
    dtype = dtypes.pop()
    if require_16bit and dtype not in _SUPPORTED_DTYPES:
        return None, (f"its weights are {dtype}; gatedmlp runs bfloat16 and float16 "
                      "(cast the model first, e.g. model.to(torch.bfloat16))")
    return dtype, ""


def _not_supported(message: str) -> Exception:
    e = _g.NotSupportedError(message)
    e.code = _g.StatusCode.not_supported
    return e


# ---------------------------------------------------------------- activations
# transformers' activation classes (transformers.activations) by name, and
# the gatedmlp activation each computes. Matched on module and name, so that
# transformers need not be imported; the probe below checks the claim.
_TRANSFORMERS_ACTIVATIONS = {
    "SiLUActivation": "silu",
    "GELUTanh": "gelu_tanh",
    "PytorchGELUTanh": "gelu_tanh",
    "NewGELUActivation": "gelu_tanh",
    "FastGELUActivation": "gelu_tanh",
    "AccurateGELUActivation": "gelu_tanh",
    "GELUActivation": "gelu_erf",
}


def _reference(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "silu":
        return x * torch.sigmoid(x)
    if name == "relu":
        return x.clamp_min(0)
    if name == "gelu_erf":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if name == "gelu_tanh":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    raise AssertionError(name)


@functools.lru_cache(maxsize=1)
def _probe_points() -> torch.Tensor:
    # Wide enough to catch clipping (gelu_10 clips at +-10), dense enough to
    # tell gelu_tanh from gelu_erf (they differ by up to ~5e-4 near |x| = 2).
    return torch.cat([torch.linspace(-30.0, 30.0, 1201, dtype=torch.float64),
                      torch.tensor([-1e-3, -1e-6, 0.0, 1e-6, 1e-3], dtype=torch.float64)])


def _hooks(m: nn.Module) -> List[str]:
    """The kinds of hooks or wrappers on m that a swap would silently drop."""
    found = [attr.strip("_") for attr in (
        "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
        "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")
        if getattr(m, attr, None)]
    if getattr(m, "_hf_hook", None) is not None:
        found.append("accelerate hook (device_map offloading?)")
    elif "forward" in vars(m):
        found.append("forward replaced on the instance")
    return found


def _identify_activation(act) -> Tuple[Optional[str], str]:
    """(gatedmlp activation name, "") or (None, why not)."""
    if not isinstance(act, nn.Module):
        return None, f"the activation is a {type(act).__name__}, not an nn.Module gatedmlp can inspect"
    cls = type(act)
    name = None
    if cls is nn.SiLU:
        name = "silu"
    elif cls is nn.ReLU:
        name = "relu"
    elif cls is nn.GELU:
        name = {"tanh": "gelu_tanh", "none": "gelu_erf"}.get(act.approximate)
    elif cls.__module__ == "transformers.activations":
        name = _TRANSFORMERS_ACTIVATIONS.get(cls.__name__)
    if name is None:
        return None, (f"activation {cls.__name__} is not one gatedmlp computes "
                      f"(silu, gelu_tanh, gelu_erf, relu)")
    if any(True for _ in act.parameters()) or any(True for _ in act.buffers()):
        return None, f"activation {cls.__name__} has parameters or buffers"
    hooks = _hooks(act)
    if hooks:
        return None, f"activation {cls.__name__} has {', '.join(hooks)}"
    # The class says what it should compute; check that this instance does
    # (a replaced `act` attribute, a hub kernel, a subclass-like patch).
    x = _probe_points()
    try:
        with torch.no_grad():
            y = act(x.clone())
    except Exception as e:  # noqa: BLE001 - any failure means we cannot vouch for it
        return None, f"activation {cls.__name__} failed on a float64 CPU probe ({type(e).__name__}: {e})"
    ref = _reference(name, x)
    if not (isinstance(y, torch.Tensor) and y.shape == x.shape and y.dtype == torch.float64
            and torch.allclose(y, ref, rtol=1e-6, atol=1e-9)):
        return None, f"activation {cls.__name__} does not compute {name} on a probe"
    return name, ""


def activation_of_module(act: nn.Module) -> str:
    """The gatedmlp activation name ("silu", "gelu_tanh", "gelu_erf", "relu")
    that an activation module computes: nn.SiLU / nn.ReLU / nn.GELU or one
    of transformers' activation classes (SiLUActivation, GELUTanh,
    GELUActivation, NewGELUActivation, ...), verified on a probe. Raises
    gatedmlp.InvalidArgumentError for anything else."""
    name, why = _identify_activation(act)
    if name is None:
        raise _g.InvalidArgumentError(
            f"gatedmlp: cannot tell which activation {type(act).__name__} is ({why}); "
            "pass activation= to GatedMLP.from_module")
    return name


# ---------------------------------------------------------------- forwards
# The forwards a swappable MLP may have, as transformers writes them. ACT and
# DROP stand for the module's activation and dropout attributes; argument and
# local variable names do not matter, nor does `v = E; return v` against
# `return E`. `a * b` and `b * a` are the same
# elementwise product, so the operand order of the product may differ.
_SEPARATE_FORWARDS = [
    # Llama, Mistral, Qwen2/3, Gemma 1-3, Granite, OLMo2 and most others
    # (`down_proj = ...; return down_proj`, the same after normalisation),
    # Qwen2.5-VL and Idefics vision MLPs.
    """
def forward(self, x):
    return self.down_proj(self.ACT(self.gate_proj(x)) * self.up_proj(x))
""",
    # Llama 4 text MLP.
    """
def forward(self, x):
    h = self.ACT(self.gate_proj(x)) * self.up_proj(x)
    return self.down_proj(h)
""",
    # RecurrentGemma.
    """
def forward(self, x):
    g = self.ACT(self.gate_proj(x))
    return self.down_proj(g * self.up_proj(x))
""",
]
_DROPOUT_FORWARDS = [
    # T5Gemma: a dropout between the product and down_proj.
    """
def forward(self, x):
    h = self.ACT(self.gate_proj(x)) * self.up_proj(x)
    h = self.DROP(h)
    down_proj = self.down_proj(h)
    return down_proj
""",
]
_FUSED_FORWARDS = [
    # Phi-3, GLM, Dia: chunk(2) of gate_up_proj's output is (gate, up), so
    # its weight is [gate; up] stacked -- GatedMLP's own layout.
    """
def forward(self, x):
    up_states = self.gate_up_proj(x)
    gate, up_states = up_states.chunk(2, dim=-1)
    up_states = up_states * self.ACT(gate)
    return self.down_proj(up_states)
""",
]

_PROJECTIONS = {"separate": ("gate_proj", "up_proj", "down_proj"), "fused": ("gate_up_proj", "down_proj")}


class _Canonical(ast.NodeTransformer):
    """Renames the argument and the local variables in order of appearance,
    `self.<role attr>` to `self.ACT` / `self.DROP`, and puts the operands of
    every `*` in a fixed order, so equal forwards give equal dumps."""

    def __init__(self, local_names, roles):
        self.local_names = local_names
        self.roles = roles
        self.renamed = {}

    def visit_Name(self, node):
        if node.id in self.local_names:
            new = self.renamed.setdefault(node.id, f"v{len(self.renamed)}")
            return ast.copy_location(ast.Name(id=new, ctx=node.ctx), node)
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in self.roles:
            return ast.copy_location(ast.Attribute(value=node.value, attr=self.roles[node.attr], ctx=node.ctx), node)
        return node

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.Mult):
            a, b = sorted([node.left, node.right], key=ast.dump)
            node.left, node.right = a, b
        return node


def _canonical(fn: ast.FunctionDef, roles: Dict[str, str]) -> Optional[str]:
    a = fn.args
    if (a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults or len(a.args) != 2
            or a.args[0].arg != "self" or fn.decorator_list):
        return None
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # the docstring
    if (len(body) >= 2 and isinstance(body[-1], ast.Return) and isinstance(body[-1].value, ast.Name)
            and isinstance(body[-2], ast.Assign) and len(body[-2].targets) == 1
            and isinstance(body[-2].targets[0], ast.Name) and body[-2].targets[0].id == body[-1].value.id):
        body = body[:-2] + [ast.Return(value=body[-2].value)]  # `v = E; return v` is `return E`
    local_names = {a.args[1].arg}
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            local_names.add(node.id)
    body = [copy.deepcopy(stmt) for stmt in body]  # the transformer edits in place; fn may be cached
    t = _Canonical(local_names, roles)
    t.visit_Name(ast.Name(id=a.args[1].arg, ctx=ast.Load()))  # the argument is always v0
    body = [t.visit(ast.fix_missing_locations(stmt)) for stmt in body]
    return "\n".join(ast.dump(stmt) for stmt in body)


def _function_def(source: str) -> Optional[ast.FunctionDef]:
    tree = ast.parse(textwrap.dedent(source))
    if len(tree.body) == 1 and isinstance(tree.body[0], ast.FunctionDef):
        return tree.body[0]
    return None


@functools.lru_cache(maxsize=None)
def _known_forwards() -> Dict[str, Tuple[str, bool]]:
    """canonical dump -> (layout, has dropout)."""
    roles = {"ACT": "ACT", "DROP": "DROP"}
    known = {}
    for layout, sources, dropout in (("separate", _SEPARATE_FORWARDS, False),
                                     ("separate", _DROPOUT_FORWARDS, True),
                                     ("fused", _FUSED_FORWARDS, False)):
        for src in sources:
            known[_canonical(_function_def(src), roles)] = (layout, dropout)
    return known


@functools.lru_cache(maxsize=None)
def _parsed_forward(fn) -> Tuple[Optional[ast.FunctionDef], str]:
    if not inspect.isfunction(fn) or hasattr(fn, "__wrapped__"):
        return None, "its forward is wrapped or not a plain Python function"
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return None, "the source of its forward is not available to check"
    try:
        fdef = _function_def(source)
    except SyntaxError:
        fdef = None
    if fdef is None:
        return None, "the source of its forward could not be parsed"
    return fdef, ""


def _self_attributes(fdef: ast.FunctionDef) -> List[str]:
    """The names X of every `self.X` in a function, in order of appearance."""
    seen: List[str] = []
    for node in ast.walk(fdef):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                and node.attr not in seen:
            seen.append(node.attr)
    return seen


def _state_or_hooks(mlp: nn.Module, children: Dict[str, nn.Module]) -> Optional[str]:
    """Why a swap of mlp would lose something: parameters or buffers of
    its own (beyond its projections), or hooks on it or its children; None
    when there is nothing."""
    own = [n for n, _ in mlp.named_parameters(recurse=False)] + [n for n, _ in mlp.named_buffers(recurse=False)]
    if own:
        return f"it has parameters or buffers of its own ({', '.join(own)})"
    for n, m in [("", mlp)] + list(children.items()):
        hooks = _hooks(m)
        if hooks:
            return f"{n or 'the module'} has {', '.join(hooks)}, which a swap would drop"
    return None


def _match_forward(mlp: nn.Module, layout: str) -> Tuple[Optional[Tuple[Optional[str], Optional[str]]], str]:
    """((activation attr, dropout attr or None), "") when mlp's forward is a
    known gated-MLP forward for its layout, else (None, why not)."""
    cls = type(mlp)
    if cls.__call__ is not nn.Module.__call__ or cls._call_impl is not nn.Module._call_impl:
        return None, "its class overrides __call__"
    fdef, why = _parsed_forward(cls.forward)
    if fdef is None:
        return None, why
    used = [n for n in _self_attributes(fdef) if n not in _PROJECTIONS[layout]]
    for n in used:
        if not isinstance(mlp._modules.get(n), nn.Module):
            return None, f"its forward uses self.{n}, which is not a submodule gatedmlp can inspect"
    if len(used) == 1:
        assignments = [{used[0]: "ACT"}]
    elif len(used) == 2:
        assignments = [{used[0]: "ACT", used[1]: "DROP"}, {used[1]: "ACT", used[0]: "DROP"}]
    else:
        assignments = []
    known = _known_forwards()
    for roles in assignments:
        hit = known.get(_canonical(fdef, roles))
        if hit is not None and hit[0] == layout:
            inverse = {v: k for k, v in roles.items()}
            return (inverse["ACT"], inverse.get("DROP")), ""
    return None, (f"its forward ({cls.__qualname__}.forward) is not down_proj(act(gate_proj(x)) * up_proj(x)) "
                  "in any form gatedmlp knows")


# ---------------------------------------------------------------- recognition
@dataclass
class _Plan:
    layout: str                 # "separate" (gate_proj, up_proj) or "fused" (gate_up_proj, [gate; up])
    activation: str             # gatedmlp name
    hidden_size: int
    intermediate_size: int
    bias: bool                  # gate/up bias
    dropout_p: float
    replaces: str               # the class swapped out, for repr


def _is_plain_linear(m) -> bool:
    return (type(m) is nn.Linear and type(m.weight) is nn.Parameter
            and (m.bias is None or type(m.bias) is nn.Parameter))


def _plan(mlp: nn.Module, owners: Dict[int, set]) -> Tuple[Optional[_Plan], str]:
    """How to swap mlp, or (None, why it cannot be swapped faithfully)."""
    children = dict(mlp.named_children())
    layout = "fused" if "gate_up_proj" in children else "separate"
    projections = _PROJECTIONS[layout]
    if layout == "fused" and ("gate_proj" in children or "up_proj" in children):
        return None, "it has both gate_up_proj and gate_proj/up_proj"
    for p in projections:
        if not _is_plain_linear(children.get(p)):
            return None, (f"{p} is a {type(children.get(p)).__name__}, not a plain nn.Linear "
                          "(quantized, LoRA-wrapped, parametrized or tensor-parallel weights are not handled)")
    why = _state_or_hooks(mlp, children)
    if why:
        return None, why
    match, why = _match_forward(mlp, layout)
    if match is None:
        return None, why
    act_attr, drop_attr = match
    activation, why = _identify_activation(children[act_attr])
    if activation is None:
        return None, why
    # Children the forward does not use change nothing it computes, but
    # their state would be lost with them.
    for n in children:
        if n not in projections and n != act_attr and (
                any(True for _ in children[n].parameters()) or any(True for _ in children[n].buffers())):
            return None, f"its child {n} ({type(children[n]).__name__}) has parameters or buffers"
    dropout_p = 0.0
    if drop_attr is not None:
        drop = children[drop_attr]
        if type(drop) is not nn.Dropout:
            return None, f"{drop_attr} is a {type(drop).__name__}, not nn.Dropout"
        dropout_p = float(drop.p)
        if dropout_p > 0 and (mlp.training or drop.training):
            return None, (f"dropout (p={dropout_p}) is active in training mode; gatedmlp does not apply it "
                          "(call model.eval() first)")

    down = children["down_proj"]
    if layout == "separate":
        gate, up = children["gate_proj"], children["up_proj"]
        k, u = gate.in_features, gate.out_features
        if up.in_features != k or up.out_features != u:
            return None, (f"gate_proj is [{u}, {k}] but up_proj is [{up.out_features}, {up.in_features}]")
        if (gate.bias is None) != (up.bias is None):
            return None, "gate_proj and up_proj differ in having a bias"
        stacked = [gate.weight, up.weight] + ([gate.bias, up.bias] if gate.bias is not None else [])
        for t in stacked:
            if owners.get(id(t), set()) - {id(gate), id(up)}:
                return None, "its gate/up weights are shared with another module; stacking them would untie them"
        bias = gate.bias is not None
    else:
        gu = children["gate_up_proj"]
        k, u2 = gu.in_features, gu.out_features
        if u2 % 2:
            return None, f"gate_up_proj has an odd number of rows ({u2})"
        u = u2 // 2
        stacked = [gu.weight] + ([gu.bias] if gu.bias is not None else [])
        bias = gu.bias is not None
    if down.in_features != u:
        return None, f"down_proj takes {down.in_features} features but the gate/up half gives {u}"
    tensors = stacked + [down.weight] + ([down.bias] if down.bias is not None else [])
    dtype, why = _weights_dtype(tensors)
    if dtype is None:
        return None, why
    return _Plan(layout, activation, k, u, bias, dropout_p, type(mlp).__qualname__), ""


def _is_candidate(m: nn.Module) -> bool:
    """A module that looks like a gated MLP: these it swaps or refuses."""
    names = set(m._modules)
    return {"gate_proj", "up_proj", "down_proj"} <= names or {"gate_up_proj", "down_proj"} <= names


def patch_model(model: nn.Module, *, strict: bool = True) -> List[str]:
    """Swap every gated MLP of `model` for an :class:`HFGatedMLP`, in place.

    A gated MLP is a module with child modules ``gate_proj``, ``up_proj``,
    ``down_proj`` or ``gate_up_proj``, ``down_proj``. Each is swapped when it
    provably computes ``down_proj(act(gate_proj(x)) * up_proj(x))`` with an
    activation gatedmlp has (see the module docstring); the swapped module
    keeps the dtype, device, training mode and requires_grad of the weights,
    reuses the original ``down_proj`` (and Phi-3's ``gate_up_proj``) module,
    and stacks gate and up into one new weight (the separate tensors are no
    longer referenced and are freed). A module shared under several names
    is swapped once and stays shared.

    MoE experts modules (transformers' ``Qwen3MoeExperts``,
    ``MixtralExperts``, ``GptOssExperts``; see the module docstring) are
    swapped for ``MoEExperts.from_module(experts)``: Qwen3-MoE's and
    Mixtral's expert weights are kept as they are (the same parameters),
    gpt-oss's are copied once into gatedmlp's layout. Their routers are left
    alone, as are other expert banks (3-D parameters of classes gatedmlp
    does not know).

    FP8 MLPs, whose gate_proj and up_proj are transformers' ``FP8Linear``
    (128 x 128 block or per-tensor scales) or ``FbgemmFp8Linear``
    (per-channel scales), are swapped for a
    :class:`gatedmlp.fp8_module.Fp8GatedMLP` (FP8 activations on the sm_90
    gate/up kernel), under the same conditions on their forward, activation
    and hooks; their tensors are taken over as they are (the same
    parameters, ``mlp.gate_proj.weight_scale_inv`` and the others keep their
    names).

    The patched model's ``state_dict()`` and ``save_pretrained()`` write the
    checkpoint's own keys (``mlp.gate_proj.weight``, ``mlp.up_proj.weight``,
    ...; Phi-3 ``mlp.gate_up_proj.weight``; ``mlp.experts.gate_up_proj``,
    ``mlp.experts.down_proj``, ... in the transformers module's shapes), so
    an unpatched model loads them.

    strict=True (the default): raises ``gatedmlp.NotSupportedError`` naming
    the first module it cannot swap faithfully and why, before swapping
    anything. strict=False: leaves those modules as they are and issues one
    ``UserWarning`` listing them with the reasons.

    Returns the qualified names (as in ``model.named_modules()``) of the
    modules swapped, dense MLPs and MoE experts alike, in the model's
    order -- with strict=False, only those; an empty list when the model
    has no gated MLP. Inference only: as for GatedMLP, the patched model's
    forward raises where a gradient through gate/up (MoE experts: through
    any of their weights or the routing weights) would be needed.
    """
    from gatedmlp.fp8_module import Fp8GatedMLP, _Fp8Plan, _is_fp8_mlp, _plan as _plan_fp8
    from gatedmlp.moe_module import MoEExperts, _experts_kind, _plan as _plan_experts

    # Plans hold no tensors: the old modules must be free to go as soon as
    # each is swapped, so that peak memory is one layer's gate/up, not all.
    owners: Dict[int, set] = {}
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None:
                owners.setdefault(id(p), set()).add(id(m))
    plans: Dict[int, Tuple[_Plan, List[str]]] = {}
    skipped: List[Tuple[str, str]] = []
    seen_inside: List[str] = []
    for name, m in model.named_modules(remove_duplicate=False):
        if any(name.startswith(p + ".") for p in seen_inside):
            continue  # inside a gated MLP already handled
        if isinstance(m, (GatedMLP, MoEExperts, Fp8GatedMLP)):
            seen_inside.append(name)  # swapped already, by an earlier call or by hand
            continue
        experts = _experts_kind(m) is not None
        if not experts and not _is_candidate(m):
            continue
        seen_inside.append(name)
        if id(m) in plans:
            plans[id(m)][1].append(name)
            continue
        fp8 = not experts and _is_fp8_mlp(m)
        if name == "":
            builder = ("MoEExperts.from_module" if experts else "Fp8GatedMLP.from_module" if fp8
                       else "HFGatedMLP.from_hf")
            plan, why = None, f"it is the model itself; build one with {builder} instead"
        elif experts:
            plan, why = _plan_experts(m, owners)
        elif fp8:
            plan, why = _plan_fp8(m)
        else:
            plan, why = _plan(m, owners)
        if plan is None:
            if strict:
                raise _not_supported(f"gatedmlp: cannot swap {name or '<model>'} ({type(m).__qualname__}): {why}. "
                                     "Pass strict=False to patch_model to leave it as it is.")
            skipped.append((name, why))
            continue
        plans[id(m)] = (plan, [name])
    del m
    del owners

    swapped: List[str] = []
    for plan, names in plans.values():
        old = model.get_submodule(names[0])
        new = (HFGatedMLP._from_plan(old, plan) if isinstance(plan, _Plan)
               else Fp8GatedMLP._from_plan(old, plan) if isinstance(plan, _Fp8Plan)
               else MoEExperts._from_plan(old, plan))
        for name in names:
            parent_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent_name), attr, new)
        del old, new
        swapped.extend(names)
    if skipped:
        warnings.warn("gatedmlp: patch_model left these modules as they are: "
                      + "; ".join(f"{n}: {why}" for n, why in skipped), stacklevel=2)
    return swapped


# The import comes last: gatedmlp.torch imports patch_model from here at its
# end, so patch_model must exist before this module asks for gatedmlp.torch.
from gatedmlp.torch import GatedMLP  # noqa: E402


class HFGatedMLP(GatedMLP):
    """A GatedMLP standing in for a Hugging Face MLP, saving in its layout.

    Computes what GatedMLP does. Its state dict has the checkpoint's keys:
    ``gate_proj.*`` and ``up_proj.*`` (views of the rows of the stacked
    ``gate_up_proj`` weight, no copy) for checkpoint_layout="separate", or
    ``gate_up_proj.*`` as is for "fused" (Phi-3). It loads either form.
    Being views, gate and up share one storage: torch.save and
    save_pretrained (which copies such tensors while it writes) handle
    that; safetensors' save_model, which wants one name per storage, does
    not.

    dropout_p: the dropout of the MLP it replaced (T5Gemma), which it does
    not apply. One swapped in with dropout_p > 0 (in eval mode) refuses to
    run in training mode.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, *, bias: bool = False, activation="silu",
                 checkpoint_layout: str = "separate", dropout_p: float = 0.0, replaces: str = "", device=None,
                 dtype=None):
        super().__init__(hidden_size, intermediate_size, bias=bias, activation=activation, device=device,
                         dtype=dtype)
        if checkpoint_layout not in _PROJECTIONS:
            raise _g.InvalidArgumentError(
                f"gatedmlp: checkpoint_layout={checkpoint_layout!r} is not one of {', '.join(_PROJECTIONS)}")
        self.checkpoint_layout = checkpoint_layout
        self.dropout_p = float(dropout_p)
        self.replaces = replaces

    @classmethod
    def from_hf(cls, mlp: nn.Module) -> "HFGatedMLP":
        """An HFGatedMLP computing what the Hugging Face MLP `mlp` does, when
        patch_model would swap it; raises gatedmlp.NotSupportedError saying
        why not otherwise. It takes over mlp's down_proj (and a fused
        gate_up_proj) module; gate and up are copied into the stacked weight."""
        owners: Dict[int, set] = {}
        for m in mlp.modules():
            for p in m._parameters.values():
                if p is not None:
                    owners.setdefault(id(p), set()).add(id(m))
        plan, why = _plan(mlp, owners)
        if plan is None:
            raise _not_supported(f"gatedmlp: cannot swap {type(mlp).__qualname__}: {why}")
        return cls._from_plan(mlp, plan)

    @classmethod
    def _from_plan(cls, old: nn.Module, plan: _Plan) -> "HFGatedMLP":
        # Built on meta, then given the real tensors: no throwaway init of a
        # [2U, K] weight. The training-mode guard is a subclass of its own so
        # that the common module's forward is GatedMLP's, with no extra work.
        if plan.dropout_p > 0:
            cls = _EvalOnlyHFGatedMLP
        new = cls(plan.hidden_size, plan.intermediate_size, bias=plan.bias, activation=plan.activation,
                  checkpoint_layout=plan.layout, dropout_p=plan.dropout_p, replaces=plan.replaces, device="meta")
        with torch.no_grad():
            if plan.layout == "separate":
                gate, up = old.gate_proj, old.up_proj
                w = torch.cat([gate.weight, up.weight], dim=0)
                grad = gate.weight.requires_grad or up.weight.requires_grad
                new.gate_up_proj.weight = nn.Parameter(w, requires_grad=grad)
                if plan.bias:
                    b = torch.cat([gate.bias, up.bias], dim=0)
                    new.gate_up_proj.bias = nn.Parameter(b, requires_grad=gate.bias.requires_grad or
                                                         up.bias.requires_grad)
            else:
                gu = old.gate_up_proj
                if not gu.weight.is_contiguous():  # the kernel reads rows of K contiguous elements
                    gu.weight = nn.Parameter(gu.weight.contiguous(), requires_grad=gu.weight.requires_grad)
                new.gate_up_proj = gu
        new.down_proj = old.down_proj
        new.train(old.training)
        return new

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        # Module.state_dict writes the children (gate_up_proj) after this
        # module's own _save_to_state_dict, so the split is done here, on the
        # finished entries.
        if len(args) > 1 and prefix == "":
            prefix = args[1]
        out = super().state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)
        if self.checkpoint_layout != "separate":
            return out
        fused = f"{prefix}gate_up_proj."
        keys = list(out.keys())
        if f"{fused}weight" not in out:
            return out
        # This module's entries are the last ones written; rewrite them in
        # the order the Hugging Face module has (gate_proj, up_proj, down_proj).
        tail = keys[keys.index(f"{fused}weight"):]
        entries = {k: out.pop(k) for k in tail}
        w = entries.pop(f"{fused}weight")
        b = entries.pop(f"{fused}bias", None)
        u = self.intermediate_size
        for half, rows in (("gate_proj", slice(0, u)), ("up_proj", slice(u, 2 * u))):
            out[f"{prefix}{half}.weight"] = w[rows]
            if b is not None:
                out[f"{prefix}{half}.bias"] = b[rows]
        out.update(entries)
        meta = getattr(out, "_metadata", None)
        if meta is not None and fused[:-1] in meta:
            linear_meta = meta.pop(fused[:-1])
            meta[f"{prefix}gate_proj"] = dict(linear_meta)
            meta[f"{prefix}up_proj"] = dict(linear_meta)
        return out

    def extra_repr(self) -> str:
        s = super().extra_repr()
        if self.replaces:
            s += f", replaces={self.replaces}"
        return s


class _EvalOnlyHFGatedMLP(HFGatedMLP):
    """An HFGatedMLP for an MLP with an active dropout: eval mode only."""

    def forward(self, x):
        if self.training:
            raise _not_supported(
                f"gatedmlp: this MLP had dropout p={self.dropout_p}, which gatedmlp does not apply; "
                "run it in eval mode")
        return super().forward(x)
