"""gatedmlp: fused gated-MLP (GEMM + GLU) kernels.

    y = act(alpha * x @ Wg^T + bg) * (alpha * x @ Wu^T + bu)        # [M, U]

in one launch, writing only y, and the down projection after it,

    y = alpha * h @ Wd^T + bd,   h = x or act(gate) * up              # [M, hidden]

This package binds the C++ API one to one (``Problem``, ``check_support``,
``plan``, ``run``, ``convert_weights``, the enums) and adds :func:`gate_up`,
:func:`down` and :func:`mlp` (both halves), which take tensors of any
framework that speaks DLPack or ``__cuda_array_interface__`` (PyTorch, JAX,
CuPy, ...) without copying them. :func:`gather_gate_up`,
:func:`gather_down` and :func:`fused_swiglu_gather_qmv` are the
Mixture-of-Experts (gathered) calls: many experts' rows in one launch;
:func:`grouped_gate_up` is the grouped (prefill) gate/up call: rows sorted
by expert, each expert's rows a contiguous range given by cumulative
offsets, and :func:`moe_sort` sorts a routing into that form.
:func:`moe_mlp` is a whole MoE layer's experts (both halves, the routing
weights and the sum over the top-k). ``gatedmlp.torch`` has the PyTorch
operators and the ``GatedMLP`` and ``MoEExperts`` modules.

Errors are the library's own messages, raised as ``gatedmlp.Error``
subclasses: ``InvalidArgumentError`` (a ``ValueError``), ``NotSupportedError``
(a ``NotImplementedError``), ``NoDeviceError``, ``CudaError`` and
``LibraryError`` (``RuntimeError``\\ s).
"""

from __future__ import annotations

import os as _os
import sys as _sys
from typing import NamedTuple as _NamedTuple

from . import _gatedmlp as _C
from ._gatedmlp import (
    Activation,
    ActivationParams,
    Arguments,
    Config,
    CudaError,
    DType,
    Error,
    Gather,
    Half,
    IndexType,
    InvalidArgumentError,
    KernelPath,
    LibraryError,
    NoDeviceError,
    NotSupportedError,
    Operation,
    Problem,
    Status,
    StatusCode,
    QuantFormat,
    QuantMode,
    WeightFormat,
    WeightLayout,
    WeightStorage,
    XScale,
    YScaleLayout,
    __version__,
    check_support,
    dtype_size,
    fused_row,
    fused_row_inverse,
    kAuto,
    kMaxGatherExperts,
    make_down_problem as _make_down_problem,
    make_problem as _make_problem,
    plan,
    run,
    to_string,
    validate,
    workspace_size,
)

__all__ = [
    "Activation", "ActivationParams", "Arguments", "Config", "CudaError", "DType", "Error", "Half",
    "InvalidArgumentError", "KernelPath", "LibraryError", "NoDeviceError", "NotSupportedError", "Operation",
    "Problem", "Status", "StatusCode", "WeightFormat", "WeightLayout", "WeightStorage", "__version__",
    "check_support", "convert_weights", "convert_weights_device", "current_stream", "down", "dtype_size",
    "fused_row", "fused_row_inverse", "gate_up", "kAuto", "make_down_problem", "make_problem", "mlp", "plan", "run",
    "to_string", "validate", "workspace_size",
    "QuantFormat", "QuantMode", "quantize", "dequantize", "repack", "tile", "quantized_down", "quantized_gate_up", "quantized_mlp",
    "Gather", "IndexType", "kMaxGatherExperts", "gather_gate_up", "quantized_gather_gate_up", "gather_down",
    "fused_swiglu_gather_qmv", "moe_mlp", "MoESort", "moe_sort", "grouped_gate_up",
    "XScale", "YScaleLayout", "fp8_gate_up", "quantize_fp8",
]

from .quant import dequantize, quantize, quantized_down, quantized_gate_up, quantized_mlp, repack, tile  # noqa: E402
from .quant import _format as _quant_format  # noqa: E402
from .fp8 import fp8_gate_up, quantize_fp8  # noqa: E402

_NO_BACKWARD = (
    "gatedmlp has no backward pass yet: call it under torch.no_grad() or torch.inference_mode(), "
    "or on tensors that do not require grad"
)


def _enum(cls, value, what):
    """An enum member from itself or its name ("silu", "gate", "in_out")."""
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        try:
            return cls.__members__[value]
        except KeyError:
            names = ", ".join(cls.__members__)
            raise InvalidArgumentError(f"gatedmlp: {what}={value!r} is not one of {names}") from None
    raise TypeError(f"gatedmlp: {what} must be a {cls.__name__} or its name, got {type(value).__name__}")


def _framework(t) -> str:
    return type(t).__module__.split(".", 1)[0]


def _torch_capsule(t):
    # A DLPack capsule straight from ATen: no stream synchronisation (the
    # kernel runs on the current stream anyway) and none of the per-call
    # Python work of Tensor.__dlpack__.
    return _sys.modules["torch"].utils.dlpack.to_dlpack(t)


def _check_no_grad(tensors) -> None:
    # A torch tensor that requires grad would get a result with no gradient.
    if not any(_framework(t) == "torch" for t in tensors if t is not None):
        return
    if _sys.modules["torch"].is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors):
        raise RuntimeError(_NO_BACKWARD)


def _export(t):
    """What the extension receives for a tensor: torch tensors go as capsules."""
    if t is None:
        return None
    if _framework(t) == "torch":
        return _torch_capsule(t.detach())
    return t


def current_stream(t) -> int:
    """The stream gatedmlp uses for tensor `t` when none is given: PyTorch's
    current stream on t's device, CuPy's current stream, else 0 (the default
    stream)."""
    fw = _framework(t)
    if fw == "torch":
        if t.device.type != "cuda":
            return 0
        return _sys.modules["torch"].cuda.current_stream(t.device).cuda_stream
    if fw == "cupy":
        return _sys.modules["cupy"].cuda.get_current_stream().ptr
    return 0


def _stream_handle(stream) -> int:
    """A cudaStream_t as an int, from an int or a framework's stream object."""
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    return int(stream)


def _empty(like, shape, what):
    fw = _framework(like)
    if fw == "torch":
        return _sys.modules["torch"].empty(shape, dtype=like.dtype, device=like.device)
    if fw == "cupy":
        with _sys.modules["cupy"].cuda.Device(like.device.id):
            return _sys.modules["cupy"].empty(shape, dtype=like.dtype)
    if fw == "numpy":
        return _sys.modules["numpy"].empty(shape, dtype=like.dtype)
    raise TypeError(
        f"gatedmlp: cannot allocate '{what}' for a {type(like).__module__}.{type(like).__qualname__} input; "
        f"pass {what}= (a writable CUDA tensor)"
    )


def _workspace_alloc(like):
    """n -> n bytes of scratch allocated like `like` (torch and CuPy: their
    caching allocators), or None: the call then runs without a workspace."""
    fw = _framework(like)
    if fw == "torch":
        torch = _sys.modules["torch"]
        device = like.device
        return lambda n: _export(torch.empty(n, dtype=torch.uint8, device=device))
    if fw == "cupy":
        cupy = _sys.modules["cupy"]

        def alloc(n):
            with cupy.cuda.Device(like.device.id):
                return cupy.empty(n, dtype=cupy.uint8)
        return alloc
    return None


def make_problem(x, w, w_up=None, bias=None, bias_up=None, *, out=None, preact=None,
                 activation=Activation.silu, act_params=None, group=0, first=Half.gate,
                 storage=WeightStorage.out_in, alpha=1.0, indices=None, rows_per_x=1, rows_per_index=1,
                 grouped=False) -> Problem:
    """The Problem that gate_up() would run for these tensors; with
    `indices`, the gathered call's (x [m / rows_per_x, K], w [E, rows, K],
    Problem.gather); with grouped=True as well, grouped_gate_up's (indices
    the E cumulative row ends; workspace_size() of it is the scratch that
    call needs)."""
    return _make_problem(
        _export(x), _export(w), _export(out), _export(w_up), _export(bias), _export(bias_up), _export(preact),
        activation=_enum(Activation, activation, "activation"), act_params=act_params, group=group,
        first=_enum(Half, first, "first"), storage=_enum(WeightStorage, storage, "storage"), alpha=alpha,
        indices=_export(indices), rows_per_x=rows_per_x, rows_per_index=rows_per_index,
        **({"grouped": True} if grouped else {}))


