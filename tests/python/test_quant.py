"""gatedmlp.quantize / dequantize against MLX itself (the mlx package, CPU
backend): the packed words, scales and biases must be bit-identical to
mlx.core.quantize for every bits x group size, fp32 and fp16 (NumPy) and bf16
(PyTorch), odd shapes and the groups MLX treats specially."""
import random

import numpy as np
import pytest

import gatedmlp

mx = pytest.importorskip("mlx.core")

SEED = random.randrange(1 << 30)


def _special_rows(w, g):
    w = w.reshape(-1, w.shape[-1])  # a view: every row of every batch
    if w.shape[0] < 5:
        return
    w[0, :g] = 0.5                 # a constant group: the scale's 1e-7 floor
    w[1, :g] = 0.0                 # all zeros: the edge rounds to q0 = 0
    w[2, g:2 * g] = np.abs(w[2, g:2 * g])    # all positive: the max is the edge
    w[3, g:2 * g] = -np.abs(w[3, g:2 * g])   # all negative: the min is the edge
    w[4, :g] = np.linspace(-1, 1, g)         # symmetric: |min| == |max|


def _random(rng, shape, dtype, group=64):
    scale = float(rng.choice([1e-3, 0.05, 1.0, 30.0]))
    w = (rng.standard_normal(shape) * scale).astype(dtype)
    _special_rows(w, group)
    return w


def _same_bits(a, b, what):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{a.shape} vs MLX {b.dtype}{b.shape}"
    diff = np.nonzero(a.view(np.uint8).ravel() != b.view(np.uint8).ravel())[0]
    assert diff.size == 0, f"{what}: {diff.size} bytes differ from MLX's (seed {SEED})"


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_quantize_is_mlx_bit_for_bit(dtype, bits, group):
    rng = np.random.default_rng(SEED + bits * 1000 + group)
    for shape in [(7, 3 * group), (2, 5, 2 * group), (33, group * 4)]:
        w = _random(rng, shape, dtype, group)
        ours = gatedmlp.quantize(w, group_size=group, bits=bits)
        theirs = mx.quantize(mx.array(w), group_size=group, bits=bits)
        for a, b, name in zip(ours, theirs, ("wq", "scales", "biases")):
            _same_bits(a, np.array(b), f"{name} {np.dtype(dtype).name} bits={bits} group={group} shape={shape}")


@pytest.mark.parametrize("bits", [4, 8])
def test_bf16_torch_is_mlx_bit_for_bit(bits):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(SEED + 7)
    w32 = _random(rng, (9, 256), np.float32, 64)
    w = torch.from_numpy(w32).to(torch.bfloat16)
    wq, scales, biases = gatedmlp.quantize(w, group_size=64, bits=bits)
    assert wq.dtype == torch.uint32 and scales.dtype == torch.bfloat16 and biases.dtype == torch.bfloat16
    # The bf16 values exactly, through float32 on both sides.
    mq, ms, mb = mx.quantize(mx.array(w.float().numpy()).astype(mx.bfloat16), group_size=64, bits=bits)
    _same_bits(wq.view(torch.int32).numpy().view(np.uint32), np.array(mq), "wq bf16")
    _same_bits(scales.float().numpy(), np.array(ms.astype(mx.float32)), "scales bf16")
    _same_bits(biases.float().numpy(), np.array(mb.astype(mx.float32)), "biases bf16")
    back = gatedmlp.dequantize(wq, scales, biases, group_size=64, bits=bits)
    assert back.dtype == torch.bfloat16 and back.shape == w.shape


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("bits", [4, 8])
def test_dequantize(dtype, bits):
    rng = np.random.default_rng(SEED + 11)
    w = _random(rng, (13, 192), dtype, 64)
    wq, s, b = gatedmlp.quantize(w, group_size=64, bits=bits)
    ours = gatedmlp.dequantize(wq, s, b, group_size=64, bits=bits)
    # q * scale + bias in fp32, rounded once.
    q = np.stack([(wq >> (bits * i)) & ((1 << bits) - 1) for i in range(32 // bits)], -1).reshape(w.shape)
    want = (q.astype(np.float32) * np.repeat(s, 64, -1).astype(np.float32)
            + np.repeat(b, 64, -1).astype(np.float32)).astype(dtype)
    _same_bits(ours, want, "dequantize")
    # MLX's own rounds after the multiply and after the add, in the scales'
    # dtype: the same as ours in fp32; in fp16 it is that two-step rounding
    # (checked here, so that the difference is known, not guessed), which
    # ours, rounding once as the kernels do, does not copy.
    theirs = np.array(mx.dequantize(mx.array(wq), mx.array(s), mx.array(b), group_size=64, bits=bits))
    if dtype == np.float32:
        _same_bits(ours, theirs, "dequantize vs MLX (fp32)")
    else:
        two_step = (q.astype(np.float16) * np.repeat(s, 64, -1)).astype(np.float16) + np.repeat(b, 64, -1)
        _same_bits(theirs, two_step.astype(np.float16), "MLX's fp16 dequantize, two roundings")


def test_torch_keeps_the_framework_and_shapes():
    torch = pytest.importorskip("torch")
    w = torch.randn(3, 4, 128, dtype=torch.float16)
    wq, s, b = gatedmlp.quantize(w, group_size=32, bits=8)
    assert wq.shape == (3, 4, 32) and s.shape == (3, 4, 4) and b.shape == (3, 4, 4) and s.dtype == torch.float16
    back = gatedmlp.dequantize(wq, s, b, group_size=32, bits=8, dtype=torch.float32)
    assert back.shape == w.shape and back.dtype == torch.float32
    # Half a step, or up to a step and a half at a grid that stops short of
    # the far end (it is anchored at the edge of larger magnitude).
    assert (back - w.float()).abs().max() <= s.float().abs().max() * 2


def test_errors_name_the_argument():
    w = np.zeros((4, 96), np.float32)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="k=96.*group_size=64"):
        gatedmlp.quantize(w)
    with pytest.raises(gatedmlp.NotSupportedError, match="bits=3"):
        gatedmlp.quantize(w, group_size=32, bits=3)
    with pytest.raises(gatedmlp.NotSupportedError, match="group_size=48"):
        gatedmlp.quantize(w, group_size=48)
    with pytest.raises(gatedmlp.NotSupportedError, match="mxfp4"):
        gatedmlp.quantize(w, group_size=32, mode="mxfp4")
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'nf4'"):
        gatedmlp.quantize(w, group_size=32, mode="nf4")
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'w' has dtype int32"):
        gatedmlp.quantize(np.zeros((2, 64), np.int32))
    wq, s, b = gatedmlp.quantize(np.ones((4, 64), np.float32))
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'scales' must have shape \\(4, 1\\)"):
        gatedmlp.dequantize(wq, s[:2], b)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'biases'"):
        gatedmlp.dequantize(wq, s, b.astype(np.float16))
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'wq' must be uint32"):
        gatedmlp.dequantize(wq.view(np.int32), s, b)


def test_empty_rows():
    wq, s, b = gatedmlp.quantize(np.zeros((0, 64), np.float32))
    assert wq.shape == (0, 8) and s.shape == (0, 1)
    assert gatedmlp.dequantize(wq, s, b).shape == (0, 64)
