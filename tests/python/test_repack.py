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