def gate_up(x, w, w_up=None, bias=None, bias_up=None, *, out=None, preact=None,
            activation=Activation.silu, act_params=None, group=0, first=Half.gate,
            storage=WeightStorage.out_in, alpha=1.0, stream=None, workspace=None):
    """y = act(alpha * x @ Wg^T + bg) * (alpha * x @ Wu^T + bu), fused.

    x:       [M, K] or [batch, M, K], bf16 or fp16, rows contiguous.
    w:       fused gate/up weights, [2U, K] (storage=out_in, as nn.Linear) or
             [K, 2U] (storage=in_out), interleaved in blocks of `group` rows
             (0: U, the stacked [gate; up] layout), `first` half first.
             With w_up: the gate weights, and w_up the up weights, [U, K] each.
             A leading batch axis is optional; without it the weights are
             shared by every batch.
    bias:    [2U] in weight-row order (fused), or the gate bias [U] with
             bias_up [U] (separate). Optional.
    out:     [M, U] (the C++ Arguments.y). Allocated like x when None (for
             PyTorch, CuPy and NumPy inputs). Its dtype picks the output dtype;
             it may be a strided slice of a larger tensor.
    preact:  optional [M, 2U] output of the GEMM result plus bias, before the
             activation (columns in weight-row order).
    activation: an Activation or its name; act_params an ActivationParams
             (swiglu_clamped's alpha and limit).
    stream:  a cudaStream_t as an int, or a torch/CuPy stream object;
             None: current_stream(x).
    workspace: optional device scratch of workspace_size(make_problem(...))
             bytes (any dtype). None: allocated like x when the call uses one
             (the Hopper path's split tail); a smaller one runs unsplit.

    Returns `out`. No copy of any tensor is made.
    """
    activation = activation if type(activation) is Activation else _enum(Activation, activation, "activation")
    first = first if type(first) is Half else _enum(Half, first, "first")
    storage = storage if type(storage) is WeightStorage else _enum(WeightStorage, storage, "storage")
    torch = _sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _gate_up_torch(torch, x, w, w_up, bias, bias_up, out, preact, activation, act_params, group, first,
                              storage, alpha, stream, workspace)
    _check_no_grad((x, w, w_up, bias, bias_up, out, preact))
    if out is None:
        p = _make_problem(_export(x), _export(w), None, _export(w_up), None, None, None,
                          activation=activation, act_params=act_params, group=group, first=first,
                          storage=storage, alpha=alpha)
        shape = (p.batch, p.m, p.u) if len(x.shape) == 3 else (p.m, p.u)
        out = _empty(x, shape, "out")
    if stream is None:
        stream = current_stream(x)
    _C.gate_up(_export(x), _export(w), _export(out), _export(w_up), _export(bias), _export(bias_up),
               _export(preact), activation=activation, act_params=act_params, group=group, first=first,
               storage=storage, alpha=alpha, stream=_stream_handle(stream), workspace=_export(workspace),
               workspace_alloc=_workspace_alloc(x))
    return out


# Per device, the allocator of held scratch (see _gatedmlp.gate_up).
_TORCH_WS_ALLOC = {}


def _torch_stream_and_alloc(torch, t, stream, workspace):
    """The raw stream of a PyTorch call (the current one of t's device when
    None) and the workspace allocator held for t's device (None when the
    caller passes a workspace)."""
    if stream is None:
        stream = torch._C._cuda_getCurrentRawStream(t.get_device()) if t.is_cuda else 0
    else:
        stream = _stream_handle(stream)
    alloc = None
    if workspace is None:
        alloc = _TORCH_WS_ALLOC.get(t.device)
        if alloc is None:
            alloc = _TORCH_WS_ALLOC[t.device] = _workspace_alloc(t)
    return stream, alloc


def _new_out(x, u, dtype=None):
    """Y [..., u] for a torch x [..., K], in dtype (None: x's). Spelled for
    host time (h88, x86): x.new_empty(x.size(0), u) 1.5 us, with dtype=None
    0.6 us more, with the sizes unpacked from x.shape[:-1] 1.2 us more."""
    if x.dim() == 2:
        return x.new_empty(x.size(0), u) if dtype is None else x.new_empty(x.size(0), u, dtype=dtype)
    return x.new_empty(*x.shape[:-1], u, dtype=dtype)


def _gate_up_torch(torch, x, w, w_up, bias, bias_up, out, preact, activation, act_params, group, first, storage,
                   alpha, stream, workspace):
    # gate_up for PyTorch tensors, kept short: every line here is host time
    # on each call (the library checks the shapes; this only sizes `out`).
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (x, w, w_up, bias, bias_up, out, preact)):
        raise RuntimeError(_NO_BACKWARD)
    if out is None:
        rows = w.shape[-1] if storage == WeightStorage.in_out else w.shape[-2]
        out = _new_out(x, rows if w_up is not None else rows // 2)
    stream, alloc = _torch_stream_and_alloc(torch, x, stream, workspace)
    to = torch.utils.dlpack.to_dlpack
    _C.gate_up(to(x), to(w), to(out), None if w_up is None else to(w_up), None if bias is None else to(bias),
               None if bias_up is None else to(bias_up), None if preact is None else to(preact),
               activation=activation, act_params=act_params, group=group, first=first, storage=storage,
               alpha=alpha, stream=stream, workspace=None if workspace is None else _export(workspace),
               workspace_alloc=alloc)
    return out


# ---------------------------------------------------------------- the down projection
def make_down_problem(h, w, bias=None, *, up=None, out=None, activation=Activation.silu, act_params=None,
                      storage=WeightStorage.out_in, alpha=1.0, indices=None, rows_per_x=1,
                      rows_per_index=1, row_scale=None) -> Problem:
    """The Problem that down() would run for these tensors (op = down,
    glu_input when `up` is given; gathered with `indices`, has_row_scale
    with `row_scale`)."""
    return _make_down_problem(
        _export(h), _export(w), _export(out), _export(up), _export(bias),
        activation=_enum(Activation, activation, "activation"), act_params=act_params,
        storage=_enum(WeightStorage, storage, "storage"), alpha=alpha, indices=_export(indices),
        rows_per_x=rows_per_x, rows_per_index=rows_per_index, row_scale=_export(row_scale))


def down(h, w, bias=None, *, up=None, out=None, activation=Activation.silu, act_params=None,
         storage=WeightStorage.out_in, alpha=1.0, stream=None, workspace=None):
    """The down projection: y = alpha * h @ W^T + bias; with `up`, the GLU
    act(h) * up is its input (h the gate half; the call computes the GLU
    into its workspace, so the caller never stores it).

    h:       [M, K] or [batch, M, K] (K: the MLP's intermediate size), bf16 or
             fp16, rows contiguous. With `up`: the gate half of the input.
    up:      optional up half, h's shape, dtype and strides (the two halves
             of gate_up's preact=, h = pre[:, :K] and up = pre[:, K:], qualify).
    w:       [U, K] (storage=out_in, as nn.Linear) or [K, U] (in_out), U the
             hidden size; batched [batch, ...] or shared by every batch.
    bias:    optional [U] (fp32, bf16 or fp16), or [batch, U].
    out:     [M, U]; allocated like h when None. Its dtype picks the output
             dtype (bf16, fp16, fp32); it may be a strided slice.
    activation, act_params: the GLU applied with `up`; ignored without it.
    stream, workspace: as for gate_up (scratch: the GLU of the input, the
             dequantized or cuBLASLt path at larger M).

    Messages name h 'x' and up 'x_up', the C++ Arguments' names. Returns out.
    """
    activation = activation if type(activation) is Activation else _enum(Activation, activation, "activation")
    storage = storage if type(storage) is WeightStorage else _enum(WeightStorage, storage, "storage")
    torch = _sys.modules.get("torch")
    if torch is not None and isinstance(h, torch.Tensor):
        return _down_torch(torch, h, w, up, bias, out, activation, act_params, storage, alpha, stream, workspace)
    _check_no_grad((h, w, up, bias, out))
    if out is None:
        p = _make_down_problem(_export(h), _export(w), None, _export(up), None, activation=activation,
                               act_params=act_params, storage=storage, alpha=alpha)
        out = _empty(h, (p.batch, p.m, p.u) if len(h.shape) == 3 else (p.m, p.u), "out")
    if stream is None:
        stream = current_stream(h)
    _C.down(_export(h), _export(w), _export(out), _export(up), _export(bias), activation=activation,
            act_params=act_params, storage=storage, alpha=alpha, stream=_stream_handle(stream),
            workspace=_export(workspace), workspace_alloc=_workspace_alloc(h))
    return out


def _down_torch(torch, h, w, up, bias, out, activation, act_params, storage, alpha, stream, workspace):
    # down for PyTorch tensors, kept short like _gate_up_torch: the library
    # checks the shapes; this only sizes `out`.
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (h, w, up, bias, out)):
        raise RuntimeError(_NO_BACKWARD)
    if out is None:
        if w.dim() not in (2, 3):  # let the binding say what w must be
            _make_down_problem(_export(h), _export(w), None, _export(up), None, storage=storage)
        out = h.new_empty(*h.shape[:-1], w.shape[-1] if storage == WeightStorage.in_out else w.shape[-2])
    stream, alloc = _torch_stream_and_alloc(torch, h, stream, workspace)
    to = torch.utils.dlpack.to_dlpack
    _C.down(to(h), to(w), to(out), None if up is None else to(up), None if bias is None else to(bias),
            activation=activation, act_params=act_params, storage=storage, alpha=alpha, stream=stream,
            workspace=None if workspace is None else _export(workspace), workspace_alloc=alloc)
    return out


