"""The down projection from Python: gatedmlp.down / quantized_down, the
whole MLP (mlp / quantized_mlp) and their PyTorch operators.

Without a GPU (NumPy host arrays, CPU and meta tensors): the descriptor the
binding builds (op = down, glu_input, strides), every malformed argument
refused by name with its values, empty inputs, fake shapes and tracing.
On a GPU: random odd shapes against a float64 reference under the fused
suite's tolerance rule (test_gpu.py: at most 2x the error of the unfused
PyTorch path at the same precision), quantized weights against float64 on
the dequantized weights and, where the mlx package imports, against MLX's
own quantized_matmul; the whole MLP against the composition of the
references; the operators against the functional calls. Outputs are
poisoned with NaN first.
"""

import math
import os
import random

import numpy as np
import pytest

import gatedmlp
from gatedmlp import Activation, DType, Operation, WeightFormat, WeightStorage

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="no PyTorch")
HAS_CUDA = torch is not None and torch.cuda.is_available()


def on_gpu(test):
    """The GPU tests: marked gpu, skipped without PyTorch and a CUDA device."""
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")(test))


if torch is not None:
    import gatedmlp.torch as gt
if HAS_CUDA:
    # The fused suite's reference activation and tolerance rule, and the
    # quantized suite's MLX driver: the same yardsticks for the down projection.
    from test_gpu import act_torch, assert_within_rule
    from test_quant_kernel import cosine, mlx_matmul

rng = np.random.default_rng(4321)
ACTS = ["silu", "gelu_tanh", "gelu_erf", "relu", "swiglu_clamped"]


def f16(*shape):
    return rng.standard_normal(shape).astype(np.float16)


# ================================================================ without a GPU
def test_names():
    assert list(Operation.__members__) == ["gate_up", "down"]
    assert gatedmlp.to_string(Operation.down) == "down"
    assert gatedmlp.KernelPath.cublas.name == "cublas"
    p = gatedmlp.Problem()
    assert p.op == Operation.gate_up and not p.glu_input
    p = gatedmlp.Problem(op=Operation.down, m=4, k=64, u=32, glu_input=True)
    assert p.op == Operation.down and p.glu_input and "down" in repr(p)
    a = gatedmlp.Arguments(x=0x1000, x_up=0x2000)
    assert a.x_up == 0x2000 and "x_up=0x2000" in repr(a)
    assert "x_up" not in repr(gatedmlp.Arguments(x=0x1000))
    for name in ("down", "quantized_down", "mlp", "quantized_mlp", "make_down_problem"):
        assert callable(getattr(gatedmlp, name)) and name in gatedmlp.__all__, name


def test_problem_from_tensors():
    h, w = f16(5, 64), f16(48, 64)
    p = gatedmlp.make_down_problem(h, w)
    assert p.op == Operation.down and not p.glu_input
    assert (p.m, p.k, p.u, p.batch) == (5, 64, 48, 1)
    assert (p.ldx, p.weights.ld, p.input_dtype, p.output_dtype) == (64, 64, DType.fp16, DType.fp16)
    # The layout fields the down projection must leave at their defaults.
    assert (p.weights.format, p.weights.group, p.weights.first) == (WeightFormat.fused, 0, gatedmlp.Half.gate)
    assert not p.has_bias and not p.has_preact and not p.quantized
    assert gatedmlp.check_support(p), gatedmlp.check_support(p).message

    # The two halves of gate_up's pre-activation [M, 2K] as the GLU input:
    # one row stride (2K) for both.
    pre = f16(5, 128)
    out = np.empty((5, 80), np.float32)[:, :48]
    p = gatedmlp.make_down_problem(pre[:, :64], w, bias=np.zeros(48, np.float32), up=pre[:, 64:], out=out,
                                   activation="swiglu_clamped", act_params=gatedmlp.ActivationParams(clamp_limit=3.0),
                                   alpha=0.5)
    assert p.glu_input and p.activation == Activation.swiglu_clamped and p.act_params.clamp_limit == 3.0
    assert (p.ldx, p.ldy, p.output_dtype, p.alpha) == (128, 80, DType.fp32, 0.5)
    assert p.has_bias and p.bias_dtype == DType.fp32
    assert gatedmlp.check_support(p), gatedmlp.check_support(p).message


def test_problem_in_out_and_batched():
    h = f16(3, 4, 32)
    p = gatedmlp.make_down_problem(h, f16(32, 24), storage="in_out")  # [K, U]
    assert (p.batch, p.m, p.k, p.u) == (3, 4, 32, 24)
    assert p.weights.storage == WeightStorage.in_out and p.weights.ld == 24
    assert p.batch_stride_x == 4 * 32 and p.batch_stride_w == 0  # weights shared by the batch
    p = gatedmlp.make_down_problem(h, f16(3, 24, 32), bias=np.zeros((3, 24), np.float16), up=f16(3, 4, 32),
                                   out=np.empty((3, 4, 24), np.float16))
    assert p.glu_input and p.batch_stride_w == 24 * 32 and p.batch_stride_bias == 24 and p.batch_stride_y == 4 * 24


def test_quantized_problem():
    w = rng.standard_normal((40, 256)).astype(np.float32)
    wq, s, b = gatedmlp.quantize(w, group_size=64, bits=4)
    p = gatedmlp._C.make_down_problem(f16(3, 256), wq, scales=s, biases=b,
                                      quant=gatedmlp.QuantFormat(group_size=64, bits=4))
    assert p.op == Operation.down and p.quantized and (p.m, p.k, p.u) == (3, 256, 40)
    assert p.scale_dtype == DType.fp32 and p.weights.ld == 32
    assert gatedmlp.check_support(p), gatedmlp.check_support(p).message


