"""The grouped (prefill) Mixture-of-Experts path from Python: moe_sort,
grouped_gate_up (the binding's grouped=True, indices = cumulative offsets)
and moe_mlp's grouped path (grouped_gate_up, then torch._grouped_mm for the
down projection).

Without a GPU (PyTorch CPU tensors): every malformed argument of
grouped_gate_up refused by name with its values before anything is
allocated or launched (the binding replaced by a recorder that fails if
called); what grouped_gate_up hands the binding (grouped=True, the offsets
as indices, rows_per_x = rows_per_index = 1, the offsets check) and the
ValueError it raises for each kind of bad offsets; moe_sort against a
plain Python sort (stable order, offsets, inverse; empty experts, the first
and the last among them; no rows) and its refusals; moe_mlp's grouped path
end to end on the host (the binding's gate/up stood in for by a float64
loop over the experts, torch._grouped_mm on its CPU fallback) against the
float64 reference of test_moe, and its choice of path.

On a GPU with compute capability 9.0 (the grouped kernel is Hopper's):
random grouped_gate_up cases (R, K and U of odd sizes, E in {1, 3, 8, 33},
uniform, skewed, one-expert and empty-expert routings, stacked, interleaved,
grouped-by-16/64 and separate weights, first=up, biases, every activation,
bf16 and fp16, alpha != 1) against a float64 loop over the experts under the
fused suite's tolerance rule (test_gpu.py); bad offsets raise ValueError and
write nothing; R = 0; 70000 rows; moe_sort on the device; moe_mlp with
GATEDMLP_MOE_GROUPED=1 and =0 on the same inputs, each against the float64
reference under test_moe's rule and the two against each other, the path
each took, a bad id, and the grouped path in a CUDA graph. Outputs are
poisoned with NaN first.
"""

import math
import os
import random

import pytest

torch = pytest.importorskip("torch")