def mlp(x, w, w_down, w_up=None, bias=None, bias_up=None, bias_down=None, *, out=None, activation=Activation.silu,
        act_params=None, group=0, first=Half.gate, storage=WeightStorage.out_in, stream=None):
    """The whole gated MLP: down(gate_up(x, w, ...), w_down, bias_down).

    x, w, w_up, bias, bias_up, activation, act_params, group, first: as for
    gate_up, whose result h [M, I] (I the intermediate size, in x's dtype)
    is a temporary allocated like x. w_down is [H, I] (storage=out_in) or
    [I, H] (in_out; `storage` applies to every weight), bias_down [H]; out
    [M, H] is allocated like x when None. Both calls run on `stream`
    (None: current_stream(x)), one after the other. Returns out.
    """
    if stream is None:
        stream = current_stream(x)
    h = gate_up(x, w, w_up, bias, bias_up, activation=activation, act_params=act_params, group=group, first=first,
                storage=storage, stream=stream)
    return down(h, w_down, bias_down, out=out, storage=storage, stream=stream)


def _conv(fn, from_w, to_w, from_layout, to_layout, from_w_up, to_w_up, stream):
    if stream is None:
        stream = current_stream(from_w)
    fn(_export(from_w), _export(to_w), from_layout=from_layout, to_layout=to_layout,
       from_w_up=_export(from_w_up), to_w_up=_export(to_w_up), stream=_stream_handle(stream))
    return to_w


def convert_weights(from_w, to_w, *, from_layout, to_layout, from_w_up=None, to_w_up=None, stream=None):
    """Copy gate/up weights (or a 1-D bias, K = 1) from one WeightLayout to another.

    U, K, the dtype and each layout's ld are read from the tensors (a layout's
    ld may be left at 0). from_w_up / to_w_up are the up tensors of a
    separate layout. Host tensors (NumPy, CPU torch) are converted on the host;
    CUDA tensors on the device, asynchronously on `stream` (None: the current
    stream). Returns to_w.
    """
    return _conv(_C.convert_weights, from_w, to_w, from_layout, to_layout, from_w_up, to_w_up, stream)


def convert_weights_device(from_w, to_w, *, from_layout, to_layout, from_w_up=None, to_w_up=None, stream=None):
    """convert_weights for CUDA tensors only, asynchronously on `stream`."""
    return _conv(_C.convert_weights_device, from_w, to_w, from_layout, to_layout, from_w_up, to_w_up, stream)


# ---------------------------------------------------------------- gathered (Mixture-of-Experts) calls
# One launch computes the rows of many experts: output row r reads row
# r / rows_per_x of the input and the weights of expert ids[r /
# rows_per_index], each distinct expert's weights read once (Gather in
# gatedmlp.hpp). The weights, bias and quantized scales / biases carry a
# leading expert axis E.
def _shape(t):
    return tuple(int(d) for d in t.shape)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _invalid(message):
    return InvalidArgumentError("gatedmlp: " + message)


def _xp(t):
    """The array module of a tensor that is not a torch tensor: NumPy, CuPy,
    or its Array API namespace."""
    fw = _framework(t)
    if fw in ("numpy", "cupy"):
        return _sys.modules[fw]
    if hasattr(t, "__array_namespace__"):
        return t.__array_namespace__()
    raise TypeError(f"gatedmlp: cannot reshape a {type(t).__module__}.{type(t).__qualname__} tensor here; "
                    "pass a PyTorch, CuPy or NumPy tensor, or one with __array_namespace__")


def _alloc(like, shape, what):
    if _framework(like) == "torch":
        return like.new_empty(shape)
    return _empty(like, shape, what)


def _as_rows(t, rows, form, natural, what):
    """Output `t`, of shape `natural` or `rows` (2-D), as `rows` without a
    copy: the kernel must write into t itself."""
    if t is None:
        return None
    ts = _shape(t)
    if ts == rows:
        return t
    if ts != natural:
        raise _invalid(f"'{what}' must be {form} = {natural} (or {rows} as rows), got shape {ts}")
    fw = _framework(t)
    try:
        v = t.view(rows) if fw == "torch" else t.reshape(rows)
    except RuntimeError:  # torch: no view of these strides
        v = None
    if v is None or (fw in ("numpy", "cupy") and _numel(rows) > 0 and not _xp(t).may_share_memory(v, t)):
        raise _invalid(f"'{what}' of shape {ts} cannot be viewed as {rows} rows without a copy (an output is "
                       "written in place): pass a contiguous tensor")
    return v


