"""gatedmlp.torch.QuantizedGatedMLP: a gated MLP holding a checkpoint's
quantized arrays as they are (MLX affine / MXFP4 words, scales, biases;
FP8 bytes with block, channel or tensor scales).

Without a GPU: the format is read off the arrays, state_dict() gives back
the checkpoint's keys, shapes, dtypes and bytes, a mismatched array is
refused by name, and meta tensors trace the forward. On a GPU: the forward
against float64 on the dequantized weights, eager and compiled.
"""

import pytest

torch = pytest.importorskip("torch")

import gatedmlp  # noqa: E402
import gatedmlp.torch as gt  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
PROJ = ("gate_proj", "up_proj", "down_proj")


def _shapes(hidden, inter):
    return {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}


def mlx_checkpoint(hidden, inter, *, bits=4, group_size=64, mode="affine", prefix="", dtype=torch.bfloat16,
                   bias=False, seed=0):
    """An MLP's arrays as an MLX checkpoint stores them (gatedmlp.quantize is
    bit for bit mlx.core.quantize: test_quant.py), with the float weights."""
    g = torch.Generator().manual_seed(seed)
    sd, dense = {}, {}
    for name, (o, i) in _shapes(hidden, inter).items():
        w = (torch.randn(o, i, generator=g) * 2 / i ** 0.5).to(dtype)
        arrays = gatedmlp.quantize(w, group_size=group_size, bits=bits, mode=mode)
        sd[f"{prefix}{name}.weight"], sd[f"{prefix}{name}.scales"] = arrays[0], arrays[1]
        if mode == "affine":
            sd[f"{prefix}{name}.biases"] = arrays[2]
        dense[name] = gatedmlp.dequantize(*arrays, group_size=group_size, bits=bits, mode=mode,
                                          dtype=torch.float32).double()
        if bias:
            sd[f"{prefix}{name}.bias"] = (torch.randn(o, generator=g) * 0.1).to(dtype)
            dense[name + ".bias"] = sd[f"{prefix}{name}.bias"].double()
    return sd, dense


def fp8_checkpoint(hidden, inter, *, scales="block", name="weight_scale_inv", seed=0):
    """An MLP's arrays as FP8 checkpoints store them, with the exact weights."""
    g = torch.Generator().manual_seed(seed)
    sd, dense = {}, {}
    for proj, (o, i) in _shapes(hidden, inter).items():
        w8 = (torch.randn(o, i, generator=g) * 0.5).to(torch.float8_e4m3fn)
        if scales == "block":
            s = torch.rand(-(-o // 128), -(-i // 128), generator=g) * 4 / i ** 0.5 + 0.5 / i ** 0.5
            full = s.repeat_interleave(128, 0)[:o].repeat_interleave(128, 1)[:, :i]
        elif scales == "channel":
            s = torch.rand(o, 1, generator=g) * 4 / i ** 0.5 + 0.5 / i ** 0.5
            full = s.expand(o, i)
        else:
            s = torch.tensor([2.0 / i ** 0.5])
            full = s.expand(o, i)
        sd[f"{proj}.weight"], sd[f"{proj}.{name}"] = w8, s
        dense[proj] = w8.double() * full.double()
    return sd, dense


def reference(x, dense, activation="silu"):
    """float64: down(act(x Wg^T + bg) * (x Wu^T + bu)) + bd."""
    x = x.double()
    g = x @ dense["gate_proj"].T + dense.get("gate_proj.bias", 0)
    u = x @ dense["up_proj"].T + dense.get("up_proj.bias", 0)
    h = torch.nn.functional.silu(g) * u if activation == "silu" else torch.nn.functional.gelu(g, approximate="tanh") * u
    return h @ dense["down_proj"].T + dense.get("down_proj.bias", 0)


def same_arrays(a, b):
    """Same keys, shapes, dtypes and bytes."""
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].contiguous().view(torch.uint8), b[k].contiguous().view(torch.uint8)), k


