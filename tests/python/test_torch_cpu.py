"""gatedmlp.torch without a GPU: operator registration, fake (meta) shapes,
torch.compile tracing, the no-backward guard and state-dict loading."""

import re

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import gatedmlp  # noqa: E402
import gatedmlp.torch as gt  # noqa: E402

META = dict(device="meta", dtype=torch.bfloat16)


class HFMLP(nn.Module):
    """The shape of a Hugging Face Llama/Qwen MLP."""

    def __init__(self, hidden, inter, bias=False, act=None, dtype=None):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=bias, dtype=dtype)
        self.up_proj = nn.Linear(hidden, inter, bias=bias, dtype=dtype)
        self.down_proj = nn.Linear(inter, hidden, bias=bias, dtype=dtype)
        self.act_fn = act or nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def test_ops_are_registered():
    for name in ("gate_up", "gate_up_preact", "gate_up_out", "quantized_gate_up", "fp8_gate_up", "fp8_gate_up_fp8"):
        assert hasattr(torch.ops.gatedmlp, name)


@pytest.mark.parametrize("storage", ["out_in", "in_out"])
def test_fake_shapes(storage):
    x = torch.empty(2, 3, 64, **META)
    w = torch.empty(96, 64, **META) if storage == "out_in" else torch.empty(64, 96, **META)
    y = gt.gate_up(x, w, storage=storage)
    assert y.shape == (2, 3, 48) and y.dtype == torch.bfloat16
    y, pre = gt.gate_up(x, w, storage=storage, out_dtype=torch.float32, return_preact=True,
                        preact_dtype=torch.float16)
    assert y.shape == (2, 3, 48) and y.dtype == torch.float32
    assert pre.shape == (2, 3, 96) and pre.dtype == torch.float16
    wg = torch.empty(48, 64, **META) if storage == "out_in" else torch.empty(64, 48, **META)
    assert gt.gate_up(x, wg, wg.clone(), storage=storage).shape == (2, 3, 48)
    # batched weights keep x's batch axis
    assert gt.gate_up(x, torch.empty(2, 96, 64, **META)).shape == (2, 3, 48)


def test_opcheck_schema_and_fake():
    x = torch.empty(5, 64, **META)
    w = torch.empty(96, 64, **META)
    b = torch.empty(96, device="meta")
    for options in ("", "activation=gelu_tanh,group=8,first=up,out_dtype=float32"):
        args = (x, w, None, b, None, options)
        torch.library.opcheck(torch.ops.gatedmlp.gate_up.default, args, test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.gatedmlp.gate_up_preact.default, (x, w, None, b, None, "preact_dtype=float32"),
                          test_utils=("test_schema", "test_faketensor"))


def test_gate_up_options_round_trip():
    """The gate/up operators' options string: gate_up's keyword options as
    name=value pairs, the defaults left out, and parsed back to the same
    values; a bad string is refused naming what is wrong."""
    assert gt.gate_up_options() == ""
    s = gt.gate_up_options(activation="gelu_pytorch_tanh", clamp_alpha=1.5, clamp_limit=0.1 + 0.2, group=8,
                           first="up", storage="in_out", alpha=0.3, out_dtype=torch.float32,
                           preact_dtype=torch.float16)
    assert s.startswith("activation=gelu_tanh,clamp_alpha=1.5,"), s
    from gatedmlp.torch import _parse_options
    assert _parse_options(s) == ("gelu_tanh", 1.5, 0.1 + 0.2, 8, "up", "in_out", 0.3, torch.float32, torch.float16)
    assert _parse_options("") == ("silu", 1.702, 7.0, 0, "gate", "out_in", 1.0, None, None)
    assert _parse_options("activation=gelu_pytorch_tanh")[0] == "gelu_tanh"  # Hugging Face's names too
    x, w = torch.empty(5, 64, **META), torch.empty(96, 64, **META)
    for bad, what in (("activation=swishy", "'swishy'"), ("groups=8", "'groups=8'"), ("group", "'group'"),
                      ("alpha=fast", "'alpha=fast'"), ("out_dtype=float64", "out_dtype='float64'"),
                      ("first=down", "first='down'")):
        with pytest.raises(gatedmlp.InvalidArgumentError, match=re.escape(what)):
            torch.ops.gatedmlp.gate_up(x, w, None, None, None, bad)
    # What gt.gate_up records when traced is the same operator with the same meaning.
    assert torch.ops.gatedmlp.gate_up(x, w, None, None, None, "out_dtype=float32").dtype == torch.float32
    assert gt.gate_up(x, w, out_dtype=torch.float32).dtype == torch.float32


