"""gatedmlp: fused gated-MLP (GEMM + GLU) kernels.

    y = act(alpha * x @ Wg^T + bg) * (alpha * x @ Wu^T + bu)        # [M, U]

in one launch, writing only y, and the down projection after it,

    y = alpha * h @ Wd^T + bd,   h = x or act(gate) * up              # [M, hidden]

This package binds the C++ API one to one (``Problem``, ``check_support``,
``plan``, ``run``, ``convert_weights``, the enums) and adds :func:`gate_up`,
:func:`down` and :func:`mlp` (both halves), which take tensors of any
framework that speaks DLPack or ``__cuda_array_interface__`` (PyTorch, JAX,
CuPy, ...) without copying them. ``gatedmlp.torch`` has the PyTorch
operators and the ``GatedMLP`` module.

Errors are the library's own messages, raised as ``gatedmlp.Error``
subclasses: ``InvalidArgumentError`` (a ``ValueError``), ``NotSupportedError``
(a ``NotImplementedError``), ``NoDeviceError``, ``CudaError`` and
``LibraryError`` (``RuntimeError``\\ s).
"""

from __future__ import annotations

import sys as _sys

from . import _gatedmlp as _C
from ._gatedmlp import (
    Activation,
    ActivationParams,
    Arguments,
    Config,
    CudaError,
    DType,
    Error,
    Half,
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
    __version__,
    check_support,
    dtype_size,
    fused_row,
    fused_row_inverse,
    kAuto,
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
    "QuantFormat", "QuantMode", "quantize", "dequantize", "quantized_down", "quantized_gate_up", "quantized_mlp",
]

from .quant import dequantize, quantize, quantized_down, quantized_gate_up, quantized_mlp  # noqa: E402

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
                 storage=WeightStorage.out_in, alpha=1.0) -> Problem:
    """The Problem that gate_up() would run for these tensors."""
    return _make_problem(
        _export(x), _export(w), _export(out), _export(w_up), _export(bias), _export(bias_up), _export(preact),
        activation=_enum(Activation, activation, "activation"), act_params=act_params, group=group,
        first=_enum(Half, first, "first"), storage=_enum(WeightStorage, storage, "storage"), alpha=alpha)


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


def _gate_up_torch(torch, x, w, w_up, bias, bias_up, out, preact, activation, act_params, group, first, storage,
                   alpha, stream, workspace):
    # gate_up for PyTorch tensors, kept short: every line here is host time
    # on each call (the library checks the shapes; this only sizes `out`).
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (x, w, w_up, bias, bias_up, out, preact)):
        raise RuntimeError(_NO_BACKWARD)
    if out is None:
        rows = w.shape[-1] if storage == WeightStorage.in_out else w.shape[-2]
        out = x.new_empty((*x.shape[:-1], rows if w_up is not None else rows // 2))
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
                      storage=WeightStorage.out_in, alpha=1.0) -> Problem:
    """The Problem that down() would run for these tensors (op = down,
    glu_input when `up` is given)."""
    return _make_down_problem(
        _export(h), _export(w), _export(out), _export(up), _export(bias),
        activation=_enum(Activation, activation, "activation"), act_params=act_params,
        storage=_enum(WeightStorage, storage, "storage"), alpha=alpha)


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
        out = h.new_empty((*h.shape[:-1], w.shape[-1] if storage == WeightStorage.in_out else w.shape[-2]))
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
