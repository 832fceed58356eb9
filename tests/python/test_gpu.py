"""The binding on a GPU, against a float64 PyTorch reference.

Tolerance rule (DESIGN.md): the fused error against the fp64 reference is at
most 2x the error of the unfused PyTorch path at the same precision, plus a
tiny atol, by relative Frobenius norm and by max abs diff. Every case draws
fresh random inputs, outputs are poisoned with NaN first, and NaN never
passes. Skipped without PyTorch or a CUDA device.
"""

import math
import os
import random

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import gatedmlp  # noqa: E402
import gatedmlp.torch as gt  # noqa: E402
from refs import act_torch  # noqa: E402,F401 - the shared reference activation

pytestmark = pytest.mark.gpu
DEV = "cuda"
SEED = int(os.environ.get("GATEDMLP_TEST_SEED", "20261122"))
ACTS = ["silu", "gelu_tanh", "gelu_erf", "relu", "swiglu_clamped"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


# ---------------------------------------------------------------- reference
def errors(out, ref):
    d = (out.double() - ref).flatten()
    return (d.norm() / ref.norm().clamp_min(1e-300)).item(), d.abs().max().item()


def assert_within_rule(fused, unfused, ref, what=""):
    assert torch.isfinite(fused).all(), f"{what}: non-finite output (an element not written, or NaN)"
    rel_f, max_f = errors(fused, ref)
    rel_u, max_u = errors(unfused, ref)
    scale = ref.abs().max().item()
    assert rel_f <= 2 * rel_u + 1e-6, f"{what}: rel err {rel_f:.3e} > 2 x unfused {rel_u:.3e}"
    assert max_f <= 2 * max_u + 1e-6 * scale + 1e-30, f"{what}: max err {max_f:.3e} > 2 x unfused {max_u:.3e}"


def logical_weights(u, k, dtype, scale=1.0):
    std = scale / math.sqrt(k)
    return (torch.randn(u, k, device=DEV) * std).to(dtype), (torch.randn(u, k, device=DEV) * std).to(dtype)


def fuse_rows(gate, up, group, first):
    """[U, ...] gate and up -> fused [2U, ...] interleaved by group (0: U)."""
    u = gate.shape[0]
    g = u if group == 0 else group
    halves = (gate, up) if first == "gate" else (up, gate)
    blocks = torch.stack([halves[0].reshape(u // g, g, *gate.shape[1:]),
                          halves[1].reshape(u // g, g, *gate.shape[1:])], dim=1)
    return blocks.reshape(2 * u, *gate.shape[1:]).contiguous()


def references(x, wg, wu, bg, bu, act, alpha, out_dtype, ca=1.702, cl=7.0):
    """(fp64 reference, unfused PyTorch result at the input precision)."""
    g64 = alpha * (x.double() @ wg.double().T)
    u64 = alpha * (x.double() @ wu.double().T)
    if bg is not None:
        g64, u64 = g64 + bg.double(), u64 + bu.double()
    ref = act_torch(act, g64, u64, ca, cl)
    g = (x @ wg.T) * alpha
    u = (x @ wu.T) * alpha
    if bg is not None:
        g, u = g + bg.to(x.dtype), u + bu.to(x.dtype)
    return ref, act_torch(act, g, u, ca, cl).to(out_dtype)


# ---------------------------------------------------------------- random cases
def random_cases(n):
    r = random.Random(SEED)
    fixed = [  # awkward ones first
        dict(m=1, k=64, u=64), dict(m=7, k=100, u=37), dict(m=129, k=136, u=96), dict(m=300, k=24, u=8),
        dict(m=64, k=1, u=16), dict(m=257, k=520, u=200),
    ]
    cases = []
    for i in range(n):
        c = dict(fixed[i]) if i < len(fixed) else dict(
            m=r.choice([1, 2, 16, 63, 128, 200, 513]), k=8 * r.randint(1, 80), u=8 * r.randint(1, 40))
        divisors = [d for d in (0, 1, 2, 8, 32, c["u"]) if d == 0 or c["u"] % d == 0]
        c.update(
            dtype=r.choice(["bf16", "fp16"]),
            out=r.choice(["same", "same", "fp32", "bf16", "fp16"]),
            act=ACTS[i % len(ACTS)],
            separate=r.random() < 0.25,
            group=r.choice(divisors),
            first=r.choice(["gate", "up"]),
            storage=r.choice(["out_in", "out_in", "in_out"]),
            bias=r.choice([None, None, "fp32", "same"]),
            alpha=r.choice([1.0, 1.0, 0.5]),
            preact=r.random() < 0.2,
            pad_x=r.choice([0, 0, 8]),
            pad_y=r.choice([0, 0, 3]),
        )
        cases.append(c)
    return cases


CASES = random_cases(40)


def _id(c):
    return (f"m{c['m']}k{c['k']}u{c['u']}-{c['dtype']}-{c['act']}-{'sep' if c['separate'] else 'g' + str(c['group'])}"
            f"-{c['first']}-{c['storage']}")


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_random_problem(case):
    c = case
    dt = DTYPES[c["dtype"]]
    odt = dt if c["out"] == "same" else DTYPES[c["out"]]
    m, k, u = c["m"], c["k"], c["u"]
    scale = 4.0 if c["act"] == "swiglu_clamped" else 1.0  # reach the clamps
    x_full = torch.randn(m, k + c["pad_x"], device=DEV).to(dt)
    x = x_full[:, :k]
    wg, wu = logical_weights(u, k, dt, scale)
    bg = bu = None
    if c["bias"]:
        bdt = torch.float32 if c["bias"] == "fp32" else dt
        bg, bu = torch.randn(u, device=DEV).to(bdt), torch.randn(u, device=DEV).to(bdt)
    ref, unfused = references(x, wg, wu, bg, bu, c["act"], c["alpha"], odt)

    kw = dict(activation=c["act"], alpha=c["alpha"], storage=c["storage"])
    if c["separate"]:
        w, w_up = wg, wu
        b, b_up = bg, bu
    else:
        w, w_up = fuse_rows(wg, wu, c["group"], c["first"]), None
        b, b_up = (fuse_rows(bg, bu, c["group"], c["first"]) if bg is not None else None), None
        kw.update(group=c["group"], first=c["first"])
    if c["storage"] == "in_out":
        w = w.T.contiguous()
        w_up = w_up.T.contiguous() if w_up is not None else None

    y_full = torch.full((m, u + c["pad_y"]), float("nan"), device=DEV, dtype=odt)
    y = y_full[:, :u]
    pre = torch.full((m, 2 * u), float("nan"), device=DEV, dtype=torch.float32) if c["preact"] else None
    gatedmlp.gate_up(x, w, w_up, b, b_up, out=y, preact=pre, **kw)
    torch.cuda.synchronize()
    assert_within_rule(y, unfused, ref, _id(c))
    if c["pad_y"]:
        assert torch.isnan(y_full[:, u:]).all(), "wrote outside out's columns"
    if pre is not None:
        assert torch.isfinite(pre).all()
        g64 = c["alpha"] * (x.double() @ wg.double().T) + (bg.double() if bg is not None else 0)
        u64 = c["alpha"] * (x.double() @ wu.double().T) + (bu.double() if bu is not None else 0)
        if c["separate"]:
            pre_ref = torch.cat([g64, u64], dim=1)
        else:
            pre_ref = fuse_rows(g64.T, u64.T, c["group"], c["first"]).T
        rel, _ = errors(pre, pre_ref)
        assert rel < 1e-4, f"preact rel err {rel:.3e}"

    # The torch operator on the same problem (the same out layout) runs the
    # same kernel: the same bits. Into a fresh contiguous out the problem
    # differs (ldy), and with it maybe the kernel: within the rule.
    with torch.no_grad():
        y2 = gt.gate_up(x, w, w_up, b, b_up, out_dtype=odt, **kw)
        y3_full = torch.full_like(y_full, float("nan"))
        gt.gate_up(x, w, w_up, b, b_up, out=y3_full[:, :u], **kw)
    assert_within_rule(y2, unfused, ref, _id(c) + " (torch op)")
    if pre is None:
        assert torch.equal(y3_full[:, :u], y)
    if c["pad_y"]:
        assert torch.isnan(y3_full[:, u:]).all(), "the torch op wrote outside out's columns"


@pytest.mark.parametrize("act", ACTS)
def test_batched(act):
    L, m, k, u = 3, 33, 64, 48
    x = torch.randn(L, m, k, device=DEV, dtype=torch.bfloat16)
    wg = torch.randn(L, u, k, device=DEV, dtype=torch.bfloat16) / 8
    wu = torch.randn(L, u, k, device=DEV, dtype=torch.bfloat16) / 8
    y = torch.full((L, m, u), float("nan"), device=DEV, dtype=torch.bfloat16)
    gatedmlp.gate_up(x, torch.cat([wg, wu], dim=1), out=y, activation=act)
    for i in range(L):
        ref, unfused = references(x[i], wg[i], wu[i], None, None, act, 1.0, torch.bfloat16)
        assert_within_rule(y[i], unfused, ref, f"batch {i}")
    # weights shared by the batch (no batch axis)
    y.fill_(float("nan"))
    gatedmlp.gate_up(x, torch.cat([wg[0], wu[0]]), out=y, activation=act)
    for i in range(L):
        ref, unfused = references(x[i], wg[0], wu[0], None, None, act, 1.0, torch.bfloat16)
        assert_within_rule(y[i], unfused, ref, f"shared weights, batch {i}")


def test_clamped_parameters_are_used():
    m, k, u = 64, 64, 64
    x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16) * 4
    wg, wu = logical_weights(u, k, torch.bfloat16, 4.0)
    w = torch.cat([wg, wu])
    for ca, cl in [(1.702, 7.0), (1.0, 2.0), (3.0, 0.5)]:
        with torch.no_grad():
            y = gt.gate_up(x, w, activation="swiglu_clamped", clamp_alpha=ca, clamp_limit=cl)
        ref, unfused = references(x, wg, wu, None, None, "swiglu_clamped", 1.0, torch.bfloat16, ca, cl)
        assert_within_rule(y, unfused, ref, f"alpha={ca} limit={cl}")


# ---------------------------------------------------------------- torch integration
def _mlp_pair(act, bias, hidden=256, inter=384, dtype=torch.bfloat16):
    class EagerMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(hidden, inter, bias=bias, device=DEV, dtype=dtype)
            self.up_proj = nn.Linear(hidden, inter, bias=bias, device=DEV, dtype=dtype)
            self.down_proj = nn.Linear(inter, hidden, bias=bias, device=DEV, dtype=dtype)

        def forward(self, x):
            return self.down_proj(act_torch(act, self.gate_proj(x), self.up_proj(x)))

        def reference(self, x):
            d = {n: p.double() for n, p in self.named_parameters()}
            lin = lambda name, t: F.linear(t, d[name + ".weight"], d.get(name + ".bias"))  # noqa: E731
            x = x.double()
            return lin("down_proj", act_torch(act, lin("gate_proj", x), lin("up_proj", x)))

    eager = EagerMLP()
    fused = gt.GatedMLP(hidden, inter, bias=bias, activation=act, device=DEV, dtype=dtype)
    fused.load_state_dict(eager.state_dict())
    return eager, fused


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("bias", [False, True])
def test_module_matches_eager(act, bias):
    eager, fused = _mlp_pair(act, bias)
    x = torch.randn(2, 77, 256, device=DEV, dtype=torch.bfloat16) * (4 if act == "swiglu_clamped" else 1)
    with torch.no_grad():
        ref = eager.reference(x)
        assert_within_rule(fused(x), eager(x), ref, f"GatedMLP {act}")


def test_module_under_torch_compile():
    eager, fused = _mlp_pair("silu", False)
    x = torch.randn(3, 50, 256, device=DEV, dtype=torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(fused, fullgraph=True)
    with torch.inference_mode():
        y_eager_op = fused(x)
        y = compiled(x)
        y = compiled(x)
        assert_within_rule(y, eager(x), eager.reference(x), "compiled GatedMLP")
        assert torch.allclose(y, y_eager_op, rtol=1e-2, atol=1e-2)


def test_function_under_torch_compile_and_cudagraphs():
    m, k, u = 128, 256, 192
    wg, wu = logical_weights(u, k, torch.bfloat16)
    w = torch.cat([wg, wu])

    def f(x):
        # a pointwise op before the custom op, exact in bf16 (a power of two)
        return gt.gate_up(x * 2.0, w, activation="gelu_tanh", alpha=0.5)

    torch._dynamo.reset()
    for mode in (None, "reduce-overhead"):
        cf = torch.compile(f, fullgraph=True, mode=mode)
        with torch.no_grad():
            for _ in range(3):  # fresh inputs each call, replayed graphs included
                x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
                y = cf(x).clone()
                ref, unfused = references(x, wg, wu, None, None, "gelu_tanh", 1.0, torch.bfloat16)
                assert_within_rule(y, unfused, ref, f"compile mode={mode}")


def test_cuda_graph_capture_and_replay():
    m, k, u = 96, 128, 64
    wg, wu = logical_weights(u, k, torch.bfloat16)
    w = torch.cat([wg, wu])
    x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    y = torch.empty(m, u, device=DEV, dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        gt.gate_up(x, w, out=y)  # warm up outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        gt.gate_up(x, w, out=y)
    for _ in range(3):
        x.copy_(torch.randn(m, k, device=DEV))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, unfused = references(x, wg, wu, None, None, "silu", 1.0, torch.bfloat16)
        assert_within_rule(y, unfused, ref, "graph replay")


def test_runs_on_the_current_stream():
    m, k, u = 256, 512, 256
    wg, wu = logical_weights(u, k, torch.float16)
    w = torch.cat([wg, wu])
    s = torch.cuda.Stream()
    with torch.cuda.stream(s), torch.no_grad():
        x = torch.randn(m, k, device=DEV, dtype=torch.float16)
        assert gatedmlp.current_stream(x) == s.cuda_stream
        y = gatedmlp.gate_up(x, w)
        y2 = gt.gate_up(x, w)
    s.synchronize()
    ref, unfused = references(x, wg, wu, None, None, "silu", 1.0, torch.float16)
    assert_within_rule(y, unfused, ref, "side stream")
    assert torch.equal(y, y2)


def test_out_variant_writes_into_a_slice():
    m, k, u = 40, 64, 32
    x = torch.randn(2, m // 2, k, device=DEV, dtype=torch.bfloat16)
    wg, wu = logical_weights(u, k, torch.bfloat16)
    big = torch.full((2, m // 2, 3 * u), float("nan"), device=DEV, dtype=torch.bfloat16)
    out = big[..., u:2 * u]
    with torch.no_grad():
        r = gt.gate_up(x, torch.cat([wg, wu]), out=out)
    assert r is out
    ref, unfused = references(x.reshape(m, k), wg, wu, None, None, "silu", 1.0, torch.bfloat16)
    assert_within_rule(out.reshape(m, u), unfused, ref, "out= slice")
    assert torch.isnan(big[..., :u]).all() and torch.isnan(big[..., 2 * u:]).all()


def test_workspace_given_allocated_or_too_small():
    # 300 x 1024 x 1300: 22 cluster items of 16 k-blocks on an H100's 66
    # clusters: the Hopper path splits them in the workspace.
    m, k, u = 300, 1024, 1300
    x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    wg, wu = logical_weights(u, k, torch.bfloat16)
    w = torch.cat([wg, wu])
    ref, unfused = references(x, wg, wu, None, None, "gelu_tanh", 1.0, torch.bfloat16)
    n = gatedmlp.workspace_size(gatedmlp.make_problem(x, w, activation="gelu_tanh"))
    assert n >= 0
    given = torch.full((max(n, 1),), 255, device=DEV, dtype=torch.uint8)  # garbage in: must not matter
    for ws, what in [(None, "allocated"), (given, "given"), (given[:16], "too small")]:
        y = gatedmlp.gate_up(x, w, activation="gelu_tanh", workspace=ws)
        assert_within_rule(y, unfused, ref, f"workspace {what}")
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'workspace'.*host memory"):
        gatedmlp.gate_up(x, w, activation="gelu_tanh", workspace=given.cpu())
    with torch.no_grad():
        y = gt.gate_up(x, w, activation="gelu_tanh")  # the torch op allocates its own
    assert_within_rule(y, unfused, ref, "torch op")


def test_errors_on_the_gpu():
    x = torch.randn(8, 64, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(96, 64, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'x'.*host memory"):
        gatedmlp.gate_up(x.cpu(), w, out=torch.empty(8, 48, device=DEV, dtype=torch.bfloat16))
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'w'.*host memory"):
        gatedmlp.gate_up(x, w.cpu(), out=torch.empty(8, 48, device=DEV, dtype=torch.bfloat16))
    with pytest.raises(gatedmlp.InvalidArgumentError, match="overlaps"):
        gatedmlp.gate_up(x, w, out=x[:, :48])
    with pytest.raises(gatedmlp.NotSupportedError):
        gatedmlp.gate_up(x.float(), w.float())
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'w' has dtype float16"):
        gatedmlp.gate_up(x, w.half())
    with pytest.raises(RuntimeError, match="no backward pass"):
        gt.GatedMLP(64, 48, device=DEV, dtype=torch.bfloat16)(x)


def test_plan_reports_a_kernel():
    p = gatedmlp.Problem(m=1024, k=4096, u=14336)
    c = gatedmlp.plan(p)
    assert c.path != gatedmlp.KernelPath.none and c.tile_m > 0 and c.threads > 0


def test_convert_weights_on_device():
    u, k = 64, 96
    gate = torch.randn(u, k, device=DEV, dtype=torch.bfloat16)
    up = torch.randn(u, k, device=DEV, dtype=torch.bfloat16)
    out = torch.full((2 * u, k), float("nan"), device=DEV, dtype=torch.bfloat16)
    sep = gatedmlp.WeightLayout(format=gatedmlp.WeightFormat.separate)
    to = gatedmlp.WeightLayout(group=32, first=gatedmlp.Half.up)
    gatedmlp.convert_weights(gate, out, from_w_up=up, from_layout=sep, to_layout=to)
    torch.cuda.synchronize()
    assert torch.equal(out, fuse_rows(gate, up, 32, "up"))
    with pytest.raises(gatedmlp.InvalidArgumentError, match="must all be host memory or all CUDA memory"):
        gatedmlp.convert_weights(gate.cpu(), out, from_w_up=up.cpu(), from_layout=sep, to_layout=to)


def test_other_frameworks_zero_copy():
    cupy = pytest.importorskip("cupy")
    m, k, u = 32, 64, 48
    x = cupy.random.standard_normal((m, k), dtype=cupy.float32).astype(cupy.float16)
    w = (cupy.random.standard_normal((2 * u, k), dtype=cupy.float32) / 8).astype(cupy.float16)
    y = gatedmlp.gate_up(x, w)  # allocated with CuPy, on CuPy's current stream
    assert isinstance(y, cupy.ndarray) and y.shape == (m, u)
    xt, wt = torch.from_dlpack(x), torch.from_dlpack(w)
    ref, unfused = references(xt, wt[:u], wt[u:], None, None, "silu", 1.0, torch.float16)
    torch.cuda.synchronize()
    assert_within_rule(torch.from_dlpack(y), unfused, ref, "cupy")


# ---------------------------------------------------------------- the lean call path
def test_direct_path_matches_the_op():
    # Eager calls of gatedmlp.torch launch directly (no dispatcher); the op is
    # what torch.compile records. Same kernel, so the same bits.
    x = torch.randn(37, 256, device=DEV, dtype=torch.bfloat16)
    wg, wu = logical_weights(96, 256, torch.bfloat16)
    b = torch.randn(192, device=DEV)
    w = fuse_rows(wg, wu, 8, "up")
    with torch.no_grad():
        direct = gt.gate_up(x, w, bias=b, activation="gelu_tanh", group=8, first="up")
        op = torch.ops.gatedmlp.gate_up(x, w, None, b, None, "activation=gelu_tanh,group=8,first=up")
        plain = gatedmlp.gate_up(x, w, bias=b, activation="gelu_tanh", group=8, first="up")
    assert torch.equal(direct, op) and torch.equal(direct, plain)
    # The bias is in weight-row order: blocks of 8 rows, up first.
    bg, bu = b.view(12, 2, 8)[:, 1].reshape(-1), b.view(12, 2, 8)[:, 0].reshape(-1)
    ref, unfused = references(x, wg, wu, bg, bu, "gelu_tanh", 1.0, torch.bfloat16)
    assert_within_rule(direct, unfused, ref, "direct")


@pytest.mark.parametrize("shape", [(300, 1024, 1300), (512, 512, 1408), (5, 512, 640), (40, 192, 72)],
                         ids=lambda s: "m{}k{}u{}".format(*s))
def test_repeated_calls_follow_new_pointers(shape):
    # A repeated call reuses its plan (and on Hopper its tensor maps, with the
    # new addresses put in): every call here has new x, y, weights and
    # pre-activation, and each must be right. Shapes: the split tail, the
    # ping-pong kernels, the decode kernel, the portable kernel's K.
    m, k, u = shape
    for i in range(6):
        sep = i % 2 == 1
        wg, wu = logical_weights(u, k, torch.bfloat16)
        x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
        y = torch.full((m, u), float("nan"), device=DEV, dtype=torch.bfloat16)
        pre = torch.full((m, 2 * u), float("nan"), device=DEV, dtype=torch.bfloat16) if i >= 4 else None
        with torch.no_grad():
            if sep:
                gatedmlp.gate_up(x, wg, wu, out=y, preact=pre)
            else:
                gatedmlp.gate_up(x, torch.cat([wg, wu]), out=y, preact=pre)
        ref, unfused = references(x, wg, wu, None, None, "silu", 1.0, torch.bfloat16)
        assert_within_rule(y, unfused, ref, f"call {i}")
        if pre is not None:
            g = (x.double() @ wg.double().T)
            assert torch.allclose(pre[:, :u].double(), g, rtol=2e-2, atol=2e-2)


def test_split_tail_in_a_cuda_graph_and_on_two_streams(monkeypatch):
    # The Hopper path's scratch: held per stream for eager calls, fresh for a
    # call captured into a graph (replayed here while the eager stream runs),
    # whose split tail must not take the flags of the previous replay. The
    # cooperative kernels (the ones with a split tail), split wherever they can.
    monkeypatch.setenv("GATEDMLP_SM90_PINGPONG", "0")
    monkeypatch.setenv("GATEDMLP_SM90_SPLIT_TAIL", "force")
    m, k, u = 300, 1024, 1300
    wg, wu = logical_weights(u, k, torch.bfloat16)
    w = torch.cat([wg, wu])
    xs = [torch.randn(m, k, device=DEV, dtype=torch.bfloat16) for _ in range(3)]
    ys = [torch.empty(m, u, device=DEV, dtype=torch.bfloat16) for _ in range(3)]
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.no_grad():
        gt.gate_up(xs[0], w, out=ys[0])
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            gt.gate_up(xs[0], w, out=ys[0])
        torch.cuda.synchronize()
        for _ in range(3):
            for y in ys:
                y.fill_(float("nan"))
            torch.cuda.synchronize()
            graph.replay()
            with torch.cuda.stream(s1):
                gt.gate_up(xs[1], w, out=ys[1])
            with torch.cuda.stream(s2):
                gatedmlp.gate_up(xs[2], w, out=ys[2])
            torch.cuda.synchronize()
            for x, y in zip(xs, ys):
                ref, unfused = references(x, wg, wu, None, None, "silu", 1.0, torch.bfloat16)
                assert_within_rule(y, unfused, ref, "graph / streams")


def test_held_scratch_stays_allocated():
    # The scratch held for a stream must stay the framework's allocation for
    # as long as it is held: were it freed, the next tensor could take its
    # memory and the next split call would write over that tensor.
    m, k, u = 300, 1024, 1300
    x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    wg, wu = logical_weights(u, k, torch.bfloat16)
    w = torch.cat([wg, wu])
    y = torch.empty(m, u, device=DEV, dtype=torch.bfloat16)
    n = gatedmlp.workspace_size(gatedmlp.make_problem(x, w, out=y))
    if n == 0:
        pytest.skip("this GPU's path takes no scratch for the shape")
    s = torch.cuda.Stream()  # a stream of its own: no scratch held for it yet
    with torch.cuda.stream(s), torch.no_grad():
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        gatedmlp.gate_up(x, w, out=y)
        held = torch.cuda.memory_allocated() - before
        assert held >= n, f"held scratch: {held} bytes allocated after the call, expected >= {n}"
        ref, unfused = references(x, wg, wu, None, None, "silu", 1.0, torch.bfloat16)
        for _ in range(3):  # new tensors next to the held scratch: the calls stay right
            y2 = torch.full((m, u), float("nan"), device=DEV, dtype=torch.bfloat16)
            gt.gate_up(x, w, out=y2)
            s.synchronize()
            assert_within_rule(y2, unfused, ref, "after held scratch")
            assert torch.equal(y2, y)


def test_empty_inputs_launch_nothing():
    w = torch.randn(96, 64, device=DEV, dtype=torch.bfloat16)
    mlp = gt.GatedMLP(64, 48, device=DEV, dtype=torch.bfloat16).requires_grad_(False)
    for x in (torch.empty(0, 64, device=DEV, dtype=torch.bfloat16),
              torch.empty(2, 0, 64, device=DEV, dtype=torch.bfloat16),
              torch.empty(0, 5, 64, device=DEV, dtype=torch.bfloat16)):
        with torch.no_grad():
            assert gt.gate_up(x, w).shape == (*x.shape[:-1], 48)
            assert mlp(x).shape == x.shape
        assert gatedmlp.gate_up(x, w).shape == (*x.shape[:-1], 48)
    torch.cuda.synchronize()
    # Still checked: an empty batch with the wrong K is an error.
    with pytest.raises(gatedmlp.InvalidArgumentError, match="K = 32"):
        gt.gate_up(torch.empty(0, 32, device=DEV, dtype=torch.bfloat16), w)
