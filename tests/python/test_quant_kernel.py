"""The quantized gate/up kernel from Python, on the GPU, against the real
thing: MLX's own quantized_matmul on its CPU backend, from the same packed
arrays (gatedmlp.quantize gives MLX's bits; test_quant.py checks that), for
the gate and the up rows, then the GLU in float64 (skipped without the mlx
package). Then the torch operator against the functional call. Skipped
without a CUDA device."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gatedmlp  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

FORMATS = [("affine", 4, 64), ("affine", 4, 32), ("affine", 4, 128), ("affine", 8, 64), ("affine", 8, 32),
           ("mxfp4", 4, 32)]


def cosine(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def mlx_matmul(x32, wq, scales, biases, group_size, bits, mode):
    """x32 @ dequant(wq)^T by mlx.core.quantized_matmul on the CPU, in float64."""
    mx = pytest.importorskip("mlx.core")
    with mx.stream(mx.cpu):
        args = dict(transpose=True, group_size=group_size, bits=bits, mode=mode)
        out = mx.quantized_matmul(mx.array(x32), mx.array(wq), mx.array(scales),
                                  None if biases is None else mx.array(biases), **args)
        return np.array(out.astype(mx.float32), dtype=np.float64)


@pytest.mark.parametrize("mode,bits,group", FORMATS)
@pytest.mark.parametrize("m", [1, 5, 16, 33, 64, 100])
@pytest.mark.parametrize("scale_dtype", ["float32", "bfloat16"])
def test_matches_mlx_quantized_matmul(mode, bits, group, m, scale_dtype):
    """With bf16 scales and biases (a bf16 model's own) the affine formats at
    M 17-128 run on the kernel's Hopper form on an H100 / H200; MLX gets the
    same values in fp32."""
    if scale_dtype == "bfloat16" and mode != "affine":
        pytest.skip("e8m0 scales have one dtype")
    rng = np.random.default_rng()
    k, u = 512, 96
    # Weights in fp32: MLX quantizes them with fp32 scales and biases.
    w = (rng.standard_normal((2 * u, k)) * 0.05).astype(np.float32)
    parts = gatedmlp.quantize(w, group_size=group, bits=bits, mode=mode)
    wq, scales = parts[0], parts[1]
    biases = parts[2] if mode == "affine" else None
    if scale_dtype == "bfloat16":  # rounded to bf16 for both, MLX reading them as fp32
        as_bf16 = lambda a: torch.from_numpy(a).to(torch.bfloat16)  # noqa: E731
        scales_t, biases_t = as_bf16(scales), as_bf16(biases)
        scales, biases = scales_t.float().numpy(), biases_t.float().numpy()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    x32 = x.float().cpu().numpy()  # exact: the same inputs for both
    g = mlx_matmul(x32, wq[:u], scales[:u], None if biases is None else biases[:u], group, bits, mode)
    up = mlx_matmul(x32, wq[u:], scales[u:], None if biases is None else biases[u:], group, bits, mode)
    want = g / (1 + np.exp(-g)) * up

    dev = lambda a: None if a is None else torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    s_dev, b_dev = dev(scales), dev(biases)
    if scale_dtype == "bfloat16":
        s_dev, b_dev = scales_t.cuda(), biases_t.cuda()
    y = gatedmlp.quantized_gate_up(x, dev(wq.view(np.int32)), s_dev, b_dev, group_size=group,
                                   bits=bits, mode=mode, out=torch.empty(m, u, device="cuda", dtype=torch.float32))
    got = y.cpu().numpy()
    assert np.isfinite(got).all()
    c = cosine(got, want)
    assert c >= 0.99999, f"cosine {c} against MLX ({mode}, bits={bits}, group={group}, m={m})"


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("m", [1, 9, 16])
def test_tiled_matches_mlx_quantized_matmul(group, m):
    """The tiled kernels (gate/up and the down projection) against MLX's
    quantized_matmul on the checkpoint's arrays they were tiled from, bf16
    scales and biases (the tiled kernels' own: x's dtype) read by MLX as
    fp32. K = 704 / 640: a padded k-block."""
    rng = np.random.default_rng()
    k, u, hdim = (704 if group < 128 else 640), 96, 64
    as_bf16 = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(torch.bfloat16)  # noqa: E731
    wq, s, b = gatedmlp.quantize((rng.standard_normal((2 * u, k)) * 0.05).astype(np.float32), group_size=group)
    s_t, b_t = as_bf16(s), as_bf16(b)
    s, b = s_t.float().numpy(), b_t.float().numpy()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    x32 = x.float().cpu().numpy()
    g = mlx_matmul(x32, wq[:u], s[:u], b[:u], group, 4, "affine")
    up = mlx_matmul(x32, wq[u:], s[u:], b[u:], group, 4, "affine")
    tw, tsb = gatedmlp.tile(torch.from_numpy(wq).cuda(), s_t.cuda(), b_t.cuda(), group_size=group)
    got = gatedmlp.quantized_gate_up(x, tw, tsb, group_size=group, tiled=True)
    c = cosine(got.float().cpu().numpy(), g / (1 + np.exp(-g)) * up)
    assert c >= 0.99999, f"gate/up: cosine {c} against MLX (group={group}, m={m})"
    # The down projection [H, K], its rows tiled as they are.
    dq, ds, db = gatedmlp.quantize((rng.standard_normal((hdim, k)) * 0.05).astype(np.float32), group_size=group)
    ds_t, db_t = as_bf16(ds), as_bf16(db)
    want = mlx_matmul(x32, dq, ds_t.float().numpy(), db_t.float().numpy(), group, 4, "affine")
    td, tds = gatedmlp.tile(torch.from_numpy(dq).cuda(), ds_t.cuda(), db_t.cuda(), group_size=group, down=True)
    got = gatedmlp.quantized_down(x, td, tds, group_size=group, tiled=True)
    c = cosine(got.float().cpu().numpy(), want)
    assert c >= 0.99999, f"down: cosine {c} against MLX (group={group}, m={m})"


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("m", [1, 5, 16, 40])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tiled_matches_the_checkpoint_order(group, m, dtype):
    # tile() on the device against the checkpoint's arrays of the same
    # weights: up to 16 rows the tiled kernels run the checkpoint kernel's
    # sums in its order (Y bit-identical); past them both are dequantized
    # or read by other kernels, so close. K = 704 / 640: a padded k-block.
    rng = np.random.default_rng()
    k, u = (704 if group < 128 else 640), 8 * int(rng.integers(3, 40))
    w = (rng.standard_normal((2 * u, k)) * 0.05).astype(np.float32)
    wq, scales, biases = (torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in gatedmlp.quantize(w, group_size=group))
    scales, biases = scales.to(dtype), biases.to(dtype)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    tw, tsb = gatedmlp.tile(wq, scales, biases, group_size=group)  # stacked -> tiled
    want = gatedmlp.quantized_gate_up(x, wq, scales, biases, group_size=group)
    got = gatedmlp.quantized_gate_up(x, tw, tsb, group_size=group, tiled=True)
    if m <= 16:
        assert torch.equal(got, want), (got - want).abs().max()
    else:
        assert cosine(got.float().cpu().numpy(), want.float().cpu().numpy()) >= 0.99999
    # The PyTorch operator on the same arrays, called directly and through the dispatcher.
    import gatedmlp.torch as gt
    assert torch.equal(gt.quantized_gate_up(x, tw, tsb, group_size=group, tiled=True), got)
    op = torch.ops.gatedmlp.quantized_gate_up(x, tw, tsb, None, None, None, None, None, None, "affine_tiled", 4, group,
                                              1, "silu", 1.702, 7.0, 8, "gate", 1.0, None)
    assert torch.equal(op, got)
    back = gatedmlp.tile(tw, tsb, group_size=group, inverse=True, k=k)
    assert all(torch.equal(a, b) for a, b in zip(back, (wq, scales, biases)))


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("m", [1, 5, 16, 40])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_tiled_down_and_mlp_match_the_checkpoint_order(group, m, dtype):
    # The down projection on tile(down=True)'s arrays against the
    # checkpoint's arrays of the same weights (the two kernels split K over
    # their warps differently, so close, not bit-identical), the GLU fused
    # into its input, and the whole MLP with both weights tiled.
    rng = np.random.default_rng()
    k, hdim = (704 if group < 128 else 640), 16 * int(rng.integers(2, 20))
    dev = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    wq, s, b = (dev(a) for a in gatedmlp.quantize((rng.standard_normal((hdim, k)) * 0.05).astype(np.float32),
                                                  group_size=group))
    s, b = s.to(dtype), b.to(dtype)
    tw, tsb = gatedmlp.tile(wq, s, b, group_size=group, down=True)
    h, up = (torch.randn(m, k, device="cuda", dtype=dtype) for _ in range(2))

    def close(got, want):
        assert torch.isfinite(got).all()
        assert cosine(got.float().cpu().numpy(), want.float().cpu().numpy()) >= 0.99999
        assert (got.float() - want.float()).abs().max() <= 0.02 * want.float().abs().max()

    want = gatedmlp.quantized_down(h, wq, s, b, group_size=group)
    got = gatedmlp.quantized_down(h, tw, tsb, group_size=group, tiled=True)
    close(got, want)
    close(gatedmlp.quantized_down(h, tw, tsb, up=up, group_size=group, tiled=True),
          gatedmlp.quantized_down(h, wq, s, b, up=up, group_size=group))
    import gatedmlp.torch as gt
    assert torch.equal(gt.quantized_down(h, tw, tsb, group_size=group, tiled=True), got)
    op = torch.ops.gatedmlp.quantized_down(h, tw, tsb, None, None, None, "affine_tiled", 4, group, 1, "silu", 1.702,
                                           7.0, 1.0, None)
    assert torch.equal(op, got)
    # The whole MLP: gate/up [2U, K] and down [H, U] tiled (U whole groups).
    u = group * int(rng.integers(1, 4))
    gq, gs, gb = (dev(a) for a in gatedmlp.quantize((rng.standard_normal((2 * u, k)) * 0.05).astype(np.float32),
                                                    group_size=group))
    dq, ds, db = (dev(a) for a in gatedmlp.quantize((rng.standard_normal((hdim, u)) * 0.05).astype(np.float32),
                                                    group_size=group))
    gs, gb, ds, db = (t.to(dtype) for t in (gs, gb, ds, db))
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    want = gatedmlp.quantized_mlp(x, gq, gs, gb, wq_down=dq, scales_down=ds, biases_down=db, group_size=group)
    tg, tgs = gatedmlp.tile(gq, gs, gb, group_size=group)
    td, tds = gatedmlp.tile(dq, ds, db, group_size=group, down=True)
    got = gatedmlp.quantized_mlp(x, tg, tgs, wq_down=td, scales_down=tds, group_size=group, tiled=True)
    close(got, want)
    assert torch.equal(gt.quantized_mlp(x, tg, tgs, wq_down=td, scales_down=tds, group_size=group, tiled=True), got)


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("m", [1, 9, 64, 100])
def test_repacked_matches_mlx_quantized_matmul(group, m):
    # MLX's own words repacked on the device (gatedmlp.repack), against MLX
    # on the checkpoint's order. K = 704 (groups of 32, 64): 5.5 chunks of
    # 128, the last padded; groups of 128 divide K, so K = 640, unpadded.
    rng = np.random.default_rng()
    k, u = (704 if group < 128 else 640), 72
    chunks = -(-k // 128)
    w = (rng.standard_normal((2 * u, k)) * 0.05).astype(np.float32)
    wq, scales, biases = gatedmlp.quantize(w, group_size=group)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    dev = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    # Without mlx too: the device repack's round trip and a refusal.
    packed = gatedmlp.repack(dev(wq), group_size=group)
    assert packed.shape == (2 * u, chunks * 16)
    assert np.array_equal(gatedmlp.repack(packed, k, group, inverse=True).cpu().numpy(), wq)
    # Words of the wrong width refused by name: the checkpoint's where the
    # padding makes them narrower, else a row cut short.
    wrong = dev(wq if k % 128 else wq[:, :64])
    want_shape = rf"'w' must be \[rows, ceil\(K / 128\) \* 16\] = \(144, {chunks * 16}\)"
    with pytest.raises(gatedmlp.InvalidArgumentError, match=want_shape):
        gatedmlp.quantized_gate_up(x, wrong, dev(scales), dev(biases), group_size=group, repacked=True)
    x32 = x.float().cpu().numpy()
    g = mlx_matmul(x32, wq[:u], scales[:u], biases[:u], group, 4, "affine")
    up = mlx_matmul(x32, wq[u:], scales[u:], biases[u:], group, 4, "affine")
    want = g / (1 + np.exp(-g)) * up
    y = gatedmlp.quantized_gate_up(x, packed, dev(scales), dev(biases), group_size=group, repacked=True,
                                   out=torch.empty(m, u, device="cuda", dtype=torch.float32))
    c = cosine(y.cpu().numpy(), want)
    assert c >= 0.99999, f"cosine {c} against MLX (repacked, group={group}, m={m})"


def test_refusals_name_the_argument():
    x = torch.randn(1, 256, device="cuda", dtype=torch.bfloat16)
    w = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    wq, s, b = gatedmlp.quantize(w)
    to = lambda a: torch.from_numpy(a).cuda()  # noqa: E731
    with pytest.raises(gatedmlp.InvalidArgumentError, match="scales"):
        gatedmlp.quantized_gate_up(x, to(wq.view(np.int32)), to(s[:, :2].copy()), to(b))
    with pytest.raises(gatedmlp.InvalidArgumentError, match="biases"):
        gatedmlp.quantized_gate_up(x, to(wq.view(np.int32)), to(s), None)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="k=250|K = 250|250"):
        gatedmlp.quantized_gate_up(x[:, :250], to(wq.view(np.int32)), to(s), to(b))


@pytest.mark.parametrize("m", [1, 16, 80])
def test_torch_op_matches_the_functional_call(m):
    import gatedmlp.torch as gt

    rng = np.random.default_rng()
    k, u = 256, 40
    w = (rng.standard_normal((2 * u, k)) * 0.05).astype(np.float32)
    wq, s, b = (torch.from_numpy(a).cuda() for a in gatedmlp.quantize(w, group_size=32, bits=4))
    s, b = s.to(torch.bfloat16), b.to(torch.bfloat16)
    wq = wq.view(torch.int32) if wq.dtype != torch.int32 else wq
    x = torch.randn(2, m, k, device="cuda", dtype=torch.bfloat16)
    want = gatedmlp.quantized_gate_up(x.reshape(-1, k), wq, s, b, group_size=32, activation="gelu_tanh")
    got = gt.quantized_gate_up(x, wq, s, b, group_size=32, activation="gelu_tanh")
    assert got.shape == (2, m, u)
    assert torch.equal(got.reshape(-1, u), want)
    compiled = torch.compile(lambda x: gt.quantized_gate_up(x, wq, s, b, group_size=32, activation="gelu_tanh"),
                             backend="eager", fullgraph=True)
    assert torch.equal(compiled(x).reshape(-1, u), want)


@pytest.mark.parametrize("row_block,group_size", [(128, 128), (1, 0), (0, 0)])
@pytest.mark.parametrize("m", [1, 16, 40, 70])
@pytest.mark.parametrize("k", [384, 512])
def test_fp8_weights_match_torch(row_block, group_size, m, k):
    """FP8 e4m3fn weights as checkpoints store them (torch.float8_e4m3fn with
    block, channel or tensor scales) against float64 on the exact values
    (K = 512 at M 40 and 70: the kernel's Hopper form on an H100 / H200)."""
    u = 72
    w8 = (torch.randn(2 * u, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    rows_s = 1 if row_block == 0 else -(-2 * u // row_block)
    cols_s = 1 if group_size == 0 else -(-k // group_size)
    scales = torch.rand(rows_s, cols_s, device="cuda", dtype=torch.float32) * 0.02 + 0.005
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    y = gatedmlp.quantized_gate_up(x, w8.view(torch.int32), scales, mode="fp8_e4m3", row_block=row_block,
                                   group_size=group_size, out=torch.empty(m, u, device="cuda", dtype=torch.float32))
    rb = 2 * u if row_block == 0 else row_block
    gs = k if group_size == 0 else group_size
    s_full = scales.double().repeat_interleave(rb, 0)[:2 * u].repeat_interleave(gs, 1)[:, :k]
    w = w8.double() * s_full
    h = x.double() @ w.T
    want = torch.nn.functional.silu(h[:, :u]) * h[:, u:]
    c = cosine(y.cpu().numpy(), want.cpu().numpy())
    assert c >= 0.99999, f"cosine {c}"
    on_decode = m <= 64 or (k % 256 == 0 and torch.cuda.get_device_capability() == (9, 0))
    if on_decode:  # the decode kernel multiplies the exact e4m3 values: fp32 sums only
        assert torch.allclose(y.double(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
