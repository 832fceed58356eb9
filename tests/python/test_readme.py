"""The README's Python quick start, as written: it must parse everywhere and
run on a GPU (a newcomer copies it as it stands)."""
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _block_after(heading: str) -> str:
    text = README.read_text()
    section = text.split(heading, 1)[1]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, f"no python block after {heading!r}"
    return m.group(1)


def test_quick_start_parses():
    compile(_block_after("## Python quick start"), "README quick start", "exec")
    compile(_block_after("## Hugging Face models"), "README Hugging Face", "exec")


def test_quick_start_runs():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    scope = {}
    exec(compile(_block_after("## Python quick start"), "README quick start", "exec"), scope)
    assert scope["y"].shape == (16, 14336) and torch.isfinite(scope["y"]).all()
    assert scope["y2"].shape == (16, 14336) and torch.isfinite(scope["y2"]).all()