def _row_strides(t):
    """Strides in elements, or None where the framework does not say."""
    if _framework(t) == "torch":
        return tuple(t.stride())
    st = getattr(t, "strides", None)
    if st is None:
        return None
    return tuple(s // t.dtype.itemsize for s in st)


def _contiguous(t):
    if _framework(t) == "torch":
        return t.contiguous()
    return _xp(t).ascontiguousarray(t) if _framework(t) in ("numpy", "cupy") else t


def _same_rows(a, b):
    """a and b ([R, K]) with one row stride and contiguous rows, as the
    descriptor reads both halves of a GLU input: copies only where needed."""
    sa, sb = _row_strides(a), _row_strides(b)
    if sa is None or sb is None:
        return a, b
    rows, k = _shape(a)
    ok = lambda s: k <= 1 or s[1] == 1  # noqa: E731
    if ok(sa) and ok(sb) and (rows <= 1 or sa[0] == sb[0]):
        return a, b
    return _contiguous(a), _contiguous(b)


def _flat_rows(t, rows, k):
    """Input t [..., K] as [rows, K] (a view where one exists, else a copy)."""
    return t if len(t.shape) == 2 else t.reshape(rows, k)


def _expand(t, shape):
    """t broadcast to `shape` (a view)."""
    if _framework(t) == "torch":
        return t.expand(shape)
    return _xp(t).broadcast_to(t, shape)


def _ids(t):
    """Expert ids as the kernels take them: int32 or int64, contiguous.
    Other integer dtypes (MLX's uint32, ...) are converted to int64."""
    if _framework(t) == "torch":
        torch = _sys.modules["torch"]
        if t.dtype not in (torch.int32, torch.int64):
            if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
                return t  # the binding names the dtype
            t = t.to(torch.int64)
        return t.contiguous()
    dt = getattr(t, "dtype", None)
    if _framework(t) in ("numpy", "cupy"):
        xp = _xp(t)
        if dt.kind in "ui" and dt not in (xp.dtype("int32"), xp.dtype("int64")):
            t = t.astype(xp.int64)
        return xp.ascontiguousarray(t)
    return t


def _index_error_like(like):
    """The two int64 a gathered call writes its index check into, allocated
    with like's framework on its device."""
    fw = _framework(like)
    if fw == "torch":
        return _sys.modules["torch"].empty(2, dtype=_sys.modules["torch"].int64, device=like.device)
    if fw == "cupy":
        cupy = _sys.modules["cupy"]
        with cupy.cuda.Device(like.device.id):
            return cupy.empty(2, dtype=cupy.int64)
    if fw == "numpy":
        return _sys.modules["numpy"].empty(2, dtype=_sys.modules["numpy"].int64)
    raise TypeError(
        f"gatedmlp: cannot allocate the index check's 2 int64 for a {type(like).__module__}."
        f"{type(like).__qualname__} input; pass check_indices=False (a bad index then leaves the output unwritten)")


_ASYNC = "async"


def _check_index_error(err, stream, name, experts, position=None):
    """Raises IndexError naming `name` when the call found a bad index
    (reading err synchronises with `stream`). position(p) maps a position
    in the ids the kernel read to one in the caller's tensor."""
    pos, value = _C.read_index_error(_export(err), stream)
    if pos < 0:
        return
    if position is not None:
        pos = position(pos)
    raise IndexError(f"gatedmlp: '{name}' holds {value} at position {pos}, outside [0, E={experts}); "
                     "nothing was written")


def _stream_and_alloc(x, stream, workspace):
    """The raw stream of a call (current_stream(x) when None) and the
    workspace allocator (None when the caller passes a workspace)."""
    torch = _sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _torch_stream_and_alloc(torch, x, stream, workspace)
    handle = _stream_handle(current_stream(x) if stream is None else stream)
    return handle, (None if workspace is not None else _workspace_alloc(x))


def _expert_weights(w, form, what="w"):
    ws = _shape(w)
    if len(ws) != 3:
        raise _invalid(f"'{what}' must be {form} (the experts' weights one after another), got shape {ws}")
    return ws


def _gather_gate_up(x, ids, w, w_up, bias, bias_up, out, preact, activation, act_params, group, first, alpha,
                    stream, workspace, check, fmt=None, scales=None, biases=None, scales_up=None, biases_up=None):
    activation = activation if type(activation) is Activation else _enum(Activation, activation, "activation")
    first = first if type(first) is Half else _enum(Half, first, "first")
    _check_no_grad((x, w, w_up, bias, bias_up, out, preact))
    xs, ks = _shape(x), _shape(ids)
    if len(xs) != 2:
        raise _invalid(f"'x' must be [T, K] (2-D), got shape {xs}")
    if len(ks) != 2 or ks[0] != xs[0]:
        raise _invalid(f"'topk_ids' must be [T, k] with T = {xs[0]} (x.shape[0]), got shape {ks}")
    t, k = ks
    sep = w_up is not None
    if fmt is None:
        form = "[E, U, K]" if sep else "[E, 2U, K]"
    else:
        form = "[E, U, K * bits / 32]" if sep else "[E, 2U, K * bits / 32]"
    experts, rows, _ = _expert_weights(w, form)
    u = rows if sep else rows // 2
    m = t * k
    if out is None:
        out = _alloc(x, (t, k, u), "out")
    out2 = _as_rows(out, (m, u), "[T, k, U]", (t, k, u), "out")
    pre2 = _as_rows(preact, (m, 2 * u), "[T, k, 2U]", (t, k, 2 * u), "preact")
    if k == 0:
        return out  # no rows to compute (and rows_per_x must be >= 1)
    handle, alloc = _stream_and_alloc(x, stream, workspace)
    # "async" (PyTorch): the kernel's own device-side assertion, no read back.
    trap = check == _ASYNC and _framework(x) == "torch"
    err = _index_error_like(x) if check and not trap and m > 0 else None
    e = _export
    _C.gate_up(e(x), e(w), e(out2), e(w_up), e(bias), e(bias_up), e(pre2), activation=activation,
               act_params=act_params, group=group, first=first, alpha=alpha, stream=handle, workspace=e(workspace),
               workspace_alloc=alloc, scales=e(scales), biases=e(biases), scales_up=e(scales_up),
               biases_up=e(biases_up), quant=fmt, indices=e(_ids(ids)), rows_per_x=k, rows_per_index=1,
               index_error=e(err), index_trap=trap)
    if err is not None:
        _check_index_error(err, handle, "topk_ids", experts)
    return out


def gather_gate_up(x, topk_ids, w, w_up=None, bias=None, bias_up=None, *, out=None, preact=None,
                   activation=Activation.silu, act_params=None, group=0, first=Half.gate, alpha=1.0, stream=None,
                   workspace=None, check_indices=True):
    """gate_up of a Mixture-of-Experts layer, vLLM-style: every token's x
    row through each of its top-k experts, in one launch.

        out[t, j] = act(alpha * x[t] @ Wg[e]^T + bg[e]) * (alpha * x[t] @ Wu[e]^T + bu[e]),
                    e = topk_ids[t, j]

    x:        [T, K], bf16 or fp16, rows contiguous.
    topk_ids: [T, k] expert ids, int32 or int64 (other integer dtypes are
              converted), in [0, E).
    w:        the experts' fused gate/up weights [E, 2U, K] (each [2U, K]
              interleaved by `group` rows, `first` half first, as for
              gate_up), or with w_up the gate weights, w_up the up weights,
              [E, U, K] each. K contiguous (storage out_in only).
    bias:     optional [E, 2U] (fused, weight-row order), or [E, U] with
              bias_up [E, U].
    out:      [T, k, U] (or [T * k, U]); allocated like x when None.
    preact:   optional [T, k, 2U] output of the GEMM results plus bias.
    check_indices: after the launch, read the kernel's index check (a
              synchronisation) and raise IndexError naming 'topk_ids' if an
              id is outside [0, E). False: no check and no sync (CUDA
              graphs); a bad id then leaves `out` unwritten, silently.
              "async" (PyTorch tensors): no read back; the kernel itself
              raises a device-side assertion on a bad id
              (Arguments.index_trap), which fails the stream, reported
              at the next synchronisation (see moe_mlp).

    activation, act_params, alpha, stream, workspace: as for gate_up.
    Messages from the binding name topk_ids 'indices'. Returns out.
    """
    return _gather_gate_up(x, topk_ids, w, w_up, bias, bias_up, out, preact, activation, act_params, group, first,
                           alpha, stream, workspace, check_indices)


def quantized_gather_gate_up(x, topk_ids, wq, scales, biases=None, *, wq_up=None, scales_up=None, biases_up=None,
                             bias=None, bias_up=None, out=None, preact=None, group_size=None, bits=None,
                             mode="affine", row_block=None, activation=Activation.silu, act_params=None, group=0,
                             first=Half.gate, alpha=1.0, stream=None, workspace=None, check_indices=True,
                             tiled=False):
    """gather_gate_up on quantized expert weights (quantize()'s arrays with
    a leading expert axis E; tiled=True: tile()'s words and (scale, bias)
    pairs as wq and scales, no biases, affine 4-bit with scales of x's dtype).

    wq:       [E, 2U, K * bits / 32] uint32 (or int32) words of the fused
              gate/up rows (by `group` and `first`), with scales / biases
              [E, 2U, K / group_size]; or, with wq_up, the gate rows in wq
              and the up rows in wq_up, [E, U, ...] each, with scales_up /
              biases_up. mxfp4 has no biases; fp8_e4m3 scales are
              [E, ceil(rows / row_block), ceil(K / group_size)] ([E] for one
              per expert). Formats, defaults and dtypes as for
              quantized_gate_up.

    x, topk_ids, bias, bias_up, out, preact, check_indices and the rest:
    as for gather_gate_up. Returns out [T, k, U].
    """
    fmt = _quant_format(group_size, bits, mode, row_block, False, tiled)
    if tiled and group == 0:
        group = 8  # tile()'s order
    return _gather_gate_up(x, topk_ids, wq, wq_up, bias, bias_up, out, preact, activation, act_params, group, first,
                           alpha, stream, workspace, check_indices, fmt, scales, biases, scales_up, biases_up)


def gather_down(h, ids, w, bias=None, *, up=None, scales=None, biases=None, group_size=None, bits=None,
                mode="affine", row_block=None, out=None, activation=Activation.silu, act_params=None, alpha=1.0,
                stream=None, workspace=None, check_indices=True, row_scale=None, tiled=False):
    """The down projection of a Mixture-of-Experts layer: each row of h
    through the expert its id names, in one launch.

        out[r] = s[r] * (alpha * H[r] @ W[ids[r]]^T + bias[ids[r]]),   H = h, or act(h) * up
        s = row_scale (1 without it)

    h:        [R, K] or [..., K] (gather_gate_up's [T, k, U] output, say),
              bf16 or fp16; the leading axes are flattened to R rows.
    ids:      R expert ids (any shape, gather_gate_up's topk_ids [T, k]
              say), int32 or int64 (other integer dtypes are converted).
    up:       optional up half of a GLU input, h's shape (h the gate half).
    w:        the experts' weights [E, U, K] (16-bit, K contiguous); with
              scales, quantized words [E, U, K * bits / 32] with scales /
              biases [E, U, K / group_size] in quantized_down's formats;
              tiled=True: tile(..., down=True)'s words and (scale, bias)
              pairs as w and scales, no biases (affine 4-bit, U a multiple
              of 16, scales of h's dtype).
    bias:     optional [E, U].
    row_scale: optional R per-row scales, float32, bfloat16 or float16 (any
              shape, made contiguous): the MoE routing weights, e.g.
              topk_weights [T, k] for h [T, k, K]. Applied in the kernel's
              epilogue, after alpha and the bias, before the one rounding.
    out:      [..., U] like h (or [R, U]); allocated like h when None.
    check_indices: as for gather_gate_up (the message names 'ids').

    activation, act_params, alpha, stream, workspace: as for down. Messages
    from the binding name h 'x', up 'x_up' and ids 'indices'. Returns out.
    """
    activation = activation if type(activation) is Activation else _enum(Activation, activation, "activation")
    _check_no_grad((h, w, up, bias, out, row_scale))
    if tiled and scales is None:
        raise _invalid("tiled=True takes tile(..., down=True)'s words and (scale, bias) pairs as w and scales; "
                       "'scales' is missing")
    fmt = None if scales is None else _quant_format(group_size, bits, mode, row_block, False, tiled)
    hs = _shape(h)
    if len(hs) < 2:
        raise _invalid(f"'h' must be [R, K] or [..., K], got shape {hs}")
    lead, k = hs[:-1], hs[-1]
    rows = _numel(lead)
    if up is not None and _shape(up) != hs:
        raise _invalid(f"'up' (the up half of the input) must have the shape of 'h' {hs}, got {_shape(up)}")
    ids_shape = _shape(ids)
    if _numel(ids_shape) != rows:
        raise _invalid(f"'ids' must hold one expert id per row of h, {rows} (h.shape[:-1] = {lead}), got shape "
                       f"{ids_shape}")
    if row_scale is not None and _numel(_shape(row_scale)) != rows:
        raise _invalid(f"'row_scale' must hold one scale per row of h, {rows} (h.shape[:-1] = {lead}), got shape "
                       f"{_shape(row_scale)}")
    experts, u, _ = _expert_weights(w, "[E, U, K]" if fmt is None else "[E, U, K * bits / 32]")
    if out is None:
        out = _alloc(h, (*lead, u), "out")
    out2 = _as_rows(out, (rows, u), "[..., U] like h", (*lead, u), "out")
    h2, up2 = _flat_rows(h, rows, k), None if up is None else _flat_rows(up, rows, k)
    if up2 is not None:
        h2, up2 = _same_rows(h2, up2)
    handle, alloc = _stream_and_alloc(h, stream, workspace)
    err = _index_error_like(h) if check_indices and rows > 0 else None
    e = _export
    _C.down(e(h2), e(w), e(out2), e(up2), e(bias), activation=activation, act_params=act_params, alpha=alpha,
            stream=handle, workspace=e(workspace), workspace_alloc=alloc, scales=e(scales), biases=e(biases),
            quant=fmt, indices=e(_ids(ids)), rows_per_x=1, rows_per_index=1, index_error=e(err),
            row_scale=None if row_scale is None else e(_contiguous(row_scale)))
    if err is not None:
        _check_index_error(err, handle, "ids", experts)
    return out


def _broadcast(a, b, names):
    """NumPy's broadcast of shapes a and b, or an error naming both."""
    n = max(len(a), len(b))
    a2, b2 = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a2, b2):
        if x != y and x != 1 and y != 1:
            raise _invalid(f"{names[0]} {tuple(a)} and {names[1]} {tuple(b)} do not broadcast")
        out.append(y if x == 1 else x)
    return tuple(out)