def test_quantized_fake_shapes_opcheck_and_compile():
    x = torch.empty(2, 3, 256, **META)
    wq = torch.empty(96, 32, device="meta", dtype=torch.int32)  # 2U = 96 rows of 256 4-bit values
    s = torch.empty(96, 4, **META)
    y = gt.quantized_gate_up(x, wq, s, s.clone())
    assert y.shape == (2, 3, 48) and y.dtype == torch.bfloat16
    assert gt.quantized_gate_up(x, wq, s, s.clone(), out_dtype=torch.float32).dtype == torch.float32
    # separate gate and up words: U rows each
    assert gt.quantized_gate_up(x, wq, s, s.clone(), wq_up=wq.clone(), scales_up=s.clone(),
                                biases_up=s.clone()).shape == (2, 3, 96)
    mx_scales = torch.empty(96, 8, device="meta", dtype=torch.uint8)
    assert gt.quantized_gate_up(x, wq, mx_scales, mode="mxfp4").shape == (2, 3, 48)
    args = (x, wq, s, s.clone(), None, None, None, None, None, "affine", 4, 64, 1, "silu", 1.702, 7.0, 0, "gate",
            1.0, None)
    torch.library.opcheck(torch.ops.gatedmlp.quantized_gate_up.default, args,
                          test_utils=("test_schema", "test_faketensor"))

    def f(x, wq, s, b):
        return gt.quantized_gate_up(x, wq, s, b, activation="gelu_tanh", group=8, first="up") * 2.0

    with torch.no_grad():
        assert torch.compile(f, backend="eager", fullgraph=True)(x, wq, s, s.clone()).shape == (2, 3, 48)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="nvfp4"):
        gt.quantized_gate_up(x, wq, s, mode="nvfp4")


def test_fp8_fake_shapes_opcheck_and_compile():
    """gatedmlp::fp8_gate_up on meta tensors: [M, U] of out_dtype (bf16 by
    default) for fused and separate weights and every scaling; its schema
    and fake implementation pass opcheck; torch.compile traces it whole."""
    f8 = dict(device="meta", dtype=torch.float8_e4m3fn)
    f32 = dict(device="meta", dtype=torch.float32)
    x, w = torch.empty(5, 256, **f8), torch.empty(96, 256, **f8)
    for xs, ws in ((torch.empty(1, **f32), torch.empty(1, **f32)), (torch.empty(5, 1, **f32), torch.empty(96, 1, **f32)),
                   (torch.empty(5, 2, **f32), torch.empty(1, 2, **f32))):
        y = gt.fp8_gate_up(x, xs, w, ws)
        assert y.shape == (5, 48) and y.dtype == torch.bfloat16
    assert gt.fp8_gate_up(x, xs, w, ws, out_dtype=torch.float32).dtype == torch.float32
    wg = torch.empty(48, 256, **f8)
    assert gt.fp8_gate_up(x, xs, wg, ws, w_up=wg.clone(), w_up_scale=ws.clone(), promote=True).shape == (5, 48)
    args = (x, xs, w, ws, None, None, None, None, "silu", 1.702, 7.0, 0, "gate", 1.0, False, None)
    torch.library.opcheck(torch.ops.gatedmlp.fp8_gate_up.default, args,
                          test_utils=("test_schema", "test_faketensor"))

    def f(x, xs, w, ws):
        return gt.fp8_gate_up(x, xs, w, ws, activation="swiglu_clamped", promote=True).float() * 2.0

    with torch.no_grad():
        assert torch.compile(f, backend="eager", fullgraph=True)(x, xs, w, ws).shape == (5, 48)