# Each: (h, w, keywords) -> the message (a regex) the binding raises.
def _bad_cases():
    h, w = f16(5, 64), f16(48, 64)
    wide = f16(5, 80)
    return [
        ("h 1-D", (f16(64), w, {}), r"'x' must be \[M, K\] or \[batch, M, K\], got shape \(64,\)"),
        ("h 4-D", (f16(2, 2, 5, 64), w, {}), r"'x' must be \[M, K\]"),
        ("h float64", (h.astype(np.float64), w, {}), r"'x' has dtype float64"),
        ("h int32", (h.astype(np.int32), w, {}), r"'x' has dtype int32"),
        ("w K", (h, f16(48, 63), {}), r"'w' must be \[U, K\] with K = 64 \(x.shape\[-1\]\), got shape \(48, 63\)"),
        ("w in_out K", (h, f16(63, 48), dict(storage="in_out")), r"'w' must be \[K, U\] with K = 64.*storage=in_out"),
        ("w 1-D", (h, f16(64), {}), r"'w' must be \[U, K\] \(or batched\), got shape \(64,\)"),
        ("w dtype", (h, w.astype(np.float32), {}), r"'w' has dtype float32 but 'x' has float16"),
        ("w transposed", (h, f16(64, 48).T, {}), r"'w' must have a contiguous last dimension"),
        ("w batch", (f16(2, 5, 64), f16(3, 48, 64), {}), r"'w' has a batch axis of 3 but x has batch 2"),
        ("up shape", (h, w, dict(up=f16(5, 32))),
         r"'x_up' \(the up half of the input\) must have the shape of 'x' \(5, 64\), got \(5, 32\)"),
        ("up rows", (h, w, dict(up=f16(4, 64))), r"must have the shape of 'x' \(5, 64\), got \(4, 64\)"),
        ("up dtype", (h, w, dict(up=h.astype(np.float32))), r"'x_up' has dtype float32 but 'x' has float16"),
        ("up row stride", (h, w, dict(up=wide[:, :64])),
         r"'x_up' must have the row stride of 'x' \(ldx = 64\), got strides \(80, 1\)"),
        ("up batch stride", (f16(2, 5, 64), w, dict(up=f16(4, 5, 64)[::2])), r"'x_up' must have the batch stride"),
        ("bias length", (h, w, dict(bias=np.zeros(47, np.float32))), r"'bias' must be \[U\] = \(48,\).*got shape \(47,\)"),
        ("bias 2U", (h, w, dict(bias=np.zeros(96, np.float32))), r"'bias' must be \[U\] = \(48,\)"),
        ("bias strided", (h, w, dict(bias=np.zeros(96, np.float32)[::2])), r"'bias' must be contiguous"),
        ("bias dtype", (h, w, dict(bias=np.zeros(48, np.float64))), r"'bias' has dtype float64"),
        ("out shape", (h, w, dict(out=np.empty((5, 47), np.float16))),
         r"'out' must be \[M, U\] = \(5, 48\), got shape \(5, 47\)"),
        ("out dtype", (h, w, dict(out=np.empty((5, 48), np.float64))), r"'out' has dtype float64"),
        ("activation", (h, w, dict(up=f16(5, 64), activation="swish")), r"activation='swish'"),
        ("storage", (h, w, dict(storage="rows")), r"storage='rows'"),
    ]


BAD = _bad_cases()


@pytest.mark.parametrize("h, w, kw, match", [(*c[1], c[2]) for c in BAD], ids=[c[0] for c in BAD])
def test_bad_arguments_are_named(h, w, kw, match):
    with pytest.raises(gatedmlp.InvalidArgumentError, match=match):
        gatedmlp.make_down_problem(h, w, **kw)
    kw = dict(kw)
    kw.setdefault("out", np.empty((5, 48), np.float16))
    with pytest.raises(gatedmlp.InvalidArgumentError, match=match):
        gatedmlp.down(h, w, **kw)


def test_bad_quantized_arguments_are_named():
    h = f16(3, 256)
    w = rng.standard_normal((40, 256)).astype(np.float32)
    wq, s, b = gatedmlp.quantize(w, group_size=64, bits=4)
    mq, ms = gatedmlp.quantize(w, mode="mxfp4")
    out = np.empty((3, 40), np.float16)
    cases = [
        (dict(wq=wq[:, :16], scales=s, biases=b), r"'w' must be \[rows, K \* bits / 32\] = \(40, 32\)"),
        (dict(wq=wq.astype(np.float32), scales=s, biases=b), r"'w' holds quantized weights, so must be uint32"),
        (dict(wq=wq, scales=s[:, :2].copy(), biases=b), r"'scales' must be \[rows, K / group_size\] = \(40, 4\)"),
        (dict(wq=wq, scales=s, biases=None), r"'biases' is required with affine quantized weights"),
        (dict(wq=wq, scales=s, biases=b[:39]), r"'biases' must have the shape of 'scales' \(40, 4\)"),
        (dict(wq=mq, scales=ms, biases=b, mode="mxfp4"), r"'biases' is given, but mxfp4 has no biases"),
        (dict(wq=mq, scales=ms.astype(np.float32), mode="mxfp4"), r"'scales' must be uint8"),
        (dict(wq=wq, scales=s, biases=b, group_size=48), r"group"),
        (dict(wq=wq, scales=s, biases=b, mode="nvfp4"), r"nvfp4"),
    ]
    for kw, match in cases:
        kw = dict(kw)
        wq_, s_, b_ = kw.pop("wq"), kw.pop("scales"), kw.pop("biases", None)
        with pytest.raises((gatedmlp.InvalidArgumentError, gatedmlp.NotSupportedError), match=match):
            gatedmlp.quantized_down(h, wq_, s_, b_, out=out, **kw)
    with pytest.raises(gatedmlp.InvalidArgumentError, match=r"'x_up'.*shape of 'x'"):
        gatedmlp.quantized_down(h, wq, s, b, up=f16(3, 128), out=out)
    with pytest.raises(gatedmlp.InvalidArgumentError, match=r"storage=out_in"):
        gatedmlp._C.down(h, wq, out, scales=s, biases=b, storage=WeightStorage.in_out,
                         quant=gatedmlp.QuantFormat())
    with pytest.raises(gatedmlp.InvalidArgumentError, match=r"'scales' and 'biases' go with quantized weights"):
        gatedmlp._C.down(h, f16(40, 256), out, scales=s, biases=b)
    w8 = np.zeros((40, 64), np.int32)  # 256 e4m3 bytes a row
    with pytest.raises(gatedmlp.InvalidArgumentError, match=r"'biases' is given, but fp8_e4m3 has no biases"):
        gatedmlp.quantized_down(h, w8, np.ones((1, 2), np.float32), np.ones((1, 2), np.float32), mode="fp8_e4m3",
                                out=out)


