"""The README's Python quick start, as written: it must parse everywhere and
run on a GPU (a newcomer copies it as it stands)."""
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _block_after(heading: str, index: int = 0) -> str:
    """The index-th python block of the section that `heading` opens."""
    text = README.read_text()
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) > index, f"no python block {index} after {heading!r}"
    return blocks[index]


def test_quick_start_parses():
    compile(_block_after("## Python quick start"), "README quick start", "exec")
    compile(_block_after("## Python quick start", 1), "README quantized", "exec")
    compile(_block_after("## Python quick start", 2), "README down and mlp", "exec")
    compile(_block_after("## Hugging Face models"), "README Hugging Face", "exec")


def test_quick_start_runs():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    scope = {}
    exec(compile(_block_after("## Python quick start"), "README quick start", "exec"), scope)
    assert scope["y"].shape == (16, 14336) and torch.isfinite(scope["y"]).all()
    assert scope["y2"].shape == (16, 14336) and torch.isfinite(scope["y2"]).all()
    # The quantized block, in the quick start's scope: the same call on the
    # weights dequantized to x's dtype, within bf16 roundings.
    exec(compile(_block_after("## Python quick start", 1), "README quantized", "exec"), scope)
    import gatedmlp

    y3 = scope["y3"]
    wd = gatedmlp.dequantize(scope["wq"], scope["scales"], scope["biases"], dtype=torch.bfloat16).cuda()
    want = gatedmlp.gate_up(scope["x"], wd).float()
    assert y3.shape == (16, 14336) and torch.isfinite(y3).all()
    assert ((y3.float() - want).norm() / want.norm()).item() < 1e-2
    # The down projection and whole-MLP block: against float64 PyTorch.
    exec(compile(_block_after("## Python quick start", 2), "README down and mlp", "exec"), scope)
    g, u, wdn = (scope[k].double() for k in ("g", "u", "wd"))
    want4 = (g * torch.sigmoid(g) * u) @ wdn.T
    y4 = scope["y4"].double()
    assert y4.shape == (1, 4096) and ((y4 - want4).norm() / want4.norm()).item() < 1e-2
    x1, w_gu = scope["x1"].double(), scope["w_gu"].double()
    gu = x1 @ w_gu.T
    want5 = (gu[:, :1024] * torch.sigmoid(gu[:, :1024]) * gu[:, 1024:]) @ wdn.T
    y5 = scope["y5"].double()
    assert y5.shape == (1, 4096) and ((y5 - want5).norm() / want5.norm()).item() < 2e-2
