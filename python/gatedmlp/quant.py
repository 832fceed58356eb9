"""Quantized weights on the host: MLX's affine format and MXFP4.

``quantize(w)`` gives what ``mlx.core.quantize(w)`` gives on MLX's CPU backend,
bit for bit. Affine (the default): ``(wq, scales, biases)``; ``wq`` holds
uint32 words of ``32 / bits`` values, the first of K in the lowest bits;
``scales`` and ``biases`` are ``[..., K / group_size]`` in w's dtype, and
``w ~= q * scale + bias`` per group along the last axis. ``mode="mxfp4"``:
``(wq, scales)``, e2m1 values packed the same way (the bytes of gpt-oss's
``*_blocks``) and one e8m0 byte per 32 values (gpt-oss's ``*_scales``).
NumPy arrays give NumPy arrays; PyTorch tensors give tensors on w's device
(the work is done on a host copy). ``quantized_gate_up``, ``quantized_down``
and ``quantized_mlp`` run the kernels on those arrays.
"""

from __future__ import annotations

import sys as _sys

from . import _gatedmlp as _C

# mode -> (QuantMode, default group_size, default bits, default row_block): MLX's defaults, and
# DeepSeek-V3's 128 x 128 blocks for FP8.
_MODES = {"affine": (_C.QuantMode.affine, 64, 4, 1), "mxfp4": (_C.QuantMode.mxfp4, 32, 4, 1),
          "fp8_e4m3": (_C.QuantMode.fp8_e4m3, 128, 8, 128)}
_NOT_YET = ("mxfp8", "nvfp4")  # MLX's other modes: not in gatedmlp yet


def _format(group_size, bits, mode, row_block=None, repacked=False, tiled=False) -> "_C.QuantFormat":
    if mode in _NOT_YET:
        raise _C.NotSupportedError(
            f"gatedmlp: quantization mode {mode!r} is not supported yet (affine, mxfp4, fp8_e4m3 are)")
    if mode not in _MODES:
        raise _C.InvalidArgumentError(
            f"gatedmlp: mode {mode!r} is not a quantization mode ('affine', 'mxfp4', 'fp8_e4m3')")
    qm, g, b, rb = _MODES[mode]
    return _C.QuantFormat(mode=qm, bits=int(b if bits is None else bits),
                          group_size=int(g if group_size is None else group_size),
                          row_block=int(rb if row_block is None else row_block), repacked=bool(repacked),
                          tiled=bool(tiled))


# (group_size, bits, mode, row_block, repacked, tiled) -> its QuantFormat, built once.
_FORMATS = {}


def _format_cached(group_size, bits, mode, row_block, repacked, tiled=False) -> "_C.QuantFormat":
    key = (group_size, bits, mode, row_block, repacked, tiled)
    fmt = _FORMATS.get(key)
    if fmt is None:
        fmt = _FORMATS[key] = _format(group_size, bits, mode, row_block, repacked, tiled)
    return fmt


def _is_torch(t) -> bool:
    return type(t).__module__.split(".", 1)[0] == "torch"


def quantize(w, group_size: int | None = None, bits: int | None = None, mode: str = "affine", *,
             repacked: bool = False):
    """(wq, scales, biases) (affine) or (wq, scales) (mxfp4) of w [..., K]
    (bf16, fp16 or fp32). Affine: bits 4 or 8, group_size 32, 64 or 128
    (default 64, 4); mxfp4: 32 and 4. K must be a multiple of group_size.
    repacked=True (affine 4-bit): wq in the kernels' order (see repack)."""
    fmt = _format(group_size, bits, mode, None, repacked)
    mx = fmt.mode == _C.QuantMode.mxfp4
    if _is_torch(w):
        torch = _sys.modules["torch"]
        host = w.detach().to("cpu").contiguous()
        empty, u32, u8, dt = torch.empty, torch.uint32, torch.uint8, host.dtype
    else:
        import numpy as np

        host = np.ascontiguousarray(w)
        empty = lambda *shape, dtype: np.empty(shape, dtype=dtype)  # noqa: E731
        u32, u8, dt = np.uint32, np.uint8, host.dtype
    if host.ndim < 1:
        raise _C.InvalidArgumentError("gatedmlp: 'w' must have at least one axis, got a scalar")
    lead, k = tuple(host.shape[:-1]), host.shape[-1]
    _C.check_quant_format(fmt, k).raise_if_error()
    wq = empty(*lead, _C.quant_words_per_row(fmt, k), dtype=u32)
    scales = empty(*lead, _C.quant_groups_per_row(fmt, k), dtype=u8 if mx else dt)
    biases = None if mx else empty(*lead, _C.quant_groups_per_row(fmt, k), dtype=dt)
    _C.quantize_into(host, wq, scales, biases, fmt)
    out = (wq, scales) if mx else (wq, scales, biases)
    return tuple(t.to(w.device) for t in out) if _is_torch(w) else out