# ---------------------------------------------------------------- CPU
@pytest.mark.parametrize("bits,group_size", [(4, 64), (4, 32), (8, 128)])
def test_mlx_affine_round_trip(bits, group_size):
    sd, _ = mlx_checkpoint(256, 384, bits=bits, group_size=group_size, prefix="model.layers.3.mlp.", bias=True)
    m = gt.QuantizedGatedMLP.from_state_dict(sd, bits=bits, group_size=group_size, prefix="model.layers.3.mlp.")
    assert (m.mode, m.bits, m.group_size, m.hidden_size, m.intermediate_size) == ("affine", bits, group_size, 256, 384)
    same_arrays(m.state_dict(), {k[len("model.layers.3.mlp."):]: v for k, v in sd.items()})
    assert "bits=%d, group_size=%d" % (bits, group_size) in repr(m)


@pytest.mark.parametrize("hidden,inter,group_size", [(256, 384, 64), (160, 224, 32)])
def test_tiled_round_trip(hidden, inter, group_size):
    """Affine 4-bit without biases is held in gatedmlp.tile's order (a
    padded k-block where hidden or inter is not a multiple of 128), and
    state_dict() gives the checkpoint's arrays back bit for bit."""
    sd, _ = mlx_checkpoint(hidden, inter, group_size=group_size, prefix="mlp.")
    plain = {k[len("mlp."):]: v for k, v in sd.items()}
    m = gt.QuantizedGatedMLP.from_state_dict(sd, group_size=group_size, prefix="mlp.")
    assert m.tiled and "tiled" in repr(m) and not hasattr(m, "gate_proj")
    assert m.gate_up_words.shape == (2 * inter, -(-hidden // 128) * 16)
    same_arrays(m.state_dict(), plain)
    assert not gt.QuantizedGatedMLP.from_state_dict(sd, group_size=group_size, prefix="mlp.", tiled=False).tiled
    built = gt.QuantizedGatedMLP(hidden, inter, group_size=group_size)
    built.load_state_dict(plain)
    same_arrays(built.state_dict(), plain)
    with pytest.raises(ValueError, match="tiled=True: the projections have biases"):
        gt.QuantizedGatedMLP(hidden, inter, group_size=group_size, bias=True, tiled=True)
    with pytest.raises(ValueError, match="tiled=True: mode is not affine 4-bit"):
        gt.QuantizedGatedMLP(hidden, inter, bits=8, group_size=group_size, tiled=True)
    missing = {k: v for k, v in plain.items() if k != "up_proj.biases"}
    with pytest.raises(RuntimeError, match="up_proj.biases"):
        gt.QuantizedGatedMLP(hidden, inter, group_size=group_size).load_state_dict(missing)
    extra = dict(plain, **{"up_proj.bias": torch.zeros(inter)})
    with pytest.raises(RuntimeError, match="up_proj.bias"):
        gt.QuantizedGatedMLP(hidden, inter, group_size=group_size).load_state_dict(extra)


def test_mxfp4_round_trip():
    sd, _ = mlx_checkpoint(128, 256, mode="mxfp4", bits=4, group_size=32)
    m = gt.QuantizedGatedMLP.from_state_dict(sd)
    assert (m.mode, m.group_size) == ("mxfp4", 32)
    same_arrays(m.state_dict(), sd)


@pytest.mark.parametrize("scales,name", [("block", "weight_scale_inv"), ("channel", "weight_scale"),
                                         ("tensor", "weight_scale")])
def test_fp8_round_trip(scales, name):
    sd, _ = fp8_checkpoint(256, 320, scales=scales, name=name)
    m = gt.QuantizedGatedMLP.from_state_dict(sd)
    assert (m.mode, m.fp8_scales) == ("fp8_e4m3", scales)
    same_arrays(m.state_dict(), sd)


def test_load_state_dict_into_a_built_module():
    sd, _ = mlx_checkpoint(128, 192)
    m = gt.QuantizedGatedMLP(128, 192)
    m.load_state_dict(sd)
    same_arrays(m.state_dict(), sd)
    sd8, _ = fp8_checkpoint(128, 192, scales="channel", name="weight_scale")
    m8 = gt.QuantizedGatedMLP(128, 192, mode="fp8_e4m3", fp8_scales="channel", fp8_scale_name="weight_scale")
    m8.load_state_dict(sd8)
    same_arrays(m8.state_dict(), sd8)


def test_refusals_name_what_is_wrong():
    sd, _ = mlx_checkpoint(128, 192, bits=4, group_size=64)
    with pytest.raises(ValueError, match=r"gate_proj.scales is \(192, 2\); bits=4 and group_size=32 need \(192, 4\)"):
        gt.QuantizedGatedMLP.from_state_dict(sd, group_size=32)
    with pytest.raises(ValueError, match="down_proj.weight"):
        gt.QuantizedGatedMLP.from_state_dict(sd, bits=8)
    with pytest.raises(KeyError, match="mlp.gate_proj.weight"):
        gt.QuantizedGatedMLP.from_state_dict(sd, prefix="mlp.")
    with pytest.raises(ValueError, match="mode must be"):
        gt.QuantizedGatedMLP(128, 192, mode="int3")
    with pytest.raises(ValueError, match="intermediate_size=200 is not a multiple of group_size=64"):
        gt.QuantizedGatedMLP(128, 200)
    with pytest.raises(ValueError, match="fp8_scales must be"):
        gt.QuantizedGatedMLP(128, 192, mode="fp8_e4m3", fp8_scales="row")
    sd8, _ = fp8_checkpoint(128, 192)
    del sd8["gate_proj.weight_scale_inv"]
    with pytest.raises(KeyError, match="without weight_scale_inv or weight_scale"):
        gt.QuantizedGatedMLP.from_state_dict(sd8)
    m = gt.QuantizedGatedMLP(128, 192)
    bad = dict(sd)
    bad["down_proj.scales"] = bad["down_proj.scales"][:, :1]
    with pytest.raises(RuntimeError, match="down_proj.scales"):
        m.load_state_dict(bad)


@pytest.mark.parametrize("mode", ["affine", "mxfp4", "fp8_e4m3"])
def test_meta_forward_traces(mode):
    m = gt.QuantizedGatedMLP(256, 512, mode=mode, device="meta")
    y = m(torch.empty(2, 5, 256, device="meta", dtype=torch.bfloat16))
    assert y.shape == (2, 5, 256) and y.dtype == torch.bfloat16


# ---------------------------------------------------------------- GPU
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")


def _check(m, dense, hidden, ms=(1, 7, 64, 100), activation="silu"):
    for mm in ms:
        x = torch.randn(mm, hidden, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            y = m(x)
        want = reference(x.cpu(), dense, activation)
        err = ((y.double().cpu() - want).norm() / want.norm()).item()
        assert y.shape == (mm, hidden) and torch.isfinite(y).all()
        assert err < 1.5e-2, f"M={mm}: relative error {err}"


@gpu
@pytest.mark.parametrize("bits,group_size,mode", [(4, 64, "affine"), (8, 32, "affine"), (4, 32, "mxfp4")])
def test_mlx_forward_against_float64(bits, group_size, mode):
    sd, dense = mlx_checkpoint(512, 1024, bits=bits, group_size=group_size, mode=mode, bias=mode == "affine")
    m = gt.QuantizedGatedMLP.from_state_dict({k: v.cuda() for k, v in sd.items()}, bits=bits, group_size=group_size)
    _check(m, dense, 512)


@gpu
def test_tiled_forward_against_float64_and_the_checkpoint_order():
    sd, dense = mlx_checkpoint(512, 1024)
    sd = {k: v.cuda() for k, v in sd.items()}
    m = gt.QuantizedGatedMLP.from_state_dict(sd)
    assert m.tiled
    _check(m, dense, 512, ms=(1, 7, 16, 17, 100))
    plain = gt.QuantizedGatedMLP.from_state_dict(sd, tiled=False)
    x = torch.randn(5, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        a, b = m(x).double(), plain(x).double()
    assert ((a - b).norm() / b.norm()).item() < 2e-3


@gpu
@pytest.mark.parametrize("scales,name", [("block", "weight_scale_inv"), ("channel", "weight_scale"),
                                         ("tensor", "weight_scale")])
def test_fp8_forward_against_float64(scales, name):
    sd, dense = fp8_checkpoint(384, 640, scales=scales, name=name)
    m = gt.QuantizedGatedMLP.from_state_dict({k: v.cuda() for k, v in sd.items()}, activation="gelu_pytorch_tanh")
    _check(m, dense, 384, activation="gelu_tanh")


@gpu
def test_compiled_forward_matches_eager():
    sd, _ = mlx_checkpoint(256, 512)
    m = gt.QuantizedGatedMLP.from_state_dict({k: v.cuda() for k, v in sd.items()})
    x = torch.randn(3, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want = m(x)
        got = torch.compile(m, fullgraph=True)(x)
    assert torch.equal(got, want)