def fused_swiglu_gather_qmv(gate, up, w, scales, biases, rhs_indices, group_size=64, bits=4, mode="affine", *,
                            activation=Activation.silu, out=None, stream=None, check_indices=True):
    """MLX's ``gather_qmm(silu(gate) * up, w, scales, biases,
    rhs_indices=rhs_indices, transpose=True, group_size=..., bits=...,
    mode=...)`` in one launch: the GLU of the input fused into the gathered
    quantized down projection.

    gate, up:    (..., M, K), bf16 or fp16 (they broadcast against each
                 other, as silu(gate) * up does).
    w:           (E, N, K * bits / 32) uint32 (or int32) words with scales /
                 biases (E, N, K / group_size), MLX's arrays (mxfp4: biases
                 None); with scales None, 16-bit weights (E, N, K).
    rhs_indices: expert ids of the batch: broadcast against gate's batch
                 shape (gate.shape[:-2]); int32 or int64 (MLX's uint32 and
                 other integer dtypes are converted).
    out:         broadcast(gate.shape[:-2], rhs_indices.shape) + (M, N);
                 allocated like gate (its dtype) when None.
    activation:  the GLU (default silu: SwiGLU).
    check_indices: as for gather_gate_up (the message names 'rhs_indices').

    The GLU is computed in fp32 and rounded to gate's dtype, the sums are
    fp32. Inputs that need broadcasting are expanded with a copy; the rest
    are read in place. Returns out.
    """
    activation = activation if type(activation) is Activation else _enum(Activation, activation, "activation")
    _check_no_grad((gate, up, w, out))
    fmt = None if scales is None else _quant_format(group_size, bits, mode)
    gs, us = _shape(gate), _shape(up)
    xs = _broadcast(gs, us, ("'gate'", "'up'"))
    if len(xs) < 2:
        raise _invalid(f"'gate' and 'up' must be (..., M, K), got shapes {gs} and {us}")
    ids_shape = _shape(rhs_indices)
    batch = _broadcast(xs[:-2], ids_shape, ("the batch shape of 'gate'", "'rhs_indices'"))
    m, k = xs[-2], xs[-1]
    experts, n, _ = _expert_weights(w, "(E, N, K)" if fmt is None else "(E, N, K * bits / 32)")
    if out is None:
        out = _alloc(gate, (*batch, m, n), "out")
    b = _numel(batch)
    out2 = _as_rows(out, (b * m, n), "broadcast(gate.shape[:-2], rhs_indices.shape) + (M, N)", (*batch, m, n),
                    "out")
    if b * m == 0:
        return out
    full = (*batch, m, k)
    g2 = _flat_rows(_expand(gate, full) if gs != full else gate, b * m, k)
    u2 = _flat_rows(_expand(up, full) if us != full else up, b * m, k)
    g2, u2 = _same_rows(g2, u2)
    ids = rhs_indices if ids_shape == batch else _expand(rhs_indices, batch)
    ids = _ids(ids)
    if len(batch) != 1:
        ids = ids.reshape(b)
    handle, alloc = _stream_and_alloc(gate, stream, None)
    err = _index_error_like(gate) if check_indices else None
    e = _export
    _C.down(e(g2), e(w), e(out2), e(u2), None, activation=activation, stream=handle, workspace_alloc=alloc,
            scales=e(scales), biases=e(biases), quant=fmt, indices=e(ids), rows_per_x=1, rows_per_index=m,
            index_error=e(err))
    if err is not None:
        def position(p):
            # p in the broadcast batch -> the same element of rhs_indices
            idx = []
            for d in reversed(batch):
                idx.append(p % d)
                p //= d
            idx = idx[::-1][len(batch) - len(ids_shape):]
            flat = 0
            for i, d in zip(idx, ids_shape):
                flat = flat * d + (i if d > 1 else 0)
            return flat

        _check_index_error(err, handle, "rhs_indices", experts, position)
    return out


# ---------------------------------------------------------------- grouped (prefill) calls
# The rows come sorted by expert: expert e owns rows [offsets[e-1],
# offsets[e]) (offsets[-1] read as 0), torch._grouped_mm's `offs`. One launch
# computes every expert's rows, each expert's weights read once for all its
# rows (the Hopper path only).
def _integer_dtype(t) -> bool:
    return _dtype_name(t).startswith(("int", "uint"))


def _check_offsets_error(err, stream, rows, experts):
    """Raises ValueError naming 'offsets' when the grouped call found them
    malformed (reading err synchronises with `stream`)."""
    pos, value = _C.read_index_error(_export(err), stream)
    if pos < 0:
        return
    if value < 0:
        why = "a negative row end"
    elif value > rows:
        why = f"past R = {rows} (x.shape[0])"
    elif pos == experts - 1:
        why = f"the last one must be R = {rows} (x.shape[0])"
    elif pos > 0:
        why = f"less than offsets[{pos - 1}]"
    else:
        why = "refused by the kernel's check"
    raise ValueError(f"gatedmlp: 'offsets' holds {value} at position {pos}: {why} (offsets must be E = {experts} "
                     f"non-decreasing row ends in [0, R = {rows}], the last one R); nothing was written")


def _refuse_check_while_capturing(t, what):
    """A check that reads its result back cannot run while t's (current)
    stream is being captured into a CUDA graph: refused before anything is
    queued, naming the way out."""
    torch = _sys.modules.get("torch")
    if torch is not None and isinstance(t, torch.Tensor) and t.is_cuda and torch.cuda.is_current_stream_capturing():
        raise _invalid(f"the {what} check reads its result back to the host, which a stream being captured into a "
                       f"CUDA graph cannot do: pass check_{what}=False")


