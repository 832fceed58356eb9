"""gatedmlp.quantize / dequantize against MLX itself (the mlx package, CPU
backend): the packed words, scales and biases must be bit-identical to
mlx.core.quantize for every bits x group size, fp32 and fp16 (NumPy) and bf16
(PyTorch), odd shapes and the groups MLX treats specially; MXFP4 likewise,
and its dequantization against transformers' own for gpt-oss checkpoints."""
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
    # q * scale + bias rounded once to fp32 (a fused multiply-add: the
    # weights the kernels multiply with), then to dtype. q * scale is exact
    # in float64, so float64's sum rounded to fp32 is the FMA's result.
    q = np.stack([(wq >> (bits * i)) & ((1 << bits) - 1) for i in range(32 // bits)], -1).reshape(w.shape)
    want = (q.astype(np.float64) * np.repeat(s, 64, -1).astype(np.float64)
            + np.repeat(b, 64, -1).astype(np.float64)).astype(np.float32).astype(dtype)
    _same_bits(ours, want, "dequantize")
    # MLX's own rounds after the multiply and after the add, in the scales'
    # dtype (checked here, so that the difference is known, not guessed):
    # in fp32 ours differs by at most its two roundings (an ulp of q * scale
    # and one of the sum); in fp16 that two-step rounding.
    theirs = np.array(mx.dequantize(mx.array(wq), mx.array(s), mx.array(b), group_size=64, bits=bits))
    if dtype == np.float32:
        two_step = q.astype(np.float32) * np.repeat(s, 64, -1) + np.repeat(b, 64, -1)
        _same_bits(theirs, two_step, "MLX's fp32 dequantize, two roundings")
        product = q.astype(np.float32) * np.repeat(s, 64, -1)
        assert (np.abs(ours - theirs) <= np.spacing(np.abs(product)) + np.spacing(np.abs(theirs))).all()
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
    with pytest.raises(gatedmlp.NotSupportedError, match="nvfp4"):
        gatedmlp.quantize(w, mode="nvfp4")
    with pytest.raises(gatedmlp.NotSupportedError, match="mxfp4 takes bits=4 and group_size=32"):
        gatedmlp.quantize(w, group_size=64, mode="mxfp4")
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


# ---------------------------------------------------------------- MXFP4
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_mxfp4_is_mlx_bit_for_bit(dtype):
    rng = np.random.default_rng(SEED + 23)
    for shape in [(7, 96), (3, 4, 256), (40, 32)]:
        w = (rng.standard_normal(shape) * rng.uniform(1e-3, 1e3, (*shape[:-1], 1))).astype(dtype)
        flat = w.reshape(-1, shape[-1])
        flat[0, :32] = 0.0                                                # all zero: scale 2^0
        flat[1, :32] = 6.0                                                # the largest value exactly
        flat[2, :32] = np.tile([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], 4)  # every tie
        flat[2, 8:16] *= -1
        flat[3, :32] = -0.01 * np.arange(32) / 32.0                       # values that round to +0
        ours = gatedmlp.quantize(w, mode="mxfp4")
        theirs = mx.quantize(mx.array(w), mode="mxfp4")
        assert len(ours) == len(theirs) == 2
        for a, b, name in zip(ours, theirs, ("wq", "scales")):
            _same_bits(a, np.array(b), f"mxfp4 {name} {np.dtype(dtype).name} shape={shape}")
        back = gatedmlp.dequantize(*ours, mode="mxfp4", dtype=np.float32)
        mlx_back = np.array(mx.dequantize(*theirs, mode="mxfp4").astype(mx.float32))
        _same_bits(back, mlx_back, f"mxfp4 dequantize {shape}")


def test_mxfp4_bf16_torch_is_mlx_bit_for_bit():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(SEED + 29)
    w = torch.from_numpy((rng.standard_normal((5, 128)) * 7).astype(np.float32)).to(torch.bfloat16)
    wq, scales = gatedmlp.quantize(w, mode="mxfp4")
    assert wq.dtype == torch.uint32 and scales.dtype == torch.uint8
    mq, ms = mx.quantize(mx.array(w.float().numpy()).astype(mx.bfloat16), mode="mxfp4")
    _same_bits(wq.view(torch.int32).numpy().view(np.uint32), np.array(mq), "mxfp4 wq bf16")
    _same_bits(scales.numpy(), np.array(ms), "mxfp4 scales bf16")
    back = gatedmlp.dequantize(wq, scales, mode="mxfp4")
    assert back.dtype == torch.bfloat16
    _same_bits(back.float().numpy(), np.array(mx.dequantize(mq, ms, mode="mxfp4").astype(mx.float32)),
               "mxfp4 dequantize bf16")


def test_mxfp4_reads_gpt_oss_checkpoint_arrays():
    # gpt-oss ships each expert matrix as *_blocks uint8 [E, N, K / 32, 16]
    # (two e2m1 values a byte, the even one in the low nibble) and *_scales
    # uint8 [E, N, K / 32]; transformers dequantizes them for its forward
    # (and transposes to [E, K, N]). The blocks are our words' bytes.
    torch = pytest.importorskip("torch")
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    g = torch.Generator().manual_seed(SEED)
    E, N, G = 3, 10, 6
    blocks = torch.randint(0, 256, (E, N, G, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(110, 140, (E, N, G), dtype=torch.uint8, generator=g)
    want = mxfp4.convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16).transpose(1, 2)  # [E, N, K]
    wq = blocks.reshape(E, N, G * 16).view(torch.int32).view(torch.uint32)
    ours = gatedmlp.dequantize(wq, scales, mode="mxfp4")
    assert ours.shape == want.shape == (E, N, G * 32)
    assert torch.equal(ours, want), f"{(ours != want).sum().item()} values differ from transformers' (seed {SEED})"


def test_mxfp4_errors():
    w = np.ones((2, 64), np.float32)
    wq, scales = gatedmlp.quantize(w, mode="mxfp4")
    with pytest.raises(gatedmlp.InvalidArgumentError, match="mxfp4 has no biases"):
        gatedmlp.dequantize(wq, scales, scales, mode="mxfp4", dtype=np.float32)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'scales' must be uint8"):
        gatedmlp.dequantize(wq, scales.astype(np.float32), mode="mxfp4", dtype=np.float32)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="bfloat16"):
        gatedmlp.dequantize(wq, scales, mode="mxfp4")