def test_fp8_y_fake_shapes_opcheck_and_compile():
    """gatedmlp::fp8_gate_up_fp8 (an FP8 Y) on meta tensors: y [M, U]
    float8_e4m3fn, its scales [M, ceil(U / 128)] float32 (MN-major: strides
    (1, align4(M)), a view of the op's [G, align4(M)]), the amax on request;
    schema and fake pass opcheck; torch.compile traces it whole."""
    f8 = dict(device="meta", dtype=torch.float8_e4m3fn)
    f32 = dict(device="meta", dtype=torch.float32)
    x, w, xs, ws = torch.empty(5, 256, **f8), torch.empty(600, 256, **f8), torch.empty(1, **f32), torch.empty(1, **f32)
    y, sc = gt.fp8_gate_up(x, xs, w, ws, out_dtype=torch.float8_e4m3fn)
    assert y.shape == (5, 300) and y.dtype == torch.float8_e4m3fn
    assert sc.shape == (5, 3) and sc.dtype == torch.float32 and sc.stride() == (3, 1)
    y, sc, am = gt.fp8_gate_up(x, xs, w, ws, out_dtype=torch.float8_e4m3fn, y_scale_layout="mn", amax=True)
    assert sc.shape == (5, 3) and sc.stride() == (1, 8) and am.shape == () and am.dtype == torch.float32
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'y_scale_layout' must be 'row' or 'mn'"):
        gt.fp8_gate_up(x, xs, w, ws, out_dtype=torch.float8_e4m3fn, y_scale_layout="col")
    with pytest.raises(gatedmlp.InvalidArgumentError, match="go with an FP8 Y"):
        gt.fp8_gate_up(x, xs, w, ws, amax=True)
    for mn in (False, True):
        args = (x, xs, w, ws, None, None, None, None, "silu", 1.702, 7.0, 0, "gate", 1.0, False, mn)
        torch.library.opcheck(torch.ops.gatedmlp.fp8_gate_up_fp8.default, args,
                              test_utils=("test_schema", "test_faketensor"))

    def f(x, xs, w, ws):
        y, sc = gt.fp8_gate_up(x, xs, w, ws, out_dtype=torch.float8_e4m3fn, y_scale_layout="mn")
        return y.float() * sc.repeat_interleave(128, dim=1)[:, :300]

    with torch.no_grad():
        assert torch.compile(f, backend="eager", fullgraph=True)(x, xs, w, ws).shape == (5, 300)


def test_compile_traces_without_graph_breaks():
    x = torch.empty(2, 3, 64, **META)
    mlp = gt.GatedMLP(64, 48, activation="swiglu_clamped", **META)

    def f(x, w):
        return gt.gate_up(x, w, activation="gelu_tanh", group=8, first="up") * 2.0

    w = torch.empty(96, 64, **META)
    with torch.no_grad():
        assert torch.compile(f, backend="eager", fullgraph=True)(x, w).shape == (2, 3, 48)
        assert torch.compile(mlp, backend="eager", fullgraph=True)(x).shape == (2, 3, 64)
    ep = torch.export.export(mlp.requires_grad_(False), (x,))
    assert "gatedmlp.gate_up" in ep.graph_module.code


def test_no_backward_is_an_error():
    x = torch.empty(4, 64, **META)
    w = torch.empty(96, 64, **META)
    with pytest.raises(RuntimeError, match="no backward pass"):
        gt.gate_up(x.requires_grad_(), w)
    x.requires_grad_(False)
    with pytest.raises(RuntimeError, match="no backward pass"):
        gt.gate_up(x, w.requires_grad_())
    with torch.no_grad():
        gt.gate_up(x, w)
    mlp = gt.GatedMLP(64, 48, **META)  # parameters require grad, as in any nn.Module
    with pytest.raises(RuntimeError, match="no backward pass"):
        mlp(x)
    with torch.inference_mode():
        mlp(x)
    # down_proj's gradient is ordinary autograd: it may require grad
    mlp.gate_up_proj.requires_grad_(False)
    mlp(x)
    # the framework-neutral entry point refuses too
    with pytest.raises(RuntimeError, match="no backward pass"):
        gatedmlp.gate_up(torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True),
                         torch.randn(96, 64, dtype=torch.bfloat16))


