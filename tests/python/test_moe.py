"""A whole Mixture-of-Experts layer's experts: the gathered down
projection's per-row scale (row_scale, the routing weight in the epilogue),
gatedmlp.moe_mlp, gatedmlp.torch.MoEExperts and patch_model on MoE models.

Without a GPU: the descriptor the binding builds for row_scale and every
malformed row_scale refused by name; moe_mlp's argument errors, raised
before anything is allocated or launched (the binding replaced by a
recorder that fails if called), and what moe_mlp hands the binding; the
layout mapping of MoEExperts.from_module for transformers' Qwen3MoeExperts,
MixtralExperts and GptOssExperts (tensors shared or transposed as they
should be, and the function of the MoEExperts' tensors evaluated in
float64 against the original module's own forward); the refusals; the
checkpoint keys; patch_model's swaps on tiny Qwen3-MoE, Mixtral and gpt-oss
models; the fake (meta) implementation of the op.

On a GPU: moe_mlp against a float64 loop over the experts (random E, k
and T including T = 1 and 64, duplicate ids, with and without biases,
every activation, stacked and interleaved gate/up rows) under the fused
suite's rule (at most 2x the error of the unfused PyTorch path at the same
precision, with a small allowance for the bf16 intermediate both share);
gather_down's row_scale in each dtype; a bad id; MoEExperts.from_module
against each transformers module's own forward (bf16 weights, the module
run in float32 as the reference and in bf16 as the baseline); a CUDA
graph; patch_model on the three tiny models (bf16, CUDA) against the
unpatched logits. Outputs are poisoned with NaN first.
"""

import copy
import math
import os
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import gatedmlp  # noqa: E402
import gatedmlp.torch as gt  # noqa: E402
from gatedmlp import DType  # noqa: E402
from gatedmlp.torch import MoEExperts  # noqa: E402
from binding_recorder import Recorder, record  # noqa: E402,F401
from refs import fused_halves, moe_reference  # noqa: E402

try:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
except ImportError:
    transformers = None

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda"
SEED = int(os.environ.get("GATEDMLP_TEST_SEED", "20261127"))
ACTS = ["silu", "gelu_tanh", "gelu_erf", "relu", "swiglu_clamped"]
E = gatedmlp.InvalidArgumentError


def on_gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")(test))


needs_transformers = pytest.mark.skipif(transformers is None, reason="transformers is not installed")


# ================================================================ references
def errors(out, ref):
    d = (out.double() - ref.double()).flatten()
    return (d.norm() / ref.double().norm().clamp_min(1e-300)).item(), d.abs().max().item()


def assert_within_rule(got, unfused, ref, what, rel_atol=2e-3, max_atol=5e-3):
    """At most 2x the unfused path's error against the float64 reference,
    by relative Frobenius norm and by max abs diff, plus an allowance (the
    intermediate h is rounded to x's dtype in both paths, which alone can
    make the two errors close)."""
    assert torch.isfinite(got).all(), f"{what}: non-finite output (an element not written, or NaN)"
    rel_f, max_f = errors(got, ref)
    rel_u, max_u = errors(unfused, ref)
    scale = ref.abs().max().item()
    assert rel_f <= 2 * rel_u + rel_atol, f"{what}: rel err {rel_f:.3e} > 2 x unfused {rel_u:.3e}"
    assert max_f <= 2 * max_u + max_atol * scale + 1e-30, f"{what}: max err {max_f:.3e} > 2 x unfused {max_u:.3e}"


def f16(*shape):
    return torch.randn(*shape).to(torch.float16)


# ================================================================ without a GPU
def test_names():
    assert "moe_mlp" in gatedmlp.__all__ and callable(gatedmlp.moe_mlp)
    assert "MoEExperts" in gt.__all__ and gt.MoEExperts is MoEExperts
    p = gatedmlp.Problem()
    assert not p.has_row_scale and p.row_scale_dtype == DType.fp32 and "row_scale" not in repr(p)
    p = gatedmlp.Problem(has_row_scale=True, row_scale_dtype=DType.bf16)
    assert p.has_row_scale and p.row_scale_dtype == DType.bf16
    a = gatedmlp.Arguments(x=0x1000, row_scale=0x4000)
    assert a.row_scale == 0x4000 and "row_scale=0x4000" in repr(a)
    assert "row_scale" not in repr(gatedmlp.Arguments(x=0x1000))
    assert hasattr(torch.ops.gatedmlp, "moe_mlp")


@pytest.mark.parametrize("dtype, want", [(torch.float32, DType.fp32), (torch.bfloat16, DType.bf16),
                                         (torch.float16, DType.fp16)], ids=["fp32", "bf16", "fp16"])
def test_problem_row_scale(dtype, want):
    t, k, e, i, h = 5, 2, 4, 32, 48
    hh, w = f16(t, k, i).reshape(t * k, i), f16(e, h, i)
    ids = torch.randint(0, e, (t, k), dtype=torch.int32)
    p = gatedmlp.make_down_problem(hh, w, indices=ids, row_scale=torch.rand(t, k, dtype=dtype))
    assert p.has_row_scale and p.row_scale_dtype == want and p.gather.experts == e and p.m == t * k
    assert f"row_scale={gatedmlp.to_string(want)}" in repr(p)
    assert gatedmlp.check_support(p), gatedmlp.check_support(p).message
    # the routing weight may come flat, or in any shape holding m values
    p = gatedmlp.make_down_problem(hh, w, indices=ids, row_scale=torch.rand(t * k, dtype=dtype))
    assert p.has_row_scale
    assert not gatedmlp.make_down_problem(hh, w, indices=ids).has_row_scale
    # the library itself refuses it outside a gathered down projection
    q = gatedmlp.Problem(op=gatedmlp.Operation.down, m=4, k=64, u=32, has_row_scale=True)
    s = gatedmlp.check_support(q)
    assert not s and "has_row_scale" in s.message