def dequantize(wq, scales, biases=None, group_size: int | None = None, bits: int | None = None,
               mode: str = "affine", dtype=None, *, repacked: bool = False, tiled: bool = False):
    """w [..., K] from quantize()'s arrays: q * scale + bias (affine) or
    value * 2^(scale - 127) (mxfp4), computed in fp32 (one fused multiply-add) and rounded to
    dtype (default: the scales' dtype for affine, bfloat16 for mxfp4, as
    MLX). repacked=True: wq in the kernels' order (see repack). tiled=True:
    tile()'s words and (scale, bias) pairs (biases None), rows in its order,
    K the padded one."""
    fmt = _format(group_size, bits, mode, None, repacked, tiled)
    mx = fmt.mode == _C.QuantMode.mxfp4
    parts = (wq, scales) if biases is None else (wq, scales, biases)
    if _is_torch(wq):
        torch = _sys.modules["torch"]
        host = [t.detach().to("cpu").contiguous() for t in parts]
        default = torch.bfloat16 if mx else host[1].dtype
        make = lambda shape: torch.empty(*shape, dtype=dtype or default)  # noqa: E731
    else:
        import numpy as np

        host = [np.ascontiguousarray(t) for t in parts]
        if mx and dtype is None:
            raise _C.InvalidArgumentError("gatedmlp: NumPy has no bfloat16: give dtype= for mxfp4 (np.float32, ...)")
        make = lambda shape: np.empty(shape, dtype=dtype or host[1].dtype)  # noqa: E731
    if host[0].ndim < 1:
        raise _C.InvalidArgumentError("gatedmlp: 'wq' must have at least one axis, got a scalar")
    # K from the words, or (repacked, tiled: rows padded to 128) from the
    # groups (tiled: (scale, bias) pairs, two per group).
    k = (host[1].shape[-1] * fmt.group_size if fmt.repacked else host[1].shape[-1] // 2 * fmt.group_size if fmt.tiled
         else host[0].shape[-1] * 32 // fmt.bits)
    w = make((*host[0].shape[:-1], k))
    _C.dequantize_into(host[0], host[1], host[2] if len(host) > 2 else None, w, fmt)
    return w.to(wq.device) if _is_torch(wq) else w


def repack(wq, k: int | None = None, group_size: int | None = None, *, inverse: bool = False, stream=None):
    """The words of affine 4-bit weights in the kernels' streaming order (a
    one-time repack at load), or back to the checkpoint's (inverse=True).

    wq [..., K / 8] uint32 (MLX's words; inverse: [..., ceil(K / 128) * 16],
    and k is needed). The scales and biases stay as they are. Each row's K
    is cut into chunks of 128 (the last padded with zero words); inside a
    chunk, word 4 wd + t moves to 4 t + wd, and its nibbles are reordered so
    that nibble i holds element 2i and nibble i + 4 element 2i + 1. On this
    order the decode kernel applies the scales to its fp32 sums instead of
    to each weight (the weights enter exactly). Pass repacked=True to
    quantized_gate_up and quantized_down. Not yet faster than the
    checkpoint's order: 1.11-1.16x its time at M = 1, 0.98-1.02x at M = 16
    (H200; see the project's notes, h79).
    NumPy arrays are repacked on the host, PyTorch tensors where they are
    (CUDA: on `stream`, None: the current one). Returns a new array."""
    g = 64 if group_size is None else int(group_size)
    if k is None:
        if inverse:
            raise _C.InvalidArgumentError("gatedmlp: repack(inverse=True) needs k (a repacked row is padded to 128)")
        k = wq.shape[-1] * 8
    src = _format(g, 4, "affine", None, inverse)
    dst = _format(g, 4, "affine", None, not inverse)
    _C.check_quant_format(src, int(k)).raise_if_error()
    shape = (*wq.shape[:-1], _C.quant_words_per_row(dst, int(k)))
    if _is_torch(wq):
        out = wq.new_empty(shape)
        handle = 0
        if wq.is_cuda:
            from . import _stream_handle, current_stream

            handle = _stream_handle(stream if stream is not None else current_stream(wq))
        _C.repack_into(wq, out, src, dst, int(k), handle)
    else:
        import numpy as np

        out = np.empty(shape, dtype=np.uint32)
        _C.repack_into(np.ascontiguousarray(wq), out, src, dst, int(k))
    return out


def tile(wq, scales, biases=None, *, group_size: int | None = None, group: int = 0, first="gate",
         down: bool = False, inverse: bool = False, k: int | None = None):
    """Affine 4-bit gate/up weights in the tiled order (a one-time repack at
    load for the decode kernels), or back (inverse=True). down=True: a down
    projection's [..., H, I / 8] words (H a multiple of 16), its rows tiled
    as they are (group and first do not apply); pass the result to
    quantized_down(tiled=True).

    wq [..., 2U, K / 8] uint32 (or int32), scales and biases [..., 2U,
    K / group_size]: the checkpoint's arrays of a fused gate/up weight (any
    leading axes, e.g. MoE experts [E, 2U, ...]), rows interleaved in blocks
    of `group` (0: stacked, U) with the `first` half first (as gate_up takes
    them; stack separate gate and up weights first). Returns (wq, pairs) in
    the tiled order: the rows put in blocks of 8, gate first (row 16c + 8h + j
    is half h of column 8c + j), K padded with zeros to whole k-blocks of
    128, then cut into tiles of 16 rows x 128 of K, each 1 KB of words, tile
    (c, kb) at row block c, k-block kb; and one array of (scale, bias) pairs
    in the order (c, group, row % 8, row // 8 % 2). Shapes: [..., 2U,
    ceil(K / 128) * 16] and [..., 2U, 2 * ceil(K / 128) * 128 / group_size].
    Pass them as wq and scales (no biases) with tiled=True to
    quantized_gate_up / quantized_gather_gate_up. inverse=True takes tile()'s
    (wq, pairs) and k (the unpadded K) and gives the checkpoint's (wq,
    scales, biases) back, rows in the order `group` and `first` say. NumPy
    arrays or PyTorch tensors (on their device); U must be a multiple of 8.
    The decode kernels read the tiled order 1.12-1.23x faster than the
    checkpoint's at 1-16 rows (H200; the project's notes, h95)."""
    g = 64 if group_size is None else int(group_size)
    fmt = _format(g, 4, "affine", None, False, True)
    if wq.ndim < 2:
        raise _C.InvalidArgumentError(f"gatedmlp: tile: wq must be [..., 2U, words], got {tuple(wq.shape)}")
    lead, rows = tuple(wq.shape[:-2]), int(wq.shape[-2])
    if rows % 16:
        raise _C.InvalidArgumentError(f"gatedmlp: tile: wq has {rows} rows; the tiled order takes "
                                      + ("H rows, a multiple of 16 (down=True)" if down else
                                         "2U rows with U a multiple of 8"))
    u = rows // 2
    if inverse and k is None:
        raise _C.InvalidArgumentError("gatedmlp: tile(inverse=True) needs k (the tiled rows are padded to 128)")
    if (biases is None) != inverse:
        raise _C.InvalidArgumentError("gatedmlp: tile takes (wq, scales, biases), and with inverse=True tile()'s "
                                      "(wq, pairs)")
    k = int(k) if inverse else int(wq.shape[-1]) * 8
    _C.check_quant_format(fmt, k).raise_if_error()
    kb, gp, gk = (k + 127) // 128, (k + 127) // 128 * (128 // g), k // g
    gg = u if group == 0 else int(group)
    if u and not down and (gg <= 0 or u % gg):  # no rows (an empty weight): nothing to group
        raise _C.InvalidArgumentError(f"gatedmlp: tile: group={group} must divide U={u} (0: stacked)")
    up_first = first in ("up", 1) or getattr(first, "name", None) == "up"
    # The source row of tiled row 16c + 8h + j (column 8c + j, half h); a
    # down projection's rows stay where they are.
    col = [8 * (r // 16) + r % 8 for r in range(rows)]
    half = [(r // 8) % 2 for r in range(rows)]
    src = list(range(rows)) if down else [(2 * (j // gg) + (1 - h if up_first else h)) * gg + j % gg
                                          for j, h in zip(col, half)]
    nl = len(lead)
    dims = lambda d: tuple(range(nl)) + tuple(nl + i for i in d)  # noqa: E731
    torch = _sys.modules.get("torch")
    is_t = torch is not None and isinstance(wq, torch.Tensor)
    words_dtype = wq.dtype
    if is_t:
        wq = wq.view(torch.int32)  # CUDA indexes, pads and permutes no uint32 tensor
        perm = torch.tensor(src, dtype=torch.long, device=wq.device)
        pad = lambda t, n: torch.nn.functional.pad(t, (0, n - t.shape[-1]))  # noqa: E731
        order = lambda t, shape, d, n: t.reshape(*lead, *shape).permute(dims(d)).reshape(*lead, rows, n)  # noqa: E731
        pair = lambda s, b: torch.stack((s, b), -1).reshape(*lead, rows, 2 * gp)  # noqa: E731
    else:
        import numpy as np

        perm = np.asarray(src, dtype=np.int64)
        pad = lambda t, n: np.pad(t, ((0, 0),) * (t.ndim - 1) + ((0, n - t.shape[-1]),))  # noqa: E731
        order = lambda t, shape, d, n: np.ascontiguousarray(  # noqa: E731
            t.reshape(*lead, *shape).transpose(dims(d))).reshape(*lead, rows, n)
        pair = lambda s, b: np.stack((s, b), -1).reshape(*lead, rows, 2 * gp)  # noqa: E731
    # order(t, shape, dims, n): t's rows cut as `shape`, permuted, back to rows of n.
    if not inverse:
        w = order(pad(wq[..., perm, :], kb * 16), (rows // 16, 16, kb, 16), (0, 2, 1, 3), kb * 16)
        s, b = (order(pad(t[..., perm, :], gp), (rows // 16, 2, 8, gp), (0, 3, 2, 1), gp) for t in (scales, biases))
        # Both [..., rows, gp] in the order (c, group, row % 8, row // 8 % 2): interleaved into pairs.
        return (w.view(words_dtype) if is_t else w), pair(s, b)
    w = order(wq, (rows // 16, kb, 16, 16), (0, 2, 1, 3), kb * 16)[..., : k // 8]
    pairs = scales.reshape(*lead, rows, gp, 2)
    s, b = (order(pairs[..., i], (rows // 16, gp, 8, 2), (0, 3, 2, 1), gp)[..., :gk] for i in (0, 1))
    inv = torch.empty_like(perm) if is_t else np.empty_like(perm)
    inv[perm] = torch.arange(rows, device=wq.device) if is_t else np.arange(rows)
    out = tuple(t[..., inv, :] for t in (w, s, b))
    if is_t:
        return (out[0].contiguous().view(words_dtype), out[1].contiguous(), out[2].contiguous())
    return tuple(np.ascontiguousarray(t) for t in out)


def quantized_gate_up(x, wq, scales, biases=None, *, wq_up=None, scales_up=None, biases_up=None, bias=None,
                      bias_up=None, out=None, preact=None, group_size: int | None = None, bits: int | None = None,
                      mode: str = "affine", row_block: int | None = None, activation="silu", act_params=None,
                      group: int = 0, first="gate", alpha: float = 1.0, stream=None, repacked: bool = False,
                      tiled: bool = False):
    """gate_up with quantized weights: y = act(alpha * x @ Wg^T + bg) * (alpha * x @ Wu^T + bu),
    the weights dequantized on the fly from quantize()'s arrays.

    x [M, K] (bf16 or fp16); wq [2U, K * bits / 32] uint32 (or int32)
    words of the fused gate/up rows (interleaved in blocks of `group` rows,
    0: stacked, `first` half first) with scales / biases [2U, K / group_size];
    or, with wq_up, the gate rows in wq and the up rows in wq_up, [U, ...]
    each, with scales_up / biases_up. mxfp4 has no biases. Affine scales and
    biases may be bf16, fp16 or fp32. mode="fp8_e4m3": wq holds the bytes of
    float8_e4m3fn weights (the float8_e4m3fn tensor itself, its uint8
    view, or its int32 words ``w.view(torch.int32)``), scales are float
    [ceil(rows / row_block), ceil(K / group_size)] (row_block and group_size
    128: DeepSeek-V3's ``weight_scale_inv``; 1 and 0: per channel; 0 and 0:
    per tensor), no biases. Returns out [M, U] (x's dtype when allocated
    here). Up to 64 rows the weights are dequantized in registers as they
    stream (on an H100 / H200 up to 128 for fused weights with K a multiple
    of 256); past that, or where the rows of x are not 16-byte aligned, they
    are dequantized into scratch (allocated like x, kept for the stream) and
    the 16-bit kernel runs on them. repacked=True: affine 4-bit words from
    repack(). tiled=True: affine 4-bit words and (scale, bias) pairs from
    tile() as wq and scales, no biases (group 8, gate first; the fastest
    order up to 16 rows, dequantized past them).
    """
    g = _sys.modules[__package__]
    fmt = _format_cached(group_size, bits, mode, row_block, repacked, tiled)
    if tiled and group == 0:
        group = 8  # tile()'s order
    activation = activation if type(activation) is g.Activation else g._enum(g.Activation, activation, "activation")
    first = first if type(first) is g.Half else g._enum(g.Half, first, "first")
    torch = _sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return _quantized_gate_up_torch(torch, g, x, wq, scales, biases, wq_up, scales_up, biases_up, bias, bias_up,
                                        out, preact, fmt, activation, act_params, group, first, alpha, stream)
    from . import _export, _stream_handle, _workspace_alloc, current_stream

    if out is None:
        rows = wq.shape[0]
        out = g._empty(x, (*x.shape[:-1], rows if wq_up is not None else rows // 2), "out")
    if stream is None:
        stream = current_stream(x)
    e = _export
    _C.gate_up(e(x), e(wq), e(out), e(wq_up), e(bias), e(bias_up), e(preact), activation=activation,
               act_params=act_params, group=group, first=first, alpha=alpha, stream=_stream_handle(stream),
               scales=e(scales), biases=e(biases), scales_up=e(scales_up), biases_up=e(biases_up), quant=fmt,
               workspace_alloc=_workspace_alloc(x))
    return out


def _torch_prep(torch, g, like, stream, workspace, grad_checked):
    """For a call on PyTorch tensors, kept short as gate_up's (every line is
    host time on each call; the library checks the shapes): refuses the
    tensors that would need a gradient, as gate_up does, and gives the raw
    stream, the device's held allocator and the capsule maker. The generic
    path cost 25-30 us a call on an H200's host, 1.8-2.1x F.linear
    (docs/notes/drop-in-and-decode.md, h85)."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in grad_checked):
        raise RuntimeError(g._NO_BACKWARD)
    stream, alloc = g._torch_stream_and_alloc(torch, like, stream, workspace)
    to = torch.utils.dlpack.to_dlpack

    def e(t):  # scales held as parameters may require grad: the kernel reads their values
        return None if t is None else to(t.detach() if t.requires_grad else t)

    return stream, alloc, e


def _quantized_gate_up_torch(torch, g, x, wq, scales, biases, wq_up, scales_up, biases_up, bias, bias_up, out,
                             preact, fmt, activation, act_params, group, first, alpha, stream):
    if out is None:
        rows = wq.shape[0]
        out = g._new_out(x, rows if wq_up is not None else rows // 2)
    stream, alloc, e = _torch_prep(torch, g, x, stream, None, (x, bias, bias_up, out, preact))
    # e() for what may require grad; the words are integers and cannot, and
    # the absent tensors skip the call (each is host time on every call).
    to = torch.utils.dlpack.to_dlpack
    _C.gate_up(e(x), to(wq), e(out), None if wq_up is None else to(wq_up), None if bias is None else e(bias),
               None if bias_up is None else e(bias_up), None if preact is None else e(preact), activation=activation,
               act_params=act_params, group=group, first=first, alpha=alpha, stream=stream, scales=e(scales),
               biases=None if biases is None else e(biases), scales_up=None if scales_up is None else e(scales_up),
               biases_up=None if biases_up is None else e(biases_up), quant=fmt, workspace_alloc=alloc)
    return out


def quantized_down(h, wq, scales, biases=None, *, up=None, bias=None, out=None, group_size: int | None = None,
                   bits: int | None = None, mode: str = "affine", row_block: int | None = None, activation="silu",
                   act_params=None, alpha: float = 1.0, stream=None, workspace=None,
                   repacked: bool = False, tiled: bool = False):
    """down with quantized weights: y = alpha * h @ W^T + bias, W dequantized
    on the fly from quantize()'s arrays; with `up`, the GLU act(h) * up is
    the input, fused (h the gate half).

    h [M, K] (bf16 or fp16; K the MLP's intermediate size), up h's shape,
    dtype and strides; wq [U, K * bits / 32] uint32 (or int32) words with
    scales / biases [U, K / group_size] (affine; mxfp4 has no biases;
    fp8_e4m3: float scales [ceil(U / row_block), ceil(K / group_size)]), in
    the formats, defaults and dtypes of quantized_gate_up. bias [U]. Returns
    out [M, U] (h's dtype when allocated here). Each weight is rounded once
    to h's dtype and the sums are fp32, as in quantized_gate_up.
    tiled=True: affine 4-bit words and (scale, bias) pairs from
    tile(down=True) as wq and scales, no biases (U a multiple of 16; the
    fastest order up to 16 rows, dequantized past them).
    """
    g = _sys.modules[__package__]
    fmt = _format_cached(group_size, bits, mode, row_block, repacked, tiled)
    activation = activation if type(activation) is g.Activation else g._enum(g.Activation, activation, "activation")
    torch = _sys.modules.get("torch")
    if torch is not None and isinstance(h, torch.Tensor):
        if out is None:
            out = h.new_empty(*h.shape[:-1], wq.shape[0])
        stream, alloc, e = _torch_prep(torch, g, h, stream, workspace, (h, up, bias, out))
        _C.down(e(h), e(wq), e(out), e(up), e(bias), activation=activation, act_params=act_params, alpha=alpha,
                stream=stream, scales=e(scales), biases=e(biases), quant=fmt, workspace=e(workspace),
                workspace_alloc=alloc)
        return out
    from . import _export, _stream_handle, _workspace_alloc, current_stream

    if out is None:
        out = g._empty(h, (*h.shape[:-1], wq.shape[0]), "out")
    if stream is None:
        stream = current_stream(h)
    e = _export
    _C.down(e(h), e(wq), e(out), e(up), e(bias), activation=activation, act_params=act_params, alpha=alpha,
            stream=_stream_handle(stream), scales=e(scales), biases=e(biases), quant=fmt, workspace=e(workspace),
            workspace_alloc=_workspace_alloc(h))
    return out


def _down_format(group_size, bits, mode, row_block, group_size_down, bits_down, mode_down, row_block_down):
    """The down projection's (group_size, bits, mode, row_block): the gate/up
    ones unless given; with another mode, that mode's defaults."""
    if mode_down is None or mode_down == mode:
        pick = lambda d, g: g if d is None else d  # noqa: E731
        return (pick(group_size_down, group_size), pick(bits_down, bits), mode,
                pick(row_block_down, row_block))
    return group_size_down, bits_down, mode_down, row_block_down


def quantized_mlp(x, wq, scales, biases=None, *, wq_down, scales_down, biases_down=None, wq_up=None,
                  scales_up=None, biases_up=None, bias=None, bias_up=None, bias_down=None, out=None,
                  group_size: int | None = None, bits: int | None = None, mode: str = "affine",
                  row_block: int | None = None, group_size_down: int | None = None, bits_down: int | None = None,
                  mode_down: str | None = None, row_block_down: int | None = None, activation="silu",
                  act_params=None, group: int = 0, first="gate", stream=None, tiled: bool = False):
    """The whole gated MLP on quantized weights: quantized_down of
    quantized_gate_up's result.

    x, wq, scales, biases, wq_up, scales_up, biases_up, bias, bias_up,
    group_size, bits, mode, row_block, activation, act_params, group, first:
    as for quantized_gate_up, whose h [M, I] (x's dtype) is a temporary
    allocated like x. wq_down [H, I * bits / 32] words with scales_down /
    biases_down [H, I / group_size] and bias_down [H]: the down projection,
    in the gate/up format unless group_size_down, bits_down, mode_down or
    row_block_down say otherwise. out [M, H] is allocated like x when None.
    Both calls run on `stream` (None: the current stream of x). tiled=True:
    both weights in tile()'s order (gate/up: tile(...); down:
    tile(..., down=True)), affine 4-bit, no biases arrays. Returns out.
    """
    from . import current_stream

    if stream is None:
        stream = current_stream(x)
    h = quantized_gate_up(x, wq, scales, biases, wq_up=wq_up, scales_up=scales_up, biases_up=biases_up, bias=bias,
                          bias_up=bias_up, group_size=group_size, bits=bits, mode=mode, row_block=row_block,
                          activation=activation, act_params=act_params, group=group, first=first, stream=stream,
                          tiled=tiled)
    gd, bd, md, rd = _down_format(group_size, bits, mode, row_block, group_size_down, bits_down, mode_down,
                                  row_block_down)
    return quantized_down(h, wq_down, scales_down, biases_down, bias=bias_down, out=out, group_size=gd, bits=bd,
                          mode=md, row_block=rd, stream=stream, tiled=tiled)
