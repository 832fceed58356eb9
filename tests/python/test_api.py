"""The binding without a GPU: names, descriptors, and the errors a caller gets.

Needs NumPy only. Tensors here are host arrays: building the descriptor from
them needs no device, and running on them must fail with the library's error.
"""

import copy

import numpy as np
import pytest

import gatedmlp
from gatedmlp import Activation, DType, Half, WeightFormat, WeightStorage

rng = np.random.default_rng(1234)


def f16(*shape):
    return rng.standard_normal(shape).astype(np.float16)


# ---------------------------------------------------------------- names
def test_version_and_names():
    assert isinstance(gatedmlp.__version__, str) and gatedmlp.__version__
    assert [m for m in DType.__members__] == ["bf16", "fp16", "fp32", "fp8_e4m3"]
    assert list(Activation.__members__) == ["silu", "gelu_tanh", "gelu_erf", "relu", "swiglu_clamped"]
    assert list(WeightFormat.__members__) == ["fused", "separate"]
    assert list(Half.__members__) == ["gate", "up"]
    assert list(WeightStorage.__members__) == ["out_in", "in_out"]
    assert list(gatedmlp.KernelPath.__members__) == ["none", "sm80_mma", "sm90_wgmma", "decode", "quant_decode",
                                                     "cublas"]
    assert list(gatedmlp.StatusCode.__members__) == [
        "ok", "invalid_argument", "not_supported", "no_device", "cuda_error", "library_error"]
    assert gatedmlp.kAuto == -1
    assert gatedmlp.dtype_size(DType.fp32) == 4 and gatedmlp.dtype_size(DType.bf16) == 2
    assert gatedmlp.to_string(Activation.swiglu_clamped) == "swiglu_clamped"
    for name in ["check_support", "plan", "validate", "run", "workspace_size", "convert_weights",
                 "convert_weights_device", "gate_up", "make_problem", "fused_row", "fused_row_inverse"]:
        assert callable(getattr(gatedmlp, name)), name


def test_error_classes():
    E = gatedmlp
    assert issubclass(E.InvalidArgumentError, E.Error) and issubclass(E.InvalidArgumentError, ValueError)
    assert issubclass(E.NotSupportedError, E.Error) and issubclass(E.NotSupportedError, NotImplementedError)
    for cls in (E.NoDeviceError, E.CudaError, E.LibraryError):
        assert issubclass(cls, E.Error) and issubclass(cls, RuntimeError)


def test_problem_fields_defaults_and_kwargs():
    p = gatedmlp.Problem()
    assert (p.m, p.k, p.u, p.batch) == (0, 0, 0, 1)
    assert p.input_dtype == DType.bf16 and p.output_dtype == DType.bf16
    assert p.activation == Activation.silu and p.alpha == 1.0
    assert p.batch_stride_x == gatedmlp.kAuto
    assert p.weights.format == WeightFormat.fused and p.weights.group == 0
    assert p.act_params.clamp_alpha == pytest.approx(1.702) and p.act_params.clamp_limit == 7.0

    p = gatedmlp.Problem(m=3, k=64, u=32, activation=Activation.gelu_tanh,
                         weights=gatedmlp.WeightLayout(group=8, first=Half.up))
    assert (p.m, p.k, p.u, p.activation) == (3, 64, 32, Activation.gelu_tanh)
    assert p.weights.group == 8 and p.weights.first == Half.up
    # Nested structs are references: editing them edits the problem.
    p.weights.storage = WeightStorage.in_out
    p.act_params.clamp_limit = 5.0
    assert p.weights.storage == WeightStorage.in_out and p.act_params.clamp_limit == 5.0
    q = copy.deepcopy(p)
    q.m = 7
    assert p.m == 3
    assert "m=3" in repr(p) and "group=8" in repr(p)
    with pytest.raises(TypeError, match="no field 'mm'"):
        gatedmlp.Problem(mm=1)
    with pytest.raises(TypeError):
        gatedmlp.Problem(m="three")


def test_resolved():
    r = gatedmlp.Problem(m=4, k=64, u=32).resolved()
    assert (r.ldx, r.ldy, r.weights.group, r.weights.ld, r.batch_stride_x) == (64, 32, 32, 64, 4 * 64)


def test_check_support_returns_status():
    s = gatedmlp.check_support(gatedmlp.Problem(m=4, k=64, u=32))
    assert s and s.ok() and s.code == gatedmlp.StatusCode.ok
    bad = gatedmlp.check_support(gatedmlp.Problem(m=4, k=64, u=32, weights=gatedmlp.WeightLayout(group=5)))
    assert not bad and bad.code == gatedmlp.StatusCode.invalid_argument
    assert "group" in bad.message
    with pytest.raises(gatedmlp.InvalidArgumentError, match="group") as e:
        bad.raise_if_error()
    assert e.value.code == gatedmlp.StatusCode.invalid_argument
    fp32 = gatedmlp.check_support(gatedmlp.Problem(m=4, k=64, u=32, input_dtype=DType.fp32))
    assert fp32.code == gatedmlp.StatusCode.not_supported
    assert gatedmlp.workspace_size(gatedmlp.Problem(m=4, k=64, u=32)) == 0