def test_binding_refuses_row_scale_by_name():
    r, e, u, kk = 6, 3, 40, 64
    h, w = f16(r, kk).numpy(), f16(e, u, kk).numpy()
    ids = np.array([0, 1, 2, 0, 1, 2], np.int32)
    out = np.empty((r, u), np.float16)
    cases = [
        (dict(row_scale=np.ones(r, np.float32)), None, r"'row_scale' \(a per-row scale, the MoE routing weight\) "
                                                         r"goes with a gathered down projection \(pass 'indices'\)"),
        (dict(indices=ids, row_scale=np.ones(r, np.float64)), ids, r"'row_scale' must be float32, bfloat16 or "
                                                                   r"float16, got float64"),
        (dict(indices=ids, row_scale=np.ones(r, np.int32)), ids, r"'row_scale' must be float32, bfloat16 or float16, "
                                                                 r"got int32"),
        (dict(indices=ids, row_scale=np.ones(r - 1, np.float32)), ids,
         r"'row_scale' must hold m = 6 values, one per output row, got shape \(5,\)"),
        (dict(indices=ids, row_scale=np.ones((3, 4), np.float32)[:, ::2]), ids,
         r"'row_scale' must be contiguous, got shape \(3, 2\) with strides \(4, 2\)"),
    ]
    for kw, idx, match in cases:
        with pytest.raises(E, match=match):
            gatedmlp._C.down(h, w if idx is not None else w[0], out, **kw)
        with pytest.raises(E, match=match):
            gatedmlp._C.make_down_problem(h, w if idx is not None else w[0], **kw)
    # the gate/up half has no row_scale at all
    with pytest.raises(TypeError):
        gatedmlp._C.gate_up(h, f16(e, 2 * u, kk).numpy(), out, indices=ids, row_scale=np.ones(r, np.float32))


def test_gather_down_hands_the_binding_row_scale(monkeypatch):
    rec = record(monkeypatch)
    t, k, e, u, kk = 4, 2, 6, 40, 64
    h, w = f16(t, k, kk), f16(e, u, kk)
    ids = torch.randint(0, e, (t, k))
    s = torch.rand(k, t).T  # a transposed view: handed over contiguous
    gatedmlp.gather_down(h, ids, w, row_scale=s, out=torch.empty(t, k, u, dtype=torch.float32))
    (name, args, kw), = rec.calls
    got = kw["row_scale"]
    assert got.is_contiguous() and torch.equal(got, s)
    gatedmlp.gather_down(h, ids, w)
    assert rec.calls[-1][2]["row_scale"] is None
    with pytest.raises(E, match=r"'row_scale' must hold one scale per row of h, 8 \(h.shape\[:-1\] = \(4, 2\)\), "
                                r"got shape \(4, 3\)"):
        gatedmlp.gather_down(h, ids, w, row_scale=torch.rand(t, 3))
    with pytest.raises(RuntimeError, match="no backward"):
        gatedmlp.gather_down(h, ids, w, row_scale=torch.rand(t, k, requires_grad=True))
    assert len(rec.calls) == 2


def _moe_args(t=5, k=2, e=4, h=64, i=32, dtype=torch.bfloat16):
    x = torch.randn(t, h).to(dtype)
    ids = torch.randint(0, e, (t, k), dtype=torch.int32)
    wts = torch.rand(t, k)
    return x, ids, wts, torch.randn(e, 2 * i, h).to(dtype), torch.randn(e, h, i).to(dtype)


def test_moe_mlp_refuses_by_name_before_any_launch(monkeypatch):
    record(monkeypatch, fail=True)
    t, k, e, h, i = 5, 2, 4, 64, 32
    x, ids, wts, w13, w2 = _moe_args(t, k, e, h, i)
    bf = torch.bfloat16
    cases = [
        (dict(x=x[None]), r"'x' must be \[T, H\] \(2-D\), got shape \(1, 5, 64\)"),
        (dict(x=x.float(), w13=w13.float(), w2=w2.float()), r"'x' must be bfloat16 or float16, got float32"),
        (dict(topk_ids=ids.ravel()), r"'topk_ids' must be \[T, k\] with T = 5 \(x.shape\[0\]\), got shape \(10,\)"),
        (dict(topk_ids=ids[:3]), r"'topk_ids' must be \[T, k\] with T = 5 .*got shape \(3, 2\)"),
        (dict(topk_weights=wts[:, :1]), r"'topk_weights' must be \[T, k\] = \(5, 2\), the shape of 'topk_ids', "
                                        r"got shape \(5, 1\)"),
        (dict(topk_weights=wts.double()), r"'topk_weights' must be float32, bfloat16 or float16, got float64"),
        (dict(w13=w13[0]), r"'w13' must be \[E, 2I, H\] \(the experts' weights one after another\), got shape "
                           r"\(64, 64\)"),
        (dict(w13=w13[:, 1:]), r"'w13' must be \[E, 2I, H\] \(gate and up rows\) with H = 64 \(x.shape\[1\]\), "
                               r"got shape \(4, 63, 64\)"),
        (dict(w13=w13[:, :, :32]), r"'w13' must be \[E, 2I, H\] .*with H = 64 .*got shape \(4, 64, 32\)"),
        (dict(w2=w2[:3]), r"'w2' must be \[E, H, I\] = \(4, 64, 32\) \(E and I from 'w13', H = x.shape\[1\]\), "
                          r"got shape \(3, 64, 32\)"),
        (dict(w2=w2.transpose(1, 2)), r"'w2' must be \[E, H, I\] = \(4, 64, 32\) .*got shape \(4, 32, 64\)"),
        (dict(w2=w2.half()), r"'w2' has dtype float16 but 'x' has bfloat16"),
        (dict(w13=w13.half()), r"'w13' has dtype float16 but 'x' has bfloat16"),
        (dict(b13=torch.zeros(e, i, dtype=bf)), r"'b13' must be \[E, 2I\] = \(4, 64\), got shape \(4, 32\)"),
        (dict(b2=torch.zeros(h, dtype=bf)), r"'b2' must be \[E, H\] = \(4, 64\), got shape \(64,\)"),
        (dict(out=torch.empty(t, k, h, dtype=bf)), r"'out' must be \[T, H\] = \(5, 64\), got shape \(5, 2, 64\)"),
        (dict(activation="swish"), r"activation='swish' is not one of"),
        (dict(first="down"), r"first='down' is not one of"),
    ]
    for change, match in cases:
        kw = dict(x=x, topk_ids=ids, topk_weights=wts, w13=w13, w2=w2)
        kw.update(change)
        args = [kw.pop(n) for n in ("x", "topk_ids", "topk_weights", "w13", "w2")]
        with pytest.raises(E, match=match):
            gatedmlp.moe_mlp(*args, **kw)
    with pytest.raises(RuntimeError, match="no backward"):
        gatedmlp.moe_mlp(x, ids, wts.requires_grad_(), w13, w2)


