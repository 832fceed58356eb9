"""Plain NumPy statements of what the library computes, for the tests.

Written from the definitions in include/gatedmlp (not from the library's
code), so that the tests check the library against the spec.
"""

import numpy as np


def fused_rows(u, group, first):
    """(half, j) of every physical row of a fused [2U] weight.

    Rows come in blocks of `group` (0: u); block 2b holds rows
    [b*group, (b+1)*group) of half `first`, block 2b+1 the same rows of the
    other half. half: 0 = gate, 1 = up.
    """
    g = u if group == 0 else group
    out = []
    for f in range(2 * u):
        block, r = divmod(f, g)
        pair, odd = divmod(block, 2)
        half = first if odd == 0 else 1 - first
        out.append((half, pair * g + r))
    return out


def fuse(gate, up, group, first):
    """[U, K] gate and up -> the fused [2U, K] layout (out_in)."""
    u = gate.shape[0]
    halves = (gate, up)
    return np.stack([halves[h][j] for h, j in fused_rows(u, group, first)])


def unfuse(fused, group, first):
    """The fused [2U, K] layout -> (gate, up), each [U, K]."""
    u = fused.shape[0] // 2
    gate = np.empty_like(fused[:u])
    up = np.empty_like(fused[:u])
    halves = (gate, up)
    for f, (h, j) in enumerate(fused_rows(u, group, first)):
        halves[h][j] = fused[f]
    return gate, up


def act64(name, g, u, clamp_alpha=1.702, clamp_limit=7.0):
    """The activation in float64 NumPy."""
    g = g.astype(np.float64)
    u = u.astype(np.float64)
    if name == "silu":
        return g / (1.0 + np.exp(-g)) * u
    if name == "gelu_tanh":
        return 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g**3))) * u
    if name == "gelu_erf":
        from math import erf

        return 0.5 * g * (1.0 + np.vectorize(erf)(g / np.sqrt(2.0))) * u
    if name == "relu":
        return np.maximum(g, 0.0) * u
    if name == "swiglu_clamped":
        g = np.minimum(g, clamp_limit)
        u = np.clip(u, -clamp_limit, clamp_limit)
        return g / (1.0 + np.exp(-clamp_alpha * g)) * (u + 1.0)
    raise ValueError(name)


def act_torch(name, g, u, ca=1.702, cl=7.0):
    """The GLU in PyTorch at the precision of g and u (the unfused path a
    model runs): act(g) * u, gpt-oss's clamped form for swiglu_clamped."""
    import torch
    import torch.nn.functional as F

    if name == "silu":
        return F.silu(g) * u
    if name == "gelu_tanh":
        return F.gelu(g, approximate="tanh") * u
    if name == "gelu_erf":
        return F.gelu(g) * u
    if name == "relu":
        return F.relu(g) * u
    if name == "swiglu_clamped":
        g = g.clamp(max=cl)
        u = u.clamp(min=-cl, max=cl)
        return g * torch.sigmoid(ca * g) * (u + 1)
    raise ValueError(name)


def fused_halves(u, group, first, device="cpu"):
    """Physical rows of the gate and the up half of a fused [2U] weight, in
    logical order (fused_rows), as torch index tensors on `device`. first:
    "gate" / "up" or the library's Half."""
    import torch

    rows = fused_rows(u, group, 0 if getattr(first, "name", first) == "gate" else 1)
    gate = [f for f, (h, _) in enumerate(rows) if h == 0]
    up = [f for f, (h, _) in enumerate(rows) if h == 1]
    return torch.tensor(gate, device=device), torch.tensor(up, device=device)


def moe_reference(x, ids, wts, w13, w2, b13, b2, act, group, first, ca=1.702, cl=7.0, dtype=None):
    """A Mixture-of-Experts layer's experts (PyTorch tensors):
    sum_j wts[t, j] * (act(gate, up) @ w2[e]^T + b2[e]), e = ids[t, j],
    looping over the experts: the (token, slot) pairs that chose expert e
    go through a dense MLP on e's weights, in `dtype` throughout (None:
    float64, the reference; x's dtype: the unfused path, rounding after each
    op as transformers' eager forward does, its sum too)."""
    import torch

    dtype = torch.float64 if dtype is None else dtype
    t, k = ids.shape
    i = w13.shape[1] // 2
    gi, ui = fused_halves(i, group, first, x.device)
    y = torch.zeros(t, w2.shape[1], dtype=dtype, device=x.device)
    for e in ids.unique().tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        p = x[tok].to(dtype) @ w13[e].to(dtype).T
        if b13 is not None:
            p = p + b13[e].to(dtype)
        h = act_torch(act, p[:, gi], p[:, ui], ca, cl)
        o = h @ w2[e].to(dtype).T
        if b2 is not None:
            o = o + b2[e].to(dtype)
        y.index_add_(0, tok, o * wts[tok, slot].to(dtype)[:, None])
    return y
