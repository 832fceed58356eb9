"""FP8 activations on the gate/up kernel from Python: gatedmlp.fp8_gate_up,
gatedmlp.quantize_fp8 and the binding's FP8 form of gate_up (x_scales,
x_fp8).

Without a GPU (PyTorch CPU tensors): the names and printing (DType.fp8_e4m3,
XScale, Problem.x_scale, Arguments.x_scales); the Problem the binding builds
from FP8 tensors (make_problem: x float8_e4m3fn or its uint8 bytes with
x_fp8=True, the x scale's granularity from its size: 1, M or M * ceil(K /
128) values; the weights' words and scales, per tensor, channel or 128 x
128 block; the bf16 default output), check_support's rule for fused
weights with block scales, and each refusal by name; what fp8_gate_up
hands the binding (the binding replaced by a recorder: x's bytes and
x_fp8, x_scales, the QuantFormat from the weight scale's shape, the words,
scales reshaped to [rows, 1] or the blocks, layouts, bias, out / out_dtype,
preact), checked by computing the call's result from what the binding
received, as gatedmlp.hpp defines it, against a float64 reference on the
caller's tensors; every malformed call refused by name with its values
before anything is launched; quantize_fp8's round trip at every
granularity (tensor, row, 1 x 128 block, 128 x 128 block).

On an sm_90 GPU: random cases (odd M, K a multiple of 16, odd U) of every
x-scale granularity (per tensor, per token) x weight-scale granularity (per
tensor, per output channel) x layout (stacked, even/odd with up first,
group 32, separate gate and up with their own scales) x activation x
output dtype, with bias, alpha, preact and padded rows on some, against a
float64 reference on the dequantized inputs (x_e4m3 * x_scale, w_e4m3 *
w_scale): the error (relative Frobenius and max abs) at most 2x that of
torch._scaled_mm (fp32 out; an fp32 GEMM of the e4m3 values where
_scaled_mm refuses the scaling) + the GLU in fp32, the suite's rule, plus a
tiny atol and the FP8 accumulation's modelled error. Block scales (x 1 x
128, w 128 x 128, with any scaling of the other operand; separate and
fused layouts whose interleave block is a multiple of 128; K often not a
multiple of 128): the same rule against an fp32 emulation of block-scaled
_scaled_mm (see blocked_fp32). A fused layout the block rule refuses
raises saying why. GATEDMLP_FP8_PROMOTE=1 (per-k-block promotion of
calls without block scales) passes the rule too. Outputs are poisoned with NaN first; a CUDA graph replay
gives the eager bits. On a GPU that is not sm_90, NotSupportedError.

An FP8 Y (out float8_e4m3fn with 1 x 128 group scales, row-major or
MN-major, and the amax): on the CPU, the Problem the binding builds and
every malformed call refused by name, what fp8_gate_up hands the binding
(and the layout it reads from a given scale tensor's strides); on the GPU,
each scale against the bf16 Y's group amax / 448, each value times its
scale within one e4m3 step of the bf16 Y, the amax exactly consistent with
the scales, the torch operator's bits eager and compiled, and the MN-major
scales read as they are by cuBLASLt's blockwise torch._scaled_mm (a down
projection from the FP8 Y).
"""

import os
import random

import pytest

torch = pytest.importorskip("torch")