def test_moe_mlp_hands_the_binding_its_calls(monkeypatch):
    rec = record(monkeypatch)
    t, k, e, h, i = 5, 3, 4, 64, 32
    x, ids, wts, w13, w2 = _moe_args(t, k, e, h, i)
    b13, b2 = torch.zeros(e, 2 * i), torch.zeros(e, h)
    y = gatedmlp.moe_mlp(x, ids.to(torch.uint8), wts, w13, w2, b13, b2, activation="gelu_tanh", group=8, first="up")
    assert y.shape == (t, h) and y.dtype == x.dtype
    (n1, a1, kw1), (n2, a2, kw2) = rec.calls
    assert (n1, n2) == ("gate_up", "down")
    # gate/up: x's rows through each token's k experts, checked once
    assert a1[0].data_ptr() == x.data_ptr() and a1[1].data_ptr() == w13.data_ptr()
    assert a1[2].shape == (t * k, i) and a1[2].dtype == x.dtype
    assert a1[4].data_ptr() == b13.data_ptr()
    assert kw1["rows_per_x"] == k and kw1["rows_per_index"] == 1 and kw1["index_error"] is not None
    assert kw1["activation"] == gatedmlp.Activation.gelu_tanh and kw1["group"] == 8
    assert kw1["first"] == gatedmlp.Half.up
    assert kw1["indices"].dtype == torch.int64  # uint8 ids converted, once
    # down: h's rows, the same ids, the routing weights as row_scale, float32 [T, k, H]; no second check
    assert a2[0].data_ptr() == a1[2].data_ptr()
    assert a2[1].data_ptr() == w2.data_ptr() and a2[4].data_ptr() == b2.data_ptr()
    out32 = a2[2]
    assert out32.shape == (t * k, h) and out32.dtype == torch.float32
    assert kw2["row_scale"].data_ptr() == wts.data_ptr()
    assert kw2["index_error"] is None and kw2["rows_per_x"] == 1 and kw2["rows_per_index"] == 1
    assert kw2["indices"].data_ptr() == kw1["indices"].data_ptr()

    # k = 1: the down projection writes the result itself, in out's dtype
    rec.calls.clear()
    out = torch.empty(t, h, dtype=torch.float16)
    x, ids, wts, w13, w2 = _moe_args(t, 1, e, h, i, torch.float16)
    assert gatedmlp.moe_mlp(x, ids, wts, w13, w2, out=out, check_indices=False) is out
    (_, a1, kw1), (_, a2, kw2) = rec.calls
    assert kw1["index_error"] is None
    assert a2[2].data_ptr() == out.data_ptr() and a2[2].shape == (t, h)

    # no rows (T = 0 or k = 0): zeros, no launch
    rec.calls.clear()
    x, ids, wts, w13, w2 = _moe_args(3, 0, e, h, i)
    assert torch.equal(gatedmlp.moe_mlp(x, ids, wts, w13, w2), torch.zeros(3, h, dtype=x.dtype))
    x, ids, wts, w13, w2 = _moe_args(0, 2, e, h, i)
    assert gatedmlp.moe_mlp(x, ids, wts, w13, w2).shape == (0, h)
    assert rec.calls == []

    # a bad id: IndexError naming topk_ids, raised after the gate/up launch, before the down projection
    rec.bad = (3, 4)
    x, ids, wts, w13, w2 = _moe_args(t, 2, e, h, i)
    with pytest.raises(IndexError, match=r"'topk_ids' holds 4 at position 3, outside \[0, E=4\); nothing was written"):
        gatedmlp.moe_mlp(x, ids, wts, w13, w2)
    assert [c[0] for c in rec.calls] == ["gate_up"]


def test_moe_mlp_repeated_calls_skip_the_checks_not_the_launches(monkeypatch):
    """A repeated signature takes the cached reading of the checks (the
    decode path's host time) and hands the binding exactly what the first,
    fully checked call did; anything the key does not match is checked
    again, and the no-backward guard runs on every call."""
    rec = record(monkeypatch)
    monkeypatch.setattr(gatedmlp, "_MOE_PLANS", {})
    t, k, e, h, i = 3, 2, 4, 64, 32
    x, ids, wts, w13, w2 = _moe_args(t, k, e, h, i)
    b13, b2 = torch.zeros(e, 2 * i, dtype=x.dtype), torch.zeros(e, h, dtype=x.dtype)
    params = gatedmlp.ActivationParams(clamp_alpha=1.5, clamp_limit=6.0)

    def launches():
        rec.calls.clear()
        y = gatedmlp.moe_mlp(x, ids.to(torch.uint8), wts, w13, w2, b13, b2, activation="swiglu_clamped",
                             act_params=params, group=8, first="up", check_indices=False)
        assert y.shape == (t, h) and y.dtype == x.dtype
        return [(n, [None if a is None else (tuple(a.shape), a.dtype) for a in args],
                 {kw: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v for kw, v in kws.items()
                  if kw not in ("workspace_alloc",)})
                for n, args, kws in rec.calls]

    first = launches()
    assert len(gatedmlp._MOE_PLANS) == 1
    second = launches()
    assert len(gatedmlp._MOE_PLANS) == 1
    assert [c[0] for c in first] == ["gate_up", "down"]
    assert second == first
    assert rec.calls[0][2]["act_params"] is params and rec.calls[0][2]["activation"] == gatedmlp.Activation.swiglu_clamped

    # another shape is another key: checked (and refused by name) before any launch
    rec.calls.clear()
    with pytest.raises(E, match=r"'w2' must be \[E, H, I\]"):
        gatedmlp.moe_mlp(x, ids, wts, w13, w2[:, :, :16])
    assert rec.calls == []
    # the guard still runs on a cached signature
    gatedmlp.moe_mlp(x, ids, wts, w13, w2, check_indices=False)
    with pytest.raises(RuntimeError, match="no backward"):
        gatedmlp.moe_mlp(x, ids, wts.clone().requires_grad_(), w13, w2, check_indices=False)
    # a bad id on a cached signature: IndexError after the gate/up launch, as the first call gives it
    gatedmlp.moe_mlp(x, ids, wts, w13, w2)
    rec.calls.clear()
    rec.bad = (1, 9)
    with pytest.raises(IndexError, match=r"'topk_ids' holds 9 at position 1, outside \[0, E=4\)"):
        gatedmlp.moe_mlp(x, ids, wts, w13, w2)
    assert [c[0] for c in rec.calls] == ["gate_up"]


def test_host_tensors_reach_the_library():
    x, ids, wts, w13, w2 = _moe_args()
    with pytest.raises(gatedmlp.Error) as err:
        gatedmlp.moe_mlp(x, ids, wts, w13, w2)
    if not isinstance(err.value, gatedmlp.NoDeviceError):  # without a GPU the library may stop there
        assert isinstance(err.value, E) and "host memory" in str(err.value), str(err.value)


