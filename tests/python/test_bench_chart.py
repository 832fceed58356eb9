"""scripts/bench_chart.py on a fixture in the format `gatedmlp bench --json` writes.

The fixture (data/bench_sample.json) is synthetic ("synthetic": true): it
tests the script, it is not a measurement. Needs matplotlib
(scripts/requirements-chart.txt); skipped without it. No GPU, no extension.
"""

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_chart.py"
SAMPLE = Path(__file__).resolve().parent / "data" / "bench_sample.json"


def chart(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def assert_nontrivial_png(path, min_w=600, min_h=400):
    assert path.is_file(), f"{path} was not written"
    w, h = png_size(path)
    assert w >= min_w and h >= min_h, (w, h)
    assert path.stat().st_size > 30_000, path.stat().st_size  # a blank canvas compresses to a few KB
    import matplotlib.image as mpimg

    img = mpimg.imread(str(path))
    assert img.std() > 0.05  # drawn on, not a uniform canvas
    # Colour, not only grey: the three paths' lines are drawn.
    rgb = img[..., :3]
    assert (rgb.max(axis=-1) - rgb.min(axis=-1)).max() > 0.3


def test_fixture_has_the_bench_format():
    doc = json.loads(SAMPLE.read_text())
    assert doc["synthetic"] is True and "SYNTHETIC" in doc["note"]
    assert doc["tool"] == "gatedmlp bench"
    for key in ("device", "git_commit", "input_dtype", "output_dtype", "layout", "schedule", "cublas_mode"):
        assert key in doc
    models = {r["model"] for r in doc["rows"]}
    assert {"8b", "70b", "405b", "qwen-0.5b", "1024x2816", "llama-1b", "llama-3b"} <= models
    for r in doc["rows"]:
        for key in ("m", "k", "u", "fused_ms", "gemm_ms", "unfused_ms", "fused_tflops", "timing"):
            assert key in r
        assert r["timing"] == ("graph" if r["m"] <= 16 and r["k"] <= 3072 else "events")
        f = 2.0 * r["m"] * r["k"] * 2 * r["u"]
        assert r["fused_tflops"] == pytest.approx(f / (r["fused_ms"] * 1e-3) / 1e12, rel=1e-6)


def test_chart_of_the_sample(tmp_path):
    out = tmp_path / "docs" / "bench.png"  # the folder does not exist yet
    res = chart(SAMPLE, "-o", out)
    assert res.returncode == 0, res.stderr
    assert_nontrivial_png(out, min_w=1500, min_h=1000)  # 4 columns, 2 rows of models


def test_options_one_model_no_ratios_own_ceilings(tmp_path):
    out = tmp_path / "one.png"
    res = chart(SAMPLE, "-o", out, "--models", "8b", "--no-ratios", "--ceiling-tflops", "700",
                "--ceiling-tbps", "3.0", "--title", "test", "--date", "2000-01-01", "--commit", "abc1234")
    assert res.returncode == 0, res.stderr
    assert_nontrivial_png(out, min_w=500, min_h=400)


def test_skipped_bad_and_null_rows_are_drawn_around(tmp_path):
    doc = json.loads(SAMPLE.read_text())
    rows = [r for r in doc["rows"] if r["model"] == "405b"]
    rows[-1].update(skipped=True, fused_ms=None, gemm_ms=None, unfused_ms=None, note="needs 90 GiB")
    rows[0]["bad"] = True
    rows[1]["fused_ms"] = None  # fused not timed (plan refused)
    doc["rows"] = rows
    src = tmp_path / "b.json"
    src.write_text(json.dumps(doc))
    out = tmp_path / "b.png"
    res = chart(src, "-o", out)
    assert res.returncode == 0, res.stderr
    assert_nontrivial_png(out, min_w=500, min_h=400)


def test_unknown_device_needs_ceilings_or_no_roofline(tmp_path):
    doc = json.loads(SAMPLE.read_text())
    doc["device"] = "Some Future GPU"
    src = tmp_path / "d.json"
    src.write_text(json.dumps(doc))
    res = chart(src, "-o", tmp_path / "d.png")
    assert res.returncode == 1
    assert "--ceiling-tflops" in res.stderr and not (tmp_path / "d.png").exists()
    assert chart(src, "-o", tmp_path / "d.png", "--no-roofline").returncode == 0
    doc["ceiling_tflops"], doc["ceiling_tbps"] = 500, 2.0  # ceilings carried in the JSON
    src.write_text(json.dumps(doc))
    assert chart(src, "-o", tmp_path / "e.png").returncode == 0


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        ('{"tool": "gatedmlp bench --host", "entries": []}', "--host"),
        ('{"tool": "gatedmlp bench", "device": "x"}', "no 'rows'"),
        ('{"tool": "gatedmlp bench", "rows": []}', "empty"),
        ('{"rows": [{"model": "8b", "m": 1, "k": 4096, "u": 14336, "fused_ms": 0.1}]}', "lacks gemm_ms"),
        ('{"rows": [{"model": "8b", "m": 1, "k": 4096, "u": 14336, "skipped": true, "fused_ms": null, '
         '"gemm_ms": null, "unfused_ms": null}]}', "none of the 1 rows has a time"),
    ],
)
def test_clear_message_when_the_json_lacks_what_it_needs(tmp_path, content, message):
    src = tmp_path / "x.json"
    src.write_text(content)
    res = chart(src, "-o", tmp_path / "x.png")
    assert res.returncode == 1
    assert message in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "x.png").exists()


def test_missing_file(tmp_path):
    res = chart(tmp_path / "nope.json", "-o", tmp_path / "x.png")
    assert res.returncode == 1 and "no such file" in res.stderr