def _assert_host_memory_error(e, name):
    """Host memory is refused by the library naming the argument; on a
    machine without a GPU the library may stop earlier, at 'no device'."""
    if isinstance(e, gatedmlp.NoDeviceError):
        return
    assert isinstance(e, gatedmlp.InvalidArgumentError), repr(e)
    assert f"'{name}'" in str(e) and "host memory" in str(e), str(e)


def test_host_arrays_reach_the_library():
    h, w = f16(5, 64), f16(48, 64)
    with pytest.raises(gatedmlp.Error) as e:
        gatedmlp.down(h, w)
    _assert_host_memory_error(e.value, "x")
    with pytest.raises(gatedmlp.Error) as e:
        gatedmlp.down(h, w, up=f16(5, 64), bias=np.zeros(48, np.float32))
    _assert_host_memory_error(e.value, "x")


def test_empty_inputs_numpy():
    w = f16(48, 64)
    y = gatedmlp.down(np.empty((0, 64), np.float16), w)
    assert y.shape == (0, 48) and y.dtype == np.float16
    y = gatedmlp.down(np.empty((0, 64), np.float16), w, up=np.empty((0, 64), np.float16),
                      bias=np.zeros(48, np.float32), out=np.empty((0, 48), np.float32))
    assert y.shape == (0, 48) and y.dtype == np.float32
    assert gatedmlp.down(np.empty((2, 0, 64), np.float16), w).shape == (2, 0, 48)
    # Still checked: an empty batch with the wrong K, or a bad up half.
    with pytest.raises(gatedmlp.InvalidArgumentError, match="K = 32"):
        gatedmlp.down(np.empty((0, 32), np.float16), w)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'x_up'"):
        gatedmlp.down(np.empty((0, 64), np.float16), w, up=np.empty((0, 32), np.float16))
    wq, s, b = gatedmlp.quantize(rng.standard_normal((48, 64)).astype(np.float32), group_size=32)
    assert gatedmlp.quantized_down(np.empty((0, 64), np.float16), wq, s, b, group_size=32).shape == (0, 48)
    x, wgu = np.empty((0, 48), np.float16), f16(128, 48)
    assert gatedmlp.mlp(x, wgu, f16(48, 64)).shape == (0, 48)  # x [0, 48] -> h [0, 64] -> y [0, 48]


def test_quantized_mlp_down_format_rule():
    from gatedmlp.quant import _down_format

    # Inherited from the gate/up format unless given; another mode brings its own defaults.
    assert _down_format(32, 8, "affine", None, None, None, None, None) == (32, 8, "affine", None)
    assert _down_format(32, 8, "affine", None, 128, None, None, None) == (128, 8, "affine", None)
    assert _down_format(32, 8, "affine", None, None, None, "mxfp4", None) == (None, None, "mxfp4", None)
    assert _down_format(128, None, "fp8_e4m3", 128, None, None, "fp8_e4m3", 1) == (128, None, "fp8_e4m3", 1)


# ---------------------------------------------------------------- gatedmlp.torch without a GPU
META = dict(device="meta", dtype=torch.bfloat16) if torch is not None else {}


@needs_torch
def test_ops_are_registered():
    for name in ("down", "quantized_down"):
        assert hasattr(torch.ops.gatedmlp, name)
    for name in ("down", "quantized_down", "mlp", "quantized_mlp"):
        assert name in gt.__all__ and callable(getattr(gt, name))


@needs_torch
@pytest.mark.parametrize("storage", ["out_in", "in_out"])
def test_fake_shapes(storage):
    h = torch.empty(2, 3, 64, **META)
    w = torch.empty(48, 64, **META) if storage == "out_in" else torch.empty(64, 48, **META)
    y = gt.down(h, w, storage=storage)
    assert y.shape == (2, 3, 48) and y.dtype == torch.bfloat16 and y.device.type == "meta"
    y = gt.down(h, w, torch.empty(48, device="meta"), up=h.clone(), activation="gelu_tanh", storage=storage,
                out_dtype=torch.float32)
    assert y.shape == (2, 3, 48) and y.dtype == torch.float32
    # batched weights keep h's batch axis
    assert gt.down(h, torch.empty(2, 48, 64, **META)).shape == (2, 3, 48)
    # the whole MLP: x [.., 48] -> h [.., 64] -> y [.., 48]
    x = torch.empty(2, 3, 48, **META)
    wgu = torch.empty(128, 48, **META) if storage == "out_in" else torch.empty(48, 128, **META)
    wd = torch.empty(48, 64, **META) if storage == "out_in" else torch.empty(64, 48, **META)
    assert gt.mlp(x, wgu, wd, storage=storage).shape == (2, 3, 48)
    assert gt.mlp(x, wgu, wd, storage=storage, out_dtype=torch.float16).dtype == torch.float16


@needs_torch
def test_quantized_fake_shapes():
    h = torch.empty(2, 3, 256, **META)
    wq = torch.empty(40, 32, device="meta", dtype=torch.int32)  # U = 40 rows of 256 4-bit values
    s = torch.empty(40, 4, **META)
    y = gt.quantized_down(h, wq, s, s.clone())
    assert y.shape == (2, 3, 40) and y.dtype == torch.bfloat16
    assert gt.quantized_down(h, wq, s, s.clone(), up=h.clone(), out_dtype=torch.float32).dtype == torch.float32
    mx_scales = torch.empty(40, 8, device="meta", dtype=torch.uint8)
    assert gt.quantized_down(h, wq, mx_scales, mode="mxfp4").shape == (2, 3, 40)
    # quantized_mlp: x [.., 256] -> h [.., 128] (gate/up: 256 rows) -> y [.., 256]
    x = torch.empty(5, 256, **META)
    wgu = torch.empty(256, 32, device="meta", dtype=torch.int32)
    sgu = torch.empty(256, 4, **META)
    wd = torch.empty(256, 16, device="meta", dtype=torch.int32)
    sd = torch.empty(256, 2, **META)
    y = gt.quantized_mlp(x, wgu, sgu, sgu.clone(), wq_down=wd, scales_down=sd, biases_down=sd.clone())
    assert y.shape == (5, 256)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="nvfp4"):
        gt.quantized_down(h, wq, s, mode="nvfp4")