# ---------------------------------------------------------------- MoEExperts on its own
def test_import_moe_module_first():
    # gatedmlp.torch and gatedmlp.moe_module import each other; a fresh
    # interpreter tries the order this session did not.
    import subprocess
    import sys

    code = ("import gatedmlp.moe_module as mm; import gatedmlp.torch as gt; import gatedmlp.hf; "
            "assert gt.MoEExperts is mm.MoEExperts")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_module_basics():
    m = MoEExperts(4, 64, 32, activation="gelu_pytorch_tanh", dtype=torch.bfloat16)
    assert m.activation == "gelu_tanh" and m.w13.shape == (4, 64, 64) and m.w2.shape == (4, 64, 32)
    assert m.b13 is None and m.b2 is None and m.check_indices
    assert list(m.state_dict()) == ["w13", "w2"]
    assert torch.isfinite(m.w13.float()).all() and m.w13.float().std() > 0  # initialised
    m = MoEExperts(4, 64, 32, bias=True, activation="swiglu_clamped", clamp_limit=5.0, group=1)
    assert list(m.state_dict()) == ["w13", "b13", "w2", "b2"] and m.b13.shape == (4, 64)
    assert "clamp_limit=5.0" in repr(m) and "group=1" in repr(m)
    with pytest.raises(E, match=r"group=3 must be 0 \(stacked\) or divide intermediate_size=32"):
        MoEExperts(4, 64, 32, group=3)
    with pytest.raises(E, match=r"checkpoint_layout='gpt_oss' stores w13 with group=1"):
        MoEExperts(4, 64, 32, bias=True, checkpoint_layout="gpt_oss")
    with pytest.raises(E, match="activation 'swish2' is not one of"):
        MoEExperts(4, 64, 32, activation="swish2")


def test_module_forward_raises_where_a_gradient_is_needed():
    m = MoEExperts(4, 64, 32, dtype=torch.bfloat16)
    x, ids, wts = torch.randn(3, 64, dtype=torch.bfloat16), torch.zeros(3, 2, dtype=torch.int64), torch.rand(3, 2)
    with pytest.raises(RuntimeError, match="no backward"):
        m(x, ids, wts)


def test_fake_implementation_traces():
    # meta tensors go through the op's fake implementation: shapes only
    m = MoEExperts(8, 64, 32, device="meta", dtype=torch.bfloat16).requires_grad_(False)
    x = torch.empty(5, 64, device="meta", dtype=torch.bfloat16)
    y = m(x, torch.empty(5, 2, device="meta", dtype=torch.int64), torch.empty(5, 2, device="meta"))
    assert y.shape == (5, 64) and y.dtype == torch.bfloat16 and y.is_meta
    y = m(x.reshape(1, 5, 64), torch.empty(5, 2, device="meta", dtype=torch.int64), torch.empty(5, 2, device="meta"))
    assert y.shape == (1, 5, 64)


# ---------------------------------------------------------------- transformers' experts modules
def tiny_config(family, **overrides):
    """A small config of each family: hidden 64-96, intermediate 32-64,
    4-8 experts, top 2, 2 layers."""
    common = dict(vocab_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64)
    if family == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(**common, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                                          num_experts=8, num_experts_per_tok=2, head_dim=16,
                                          **{"hidden_act": "silu", **overrides})
    elif family == "mixtral":
        cfg = transformers.MixtralConfig(**common, hidden_size=96, intermediate_size=64, num_local_experts=4,
                                         num_experts_per_tok=2, **{"hidden_act": "silu", **overrides})
    elif family == "gpt_oss":
        cfg = transformers.GptOssConfig(**common, hidden_size=64, intermediate_size=48, num_local_experts=4,
                                        num_experts_per_tok=2, head_dim=16, sliding_window=16, **overrides)
    else:
        raise ValueError(family)
    cfg._attn_implementation = "eager"
    return cfg


FAMILIES = ["qwen3_moe", "mixtral", "gpt_oss"]
CLASSES = {"qwen3_moe": ("qwen3_moe", "Qwen3MoeExperts"), "mixtral": ("mixtral", "MixtralExperts"),
           "gpt_oss": ("gpt_oss", "GptOssExperts")}
MODELS = {"qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM", "gpt_oss": "GptOssForCausalLM"}


def experts_class(family):
    mod, name = CLASSES[family]
    return getattr(getattr(transformers.models, mod), f"modeling_{mod}").__dict__[name]


def init_experts(m, seed, scale=1.0):
    """Random weights: gate/up preactivations of a few units for inputs of
    unit scale (gpt-oss's reach its clamp at 7), biases of order 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.dim() == 3:
                # [E, out, in], or gpt-oss's [E, in, out]
                fan_in = p.shape[1] if type(m).__name__ == "GptOssExperts" else p.shape[2]
                p.copy_(torch.randn(p.shape, generator=g) * ((scale if n == "gate_up_proj" else 1) / math.sqrt(fan_in)))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return m


def tiny_experts(family, dtype=torch.bfloat16, seed=0, **overrides):
    cfg = tiny_config(family, **overrides)
    cfg._experts_implementation = "eager"  # the module's own loop over the experts
    torch.manual_seed(seed)
    m = experts_class(family)(cfg)
    init_experts(m, seed, scale=3.0 if family == "gpt_oss" else 1.0)
    return m.to(dtype).eval()


def routing(t, k, e, seed, dtype=torch.float32, device="cpu"):
    """transformers-style top-k routing of random logits: ids [T, k] (int64)
    and softmax weights over the chosen."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(t, e, generator=g)
    top, ids = logits.topk(k, dim=-1)
    return ids.to(device), top.softmax(-1).to(dtype).to(device)


def module_function64(m, x, ids, wts):
    """What a MoEExperts computes, from its own tensors, in float64."""
    return moe_reference(x, ids, wts, m.w13, m.w2, m.b13, m.b2, m.activation, m.group, m.first, m.clamp_alpha,
                         m.clamp_limit)


def original64(original, x, ids, wts):
    """The transformers module's own forward, in float64 (a copy)."""
    ref = copy.deepcopy(original).double()
    with torch.no_grad():
        return ref(x.double(), ids, wts.double())