def grouped_gate_up(x, offsets, w, w_up=None, bias=None, bias_up=None, *, out=None, activation=Activation.silu,
                    act_params=None, group=0, first=Half.gate, alpha=1.0, stream=None, workspace=None,
                    check_offsets=True):
    """gate_up of a Mixture-of-Experts layer at prefill, grouped: the rows
    come sorted by expert and each expert's rows are one contiguous range,
    all of them computed in one launch (Hopper, sm_90, only).

        out[r] = act(alpha * x[r] @ Wg[e]^T + bg[e]) * (alpha * x[r] @ Wu[e]^T + bu[e]),
                 offsets[e-1] <= r < offsets[e]   (offsets[-1] read as 0)

    x:        [R, K] rows sorted by expert (moe_sort's order, say), bf16 or
              fp16, rows contiguous.
    offsets:  [E] cumulative row ends, int32 or int64 (other integer dtypes
              are converted; made contiguous): torch._grouped_mm's `offs`,
              moe_sort's offsets. Non-decreasing, in [0, R], the last one R;
              an expert with no rows repeats the end before it.
    w:        the experts' fused gate/up weights [E, 2U, K] (each [2U, K]
              interleaved by `group` rows, `first` half first, as for
              gate_up), or with w_up the gate weights, w_up the up weights,
              [E, U, K] each. K contiguous (storage out_in only); 16-bit
              only (quantized weights are not supported grouped).
    bias:     optional [E, 2U] (fused, weight-row order), or [E, U] with
              bias_up [E, U].
    out:      [R, U]; allocated like x (in x's dtype) when None.
    check_offsets: after the launch, read the kernel's offsets check (a
              synchronisation) and raise ValueError naming 'offsets', the
              first bad position and its value, if they decrease, are
              negative, pass R or do not end at R; nothing is written then.
              False: no check and no sync (CUDA graphs); bad offsets then
              leave `out` unwritten, silently.

    workspace: device scratch (any dtype) of workspace_size(make_problem(x,
              w, ..., indices=offsets, grouped=True)) bytes: the kernel's
              table of row tiles, which it needs (a smaller one is
              refused). None: allocated like x (PyTorch, CuPy).

    activation, act_params, alpha, stream: as for gate_up. No preact.
    R = 0 launches nothing. Shapes are checked, naming these arguments,
    before anything is allocated or launched. Messages from the binding
    name offsets 'indices'. Returns out.
    """
    activation = activation if type(activation) is Activation else _enum(Activation, activation, "activation")
    first = first if type(first) is Half else _enum(Half, first, "first")
    _check_no_grad((x, w, w_up, bias, bias_up, out))
    xs = _shape(x)
    if len(xs) != 2:
        raise _invalid(f"'x' must be [R, K] (2-D, the rows sorted by expert), got shape {xs}")
    rows, k = xs
    sep = w_up is not None
    form = "[E, U, K]" if sep else "[E, 2U, K]"
    experts, wrows, wk = ws = _expert_weights(w, form)
    if wk != k:
        raise _invalid(f"'w' must be {form} with K = {k} (x.shape[1]), got shape {ws}")
    if not sep and wrows % 2:
        raise _invalid(f"'w' must be [E, 2U, K] (the gate and up rows, an even number), got shape {ws}")
    if experts == 0:
        raise _invalid("'w' holds no experts (E = 0)")
    if sep and _shape(w_up) != ws:
        raise _invalid(f"'w_up' must have the shape of 'w' {ws}, got {_shape(w_up)}")
    u = wrows if sep else wrows // 2
    offs_shape = _shape(offsets)
    if offs_shape != (experts,):
        raise _invalid(f"'offsets' must be [E] = ({experts},) cumulative row ends, one per expert of 'w', got shape "
                       f"{offs_shape}")
    if not _integer_dtype(offsets):
        raise _invalid(f"'offsets' must be int32 or int64 (cumulative row ends), got {_dtype_name(offsets)}")
    if bias is not None and _shape(bias) != (experts, u if sep else 2 * u):
        raise _invalid(f"'bias' must be [E, {'U' if sep else '2U'}] = {(experts, u if sep else 2 * u)} (one bias "
                       f"per expert), got shape {_shape(bias)}")
    if bias_up is not None and _shape(bias_up) != (experts, u):
        raise _invalid(f"'bias_up' must be [E, U] = {(experts, u)}, got shape {_shape(bias_up)}")
    if out is not None and _shape(out) != (rows, u):
        raise _invalid(f"'out' must be [R, U] = {(rows, u)}, got shape {_shape(out)}")
    if check_offsets and rows > 0:
        _refuse_check_while_capturing(x, "offsets")
    if out is None:
        out = _alloc(x, (rows, u), "out")
    if rows == 0:
        return out  # no rows: nothing to launch (the offsets are then all 0, unread)
    handle, alloc = _stream_and_alloc(x, stream, workspace)
    err = _index_error_like(x) if check_offsets else None
    e = _export
    _C.gate_up(e(x), e(w), e(out), e(w_up), e(bias), e(bias_up), None, activation=activation, act_params=act_params,
               group=group, first=first, alpha=alpha, stream=handle, workspace=e(workspace), workspace_alloc=alloc,
               indices=e(_ids(offsets)), rows_per_x=1, rows_per_index=1, grouped=True, index_error=e(err))
    if err is not None:
        _check_offsets_error(err, handle, rows, experts)
    return out


class MoESort(_NamedTuple):
    """A routing sorted by expert (moe_sort's result), for T tokens, top-k
    and E experts.

    order:   int64 [T*k]: the flat positions p = t*k + j of topk_ids in
             expert order, stable (within an expert, in position order).
             Sorted row i comes from token order[i] // k.
    offsets: int32 [E]: cumulative row ends, torch._grouped_mm's `offs`:
             expert e owns sorted rows [offsets[e-1], offsets[e]).
    inverse: int64 [T*k]: the sorted row of each flat position,
             inverse[order[i]] = i.
    """

    order: object
    offsets: object
    inverse: object


def _first_bad_id(torch, flat, experts):
    """(position, value) of the first id outside [0, experts) in flat, or
    None: one small read back (a synchronisation)."""
    bad = (flat < 0) | (flat >= experts)
    pos = torch.argmax(bad.to(torch.int32)).reshape(1)  # the first True (0 when none)
    # index_select, not bad[pos]: indexing with a 0-d tensor reads it back
    found, p, v = torch.cat((bad.index_select(0, pos).to(torch.int64), pos,
                             flat.index_select(0, pos).to(torch.int64))).tolist()
    return (p, v) if found else None


def _moe_sort(torch, ids, experts, check, tail=""):
    """(MoESort, the sorted ids) of ids [T, k] (int32 or int64, contiguous),
    already checked for shape and dtype."""
    flat = ids.reshape(-1)
    if check == _ASYNC and flat.numel() > 0:
        torch._assert_async(((flat >= 0) & (flat < experts)).all(),
                            f"gatedmlp: 'topk_ids' holds an expert id outside [0, E={experts})")
    elif check and flat.numel() > 0:
        _refuse_check_while_capturing(flat, "indices")
        bad = _first_bad_id(torch, flat, experts)
        if bad is not None:
            raise IndexError(f"gatedmlp: 'topk_ids' holds {bad[1]} at position {bad[0]}, outside [0, E={experts})"
                             + tail)
    sorted_ids, order = torch.sort(flat, stable=True)
    # offsets[e] = the number of ids <= e: no count kernel that reads its
    # size back (bincount does), so none of this synchronises.
    bounds = torch.arange(experts, device=flat.device, dtype=sorted_ids.dtype)
    offsets = torch.searchsorted(sorted_ids, bounds, right=True, out_int32=True)
    inverse = torch.empty_like(order)
    inverse.scatter_(0, order, torch.arange(order.numel(), device=order.device, dtype=order.dtype))
    return MoESort(order, offsets, inverse), sorted_ids


def moe_sort(topk_ids, num_experts, *, check_indices=True):
    """Sorts a Mixture-of-Experts routing by expert, for the grouped calls
    (grouped_gate_up, torch._grouped_mm).

    topk_ids:    [T, k] expert ids, a PyTorch tensor (CPU or CUDA) of an
                 integer dtype (int32 and int64 are used as they are, others
                 converted to int64), each in [0, num_experts).
    num_experts: E, the number of experts (>= 1).
    check_indices: first check every id (one small read back: a
                 synchronisation with the current stream) and raise
                 IndexError naming 'topk_ids', the flat position t*k + j and
                 the value of the first outside [0, E). Refused while the
                 current stream is being captured into a CUDA graph. False:
                 no check, no sync; offsets[e] is then the number of ids
                 <= e (a negative id counts with expert 0, an id >= E falls
                 past offsets[E-1], which grouped_gate_up refuses).

    Returns MoESort(order, offsets, inverse): order, int64 [T*k], the flat
    positions in expert order (stable: ties in position order; sorted row i
    comes from token order[i] // k); offsets, int32 [E], cumulative row ends
    (torch._grouped_mm's offs); inverse, int64 [T*k], inverse[order[i]] = i.
    Nothing else synchronises (no bincount, whose CUDA kernel reads its size
    back), so with check_indices=False it can be captured into a graph.
    """
    torch = _sys.modules.get("torch")
    if torch is None or not isinstance(topk_ids, torch.Tensor):
        raise TypeError(f"gatedmlp: moe_sort takes a PyTorch tensor 'topk_ids', got "
                        f"{type(topk_ids).__module__}.{type(topk_ids).__qualname__}")
    ks = _shape(topk_ids)
    if len(ks) != 2:
        raise _invalid(f"'topk_ids' must be [T, k] (2-D), got shape {ks}")
    if not _integer_dtype(topk_ids):
        raise _invalid(f"'topk_ids' must hold integer expert ids (int32 or int64), got {_dtype_name(topk_ids)}")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int):
        try:
            num_experts = num_experts.__index__()
        except AttributeError:
            raise TypeError(f"gatedmlp: 'num_experts' must be an int, got {type(num_experts).__name__}") from None
    if not 1 <= num_experts < 2**31:
        raise _invalid(f"'num_experts' must be in [1, 2**31), got {num_experts}")
    if ks[0] * ks[1] >= 2**31:
        raise _invalid(f"'topk_ids' {ks} holds {ks[0] * ks[1]} ids; the int32 offsets hold fewer than 2**31")
    return _moe_sort(torch, _ids(topk_ids), num_experts, check_indices)[0]


# ---------------------------------------------------------------- a whole MoE layer's experts
_ROUTING_DTYPES = ("float32", "bfloat16", "float16")


def _dtype_name(t) -> str:
    """'bfloat16', 'float32', ... for a torch, NumPy, CuPy or JAX tensor."""
    d = getattr(t, "dtype", None)
    name = getattr(d, "name", None)
    return name if isinstance(name, str) else str(d).replace("torch.", "")


def _stream_scope(x, stream):
    """(context, stream to pass on) for a call of several launches and
    framework ops on `stream`: for torch and CuPy the context makes it the
    framework's current stream (its allocations and its own ops then go to
    it, and the gatedmlp calls inside pick it up: None); for others the
    stream is passed on as it is."""
    import contextlib

    if stream is None:
        return contextlib.nullcontext(), None
    fw = _framework(x)
    if fw == "torch":
        torch = _sys.modules["torch"]
        if not isinstance(stream, torch.cuda.Stream):
            stream = torch.cuda.ExternalStream(_stream_handle(stream), device=x.device)
        return torch.cuda.stream(stream), None
    if fw == "cupy":
        cupy = _sys.modules["cupy"]
        if not isinstance(stream, cupy.cuda.Stream):
            stream = cupy.cuda.ExternalStream(_stream_handle(stream))
        return stream, None
    return contextlib.nullcontext(), stream