@needs_torch
def test_opcheck_schema_and_fake():
    h = torch.empty(5, 64, **META)
    w = torch.empty(48, 64, **META)
    b = torch.empty(48, device="meta")
    args = (h, w, h.clone(), b, "silu", 1.702, 7.0, "out_in", 1.0, None)
    torch.library.opcheck(torch.ops.gatedmlp.down.default, args, test_utils=("test_schema", "test_faketensor"))
    h = torch.empty(5, 256, **META)
    wq = torch.empty(40, 32, device="meta", dtype=torch.int32)
    s = torch.empty(40, 4, **META)
    args = (h, wq, s, s.clone(), None, None, "affine", 4, 64, 1, "silu", 1.702, 7.0, 1.0, None)
    torch.library.opcheck(torch.ops.gatedmlp.quantized_down.default, args,
                          test_utils=("test_schema", "test_faketensor"))


@needs_torch
def test_compile_and_export_trace_without_graph_breaks():
    x = torch.empty(2, 3, 48, **META)
    wgu = torch.empty(128, 48, **META)
    wd = torch.empty(48, 64, **META)
    bd = torch.empty(48, **META)

    def f(x, wgu, wd, bd):
        pre = x * 2.0
        h = gt.gate_up(pre, wgu, return_preact=True)[1]
        return gt.down(h[..., :64], wd, bd, up=h[..., 64:], activation="gelu_erf") + gt.mlp(x, wgu, wd)

    with torch.no_grad():
        assert torch.compile(f, backend="eager", fullgraph=True)(x, wgu, wd, bd).shape == (2, 3, 48)

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("wgu", wgu)
            self.register_buffer("wd", wd)
            self.register_buffer("bd", bd)

        def forward(self, x):
            return gt.mlp(x, self.wgu, self.wd, bias_down=self.bd)

    ep = torch.export.export(M(), (x,))
    assert "gatedmlp.gate_up" in ep.graph_module.code and "gatedmlp.down" in ep.graph_module.code

    wq = torch.empty(256, 32, device="meta", dtype=torch.int32)
    s = torch.empty(256, 4, **META)
    wq_d = torch.empty(256, 16, device="meta", dtype=torch.int32)
    s_d = torch.empty(256, 2, **META)

    def g(x):
        return gt.quantized_mlp(x, wq, s, s, wq_down=wq_d, scales_down=s_d, biases_down=s_d, activation="relu")

    with torch.no_grad():
        assert torch.compile(g, backend="eager", fullgraph=True)(torch.empty(3, 256, **META)).shape == (3, 256)


@needs_torch
def test_no_backward_is_an_error():
    h = torch.empty(4, 64, **META)
    w = torch.empty(48, 64, **META)
    with pytest.raises(RuntimeError, match="no backward pass"):
        gt.down(h.requires_grad_(), w)
    h.requires_grad_(False)
    with pytest.raises(RuntimeError, match="no backward pass"):
        gt.down(h, w, up=torch.empty(4, 64, **META).requires_grad_())
    with torch.no_grad():
        gt.down(h, w.requires_grad_())
    with pytest.raises(RuntimeError, match="no backward pass"):
        gatedmlp.down(torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True),
                      torch.randn(48, 64, dtype=torch.bfloat16))


@needs_torch
def test_cpu_tensors_get_the_library_error():
    h = torch.randn(4, 64, dtype=torch.bfloat16)
    w = torch.randn(48, 64, dtype=torch.bfloat16)
    for call in (lambda: gt.down(h, w), lambda: gatedmlp.down(h, w, up=h.clone())):
        with pytest.raises(gatedmlp.Error) as e:
            call()
        _assert_host_memory_error(e.value, "x")
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'w' has dtype float16"):
        gt.down(h, w.half())
    with pytest.raises(gatedmlp.InvalidArgumentError, match="K = 64"):
        gt.down(h, w[:, :32])
    with pytest.raises(gatedmlp.InvalidArgumentError, match=r"'bias' must be \[U\] = \(48,\)"):
        gatedmlp.down(h, w, torch.zeros(40))
    with pytest.raises(gatedmlp.InvalidArgumentError, match=r"'x_up'.*shape of 'x' \(4, 64\), got \(4, 32\)"):
        gt.down(h, w, up=h[:, :32])


@needs_torch
def test_empty_batch_launches_nothing():
    w = torch.randn(48, 64, dtype=torch.bfloat16)
    for h in (torch.empty(0, 64, dtype=torch.bfloat16), torch.empty(2, 0, 64, dtype=torch.bfloat16)):
        assert gt.down(h, w).shape == (*h.shape[:-1], 48)
        assert gt.down(h, w, up=h.clone()).shape == (*h.shape[:-1], 48)
        assert gatedmlp.down(h, w, up=h.clone()).shape == (*h.shape[:-1], 48)
    x = torch.empty(0, 48, dtype=torch.bfloat16)
    assert gt.mlp(x, torch.randn(128, 48, dtype=torch.bfloat16), w).shape == (0, 48)
    assert gatedmlp.mlp(x, torch.randn(128, 48, dtype=torch.bfloat16), w).shape == (0, 48)


# ================================================================ on a GPU
DEV = "cuda"
SEED = int(os.environ.get("GATEDMLP_TEST_SEED", "20261127"))
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32} if torch is not None else {}


def down_references(h, up, w, b, act, alpha, out_dtype, ca=1.702, cl=7.0):
    """(float64 reference, unfused PyTorch result at the input precision) of
    alpha * H @ w^T + b, H = h or act(h) * up; w is logical [U, K]."""
    h64 = h.double() if up is None else act_torch(act, h.double(), up.double(), ca, cl)
    ref = alpha * (h64 @ w.double().T)
    hh = h if up is None else act_torch(act, h, up, ca, cl)
    y = (hh @ w.T) * alpha
    if b is not None:
        ref, y = ref + b.double(), y + b.to(h.dtype)
    return ref, y.to(out_dtype)