@needs_transformers
@pytest.mark.parametrize("family", FAMILIES)
def test_from_module_maps_the_layout(family):
    original = tiny_experts(family)
    m = MoEExperts.from_module(original)
    e = original.gate_up_proj.shape[0]
    assert m.num_experts == e and m.replaces == type(original).__name__
    if family == "gpt_oss":
        h, i = original.gate_up_proj.shape[1], original.gate_up_proj.shape[2] // 2
        assert (m.hidden_size, m.intermediate_size, m.group, m.first) == (h, i, 1, "gate")
        assert (m.activation, m.clamp_alpha, m.clamp_limit) == ("swiglu_clamped", original.alpha, original.limit)
        # a one-time copy into [E, 2I, H] / [E, H, I], rows contiguous; the biases as they are
        assert m.w13.shape == (e, 2 * i, h) and m.w13.is_contiguous()
        assert torch.equal(m.w13, original.gate_up_proj.transpose(1, 2))
        assert m.w13.data_ptr() != original.gate_up_proj.data_ptr()
        assert m.w2.shape == (e, h, i) and m.w2.is_contiguous()
        assert torch.equal(m.w2, original.down_proj.transpose(1, 2))
        assert m.b13 is original.gate_up_proj_bias and m.b2 is original.down_proj_bias
        # gate = even columns of the checkpoint = even rows of w13 (group 1, gate first)
        g_rows, u_rows = fused_halves(i, 1, "gate")
        assert torch.equal(m.w13[:, g_rows], original.gate_up_proj[:, :, ::2].transpose(1, 2))
        assert torch.equal(m.w13[:, u_rows], original.gate_up_proj[:, :, 1::2].transpose(1, 2))
    else:
        h, i = original.gate_up_proj.shape[2], original.gate_up_proj.shape[1] // 2
        assert (m.hidden_size, m.intermediate_size, m.group, m.first, m.activation) == (h, i, 0, "gate", "silu")
        # the same parameters: no copy, tied to the original
        assert m.w13 is original.gate_up_proj and m.w2 is original.down_proj
        assert m.b13 is None and m.b2 is None
    # the same function (float64 from the same bf16 values: no kernel)
    t, k = 9, 2
    x = torch.randn(t, h, dtype=torch.float64) * (3 if family == "gpt_oss" else 1)
    ids, wts = routing(t, k, e, seed=1)
    ids[0] = torch.tensor([1, 1])  # a duplicate id within a token
    torch.testing.assert_close(module_function64(m, x, ids, wts), original64(original, x, ids, wts), rtol=1e-10,
                               atol=1e-10)


@needs_transformers
@pytest.mark.parametrize("hidden_act, want", [("gelu_pytorch_tanh", "gelu_tanh"), ("gelu", "gelu_erf"),
                                              ("relu", "relu")])
def test_from_module_reads_the_activation(hidden_act, want):
    original = tiny_experts("qwen3_moe", hidden_act=hidden_act)
    m = MoEExperts.from_module(original)
    assert m.activation == want
    x = torch.randn(4, 64, dtype=torch.float64)
    ids, wts = routing(4, 2, 8, seed=2)
    torch.testing.assert_close(module_function64(m, x, ids, wts), original64(original, x, ids, wts), rtol=1e-10,
                               atol=1e-10)


def _refusals():
    if transformers is None:
        return {}

    def subclass():
        cls = experts_class("mixtral")

        class Scaled(cls):
            def forward(self, hidden_states, top_k_index, top_k_weights):
                return 2 * super().forward(hidden_states, top_k_index, top_k_weights)
        m = tiny_experts("mixtral")
        m.__class__ = Scaled
        return m

    def instance_forward():
        m = tiny_experts("qwen3_moe")
        m.forward = lambda *a: None
        return m

    def hooked():
        m = tiny_experts("qwen3_moe")
        m.register_forward_hook(lambda *a: None)
        return m

    def extra_parameter():
        m = tiny_experts("mixtral")
        m.scale = nn.Parameter(torch.ones(1))
        return m

    def wrong_activation():
        return tiny_experts("qwen3_moe", hidden_act="relu2")

    def gpt_oss_gate():
        m = tiny_experts("gpt_oss")
        m._apply_gate = lambda x: x
        return m

    def bad_shape():
        m = tiny_experts("mixtral")
        m.down_proj = nn.Parameter(m.down_proj[:, :, :-1].clone())
        return m

    return {
        "subclass": (subclass, r"its class [\w.<>]+Scaled derives from a transformers experts class"),
        "instance forward": (instance_forward, r"forward replaced on the instance"),
        "hook": (hooked, r"the module has forward_hooks"),
        "extra parameter": (extra_parameter, r"its parameters are \(gate_up_proj, down_proj, scale\)"),
        "activation": (wrong_activation, r"activation ReLUSquaredActivation is not one gatedmlp computes"),
        "gpt-oss gate": (gpt_oss_gate, r"_apply_gate replaced on the instance"),
        "shape": (bad_shape, r"its weights are not gate_up_proj \[E, 2I, H\] and down_proj \[E, H, I\]"),
        "not experts": (lambda: nn.Linear(4, 4), r"it is not one of the experts classes gatedmlp knows"),
    }


REFUSALS = _refusals()


@needs_transformers
@pytest.mark.parametrize("what", list(REFUSALS))
def test_from_module_refuses(what):
    make, reason = REFUSALS[what]
    with pytest.raises(gatedmlp.NotSupportedError, match=r"cannot build MoEExperts from [\w.<>]+: " + reason):
        MoEExperts.from_module(make())


@needs_transformers
def test_from_module_takes_an_activation_it_cannot_read():
    original = tiny_experts("qwen3_moe", hidden_act="relu2")
    assert MoEExperts.from_module(original, activation="relu").activation == "relu"


@needs_transformers
@pytest.mark.parametrize("family", FAMILIES)
def test_state_dict_keeps_the_checkpoint_layout(family):
    original = tiny_experts(family)
    before = {k: v.clone() for k, v in original.state_dict().items()}
    m = MoEExperts.from_module(original)
    after = m.state_dict(prefix="experts.")
    assert list(after) == [f"experts.{k}" for k in before]
    for k, v in before.items():
        assert after[f"experts.{k}"].shape == v.shape and torch.equal(after[f"experts.{k}"], v), k
    # an unpatched module loads it, a MoEExperts loads the checkpoint's form and its own
    fresh = tiny_experts(family, seed=5)
    fresh.load_state_dict(m.state_dict())
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, before[k]), k
    again = MoEExperts.from_module(tiny_experts(family, seed=6))
    again.load_state_dict(before)
    assert torch.equal(again.w13, m.w13) and torch.equal(again.w2, m.w2) and again.w13.is_contiguous()
    plain = MoEExperts(m.num_experts, m.hidden_size, m.intermediate_size, bias=m.b13 is not None, group=m.group,
                       dtype=torch.bfloat16)
    own = {"w13": m.w13, "b13": m.b13, "w2": m.w2, "b2": m.b2}
    own = {k: v for k, v in own.items() if v is not None}
    plain.load_state_dict(own)
    assert list(plain.state_dict()) == list(own) and torch.equal(plain.w13, m.w13)


# ---------------------------------------------------------------- patch_model on MoE models
def tiny_model(family, dtype=torch.bfloat16, seed=0, **overrides):
    torch.manual_seed(seed)
    model = getattr(transformers, MODELS[family])(tiny_config(family, **overrides))
    for layer in model.model.layers:
        experts = layer.mlp.experts
        init_experts(experts, seed + 17, scale=3.0 if family == "gpt_oss" else 1.0)
    return model.to(dtype).eval()


EXPERTS_NAMES = [f"model.layers.{i}.mlp.experts" for i in range(2)]