def test_quantized_functional_calls_refuse_a_gradient_and_reach_the_library():
    """gatedmlp.quantized_gate_up / quantized_down / quantized_mlp on torch
    tensors take gate_up's short path: a tensor that would need a gradient is
    refused by name; scales held as parameters are read as values; CPU
    tensors get the library's own error."""
    wq, s, b = gatedmlp.quantize(torch.randn(128, 64), group_size=32, bits=4)
    wq, s, b = wq.view(torch.int32), s.bfloat16(), b.bfloat16()
    wd, sd, bd = gatedmlp.quantize(torch.randn(64, 64), group_size=32, bits=4)
    wd, sd, bd = wd.view(torch.int32), sd.bfloat16(), bd.bfloat16()
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    h = torch.randn(4, 64, dtype=torch.bfloat16)
    calls = (lambda x, h, s: gatedmlp.quantized_gate_up(x, wq, s, b, group_size=32),
             lambda x, h, s: gatedmlp.quantized_down(h, wd, sd, bd, group_size=32),
             lambda x, h, s: gatedmlp.quantized_mlp(x, wq, s, b, wq_down=wd, scales_down=sd, biases_down=bd,
                                                    group_size=32))
    for call in calls:
        with pytest.raises(RuntimeError, match="no backward pass"):
            call(x.clone().requires_grad_(), h.clone().requires_grad_(), s)
        for args in ((x, h, s), (x, h, nn.Parameter(s))):
            with pytest.raises(gatedmlp.Error) as e:
                call(*args)
            assert isinstance(e.value, (gatedmlp.NoDeviceError, gatedmlp.InvalidArgumentError)), e.value
    with torch.no_grad(), pytest.raises(gatedmlp.Error):
        gatedmlp.quantized_gate_up(x.clone().requires_grad_(), wq, s, b, group_size=32)


def test_raw_operators_refuse_a_gradient_at_the_call():
    """The operators themselves (as a compiled graph or a direct caller
    reaches them): a call that would need a gradient raises before it runs,
    under no_grad it runs (on meta tensors: the fake implementation)."""
    x = torch.empty(4, 64, **META)
    w = torch.empty(96, 64, **META)
    rest = (None, None, None, "")
    for args in ((x.clone().requires_grad_(), w), (x, w.clone().requires_grad_())):
        with pytest.raises(RuntimeError, match="no backward pass"):
            torch.ops.gatedmlp.gate_up(*args, *rest)
        with torch.no_grad():
            assert torch.ops.gatedmlp.gate_up(*args, *rest).shape == (4, 48)
    ids, wts = torch.zeros(4, 2, dtype=torch.int64, device="meta"), torch.empty(4, 2, **META)
    w13, w2 = torch.empty(3, 64, 64, **META), torch.empty(3, 64, 32, **META)
    moe_rest = (None, None, "silu", 1.702, 7.0, 0, "gate", 0)
    with pytest.raises(RuntimeError, match="no backward pass"):
        torch.ops.gatedmlp.moe_mlp(x, ids, wts.clone().requires_grad_(), w13, w2, *moe_rest)
    assert torch.ops.gatedmlp.moe_mlp(x, ids, wts, w13, w2, *moe_rest).shape == (4, 64)


def test_capsules_are_borrowed():
    """The binding reads a DLPack capsule in place and leaves it unconsumed:
    the same capsule describes the same tensor again, and its owner can still
    import it after the call (its own destructor frees it)."""
    to = torch.utils.dlpack.to_dlpack
    x, w = torch.randn(5, 64, dtype=torch.bfloat16), torch.randn(96, 32, dtype=torch.bfloat16)
    cx, cw = to(x[:, 8:40]), to(w)  # a strided view: the strides come through
    for _ in range(2):
        p = gatedmlp._gatedmlp.make_problem(cx, cw, None)
        assert (p.m, p.k, p.u, p.ldx, p.weights.ld) == (5, 32, 48, 64, 32)
    back = torch.utils.dlpack.from_dlpack(cx)
    assert back.data_ptr() == x[:, 8:40].data_ptr() and torch.equal(back, x[:, 8:40])