def test_fused_row_matches_spec():
    from refs import fused_rows

    for u, group in [(12, 0), (12, 1), (12, 3), (12, 12), (64, 32)]:
        for first in (Half.gate, Half.up):
            for f, (h, j) in enumerate(fused_rows(u, group, int(first.value))):
                half = Half.gate if h == 0 else Half.up
                assert gatedmlp.fused_row(j, half, u, group, first) == f
                assert gatedmlp.fused_row_inverse(f, u, group, first) == (half, j)


def test_arguments_hold_raw_pointers():
    a = gatedmlp.Arguments(x=0x1000, w=0x2000)
    assert (a.x, a.w, a.y) == (0x1000, 0x2000, 0)
    a.y = 0x3000
    assert a.y == 0x3000
    s = gatedmlp.validate(gatedmlp.Problem(m=4, k=64, u=32), a)
    assert not s and "overlaps" in s.message  # y overlaps w: the library reads the spans


# ---------------------------------------------------------------- descriptors from tensors
def test_make_problem_dense():
    x, w = f16(5, 64), f16(96, 64)
    p = gatedmlp.make_problem(x, w)
    assert (p.m, p.k, p.u, p.batch) == (5, 64, 48, 1)
    assert p.input_dtype == DType.fp16 and p.output_dtype == DType.fp16
    assert p.weights.format == WeightFormat.fused and p.weights.ld == 64 and p.ldx == 64
    assert not p.has_bias and not p.has_preact
    assert gatedmlp.check_support(p)


def test_make_problem_strided_views_and_options():
    xbig, wbig = f16(5, 80), f16(96, 72)
    out = np.empty((5, 40), np.float32)[:, :24]  # a slice: ldy = 40
    pre = np.empty((5, 48), np.float16)
    bias = rng.standard_normal(48).astype(np.float32)
    p = gatedmlp.make_problem(xbig[:, :64], wbig[:48, :64], bias=bias, out=out, preact=pre,
                              activation="swiglu_clamped", act_params=gatedmlp.ActivationParams(clamp_limit=3.0),
                              group=8, first="up", alpha=0.5)
    assert (p.m, p.k, p.u) == (5, 64, 24)
    assert (p.ldx, p.weights.ld, p.ldy, p.ldpre) == (80, 72, 40, 48)
    assert p.output_dtype == DType.fp32 and p.has_bias and p.bias_dtype == DType.fp32
    assert p.has_preact and p.preact_dtype == DType.fp16
    assert p.activation == Activation.swiglu_clamped and p.act_params.clamp_limit == 3.0
    assert p.weights.group == 8 and p.weights.first == Half.up and p.alpha == 0.5


def test_make_problem_in_out_separate_and_batched():
    x, wg, wu = f16(3, 4, 32), f16(32, 16), f16(32, 16)
    p = gatedmlp.make_problem(x, wg, wu, storage="in_out")
    assert (p.batch, p.m, p.k, p.u) == (3, 4, 32, 16)
    assert p.weights.format == WeightFormat.separate and p.weights.storage == WeightStorage.in_out
    assert p.weights.ld == 16
    assert p.batch_stride_x == 4 * 32 and p.batch_stride_w == 0  # shared weights
    wb = f16(3, 32, 32)
    p = gatedmlp.make_problem(x, wb, bias=np.zeros((3, 32), np.float32), out=np.empty((3, 4, 16), np.float16))
    assert p.batch_stride_w == 32 * 32 and p.batch_stride_bias == 32 and p.batch_stride_y == 4 * 16


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: (f16(64), f16(96, 64)), "'x' must be \\[M, K\\]"),
        (lambda: (f16(2, 2, 2, 64), f16(96, 64)), "'x' must be"),
        (lambda: (f16(5, 64), f16(96, 63)), "K = 64"),
        (lambda: (f16(5, 64), f16(95, 64)), "even number of rows"),
        (lambda: (f16(5, 64), f16(64, 96).T), "contiguous last dimension"),
        (lambda: (f16(5, 64), f16(96, 64).astype(np.float32)), "dtype"),
        (lambda: (f16(5, 64).astype(np.float64), f16(96, 64)), "float64"),
        (lambda: (f16(5, 64).astype(np.int32), f16(96, 64)), "int32"),
        (lambda: (np.broadcast_to(f16(1, 64), (5, 64)), f16(96, 64)), "row stride 0"),
        (lambda: (f16(2, 5, 64), f16(3, 96, 64)), "batch axis of 3"),
    ],
)
def test_descriptor_errors(make, match):
    x, w = make()
    with pytest.raises(gatedmlp.InvalidArgumentError, match=match):
        gatedmlp.make_problem(x, w)
    with pytest.raises(gatedmlp.InvalidArgumentError, match=match):
        gatedmlp.gate_up(x, w, out=np.empty((5, 48), np.float16))