def random_cases(n):
    r = random.Random(SEED)
    fixed = [dict(m=1, k=8, u=16), dict(m=100, k=8 * 59, u=16 * 23), dict(m=16, k=8 * 9, u=16 * 3),
             dict(m=17, k=8 * 127, u=16 * 5), dict(m=64, k=8 * 33, u=16 * 37), dict(m=65, k=8 * 3, u=16 * 1)]
    cases = []
    for i in range(n):
        c = dict(fixed[i]) if i < len(fixed) else dict(
            m=r.randint(1, 100), k=8 * (2 * r.randint(0, 60) + 1), u=16 * (2 * r.randint(0, 30) + 1))
        c.update(
            dtype=r.choice(["bf16", "fp16"]),
            out=r.choice(["same", "same", "fp32"]),
            act=ACTS[i % len(ACTS)],
            glu=(i // len(ACTS)) % 2 == 0,  # every activation with and without the GLU input
            storage=r.choice(["out_in", "out_in", "in_out"]),
            bias=r.choice([None, "fp32", "same"]),
            alpha=r.choice([1.0, 1.0, 0.5]),
            pad_x=r.choice([0, 0, 8]),
            pad_y=r.choice([0, 0, 3]),
        )
        cases.append(c)
    return cases


CASES = random_cases(60)


def _id(c):
    return (f"m{c['m']}k{c['k']}u{c['u']}-{c['dtype']}-{c['act'] if c['glu'] else 'noglu'}-{c['storage']}"
            f"-{'bias' + c['bias'] if c['bias'] else 'nobias'}")


@on_gpu
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_random_down(case):
    c = case
    dt = DTYPES[c["dtype"]]
    odt = dt if c["out"] == "same" else DTYPES[c["out"]]
    m, k, u = c["m"], c["k"], c["u"]
    scale = 4.0 if c["act"] == "swiglu_clamped" else 1.0  # reach the clamps
    # gate and up halves side by side in one padded buffer: one row stride
    buf = (torch.randn(m, 2 * (k + c["pad_x"]), device=DEV) * scale).to(dt)
    h = buf[:, :k]
    up = buf[:, k + c["pad_x"]:2 * k + c["pad_x"]] if c["glu"] else None
    w = (torch.randn(u, k, device=DEV) / math.sqrt(k)).to(dt)
    b = None
    if c["bias"]:
        b = torch.randn(u, device=DEV).to(torch.float32 if c["bias"] == "fp32" else dt)
    ref, unfused = down_references(h, up, w, b, c["act"], c["alpha"], odt)
    wt = w if c["storage"] == "out_in" else w.T.contiguous()
    kw = dict(up=up, activation=c["act"], alpha=c["alpha"], storage=c["storage"])

    y_full = torch.full((m, u + c["pad_y"]), float("nan"), device=DEV, dtype=odt)
    y = y_full[:, :u]
    assert gatedmlp.down(h, wt, b, out=y, **kw) is y
    torch.cuda.synchronize()
    assert_within_rule(y, unfused, ref, _id(c))
    if c["pad_y"]:
        assert torch.isnan(y_full[:, u:]).all(), "wrote outside out's columns"

    # The torch operator: into a fresh out (within the rule), and into the
    # same out layout through the functional call's twin (the same bits).
    with torch.no_grad():
        y2 = gt.down(h, wt, b, out_dtype=odt, **kw)
    assert_within_rule(y2, unfused, ref, _id(c) + " (torch op)")
    y3_full = torch.full_like(y_full, float("nan"))
    gatedmlp.down(h, wt, b, out=y3_full[:, :u], **kw)
    assert torch.equal(y3_full[:, :u], y)


@on_gpu
@pytest.mark.parametrize("act", ACTS)
def test_batched(act):
    L, m, k, u = 3, 33, 64, 48
    h = torch.randn(L, m, k, device=DEV, dtype=torch.bfloat16)
    up = torch.randn(L, m, k, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(L, u, k, device=DEV, dtype=torch.bfloat16) / 8
    b = torch.randn(L, u, device=DEV)
    y = torch.full((L, m, u), float("nan"), device=DEV, dtype=torch.bfloat16)
    gatedmlp.down(h, w, b, up=up, out=y, activation=act)
    for i in range(L):
        ref, unfused = down_references(h[i], up[i], w[i], b[i], act, 1.0, torch.bfloat16)
        assert_within_rule(y[i], unfused, ref, f"batch {i}")
    y.fill_(float("nan"))
    gatedmlp.down(h, w[0], out=y)  # weights shared by the batch, no GLU
    for i in range(L):
        ref, unfused = down_references(h[i], None, w[0], None, act, 1.0, torch.bfloat16)
        assert_within_rule(y[i], unfused, ref, f"shared weights, batch {i}")


@on_gpu
def test_glu_input_from_gate_up_preact():
    # gate_up's pre-activation [M, 2I] (separate weights: [gate | up]) as the
    # down projection's GLU input: its two halves share one row stride.
    m, hidden, inter = 40, 128, 192
    x = torch.randn(m, hidden, device=DEV, dtype=torch.bfloat16)
    wg, wu, wd = _mlp_weights(hidden, inter, torch.bfloat16)
    pre = torch.full((m, 2 * inter), float("nan"), device=DEV, dtype=torch.bfloat16)
    gatedmlp.gate_up(x, wg, wu, preact=pre)
    y = torch.full((m, hidden), float("nan"), device=DEV, dtype=torch.bfloat16)
    gatedmlp.down(pre[:, :inter], wd, up=pre[:, inter:], out=y, activation="gelu_tanh")
    ref, unfused = down_references(pre[:, :inter], pre[:, inter:], wd, None, "gelu_tanh", 1.0, torch.bfloat16)
    assert_within_rule(y, unfused, ref, "preact halves")


@on_gpu
def test_clamped_parameters_are_used():
    m, k, u = 20, 64, 48
    h, up = (torch.randn(2, m, k, device=DEV, dtype=torch.bfloat16) * 4).unbind(0)
    w = torch.randn(u, k, device=DEV, dtype=torch.bfloat16) / 8
    for ca, cl in [(1.702, 7.0), (1.0, 2.0), (3.0, 0.5)]:
        with torch.no_grad():
            y = gt.down(h, w, up=up, activation="swiglu_clamped", clamp_alpha=ca, clamp_limit=cl)
        ref, unfused = down_references(h, up, w, None, "swiglu_clamped", 1.0, torch.bfloat16, ca, cl)
        assert_within_rule(y, unfused, ref, f"alpha={ca} limit={cl}")
        y2 = gatedmlp.down(h, w, up=up, activation="swiglu_clamped",
                           act_params=gatedmlp.ActivationParams(clamp_alpha=ca, clamp_limit=cl))
        assert torch.equal(y, y2)


@on_gpu
def test_direct_path_matches_the_op():
    h = torch.randn(2, 19, 256, device=DEV, dtype=torch.bfloat16)
    up = torch.randn(2, 19, 256, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(96, 256, device=DEV, dtype=torch.bfloat16) / 16
    b = torch.randn(96, device=DEV)
    with torch.no_grad():
        direct = gt.down(h, w, b, up=up, activation="relu")
        op = torch.ops.gatedmlp.down(h, w, up, b, "relu", 1.702, 7.0, "out_in", 1.0, None)
        plain = gatedmlp.down(h.reshape(-1, 256), w, b, up=up.reshape(-1, 256), activation="relu")
    assert direct.shape == (2, 19, 96)
    assert torch.equal(direct, op) and torch.equal(direct.reshape(-1, 96), plain)


@on_gpu
def test_workspace_given_and_held():
    m, k, u = 100, 512, 256  # past the decode kernels' rows, with the GLU input: scratch for both
    h, up = torch.randn(2, m, k, device=DEV, dtype=torch.bfloat16).unbind(0)
    w = torch.randn(u, k, device=DEV, dtype=torch.bfloat16) / 16
    ref, unfused = down_references(h, up, w, None, "silu", 1.0, torch.bfloat16)
    n = gatedmlp.workspace_size(gatedmlp.make_down_problem(h, w, up=up))
    given = torch.full((max(n, 1),), 255, device=DEV, dtype=torch.uint8)  # garbage in: must not matter
    for ws, what in [(None, "held"), (given, "given")]:
        y = gatedmlp.down(h, w, up=up, workspace=ws)
        assert_within_rule(y, unfused, ref, f"workspace {what}")
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'workspace'.*host memory"):
        gatedmlp.down(h, w, up=up, workspace=given.cpu())


@on_gpu
@pytest.mark.parametrize("m", [4, 100])
def test_cuda_graph_capture_and_replay(m):
    k, u = 256, 128
    h = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    up = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(u, k, device=DEV, dtype=torch.bfloat16) / 16
    y = torch.empty(m, u, device=DEV, dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        gatedmlp.down(h, w, up=up, out=y)  # warm up outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        gatedmlp.down(h, w, up=up, out=y)
    for _ in range(3):
        h.copy_(torch.randn(m, k, device=DEV))
        up.copy_(torch.randn(m, k, device=DEV))
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, unfused = down_references(h, up, w, None, "silu", 1.0, torch.bfloat16)
        assert_within_rule(y, unfused, ref, "graph replay")


@on_gpu
def test_errors_on_the_gpu():
    h = torch.randn(8, 64, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(48, 64, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'x'.*host memory"):
        gatedmlp.down(h.cpu(), w, out=torch.empty(8, 48, device=DEV, dtype=torch.bfloat16))
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'w'.*host memory"):
        gatedmlp.down(h, w.cpu())
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'x_up'.*host memory"):
        gatedmlp.down(h, w, up=h.cpu())
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'x_up' must have the row stride"):
        gatedmlp.down(h, w, up=torch.randn(8, 80, device=DEV, dtype=torch.bfloat16)[:, :64])
    with pytest.raises(gatedmlp.NotSupportedError):
        gatedmlp.down(h.float(), w.float())


@on_gpu
def test_empty_inputs_on_the_gpu():
    w = torch.randn(48, 64, device=DEV, dtype=torch.bfloat16)
    for h in (torch.empty(0, 64, device=DEV, dtype=torch.bfloat16),
              torch.empty(2, 0, 64, device=DEV, dtype=torch.bfloat16)):
        with torch.no_grad():
            assert gt.down(h, w, up=h).shape == (*h.shape[:-1], 48)
        assert gatedmlp.down(h, w).shape == (*h.shape[:-1], 48)
    torch.cuda.synchronize()


# ---------------------------------------------------------------- quantized weights
# (mode, bits, group_size, row_block)
QFORMATS = [("affine", 4, 32, 1), ("affine", 4, 64, 1), ("affine", 4, 128, 1), ("affine", 8, 32, 1),
            ("affine", 8, 64, 1), ("affine", 8, 128, 1), ("mxfp4", 4, 32, 1), ("fp8_e4m3", 8, 0, 1),
            ("fp8_e4m3", 8, 128, 128)]


def _qid(f):
    return f"{f[0]}-b{f[1]}-g{f[2]}" + (f"-rb{f[3]}" if f[0] == "fp8_e4m3" else "")


def quantized_weights(u, k, fmt, dtype):
    """(kernel arrays (wq as int32, scales, biases) on the GPU, the weights
    they stand for as float64 [U, K])."""
    mode, bits, group, row_block = fmt
    if mode == "fp8_e4m3":
        # FP8 as checkpoints store it; the kernels multiply the exact e4m3
        # values and scale the sums, so the reference is value * scale.
        w8 = (torch.randn(u, k, device=DEV) * 2).to(torch.float8_e4m3fn)
        rb, gs = (u if row_block == 0 else row_block), (k if group == 0 else group)
        scales = torch.rand(-(-u // rb), -(-k // gs), device=DEV, dtype=torch.float32) * 0.02 + 0.005
        full = scales.double().repeat_interleave(rb, 0)[:u].repeat_interleave(gs, 1)[:, :k]
        return (w8.view(torch.int32), scales, None), w8.double() * full
    w = (torch.randn(u, k) * 0.05).to(dtype)  # on the host: quantize works there
    parts = gatedmlp.quantize(w, group_size=group, bits=bits, mode=mode)
    wq, scales, biases = parts[0], parts[1], parts[2] if mode == "affine" else None
    # Each weight is q * scale + bias rounded once to the input dtype: what
    # dequantize gives in that dtype.
    w_ref = gatedmlp.dequantize(wq, scales, biases, group_size=group, bits=bits, mode=mode, dtype=dtype)
    arrays = (wq.view(torch.int32).to(DEV), scales.to(DEV), None if biases is None else biases.to(DEV))
    return arrays, w_ref.to(DEV).double()


def _qkw(fmt):
    mode, bits, group, row_block = fmt
    return dict(mode=mode, bits=bits, group_size=group, row_block=row_block)


@on_gpu
@pytest.mark.parametrize("glu", [False, True], ids=["noglu", "glu"])
@pytest.mark.parametrize("m", [1, 7, 16, 33, 64, 100])
@pytest.mark.parametrize("fmt", QFORMATS, ids=_qid)
def test_quantized_down(fmt, m, glu):
    k, u = 640, 72
    dt = torch.bfloat16 if m % 2 else torch.float16
    (wq, scales, biases), w64 = quantized_weights(u, k, fmt, dt)
    h = torch.randn(m, k, device=DEV, dtype=dt)
    up = torch.randn(m, k, device=DEV, dtype=dt) if glu else None
    bias = torch.randn(u, device=DEV) if m % 3 == 0 else None
    y = torch.full((m, u), float("nan"), device=DEV, dtype=dt)
    gatedmlp.quantized_down(h, wq, scales, biases, up=up, bias=bias, out=y, activation="silu", **_qkw(fmt))
    torch.cuda.synchronize()
    hh = h.double() if up is None else act_torch("silu", h.double(), up.double())
    ref = hh @ w64.T + (bias.double() if bias is not None else 0)
    # The unfused PyTorch path on the same weights in the input dtype.
    _, unfused = down_references(h, up, w64.to(dt), bias, "silu", 1.0, dt)
    assert_within_rule(y, unfused, ref, f"{_qid(fmt)} m={m} glu={glu}")
    with torch.no_grad():
        y2 = gt.quantized_down(h, wq, scales, biases, up=up, bias=bias, **_qkw(fmt))
    assert torch.equal(y2, y)


MLX_FORMATS = [("affine", 4, 32), ("affine", 4, 64), ("affine", 4, 128), ("affine", 8, 64), ("mxfp4", 4, 32)]


@on_gpu
@pytest.mark.parametrize("glu", [False, True], ids=["noglu", "glu"])
@pytest.mark.parametrize("m", [1, 16, 33, 100])
@pytest.mark.parametrize("mode,bits,group", MLX_FORMATS)
def test_quantized_down_matches_mlx(mode, bits, group, m, glu):
    """Against MLX's quantized_matmul on its CPU backend, from the same packed
    arrays; the input is act(g) * u in float32 from the same bf16 halves."""
    pytest.importorskip("mlx.core")
    nrng = np.random.default_rng()
    k, u = 512, 80
    w = (nrng.standard_normal((u, k)) * 0.05).astype(np.float32)  # fp32: MLX's scales and biases are fp32
    parts = gatedmlp.quantize(w, group_size=group, bits=bits, mode=mode)
    wq, scales = parts[0], parts[1]
    biases = parts[2] if mode == "affine" else None
    g = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    up = torch.randn(m, k, device=DEV, dtype=torch.bfloat16) if glu else None
    h32 = (F.silu(g.float()) * up.float() if glu else g.float()).cpu().numpy()
    want = mlx_matmul(h32, wq, scales, biases, group, bits, mode)

    dev = lambda a: None if a is None else torch.from_numpy(np.ascontiguousarray(a)).to(DEV)  # noqa: E731
    y = gatedmlp.quantized_down(g, dev(wq.view(np.int32)), dev(scales), dev(biases), up=up, group_size=group,
                                bits=bits, mode=mode, out=torch.full((m, u), float("nan"), device=DEV))
    got = y.cpu().numpy()
    assert np.isfinite(got).all()
    c = cosine(got, want)
    assert c >= 0.99999, f"cosine {c} against MLX ({mode}, bits={bits}, group={group}, m={m}, glu={glu})"


# ---------------------------------------------------------------- the whole MLP
def _mlp_weights(hidden, inter, dtype):
    wg, wu = [(torch.randn(inter, hidden, device=DEV) / math.sqrt(hidden)).to(dtype) for _ in range(2)]
    wd = (torch.randn(hidden, inter, device=DEV) / math.sqrt(inter)).to(dtype)
    return wg, wu, wd


def mlp_reference(x, wg, wu, wd, bg, bu, bd, act):
    """The MLP in float64 (weights of any float dtype, float64 for exact ones)."""
    lin = lambda t, w, b: t @ w.double().T + (b.double() if b is not None else 0)  # noqa: E731
    x64 = x.double()
    return lin(act_torch(act, lin(x64, wg, bg), lin(x64, wu, bu)), wd, bd)


def mlp_chain(x, wg, wu, wd, bg, bu, bd, act):
    """The unfused PyTorch chain at x's precision: F.linear, act * mul, F.linear."""
    cast = lambda b: None if b is None else b.to(x.dtype)  # noqa: E731
    return F.linear(act_torch(act, F.linear(x, wg, cast(bg)), F.linear(x, wu, cast(bu))), wd, cast(bd))


@on_gpu
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("m", [1, 16, 77])
@pytest.mark.parametrize("variant", ["fused", "separate-bias", "in_out"])
def test_mlp(act, m, variant):
    hidden, inter = 256, 384
    dt = torch.bfloat16
    wg, wu, wd = _mlp_weights(hidden, inter, dt)
    x = torch.randn(m, hidden, device=DEV, dtype=dt) * (4 if act == "swiglu_clamped" else 1)
    bg = bu = bd = None
    if variant == "separate-bias":
        bg, bu, bd = torch.randn(inter, device=DEV), torch.randn(inter, device=DEV), torch.randn(hidden, device=DEV)
    ref, chain = mlp_reference(x, wg, wu, wd, bg, bu, bd, act), mlp_chain(x, wg, wu, wd, bg, bu, bd, act)
    y = torch.full((m, hidden), float("nan"), device=DEV, dtype=dt)
    if variant == "separate-bias":
        gatedmlp.mlp(x, wg, wd, wu, bg, bu, bd, out=y, activation=act)
        y2 = gt.mlp(x, wg, wd, wu, bg, bu, bd, activation=act)
    elif variant == "in_out":
        w, w_down = torch.cat([wg, wu]).T.contiguous(), wd.T.contiguous()
        gatedmlp.mlp(x, w, w_down, out=y, activation=act, storage="in_out")
        y2 = gt.mlp(x, w, w_down, activation=act, storage="in_out")
    else:
        gatedmlp.mlp(x, torch.cat([wg, wu]), wd, out=y, activation=act)
        y2 = gt.mlp(x, torch.cat([wg, wu]), wd, activation=act)
    torch.cuda.synchronize()
    assert_within_rule(y, chain, ref, f"mlp {variant} {act} m={m}")
    assert torch.equal(y2, y), "gatedmlp.torch.mlp and gatedmlp.mlp run the same kernels"


@on_gpu
@pytest.mark.parametrize("m", [1, 16, 77])
@pytest.mark.parametrize("fmts", [(("affine", 4, 64, 1), None), (("affine", 8, 32, 1), ("affine", 4, 128, 1)),
                                  (("mxfp4", 4, 32, 1), None), (("fp8_e4m3", 8, 128, 128), None)],
                         ids=["int4g64", "int8g32-int4g128", "mxfp4", "fp8-128x128"])
@pytest.mark.parametrize("separate", [False, True], ids=["fused", "separate"])
def test_quantized_mlp(fmts, m, separate):
    hidden, inter = 256, 384
    dt = torch.bfloat16
    fmt, fmt_down = fmts[0], fmts[1] or fmts[0]
    if separate:
        (wq, s, b), wg = quantized_weights(inter, hidden, fmt, dt)
        (wq_up, s_up, b_up), wu = quantized_weights(inter, hidden, fmt, dt)
        gu = dict(wq_up=wq_up, scales_up=s_up, biases_up=b_up)
    else:
        (wq, s, b), wgu = quantized_weights(2 * inter, hidden, fmt, dt)
        wg, wu = wgu[:inter], wgu[inter:]
        gu = {}
    (wq_d, s_d, b_d), wd = quantized_weights(hidden, inter, fmt_down, dt)
    x = torch.randn(m, hidden, device=DEV, dtype=dt)
    ref = mlp_reference(x, wg, wu, wd, None, None, None, "silu")  # the exact weights
    chain = mlp_chain(x, wg.to(dt), wu.to(dt), wd.to(dt), None, None, None, "silu")
    down_kw = {}
    if fmts[1] is not None:
        down_kw = dict(mode_down=fmt_down[0], bits_down=fmt_down[1], group_size_down=fmt_down[2],
                       row_block_down=fmt_down[3])
    y = torch.full((m, hidden), float("nan"), device=DEV, dtype=dt)
    gatedmlp.quantized_mlp(x, wq, s, b, wq_down=wq_d, scales_down=s_d, biases_down=b_d, out=y, **gu,
                           **_qkw(fmt), **down_kw)
    torch.cuda.synchronize()
    assert_within_rule(y, chain, ref, f"quantized mlp {fmts} m={m}")
    with torch.no_grad():
        y2 = gt.quantized_mlp(x, wq, s, b, wq_down=wq_d, scales_down=s_d, biases_down=b_d, **gu, **_qkw(fmt),
                              **down_kw)
    assert torch.equal(y2, y)


# ---------------------------------------------------------------- torch.compile
@on_gpu
def test_compiled_ops_match_the_functional_calls():
    hidden, inter, m = 256, 384, 24
    dt = torch.bfloat16
    wg, wu, wd = _mlp_weights(hidden, inter, dt)
    w = torch.cat([wg, wu])
    bd = torch.randn(hidden, device=DEV)
    (wq, s, b), _ = quantized_weights(2 * inter, hidden, ("affine", 4, 64, 1), dt)
    (wq_d, s_d, b_d), _ = quantized_weights(hidden, inter, ("affine", 4, 64, 1), dt)

    def f(x, g, u):
        return (gt.down(g, wd, bd, up=u, activation="gelu_tanh"), gt.mlp(x, w, wd, bias_down=bd),
                gt.quantized_down(g, wq_d, s_d, b_d, up=u),
                gt.quantized_mlp(x, wq, s, b, wq_down=wq_d, scales_down=s_d, biases_down=b_d))

    torch._dynamo.reset()
    for mode in (None, "reduce-overhead"):
        cf = torch.compile(f, fullgraph=True, mode=mode)
        with torch.no_grad():
            for _ in range(3):  # fresh inputs each call, replayed graphs included
                x = torch.randn(m, hidden, device=DEV, dtype=dt)
                g, u = torch.randn(2, m, inter, device=DEV, dtype=dt).unbind(0)
                g, u = g.contiguous(), u.contiguous()
                got = [t.clone() for t in cf(x, g, u)]
                want = (gatedmlp.down(g, wd, bd, up=u, activation="gelu_tanh"), gatedmlp.mlp(x, w, wd, bias_down=bd),
                        gatedmlp.quantized_down(g, wq_d, s_d, b_d, up=u),
                        gatedmlp.quantized_mlp(x, wq, s, b, wq_down=wq_d, scales_down=s_d, biases_down=b_d))
                for name, a, e in zip(("down", "mlp", "quantized_down", "quantized_mlp"), got, want):
                    assert torch.equal(a, e), f"compiled {name} (mode={mode}) differs from the functional call"
