"""gatedmlp.repack: MLX's affine 4-bit words in the kernels' streaming order
and back, on the host (NumPy), without a GPU or the mlx package: the round
trip, quantize / dequantize with repacked=True against the plain ones
through the repack, the documented nibble order, and the refusals. The
kernel on repacked words against MLX is in test_quant_kernel.py."""
import numpy as np
import pytest

import gatedmlp


@pytest.mark.parametrize("group", [32, 64, 128])
def test_repack_round_trip_and_quantize(group):
    rng = np.random.default_rng()
    k = 384
    w = (rng.standard_normal((5, k)) * 0.1).astype(np.float32)
    wq, s, b = gatedmlp.quantize(w, group_size=group)
    packed = gatedmlp.repack(wq, group_size=group)
    assert packed.shape == (5, 48) and packed.dtype == np.uint32
    assert np.array_equal(gatedmlp.repack(packed, k, group, inverse=True), wq)
    wq2, s2, b2 = gatedmlp.quantize(w, group_size=group, repacked=True)
    assert np.array_equal(wq2, packed) and np.array_equal(s2, s) and np.array_equal(b2, b)
    assert np.array_equal(gatedmlp.dequantize(packed, s, b, group_size=group, repacked=True),
                          gatedmlp.dequantize(wq, s, b, group_size=group))
    # Element 2i of a word in nibble i, 2i + 1 in nibble i + 4 (quant.hpp).
    one = np.zeros((1, 16), np.uint32)
    one[0, 0] = 0x76543210
    assert gatedmlp.repack(one, group_size=group)[0, 0] == 0x75316420


def test_repack_errors_name_the_argument():
    wq = np.zeros((2, 16), np.uint32)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="needs k"):
        gatedmlp.repack(wq, inverse=True)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="k=100"):
        gatedmlp.repack(wq, 100)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="'src' must have 32 words"):
        gatedmlp.repack(wq, 256)
    with pytest.raises(gatedmlp.NotSupportedError, match="repacked"):
        gatedmlp.quantize(np.zeros((1, 64), np.float32), bits=8, repacked=True)


@pytest.mark.parametrize("group,k,layout", [(64, 256, (0, "gate")), (32, 160, (8, "up")), (128, 384, (1, "gate")),
                                            (64, 192, (16, "up"))])
