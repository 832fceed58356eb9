"""Quantized weights on the host: MLX's affine format.

``quantize(w)`` gives what ``mlx.core.quantize(w)`` gives on MLX's CPU backend,
bit for bit: ``wq`` (uint32 words, ``32 / bits`` values each, the first of K in
the lowest bits), ``scales`` and ``biases`` (``[..., K / group_size]``, w's
dtype), with ``w ~= q * scale + bias`` per group of ``group_size`` along the
last axis. NumPy arrays give NumPy arrays; PyTorch tensors give tensors on
w's device (the work is done on a host copy).
"""

from __future__ import annotations

import sys as _sys

from . import _gatedmlp as _C

_MODES = {"affine": _C.QuantMode.affine}
_NOT_YET = ("mxfp4", "mxfp8", "nvfp4")  # MLX's other modes: not in gatedmlp yet


def _format(group_size, bits, mode) -> "_C.QuantFormat":
    if mode in _NOT_YET:
        raise _C.NotSupportedError(f"gatedmlp: quantization mode {mode!r} is not supported yet (affine is)")
    if mode not in _MODES:
        raise _C.InvalidArgumentError(f"gatedmlp: mode {mode!r} is not a quantization mode ('affine')")
    return _C.QuantFormat(mode=_MODES[mode], bits=int(bits), group_size=int(group_size))


def _words(fmt, k):
    return k * fmt.bits // 32


def _groups(fmt, k):
    return k // fmt.group_size


def quantize(w, group_size: int = 64, bits: int = 4, mode: str = "affine"):
    """(wq, scales, biases) of w [..., K] (bf16, fp16 or fp32; K a multiple of
    group_size; bits 4 or 8; group_size 32, 64 or 128)."""
    fmt = _format(group_size, bits, mode)
    if type(w).__module__.split(".", 1)[0] == "torch":
        torch = _sys.modules["torch"]
        host = w.detach().to("cpu").contiguous()
        if host.dim() < 1:
            raise _C.InvalidArgumentError("gatedmlp: 'w' must have at least one axis, got a scalar")
        _C.check_quant_format(fmt, host.shape[-1]).raise_if_error()
        lead, k = tuple(host.shape[:-1]), host.shape[-1]
        wq = torch.empty(*lead, _words(fmt, k), dtype=torch.uint32)
        scales = torch.empty(*lead, _groups(fmt, k), dtype=host.dtype)
        biases = torch.empty_like(scales)
        _C.quantize_into(host, wq, scales, biases, fmt)
        return wq.to(w.device), scales.to(w.device), biases.to(w.device)
    import numpy as np

    host = np.ascontiguousarray(w)
    if host.ndim < 1:
        raise _C.InvalidArgumentError("gatedmlp: 'w' must have at least one axis, got a scalar")
    _C.check_quant_format(fmt, host.shape[-1]).raise_if_error()
    lead, k = host.shape[:-1], host.shape[-1]
    wq = np.empty((*lead, _words(fmt, k)), dtype=np.uint32)
    scales = np.empty((*lead, _groups(fmt, k)), dtype=host.dtype)
    biases = np.empty_like(scales)
    _C.quantize_into(host, wq, scales, biases, fmt)
    return wq, scales, biases


def dequantize(wq, scales, biases, group_size: int = 64, bits: int = 4, mode: str = "affine", dtype=None):
    """w [..., K] = q * scale + bias (computed in fp32, rounded once to dtype;
    default: the scales' dtype)."""
    fmt = _format(group_size, bits, mode)
    if type(wq).__module__.split(".", 1)[0] == "torch":
        torch = _sys.modules["torch"]
        hq, hs, hb = (t.detach().to("cpu").contiguous() for t in (wq, scales, biases))
        if hq.dim() < 1:
            raise _C.InvalidArgumentError("gatedmlp: 'wq' must have at least one axis, got a scalar")
        k = hq.shape[-1] * 32 // fmt.bits
        w = torch.empty(*hq.shape[:-1], k, dtype=dtype or hs.dtype)
        _C.dequantize_into(hq, hs, hb, w, fmt)
        return w.to(wq.device)
    import numpy as np

    hq, hs, hb = (np.ascontiguousarray(t) for t in (wq, scales, biases))
    if hq.ndim < 1:
        raise _C.InvalidArgumentError("gatedmlp: 'wq' must have at least one axis, got a scalar")
    k = hq.shape[-1] * 32 // fmt.bits
    w = np.empty((*hq.shape[:-1], k), dtype=dtype or hs.dtype)
    _C.dequantize_into(hq, hs, hb, w, fmt)
    return w