@needs_transformers
@pytest.mark.parametrize("family", FAMILIES)
def test_patch_model_swaps_the_experts(family):
    model = tiny_model(family)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    originals = {n: model.get_submodule(n) for n in EXPERTS_NAMES}
    assert gt.patch_model(model) == EXPERTS_NAMES
    for n in EXPERTS_NAMES:
        new = model.get_submodule(n)
        assert type(new) is MoEExperts and new.replaces == type(originals[n]).__name__ and not new.training
        assert new.w13.dtype == torch.bfloat16
        if family != "gpt_oss":
            assert new.w13 is originals[n].gate_up_proj
        x = torch.randn(6, new.hidden_size, dtype=torch.float64)
        ids, wts = routing(6, 2, new.num_experts, seed=3)
        original = copy.deepcopy(originals[n])
        original.config._experts_implementation = "eager"
        torch.testing.assert_close(module_function64(new, x, ids, wts), original64(original, x, ids, wts),
                                   rtol=1e-10, atol=1e-10)
    # the routers are the model's
    assert type(model.model.layers[0].mlp).__name__ in ("Qwen3MoeSparseMoeBlock", "MixtralSparseMoeBlock",
                                                          "GptOssMLP")
    # the checkpoint's keys, shapes and values; an unpatched model loads them
    after = model.state_dict()
    assert list(after) == list(before)
    for k, v in before.items():
        assert after[k].shape == v.shape and torch.equal(after[k], v), k
    fresh = tiny_model(family, seed=1)
    fresh.load_state_dict(after)
    again = tiny_model(family, seed=2)
    gt.patch_model(again)
    again.load_state_dict(before)
    for k, v in again.state_dict().items():
        assert torch.equal(v, before[k]), k
    # patching again finds nothing left to do
    assert gt.patch_model(model) == []


@needs_transformers
@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])
def test_meta_model_patches_and_loads_with_assign(family):
    ref = tiny_model(family)
    with torch.device("meta"):
        model = tiny_model(family)
    assert gt.patch_model(model) == EXPERTS_NAMES
    assert model.model.layers[0].mlp.experts.w13.is_meta
    model.load_state_dict(ref.state_dict(), assign=True)
    new, old = model.model.layers[0].mlp.experts, ref.model.layers[0].mlp.experts
    assert not new.w13.is_meta and new.w13.is_contiguous()
    if family == "gpt_oss":
        assert torch.equal(new.w13, old.gate_up_proj.transpose(1, 2))
        assert torch.equal(new.w2, old.down_proj.transpose(1, 2)) and torch.equal(new.b13, old.gate_up_proj_bias)
    else:
        assert torch.equal(new.w13, old.gate_up_proj) and torch.equal(new.w2, old.down_proj)


@needs_transformers
def test_patch_model_reports_dense_and_experts_together():
    # Qwen3-MoE with a dense MLP in layer 0 (mlp_only_layers): both kinds swapped, in the model's order
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(tiny_config("qwen3_moe", mlp_only_layers=[0])).to(torch.bfloat16)
    assert gt.patch_model(model.eval()) == ["model.layers.0.mlp", "model.layers.1.mlp.experts"]
    assert type(model.model.layers[0].mlp).__name__ == "HFGatedMLP"
    assert type(model.model.layers[1].mlp.experts) is MoEExperts


@needs_transformers
def test_patch_model_refusals():
    model = tiny_model("mixtral", dtype=torch.float32)
    with pytest.raises(gatedmlp.NotSupportedError, match=r"cannot swap model\.layers\.0\.mlp\.experts "
                                                         r"\(MixtralExperts\): its weights are torch.float32"):
        gt.patch_model(model)
    model = tiny_model("qwen3_moe")
    model.model.layers[1].mlp.experts.register_forward_pre_hook(lambda *a: None)
    with pytest.raises(gatedmlp.NotSupportedError, match=r"model\.layers\.1\.mlp\.experts .*forward_pre_hooks"):
        gt.patch_model(model)
    assert type(model.model.layers[0].mlp.experts).__name__ == "Qwen3MoeExperts"  # strict: nothing swapped
    with pytest.warns(UserWarning, match=r"model\.layers\.1\.mlp\.experts: the module has forward_pre_hooks"):
        assert gt.patch_model(model, strict=False) == ["model.layers.0.mlp.experts"]
    with pytest.raises(gatedmlp.NotSupportedError, match="MoEExperts.from_module"):
        gt.patch_model(tiny_experts("mixtral"))


@needs_transformers
def test_shared_experts_stay_shared():
    model = tiny_model("gpt_oss")
    model.model.layers[1].mlp.experts = model.model.layers[0].mlp.experts
    assert gt.patch_model(model) == EXPERTS_NAMES
    assert model.model.layers[0].mlp.experts is model.model.layers[1].mlp.experts


# ================================================================ on a GPU
def random_cases(n):
    r = random.Random(SEED)
    fixed = [dict(t=1, k=1, e=1), dict(t=1, k=8, e=64), dict(t=64, k=2, e=8), dict(t=64, k=4, e=16),
             dict(t=17, k=2, e=3), dict(t=1, k=2, e=4), dict(t=64, k=8, e=8)]
    cases = []
    for j in range(n):
        c = dict(fixed[j]) if j < len(fixed) else dict(t=r.choice([1, 2, 5, 17, 40, 64]), k=r.choice([1, 2, 4, 8]),
                                                         e=r.choice([1, 3, 8, 32, 128]))
        i = r.choice([16, 32, 48, 96, 136])
        c.update(h=r.choice([64, 72, 128, 256, 520]), i=i, dtype=r.choice(["bf16", "fp16"]), act=ACTS[j % len(ACTS)],
                 group=r.choice([0, 0, 1] + [g for g in (8, 16) if i % g == 0]), first=r.choice(["gate", "gate", "up"]),
                 bias=r.choice([None, "same", "fp32"]), wts=r.choice(["fp32", "same"]),
                 ids=r.choice(["int32", "int64"]), route=r.choice(["topk", "dup", "uniform", "skewed"]),
                 out=r.choice([False, True]), seed=r.randrange(1 << 30))
        cases.append(c)
    return cases


CASES = random_cases(30)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _id(c):
    return (f"t{c['t']}k{c['k']}e{c['e']}H{c['h']}I{c['i']}-{c['dtype']}-{c['act']}-g{c['group']}{c['first']}-"
            f"{'bias' if c['bias'] else 'nobias'}-{c['route']}")


def route_ids(r, t, k, e, kind):
    if kind == "topk" and k <= e:
        return [r.sample(range(e), k) for _ in range(t)]
    if kind == "dup":
        return [[r.randrange(e)] * k for _ in range(t)]
    if kind == "skewed":
        hot = r.randrange(e)
        return [[hot if r.random() < 0.8 else r.randrange(e) for _ in range(k)] for _ in range(t)]
    return [[r.randrange(e) for _ in range(k)] for _ in range(t)]