def test_descriptor_errors_outputs_and_extras():
    x, w = f16(5, 64), f16(96, 64)
    cases = [
        (dict(out=np.empty((5, 47), np.float16)), "'out' must be \\[M, U\\] = \\(5, 48\\)"),
        (dict(out=np.empty((5, 48), np.float64)), "'out' has dtype float64"),
        (dict(preact=np.empty((5, 48), np.float16)), "'preact' must be \\[M, 2U\\]"),
        (dict(bias=np.zeros(48, np.float32)), "'bias' must be \\[2U\\] = \\(96,\\)"),
        (dict(bias=np.zeros(192, np.float32)[::2]), "'bias' must be contiguous"),
    ]
    for kw, match in cases:
        with pytest.raises(gatedmlp.InvalidArgumentError, match=match):
            gatedmlp.make_problem(x, w, **kw)
    wg = f16(48, 64)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'w_up' must have the shape"):
        gatedmlp.make_problem(x, wg, f16(40, 64))
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'w_up' must have the row stride"):
        gatedmlp.make_problem(x, wg, f16(48, 80)[:, :64])
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'bias_up' has dtype"):
        gatedmlp.make_problem(x, wg, f16(48, 64), bias=np.zeros(48, np.float32), bias_up=np.zeros(48, np.float16))
    with pytest.raises(gatedmlp.InvalidArgumentError, match="activation='swish'"):
        gatedmlp.make_problem(x, w, activation="swish")


def test_not_a_tensor_and_read_only_output():
    with pytest.raises(TypeError, match="'x' \\(list\\)"):
        gatedmlp.gate_up([[1.0]], f16(2, 1), out=np.empty((1, 1), np.float16))
    out = np.empty((5, 48), np.float16)
    out.flags.writeable = False
    with pytest.raises(TypeError, match="'out' is read-only"):
        gatedmlp.gate_up(f16(5, 64), f16(96, 64), out=out)


# ---------------------------------------------------------------- running on host memory
def _assert_host_memory_error(e, name):
    """Host memory must be refused by the library naming the argument; on a
    machine without a GPU the library may stop earlier, at 'no device'."""
    if isinstance(e, gatedmlp.NoDeviceError):
        assert "device" in str(e)
        return
    assert isinstance(e, gatedmlp.InvalidArgumentError), repr(e)
    assert f"'{name}'" in str(e) and "host memory" in str(e)


def test_host_arrays_are_refused_by_the_library():
    x, w = f16(5, 64), f16(96, 64)
    with pytest.raises(gatedmlp.Error) as e:
        gatedmlp.gate_up(x, w)  # out is allocated with NumPy, like x
    _assert_host_memory_error(e.value, "x")
    with pytest.raises(gatedmlp.Error) as e:
        gatedmlp.gate_up(x, w, out=np.empty((5, 48), np.float16), stream=0)
    _assert_host_memory_error(e.value, "x")


def test_shape_rules_come_before_pointers():
    # fp32 inputs are a well-formed problem no kernel takes: the library says
    # so before it looks at the (host) pointers.
    x, w = f16(5, 64).astype(np.float32), f16(96, 64).astype(np.float32)
    with pytest.raises(gatedmlp.NotSupportedError, match="input_dtype"):
        gatedmlp.gate_up(x, w, out=np.empty((5, 48), np.float32))
    with pytest.raises(gatedmlp.InvalidArgumentError, match="group"):
        gatedmlp.gate_up(f16(5, 64), f16(96, 64), group=5)


class CudaArrayInterface:
    """A producer with only __cuda_array_interface__ (as Numba's arrays)."""

    def __init__(self, array, typestr=None, readonly=False):
        self.array = array
        self.__cuda_array_interface__ = {
            "shape": array.shape,
            "typestr": typestr or array.dtype.str,
            "data": (array.ctypes.data, readonly),
            "strides": array.strides,
            "version": 3,
        }


def test_cuda_array_interface_is_read():
    x, w = f16(5, 80)[:, :64], f16(96, 64)
    p = gatedmlp.make_problem(CudaArrayInterface(x), CudaArrayInterface(w))
    assert (p.m, p.k, p.u, p.ldx, p.input_dtype) == (5, 64, 48, 80, DType.fp16)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'x' has dtype float64"):
        gatedmlp.make_problem(CudaArrayInterface(x.astype(np.float64)), w)
    with pytest.raises(TypeError, match="'out' is read-only"):
        gatedmlp.gate_up(x, w, out=CudaArrayInterface(np.empty((5, 48), np.float16), readonly=True))
    with pytest.raises(gatedmlp.Error) as e:
        gatedmlp.gate_up(CudaArrayInterface(x), CudaArrayInterface(w),
                         out=CudaArrayInterface(np.empty((5, 48), np.float16)))
    _assert_host_memory_error(e.value, "x")


def test_plan_and_run_raise():
    p = gatedmlp.Problem(m=4, k=64, u=32)
    try:
        c = gatedmlp.plan(p)
    except gatedmlp.NoDeviceError:
        pass  # no GPU here
    else:
        assert c.path != gatedmlp.KernelPath.none and c.tile_m > 0
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'x' is null"):
        gatedmlp.run(p, gatedmlp.Arguments())
