"""QuantizedGatedMLP: a gated MLP whose three projections are quantized
weights, held under the checkpoint's own names and dtypes.

Two families of checkpoints, loaded as they are:

- MLX (mlx-lm's ``quantize``): ``{gate,up,down}_proj.weight`` uint32 words
  ``[N, K * bits / 32]``, ``.scales`` and ``.biases`` ``[N, K / group_size]``
  (the weights' dtype) for ``mode="affine"``; ``mode="mxfp4"`` has uint8 e8m0
  ``.scales`` and no biases.
- FP8 (DeepSeek-V3, Qwen3-FP8, compressed-tensors): ``.weight``
  float8_e4m3fn ``[N, K]`` and its scale, a multiplier whatever its name:
  ``.weight_scale_inv`` ``[ceil(N / 128), ceil(K / 128)]`` (128 x 128
  blocks), or ``.weight_scale`` ``[N, 1]`` (per output channel) or ``[]`` /
  ``[1]`` (per tensor).

Affine 4-bit weights without biases on the projections are repacked once,
at load, into gatedmlp.tile's order (gate and up fused, 1 KB tiles; the
decode kernels read it 1.2-1.36x faster at 1-16 rows: the project's notes,
h95 and h96); the module then holds only the tiled arrays, and
``state_dict()`` untiles them. Other formats are held as they come (the
kernels take separate gate/up weights as they are). Either way
``state_dict()`` gives back the checkpoint's keys, shapes, dtypes and
bytes. Forward is ``gatedmlp::quantized_gate_up`` then
``gatedmlp::quantized_down`` (two launches, each weight byte read once).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from .fp8 import fp8_bytes
from .quant import tile

_FP8_SCALE_NAMES = ("weight_scale_inv", "weight_scale")
_PROJ = ("gate_proj", "up_proj", "down_proj")


class _QuantizedProjection(nn.Module):
    """One projection's arrays, as buffers named as the checkpoint names them."""

    def __init__(self, out_features: int, in_features: int, *, mode: str, bits: int, group_size: int,
                 fp8_scales: str, fp8_scale_name: str, bias: bool, dtype, device):
        super().__init__()
        self.out_features, self.in_features = out_features, in_features
        if mode == "fp8_e4m3":
            self.register_buffer("weight", torch.empty(out_features, in_features, dtype=torch.float8_e4m3fn,
                                                       device=device))
            shape = {"block": (-(-out_features // 128), -(-in_features // 128)), "channel": (out_features, 1),
                     "tensor": ()}[fp8_scales]
            self.scale_name = fp8_scale_name
            self.register_buffer(fp8_scale_name, torch.empty(shape, dtype=torch.float32, device=device))
        else:
            self.scale_name = "scales"
            self.register_buffer("weight", torch.empty(out_features, in_features * bits // 32, dtype=torch.uint32,
                                                       device=device))
            groups = in_features // group_size
            self.register_buffer("scales", torch.empty(out_features, groups,
                                                       dtype=torch.uint8 if mode == "mxfp4" else dtype,
                                                       device=device))
            if mode == "affine":
                self.register_buffer("biases", torch.empty(out_features, groups, dtype=dtype, device=device))
        if bias:
            self.register_buffer("bias", torch.empty(out_features, dtype=dtype, device=device))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # A per-tensor FP8 scale comes as [] or [1]: kept in the checkpoint's
        # shape, so that state_dict() gives it back as it came.
        key = prefix + self.scale_name
        own = getattr(self, self.scale_name)
        if key in state_dict and own.numel() == 1 and state_dict[key].numel() == 1:
            self.register_buffer(self.scale_name, own.reshape(state_dict[key].shape))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def arrays(self):
        """(words, scales, biases, bias) as the kernels take them: FP8
        weights as their e4m3 bytes (the binding reads them as words), a
        per-tensor scale as one element."""
        w = self.weight
        if w.dtype == torch.float8_e4m3fn:
            w = fp8_bytes(torch, w)
        s = getattr(self, self.scale_name)
        if s.dim() == 0:
            s = s.reshape(1)
        return w, s, getattr(self, "biases", None), getattr(self, "bias", None)


class QuantizedGatedMLP(nn.Module):
    """down_proj(act(gate_proj(x)) * up_proj(x)) from quantized weights.

    mode: "affine" (MLX, bits 4 or 8, group_size 32 / 64 / 128), "mxfp4"
    (group_size 32) or "fp8_e4m3" with fp8_scales "block" (128 x 128,
    DeepSeek's weight_scale_inv), "channel" ([N, 1]) or "tensor";
    fp8_scale_name: the checkpoint's name for the scale. dtype: the
    activations' (bf16 or fp16) and, for MLX, the scales' and biases'.
    activation as for GatedMLP. bias: biases on all three projections.
    tiled: hold affine 4-bit weights in gatedmlp.tile's order (None: where
    it applies, affine 4-bit without biases).

    Build it and load_state_dict() the checkpoint's MLP arrays (keys
    gate_proj.weight, gate_proj.scales, ...), or let from_state_dict() read
    the sizes off the arrays. Inference only.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, *, mode: str = "affine", bits: int = 4,
                 group_size: Optional[int] = None, fp8_scales: str = "block",
                 fp8_scale_name: str = "weight_scale_inv", activation="silu", clamp_alpha: float = 1.702,
                 clamp_limit: float = 7.0, bias: bool = False, dtype=torch.bfloat16, device=None,
                 tiled: Optional[bool] = None):
        super().__init__()
        from gatedmlp.torch import activation_name  # the one table of activation names

        if mode not in ("affine", "mxfp4", "fp8_e4m3"):
            raise ValueError(f"mode must be 'affine', 'mxfp4' or 'fp8_e4m3', got {mode!r}")
        if mode == "mxfp4":
            bits = 4
        if mode == "fp8_e4m3":
            bits = 8
            if fp8_scales not in ("block", "channel", "tensor"):
                raise ValueError(f"fp8_scales must be 'block', 'channel' or 'tensor', got {fp8_scales!r}")
            if fp8_scale_name not in _FP8_SCALE_NAMES:
                raise ValueError(f"fp8_scale_name must be one of {_FP8_SCALE_NAMES}, got {fp8_scale_name!r}")
        if group_size is None:
            group_size = {"affine": 64, "mxfp4": 32, "fp8_e4m3": 128}[mode]
        for name, k in (("hidden_size", hidden_size), ("intermediate_size", intermediate_size)):
            if mode != "fp8_e4m3" and k % group_size:
                raise ValueError(f"{name}={k} is not a multiple of group_size={group_size} (the projection "
                                 f"reading it is quantized in groups along it)")
            if mode == "fp8_e4m3" and k % 4:
                raise ValueError(f"{name}={k} is not a multiple of 4 (FP8 bytes are read four to a word)")
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.mode, self.bits, self.group_size, self.fp8_scales = mode, bits, group_size, fp8_scales
        self.activation = activation_name(activation)
        self.clamp_alpha, self.clamp_limit = float(clamp_alpha), float(clamp_limit)
        # The tiled order: affine 4-bit without biases (a fused bias would
        # have to follow the rows' interleaving). Its whole tiles (down rows
        # in 16s, gate/up columns in 8s) hold: both sizes are multiples of
        # the group, 32 or more.
        why_not = ("mode is not affine 4-bit" if mode != "affine" or bits != 4 else
                   "the projections have biases" if bias else "")
        if tiled and why_not:
            raise ValueError(f"tiled=True: {why_not}")
        self.tiled = not why_not if tiled is None else bool(tiled)
        if self.tiled:
            # gatedmlp.tile's arrays only (not state_dict entries: those are
            # the checkpoint's, see _save_to_state_dict).
            kh, ki = -(-hidden_size // 128), -(-intermediate_size // 128)
            shapes = {"gate_up_words": ((2 * intermediate_size, kh * 16), torch.uint32),
                      "gate_up_pairs": ((2 * intermediate_size, 2 * kh * 128 // group_size), dtype),
                      "down_words": ((hidden_size, ki * 16), torch.uint32),
                      "down_pairs": ((hidden_size, 2 * ki * 128 // group_size), dtype)}
            for name, (shape, dt) in shapes.items():
                self.register_buffer(name, torch.empty(shape, dtype=dt, device=device), persistent=False)
            self._dtype = dtype
            return
        proj = dict(mode=mode, bits=bits, group_size=group_size, fp8_scales=fp8_scales,
                    fp8_scale_name=fp8_scale_name, bias=bias, dtype=dtype, device=device)
        self.gate_proj = _QuantizedProjection(intermediate_size, hidden_size, **proj)
        self.up_proj = _QuantizedProjection(intermediate_size, hidden_size, **proj)
        self.down_proj = _QuantizedProjection(hidden_size, intermediate_size, **proj)

    def _checkpoint_shapes(self):
        """(words, scales) shapes of each projection as an MLX checkpoint stores them."""
        h, i, g = self.hidden_size, self.intermediate_size, self.group_size
        return {"gate_proj": ((i, h // 8), (i, h // g)), "up_proj": ((i, h // 8), (i, h // g)),
                "down_proj": ((h, i // 8), (h, i // g))}

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        if not self.tiled:
            return super()._save_to_state_dict(destination, prefix, keep_vars)
        # The checkpoint's arrays, untiled (bit for bit what was loaded).
        i = self.intermediate_size
        gw, gs, gb = tile(self.gate_up_words, self.gate_up_pairs, group_size=self.group_size, inverse=True,
                          k=self.hidden_size)
        dw, ds, db = tile(self.down_words, self.down_pairs, group_size=self.group_size, down=True, inverse=True,
                          k=self.intermediate_size)
        for name, arrays in (("gate_proj", (gw[:i], gs[:i], gb[:i])), ("up_proj", (gw[i:], gs[i:], gb[i:])),
                             ("down_proj", (dw, ds, db))):
            for key, t in zip(("weight", "scales", "biases"), arrays):
                destination[f"{prefix}{name}.{key}"] = t.contiguous()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        if not self.tiled:
            return super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                                 unexpected_keys, error_msgs)
        # The checkpoint's arrays, checked by name, then tiled once.
        got = {}
        for name, (wshape, sshape) in self._checkpoint_shapes().items():
            for key, shape in (("weight", wshape), ("scales", sshape), ("biases", sshape)):
                k = f"{prefix}{name}.{key}"
                if k not in state_dict:
                    missing_keys.append(k)
                    continue
                t = state_dict[k]
                if tuple(t.shape) != shape:
                    error_msgs.append(f"size mismatch for {k}: copying a param with shape {tuple(t.shape)} from "
                                      f"checkpoint, the shape in current model is {torch.Size(shape)}.")
                    continue
                got[(name, key)] = t if key == "weight" else t.to(self._dtype)
        if strict:
            expected = {f"{prefix}{n}.{key}" for n in _PROJ for key in ("weight", "scales", "biases")}
            unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k not in expected)
        if len(got) != 9:
            return
        assign = local_metadata.get("assign_to_params_buffers", False)
        cat = lambda key: torch.cat([got[("gate_proj", key)], got[("up_proj", key)]])  # noqa: E731
        gw, gp = tile(cat("weight"), cat("scales"), cat("biases"), group_size=self.group_size)
        dw, dp = tile(got[("down_proj", "weight")], got[("down_proj", "scales")], got[("down_proj", "biases")],
                      group_size=self.group_size, down=True)
        for name, t in (("gate_up_words", gw), ("gate_up_pairs", gp), ("down_words", dw), ("down_pairs", dp)):
            own = getattr(self, name)
            t = t.view(torch.uint32) if t.dtype == torch.int32 else t
            self.register_buffer(name, t if assign else t.to(own.device), persistent=False)

    # The kernels' format arguments: FP8's scale granularity as blocks of
    # rows x K (0: all of them).
    def _format(self):
        if self.mode != "fp8_e4m3":
            return dict(mode=self.mode, bits=self.bits, group_size=self.group_size, row_block=1)
        rb, gs = {"block": (128, 128), "channel": (1, 0), "tensor": (0, 0)}[self.fp8_scales]
        return dict(mode=self.mode, bits=8, group_size=gs, row_block=rb)

    @classmethod
    def from_state_dict(cls, state_dict: dict, *, bits: int = 4, group_size: Optional[int] = None,
                        activation="silu", prefix: str = "", **kwargs) -> "QuantizedGatedMLP":
        """A QuantizedGatedMLP holding a checkpoint's MLP arrays (keys
        `prefix` + gate_proj.weight, ...). The format is read off the arrays:
        float8_e4m3fn weights are FP8 (with weight_scale_inv or weight_scale,
        whose shape says block, channel or tensor); uint32 words with uint8
        scales MXFP4; with scales and biases, MLX's affine format (`bits`
        and `group_size` as the checkpoint's config says; MLX's defaults 4
        and 64). The arrays are used as they are, on their device."""
        def get(name):
            key = prefix + name
            if key not in state_dict:
                raise KeyError(f"gatedmlp: the checkpoint has no {key!r}")
            return state_dict[key]

        gate, down = get("gate_proj.weight"), get("down_proj.weight")
        sd = {k[len(prefix):]: v for k, v in state_dict.items()
              if k.startswith(prefix) and k[len(prefix):].split(".", 1)[0] in ("gate_proj", "up_proj", "down_proj")}
        bias = "gate_proj.bias" in sd
        if gate.dtype == torch.float8_e4m3fn:
            name = next((n for n in _FP8_SCALE_NAMES if f"gate_proj.{n}" in sd), None)
            if name is None:
                raise KeyError(f"gatedmlp: FP8 weights {prefix}gate_proj.weight come without "
                               f"weight_scale_inv or weight_scale")
            s = sd[f"gate_proj.{name}"]
            scales = "tensor" if s.numel() == 1 else "channel" if s.dim() == 2 and s.shape[1] == 1 else "block"
            inter, hidden = gate.shape
            dtype = kwargs.pop("dtype", torch.bfloat16)
            self = cls(hidden, inter, mode="fp8_e4m3", fp8_scales=scales, fp8_scale_name=name, activation=activation,
                       bias=bias, dtype=dtype, device=gate.device, **kwargs)
        else:
            s = get("gate_proj.scales")
            mode = "mxfp4" if s.dtype == torch.uint8 else "affine"
            if mode == "mxfp4":
                bits, group_size = 4, 32
            group_size = group_size or 64
            inter, hidden = gate.shape[0], gate.shape[1] * 32 // bits
            if down.shape[1] * 32 // bits != inter:
                raise ValueError(f"gatedmlp: {prefix}down_proj.weight {tuple(down.shape)} does not read the "
                                 f"{inter} features gate_proj.weight {tuple(gate.shape)} gives at bits={bits}")
            if s.shape != (inter, hidden // group_size):
                raise ValueError(f"gatedmlp: {prefix}gate_proj.scales is {tuple(s.shape)}; bits={bits} and "
                                 f"group_size={group_size} need {(inter, hidden // group_size)} (pass the "
                                 f"checkpoint's bits and group_size)")
            self = cls(hidden, inter, mode=mode, bits=bits, group_size=group_size, activation=activation, bias=bias,
                       dtype=kwargs.pop("dtype", s.dtype if mode == "affine" else torch.bfloat16),
                       device=gate.device, **kwargs)
        self.load_state_dict(sd, assign=True)
        return self

    def forward(self, x: Tensor) -> Tensor:
        from gatedmlp.torch import quantized_down, quantized_gate_up

        if self.tiled:
            h = quantized_gate_up(x, self.gate_up_words, self.gate_up_pairs, activation=self.activation,
                                  clamp_alpha=self.clamp_alpha, clamp_limit=self.clamp_limit,
                                  group_size=self.group_size, tiled=True)
            return quantized_down(h, self.down_words, self.down_pairs, group_size=self.group_size, tiled=True)
        wg, sg, bg, biasg = self.gate_proj.arrays()
        wu, su, bu, biasu = self.up_proj.arrays()
        wd, sd, bd, biasd = self.down_proj.arrays()
        fmt = self._format()
        h = quantized_gate_up(x, wg, sg, bg, wq_up=wu, scales_up=su, biases_up=bu, bias=biasg, bias_up=biasu,
                              activation=self.activation, clamp_alpha=self.clamp_alpha,
                              clamp_limit=self.clamp_limit, **fmt)
        return quantized_down(h, wd, sd, bd, bias=biasd, **fmt)

    def extra_repr(self) -> str:
        f = f", fp8_scales={self.fp8_scales}" if self.mode == "fp8_e4m3" else \
            f", bits={self.bits}, group_size={self.group_size}"
        return (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, mode={self.mode}{f}, "
                f"activation={self.activation}" + (", tiled" if self.tiled else ""))