@on_gpu
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_moe_mlp(case):
    c = case
    r = random.Random(c["seed"])
    torch.manual_seed(c["seed"])
    dt = DTYPES[c["dtype"]]
    t, k, e, h, i = c["t"], c["k"], c["e"], c["h"], c["i"]
    scale = 4.0 if c["act"] == "swiglu_clamped" else 1.0  # reach the clamps
    x = (torch.randn(t, h, device=DEV) * scale).to(dt)
    w13 = (torch.randn(e, 2 * i, h, device=DEV) / math.sqrt(h)).to(dt)
    w2 = (torch.randn(e, h, i, device=DEV) / math.sqrt(i)).to(dt)
    b13 = b2 = None
    if c["bias"]:
        bdt = torch.float32 if c["bias"] == "fp32" else dt
        b13, b2 = torch.randn(e, 2 * i, device=DEV).to(bdt), torch.randn(e, h, device=DEV).to(bdt)
    ids = torch.tensor(route_ids(r, t, k, e, c["route"]), device=DEV,
                       dtype=torch.int64 if c["ids"] == "int64" else torch.int32).reshape(t, k)
    wts = torch.rand(t, k, device=DEV).softmax(-1).to(torch.float32 if c["wts"] == "fp32" else dt)
    params = gatedmlp.ActivationParams(clamp_alpha=1.702, clamp_limit=7.0)
    ref = moe_reference(x, ids, wts, w13, w2, b13, b2, c["act"], c["group"], c["first"])
    unf = moe_reference(x, ids, wts, w13, w2, b13, b2, c["act"], c["group"], c["first"], dtype=dt)
    out = torch.full((t, h), float("nan"), device=DEV, dtype=dt) if c["out"] else None
    y = gatedmlp.moe_mlp(x, ids, wts, w13, w2, b13, b2, activation=c["act"], act_params=params, group=c["group"],
                         first=c["first"], out=out)
    assert y.shape == (t, h) and y.dtype == dt
    if out is not None:
        assert y is out
    torch.cuda.synchronize()
    assert_within_rule(y, unf, ref, _id(c))


@on_gpu
@pytest.mark.parametrize("sdtype", ["fp32", "bf16", "fp16"])
def test_gather_down_row_scale(sdtype):
    torch.manual_seed(3)
    t, k, e, kk, u = 9, 4, 8, 136, 72
    dt = torch.bfloat16
    h = torch.randn(t, k, kk, device=DEV, dtype=dt)
    w = (torch.randn(e, u, kk, device=DEV) / math.sqrt(kk)).to(dt)
    bias = torch.randn(e, u, device=DEV)
    ids = torch.randint(0, e, (t, k), device=DEV)
    s = (torch.rand(t, k, device=DEV) * 2 - 0.5).to(DTYPES[sdtype])
    ref = torch.empty(t * k, u, dtype=torch.float64, device=DEV)
    unf = torch.empty(t * k, u, dtype=torch.float32, device=DEV)
    flat, hf, sf = ids.reshape(-1), h.reshape(-1, kk), s.reshape(-1)
    for ex in flat.unique().tolist():
        rows = (flat == ex).nonzero().flatten()
        ref[rows] = sf[rows].double()[:, None] * (hf[rows].double() @ w[ex].double().T + bias[ex].double())
        unf[rows] = (sf[rows].to(dt)[:, None] * ((hf[rows] @ w[ex].T) + bias[ex].to(dt))).float()
    y = torch.full((t, k, u), float("nan"), device=DEV)
    gatedmlp.gather_down(h, ids, w, bias, row_scale=s, out=y)
    torch.cuda.synchronize()
    assert_within_rule(y.reshape(t * k, u), unf, ref, f"row_scale {sdtype}", rel_atol=1e-6, max_atol=1e-6)
    # without it: the unscaled projection
    y1 = gatedmlp.gather_down(h, ids, w, bias, out=torch.empty(t, k, u, device=DEV))
    torch.testing.assert_close(y, y1 * s.float()[..., None], rtol=1e-5, atol=1e-5)


@on_gpu
def test_moe_mlp_bad_id_raises_and_writes_nothing():
    t, k, e, h, i = 6, 2, 8, 128, 64
    dt = torch.bfloat16
    x = torch.randn(t, h, device=DEV, dtype=dt)
    w13, w2 = torch.randn(e, 2 * i, h, device=DEV, dtype=dt), torch.randn(e, h, i, device=DEV, dtype=dt)
    ids = torch.randint(0, e, (t, k), device=DEV)
    wts = torch.rand(t, k, device=DEV)
    out = torch.full((t, h), float("nan"), device=DEV, dtype=dt)
    ids[2, 1] = e  # transformers' "masking index": refused, not skipped
    with pytest.raises(IndexError, match=r"'topk_ids' holds 8 at position 5, outside \[0, E=8\); nothing was written"):
        gatedmlp.moe_mlp(x, ids, wts, w13, w2, out=out)
    ids[2, 1] = -1
    with pytest.raises(IndexError, match=r"'topk_ids' holds -1 at position 5"):
        gatedmlp.moe_mlp(x, ids, wts, w13, w2, out=out)
    torch.cuda.synchronize()
    assert torch.isnan(out).all()
    m = MoEExperts(e, h, i, device=DEV, dtype=dt).requires_grad_(False)
    assert m.check_indices == "async"  # the default: no synchronisation per forward
    m.check_indices = True  # read back: a recoverable IndexError
    with pytest.raises(IndexError, match=r"'topk_ids' holds -1"):
        m(x, ids, wts)


_ASYNC_BAD_ID = """
import sys, torch
sys.path[:0] = {path!r}
import gatedmlp
from gatedmlp.torch import MoEExperts
e, h, i, t, k = 8, 128, 64, {t}, 2
m = MoEExperts(e, h, i, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
ids = torch.randint(0, e, (t, k), device="cuda")
wts = torch.rand(t, k, device="cuda")
call = {call!r}
run = ((lambda: m(x, ids, wts)) if call == "module" else
       (lambda: gatedmlp.gather_gate_up(x, ids, m.w13, check_indices="async")))
run()  # good ids first: the repeated signature (a decode step's) is the one checked below
torch.cuda.synchronize()
ids[t // 2, 1] = {bad}
y = run()
torch.cuda.synchronize()
print("NOT REPORTED", float(y.float().abs().sum()))
"""


@on_gpu
@pytest.mark.parametrize("t,bad,call", [(3, 8, "module"), (3, -1, "module"), (4096, 8, "module"),
                                        (3, 8, "gather")])  # the gathered path; the grouped one (large T)
