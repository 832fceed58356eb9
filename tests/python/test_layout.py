"""convert_weights on host arrays (NumPy, and CPU torch tensors when PyTorch is
there), checked against the layout definitions in refs.py."""

import itertools

import numpy as np
import pytest

import gatedmlp
from gatedmlp import Half, WeightFormat, WeightLayout, WeightStorage
from refs import fuse, unfuse

rng = np.random.default_rng(99)

SEP = WeightLayout(format=WeightFormat.separate)


def rand(shape, dtype=np.float16):
    return rng.standard_normal(shape).astype(dtype)


def fused_layout(group, first, storage=WeightStorage.out_in):
    return WeightLayout(format=WeightFormat.fused, group=group, first=first, storage=storage)


@pytest.mark.parametrize("u,k", [(32, 24), (12, 5)])
@pytest.mark.parametrize("first", [Half.gate, Half.up])
def test_separate_to_fused_every_group(u, k, first):
    gate, up = rand((u, k)), rand((u, k))
    for group in [0, 1, 2, 3, 4, 6, 8, 12, 16, 32]:
        if group and u % group:
            continue
        out = np.full((2 * u, k), np.nan, np.float16)
        gatedmlp.convert_weights(gate, out, from_w_up=up, from_layout=SEP, to_layout=fused_layout(group, first))
        np.testing.assert_array_equal(out, fuse(gate, up, group, int(first.value)), err_msg=f"group={group}")


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_fused_to_separate_and_back(dtype):
    u, k = 16, 40
    fused = rand((2 * u, k), dtype)
    gate = np.full((u, k), np.nan, dtype)
    up = np.full((u, k), np.nan, dtype)
    gatedmlp.convert_weights(fused, gate, to_w_up=up, from_layout=fused_layout(8, Half.up), to_layout=SEP)
    g_ref, u_ref = unfuse(fused, 8, 1)
    np.testing.assert_array_equal(gate, g_ref)
    np.testing.assert_array_equal(up, u_ref)
    back = np.empty_like(fused)
    gatedmlp.convert_weights(gate, back, from_w_up=up, from_layout=SEP, to_layout=fused_layout(8, Half.up))
    np.testing.assert_array_equal(back, fused)


def test_fused_to_fused_across_storage():
    u, k = 24, 16
    gate, up = rand((u, k)), rand((u, k))
    for (g1, f1), (g2, f2) in itertools.product([(0, 0), (1, 1), (8, 0)], [(0, 1), (3, 0), (24, 1)]):
        src = fuse(gate, up, g1, f1)
        dst = np.full((k, 2 * u), np.nan, np.float16)  # in_out: [K, 2U]
        gatedmlp.convert_weights(src, dst, from_layout=fused_layout(g1, Half(f1)),
                                 to_layout=fused_layout(g2, Half(f2), WeightStorage.in_out))
        np.testing.assert_array_equal(dst, fuse(gate, up, g2, f2).T)
        # and back from in_out
        again = np.empty_like(src)
        gatedmlp.convert_weights(dst, again, from_layout=fused_layout(g2, Half(f2), WeightStorage.in_out),
                                 to_layout=fused_layout(g1, Half(f1)))
        np.testing.assert_array_equal(again, src)


def test_strided_source_and_destination_keep_padding():
    u, k, pad = 8, 12, 5
    gate_big, up_big = rand((u, k + pad)), rand((u, k + pad))
    dst_big = rand((2 * u, k + 3))
    before = dst_big.copy()
    gatedmlp.convert_weights(gate_big[:, :k], dst_big[:, :k], from_w_up=up_big[:, :k], from_layout=SEP,
                             to_layout=fused_layout(2, Half.gate))
    np.testing.assert_array_equal(dst_big[:, :k], fuse(gate_big[:, :k], up_big[:, :k], 2, 0))
    np.testing.assert_array_equal(dst_big[:, k:], before[:, k:])  # the padding is untouched


def test_bias_is_a_weight_with_k_1():
    u = 12
    bg, bu = rand(u, np.float32), rand(u, np.float32)
    out = np.full(2 * u, np.nan, np.float32)
    gatedmlp.convert_weights(bg, out, from_w_up=bu, from_layout=SEP, to_layout=fused_layout(4, Half.up))
    np.testing.assert_array_equal(out, fuse(bg[:, None], bu[:, None], 4, 1)[:, 0])


def test_conversion_errors():
    u, k = 8, 16
    gate, up = rand((u, k)), rand((u, k))
    to = fused_layout(0, Half.gate)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'to_w' must hold 16 rows"):
        gatedmlp.convert_weights(gate, np.empty((2 * u, k + 1), np.float16), from_w_up=up, from_layout=SEP,
                                 to_layout=to)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="dtype"):
        gatedmlp.convert_weights(gate, np.empty((2 * u, k), np.float32), from_w_up=up, from_layout=SEP,
                                 to_layout=to)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'from_w_up' must have the shape"):
        gatedmlp.convert_weights(gate, np.empty((2 * u, k), np.float16), from_w_up=up[:4], from_layout=SEP,
                                 to_layout=to)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="from_w_up"):
        # separate weights without their up half: the library names the argument
        gatedmlp.convert_weights(gate, np.empty((2 * u, k), np.float16), from_layout=SEP, to_layout=to)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="group"):
        gatedmlp.convert_weights(gate, np.empty((2 * u, k), np.float16), from_w_up=up, from_layout=SEP,
                                 to_layout=fused_layout(3, Half.gate))
    with pytest.raises(gatedmlp.InvalidArgumentError, match="even number of rows"):
        gatedmlp.convert_weights(rand((7, k)), np.empty((7, k), np.float16), from_layout=to, to_layout=to)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="contradicts"):
        gatedmlp.convert_weights(gate, np.empty((2 * u, k), np.float16), from_w_up=up, from_layout=SEP,
                                 to_layout=WeightLayout(ld=k + 8))
    ro = np.empty((2 * u, k), np.float16)
    ro.flags.writeable = False
    with pytest.raises(TypeError, match="'to_w' is read-only"):
        gatedmlp.convert_weights(gate, ro, from_w_up=up, from_layout=SEP, to_layout=to)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="CUDA device memory"):
        gatedmlp.convert_weights_device(gate, np.empty((2 * u, k), np.float16), from_w_up=up, from_layout=SEP,
                                        to_layout=to)


def test_torch_cpu_tensors_bf16():
    torch = pytest.importorskip("torch")
    u, k = 16, 32
    gate = torch.randn(u, k, dtype=torch.bfloat16)
    up = torch.randn(u, k, dtype=torch.bfloat16)
    out = torch.full((2 * u, k), float("nan"), dtype=torch.bfloat16)
    r = gatedmlp.convert_weights(gate, out, from_w_up=up, from_layout=SEP, to_layout=fused_layout(4, Half.up))
    assert r is out
    ref = fuse(gate.float().numpy(), up.float().numpy(), 4, 1)
    np.testing.assert_array_equal(out.float().numpy(), ref)
    # a weight that requires grad converts all the same (the result is data)
    g2 = gate.clone().requires_grad_()
    gatedmlp.convert_weights(g2, out, from_w_up=up, from_layout=SEP, to_layout=fused_layout(4, Half.up))
    np.testing.assert_array_equal(out.float().numpy(), ref)