import gatedmlp  # noqa: E402
from binding_recorder import Recorder, record  # noqa: E402,F401
from refs import act_torch, fused_halves, moe_reference  # noqa: E402
from test_gather import expert_weights  # noqa: E402
from test_moe import assert_within_rule as moe_rule  # noqa: E402
from test_moe import errors  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
HOPPER = HAS_CUDA and tuple(torch.cuda.get_device_capability()) == (9, 0)
DEV = "cuda"
SEED = int(os.environ.get("GATEDMLP_TEST_SEED", "20261129"))
ACTS = ["silu", "gelu_tanh", "gelu_erf", "relu", "swiglu_clamped"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
E = gatedmlp.InvalidArgumentError


def on_gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")(test))


def on_hopper(test):
    """The grouped kernel's tests: marked gpu, skipped unless the device has
    compute capability 9.0."""
    return pytest.mark.gpu(pytest.mark.skipif(not HOPPER, reason="no sm_90 (Hopper) CUDA device")(test))


if HAS_CUDA:
    # The fused suite's tolerance rule.
    from test_gpu import assert_within_rule


def bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


# ================================================================ without a GPU
def test_names():
    for name in ("moe_sort", "MoESort", "grouped_gate_up"):
        assert name in gatedmlp.__all__ and hasattr(gatedmlp, name), name
    assert gatedmlp.MoESort._fields == ("order", "offsets", "inverse")
    assert gatedmlp._GROUPED_MIN_ROWS_PER_EXPERT == 32


def _grouped_args(r=10, e=3, kk=64, u=32, dtype=torch.bfloat16):
    x = torch.randn(r, kk).to(dtype)
    offsets = torch.tensor([3, 3, r][:e] if e == 3 else [r] * e, dtype=torch.int32)
    return x, offsets, torch.randn(e, 2 * u, kk).to(dtype)


def test_grouped_gate_up_refuses_by_name_before_any_launch(monkeypatch):
    record(monkeypatch, fail=True)
    r, e, kk, u = 10, 3, 64, 32
    x, offs, w = _grouped_args(r, e, kk, u)
    wg, wu = bf16(e, u, kk), bf16(e, u, kk)
    cases = [
        (dict(x=x[None]), r"'x' must be \[R, K\] \(2-D, the rows sorted by expert\), got shape \(1, 10, 64\)"),
        (dict(x=x[0]), r"'x' must be \[R, K\] .*got shape \(64,\)"),
        (dict(offsets=offs[None]), r"'offsets' must be \[E\] = \(3,\) cumulative row ends, one per expert of 'w', "
                                   r"got shape \(1, 3\)"),
        (dict(offsets=torch.tensor([3, 10], dtype=torch.int32)), r"'offsets' must be \[E\] = \(3,\) .*got shape "
                                                                 r"\(2,\)"),
        (dict(offsets=torch.tensor([3, 3, 5, 10], dtype=torch.int32)), r"'offsets' must be \[E\] = \(3,\) .*got "
                                                                       r"shape \(4,\)"),
        (dict(offsets=offs.float()), r"'offsets' must be int32 or int64 \(cumulative row ends\), got float32"),
        (dict(offsets=offs.bool()), r"'offsets' must be int32 or int64 .*got bool"),
        (dict(w=w[0]), r"'w' must be \[E, 2U, K\] \(the experts' weights one after another\), got shape \(64, 64\)"),
        (dict(w=w[None]), r"'w' must be \[E, 2U, K\] \(the experts' weights .*got shape \(1, 3, 64, 64\)"),
        (dict(w=w[:, :, :32]), r"'w' must be \[E, 2U, K\] with K = 64 \(x.shape\[1\]\), got shape \(3, 64, 32\)"),
        (dict(w=w[:, 1:]), r"'w' must be \[E, 2U, K\] \(the gate and up rows, an even number\), got shape "
                           r"\(3, 63, 64\)"),
        (dict(w=w[:0], offsets=offs[:0]), r"'w' holds no experts \(E = 0\)"),
        (dict(w=wg, w_up=bf16(e + 1, u, kk)), r"'w_up' must have the shape of 'w' \(3, 32, 64\), got \(4, 32, 64\)"),
        (dict(w=wg, w_up=wu[:, :, :32]), r"'w_up' must have the shape of 'w' \(3, 32, 64\), got \(3, 32, 32\)"),
        (dict(w=wg, w_up=wu, offsets=offs[:2]), r"'offsets' must be \[E\] = \(3,\)"),
        (dict(bias=torch.zeros(2 * u)), r"'bias' must be \[E, 2U\] = \(3, 64\) \(one bias per expert\), got shape "
                                        r"\(64,\)"),
        (dict(bias=torch.zeros(e, u)), r"'bias' must be \[E, 2U\] = \(3, 64\) .*got shape \(3, 32\)"),
        (dict(w=wg, w_up=wu, bias=torch.zeros(e, 2 * u), bias_up=torch.zeros(e, u)),
         r"'bias' must be \[E, U\] = \(3, 32\) .*got shape \(3, 64\)"),
        (dict(w=wg, w_up=wu, bias=torch.zeros(e, u), bias_up=torch.zeros(u)),
         r"'bias_up' must be \[E, U\] = \(3, 32\), got shape \(32,\)"),
        (dict(out=torch.empty(r, 2 * u, dtype=torch.bfloat16)), r"'out' must be \[R, U\] = \(10, 32\), got shape "
                                                                 r"\(10, 64\)"),
        (dict(out=torch.empty(1, r, u, dtype=torch.bfloat16)), r"'out' must be \[R, U\] = \(10, 32\), got shape "
                                                                r"\(1, 10, 32\)"),
        (dict(activation="swish"), r"activation='swish' is not one of"),
        (dict(first="down"), r"first='down' is not one of"),
    ]
    for change, match in cases:
        kw = dict(x=x, offsets=offs, w=w)
        kw.update(change)
        args = [kw.pop(n) for n in ("x", "offsets", "w")]
        with pytest.raises(E, match=match):
            gatedmlp.grouped_gate_up(*args, **kw)
    with pytest.raises(RuntimeError, match="no backward"):
        gatedmlp.grouped_gate_up(x, offs, w.clone().requires_grad_())
    with pytest.raises(TypeError):
        gatedmlp.grouped_gate_up(x, offs, w, preact=torch.empty(r, 2 * u))  # no pre-activation output grouped


def test_grouped_gate_up_hands_the_binding_its_call(monkeypatch):
    rec = record(monkeypatch)
    r, e, kk, u = 10, 3, 64, 32
    x, offs, w = _grouped_args(r, e, kk, u)
    b = torch.zeros(e, 2 * u)
    params = gatedmlp.ActivationParams(clamp_alpha=1.5, clamp_limit=5.0)
    y = gatedmlp.grouped_gate_up(x, offs, w, bias=b, activation="swiglu_clamped", act_params=params, group=8,
                                 first="up", alpha=0.5)
    assert y.shape == (r, u) and y.dtype == x.dtype
    (name, args, kw), = rec.calls
    assert name == "gate_up"
    assert args[0].data_ptr() == x.data_ptr() and args[1].data_ptr() == w.data_ptr()
    assert args[2].data_ptr() == y.data_ptr() and args[2].shape == (r, u)
    assert args[3] is None and args[4].data_ptr() == b.data_ptr() and args[5] is None
    assert args[6] is None  # no pre-activation output
    assert kw["grouped"] is True
    assert kw["indices"].data_ptr() == offs.data_ptr() and kw["indices"].dtype == torch.int32  # read in place
    assert kw["rows_per_x"] == 1 and kw["rows_per_index"] == 1
    assert kw["index_error"].dtype == torch.int64 and kw["index_error"].shape == (2,)
    assert kw["activation"] == gatedmlp.Activation.swiglu_clamped and kw["act_params"] is params
    assert kw["group"] == 8 and kw["first"] == gatedmlp.Half.up and kw["alpha"] == 0.5
    assert kw.get("quant") is None and kw.get("row_scale") is None

    # separate weights and biases; int64 offsets as they are; a given out is written in place
    rec.calls.clear()
    wg, wu = bf16(e, u, kk), bf16(e, u, kk)
    bg, bu = torch.zeros(e, u), torch.zeros(e, u)
    out = torch.empty(r, u, dtype=torch.float32)
    o64 = offs.long()
    assert gatedmlp.grouped_gate_up(x, o64, wg, wu, bg, bu, out=out, check_offsets=False) is out
    (_, args, kw), = rec.calls
    assert args[1].data_ptr() == wg.data_ptr() and args[3].data_ptr() == wu.data_ptr()
    assert args[4].data_ptr() == bg.data_ptr() and args[5].data_ptr() == bu.data_ptr()
    assert args[2].data_ptr() == out.data_ptr()
    assert kw["indices"].data_ptr() == o64.data_ptr() and kw["index_error"] is None

    # other integer dtypes converted to int64; strided offsets made contiguous
    rec.calls.clear()
    gatedmlp.grouped_gate_up(x, offs.to(torch.uint8), w)
    gatedmlp.grouped_gate_up(x, torch.stack([offs, offs], 1)[:, 0], w)
    (_, _, kw1), (_, _, kw2) = rec.calls
    assert kw1["indices"].dtype == torch.int64 and torch.equal(kw1["indices"], offs.long())
    assert kw2["indices"].is_contiguous() and torch.equal(kw2["indices"], offs)

    # no rows: nothing launched
    rec.calls.clear()
    y = gatedmlp.grouped_gate_up(x[:0], torch.zeros(e, dtype=torch.int32), w)
    assert y.shape == (0, u) and y.dtype == x.dtype and rec.calls == []


@pytest.mark.parametrize("bad, why", [
    ((0, -1), r"a negative row end"),
    ((1, 2), r"less than offsets\[0\]"),
    ((1, 11), r"past R = 10 \(x.shape\[0\]\)"),
    ((2, 9), r"the last one must be R = 10 \(x.shape\[0\]\)"),
    ((2, 12), r"past R = 10 \(x.shape\[0\]\)"),
], ids=["negative", "decreasing", "past-R", "last-short", "last-past"])
def test_grouped_gate_up_names_bad_offsets(monkeypatch, bad, why):
    rec = record(monkeypatch, bad=bad)
    x, offs, w = _grouped_args()
    with pytest.raises(ValueError, match=rf"^gatedmlp: 'offsets' holds {bad[1]} at position {bad[0]}: {why} "
                                         r"\(offsets must be E = 3 non-decreasing row ends in \[0, R = 10\], the "
                                         r"last one R\); nothing was written$"):
        gatedmlp.grouped_gate_up(x, offs, w)
    assert len(rec.calls) == 1
    # unchecked: no read back, no error
    assert gatedmlp.grouped_gate_up(x, offs, w, check_offsets=False).shape == (10, 32)


def test_make_problem_grouped(monkeypatch):
    r, e, kk, u = 10, 3, 64, 32
    x, offs, w = _grouped_args(r, e, kk, u)
    if hasattr(gatedmlp.Gather(), "grouped"):  # the binding's own descriptor
        p = gatedmlp.make_problem(x, w, indices=offs, grouped=True)
        assert p.gather.grouped and p.gather.experts == e and (p.m, p.k, p.u) == (r, kk, u)
        assert not gatedmlp.make_problem(x, w, indices=torch.zeros(r, dtype=torch.int32)).gather.grouped
    seen = []
    monkeypatch.setattr(gatedmlp, "_make_problem", lambda *a, **kw: seen.append(kw))
    gatedmlp.make_problem(x, w, indices=offs, grouped=True)
    gatedmlp.make_problem(x, w, indices=offs)
    assert seen[0]["grouped"] is True and "grouped" not in seen[1]  # left out unless asked for


# ---------------------------------------------------------------- moe_sort
def sort_reference(ids, e):
    """(order, offsets, inverse) of ids [T, k] by a plain stable Python sort."""
    flat = ids.reshape(-1).tolist()
    order = sorted(range(len(flat)), key=lambda p: (flat[p], p))
    counts = [0] * e
    for v in flat:
        counts[v] += 1
    offsets, end = [], 0
    for c in counts:
        end += c
        offsets.append(end)
    inverse = [0] * len(flat)
    for i, p in enumerate(order):
        inverse[p] = i
    return order, offsets, inverse


def sort_ids(r, t, k, e, kind):
    if kind == "one":
        hot = r.randrange(e)
        return [[hot] * k for _ in range(t)]
    if kind == "ends-empty" and e >= 3:  # the first and the last expert get no rows, some others neither
        live = [x for x in range(1, e - 1) if r.random() < 0.6] or [1]
        return [[r.choice(live) for _ in range(k)] for _ in range(t)]
    if kind == "skewed":
        hot = r.randrange(e)
        return [[hot if r.random() < 0.8 else r.randrange(e) for _ in range(k)] for _ in range(t)]
    return [[r.randrange(e) for _ in range(k)] for _ in range(t)]


SORT_CASES = [(1, 1, 1, "uniform"), (7, 2, 3, "uniform"), (64, 4, 8, "ends-empty"), (300, 2, 8, "skewed"),
              (5, 8, 33, "ends-empty"), (40, 2, 33, "one"), (0, 2, 4, "uniform"), (129, 6, 128, "uniform")]
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu,
                                              pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8"])
@pytest.mark.parametrize("t,k,e,kind", SORT_CASES, ids=[f"t{c[0]}k{c[1]}e{c[2]}-{c[3]}" for c in SORT_CASES])
def test_moe_sort_matches_a_python_sort(t, k, e, kind, dtype, device):
    r = random.Random(repr((t, k, e, kind)))
    ids = torch.tensor(sort_ids(r, t, k, e, kind), dtype=getattr(torch, dtype)).reshape(t, k).to(device)
    s = gatedmlp.moe_sort(ids, e)
    assert isinstance(s, gatedmlp.MoESort)
    order, offsets, inverse = sort_reference(ids.cpu().long(), e)
    assert s.order.dtype == torch.int64 and s.offsets.dtype == torch.int32 and s.inverse.dtype == torch.int64
    assert s.order.device == ids.device and s.offsets.device == ids.device and s.inverse.device == ids.device
    assert s.order.shape == (t * k,) and s.offsets.shape == (e,) and s.inverse.shape == (t * k,)
    assert s.order.cpu().tolist() == order, "not the stable sort by expert"
    assert s.offsets.cpu().tolist() == offsets
    assert s.inverse.cpu().tolist() == inverse
    if t * k:
        flat = ids.reshape(-1).long()
        assert torch.equal(s.inverse[s.order], torch.arange(t * k, device=device))
        assert (flat[s.order].diff() >= 0).all()
        # sorted row i is token order[i] // k's
        assert torch.equal((s.order // k).cpu(), torch.tensor([p // k for p in order], dtype=torch.int64))
    if kind == "ends-empty" and e >= 3:
        assert offsets[0] == 0 and offsets[-2] == offsets[-1] == t * k


def test_moe_sort_refuses():
    ids = torch.tensor([[0, 1], [2, 3], [1, 1]])
    with pytest.raises(TypeError, match=r"moe_sort takes a PyTorch tensor 'topk_ids', got numpy.ndarray"):
        gatedmlp.moe_sort(ids.numpy(), 4)
    with pytest.raises(E, match=r"'topk_ids' must be \[T, k\] \(2-D\), got shape \(6,\)"):
        gatedmlp.moe_sort(ids.reshape(-1), 4)
    with pytest.raises(E, match=r"'topk_ids' must hold integer expert ids \(int32 or int64\), got float32"):
        gatedmlp.moe_sort(ids.float(), 4)
    with pytest.raises(E, match=r"'topk_ids' must hold integer expert ids .*got bool"):
        gatedmlp.moe_sort(ids.bool(), 4)
    with pytest.raises(E, match=r"'num_experts' must be in \[1, 2\*\*31\), got 0"):
        gatedmlp.moe_sort(ids, 0)
    with pytest.raises(TypeError, match=r"'num_experts' must be an int, got float"):
        gatedmlp.moe_sort(ids, 4.0)
    for bad, pos in ((4, 3), (-1, 3), (100, 0)):
        b = ids.clone()
        b.view(-1)[pos] = bad
        with pytest.raises(IndexError, match=rf"^gatedmlp: 'topk_ids' holds {bad} at position {pos}, outside "
                                             r"\[0, E=4\)$"):
            gatedmlp.moe_sort(b.to(torch.int32), 4)
    # the first bad one is named
    b = ids.clone()
    b[1, 0], b[2, 1] = 7, -2
    with pytest.raises(IndexError, match=r"'topk_ids' holds 7 at position 2"):
        gatedmlp.moe_sort(b, 4)
    # unchecked: offsets[e] counts the ids <= e, so an id >= E falls past the last offset
    s = gatedmlp.moe_sort(b, 4, check_indices=False)
    assert s.offsets.tolist() == [2, 4, 4, 5] and s.order.tolist()[-1] == 2


# ---------------------------------------------------------------- moe_mlp's grouped path on the host
def fake_grouped_gate_up(name, args, kw):
    """The grouped gate/up on the host, in float64 by expert (what the
    kernel computes), rounded into out; bad offsets write nothing."""
    assert name == "gate_up" and kw["grouped"] is True
    x, w, out, w_up, b, b_up = args[:6]
    offs = kw["indices"].tolist()
    r = x.shape[0]
    if any(o < 0 or o > r for o in offs) or offs != sorted(offs) or offs[-1] != r:
        return
    sep = w_up is not None
    u = out.shape[1]
    act = kw["activation"].name
    p = kw["act_params"]
    ca, cl = (p.clamp_alpha, p.clamp_limit) if p is not None else (1.702, 7.0)
    gi, ui = fused_halves(u, kw["group"], kw["first"])
    start = 0
    for e, end in enumerate(offs):
        xe = x[start:end].double()
        we = torch.cat([w[e], w_up[e]]) if sep else w[e]
        pre = kw["alpha"] * (xe @ we.double().T)
        if b is not None:
            pre = pre + (torch.cat([b[e], b_up[e]]) if sep else b[e]).double()
        g, v = (pre[:, :u], pre[:, u:]) if sep else (pre[:, gi], pre[:, ui])
        out[start:end] = act_torch(act, g, v, ca, cl).to(out.dtype)
        start = end


def _moe_host_inputs(t, k, e, h, i, seed, bias):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    wts = torch.rand(t, k, generator=g).softmax(-1)
    w13 = (torch.randn(e, 2 * i, h, generator=g) / math.sqrt(h)).to(torch.bfloat16)
    w2 = (torch.randn(e, h, i, generator=g) / math.sqrt(i)).to(torch.bfloat16)
    b13 = b2 = None
    if bias:
        b13, b2 = torch.randn(e, 2 * i, generator=g), torch.randn(e, h, generator=g).to(torch.bfloat16)
    return x, ids, wts, w13, w2, b13, b2


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_moe_mlp_grouped_path_on_the_host(monkeypatch, bias, k):
    rec = record(monkeypatch, compute=fake_grouped_gate_up)
    monkeypatch.setattr(gatedmlp, "_use_grouped", lambda *a: True)
    calls = []
    grouped_mm = torch._grouped_mm

    def spy(*a, **kw):
        calls.append(kw["offs"])
        return grouped_mm(*a, **kw)

    monkeypatch.setattr(torch, "_grouped_mm", spy)
    t, e, h, i = 37, 6, 64, 48
    x, ids, wts, w13, w2, b13, b2 = _moe_host_inputs(t, k, e, h, i, seed=k + 10 * bias, bias=bias)
    ids[0] = torch.arange(k)  # expert 0 used; the last expert never is
    ids[ids == e - 1] = 0
    act, group, first = ("swiglu_clamped", 1, "gate") if bias else ("gelu_tanh", 0, "up")
    params = gatedmlp.ActivationParams(clamp_alpha=1.702, clamp_limit=7.0)
    out = torch.full((t, h), float("nan"), dtype=torch.bfloat16)
    y = gatedmlp.moe_mlp(x, ids, wts, w13, w2, b13, b2, activation=act, act_params=params, group=group, first=first,
                         out=out)
    assert y is out
    (name, args, kw), = rec.calls  # one launch: the grouped gate/up; no gathered down projection
    s = gatedmlp.moe_sort(ids, e)
    assert kw["grouped"] is True and torch.equal(kw["indices"], s.offsets) and kw["index_error"] is None
    assert torch.equal(args[0], x[s.order // k]) and args[2].shape == (t * k, i)
    assert len(calls) == 1 and torch.equal(calls[0], s.offsets)
    ref = moe_reference(x, ids, wts, w13, w2, b13, b2, act, group, first)
    unf = moe_reference(x, ids, wts, w13, w2, b13, b2, act, group, first, dtype=torch.bfloat16)
    moe_rule(y, unf, ref, f"grouped on the host k={k} bias={bias}")

    # a bad id: refused by name before any launch, out untouched
    rec.calls.clear()
    bad = ids.clone()
    bad[3, k - 1] = e
    out.fill_(float("nan"))
    with pytest.raises(IndexError, match=rf"^gatedmlp: 'topk_ids' holds {e} at position {3 * k + k - 1}, outside "
                                         rf"\[0, E={e}\); nothing was written$"):
        gatedmlp.moe_mlp(x, bad, wts, w13, w2, b13, b2, out=out)
    assert rec.calls == [] and len(calls) == 1 and torch.isnan(out).all()
    # unchecked: no error and nothing read out of bounds (b2 included); the values are undefined
    gatedmlp.moe_mlp(x, bad, wts, w13, w2, b13, b2, check_indices=False)
    bad[3, k - 1] = -1
    gatedmlp.moe_mlp(x, bad, wts, w13, w2, b13, b2, check_indices=False)


def test_moe_mlp_path_choice_on_the_host(monkeypatch):
    rec = record(monkeypatch)
    t, k, e, h, i = 300, 2, 4, 64, 32
    x, ids, wts, w13, w2, _, _ = _moe_host_inputs(t, k, e, h, i, seed=3, bias=False)
    for force in (None, "1", "0"):
        if force is None:
            monkeypatch.delenv("GATEDMLP_MOE_GROUPED", raising=False)
        else:
            monkeypatch.setenv("GATEDMLP_MOE_GROUPED", force)
        # host tensors: never grouped (the grouped path needs a CUDA sm_90 device)
        assert not gatedmlp._use_grouped(x, w13, w2, t * k, e, h, i)
        rec.calls.clear()
        gatedmlp.moe_mlp(x, ids, wts, w13, w2)
        assert [c[0] for c in rec.calls] == ["gate_up", "down"]
        assert rec.calls[0][2]["grouped"] is False and rec.calls[0][2]["rows_per_x"] == k
    # the new check of the ids' dtype, before anything is allocated or launched
    with pytest.raises(E, match=r"'topk_ids' must hold integer expert ids \(int32 or int64\), got float32"):
        gatedmlp.moe_mlp(x, ids.float(), wts, w13, w2)


# ================================================================ on a GPU
def route_counts(r, rows, e, kind):
    """Rows per expert: uniform; skewed (one expert 15x the mean, up to all
    the rows); one (every row in one expert); empty (the first and the last
    expert empty and some others, where E allows)."""
    counts = [0] * e
    if kind == "one" or e == 1:
        counts[r.randrange(e)] = rows
        return counts
    if kind == "skewed":
        hot = r.randrange(e)
        counts[hot] = min(rows, round(15 * rows / e))
        others = [x for x in range(e) if x != hot]
        for _ in range(rows - counts[hot]):
            counts[r.choice(others)] += 1
        return counts
    live = list(range(e))
    if kind == "empty":
        live = [x for x in range(1, e - 1) if r.random() < 0.6] or ([1] if e > 2 else [0])
    for _ in range(rows):
        counts[r.choice(live)] += 1
    return counts


def cumulative(counts, dtype="int32"):
    ends, end = [], 0
    for c in counts:
        end += c
        ends.append(end)
    return torch.tensor(ends, dtype=getattr(torch, dtype), device=DEV)


def grouped_references(x, counts, w, w_up, b, b_up, act, alpha, group, first, ca=1.702, cl=7.0):
    """(fp64 out [R, U], unfused out in x's dtype), expert by expert: rows
    [offsets[e-1], offsets[e]) through a dense reference on e's weights
    (logical halves picked out of the fused rows)."""
    sep = w_up is not None
    u = w.shape[1] if sep else w.shape[1] // 2
    r = x.shape[0]
    ref = torch.full((r, u), float("nan"), dtype=torch.float64, device=DEV)
    unf = torch.full((r, u), float("nan"), dtype=x.dtype, device=DEV)
    gi, ui = (None, None) if sep else fused_halves(u, group, first, DEV)
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        rows = slice(start, start + n)
        start += n
        we = torch.cat([w[e], w_up[e]]) if sep else w[e]
        be = None if b is None else (torch.cat([b[e], b_up[e]]) if sep else b[e])
        xe = x[rows]
        p64 = alpha * (xe.double() @ we.double().T) + (0 if be is None else be.double())
        p16 = (xe @ we.T) * alpha + (0 if be is None else be.to(x.dtype))
        g64, u64 = (p64[:, :u], p64[:, u:]) if sep else (p64[:, gi], p64[:, ui])
        g16, u16 = (p16[:, :u], p16[:, u:]) if sep else (p16[:, gi], p16[:, ui])
        ref[rows] = act_torch(act, g64, u64, ca, cl)
        unf[rows] = act_torch(act, g16, u16, ca, cl)
    return ref, unf


def random_cases(n):
    r = random.Random(SEED)
    fixed = [dict(r=1, e=1, kk=64, u=64, route="uniform"), dict(r=300, e=8, kk=136, u=200, route="skewed"),
             dict(r=777, e=33, kk=264, u=1440, route="empty"), dict(r=64, e=3, kk=64, u=128, route="one"),
             dict(r=1000, e=8, kk=512, u=384, route="empty"), dict(r=5, e=33, kk=8, u=64, route="uniform"),
             dict(r=2048, e=3, kk=136, u=200, route="skewed"), dict(r=96, e=33, kk=264, u=72, route="one")]
    cases = []
    for j in range(n):
        c = dict(fixed[j]) if j < len(fixed) else dict(
            r=r.choice([1, 7, 64, 200, 513, 1024, 2000]), e=r.choice([1, 3, 8, 33]),
            kk=r.choice([8 * r.randint(1, 80), 136, 264]), u=r.choice([64, 72, 128, 200, 256, 384, 1440]),
            route=r.choice(["uniform", "skewed", "one", "empty"]))
        sep = r.random() < 0.25
        u = c["u"]
        group = 0 if sep else r.choice([0, 0, 1] + [g for g in (16, 64) if u % g == 0])
        c.update(dtype=r.choice(["bf16", "fp16"]), act=ACTS[j % len(ACTS)], sep=sep, group=group,
                 first="gate" if sep else r.choice(["gate", "gate", "up"]), bias=r.choice([None, "fp32", "same"]),
                 alpha=r.choice([1.0, 1.0, 0.5]), offs=r.choice(["int32", "int64"]), seed=r.randrange(1 << 30))
        cases.append(c)
    return cases


CASES = random_cases(40)


def _id(c):
    return (f"r{c['r']}e{c['e']}K{c['kk']}u{c['u']}-{c['dtype']}-{c['act']}-"
            f"{'sep' if c['sep'] else 'g%d%s' % (c['group'], c['first'])}-{c['route']}-"
            f"{'bias' if c['bias'] else 'nobias'}-a{c['alpha']}-{c['offs']}")


@on_hopper
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_random_grouped_gate_up(case):
    c = case
    r = random.Random(c["seed"])
    torch.manual_seed(c["seed"])
    dt = DTYPES[c["dtype"]]
    rows, e, kk, u = c["r"], c["e"], c["kk"], c["u"]
    clamped = c["act"] == "swiglu_clamped"
    x = (torch.randn(rows, kk, device=DEV) * (4.0 if clamped else 1.0)).to(dt)  # reach the clamps
    w, w_up, b, b_up = expert_weights(c, e, kk, u, dt)
    counts = route_counts(r, rows, e, c["route"])
    offs = cumulative(counts, c["offs"])
    ca, cl = (1.5, 5.0) if clamped else (1.702, 7.0)
    params = gatedmlp.ActivationParams(clamp_alpha=ca, clamp_limit=cl)
    ref, unf = grouped_references(x, counts, w, w_up, b, b_up, c["act"], c["alpha"], c["group"], c["first"], ca, cl)
    y = torch.full((rows, u), float("nan"), device=DEV, dtype=dt)
    got = gatedmlp.grouped_gate_up(x, offs, w, w_up, b, b_up, out=y, activation=c["act"], act_params=params,
                                   group=c["group"], first=c["first"], alpha=c["alpha"])
    assert got is y
    torch.cuda.synchronize()
    assert_within_rule(y, unf, ref, _id(c))
    # allocated out: [R, U] in x's dtype, the same numbers
    y2 = gatedmlp.grouped_gate_up(x, offs, w, w_up, b, b_up, activation=c["act"], act_params=params,
                                  group=c["group"], first=c["first"], alpha=c["alpha"], check_offsets=False)
    assert y2.shape == (rows, u) and y2.dtype == dt
    torch.cuda.synchronize()
    assert torch.equal(y2, y)


@on_hopper
@pytest.mark.parametrize("offs_dtype", ["int32", "int64"])
def test_bad_offsets_raise_and_write_nothing(offs_dtype):
    rows, e, kk, u = 40, 4, 128, 64
    dt = torch.bfloat16
    x = torch.randn(rows, kk, device=DEV, dtype=dt)
    w = (torch.randn(e, 2 * u, kk, device=DEV) / math.sqrt(kk)).to(dt)
    y = torch.full((rows, u), float("nan"), device=DEV, dtype=dt)
    cases = [
        ([10, 5, 30, 40], r"'offsets' holds 5 at position 1: less than offsets\[0\]"),
        ([10, 20, 30, 39], r"'offsets' holds 39 at position 3: the last one must be R = 40"),
        ([-1, 10, 20, 40], r"'offsets' holds -1 at position 0: a negative row end"),
        ([10, 50, 50, 40], r"'offsets' holds 50 at position 1: past R = 40"),
        ([10, 20, 30, 41], r"'offsets' holds 41 at position 3: past R = 40"),
    ]
    for ends, match in cases:
        offs = torch.tensor(ends, device=DEV, dtype=getattr(torch, offs_dtype))
        with pytest.raises(ValueError, match=match + r" .*; nothing was written$"):
            gatedmlp.grouped_gate_up(x, offs, w, out=y)
        gatedmlp.grouped_gate_up(x, offs, w, out=y, check_offsets=False)  # no check, no sync: nothing written
        torch.cuda.synchronize()
        assert torch.isnan(y).all(), f"offsets {ends} wrote output"


@on_hopper
def test_empty_and_many_rows():
    e, kk, u = 3, 64, 64
    dt = torch.bfloat16
    w = (torch.randn(e, 2 * u, kk, device=DEV) / 8).to(dt)
    y = gatedmlp.grouped_gate_up(torch.empty(0, kk, device=DEV, dtype=dt), torch.zeros(e, device=DEV,
                                                                                       dtype=torch.int32), w)
    assert y.shape == (0, u) and y.dtype == dt
    # 70000 rows: the row indexing far down (the last expert's rows start at 30001)
    counts = [1, 30000, 39999]
    rows = sum(counts)
    x = torch.randn(rows, kk, device=DEV, dtype=dt)
    b = torch.randn(e, 2 * u, device=DEV)
    ref, unf = grouped_references(x, counts, w, None, b, None, "silu", 1.0, 0, "gate")
    y = torch.full((rows, u), float("nan"), device=DEV, dtype=dt)
    gatedmlp.grouped_gate_up(x, cumulative(counts), w, bias=b, out=y)
    torch.cuda.synchronize()
    assert_within_rule(y, unf, ref, "70000 rows")
    assert_within_rule(y[-1000:], unf[-1000:], ref[-1000:], "70000 rows, the last 1000")


@on_hopper
def test_streams_and_cuda_graphs():
    rows, e, kk, u = 256, 8, 256, 128
    dt = torch.bfloat16
    x = torch.randn(rows, kk, device=DEV, dtype=dt)
    w = (torch.randn(e, 2 * u, kk, device=DEV) / 16).to(dt)
    counts = route_counts(random.Random(5), rows, e, "uniform")
    offs = cumulative(counts)
    ref, unf = grouped_references(x, counts, w, None, None, None, "silu", 1.0, 0, "gate")
    y = torch.full((rows, u), float("nan"), device=DEV, dtype=dt)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    gatedmlp.grouped_gate_up(x, offs, w, out=y, stream=s)  # the check reads back on that stream
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert_within_rule(y, unf, ref, "side stream")

    with torch.cuda.stream(s):
        gatedmlp.grouped_gate_up(x, offs, w, out=y, check_offsets=False)  # warm up outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gatedmlp.grouped_gate_up(x, offs, w, out=y, check_offsets=False)
    for seed in range(3):
        counts = route_counts(random.Random(seed), rows, e, ["uniform", "skewed", "empty"][seed])
        x.copy_(torch.randn(rows, kk, device=DEV))
        offs.copy_(cumulative(counts))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, unf = grouped_references(x, counts, w, None, None, None, "silu", 1.0, 0, "gate")
        assert_within_rule(y, unf, ref, f"graph replay {seed}")

    graph2 = torch.cuda.CUDAGraph()
    with pytest.raises(E, match="check_offsets=False"):
        with torch.cuda.graph(graph2):
            gatedmlp.grouped_gate_up(x, offs, w, out=y)


# ---------------------------------------------------------------- moe_mlp, grouped and gathered
def _moe_inputs(t=300, k=2, e=8, h=256, i=128, bias=False, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(dtype).to(DEV)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(DEV)
    wts = torch.rand(t, k, generator=g).softmax(-1).to(DEV)
    w13 = (torch.randn(e, 2 * i, h, generator=g) / math.sqrt(h)).to(dtype).to(DEV)
    w2 = (torch.randn(e, h, i, generator=g) / math.sqrt(i)).to(dtype).to(DEV)
    b13 = b2 = None
    if bias:
        b13 = torch.randn(e, 2 * i, generator=g).to(DEV)
        b2 = torch.randn(e, h, generator=g).to(dtype).to(DEV)
    return x, ids, wts, w13, w2, b13, b2


def _count_grouped_mm(monkeypatch):
    calls = []
    grouped_mm = torch._grouped_mm

    def spy(*a, **kw):
        calls.append(1)
        return grouped_mm(*a, **kw)

    monkeypatch.setattr(torch, "_grouped_mm", spy)
    return calls


@on_gpu
@pytest.mark.parametrize("act", ["silu", "swiglu_clamped"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_moe_mlp_grouped_and_gathered(monkeypatch, bias, act):
    calls = _count_grouped_mm(monkeypatch)
    x, ids, wts, w13, w2, b13, b2 = _moe_inputs(bias=bias, seed=int(bias))
    if act == "swiglu_clamped":
        x = (x.float() * 3).to(x.dtype)
    group = 1 if act == "swiglu_clamped" else 0
    params = gatedmlp.ActivationParams(clamp_alpha=1.702, clamp_limit=7.0)
    ref = moe_reference(x, ids, wts, w13, w2, b13, b2, act, group, "gate")
    unf = moe_reference(x, ids, wts, w13, w2, b13, b2, act, group, "gate", dtype=x.dtype)
    got = {}
    for force in ("1", "0"):
        monkeypatch.setenv("GATEDMLP_MOE_GROUPED", force)
        before = len(calls)
        out = torch.full_like(x, float("nan"))
        y = gatedmlp.moe_mlp(x, ids, wts, w13, w2, b13, b2, activation=act, act_params=params, group=group, out=out)
        assert y is out
        torch.cuda.synchronize()
        assert len(calls) - before == (1 if force == "1" and HOPPER else 0), f"GATEDMLP_MOE_GROUPED={force}"
        moe_rule(y, unf, ref, f"GATEDMLP_MOE_GROUPED={force} {act} bias={bias}")
        got[force] = y
    # the grouped path rounds the down projection to bf16 before the bias and the routing weight
    rel, peak = errors(got["1"], got["0"].double())
    scale = got["0"].double().abs().max().item()
    assert rel <= 1e-2, f"grouped against gathered: rel diff {rel:.3e}"
    assert peak <= 2e-2 * scale, f"grouped against gathered: max diff {peak:.3e}, max |y| {scale:.3e}"


@on_gpu
def test_moe_mlp_chooses_its_path(monkeypatch):
    calls = _count_grouped_mm(monkeypatch)
    monkeypatch.delenv("GATEDMLP_MOE_GROUPED", raising=False)
    e, k = 8, 2
    cases = [  # (T, dtype, grouped on sm_90 without the variable)
        (300, torch.bfloat16, True),  # 75 rows per expert
        (128, torch.bfloat16, True),  # exactly 32
        (127, torch.bfloat16, False),
        (300, torch.float16, False),  # torch._grouped_mm is bf16
    ]
    for t, dt, want in cases:
        x, ids, wts, w13, w2, _, _ = _moe_inputs(t=t, k=k, e=e, dtype=dt, seed=t)
        before = len(calls)
        y = gatedmlp.moe_mlp(x, ids, wts, w13, w2)
        assert y.shape == x.shape and y.dtype == dt
        assert (len(calls) - before == 1) == (want and HOPPER), f"T={t} {dt}"
    # forced: grouped where the device and dtype allow, whatever T
    monkeypatch.setenv("GATEDMLP_MOE_GROUPED", "1")
    for dt in (torch.bfloat16, torch.float16):
        x, ids, wts, w13, w2, _, _ = _moe_inputs(t=5, k=k, e=e, dtype=dt)
        before = len(calls)
        gatedmlp.moe_mlp(x, ids, wts, w13, w2)
        assert (len(calls) - before == 1) == (dt == torch.bfloat16 and HOPPER), f"forced {dt}"
    # more experts than torch._grouped_mm takes (1024): gathered, even forced
    x, ids, wts, w13, w2, _, _ = _moe_inputs(t=5, k=k, e=1025, h=64, i=32)
    before = len(calls)
    gatedmlp.moe_mlp(x, ids, wts, w13, w2)
    assert len(calls) == before
    torch.cuda.synchronize()


@on_hopper
def test_moe_mlp_grouped_bad_id_raises_and_writes_nothing(monkeypatch):
    monkeypatch.setenv("GATEDMLP_MOE_GROUPED", "1")
    calls = _count_grouped_mm(monkeypatch)
    x, ids, wts, w13, w2, b13, b2 = _moe_inputs(t=64, bias=True)
    out = torch.full_like(x, float("nan"))
    ids[2, 1] = 8
    with pytest.raises(IndexError, match=r"'topk_ids' holds 8 at position 5, outside \[0, E=8\); nothing was written"):
        gatedmlp.moe_mlp(x, ids, wts, w13, w2, b13, b2, out=out)
    ids[2, 1] = -1
    with pytest.raises(IndexError, match=r"'topk_ids' holds -1 at position 5"):
        gatedmlp.moe_mlp(x, ids, wts, w13, w2, b13, b2, out=out)
    torch.cuda.synchronize()
    assert torch.isnan(out).all() and calls == []
    # unchecked: no error, nothing indexed out of bounds (the values are undefined)
    gatedmlp.moe_mlp(x, ids, wts, w13, w2, b13, b2, out=out, check_indices=False)
    torch.cuda.synchronize()


@on_hopper
def test_moe_mlp_grouped_in_a_cuda_graph(monkeypatch):
    monkeypatch.setenv("GATEDMLP_MOE_GROUPED", "1")
    x, ids, wts, w13, w2, b13, b2 = _moe_inputs(t=256, k=2, e=8, bias=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gatedmlp.moe_mlp(x, ids, wts, w13, w2, b13, b2, check_indices=False)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = gatedmlp.moe_mlp(x, ids, wts, w13, w2, b13, b2, check_indices=False)
    for seed in range(3):
        nx, nids, nwts = _moe_inputs(t=256, k=2, e=8, seed=seed + 1)[:3]
        x.copy_(nx)
        ids.copy_(nids)
        wts.copy_(nwts)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, gatedmlp.moe_mlp(x, ids, wts, w13, w2, b13, b2))
    # the id check cannot read back under capture: refused before anything is queued
    graph2 = torch.cuda.CUDAGraph()
    with pytest.raises(E, match="check_indices=False"):
        with torch.cuda.graph(graph2):
            gatedmlp.moe_mlp(x, ids, wts, w13, w2, b13, b2)