def _alloc_float32(like, shape):
    fw = _framework(like)
    if fw == "torch":
        return like.new_empty(shape, dtype=_sys.modules["torch"].float32)
    if fw == "cupy":
        cupy = _sys.modules["cupy"]
        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype=cupy.float32)
    if fw == "numpy":
        return _sys.modules["numpy"].empty(shape, dtype=_sys.modules["numpy"].float32)
    raise TypeError(f"gatedmlp: moe_mlp cannot allocate its float32 [T, k, H] scratch for a "
                    f"{type(like).__module__}.{type(like).__qualname__} input; pass PyTorch or CuPy tensors")


def _sum_topk(y, x, out):
    """y [T, k, H] float32 summed over k, in x's dtype (into out if given)."""
    if _framework(y) == "torch":
        s = y.sum(dim=1)
        if out is None:
            return s.to(x.dtype)
        out.copy_(s)
        return out
    s = _xp(y).sum(y, axis=1)
    if out is None:
        return s.astype(x.dtype)
    out[...] = s
    return out


def _zeros_into(x, shape, out):
    if out is None:
        out = _alloc(x, shape, "out")
    if _framework(out) == "torch":
        out.zero_()
    else:
        out[...] = 0
    return out


# The grouped (prefill) path of moe_mlp: from this many rows (T * k) per
# expert on, on average; GATEDMLP_MOE_GROUPED=0 / 1 overrides the choice.
_GROUPED_MIN_ROWS_PER_EXPERT = 32
# torch._grouped_mm sets its groups up with one thread block of E threads.
_GROUPED_MM_MAX_EXPERTS = 1024
# Per CUDA device index: is it sm_90?
_SM90 = {}


def _is_sm90(torch, device) -> bool:
    index = device.index if device.index is not None else torch.cuda.current_device()
    hopper = _SM90.get(index)
    if hopper is None:
        hopper = _SM90[index] = tuple(torch.cuda.get_device_capability(index)) == (9, 0)
    return hopper


def _use_grouped(x, w13, w2, rows, experts, hidden, inter) -> bool:
    """Whether moe_mlp takes the grouped path (see there)."""
    force = _os.environ.get("GATEDMLP_MOE_GROUPED", "").strip()
    if force == "0" or (force != "1" and rows < _GROUPED_MIN_ROWS_PER_EXPERT * experts):
        return False  # decode sizes leave here, before any tensor is looked at
    torch = _sys.modules.get("torch")
    if torch is None or not hasattr(torch, "_grouped_mm"):
        return False
    if not (isinstance(x, torch.Tensor) and isinstance(w13, torch.Tensor) and isinstance(w2, torch.Tensor)):
        return False
    if not x.is_cuda or x.dtype != torch.bfloat16 or not _is_sm90(torch, x.device):
        return False
    # torch._grouped_mm's operands: h [R, I] row-major, w2 read as [E, I, H]
    # with I contiguous, every row and expert 16-byte aligned.
    if hidden % 8 or inter % 8 or experts > _GROUPED_MM_MAX_EXPERTS:
        return False
    if w2.stride(2) != 1 or w2.stride(1) % 8 or w2.stride(0) % 8 or w2.data_ptr() % 16:
        return False
    return True