def test_cpu_tensors_get_the_library_error():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    w = torch.randn(96, 64, dtype=torch.bfloat16)
    with pytest.raises(gatedmlp.Error) as e:
        gt.gate_up(x, w)
    assert isinstance(e.value, (gatedmlp.NoDeviceError, gatedmlp.InvalidArgumentError))
    if isinstance(e.value, gatedmlp.InvalidArgumentError):
        assert "'x'" in str(e.value) and "host memory" in str(e.value)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'w' has dtype float16"):
        gt.gate_up(x, w.half())
    with pytest.raises(gatedmlp.InvalidArgumentError, match="K = 64"):
        gt.gate_up(x, w[:, :32])


def test_empty_batch_launches_nothing():
    x = torch.empty(0, 64, dtype=torch.bfloat16)
    w = torch.randn(96, 64, dtype=torch.bfloat16)
    assert gt.gate_up(x, w).shape == (0, 48)


def test_activation_names():
    assert gt.activation_name("silu") == "silu"
    assert gt.activation_name("gelu_pytorch_tanh") == "gelu_tanh"
    assert gt.activation_name("gelu") == "gelu_erf"
    assert gt.activation_name(gatedmlp.Activation.relu) == "relu"
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'tanh'"):
        gt.activation_name("tanh")


@pytest.mark.parametrize("bias", [False, True])
def test_loads_hugging_face_state_dict(bias):
    hf = HFMLP(32, 24, bias=bias, dtype=torch.bfloat16)
    sd = hf.state_dict()
    mlp = gt.GatedMLP(32, 24, bias=bias, dtype=torch.bfloat16)
    result = mlp.load_state_dict(sd)
    assert not result.missing_keys and not result.unexpected_keys
    w = mlp.gate_up_proj.weight
    assert w.shape == (48, 32) and w.is_contiguous()
    assert torch.equal(w[:24], hf.gate_proj.weight) and torch.equal(w[24:], hf.up_proj.weight)
    assert torch.equal(mlp.down_proj.weight, hf.down_proj.weight)
    if bias:
        assert torch.equal(mlp.gate_up_proj.bias, torch.cat([hf.gate_proj.bias, hf.up_proj.bias]))
    # its own (stacked) state dict loads back as is
    again = gt.GatedMLP(32, 24, bias=bias, dtype=torch.bfloat16)
    again.load_state_dict(mlp.state_dict())
    assert torch.equal(again.gate_up_proj.weight, w)


def test_loads_nested_and_rejects_half_pairs():
    class Block(nn.Module):
        def __init__(self, mlp):
            super().__init__()
            self.mlp = mlp

    hf = Block(HFMLP(16, 8))
    ours = Block(gt.GatedMLP(16, 8))
    ours.load_state_dict(hf.state_dict())
    assert torch.equal(ours.mlp.gate_up_proj.weight[8:], hf.mlp.up_proj.weight)
    sd = hf.state_dict()
    del sd["mlp.up_proj.weight"]
    with pytest.raises(RuntimeError, match="must be given together"):
        ours.load_state_dict(sd)


def test_from_module():
    hf = HFMLP(16, 8, bias=True, act=nn.GELU(approximate="tanh"))
    mlp = gt.GatedMLP.from_module(hf)
    assert mlp.activation == "gelu_tanh" and mlp.gate_up_proj.bias is not None
    assert torch.equal(mlp.gate_up_proj.weight[:8], hf.gate_proj.weight)
    assert gt.GatedMLP.from_module(HFMLP(16, 8), activation="relu").activation == "relu"
    clamped = gt.GatedMLP(16, 8, activation="swiglu_clamped", clamp_alpha=1.5, clamp_limit=6.0)
    assert "clamp_limit=6.0" in repr(clamped)