def test_tile_round_trip_and_dequantize(group, k, layout):
    """tile(): the rows in blocks of 8 gate first, K padded, 16 x 128 tiles;
    dequantize(tiled=True) reads them as the checkpoint's rows in that
    order, and inverse=True gives the checkpoint's arrays back bit for bit."""
    rng = np.random.default_rng()
    u = 8 * int(rng.integers(1, 5)) * (2 if layout[0] == 16 else 1)
    gg, first = layout
    w = rng.standard_normal((2 * u, k)).astype(np.float32)
    wq, s, b = gatedmlp.quantize(w, group_size=group)
    tw, tsb = gatedmlp.tile(wq, s, b, group_size=group, group=gg, first=first)
    kb, gp = (k + 127) // 128, (k + 127) // 128 * 128 // group
    assert tw.shape == (2 * u, kb * 16) and tsb.shape == (2 * u, 2 * gp)
    # Row 16c + 8h + j of the tiled weight is half h of column 8c + j.
    g = u if gg == 0 else gg
    src = [(2 * ((8 * (r // 16) + r % 8) // g) + ((r // 8) % 2 ^ (first == "up"))) * g + (8 * (r // 16) + r % 8) % g
           for r in range(2 * u)]
    dense = gatedmlp.dequantize(wq, s, b, group_size=group)[src]
    got = gatedmlp.dequantize(tw, tsb, group_size=group, tiled=True)
    assert np.array_equal(got[:, :k], dense) and not got[:, k:].any()
    # Word w of row r at tile (r // 16, w // 16), row r % 16 of it.
    r, wi = 2 * u - 1, k // 8 - 1
    flat = tw.reshape(-1)
    assert flat[(((r // 16) * kb + wi // 16) * 16 + r % 16) * 16 + wi % 16] == wq[src[r], wi]
    # The (scale, bias) pair of row r, group gi at (((c * gp + gi) * 8 + r % 8) * 2 + r // 8 % 2) * 2.
    gi = k // group - 1
    at = ((((r // 16) * gp + gi) * 8 + r % 8) * 2 + (r // 8) % 2) * 2
    assert tsb.reshape(-1)[at] == s[src[r], gi] and tsb.reshape(-1)[at + 1] == b[src[r], gi]
    back = gatedmlp.tile(tw, tsb, group_size=group, group=gg, first=first, inverse=True, k=k)
    for a, want in zip(back, (wq, s, b)):
        assert np.array_equal(a, want)


@pytest.mark.parametrize("group,k", [(64, 256), (32, 160), (128, 384)])
def test_tile_down_keeps_the_rows(group, k):
    """tile(down=True): a down projection's rows tiled where they are (a
    tile is 16 output columns); inverse=True gives the arrays back."""
    rng = np.random.default_rng()
    h = 16 * int(rng.integers(1, 5))
    w = rng.standard_normal((h, k)).astype(np.float32)
    wq, s, b = gatedmlp.quantize(w, group_size=group)
    tw, tsb = gatedmlp.tile(wq, s, b, group_size=group, down=True)
    got = gatedmlp.dequantize(tw, tsb, group_size=group, tiled=True)
    assert np.array_equal(got[:, :k], gatedmlp.dequantize(wq, s, b, group_size=group)) and not got[:, k:].any()
    kb = (k + 127) // 128
    r, wi = h - 1, k // 8 - 1
    assert tw.reshape(-1)[(((r // 16) * kb + wi // 16) * 16 + r % 16) * 16 + wi % 16] == wq[r, wi]
    back = gatedmlp.tile(tw, tsb, group_size=group, down=True, inverse=True, k=k)
    for a, want in zip(back, (wq, s, b)):
        assert np.array_equal(a, want)
    wq, s, b = gatedmlp.quantize(np.zeros((24, 128), np.float32))
    with pytest.raises(gatedmlp.InvalidArgumentError, match="24 rows.*multiple of 16"):
        gatedmlp.tile(wq, s, b, down=True)


def test_tile_refusals_name_the_argument():
    wq, s, b = gatedmlp.quantize(np.zeros((24, 128), np.float32))
    with pytest.raises(gatedmlp.InvalidArgumentError, match="24 rows"):
        gatedmlp.tile(wq, s, b)
    wq, s, b = gatedmlp.quantize(np.zeros((32, 128), np.float32))
    with pytest.raises(gatedmlp.InvalidArgumentError, match="needs k"):
        gatedmlp.tile(wq, s, inverse=True)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="pairs"):
        gatedmlp.tile(wq, s)
    with pytest.raises(gatedmlp.InvalidArgumentError, match="group=3"):
        gatedmlp.tile(wq, s, b, group=3)


def test_tile_takes_leading_axes():
    """MoE experts [E, 2U, ...]: each expert tiled as tile() tiles one."""
    rng = np.random.default_rng()
    w = rng.standard_normal((3, 32, 256)).astype(np.float32)
    wq, s, b = gatedmlp.quantize(w)
    tw, tsb = gatedmlp.tile(wq, s, b, group=8, first="up")
    for e in range(3):
        one = gatedmlp.tile(wq[e], s[e], b[e], group=8, first="up")
        for a, want in zip((tw[e], tsb[e]), one):
            assert np.array_equal(a, want)
    back = gatedmlp.tile(tw, tsb, group=8, first="up", inverse=True, k=256)
    for a, want in zip(back, (wq, s, b)):
        assert np.array_equal(a, want)


def test_tile_of_no_rows_is_empty():
    """An empty weight (U = 0) tiles to empty arrays and back, no error."""
    wq, s, b = np.zeros((0, 32), np.uint32), np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32)
    tw, tsb = gatedmlp.tile(wq, s, b)
    assert tw.shape == (0, 32) and tsb.shape == (0, 8)
    back = gatedmlp.tile(tw, tsb, inverse=True, k=256)
    assert [a.shape for a in back] == [(0, 32), (0, 4), (0, 4)]