def _moe_grouped(x, ids, topk_weights, w13, w2, b13, b2, activation, act_params, group, first, out, workspace,
                 check_indices):
    """moe_mlp's grouped path (PyTorch tensors; on the current stream)."""
    torch = _sys.modules["torch"]
    t, k = _shape(ids)
    experts, hidden = _shape(w2)[:2]
    s, sorted_ids = _moe_sort(torch, ids, experts, check_indices, "; nothing was written")
    xs = x.index_select(0, s.order // k if k > 1 else s.order)
    h = grouped_gate_up(xs, s.offsets, w13, bias=b13, activation=activation, act_params=act_params, group=group,
                        first=first, workspace=workspace, check_offsets=False)  # offsets good by construction
    y = torch._grouped_mm(h, w2.transpose(-2, -1), offs=s.offsets)  # [T*k, H] in expert order, x's dtype
    if b2 is not None:
        if check_indices is not True:  # an unchecked bad id must not index out of b2
            sorted_ids = sorted_ids.clamp(0, experts - 1)
        y += b2.index_select(0, sorted_ids)
    # Back to token order, then each token's k rows weighted and summed as
    # one batched [1, k] x [k, H] product (fp32 sums, one rounding), the
    # routing weights in x's dtype as transformers' blocks apply them. (In
    # float32 [T*k, H] passes, this tail took twice the two GEMMs' time at
    # Qwen3-30B-A3B T = 8192.)
    yt = y.index_select(0, s.inverse).view(t, k, hidden)
    wts = topk_weights.reshape(t, 1, k).to(x.dtype)
    if out is not None and out.dtype == x.dtype and out.is_contiguous():
        torch.bmm(wts, yt, out=out.view(t, 1, hidden))
        return out
    res = torch.bmm(wts, yt).view(t, hidden)
    if out is None:
        return res
    out.copy_(res)
    return out


def moe_mlp(x, topk_ids, topk_weights, w13, w2, b13=None, b2=None, *, activation=Activation.silu,
            act_params=None, group=0, first=Half.gate, out=None, stream=None, workspace=None, check_indices=True):
    """The experts of a Mixture-of-Experts layer: every token through its
    top-k experts' gated MLPs, weighted by its routing weights and summed.

        y[t] = sum_j topk_weights[t, j] * (act(g) * u @ W2[e]^T + b2[e]),  e = topk_ids[t, j]
        g, u = the gate and up halves of x[t] @ W13[e]^T + b13[e]

    Two paths compute it; both round h to x's dtype and sum the top-k in
    float32, rounding the result once to x's dtype.

    Gathered (decode, and whatever the grouped path does not take): three
    launches. h = gather_gate_up(x, topk_ids, w13, bias=b13) [T, k, I] in
    x's dtype; gather_down(h, topk_ids, w2, b2, row_scale=topk_weights)
    into float32 [T, k, H], the routing weight applied in its epilogue
    after the bias; then the sum over k (a framework op). With k = 1 the
    down projection writes the result directly.

    Grouped (prefill): taken when x is a bfloat16 CUDA PyTorch tensor on an
    sm_90 (Hopper) device and T * k / E >= _GROUPED_MIN_ROWS_PER_EXPERT
    (32), with H and I multiples of 8, w2's rows of I contiguous and
    16-byte aligned and E <= 1024 (what torch._grouped_mm takes). s =
    moe_sort(topk_ids, E); the x rows in expert order (x[s.order // k]);
    h = grouped_gate_up(those rows, s.offsets, w13, bias=b13) [T*k, I];
    the down projection on torch._grouped_mm(h, w2^T, offs=s.offsets)
    (bf16, rounded once there), plus b2 of each row's expert; unsorted
    with s.inverse, and each token's k rows weighted by its routing weights
    (in x's dtype, as transformers' blocks apply them) and summed in one
    batched product (fp32 sums, rounded once). Within bf16 rounding of the
    gathered path. The environment
    variable GATEDMLP_MOE_GROUPED=0 forces the gathered path, =1 the
    grouped one wherever the conditions other than T * k / E hold (tests,
    timing).

    Routing stays with the model: the router, its top-k and the softmax
    (or whatever normalisation the model uses) make topk_ids and
    topk_weights; this computes what transformers' experts modules
    (Qwen3MoeExperts, MixtralExperts, GptOssExperts) compute from them.

    x:            [T, H], bfloat16 or float16, rows contiguous.
    topk_ids:     [T, k] expert ids, int32 or int64 (other integer dtypes
                  are converted), each in [0, E). An id outside it (such
                  as the "masking index" E that transformers' eager
                  forwards skip) is refused: IndexError, nothing written
                  (the gathered path finds it in its first launch, the
                  grouped one before any, with one small read back).
                  check_indices=False: unchecked, no read back (CUDA
                  graphs); a bad id then leaves the result undefined.
                  check_indices="async" (PyTorch): checked on the device
                  without a read back, by a device-side assertion (the
                  gathered kernel's own, Arguments.index_trap; the grouped
                  path's torch._assert_async on the ids before its sort):
                  a bad id fails the stream as an out-of-range index in a
                  PyTorch kernel does, reported at the next
                  synchronisation. What
                  gatedmlp.torch.MoEExperts uses: no synchronisation per
                  layer, and never a silently wrong result.
    topk_weights: [T, k] routing weights, float32, bfloat16 or float16.
    w13:          [E, 2I, H] the experts' fused gate/up weights, in any
                  fused layout: rows interleaved in blocks of `group` rows
                  (0: I, the stacked [gate; up] of Qwen3-MoE and Mixtral;
                  1: gpt-oss's even/odd), `first` half first; x's dtype.
    w2:           [E, H, I] the experts' down weights (out_in), x's dtype.
    b13, b2:      optional biases [E, 2I] (w13's row order) and [E, H].
    activation, act_params: the GLU ("silu", "gelu_tanh", "gelu_erf",
                  "relu", "swiglu_clamped" with ActivationParams'
                  clamp_alpha / clamp_limit).
    out:          [T, H] (any dtype the framework copies into); allocated
                  in x's dtype when None.
    stream:       None: the current stream of x's framework; otherwise
                  every launch, allocation and the sum run on it.
    workspace:    as for gather_gate_up (the gate/up launch's scratch).
    check_indices: see topk_ids; the ids are checked once.

    Shapes and dtypes are checked, naming these arguments, before anything
    is allocated or launched. Torch and CuPy tensors (the float32 scratch
    and the sum are theirs; the grouped path is PyTorch's). Returns out.
    """
    torch = _sys.modules.get("torch")
    key = None
    if torch is not None and stream is None and type(x) is torch.Tensor:
        # A repeated call (every decode step of every layer) skips the
        # checks below: they read only what this key holds.
        try:
            key = (x.shape, x.dtype, x.device, topk_ids.shape, topk_ids.dtype, topk_weights.shape,
                   topk_weights.dtype, w13.shape, w13.dtype, w2.shape, w2.dtype, w2.stride(),
                   None if b13 is None else (b13.shape, b13.dtype), None if b2 is None else (b2.shape, b2.dtype),
                   None if out is None else (out.shape, out.dtype), activation, first, group)
            plan = _MOE_PLANS.get(key)
        except (AttributeError, TypeError):  # not tensors, or an unhashable option: checked every time
            plan, key = None, None
        if plan is not None:
            return _moe_torch(torch, plan, x, topk_ids, topk_weights, w13, w2, b13, b2, act_params, out, workspace,
                              check_indices)
    activation = activation if type(activation) is Activation else _enum(Activation, activation, "activation")
    first = first if type(first) is Half else _enum(Half, first, "first")
    _check_no_grad((x, topk_weights, w13, w2, b13, b2, out))
    xs, ks, ws = _shape(x), _shape(topk_ids), _shape(topk_weights)
    if len(xs) != 2:
        raise _invalid(f"'x' must be [T, H] (2-D), got shape {xs}")
    t, hidden = xs
    if _dtype_name(x) not in ("bfloat16", "float16"):
        raise _invalid(f"'x' must be bfloat16 or float16, got {_dtype_name(x)}")
    if len(ks) != 2 or ks[0] != t:
        raise _invalid(f"'topk_ids' must be [T, k] with T = {t} (x.shape[0]), got shape {ks}")
    k = ks[1]
    if not _integer_dtype(topk_ids):
        raise _invalid(f"'topk_ids' must hold integer expert ids (int32 or int64), got {_dtype_name(topk_ids)}")
    if ws != ks:
        raise _invalid(f"'topk_weights' must be [T, k] = {ks}, the shape of 'topk_ids', got shape {ws}")
    if _dtype_name(topk_weights) not in _ROUTING_DTYPES:
        raise _invalid(f"'topk_weights' must be float32, bfloat16 or float16, got {_dtype_name(topk_weights)}")
    experts, rows, wk = _expert_weights(w13, "[E, 2I, H]", "w13")
    if rows % 2 or wk != hidden:
        raise _invalid(f"'w13' must be [E, 2I, H] (gate and up rows) with H = {hidden} (x.shape[1]), got shape "
                       f"{_shape(w13)}")
    inter = rows // 2
    if _expert_weights(w2, "[E, H, I]", "w2") != (experts, hidden, inter):
        raise _invalid(f"'w2' must be [E, H, I] = {(experts, hidden, inter)} (E and I from 'w13', H = x.shape[1]), "
                       f"got shape {_shape(w2)}")
    for name, w in (("w13", w13), ("w2", w2)):
        if _dtype_name(w) != _dtype_name(x):
            raise _invalid(f"'{name}' has dtype {_dtype_name(w)} but 'x' has {_dtype_name(x)}; the weights must "
                           "be in the activations' dtype")
    for name, b, want in (("b13", b13, (experts, rows)), ("b2", b2, (experts, hidden))):
        if b is not None and _shape(b) != want:
            raise _invalid(f"'{name}' must be [E, {'2I' if name == 'b13' else 'H'}] = {want}, got shape {_shape(b)}")
    if out is not None and _shape(out) != (t, hidden):
        raise _invalid(f"'out' must be [T, H] = {(t, hidden)}, got shape {_shape(out)}")

    if key is not None and t * k > 0 and all(v is None or isinstance(v, torch.Tensor)
                                             for v in (topk_ids, topk_weights, w13, w2, b13, b2, out)):
        # The gate/up launch's keywords that differ from the binding's defaults.
        kw = {n: v for n, v, d in (("activation", activation, Activation.silu), ("group", group, 0),
                                   ("first", first, Half.gate)) if v != d}
        plan = _MoEPlan(t, k, hidden, inter, experts, activation, first, group, kw)
        if len(_MOE_PLANS) >= _MAX_MOE_PLANS:
            _MOE_PLANS.clear()
        _MOE_PLANS[key] = plan
        return _moe_torch(torch, plan, x, topk_ids, topk_weights, w13, w2, b13, b2, act_params, out, workspace,
                          check_indices)
    scope, stream = _stream_scope(x, stream)
    with scope:
        if t * k == 0:
            return _zeros_into(x, (t, hidden), out)
        ids = _ids(topk_ids)
        if _use_grouped(x, w13, w2, t * k, experts, hidden, inter):
            return _moe_grouped(x, ids, topk_weights, w13, w2, b13, b2, activation, act_params, group, first, out,
                                workspace, check_indices)
        h = gather_gate_up(x, ids, w13, bias=b13, activation=activation, act_params=act_params, group=group,
                           first=first, stream=stream, workspace=workspace, check_indices=check_indices)
        if k == 1:  # nothing to sum: the kernel's one rounding is the result's
            if out is None:
                out = _alloc(x, (t, hidden), "out")
            gather_down(h, ids, w2, b2, out=out, row_scale=topk_weights, stream=stream, workspace=workspace,
                        check_indices=False)
            return out
        y = _alloc_float32(x, (t, k, hidden))
        gather_down(h, ids, w2, b2, out=y, row_scale=topk_weights, stream=stream, workspace=workspace,
                    check_indices=False)
        return _sum_topk(y, x, out)


# moe_mlp's reading of a call by its checks, kept per signature (moe_mlp's
# key): PyTorch tensors on the current stream, at least one row.
_MoEPlan = _NamedTuple("_MoEPlan", [("t", int), ("k", int), ("hidden", int), ("inter", int), ("experts", int),
                                    ("activation", Activation), ("first", Half), ("group", int), ("kw", dict)])
_MOE_PLANS = {}
_MAX_MOE_PLANS = 256  # a model has a few signatures per layer kind; past this the cache starts over


def _moe_torch(torch, plan, x, topk_ids, topk_weights, w13, w2, b13, b2, act_params, out, workspace, check):
    """moe_mlp for PyTorch tensors whose signature passed its checks: the
    grouped path where it takes the call, else the gathered launches
    (gather_gate_up's and gather_down's, without their checks). Kept short:
    at decode sizes every line is host time in every MoE layer of every
    step."""
    if torch.is_grad_enabled() and any(v is not None and v.requires_grad
                                       for v in (x, topk_weights, w13, w2, b13, b2, out)):
        raise RuntimeError(_NO_BACKWARD)
    t, k, hidden, inter, experts = plan.t, plan.k, plan.hidden, plan.inter, plan.experts
    ids = _ids(topk_ids)
    m = t * k
    if _use_grouped(x, w13, w2, m, experts, hidden, inter):
        return _moe_grouped(x, ids, topk_weights, w13, w2, b13, b2, plan.activation, act_params, plan.group,
                            plan.first, out, workspace, check)
    handle, alloc = _torch_stream_and_alloc(torch, x, None, workspace)
    to = torch.utils.dlpack.to_dlpack
    # Keywords only where they differ from the binding's defaults (each one
    # is parsed on every call).
    kw = {} if workspace is None else {"workspace": _export(workspace)}
    kw_up = {**plan.kw, **kw}
    if act_params is not None:
        kw_up["act_params"] = act_params
    h = x.new_empty(m, inter)
    if check == _ASYNC:  # the kernel's own device-side assertion: no read back, no launch of its own
        kw_up["index_trap"] = True
    elif check:
        err = x.new_empty(2, dtype=torch.int64)
        kw_up["index_error"] = to(err)
    _C.gate_up(to(x), to(w13), to(h), None, None if b13 is None else to(b13), stream=handle, workspace_alloc=alloc,
               indices=to(ids), rows_per_x=k, **kw_up)
    if check and check != _ASYNC:
        _check_index_error(err, handle, "topk_ids", experts)
    # k = 1: nothing to sum, the kernel's one rounding is the result's.
    y = (x.new_empty(t, hidden) if out is None else out) if k == 1 else \
        x.new_empty(m, hidden, dtype=torch.float32)
    _C.down(to(h), to(w2), to(y), None, None if b2 is None else to(b2), stream=handle, workspace_alloc=alloc,
            indices=to(ids), row_scale=to(topk_weights.contiguous()), **kw)
    if k == 1:
        return y
    return _sum_topk(y.view(t, k, hidden), x, out)