def test_moe_experts_async_check_fails_the_stream(t, bad, call):
    """MoEExperts' default check (on the device, no read back): a bad id
    is a device-side assertion (the gathered kernel's own, Arguments.
    index_trap; the grouped path's before its sort), reported at the next
    synchronisation, as PyTorch's own kernels report an out-of-range index.
    It kills the CUDA context, so it runs in a process of its own."""
    import subprocess
    import sys

    code = _ASYNC_BAD_ID.format(path=[p for p in sys.path if p], t=t, bad=bad, call=call)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "NOT REPORTED" not in r.stdout, (r.stdout, r.stderr[-2000:])
    assert "assert" in r.stderr.lower(), r.stderr[-2000:]


def _module_errors(family, dtype_w=torch.bfloat16, t=7, seed=0):
    """(MoEExperts.from_module's output, the module's own in bf16, in float32)."""
    original = tiny_experts(family, seed=seed).to(DEV)
    m = MoEExperts.from_module(original)
    e = m.num_experts
    x = torch.randn(t, m.hidden_size, device=DEV) * (3 if family == "gpt_oss" else 1)
    x = x.to(torch.bfloat16)
    ids, wts = routing(t, 2, e, seed=seed + 1, dtype=dtype_w, device=DEV)
    with torch.no_grad():
        mine = m(x, ids, wts)
        own = original(x, ids, wts)
        ref32 = copy.deepcopy(original).float()(x.float(), ids, wts.float())
    return mine, own, ref32


@on_gpu
@needs_transformers
@pytest.mark.parametrize("t", [1, 7, 64])
@pytest.mark.parametrize("family", FAMILIES)
def test_from_module_matches_the_module(family, t):
    """bf16 weights (the kernels take bf16 and fp16): the transformers
    module run in float32 on those weights is the reference, the module run
    in bf16 the baseline. gatedmlp rounds h once and sums in fp32, so its
    error is at most about the module's own bf16 error."""
    for dtype_w in (torch.bfloat16, torch.float32):
        mine, own, ref32 = _module_errors(family, dtype_w, t=t, seed=t)
        what = f"{family} T={t} routing weights {dtype_w}"
        assert mine.dtype == torch.bfloat16 and mine.shape == own.shape
        assert_within_rule(mine, own, ref32, what)
        rel, _ = errors(mine, ref32)
        assert rel <= 1.5e-2, f"{what}: rel err {rel:.3e} against float32"
        rel_own, _ = errors(mine, own.double())
        assert rel_own <= 2e-2, f"{what}: rel diff {rel_own:.3e} from the module's bf16 forward"


@on_gpu
def test_moe_experts_in_a_cuda_graph():
    t, k, e, h, i = 8, 2, 16, 256, 64
    dt = torch.bfloat16
    m = MoEExperts(e, h, i, bias=True, activation="swiglu_clamped", group=1, device=DEV,
                   dtype=dt).requires_grad_(False)
    x = torch.randn(t, h, device=DEV, dtype=dt)
    ids = torch.randint(0, e, (t, k), device=DEV)
    wts = torch.rand(t, k, device=DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        m(x, ids, wts)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # the index check is skipped while capturing
        y = m(x, ids, wts)
    for _ in range(3):
        x.copy_(torch.randn(t, h, device=DEV))
        ids.copy_(torch.randint(0, e, (t, k), device=DEV))
        wts.copy_(torch.rand(t, k, device=DEV))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, m(x, ids, wts))


def _experts_inputs(model):
    """Forward hooks recording each experts module's inputs and output."""
    seen = {}

    def hook(name):
        def record(mod, args, output):
            seen[name] = (tuple(a.detach().clone() for a in args), output.detach().clone())
        return record
    handles = [model.get_submodule(n).register_forward_hook(hook(n)) for n in EXPERTS_NAMES]
    return seen, handles


@on_gpu
@needs_transformers
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_the_unpatched_model(family):
    """Patched bf16 logits against the unpatched model's. Routing is
    discontinuous: the experts' rounding moves layer 1's input a little, and
    a token whose top-k has a near tie (seen on the CPU emulation: 0.16321
    against 0.16303) may pick another expert there, which changes that
    token's logits by much more than any rounding. So each experts module
    is checked on the very inputs (hidden states, ids, weights) the
    unpatched model gave it, against its own output there and a float32
    run of it; the logits are compared, under a tolerance suited to bf16,
    at the positions every layer routed alike (in two layers a flip can
    only be in the last, so it changes its own position only), which must
    be most of them; and top-1 must agree on most positions overall."""
    model = tiny_model(family, initializer_range=0.05).to(DEV)
    torch.manual_seed(1)
    tokens = torch.randint(0, 128, (2, 24), device=DEV)
    originals = {n: copy.deepcopy(model.get_submodule(n)) for n in EXPERTS_NAMES}
    with torch.no_grad():
        seen, handles = _experts_inputs(model)
        unpatched = model(tokens).logits.float()
        for hdl in handles:
            hdl.remove()
        assert gt.patch_model(model) == EXPERTS_NAMES
        seen_patched, handles = _experts_inputs(model)
        patched = model(tokens).logits.float()
        for hdl in handles:
            hdl.remove()
        for n in EXPERTS_NAMES:
            args, eager = seen[n]
            mine = model.get_submodule(n)(*args)
            ref = copy.deepcopy(originals[n]).float()
            ref.config._experts_implementation = "eager"  # the loop over the experts, in float32
            ref32 = ref(args[0].float(), args[1], args[2].float())
            assert_within_rule(mine, eager, ref32, f"{family} {n}")
    assert torch.isfinite(patched).all()
    routed_alike = torch.ones(tokens.numel(), dtype=torch.bool, device=DEV)
    for n in EXPERTS_NAMES:
        ids_u, ids_p = seen[n][0][1].sort(-1).values, seen_patched[n][0][1].sort(-1).values
        routed_alike &= (ids_u == ids_p).all(-1)
    assert routed_alike.float().mean().item() >= 0.9, f"routing differs at {(~routed_alike).sum().item()} positions"
    p, u = patched.reshape(-1, patched.shape[-1]), unpatched.reshape(-1, unpatched.shape[-1])
    scale = u.abs().max().item()
    diff = (p - u)[routed_alike].abs().max().item()
    assert diff <= 0.05 * scale, f"max |patched - unpatched| {diff:.3e} > 5% of max |logit| {scale:.3e}"
    rel, _ = errors(p[routed_alike], u[routed_alike])
    assert rel <= 2e-2, f"relative difference of the logits {rel:.3e}"
    agree = (p.argmax(-1) == u.argmax(-1)).float().mean().item()
    assert agree >= 0.9, f"top-1 agrees on {agree:.0%} of the positions"