import gatedmlp  # noqa: E402
from binding_recorder import record  # noqa: E402
from refs import act_torch, fused_halves  # noqa: E402
from test_moe import errors  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
HOPPER = HAS_CUDA and tuple(torch.cuda.get_device_capability()) == (9, 0)
DEV = "cuda"
SEED = int(os.environ.get("GATEDMLP_TEST_SEED", "20261203"))
ACTS = ["silu", "gelu_tanh", "gelu_erf", "relu", "swiglu_clamped"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
F8 = torch.float8_e4m3fn
C = gatedmlp._C
E = gatedmlp.InvalidArgumentError


def on_hopper(test):
    """Marked gpu, skipped unless the device has compute capability 9.0 (the
    FP8 kernel is Hopper's)."""
    return pytest.mark.gpu(pytest.mark.skipif(not HOPPER, reason="no sm_90 (Hopper) CUDA device")(test))


def fp8(*shape, scale=1.0, device="cpu"):
    return (torch.randn(*shape, device=device) * scale).to(F8)


def fmt(row_block):
    """FP8 weights' QuantFormat: row_block 0 per tensor, 1 per channel, 128
    per 128 x 128 block (group_size 128 with it)."""
    return C.QuantFormat(mode=C.QuantMode.fp8_e4m3, bits=8, group_size=128 if row_block == 128 else 0,
                         row_block=row_block)


def nblk(n):
    """ceil(n / 128): the 128-wide blocks of n rows or columns."""
    return -(-n // 128)


def is_w_block(s, rows, k):
    """Whether weight scale s of a [rows, k] weight holds 128 x 128 blocks
    (fp8_gate_up's rule: not one value, 2-D of the block shape, not [rows, 1])."""
    return s.numel() != 1 and tuple(s.shape) == (nblk(rows), nblk(k)) and tuple(s.shape) != (rows, 1)


def is_x_block(s, m, k):
    """Whether x scale s of an [m, k] x holds 1 x 128 blocks ([m, ceil(k /
    128)] with more than one block per row)."""
    return s.numel() != 1 and s.dim() == 2 and tuple(s.shape) == (m, nblk(k)) and nblk(k) > 1


def dl(t):
    return None if t is None else torch.utils.dlpack.to_dlpack(t)


# ---------------------------------------------------------------- float64 reference
def deq_x(xq, sx):
    """x = x_e4m3 * sx in float64: sx 1 value, one per row, or [M, ceil(K /
    128)] (x[r, c] * sx[r, c // 128])."""
    m, k = xq.shape
    if is_x_block(sx, m, k):
        return xq.double() * sx.double().repeat_interleave(128, dim=1)[:, :k]
    return xq.double() * (sx.double().reshape(-1, 1) if sx.numel() == m and m > 1 else sx.double().reshape(()))


def deq_w(q, s):
    """w = w_e4m3 * s in float64: s 1 value, one per row, or [ceil(N / 128),
    ceil(K / 128)] (w[n, c] * s[n // 128, c // 128])."""
    n, k = q.shape
    if is_w_block(s, n, k):
        return q.double() * s.double().repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    return q.double() * (s.double().reshape(-1, 1) if s.numel() == n and n > 1 else s.double().reshape(()))


def reference(xq, sx, w, sw, w_up=None, sw_up=None, bias=None, bias_up=None, act="silu", alpha=1.0, group=0,
              first="gate", ca=1.702, cl=7.0):
    """(y, g, u) in float64 from the caller's tensors, as gatedmlp.hpp
    defines an FP8 call: x = x_e4m3 * sx (1 value, one per row or one per
    row and 128 columns), each weight = w_e4m3 * its scale (1 value, one
    per row or one per 128 x 128 block of that tensor), g = alpha * x @ Wg^T
    + bg, u likewise, y = act(g) * u."""
    xd = deq_x(xq, sx)
    deq = deq_w

    if w_up is None:
        wd = deq(w, sw)
        u_ = w.shape[0] // 2
        gi, ui = fused_halves(u_, group, first, w.device)
        wg, wu = wd[gi], wd[ui]
        bg = bias.double()[gi] if bias is not None else None
        bu = bias.double()[ui] if bias is not None else None
    else:
        wg, wu = deq(w, sw), deq(w_up, sw_up)
        bg = bias.double() if bias is not None else None
        bu = bias_up.double() if bias_up is not None else None
    g = alpha * (xd @ wg.T)
    u = alpha * (xd @ wu.T)
    if bg is not None:
        g, u = g + bg, u + bu
    return act_torch(act, g, u, ca, cl), g, u


def from_binding(args, kw):
    """The result of a recorded _C.gate_up call computed from what the
    binding received, as gatedmlp.hpp defines it (x's bytes as e4m3 times
    x_scales, 1 value, m or [m, ceil(K / 128)]; the words' bytes as e4m3
    [rows, K] times the scales, per tensor (row_block 0), per row (1) or per
    128 x 128 block (group_size and row_block 128: [ceil(rows / 128),
    ceil(K / 128)]); rows grouped by group and first; separate weights in w
    and w_up)."""
    x, w, out, w_up, bias, bias_up, preact = args
    q = kw["quant"]
    assert kw["x_fp8"] is True and x.dtype in (torch.uint8, F8)  # bytes where DLPack has no float8
    assert q.mode == C.QuantMode.fp8_e4m3 and q.bits == 8
    assert (q.group_size, q.row_block) in ((0, 0), (0, 1), (128, 128))
    xq = x.view(F8) if x.dtype == torch.uint8 else x
    m, k = xq.shape
    xs = kw["x_scales"]
    assert xs.dtype == torch.float32 and xs.is_contiguous()
    assert xs.numel() in (1, m) or (tuple(xs.shape) == (m, nblk(k)) and is_x_block(xs, m, k))

    def weights(words, s):
        # The e4m3 bytes [rows, K] (the binding reads them as words), or
        # their uint8 view where DLPack has no float8; words from a caller
        # of the binding itself.
        assert words.dtype in (F8, torch.uint8, torch.int32, torch.uint32) and words.dim() == 2
        wq = words.view(torch.uint8).view(F8)
        if q.row_block == 0:
            assert s.numel() == 1
        elif q.row_block == 1:
            assert tuple(s.shape) == (wq.shape[0], 1) and s.is_contiguous()
        else:
            assert tuple(s.shape) == (nblk(wq.shape[0]), nblk(k)) and s.is_contiguous()
            assert is_w_block(s, wq.shape[0], k)
        return wq, s

    wq, sw = weights(w, kw["scales"])
    act = kw["activation"].name
    if w_up is None:
        assert kw.get("scales_up") is None
        y, g, u = reference(xq, xs, wq, sw, bias=bias, act=act, alpha=kw["alpha"], group=kw["group"],
                            first=kw["first"])
    else:
        wuq, swu = weights(w_up, kw["scales_up"])
        y, g, u = reference(xq, xs, wq, sw, wuq, swu, bias, bias_up, act=act, alpha=kw["alpha"])
    return y


# ================================================================ without a GPU
def test_names_and_printing():
    for name in ("fp8_gate_up", "quantize_fp8", "XScale"):
        assert name in gatedmlp.__all__ and hasattr(gatedmlp, name), name
    assert list(gatedmlp.XScale.__members__) == ["tensor", "row", "block"]
    assert gatedmlp.XScale.block.value == 2 and gatedmlp.to_string(gatedmlp.XScale.block) == "block"
    assert gatedmlp.DType.fp8_e4m3 in gatedmlp.DType.__members__.values()
    assert gatedmlp.dtype_size(gatedmlp.DType.fp8_e4m3) == 1
    assert gatedmlp.to_string(gatedmlp.DType.fp8_e4m3) == "fp8_e4m3"
    assert gatedmlp.to_string(gatedmlp.XScale.row) == "row"
    p = gatedmlp.Problem(m=5, k=64, u=8, input_dtype=gatedmlp.DType.fp8_e4m3, x_scale=gatedmlp.XScale.row)
    assert p.x_scale == gatedmlp.XScale.row
    assert "fp8_e4m3" in repr(p) and "x_scale=row" in repr(p), repr(p)
    p.x_scale = gatedmlp.XScale.block
    assert p.x_scale == gatedmlp.XScale.block and "x_scale=block" in repr(p), repr(p)
    a = gatedmlp.Arguments(x_scales=0x100)
    assert a.x_scales == 0x100 and "x_scales=0x100" in repr(a)
    a.x_scales = 0x200
    assert a.x_scales == 0x200


# ---------------------------------------------------------------- the binding's descriptor
def _problem(x, w, x_scales=None, scales=None, w_up=None, scales_up=None, row_block=0, quant=True, **kw):
    return C.make_problem(dl(x), dl(w), None, dl(w_up), scales=dl(scales), scales_up=dl(scales_up),
                          quant=fmt(row_block) if quant else None, x_scales=dl(x_scales), **kw)


def test_binding_describes_fp8_calls():
    m, k, u = 5, 64, 24
    x, w = fp8(m, k), fp8(2 * u, k)
    words = w.view(torch.int32)
    one, rows = torch.ones(1), torch.ones(m)
    # x float8_e4m3fn as it is (DLPack's float8), or its bytes with x_fp8.
    for xv, extra in ((x, {}), (x.view(torch.uint8), dict(x_fp8=True)), (x.view(torch.int8), dict(x_fp8=True)),
                      (x, dict(x_fp8=True))):
        p = _problem(xv, words, one, torch.ones(1), **extra)
        assert (p.m, p.k, p.u, p.batch) == (m, k, u, 1)
        assert p.input_dtype == gatedmlp.DType.fp8_e4m3 and p.x_scale == gatedmlp.XScale.tensor
        assert p.output_dtype == gatedmlp.DType.bf16  # no 16-bit input dtype to follow
        assert p.quantized and p.quant.mode == C.QuantMode.fp8_e4m3 and p.quant.row_block == 0
        assert p.weights.ld in (0, k // 4) and p.ldx in (0, k)
        assert gatedmlp.check_support(p), gatedmlp.check_support(p)
        assert "fp8_e4m3(x_scale=tensor)" in repr(p)
    # The x scale's granularity from its size: M values ([M] or [M, 1]) per row.
    for xs in (rows, rows.reshape(m, 1)):
        p = _problem(x, words, xs, torch.ones(2 * u, 1), row_block=1)
        assert p.x_scale == gatedmlp.XScale.row and p.quant.row_block == 1
        assert "x_scale=row" in repr(p)
    for xs in (torch.ones(()), torch.ones(1, 1)):
        assert _problem(x, words, xs, torch.ones(1)).x_scale == gatedmlp.XScale.tensor
    # M = 1: one value is either, read as per tensor.
    assert _problem(x[:1], words, torch.ones(1, 1), torch.ones(1)).x_scale == gatedmlp.XScale.tensor
    # Weight scales of any 16/32-bit float dtype; separate weights with their own.
    for dt, gd in ((torch.bfloat16, gatedmlp.DType.bf16), (torch.float16, gatedmlp.DType.fp16)):
        assert _problem(x, words, one, torch.ones(1, dtype=dt)).scale_dtype == gd
    wg, wu = fp8(u, k).view(torch.int32), fp8(u, k).view(torch.int32)
    p = _problem(x, wg, rows, torch.ones(u, 1), w_up=wu, scales_up=torch.ones(u, 1), row_block=1)
    assert p.weights.format == gatedmlp.WeightFormat.separate and p.u == u
    # The weights as their e4m3 bytes (float8_e4m3fn, or uint8 where DLPack
    # has no float8), as checkpoints store them: read as the same words.
    for wb in (w, w.view(torch.uint8)):
        pb, pw = _problem(x, wb, rows, torch.ones(2 * u, 1), row_block=1), _problem(x, words, rows,
                                                                                   torch.ones(2 * u, 1), row_block=1)
        assert repr(pb) == repr(pw) and pb.weights.ld in (0, k // 4)
    p = _problem(x, wg.view(F8), rows, torch.ones(u, 1), w_up=wu.view(torch.uint8), scales_up=torch.ones(u, 1),
                 row_block=1)
    assert p.weights.format == gatedmlp.WeightFormat.separate and p.u == u
    # Layout, alpha and the activation go through.
    p = _problem(x, words, one, torch.ones(1), group=8, first=gatedmlp.Half.up, alpha=0.5,
                 activation=gatedmlp.Activation.relu)
    assert (p.weights.group, p.weights.first, p.alpha, p.activation) == (8, gatedmlp.Half.up, 0.5,
                                                                         gatedmlp.Activation.relu)
    # out picks the output dtype.
    p = C.make_problem(dl(x), dl(words), dl(torch.empty(m, u, dtype=torch.float16)), scales=dl(one), quant=fmt(0),
                       x_scales=dl(one))
    assert p.output_dtype == gatedmlp.DType.fp16


def test_binding_refuses_malformed_fp8_calls():
    m, k, u = 5, 64, 24
    x, w = fp8(m, k), fp8(2 * u, k)
    words = w.view(torch.int32)
    one = torch.ones(1)
    cases = [
        # e4m3 bytes that are not rows of 4-byte words (gatedmlp.fp8_gate_up hands the weights as they are)
        (lambda: _problem(x, fp8(k, 2 * u).t(), one, one),
         r"'w' holds FP8 weights as bytes, shape \(48, 64\) and strides \(1, 48\), which cannot be read as rows "
         r"of 4-byte words"),
        (lambda: _problem(fp8(m, 48), fp8(2 * u, 50)[:, 1:49], one, one),
         r"'w' holds FP8 weights as bytes, shape \(48, 48\) and strides \(50, 1\)"),
        (lambda: _problem(x, words, None, one), r"'x_scales' is required with FP8 activations \('x' float8_e4m3fn\)"),
        (lambda: _problem(x.view(torch.uint8), words, None, one, x_fp8=True),
         r"'x_scales' is required with FP8 activations \('x' uint8 with x_fp8=True\)"),
        (lambda: _problem(x.view(torch.uint8), words, one, one),
         r"'x_scales' goes with FP8 activations; 'x' is uint8: pass x_fp8=True"),
        (lambda: _problem(torch.zeros(m, k, dtype=torch.bfloat16), words, one, one),
         r"'x_scales' goes with FP8 activations .*'x' has dtype bfloat16"),
        (lambda: _problem(torch.zeros(m, k, dtype=torch.bfloat16), words, one, one, x_fp8=True),
         r"x_fp8=True reads 'x' as float8_e4m3fn bytes, so 'x' must be float8_e4m3fn, uint8 or int8 .*got bfloat16"),
        (lambda: _problem(x, words, torch.ones(m + 1), one),
         r"'x_scales' must hold 1 value \(per tensor\), M = 5 \(one per row of x: \[M\] or \[M, 1\]\) or M \* "
         r"ceil\(K / 128\) = 5 \(one per row and 128 columns of K: \[M, ceil\(K / 128\)\] = \(5, 1\), row-major\), "
         r"got shape \(6,\)"),
        (lambda: _problem(x, words, torch.ones(2), one), r"'x_scales' must hold 1 value .*got shape \(2,\)"),
        (lambda: _problem(x, words, torch.ones(1, dtype=torch.float16), one),
         r"'x_scales' \(the scales of FP8 x\) must be float32, got float16"),
        (lambda: _problem(x, words, torch.ones(2 * m)[::2], one), r"'x_scales' must be contiguous"),
        (lambda: _problem(x, words, one, one, quant=False),
         r"FP8 activations need FP8 weights: quant=QuantFormat\(mode=QuantMode.fp8_e4m3.*got no quant"),
        (lambda: C.make_problem(dl(x), dl(words), scales=dl(one), biases=dl(one),
                                quant=C.QuantFormat(mode=C.QuantMode.affine, bits=8, group_size=64),
                                x_scales=dl(one)),
         r"FP8 activations need FP8 weights: .*got quant=.*affine"),
        (lambda: _problem(x, words, one, torch.ones(2 * u)), r"'scales' must be \[scale rows, scale columns\]"),
        (lambda: _problem(x, w.view(torch.int16), one, one), r"'w' holds quantized weights, so must be uint32"),
    ]
    for call, pattern in cases:
        with pytest.raises(E, match=pattern):
            call()
    # Batched x and a gathered call are not supported FP8.
    with pytest.raises(gatedmlp.NotSupportedError, match=r"FP8 activations take 'x' \[M, K\] \(batch 1\), got shape "
                                                         r"\(2, 5, 64\)"):
        _problem(fp8(2, m, k), words, one, one)
    with pytest.raises(gatedmlp.NotSupportedError, match=r"FP8 activations \('x_scales'\) take no gather"):
        C.make_problem(dl(x), dl(fp8(3, 2 * u, k).view(torch.int32)), scales=dl(torch.ones(3)), quant=fmt(0),
                       x_scales=dl(one), indices=dl(torch.zeros(m, dtype=torch.int32)))
    # Another float8 is named as such.
    with pytest.raises(E, match=r"float8_e5m2"):
        _problem(torch.zeros(m, k, dtype=torch.float8_e5m2), words, one, one)


def test_binding_fp8_promote():
    """fp8_promote=True reaches Problem.fp8_promote (printed, and a field of
    its own); with 16-bit x it is a mistake, named."""
    m, k, u = 5, 64, 24
    x, w = fp8(m, k), fp8(2 * u, k).view(torch.int32)
    p = _problem(x, w, torch.ones(1), torch.ones(1))
    assert p.fp8_promote is False and "fp8_promote" not in repr(p)
    q = _problem(x, w, torch.ones(1), torch.ones(1), fp8_promote=True)
    assert q.fp8_promote is True and "fp8_promote" in repr(q), repr(q)
    assert gatedmlp.check_support(q), gatedmlp.check_support(q).message
    xb = torch.randn(m, k, dtype=torch.bfloat16)
    wb = torch.randn(2 * u, k, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="'fp8_promote' goes with FP8 activations"):
        C.make_problem(dl(xb), dl(wb), None, fp8_promote=True)


def test_binding_describes_block_scales():
    """x_scales of M * ceil(K / 128) values are XScale.block ([M, ceil(K /
    128)] row-major, or flat); 1 and M keep their meaning wherever they
    coincide with it; FP8 weights with 128 x 128 block scales
    (QuantFormat group_size 128, row_block 128) take [ceil(N / 128),
    ceil(K / 128)] scales of any 16/32-bit float dtype, with any x
    scaling; check_support takes separate weights of any U and fused ones
    whose interleave block is a multiple of 128, and says why otherwise."""
    m, k, u = 5, 272, 24  # K: three 128-column blocks, the last of 16
    kb = nblk(k)
    x = fp8(m, k)
    sep_g, sep_u = fp8(u, k).view(torch.int32), fp8(u, k).view(torch.int32)
    bs = torch.rand(nblk(u), kb) + 0.5
    for xs in (torch.rand(m, kb) + 0.5, (torch.rand(m, kb) + 0.5).flatten()):
        p = _problem(x, sep_g, xs, bs, w_up=sep_u, scales_up=bs.clone(), row_block=128)
        assert p.x_scale == gatedmlp.XScale.block and "x_scale=block" in repr(p), repr(p)
        assert (p.quant.group_size, p.quant.row_block) == (128, 128)
        assert p.weights.format == gatedmlp.WeightFormat.separate and p.u == u
        assert gatedmlp.check_support(p), gatedmlp.check_support(p).message
    # Any x scaling with block weights, block x with any weight scaling.
    for xs, want in ((torch.ones(1), gatedmlp.XScale.tensor), (torch.ones(m, 1), gatedmlp.XScale.row)):
        p = _problem(x, sep_g, xs, bs, w_up=sep_u, scales_up=bs, row_block=128)
        assert p.x_scale == want and gatedmlp.check_support(p), gatedmlp.check_support(p).message
    fused = fp8(2 * 128, k).view(torch.int32)
    for ws, rb in ((torch.ones(1), 0), (torch.ones(2 * 128, 1), 1), (torch.ones(2, kb), 128)):
        p = _problem(x, fused, torch.ones(m, kb), ws, row_block=rb)
        assert p.x_scale == gatedmlp.XScale.block and p.quant.row_block == rb
        assert gatedmlp.check_support(p), gatedmlp.check_support(p).message
    # M = 1: [1, ceil(K / 128)] is blocks (one value would be per tensor).
    assert _problem(x[:1], sep_g, torch.ones(1, kb), torch.ones(1)).x_scale == gatedmlp.XScale.block
    # K <= 128: a row is one block, so [M, 1] is per row, the same scaling.
    x64 = fp8(m, 64)
    w64 = fp8(2 * u, 64).view(torch.int32)
    assert _problem(x64, w64, torch.ones(m, 1), torch.ones(1)).x_scale == gatedmlp.XScale.row
    # Block weight scales of bf16 / fp16.
    for dt, gd in ((torch.bfloat16, gatedmlp.DType.bf16), (torch.float16, gatedmlp.DType.fp16)):
        p = _problem(x, sep_g, torch.ones(1), bs.to(dt), w_up=sep_u, scales_up=bs.to(dt), row_block=128)
        assert p.scale_dtype == gd and gatedmlp.check_support(p)
    # Fused weights: the interleave block (group, or U stacked) must be a
    # multiple of 128: U = 256 stacked or group 128 pass; U = 24 stacked,
    # group 64 do not (not_supported, saying why).
    w256 = fp8(2 * 256, k).view(torch.int32)
    for group, first in ((0, gatedmlp.Half.gate), (128, gatedmlp.Half.up), (256, gatedmlp.Half.gate)):
        p = _problem(x, w256, torch.ones(m, kb), torch.ones(4, kb), row_block=128, group=group, first=first)
        assert gatedmlp.check_support(p), (group, gatedmlp.check_support(p).message)
    for w_, group, what in ((fp8(2 * u, k).view(torch.int32), 0, "u=24"), (w256, 64, "group=64")):
        p = _problem(x, w_, torch.ones(m, kb), torch.ones(nblk(w_.shape[0]), kb), row_block=128, group=group)
        st = gatedmlp.check_support(p)
        assert not st and st.code == gatedmlp.StatusCode.not_supported
        assert "128 x 128 block scales, fused: the interleave block (weights.group, or u when stacked) must be a " \
               "multiple of 128" in st.message and f"got {what}" in st.message, st.message


def test_binding_refuses_malformed_block_scales():
    m, k, u = 5, 272, 24
    kb = nblk(k)
    x = fp8(m, k)
    wg, wu = fp8(u, k).view(torch.int32), fp8(u, k).view(torch.int32)
    bs = torch.ones(nblk(u), kb)
    cases = [
        # Neither 1, M nor M * ceil(K / 128) values: the three sizes named.
        (lambda: _problem(x, wg, torch.ones(m, kb + 1), bs, w_up=wu, scales_up=bs, row_block=128),
         r"'x_scales' must hold 1 value \(per tensor\), M = 5 \(one per row of x: \[M\] or \[M, 1\]\) or M \* "
         r"ceil\(K / 128\) = 15 \(one per row and 128 columns of K: \[M, ceil\(K / 128\)\] = \(5, 3\), "
         r"row-major\), got shape \(5, 4\)"),
        # The right count in the transposed shape: refused, not misread.
        (lambda: _problem(x, wg, torch.ones(kb, m), bs, w_up=wu, scales_up=bs, row_block=128),
         r"'x_scales' holds M \* ceil\(K / 128\) = 15 values \(per row and 128 columns of K\), so must be "
         r"\[M, ceil\(K / 128\)\] = \(5, 3\) or \(15,\), got shape \(3, 5\)"),
        (lambda: _problem(x, wg, torch.ones(1, m, kb), bs, w_up=wu, scales_up=bs, row_block=128),
         r"'x_scales' holds M \* ceil\(K / 128\) = 15 values .*got shape \(1, 5, 3\)"),
        # [M, ceil(K / 128)] column-major (DeepGEMM's layout) is not read as it is.
        (lambda: _problem(x, wg, torch.ones(kb, m).t(), bs, w_up=wu, scales_up=bs, row_block=128),
         r"'x_scales' must be contiguous, got shape \(5, 3\) with strides \(1, 5\) \(block scales are read "
         r"row-major"),
        # Weight block scales of the wrong shape, each tensor by its name.
        (lambda: _problem(x, wg, torch.ones(1), torch.ones(1, kb - 1), w_up=wu, scales_up=bs, row_block=128),
         r"'scales' must be \[scale rows, scale columns\] = \(1, 3\) for .*got shape \(1, 2\)"),
        (lambda: _problem(x, wg, torch.ones(1), bs, w_up=wu, scales_up=torch.ones(u, 1), row_block=128),
         r"'scales_up' must be \[scale rows, scale columns\] = \(1, 3\) for .*got shape \(24, 1\)"),
        (lambda: _problem(x, fp8(2 * 256, k).view(torch.int32), torch.ones(1), torch.ones(2, kb), row_block=128),
         r"'scales' must be \[scale rows, scale columns\] = \(4, 3\) for .*got shape \(2, 3\)"),
    ]
    for call, pattern in cases:
        with pytest.raises(E, match=pattern):
            call()


# ---------------------------------------------------------------- what fp8_gate_up hands the binding
def _inputs(m=5, k=64, u=24, sep=False, x_gran="tensor", w_gran="tensor", sdt=torch.float32):
    xq, sx = gatedmlp.quantize_fp8(torch.randn(m, k), x_gran)
    if sep:
        wg, sg = gatedmlp.quantize_fp8(torch.randn(u, k) / 8, w_gran)
        wu, su = gatedmlp.quantize_fp8(torch.randn(u, k) / 8, w_gran)
        return xq, sx, wg, sg.to(sdt), wu, su.to(sdt)
    w, sw = gatedmlp.quantize_fp8(torch.randn(2 * u, k) / 8, w_gran)
    return xq, sx, w, sw.to(sdt), None, None


def test_fp8_gate_up_hands_the_binding(monkeypatch):
    rec = record(monkeypatch)
    m, k, u = 5, 64, 24
    xq, sx, w, sw, _, _ = _inputs(m, k, u)
    y = gatedmlp.fp8_gate_up(xq, sx, w, sw)
    (name, args, kw), = rec.calls
    assert name == "gate_up"
    x_, w_, out_, w_up_, bias_, bias_up_, pre_ = args
    assert x_.dtype in (torch.uint8, F8) and x_.data_ptr() == xq.data_ptr() and tuple(x_.shape) == (m, k)
    assert kw["x_fp8"] is True
    assert torch.equal(kw["x_scales"], sx.reshape(1))
    assert w_.dtype in (F8, torch.uint8) and tuple(w_.shape) == (2 * u, k) and w_.data_ptr() == w.data_ptr()
    q = kw["quant"]
    assert (q.mode, q.bits, q.group_size, q.row_block) == (C.QuantMode.fp8_e4m3, 8, 0, 0)
    assert kw["scales"].numel() == 1 and kw["scales_up"] is None and kw.get("biases") is None
    assert out_ is not None and out_.dtype == torch.bfloat16 and tuple(out_.shape) == (m, u)
    assert out_.data_ptr() == y.data_ptr()
    assert w_up_ is None and bias_ is None and bias_up_ is None and pre_ is None
    assert kw["group"] == 0 and kw["first"] == gatedmlp.Half.gate and kw["alpha"] == 1.0
    assert kw["activation"] == gatedmlp.Activation.silu and kw["workspace"] is None
    assert kw["workspace_alloc"] is not None

    # Per token x ([M] or [M, 1]), per channel weights ([2U] or [2U, 1]):
    # row_block 1, the scales as [2U, 1]; out_dtype; the layout.
    for xs, ws in ((sx.expand(m, 1).contiguous(), sw.expand(2 * u).contiguous()),
                   (torch.rand(m) + 0.5, torch.rand(2 * u, 1) + 0.5)):
        rec.calls.clear()
        y = gatedmlp.fp8_gate_up(xq, xs, w, ws, out_dtype=torch.float16, group=8, first="up", alpha=0.25,
                                 activation="gelu_erf")
        (_, args, kw), = rec.calls
        assert y.dtype == torch.float16 and args[2].dtype == torch.float16
        assert torch.equal(kw["x_scales"].flatten(), xs.flatten()) and kw["x_scales"].numel() == m
        assert kw["quant"].row_block == 1 and tuple(kw["scales"].shape) == (2 * u, 1)
        assert torch.equal(kw["scales"].flatten(), ws.flatten())
        assert (kw["group"], kw["first"], kw["alpha"], kw["activation"]) == (8, gatedmlp.Half.up, 0.25,
                                                                             gatedmlp.Activation.gelu_erf)

    # Separate weights with their own scales, biases, out and preact given.
    rec.calls.clear()
    xq, sx, wg, sg, wu, su = _inputs(m, k, u, sep=True, x_gran="row", w_gran="row", sdt=torch.bfloat16)
    bg, bu = torch.randn(u), torch.randn(u)
    out = torch.empty(m, u, dtype=torch.float32)
    pre = torch.empty(m, 2 * u)
    y = gatedmlp.fp8_gate_up(xq, sx, wg, sg, w_up=wu, w_up_scale=su, bias=bg, bias_up=bu, out=out, preact=pre)
    assert y is out
    (_, args, kw), = rec.calls
    assert args[3].data_ptr() == wu.data_ptr() and args[3].dtype in (F8, torch.uint8)
    assert args[4].data_ptr() == bg.data_ptr() and args[5].data_ptr() == bu.data_ptr()
    assert args[6].data_ptr() == pre.data_ptr() and args[2].data_ptr() == out.data_ptr()
    assert kw["quant"].row_block == 1 and tuple(kw["scales_up"].shape) == (u, 1)
    assert kw["scales"].dtype == torch.bfloat16 and kw["x_scales"].numel() == m

    # Block scales: x [M, ceil(K / 128)] and the weights' [ceil(N / 128),
    # ceil(K / 128)] go as they are (contiguous: a column-major x scale is
    # copied row-major), QuantFormat group_size 128, row_block 128.
    k2 = 272
    for sep in (True, False):
        rec.calls.clear()
        uu = u if sep else 128  # fused block scales: U a multiple of 128
        xq, sx, w, sw, wu, su = _inputs(m, k2, uu, sep, "block", "block128")
        assert tuple(sx.shape) == (m, 3) and tuple(sw.shape) == ((1, 3) if sep else (2, 3))
        sx_cm = sx.t().contiguous().t()  # [M, 3], strides (1, M)
        gatedmlp.fp8_gate_up(xq, sx_cm, w, sw, w_up=wu, w_up_scale=su)
        (_, args, kw), = rec.calls
        q = kw["quant"]
        assert (q.mode, q.bits, q.group_size, q.row_block) == (C.QuantMode.fp8_e4m3, 8, 128, 128)
        assert tuple(kw["x_scales"].shape) == (m, 3) and kw["x_scales"].is_contiguous()
        assert torch.equal(kw["x_scales"], sx)
        assert torch.equal(kw["scales"], sw) and kw["scales"].is_contiguous()
        if sep:
            assert torch.equal(kw["scales_up"], su)
        else:
            assert kw["scales_up"] is None
    # K <= 128: [M, 1] is per token (row_block from the weights alone).
    rec.calls.clear()
    xq, sx, w, sw, _, _ = _inputs(m, k, 128, False, "block", "block128")
    assert tuple(sx.shape) == (m, 1) and tuple(sw.shape) == (2, 1)
    gatedmlp.fp8_gate_up(xq, sx, w, sw)
    (_, args, kw), = rec.calls
    assert tuple(kw["x_scales"].shape) == (m, 1) and kw["quant"].row_block == 128
    assert tuple(kw["scales"].shape) == (2, 1)
    # One block (N, K <= 128): one value, read as per tensor.
    rec.calls.clear()
    xq, sx, w, sw, _, _ = _inputs(m, k, 32, False, "tensor", "block128")
    assert tuple(sw.shape) == (1, 1)
    gatedmlp.fp8_gate_up(xq, sx, w, sw)
    (_, args, kw), = rec.calls
    assert kw["quant"].row_block == 0 and kw["scales"].numel() == 1


@pytest.mark.parametrize("layout", ["stacked", "g1-up", "g8", "separate"])
@pytest.mark.parametrize("grans", [("tensor", "tensor"), ("row", "tensor"), ("tensor", "row"), ("row", "row"),
                                   ("block", "tensor"), ("block", "row"), ("block", "block128"),
                                   ("tensor", "block128"), ("row", "block128")])
def test_fp8_gate_up_means_what_the_header_says(monkeypatch, layout, grans):
    """The call's result computed from what the binding received equals the
    float64 reference on the caller's tensors: the scales reach the rows
    (and 128-column blocks) they belong to. Block scales: K = 336 (three
    k-blocks, the last of 80 columns); fused layouts with 128 x 128 weight
    blocks have U = 256 and interleave blocks of 128 or 256 rows."""
    results = []
    record(monkeypatch, compute=lambda name, args, kw: results.append(from_binding(args, kw)))
    blocked = "block" in grans[0] or "block" in grans[1]
    m, k, u = (7, 336, 256) if blocked else (7, 48, 24)
    sep = layout == "separate"
    if grans[1] == "block128" and sep:
        u = 40  # separate weights take any U: one partial 128-row block
    xq, sx, w, sw, wu, su = _inputs(m, k, u, sep, *grans)
    if grans[1] == "block128":
        group, first = {"stacked": (0, "gate"), "g1-up": (128, "up"), "g8": (256, "up"),
                        "separate": (None, "gate")}[layout]
    else:
        group, first = {"stacked": (0, "gate"), "g1-up": (1, "up"), "g8": (8, "gate"),
                        "separate": (None, "gate")}[layout]
    bias = torch.randn(u if sep else 2 * u)
    bias_up = torch.randn(u) if sep else None
    if grans[0] == "row":
        sx = sx.flatten()  # [M] as well as [M, 1]
    gatedmlp.fp8_gate_up(xq, sx, w, sw, w_up=wu, w_up_scale=su, bias=bias, bias_up=bias_up, group=group,
                         first=first, alpha=0.5, activation="gelu_tanh")
    want, _, _ = reference(xq, sx, w, sw, wu, su, bias, bias_up, "gelu_tanh", 0.5, group or 0, first)
    got, = results
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


def test_fp8_gate_up_refuses_by_name_before_any_launch(monkeypatch):
    record(monkeypatch, fail=True)
    m, k, u = 5, 64, 24
    xq, sx, w, sw, _, _ = _inputs(m, k, u)
    wg, sg, wu, su = fp8(u, k), torch.ones(1), fp8(u, k), torch.ones(1)
    bf = torch.randn(m, k).to(torch.bfloat16)

    def call(**over):
        a = dict(x=xq, x_scale=sx, w=w, w_scale=sw)
        a.update(over)
        return lambda: gatedmlp.fp8_gate_up(a.pop("x"), a.pop("x_scale"), a.pop("w"), a.pop("w_scale"), **a)

    cases = [
        (call(x=bf), r"'x' must be float8_e4m3fn \(FP8 activations\), got bfloat16"),
        (call(x=xq.view(torch.uint8)), r"'x' must be float8_e4m3fn .*got uint8"),
        (call(x=xq[None]), r"'x' must be \[M, K\] \(2-D\), got shape \(1, 5, 64\)"),
        (call(x=fp8(m, 40), w=fp8(2 * u, 40)), r"'x' must have K a multiple of 16 .*got K = 40"),
        (call(x_scale=sx.double()), r"'x_scale' must be float32, got float64"),
        (call(x_scale=torch.ones(m + 1)),
         r"'x_scale' must hold 1 value \(per tensor: \[\], \[1\] or \[1, 1\]\), 5 \(per token, one per row of x: "
         r"\[5\] or \[5, 1\]\) or \[M, ceil\(K / 128\)\] = \[5, 1\] \(per token and 128 columns of K, 1 x 128 "
         r"blocks\), got shape \(6,\)"),
        (call(x_scale=torch.ones(1, m)), r"'x_scale' must hold 1 value .*got shape \(1, 5\)"),
        (call(w=w.to(torch.bfloat16)), r"'w' must be float8_e4m3fn \(FP8 weights\), got bfloat16"),
        (call(w=fp8(2 * u, 32)), r"'w' must be \[2U, K\] with K = 64 \(x.shape\[1\]\), got shape \(48, 32\)"),
        (call(w=fp8(2 * u + 1, k)), r"'w' holds fused gate and up weights, \[2U, K\], so needs an even number of "
                                    r"rows; got shape \(49, 64\)"),
        (call(w_scale=torch.ones(2 * u, dtype=torch.int32)), r"'w_scale' must be float32, bfloat16 or float16, got "
                                                             r"int32"),
        (call(w_scale=torch.ones(u)), r"'w_scale' must hold 1 value \(per tensor.*, 48 \(per output channel, one "
                                      r"per row of w: \[48\] or \[48, 1\]\) or \[ceil\(N / 128\), ceil\(K / 128\)\] = "
                                      r"\[1, 1\] \(128 x 128 blocks of w's 48 rows and K = 64\), got shape \(24,\)"),
        (call(w_scale=torch.ones(1, 2 * u)), r"'w_scale' must hold 1 value .*got shape \(1, 48\)"),
        (call(w_up_scale=torch.ones(1)), r"'w_up_scale' goes with separate weights \(w_up\)"),
        (call(bias_up=torch.ones(u)), r"'bias_up' goes with separate weights \(w_up\)"),
        (call(w=wg, w_scale=sg, w_up=wu), r"'w_up_scale' is required with separate weights \(w_up\)"),
        (call(w=wg, w_scale=sg, w_up=fp8(u + 1, k), w_up_scale=su), r"'w_up' must have the shape of 'w' \(24, 64\), "
                                                                    r"got \(25, 64\)"),
        (call(w=wg, w_scale=sg, w_up=wu.to(torch.bfloat16), w_up_scale=su), r"'w_up' must be float8_e4m3fn"),
        (call(w=wg, w_scale=sg, w_up=wu, w_up_scale=torch.ones(u)),
         r"'w_scale' and 'w_up_scale' must have one granularity, both 1 value, both one per row or both 128 x 128 "
         r"blocks .*got 1 value and 24 values"),
        (call(w=wg, w_scale=sg, w_up=wu, w_up_scale=su.to(torch.bfloat16)),
         r"'w_up_scale' must have the dtype of 'w_scale' \(float32\), got bfloat16"),
        (call(bias=torch.ones(u)), r"'bias' must be \[2U\] = \(48,\), got shape \(24,\)"),
        (call(bias=torch.ones(2 * u, dtype=torch.int64)), r"'bias' must be bfloat16, float16 or float32, got int64"),
        (call(w=wg, w_scale=sg, w_up=wu, w_up_scale=su, bias=torch.ones(u)),
         r"'bias' and 'bias_up' go together with separate weights"),
        (call(w=wg, w_scale=sg, w_up=wu, w_up_scale=su, bias=torch.ones(u), bias_up=torch.ones(u + 1)),
         r"'bias_up' must be \[U\] = \(24,\), got shape \(25,\)"),
        (call(out=torch.empty(m, u + 1)), r"'out' must be \[M, U\] = \(5, 24\), got shape \(5, 25\)"),
        (call(out=torch.empty(m, u, dtype=torch.float64)),
         r"'out' must be bfloat16, float16, float32 or float8_e4m3fn, got float64"),
        (call(out=torch.empty(m, u), out_dtype=torch.bfloat16), r"'out' has dtype float32 but out_dtype is bfloat16"),
        (call(out_dtype=torch.float64),
         r"'out_dtype' must be torch.bfloat16, torch.float16, torch.float32 or torch.float8_e4m3fn"),
        (call(preact=torch.empty(m, u)), r"'preact' must be \[M, 2U\] = \(5, 48\), got shape \(5, 24\)"),
        (call(activation="swish"), r"activation='swish' is not one of"),
        (call(first="down"), r"first='down' is not one of"),
    ]
    for fn, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            fn()
    with pytest.raises(TypeError, match=r"'x' must be a torch.Tensor"):
        gatedmlp.fp8_gate_up([1.0], sx, w, sw)
    with pytest.raises(TypeError, match=r"'w_up_scale' must be a torch.Tensor"):
        gatedmlp.fp8_gate_up(xq, sx, wg, sg, w_up=wu, w_up_scale=1.0)
    with pytest.raises(TypeError, match=r"'w_scale' must be a torch.Tensor"):
        gatedmlp.fp8_gate_up(xq, sx, w, 1.0)


def test_fp8_gate_up_refuses_bad_block_scales_before_any_launch(monkeypatch):
    """Block scales of the wrong shape, mixed gate / up granularities and
    fused layouts the block rule refuses: named, with the accepted shapes,
    before any launch."""
    record(monkeypatch, fail=True)
    m, k, u = 5, 272, 24  # ceil(K / 128) = 3
    xq, sx, _, _, _, _ = _inputs(m, k, u, x_gran="block")
    wg, sg, wu, su = fp8(u, k), torch.ones(1, 3), fp8(u, k), torch.ones(1, 3)
    w256, s256 = fp8(2 * 256, k), torch.ones(4, 3)

    def call(**over):
        a = dict(x=xq, x_scale=sx, w=wg, w_scale=sg, w_up=wu, w_up_scale=su)
        a.update(over)
        return lambda: gatedmlp.fp8_gate_up(a.pop("x"), a.pop("x_scale"), a.pop("w"), a.pop("w_scale"), **a)

    cases = [
        (call(x_scale=torch.ones(m, 4)),
         r"'x_scale' must hold 1 value \(per tensor: \[\], \[1\] or \[1, 1\]\), 5 \(per token, one per row of x: "
         r"\[5\] or \[5, 1\]\) or \[M, ceil\(K / 128\)\] = \[5, 3\] \(per token and 128 columns of K, 1 x 128 "
         r"blocks\), got shape \(5, 4\)"),
        (call(x_scale=torch.ones(3, m)), r"'x_scale' must hold 1 value .*= \[5, 3\] .*got shape \(3, 5\)"),
        (call(x_scale=torch.ones(m * 3)), r"'x_scale' must hold 1 value .*got shape \(15,\)"),
        (call(x_scale=torch.ones(1, m, 3)), r"'x_scale' must hold 1 value .*got shape \(1, 5, 3\)"),
        (call(w_scale=torch.ones(1, 2)),
         r"'w_scale' must hold 1 value \(per tensor: \[\], \[1\] or \[1, 1\]\), 24 \(per output channel, one per "
         r"row of w: \[24\] or \[24, 1\]\) or \[ceil\(N / 128\), ceil\(K / 128\)\] = \[1, 3\] \(128 x 128 blocks "
         r"of w's 24 rows and K = 272\), got shape \(1, 2\)"),
        (call(w_scale=torch.ones(3, 1)), r"'w_scale' must hold 1 value .*= \[1, 3\] .*got shape \(3, 1\)"),
        (call(w_up_scale=torch.ones(2, 3)), r"'w_up_scale' must hold 1 value .*= \[1, 3\] .*got shape \(2, 3\)"),
        (call(w_up_scale=torch.ones(1)), r"'w_scale' and 'w_up_scale' must have one granularity, .*got \(1, 3\) block "
                                         r"scales and 1 value"),
        (call(w_scale=torch.ones(u, 1)), r"'w_scale' and 'w_up_scale' must have one granularity, .*got 24 values and "
                                         r"\(1, 3\) block scales"),
        (call(w_up_scale=su.to(torch.bfloat16)), r"'w_up_scale' must have the dtype of 'w_scale' \(float32\), got "
                                                  r"bfloat16"),
        (call(w=w256, w_scale=torch.ones(2, 3), w_up=None, w_up_scale=None),
         r"'w_scale' must hold 1 value .*512 \(per output channel.*= \[4, 3\] \(128 x 128 blocks of w's 512 rows "
         r"and K = 272\), got shape \(2, 3\)"),
        (call(w=w256, w_scale=s256, w_up=None, w_up_scale=s256), r"'w_up_scale' goes with separate weights \(w_up\)"),
    ]
    for fn, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            fn()
    # Fused weights whose interleave block is not a multiple of 128:
    # NotSupportedError (the C++ check_support's rule, here before any
    # allocation), saying what to do instead.
    fused24 = fp8(2 * u, k)
    for over, what in ((dict(w=fused24, w_scale=torch.ones(1, 3)), r"U = 24 \(stacked"),
                       (dict(w=w256, w_scale=s256, group=64), r"group = 64"),
                       (dict(w=w256, w_scale=s256, group=32, first="up"), r"group = 32")):
        with pytest.raises(gatedmlp.NotSupportedError,
                           match=r"'w_scale' holds 128 x 128 block scales of fused 'w' .*interleave in blocks of "
                                 + what + r".*must be a multiple of 128 .*pass gate and up as separate weights") as ei:
            call(w_up=None, w_up_scale=None, **over)()
        assert ei.value.code == gatedmlp.StatusCode.not_supported


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
def test_fp8_gate_up_refuses_tensors_on_other_devices(monkeypatch):
    # A signature's first call: the Python checks name the device.
    monkeypatch.setattr(gatedmlp.fp8, "_PLANS", {})
    record(monkeypatch, fail=True)
    xq, sx, w, sw, _, _ = _inputs()
    with pytest.raises(ValueError, match=r"'x_scale' is on cpu but 'x' is on cuda"):
        gatedmlp.fp8_gate_up(xq.to(DEV), sx, w.to(DEV), sw.to(DEV))
    with pytest.raises(ValueError, match=r"'w' is on cpu but 'x' is on cuda"):
        gatedmlp.fp8_gate_up(xq.to(DEV), sx.to(DEV), w, sw.to(DEV))


@on_hopper
def test_fp8_gate_up_refuses_other_devices_on_a_known_signature():
    """The per-signature key leaves devices out (reading them cost ~0.8 us a
    call): a repeated signature with a tensor on the host is refused by the
    library's own pointer check, naming the argument, and writes nothing."""
    m, k, u = 5, 64, 24
    xq, sx, w, sw, _, _ = _inputs(m, k, u)
    xq, sx, w, sw = (t.to(DEV) for t in (xq, sx, w, sw))
    out = torch.full((m, u), float("nan"), device=DEV, dtype=torch.bfloat16)
    gatedmlp.fp8_gate_up(xq, sx, w, sw, out=out)
    assert torch.isfinite(out).all()
    out.fill_(float("nan"))
    for over, name in ((dict(x_scale=sx.cpu()), "x_scales"), (dict(w=w.cpu()), "w"), (dict(w_scale=sw.cpu()),
                                                                                       "w_scales")):
        a = dict(x=xq, x_scale=sx, w=w, w_scale=sw)
        a.update(over)
        with pytest.raises(ValueError, match=rf"argument '{name}' \(0x[0-9a-f]+\) is host memory"):
            gatedmlp.fp8_gate_up(a["x"], a["x_scale"], a["w"], a["w_scale"], out=out)
        torch.cuda.synchronize()
        assert torch.isnan(out.float()).all(), f"{name} on the host: out was written"


def test_fp8_gate_up_checks_each_new_signature(monkeypatch):
    """fp8_gate_up checks a call's arguments in Python once per signature
    (shapes, dtypes, devices, options) and then only launches: a repeated
    good call is launched again; a call that differs in anything the checks
    read is checked again and refused by name, however many good calls came
    before; the gradient check runs on every call."""
    rec = record(monkeypatch)
    m, k, u = 5, 64, 24
    xq, sx, w, sw, _, _ = _inputs(m, k, u, x_gran="row", w_gran="row")
    bias = torch.randn(2 * u)
    for _ in range(3):
        gatedmlp.fp8_gate_up(xq, sx, w, sw, bias=bias)
    assert len(rec.calls) == 3
    # New data, same signature: launched with the new tensors.
    xq2, sx2 = gatedmlp.quantize_fp8(torch.randn(m, k), "row")
    gatedmlp.fp8_gate_up(xq2, sx2, w, sw, bias=bias)
    assert rec.calls[-1][1][0].data_ptr() == xq2.data_ptr() and torch.equal(rec.calls[-1][2]["x_scales"].flatten(),
                                                                             sx2.flatten())
    n = len(rec.calls)
    with pytest.raises(E, match="'x_scale' must be float32, got float64"):
        gatedmlp.fp8_gate_up(xq, sx.double(), w, sw, bias=bias)
    with pytest.raises(E, match=r"'bias' must be \[2U\] = \(48,\)"):
        gatedmlp.fp8_gate_up(xq, sx, w, sw, bias=bias[:7])
    with pytest.raises(E, match="'w_scale' must hold 1 value"):
        gatedmlp.fp8_gate_up(xq, sx, w, sw[:3])
    with pytest.raises(TypeError, match="'x_scale' must be a torch.Tensor"):
        gatedmlp.fp8_gate_up(xq, sx.numpy(), w, sw)
    with pytest.raises(RuntimeError, match="backward"):
        gatedmlp.fp8_gate_up(xq, sx, w, sw, bias=bias.clone().requires_grad_())
    assert len(rec.calls) == n, "a refused call reached the binding"
    gatedmlp.fp8_gate_up(xq, sx, w, sw, bias=bias)
    assert len(rec.calls) == n + 1


# ---------------------------------------------------------------- FP8 Y (an FP8 output with 1 x 128 scales)
def _fp8_out_problem(m=5, k=64, u=200, out=None, y_scales=None, **kw):
    x, w = fp8(m, k), fp8(2 * u, k).view(torch.int32)
    out = torch.empty(m, u, dtype=F8) if out is None else out
    return C.make_problem(dl(x), dl(w), dl(out), scales=dl(torch.ones(1)), quant=fmt(0), x_scales=dl(torch.ones(1)),
                          y_scales=dl(y_scales), **kw)


def _mn_scales(m, u):
    """[M, ceil(U / 128)] float32 with strides (1, align4(M)): the MN-major layout."""
    return torch.empty(nblk(u), -(-m // 4) * 4).t()[:m]


def test_binding_describes_fp8_output():
    m, u = 5, 200
    for out in (torch.empty(m, u, dtype=F8), torch.empty(m, u, dtype=torch.uint8)):
        p = _fp8_out_problem(m, out=out, y_scales=torch.empty(m, 2))
        assert p.output_dtype == gatedmlp.DType.fp8_e4m3
        assert p.y_scale_layout == gatedmlp.YScaleLayout.row_major and not p.has_y_amax
        assert gatedmlp.check_support(p), gatedmlp.check_support(p)
        assert "out=fp8_e4m3(y_scales=row_major)" in repr(p)
    p = _fp8_out_problem(m, y_scales=_mn_scales(m, u), y_amax=dl(torch.empty(())),
                         y_scale_layout=gatedmlp.YScaleLayout.mn_major)
    assert p.y_scale_layout == gatedmlp.YScaleLayout.mn_major and p.has_y_amax
    assert "out=fp8_e4m3(y_scales=mn_major, amax)" in repr(p)
    # No rows (an empty batch): fine in either layout.
    for layout in (gatedmlp.YScaleLayout.row_major, gatedmlp.YScaleLayout.mn_major):
        p = _fp8_out_problem(0, y_scales=_mn_scales(0, u), y_scale_layout=layout, y_amax=dl(torch.empty(())))
        assert p.m == 0 and gatedmlp.check_support(p), gatedmlp.check_support(p)
    # One row, one group: any strides.
    p = _fp8_out_problem(1, u=100, y_scales=torch.empty(4, 1)[:1], y_scale_layout=gatedmlp.YScaleLayout.mn_major)
    assert p.output_dtype == gatedmlp.DType.fp8_e4m3
    # No out (make_problem): FP8 from y_scales.
    x, w = fp8(m, 64), fp8(2 * u, 64).view(torch.int32)
    p = C.make_problem(dl(x), dl(w), scales=dl(torch.ones(1)), quant=fmt(0), x_scales=dl(torch.ones(1)),
                       y_scales=dl(torch.empty(m, 2)))
    assert p.output_dtype == gatedmlp.DType.fp8_e4m3
    # Names and printing.
    assert gatedmlp.to_string(gatedmlp.YScaleLayout.mn_major) == "mn_major"
    a = gatedmlp.Arguments(y_scales=0x1000, y_amax=0x2000)
    assert a.y_scales == 0x1000 and a.y_amax == 0x2000 and "y_amax=0x2000" in repr(a)
    q = gatedmlp.Problem(output_dtype=gatedmlp.DType.fp8_e4m3, has_y_amax=True,
                         y_scale_layout=gatedmlp.YScaleLayout.mn_major)
    assert q.has_y_amax and q.y_scale_layout == gatedmlp.YScaleLayout.mn_major


def test_binding_refuses_malformed_fp8_output():
    m, u = 5, 200
    with pytest.raises(E, match="'out' is float8_e4m3fn: an FP8 Y needs 'y_scales'"):
        _fp8_out_problem(m)
    with pytest.raises(E, match="'y_scales' is given, so 'out' holds an FP8 Y.*got bfloat16"):
        _fp8_out_problem(m, out=torch.empty(m, u, dtype=torch.bfloat16), y_scales=torch.empty(m, 2))
    with pytest.raises(E, match=r"'y_scales' must be \[M, ceil\(U / 128\)\] = \(5, 2\), got shape \(5, 1\)"):
        _fp8_out_problem(m, y_scales=torch.empty(m, 1))
    with pytest.raises(E, match="'y_scales' .* must be float32, got bfloat16"):
        _fp8_out_problem(m, y_scales=torch.empty(m, 2, dtype=torch.bfloat16))
    with pytest.raises(E, match=r"must have strides \(1, 8\) \(y_scale_layout=mn_major"):
        _fp8_out_problem(m, y_scales=torch.empty(m, 2), y_scale_layout=gatedmlp.YScaleLayout.mn_major)
    with pytest.raises(E, match=r"must have strides \(2, 1\) \(y_scale_layout=row_major\)"):
        _fp8_out_problem(m, y_scales=_mn_scales(m, u))
    with pytest.raises(E, match="'y_amax' must be one float32"):
        _fp8_out_problem(m, y_scales=torch.empty(m, 2), y_amax=dl(torch.empty(2)))
    with pytest.raises(E, match="'y_amax' goes with an FP8 Y"):
        _fp8_out_problem(m, out=torch.empty(m, u, dtype=torch.bfloat16), y_amax=dl(torch.empty(())))
    # 16-bit x: no FP8 Y.
    x, w = torch.randn(m, 64, dtype=torch.bfloat16), torch.randn(2 * u, 64, dtype=torch.bfloat16)
    with pytest.raises(E, match="'y_scales' .an FP8 Y. goes with FP8 activations"):
        C.make_problem(dl(x), dl(w), dl(torch.empty(m, u, dtype=torch.uint8)), y_scales=dl(torch.empty(m, 2)))


def test_fp8_gate_up_fp8_out_hands_the_binding(monkeypatch):
    rec = record(monkeypatch)
    m, k, u = 5, 64, 200
    xq, sx, w, sw, _, _ = _inputs(m, k, u)
    y, ys = gatedmlp.fp8_gate_up(xq, sx, w, sw, out_dtype=F8)
    (_, args, kw), = rec.calls
    assert y.dtype == F8 and tuple(y.shape) == (m, u)
    assert args[2].dtype in (torch.uint8, F8) and args[2].data_ptr() == y.data_ptr()
    assert ys.dtype == torch.float32 and tuple(ys.shape) == (m, 2) and ys.stride() == (2, 1)
    assert kw["y_scales"].data_ptr() == ys.data_ptr() and kw["y_amax"] is None
    assert kw["y_scale_layout"] == gatedmlp.YScaleLayout.row_major
    # MN-major scales, the amax allocated.
    rec.calls.clear()
    y, ys, amax = gatedmlp.fp8_gate_up(xq, sx, w, sw, out_dtype=F8, y_scale_layout="mn", amax=True)
    (_, args, kw), = rec.calls
    assert tuple(ys.shape) == (m, 2) and ys.stride() == (1, 8)
    assert amax.dtype == torch.float32 and amax.numel() == 1 and kw["y_amax"].data_ptr() == amax.data_ptr()
    assert kw["y_scale_layout"] == gatedmlp.YScaleLayout.mn_major
    # A given MN-major y_scale is read as such (its strides).
    rec.calls.clear()
    ys_mn = _mn_scales(m, u)
    gatedmlp.fp8_gate_up(xq, sx, w, sw, out_dtype=F8, y_scale=ys_mn)
    assert rec.calls[0][2]["y_scale_layout"] == gatedmlp.YScaleLayout.mn_major
    # Given out, y_scale and amax are written in place.
    rec.calls.clear()
    out, sc, am = torch.empty(m, u, dtype=F8), torch.empty(m, 2), torch.empty(1)
    got = gatedmlp.fp8_gate_up(xq, sx, w, sw, out=out, y_scale=sc, amax=am)
    assert got[0] is out and got[1] is sc and got[2] is am
    # A 16-bit out: a tensor as before.
    rec.calls.clear()
    assert gatedmlp.fp8_gate_up(xq, sx, w, sw).dtype == torch.bfloat16
    assert rec.calls[0][2]["y_scales"] is None


def test_fp8_gate_up_fp8_out_refuses_by_name(monkeypatch):
    record(monkeypatch, fail=True)
    m, k, u = 5, 64, 200
    xq, sx, w, sw, _, _ = _inputs(m, k, u)
    with pytest.raises(E, match="'y_scale' goes with an FP8 Y"):
        gatedmlp.fp8_gate_up(xq, sx, w, sw, y_scale=torch.empty(m, 2))
    with pytest.raises(E, match="'amax' goes with an FP8 Y"):
        gatedmlp.fp8_gate_up(xq, sx, w, sw, amax=True)
    with pytest.raises(E, match="'y_scale_layout' must be 'row' or 'mn'"):
        gatedmlp.fp8_gate_up(xq, sx, w, sw, out_dtype=F8, y_scale_layout="col")
    with pytest.raises(E, match=r"'y_scale' must be float32 \[M, ceil\(U / 128\)\] = \(5, 2\)"):
        gatedmlp.fp8_gate_up(xq, sx, w, sw, out_dtype=F8, y_scale=torch.empty(m, 3))
    with pytest.raises(E, match="'amax' must be True or one float32"):
        gatedmlp.fp8_gate_up(xq, sx, w, sw, out_dtype=F8, amax=torch.empty(2))
    with pytest.raises(E, match="'out_dtype' must be"):
        gatedmlp.fp8_gate_up(xq, sx, w, sw, out_dtype=torch.float8_e5m2)


# ---------------------------------------------------------------- quantize_fp8
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_fp8_round_trip(dtype):
    t = (torch.randn(37, 80) * torch.logspace(-3, 2, 37).reshape(37, 1)).to(dtype)
    tf = t.float()
    for gran in ("tensor", "row"):
        q, s = gatedmlp.quantize_fp8(t, gran)
        assert q.dtype == F8 and q.shape == t.shape and s.dtype == torch.float32
        assert tuple(s.shape) == ((1,) if gran == "tensor" else (37, 1))
        amax = tf.abs().amax() if gran == "tensor" else tf.abs().amax(dim=1, keepdim=True)
        assert torch.equal(s, (amax / 448.0).reshape(s.shape))
        back = q.float() * s
        # e4m3: 3 mantissa bits, a relative error of at most 2^-4 on normals;
        # subnormals (below 2^-6) are spaced 2^-9 apart.
        bound = tf.abs() * 2.0 ** -4 + s * 2.0 ** -10
        assert ((back - tf).abs() <= bound).all()
        # Each amax lands on 448 exactly.
        qmax = q.float().abs().amax() if gran == "tensor" else q.float().abs().amax(dim=1)
        assert torch.all(qmax == 448.0)
    # A 3-D tensor per row: [..., 1] scales; zeros get the floor's tiny
    # scale, not 0 (no division by zero); NaN stays NaN.
    q, s = gatedmlp.quantize_fp8(torch.zeros(2, 3, 16), "row")
    assert tuple(s.shape) == (2, 3, 1) and torch.all(s > 0) and torch.all(q.float() == 0)
    q, s = gatedmlp.quantize_fp8(torch.tensor([1.0, float("nan")]))
    assert torch.isnan(q.float()[1])


def _expand_blocks(s, shape):
    """Block scales s repeated over the elements each covers: 1 x 128 groups
    along the last axis (s [..., ceil(K / 128)]) when s has t's rank and
    its leading axes, else 128 x 128 blocks of a 2-D t."""
    k = shape[-1]
    e = s.repeat_interleave(128, dim=-1)[..., :k]
    if tuple(s.shape[:-1]) != tuple(shape[:-1]):
        e = e.repeat_interleave(128, dim=0)[:shape[0]]
    return e


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_fp8_blocks(dtype):
    """"block": a scale per 1 x 128 group of each row ([..., ceil(K /
    128)], the last group partial); "block128": per 128 x 128 block of a
    2-D t ([ceil(N / 128), ceil(K / 128)], the last row and column blocks
    partial). Each scale is its block's amax / 448 (the floor's tiny scale
    for a block of zeros), the block's amax lands on 448, and q * scale
    gives t back within e4m3's rounding."""
    torch.manual_seed(5)
    n, k = 300, 300  # 3 blocks each way: 128, 128, 44
    # Magnitudes differing from block to block, both ways, and within rows.
    t = torch.randn(n, k) * torch.logspace(-3, 2, n).reshape(n, 1) * torch.logspace(1, -1, k).reshape(1, k)
    t[:, 128:256] *= 0.01
    t[128:256, 0:128] = 0.0  # block (1, 0) all zeros, and so are those rows' first 1 x 128 groups
    t = t.to(dtype)
    tf = t.float()
    for gran, lead in (("block", (n,)), ("block128", (3,))):
        q, s = gatedmlp.quantize_fp8(t, gran)
        assert q.dtype == F8 and q.shape == t.shape and q.is_contiguous() and s.dtype == torch.float32
        assert tuple(s.shape) == lead + (3,), (gran, tuple(s.shape))
        # The scales: each block's amax / 448.
        want = torch.empty_like(s)
        for j in range(3):
            cols = tf[:, 128 * j:128 * (j + 1)].abs()
            if gran == "block":
                want[:, j] = cols.amax(dim=1)
            else:
                for i in range(3):
                    want[i, j] = cols[128 * i:128 * (i + 1)].amax()
        assert torch.equal(s, want.clamp_min(1e-12) / 448.0), gran
        se = _expand_blocks(s, t.shape)
        back = q.float() * se
        # e4m3: 3 mantissa bits, a relative error of at most 2^-4 on normals;
        # subnormals (below 2^-6) are spaced 2^-9 apart.
        bound = tf.abs() * 2.0 ** -4 + se * 2.0 ** -10
        assert ((back - tf).abs() <= bound).all(), gran
        # Each nonzero block's amax lands on 448; a zero block stays zero
        # with a tiny positive scale.
        qa = q.float().abs()
        for j in range(3):
            cols = qa[:, 128 * j:128 * (j + 1)]
            if gran == "block":
                nz = want[:, j] > 0
                assert torch.all(cols.amax(dim=1)[nz] == 448.0) and torch.all(cols[~nz] == 0)
            else:
                for i in range(3):
                    blk = cols[128 * i:128 * (i + 1)]
                    assert (blk.amax() == 448.0) if want[i, j] > 0 else (blk.amax() == 0)
        assert torch.all(s > 0)
    # Block (1, 0) is all zeros: the floor's scale.
    assert gatedmlp.quantize_fp8(t, "block128")[1][1, 0].item() == (torch.tensor(1e-12) / 448.0).item()
    # 1 x 128 groups along the last axis of any rank; K < 128: one group per row.
    t3 = torch.randn(2, 3, 200).to(dtype)
    q, s = gatedmlp.quantize_fp8(t3, "block")
    assert tuple(s.shape) == (2, 3, 2)
    assert torch.equal(s[..., 1], t3.float()[..., 128:].abs().amax(-1) / 448.0)
    q, s = gatedmlp.quantize_fp8(t3[..., :64], "block")
    q_row, s_row = gatedmlp.quantize_fp8(t3[..., :64], "row")
    assert torch.equal(s, s_row) and torch.equal(q.view(torch.uint8), q_row.view(torch.uint8))
    # K a multiple of 128: no partial group; and zeros.
    q, s = gatedmlp.quantize_fp8(torch.zeros(4, 256, dtype=dtype), "block")
    assert tuple(s.shape) == (4, 2) and torch.all(s > 0) and torch.all(q.float() == 0)
    q, s = gatedmlp.quantize_fp8(torch.zeros(256, 384, dtype=dtype), "block128")
    assert tuple(s.shape) == (2, 3) and torch.all(s > 0) and torch.all(q.float() == 0)
    # Small weights: one partial block.
    q, s = gatedmlp.quantize_fp8(torch.ones(5, 16, dtype=dtype) * 3, "block128")
    assert tuple(s.shape) == (1, 1) and s.item() == (torch.tensor(3.0) / 448.0).item()
    assert torch.all(q.float() == 448.0)
    # NaN makes its block's scale NaN; the other blocks keep theirs.
    tn = torch.ones(2, 256)
    tn[0, 3] = float("nan")
    q, s = gatedmlp.quantize_fp8(tn, "block")
    one = (torch.tensor(1.0) / 448.0).item()
    assert torch.isnan(s[0, 0]) and torch.isnan(q.float()[0, 3]) and s[0, 1].item() == s[1, 0].item() == one


def test_quantize_fp8_refuses():
    with pytest.raises(ValueError, match=r"granularity='block64' is not one of 'tensor', 'row', 'block', 'block128'"):
        gatedmlp.quantize_fp8(torch.ones(4), "block64")
    with pytest.raises(ValueError, match=r"granularity='block128' \(128 x 128 blocks\) takes a 2-D 't' \[N, K\], got "
                                         r"shape \(2, 3, 4\)"):
        gatedmlp.quantize_fp8(torch.ones(2, 3, 4), "block128")
    with pytest.raises(ValueError, match=r"granularity='block128' .*got shape \(4,\)"):
        gatedmlp.quantize_fp8(torch.ones(4), "block128")
    with pytest.raises(ValueError, match=r"'t' has rows of 0 elements \(shape \(3, 0\)\): no block-wise amax"):
        gatedmlp.quantize_fp8(torch.ones(3, 0), "block")
    with pytest.raises(ValueError, match=r"'t' must be float32, bfloat16 or float16 .*got int32"):
        gatedmlp.quantize_fp8(torch.ones(4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"'t' must have at least one axis"):
        gatedmlp.quantize_fp8(torch.tensor(1.0))
    with pytest.raises(TypeError, match=r"'t' must be a torch.Tensor"):
        gatedmlp.quantize_fp8([1.0, 2.0])


# ================================================================ on a GPU
def acc_allowance(k):
    """The FP8 wgmma's own accumulation error per unit of sum(|x w|): the
    tensor core adds each k = 32 slice with its addends aligned to the
    largest and kept to ~14 bits, truncated; 2^-11 per slice up to 4, as
    tests/test_gpu_fp8.cpp models it (measured 2^-12.6 for one slice). The
    promoting kernels (every block-scaled call, and the others with
    GATEDMLP_FP8_PROMOTE=1) sum each 128-deep k-block (4 slices) in the
    tensor cores and add it into fp32: the same 4-slice bound per k-block,
    so per unit of the whole sum of magnitudes."""
    return 2.0 ** -11 * min(-(-k // 32), 4)


def magnitudes(xq, sx, w, sw, w_up, sw_up, alpha, group, first):
    """sum_k |alpha x w| of each gate and up sum: the size the accumulation
    error is measured against."""
    ab = lambda t: None if t is None else t.double().abs()  # noqa: E731
    _, ag, au = reference(ab(xq), ab(sx), ab(w), ab(sw), ab(w_up), ab(sw_up), None, None, "relu", abs(alpha),
                          group, first)
    return ag, au


def assert_within_rule(got, base, ref, what, acc=None):
    """The suite's rule (test_gpu.py): at most 2x the baseline's error
    against the float64 reference, by relative Frobenius norm and by max
    abs, plus a tiny atol; NaN never passes. acc: (g, u, A_g, A_u, k) of the
    reference, which adds the FP8 accumulation's modelled error (through
    the GLU: 1.2 (|u| + 1) dg + |g| du, dg = acc_allowance(k) A_g) on top:
    the baseline (_scaled_mm, fp32 promotion) has none of it."""
    assert torch.isfinite(got).all(), f"{what}: non-finite output (an element not written, or NaN)"
    rel, mx = errors(got, ref)
    rel_b, mx_b = errors(base, ref)
    scale = ref.abs().max().item()
    extra_rel = extra_max = 0.0
    if acc is not None:
        g, u, ag, au, k = acc
        dg, du = acc_allowance(k) * ag, acc_allowance(k) * au
        dy = 1.2 * (u.abs() + 1 + du) * dg + (g.abs() + dg) * du
        extra_rel = (dy.norm() / ref.norm().clamp_min(1e-300)).item()
        extra_max = dy.max().item()
    assert rel <= 2 * rel_b + extra_rel + 1e-6, f"{what}: rel err {rel:.3e} > 2 x baseline {rel_b:.3e} + {extra_rel:.3e}"
    assert mx <= 2 * mx_b + extra_max + 1e-6 * scale + 1e-30, \
        f"{what}: max err {mx:.3e} > 2 x baseline {mx_b:.3e} + {extra_max:.3e}"


def _pad16(n):
    return -(-n // 16) * 16


def scaled_mm_fp32(xq, sx, w, sw):
    """(x_e4m3 * sx) @ (w_e4m3 * sw)^T in fp32, [M, rows] in w's row order,
    as torch._scaled_mm computes it (fp32 out; per-tensor scales as scalars,
    others row-wise [M, 1] x [1, N]; M and N padded with zero rows to the
    multiples of 16 it needs), or where _scaled_mm refuses this scaling an
    fp32 GEMM of the exact e4m3 values with the scales applied after (what
    _scaled_mm's epilogue does). Returns (result, which)."""
    m, k = xq.shape
    n = w.shape[0]
    per_tensor = sx.numel() == 1 and sw.numel() == 1
    mp, np_ = _pad16(m), _pad16(n)
    a = torch.zeros(mp, k, device=xq.device, dtype=F8)
    a[:m] = xq
    b = torch.zeros(np_, k, device=w.device, dtype=F8)
    b[:n] = w
    try:
        if per_tensor:
            sa, sb = sx.float().reshape(()), sw.float().reshape(())
        else:
            sa = torch.ones(mp, 1, device=xq.device)
            sa[:m] = sx.float().reshape(-1, 1).expand(m, 1)
            sb = torch.ones(1, np_, device=xq.device)
            sb[0, :n] = sw.float().reshape(-1).expand(n)
        h = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float32)
        return h[:m, :n], "_scaled_mm"
    except (RuntimeError, TypeError):
        h = xq.float() @ w.float().T
        return h * sx.float().reshape(-1, 1) * sw.float().reshape(1, -1), "fp32 GEMM of the e4m3 values"


def blocked_fp32(xq, sx, w, sw):
    """The baseline where x or w carries block scales: (x_e4m3 * sx) @
    (w_e4m3 * sw)^T in fp32, [M, rows] in w's row order, computed as
    block-scaled _scaled_mm (cuBLAS's 1 x 128 / 128 x 128 kernels, as
    DeepGEMM) computes it: each 128-deep k-block (the last one partial) an
    fp32 GEMM of the exact e4m3 values (their products are exact in fp32,
    and in TF32 too: 4 significant bits each), times its block scales in
    fp32, added into fp32 sums; per-tensor / row / channel scales multiply
    the sum after. _scaled_mm itself is not the baseline here: it takes
    only the 1 x 128 x 128 x 128 pairing (not block x with tensor or
    channel w, nor tensor / row x with block w), bf16 out only (its own
    rounding of h would loosen the bar), and needs M, N, K multiples of 16
    or 128. The emulation is that GEMM at its best: its error against the
    float64 reference is the fp32 sums' alone, so the bar is the output
    dtype's rounding (2x the baseline's) plus the FP8 accumulation's
    modelled error, as for the other schemes."""
    m, k = xq.shape
    n = w.shape[0]
    xb, wb = is_x_block(sx, m, k), is_w_block(sw, n, k)
    h = torch.zeros(m, n, device=xq.device, dtype=torch.float32)
    for j in range(nblk(k)):
        c = slice(128 * j, min(128 * (j + 1), k))
        part = xq[:, c].float() @ w[:, c].float().T
        if xb:
            part = part * sx[:, j:j + 1].float()
        if wb:
            part = part * sw[:, j].float().repeat_interleave(128)[:n].reshape(1, n)
        h += part
    if not xb:
        h = h * (sx.float().reshape(()) if sx.numel() == 1 else sx.float().reshape(-1, 1))
    if not wb:
        h = h * (sw.float().reshape(()) if sw.numel() == 1 else sw.float().reshape(1, -1))
    return h, "an fp32 per-k-block emulation of block-scaled _scaled_mm"


def gemm_fp32(xq, sx, w, sw):
    """The baseline GEMM for one weight tensor: blocked_fp32 where either
    scale is blocked, else scaled_mm_fp32."""
    m, k = xq.shape
    if is_x_block(sx, m, k) or is_w_block(sw, w.shape[0], k):
        return blocked_fp32(xq, sx, w, sw)
    return scaled_mm_fp32(xq, sx, w, sw)


def baseline(xq, sx, w, sw, w_up, sw_up, bias, bias_up, act, alpha, group, first, out_dtype):
    """_scaled_mm (or its block-scaled emulation) + the GLU in fp32 (alpha,
    bias, activation), rounded to out_dtype: the bar's baseline."""
    if w_up is None:
        h, which = gemm_fp32(xq, sx, w, sw)
        gi, ui = fused_halves(w.shape[0] // 2, group, first, w.device)
        g, u = h[:, gi] * alpha, h[:, ui] * alpha
        if bias is not None:
            g, u = g + bias.float()[gi], u + bias.float()[ui]
    else:
        hg, which = gemm_fp32(xq, sx, w, sw)
        hu, _ = gemm_fp32(xq, sx, w_up, sw_up)
        g, u = hg * alpha, hu * alpha
        if bias is not None:
            g, u = g + bias.float(), u + bias_up.float()
    return act_torch(act, g, u).to(out_dtype), which


LAYOUTS = ["stacked", "g1-up", "g32", "separate"]


def gpu_cases():
    r = random.Random(SEED)
    cases = []
    for xg in ("tensor", "row"):
        for wg in ("tensor", "row"):
            for layout in LAYOUTS:
                for act in ACTS:
                    for out in DTYPES:
                        u = 32 * r.choice([1, 3, 5, 7]) if layout == "g32" else r.choice([1, 3, 37, 101, 199, 333])
                        cases.append(dict(
                            xg=xg, wg=wg, layout=layout, act=act, out=out, u=u,
                            m=r.choice([1, 3, 7, 63, 65, 129, 255, 511]), k=16 * r.randint(1, 48),
                            sdt=r.choice(["fp32", "fp32", "bf16", "fp16"]),
                            bias=r.choice([None, None, "fp32", "bf16"]),
                            alpha=r.choice([1.0, 1.0, 0.5]),
                            preact=r.random() < 0.2,
                            pad_x=r.choice([0, 0, 16]),
                            pad_y=r.choice([0, 0, 3]),
                            x_shape=r.choice(["[M, 1]", "[M]"]),
                        ))
    return cases


GPU_CASES = gpu_cases()

# Block scales: x 1 x 128 with weights per tensor, channel or 128 x 128
# block, and x per tensor / token with 128 x 128 weight blocks. Fused
# layouts with weight blocks need an interleave block that is a multiple of
# 128 (stacked with U = 128 j, group 128 with up first); separate weights
# take any U. K is a multiple of 16, most often not of 128 (a partial last
# k-block), up to 2560 (20 k-blocks).
BLOCK_SCHEMES = [("block", "tensor"), ("block", "row"), ("block", "block128"), ("tensor", "block128"),
                 ("row", "block128")]
BLOCK_LAYOUTS = {"tensor": LAYOUTS, "row": LAYOUTS, "block128": ["stacked", "g128-up", "separate"]}


def gpu_block_cases():
    r = random.Random(SEED + 1)
    cases = []
    for xg, wg in BLOCK_SCHEMES:
        for layout in BLOCK_LAYOUTS[wg]:
            for out in DTYPES:
                if layout == "g32":
                    u = 32 * r.choice([1, 3, 5, 7])
                elif wg == "block128" and layout != "separate":
                    u = 128 * r.choice([1, 2, 3])
                else:
                    u = r.choice([1, 3, 37, 101, 199, 333])
                k = 16 * r.randint(1, 160)
                if k % 128 == 0 and r.random() < 0.7:
                    k += 16 * r.randint(1, 7)
                cases.append(dict(
                    xg=xg, wg=wg, layout=layout, act=r.choice(ACTS), out=out, u=u,
                    m=r.choice([1, 3, 7, 63, 65, 129, 255, 511]), k=k,
                    sdt=r.choice(["fp32", "fp32", "bf16", "fp16"]),
                    bias=r.choice([None, None, "fp32", "bf16"]),
                    alpha=r.choice([1.0, 1.0, 0.5]),
                    preact=r.random() < 0.2,
                    pad_x=r.choice([0, 0, 16]),
                    pad_y=r.choice([0, 0, 3]),
                    x_shape="[M, 1]",
                ))
    return cases


GPU_BLOCK_CASES = gpu_block_cases()


def _id(c):
    return f"x{c['xg']}-w{c['wg']}-{c['layout']}-{c['act']}-{c['out']}-m{c['m']}k{c['k']}u{c['u']}"


@on_hopper
@pytest.mark.parametrize("case", GPU_CASES, ids=_id)
def test_random_fp8_problem(case):
    run_case(case, SEED + GPU_CASES.index(case))


@on_hopper
@pytest.mark.parametrize("case", GPU_BLOCK_CASES, ids=_id)
def test_random_fp8_block_problem(case):
    run_case(case, SEED + 100000 + GPU_BLOCK_CASES.index(case))


def run_case(c, seed):
    """One random case: the call against the float64 reference, by the
    rule (and the pre-activation, padded columns, NaN poisoning)."""
    torch.manual_seed(seed)
    m, k, u = c["m"], c["k"], c["u"]
    odt, sdt = DTYPES[c["out"]], DTYPES[c["sdt"]]
    sep = c["layout"] == "separate"
    group, first = {"stacked": (0, "gate"), "g1-up": (1, "up"), "g32": (32, "gate"), "g128-up": (128, "up"),
                    "separate": (0, "gate")}[c["layout"]]
    wscale = 4.0 if c["act"] == "swiglu_clamped" else 1.0  # reach the clamps
    x_full = torch.randn(m, k + c["pad_x"], device=DEV) * torch.logspace(-1, 1, m, device=DEV).reshape(m, 1)
    if c["xg"] == "block":
        # Columns of varying size, so that the 1 x 128 scales differ along
        # K; the scales of x's K columns (not of the padding), in a padded
        # buffer.
        x_full = x_full * torch.logspace(0.5, -0.5, k + c["pad_x"], device=DEV).reshape(1, -1)
        q, sx = gatedmlp.quantize_fp8(x_full[:, :k], "block")
        xq_full = torch.zeros(m, k + c["pad_x"], device=DEV, dtype=torch.uint8).view(F8)
        xq_full[:, :k] = q
    else:
        xq_full, sx = gatedmlp.quantize_fp8(x_full, c["xg"])
    xq = xq_full[:, :k]
    if c["xg"] == "row" and c["x_shape"] == "[M]":
        sx = sx.flatten()
    def weights(rows):
        wr = torch.randn(rows, k, device=DEV) * wscale / k ** 0.5
        if c["wg"] == "block128":
            # Sizes varying over the rows and along K, so that a scale read
            # from the wrong 128 x 128 block shows.
            wr = wr * torch.logspace(0.5, -0.5, rows, device=DEV).reshape(-1, 1)
            wr = wr * torch.logspace(-0.5, 0.5, k, device=DEV).reshape(1, -1)
        return wr

    if sep:
        wg, swg = gatedmlp.quantize_fp8(weights(u), c["wg"])
        wu, swu = gatedmlp.quantize_fp8(weights(u) * 0.7, c["wg"])
        w, sw, w_up, sw_up = wg, swg.to(sdt), wu, swu.to(sdt)
    else:
        w, sw = gatedmlp.quantize_fp8(weights(2 * u), c["wg"])
        sw, w_up, sw_up = sw.to(sdt), None, None
    bias = bias_up = None
    if c["bias"]:
        bdt = DTYPES[c["bias"]]
        bias = torch.randn(u if sep else 2 * u, device=DEV).to(bdt)
        bias_up = torch.randn(u, device=DEV).to(bdt) if sep else None
    ref, g64, u64 = reference(xq, sx, w, sw, w_up, sw_up, bias, bias_up, c["act"], c["alpha"], group, first)
    base, which = baseline(xq, sx, w, sw, w_up, sw_up, bias, bias_up, c["act"], c["alpha"], group, first, odt)

    y_full = torch.full((m, u + c["pad_y"]), float("nan"), device=DEV, dtype=odt)
    y = y_full[:, :u]
    pre = torch.full((m, 2 * u), float("nan"), device=DEV) if c["preact"] else None
    got = gatedmlp.fp8_gate_up(xq, sx, w, sw, w_up=w_up, w_up_scale=sw_up, bias=bias, bias_up=bias_up, out=y,
                               preact=pre, activation=c["act"], group=None if sep else group, first=first,
                               alpha=c["alpha"])
    torch.cuda.synchronize()
    assert got is y
    ag, au = magnitudes(xq, sx, w, sw, w_up, sw_up, c["alpha"], group, first)
    assert_within_rule(y, base, ref, f"{_id(c)} against {which} + GLU", acc=(g64, u64, ag, au, k))
    if c["pad_y"]:
        assert torch.isnan(y_full[:, u:]).all(), "wrote outside out's columns"
    if pre is not None:
        assert torch.isfinite(pre).all()
        if sep:
            pre_ref = torch.cat([g64, u64], dim=1)
        else:
            gi, ui = fused_halves(u, group, first, DEV)
            pre_ref = torch.empty(m, 2 * u, device=DEV, dtype=torch.float64)
            pre_ref[:, gi], pre_ref[:, ui] = g64, u64
        # fp32 pre-activation: the accumulation's error only.
        if sep:
            a_ref = torch.cat([ag, au], dim=1)
        else:
            a_ref = torch.empty(m, 2 * u, device=DEV, dtype=torch.float64)
            a_ref[:, gi], a_ref[:, ui] = ag, au
        rel, _ = errors(pre, pre_ref)
        allow = (acc_allowance(k) * a_ref.norm() / pre_ref.norm().clamp_min(1e-300)).item()
        assert rel < 1e-5 + allow, f"preact rel err {rel:.3e} > 1e-5 + {allow:.3e}"


@on_hopper
def test_fp8_larger_shapes_and_default_out():
    """Several tiles and k-blocks (and the split tail where the workspace
    allows it), out allocated here (bf16 by default, out_dtype otherwise)."""
    for m, k, u in ((1000, 4096, 1000), (4097, 1024, 768), (128, 8192, 3)):
        xq, sx = gatedmlp.quantize_fp8(torch.randn(m, k, device=DEV), "row")
        w, sw = gatedmlp.quantize_fp8(torch.randn(2 * u, k, device=DEV) / k ** 0.5, "row")
        ref, g64, u64 = reference(xq, sx, w, sw)
        acc = (g64, u64, *magnitudes(xq, sx, w, sw, None, None, 1.0, 0, "gate"), k)
        y = gatedmlp.fp8_gate_up(xq, sx, w, sw)
        assert y.dtype == torch.bfloat16 and tuple(y.shape) == (m, u)
        base, which = baseline(xq, sx, w, sw, None, None, None, None, "silu", 1.0, 0, "gate", torch.bfloat16)
        assert_within_rule(y, base, ref, f"m{m}k{k}u{u} against {which}", acc=acc)
        y32 = gatedmlp.fp8_gate_up(xq, sx, w, sw, out_dtype=torch.float32)
        assert y32.dtype == torch.float32
        base32, _ = baseline(xq, sx, w, sw, None, None, None, None, "silu", 1.0, 0, "gate", torch.float32)
        assert_within_rule(y32, base32, ref, f"m{m}k{k}u{u} fp32 out", acc=acc)


@on_hopper
def test_fp8_block_larger_shapes():
    """Block scales over several tiles and many k-blocks (a partial last
    one; DeepSeek-V3's K = 7168), stacked and separate, against the rule."""
    for m, k, u, sep in ((1000, 7168, 512, False), (4097, 2064, 384, True), (129, 8208, 3, True),
                         (300, 1040, 1024, False)):
        x = torch.randn(m, k, device=DEV) * torch.logspace(-1, 1, k, device=DEV).reshape(1, k)
        xq, sx = gatedmlp.quantize_fp8(x, "block")
        rows = u if sep else 2 * u
        w, sw = gatedmlp.quantize_fp8(torch.randn(rows, k, device=DEV) / k ** 0.5, "block128")
        w_up = sw_up = None
        if sep:
            w_up, sw_up = gatedmlp.quantize_fp8(torch.randn(rows, k, device=DEV) / k ** 0.5, "block128")
        ref, g64, u64 = reference(xq, sx, w, sw, w_up, sw_up)
        acc = (g64, u64, *magnitudes(xq, sx, w, sw, w_up, sw_up, 1.0, 0, "gate"), k)
        y = gatedmlp.fp8_gate_up(xq, sx, w, sw, w_up=w_up, w_up_scale=sw_up)
        assert y.dtype == torch.bfloat16 and tuple(y.shape) == (m, u)
        base, which = baseline(xq, sx, w, sw, w_up, sw_up, None, None, "silu", 1.0, 0, "gate", torch.bfloat16)
        assert_within_rule(y, base, ref, f"block m{m}k{k}u{u} against {which}", acc=acc)
        y32 = gatedmlp.fp8_gate_up(xq, sx, w, sw, w_up=w_up, w_up_scale=sw_up, out_dtype=torch.float32)
        base32, _ = baseline(xq, sx, w, sw, w_up, sw_up, None, None, "silu", 1.0, 0, "gate", torch.float32)
        assert_within_rule(y32, base32, ref, f"block m{m}k{k}u{u} fp32 out", acc=acc)


@on_hopper
def test_fp8_block_fused_layout_refused():
    """Fused weights with 128 x 128 block scales whose interleave block is
    not a multiple of 128: fp8_gate_up refuses before allocating, and the
    binding itself (the C++ check) refuses with its message; nothing is
    written."""
    m, k = 64, 256
    xq, sx = gatedmlp.quantize_fp8(torch.randn(m, k, device=DEV), "block")
    stream = torch.cuda.current_stream().cuda_stream
    for u, group, cxx in ((96, 0, r"got u=96"), (256, 64, r"got group=64")):
        w, sw = gatedmlp.quantize_fp8(torch.randn(2 * u, k, device=DEV) / 16, "block128")
        with pytest.raises(gatedmlp.NotSupportedError, match=r"'w_scale' holds 128 x 128 block scales of fused 'w'.*"
                                                             r"must be a multiple of 128"):
            gatedmlp.fp8_gate_up(xq, sx, w, sw, group=group)
        out = torch.full((m, u), float("nan"), device=DEV, dtype=torch.bfloat16)
        with pytest.raises(gatedmlp.NotSupportedError,
                           match=r"FP8 weights with 128 x 128 block scales, fused: the interleave block "
                                 r"\(weights.group, or u when stacked\) must be a multiple of 128 .*" + cxx):
            C.gate_up(dl(xq), dl(w.view(torch.int32)), dl(out), scales=dl(sw), quant=fmt(128), x_scales=dl(sx),
                      group=group, stream=stream)
        torch.cuda.synchronize()
        assert torch.isnan(out).all(), "a refused call wrote out"
    # The same weights as separate gate and up tensors (any U) run.
    u = 96
    wg, sg = gatedmlp.quantize_fp8(torch.randn(u, k, device=DEV) / 16, "block128")
    wu, su = gatedmlp.quantize_fp8(torch.randn(u, k, device=DEV) / 16, "block128")
    y = gatedmlp.fp8_gate_up(xq, sx, wg, sg, w_up=wu, w_up_scale=su)
    ref, g64, u64 = reference(xq, sx, wg, sg, wu, su)
    base, which = baseline(xq, sx, wg, sg, wu, su, None, None, "silu", 1.0, 0, "gate", torch.bfloat16)
    acc = (g64, u64, *magnitudes(xq, sx, wg, sg, wu, su, 1.0, 0, "gate"), k)
    assert_within_rule(y, base, ref, f"separate u{u} against {which}", acc=acc)


@on_hopper
def test_torch_op_matches_the_call():
    """gatedmlp.torch.fp8_gate_up gives fp8_gate_up's bits, eager (the
    direct call) and through the gatedmlp::fp8_gate_up operator under
    torch.compile, for per-tensor and block scales."""
    import gatedmlp.torch as gt

    m, k, u = 200, 1024, 256
    for xg, wg in (("tensor", "tensor"), ("block", "block128")):
        xq, sx = gatedmlp.quantize_fp8(torch.randn(m, k, device=DEV), xg)
        w, sw = gatedmlp.quantize_fp8(torch.randn(2 * u, k, device=DEV) / k ** 0.5, wg)
        want = gatedmlp.fp8_gate_up(xq, sx, w, sw, activation="gelu_tanh")
        assert torch.equal(gt.fp8_gate_up(xq, sx, w, sw, activation="gelu_tanh"), want)

        def f(xq, sx, w, sw):
            return gt.fp8_gate_up(xq, sx, w, sw, activation="gelu_tanh")

        with torch.no_grad():
            got = torch.compile(f, fullgraph=True)(xq, sx, w, sw)
        assert torch.equal(got, want), f"{xg}: compiled call differs"


@on_hopper
def test_fp8_with_promotion(monkeypatch):
    """GATEDMLP_FP8_PROMOTE=1: calls without block scales take the
    promoting kernels too (plan() says so) and meet the rule; block-scaled
    calls promote regardless."""
    m, k, u = 300, 4096, 384
    xq, sx = gatedmlp.quantize_fp8(torch.randn(m, k, device=DEV), "tensor")
    w, sw = gatedmlp.quantize_fp8(torch.randn(2 * u, k, device=DEV) / k ** 0.5, "tensor")
    xr, sxr = gatedmlp.quantize_fp8(torch.randn(m, k, device=DEV), "row")
    wr, swr = gatedmlp.quantize_fp8(torch.randn(2 * u, k, device=DEV) / k ** 0.5, "row")
    xb, sxb = gatedmlp.quantize_fp8(torch.randn(m, k, device=DEV), "block")
    wb, swb = gatedmlp.quantize_fp8(torch.randn(2 * u, k, device=DEV) / k ** 0.5, "block128")

    def plan_reason(xq, sx, w, sw, row_block):
        p = C.make_problem(dl(xq), dl(w.view(torch.int32)), scales=dl(sw), quant=fmt(row_block), x_scales=dl(sx))
        return gatedmlp.plan(p).reason

    promoting = "in its own accumulator"
    fast = plan_reason(xq, sx, w, sw, 0)
    assert promoting not in fast, fast
    assert promoting in plan_reason(xb, sxb, wb, swb, 128)
    monkeypatch.setenv("GATEDMLP_FP8_PROMOTE", "1")
    assert promoting in plan_reason(xq, sx, w, sw, 0), plan_reason(xq, sx, w, sw, 0)
    for what, (xq_, sx_, w_, sw_) in (("per tensor", (xq, sx, w, sw)), ("row-wise", (xr, sxr, wr, swr)),
                                      ("block", (xb, sxb, wb, swb))):
        for odt in (torch.bfloat16, torch.float32):
            ref, g64, u64 = reference(xq_, sx_, w_, sw_)
            acc = (g64, u64, *magnitudes(xq_, sx_, w_, sw_, None, None, 1.0, 0, "gate"), k)
            y = gatedmlp.fp8_gate_up(xq_, sx_, w_, sw_, out_dtype=odt)
            base, which = baseline(xq_, sx_, w_, sw_, None, None, None, None, "silu", 1.0, 0, "gate", odt)
            assert_within_rule(y, base, ref, f"GATEDMLP_FP8_PROMOTE=1 {what} {odt} against {which}", acc=acc)
    monkeypatch.delenv("GATEDMLP_FP8_PROMOTE")
    assert plan_reason(xq, sx, w, sw, 0) == fast
    # The same per call: promote=True (Problem.fp8_promote).
    ref, g64, u64 = reference(xq, sx, w, sw)
    acc = (g64, u64, *magnitudes(xq, sx, w, sw, None, None, 1.0, 0, "gate"), k)
    y = gatedmlp.fp8_gate_up(xq, sx, w, sw, out_dtype=torch.float32, promote=True)
    base, which = baseline(xq, sx, w, sw, None, None, None, None, "silu", 1.0, 0, "gate", torch.float32)
    assert_within_rule(y, base, ref, f"promote=True per tensor against {which}", acc=acc)


@on_hopper
def test_fp8_m0_and_cuda_graph():
    k, u = 256, 96
    w, sw = gatedmlp.quantize_fp8(torch.randn(2 * u, k, device=DEV) / 16, "tensor")
    x0 = torch.empty(0, k, device=DEV, dtype=F8)
    y0 = gatedmlp.fp8_gate_up(x0, torch.ones(1, device=DEV), w, sw)
    assert tuple(y0.shape) == (0, u)
    # A CUDA graph replay gives the eager call's bits.
    xq, sx = gatedmlp.quantize_fp8(torch.randn(300, k, device=DEV), "row")
    eager = gatedmlp.fp8_gate_up(xq, sx, w, sw)
    out = torch.full_like(eager, float("nan"))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gatedmlp.fp8_gate_up(xq, sx, w, sw, out=out)  # warm-up: plan and workspace outside the capture
    torch.cuda.current_stream().wait_stream(s)
    out.fill_(float("nan"))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gatedmlp.fp8_gate_up(xq, sx, w, sw, out=out)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


@on_hopper
def test_fp8_binding_direct_and_plan():
    """The binding itself: x as float8_e4m3fn through DLPack and as its
    uint8 bytes with x_fp8=True give the same bits; plan() names the FP8
    path."""
    m, k, u = 200, 512, 160
    xq, sx = gatedmlp.quantize_fp8(torch.randn(m, k, device=DEV), "row")
    w, sw = gatedmlp.quantize_fp8(torch.randn(2 * u, k, device=DEV) / 16, "row")
    words = w.view(torch.int32)
    outs = []
    for xv, flag in ((xq, False), (xq.view(torch.uint8), True)):
        out = torch.full((m, u), float("nan"), device=DEV, dtype=torch.bfloat16)
        C.gate_up(dl(xv), dl(words), dl(out), scales=dl(sw), quant=fmt(1), x_scales=dl(sx), x_fp8=flag,
                  stream=torch.cuda.current_stream().cuda_stream)
        outs.append(out)
    torch.cuda.synchronize()
    assert torch.isfinite(outs[0]).all() and torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0], gatedmlp.fp8_gate_up(xq, sx, w, sw))
    p = C.make_problem(dl(xq), dl(words), dl(outs[0]), scales=dl(sw), quant=fmt(1), x_scales=dl(sx))
    cfg = gatedmlp.plan(p)
    assert cfg.path == gatedmlp.KernelPath.sm90_wgmma and "FP8" in cfg.reason, cfg


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA or HOPPER, reason="needs a CUDA device that is not sm_90")
def test_fp8_not_supported_off_hopper():
    xq, sx = gatedmlp.quantize_fp8(torch.randn(16, 64, device=DEV))
    w, sw = gatedmlp.quantize_fp8(torch.randn(64, 64, device=DEV))
    with pytest.raises(gatedmlp.NotSupportedError, match=r"FP8 activations"):
        gatedmlp.fp8_gate_up(xq, sx, w, sw)


def _e4m3_spacing(t):
    """The spacing of e4m3fn values at magnitudes t (<= 448): 2^(e - 3) in
    [2^e, 2^(e + 1)), 2^-9 below 2^-6."""
    e = torch.floor(torch.log2(t.clamp(2.0 ** -6, 448.0)))
    return torch.exp2(e - 3)


@on_hopper
@pytest.mark.parametrize("grans", [("tensor", "tensor"), ("row", "row"), ("block", "block128")])
@pytest.mark.parametrize("layout", ["row", "mn"])
def test_fp8_output(grans, layout):
    """An FP8 Y: each 1 x 128 group's scale is its amax / 448 (the amax, if
    asked, exactly fp32(max |y|) / 448's largest scale), and every value
    times its scale within one e4m3 step of the same call's bf16 Y (plus
    the bf16 Y's own rounding), on stacked and separate weights, U a
    multiple of 128 and not (the last group partial; U % 16 != 0: Y
    stored without TMA), several tiles, with a pre-activation."""
    torch.manual_seed(SEED)
    for m, k, u, sep in ((300, 1024, 640, False), (129, 272, 200, True), (1, 128, 72, True), (2048, 512, 130, False)):
        uu = u if sep or grans[1] != "block128" else 128 * nblk(u)
        xq, sx = gatedmlp.quantize_fp8(torch.randn(m, k, device=DEV), grans[0])
        rows = uu if sep else 2 * uu
        w, sw = gatedmlp.quantize_fp8(torch.randn(rows, k, device=DEV) / k ** 0.5, grans[1])
        wu, su = (gatedmlp.quantize_fp8(torch.randn(rows, k, device=DEV) / k ** 0.5, grans[1]) if sep
                  else (None, None))
        kw = dict(w_up=wu, w_up_scale=su, activation="gelu_tanh")
        yb = gatedmlp.fp8_gate_up(xq, sx, w, sw, **kw).float()
        pre = torch.full((m, 2 * uu), float("nan"), device=DEV, dtype=torch.bfloat16)
        y8, ys, amax = gatedmlp.fp8_gate_up(xq, sx, w, sw, out_dtype=F8, y_scale_layout=layout, amax=True,
                                            preact=pre, **kw)
        torch.cuda.synchronize()
        assert not pre.isnan().any(), "the pre-activation was not written"
        g = nblk(uu)
        assert tuple(ys.shape) == (m, g) and ys.stride() == ((g, 1) if layout == "row" else (1, -(-m // 4) * 4))
        assert torch.isfinite(ys).all() and (ys > 0).all()
        q = y8.float()
        assert torch.isfinite(q).all()
        s_full = ys.repeat_interleave(128, dim=1)[:, :uu]
        deq = q * s_full
        # The scales: amax / 448 of the bf16 Y's groups (its rounding: 2^-8).
        pad = torch.zeros(m, g * 128, device=DEV)
        pad[:, :uu] = yb.abs()
        ref_amax = pad.reshape(m, g, 128).amax(dim=2)
        assert torch.allclose(ys * 448, ref_amax.clamp_min(1e-10), rtol=2 ** -7, atol=1e-6)
        # amax times fp32(1 / 448) is the largest scale, to the bit.
        assert (amax.float() * torch.tensor(1 / 448, dtype=torch.float32, device=DEV)).item() == ys.max().item()
        assert abs(amax.item() - yb.abs().max().item()) <= 2 ** -7 * amax.item()
        t = torch.maximum(q.abs(), yb.abs() / s_full)
        bound = _e4m3_spacing(t) * s_full + 2 ** -8 * yb.abs() + 1e-6
        bad = (deq - yb).abs() > bound
        assert not bad.any(), (f"m{m} u{u}: {int(bad.sum())} values more than one e4m3 step from the bf16 Y, e.g. "
                               f"{deq[bad][:4].tolist()} vs {yb[bad][:4].tolist()}")


@on_hopper
def test_fp8_output_feeds_blockwise_scaled_mm():
    """The FP8 Y with MN-major scales (M a multiple of 4) is what cuBLASLt's
    blockwise torch._scaled_mm reads as its 1 x 128 scaled A: a down
    projection from it matches the bf16 Y's within FP8's error. Skipped
    where this torch / GPU has no blockwise _scaled_mm."""
    torch.manual_seed(SEED)
    m, k, u, n = 256, 1024, 512, 384
    xq, sx = gatedmlp.quantize_fp8(torch.randn(m, k, device=DEV), "block")
    w, sw = gatedmlp.quantize_fp8(torch.randn(2 * u, k, device=DEV) / k ** 0.5, "block128")
    yb = gatedmlp.fp8_gate_up(xq, sx, w, sw)
    y8, ys = gatedmlp.fp8_gate_up(xq, sx, w, sw, out_dtype=F8, y_scale_layout="mn")
    wd, sd = gatedmlp.quantize_fp8(torch.randn(n, u, device=DEV) / u ** 0.5, "block128")
    ref = yb.double() @ deq_w(wd, sd).T
    try:
        got = torch._scaled_mm(y8, wd.t(), scale_a=ys, scale_b=sd.float().contiguous().t(), out_dtype=torch.bfloat16)
    except (RuntimeError, TypeError) as ex:
        pytest.skip(f"no blockwise torch._scaled_mm here: {str(ex).splitlines()[0][:200]}")
    rel = ((got.double() - ref).norm() / ref.norm()).item()
    assert rel < 3e-2, f"down projection from the FP8 Y: relative error {rel:.3e}"


@on_hopper
def test_torch_op_fp8_y_matches_the_call():
    """gatedmlp.torch.fp8_gate_up with an FP8 Y gives fp8_gate_up's bits
    (y, scales, amax), eager and through the gatedmlp::fp8_gate_up_fp8
    operator under torch.compile, for both scale layouts."""
    import gatedmlp.torch as gt

    m, k, u = 200, 1024, 300
    xq, sx = gatedmlp.quantize_fp8(torch.randn(m, k, device=DEV), "block")
    w, sw = gatedmlp.quantize_fp8(torch.randn(2 * u, k, device=DEV) / k ** 0.5, "tensor")
    for layout in ("row", "mn"):
        want = gatedmlp.fp8_gate_up(xq, sx, w, sw, out_dtype=F8, y_scale_layout=layout, amax=True)
        got = gt.fp8_gate_up(xq, sx, w, sw, out_dtype=F8, y_scale_layout=layout, amax=True)

        def f(xq, sx, w, sw, layout=layout):
            return gt.fp8_gate_up(xq, sx, w, sw, out_dtype=F8, y_scale_layout=layout, amax=True)

        with torch.no_grad():
            compiled = torch.compile(f, fullgraph=True)(xq, sx, w, sw)
        for g in (got, compiled):
            assert torch.equal(g[0].view(torch.uint8), want[0].view(torch.uint8)), f"{layout}: y differs"
            assert g[1].stride() == want[1].stride() and torch.equal(g[1], want[1]), f"{layout}: scales differ"
            assert torch.equal(g[2].reshape(()), want[2].reshape(())), f"{layout}: amax differs"
