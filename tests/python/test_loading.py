"""The extension next to other C++ libraries in one process.

The module links some libraries statically (nanobind, the gatedmlp library,
and libstdc++ too where the toolchain links it statically). If it exported
their symbols, a libstdc++.so.6 loaded before it -- `import torch` loads one --
would take over part of them (the STB_GNU_UNIQUE locale facet ids, whatever
the RTLD_ mode; all of it in the global scope), and the module would run with
two libstdc++ copies mixed: a segfault on the first std::ostringstream (repr
of a Problem or a Config) when their versions differ.
The module must export PyInit__gatedmlp and nothing else.
"""

import ctypes.util
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import gatedmlp
from gatedmlp import _gatedmlp

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF symbol interposition")

# Everything that formats through the C++ library's std::ostringstream, and a
# C++ exception on its way to Python.
EXERCISE = textwrap.dedent(
    """
    import copy
    import gatedmlp
    p = gatedmlp.Problem(m=3, k=64, u=32, weights=gatedmlp.WeightLayout(group=8))
    assert "m=3" in repr(p) and "group=8" in repr(p), repr(p)
    q = copy.deepcopy(p)
    assert repr(q) == repr(p)
    p.activation = gatedmlp.Activation.swiglu_clamped
    assert "limit=7" in repr(p), repr(p)
    assert "Config{" in repr(gatedmlp.Config())
    assert "group=8" in gatedmlp.to_string(p.weights)
    s = gatedmlp.check_support(gatedmlp.Problem(m=4, k=64, u=32, weights=gatedmlp.WeightLayout(group=5)))
    assert not s and "group" in s.message and "group" in repr(s), repr(s)
    try:
        gatedmlp.run(gatedmlp.Problem(m=4, k=64, u=32), gatedmlp.Arguments())
    except gatedmlp.InvalidArgumentError as e:
        assert "'x' is null" in str(e), str(e)
    else:
        raise AssertionError("run() with null pointers did not raise")
    print("ok", gatedmlp.__file__)
    """
)


def _run(prelude):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", prelude + EXERCISE], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.split()[-1] == gatedmlp.__file__


@linux_only
@pytest.mark.parametrize("mode", ["RTLD_LOCAL", "RTLD_GLOBAL"])
def test_works_after_libstdcxx(mode):
    # RTLD_LOCAL is how torch has it: a dependency of its libraries. Even so
    # its STB_GNU_UNIQUE symbols (the locale facet ids) win over any the
    # module exports.
    lib = ctypes.util.find_library("stdc++")
    if not lib:
        pytest.skip("no libstdc++ shared library")
    _run(f"import ctypes; ctypes.CDLL({lib!r}, mode=ctypes.{mode})\n")


@linux_only
def test_works_after_torch():
    pytest.importorskip("torch")
    _run("import torch\n")


@linux_only
def test_exports_only_the_module_init():
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("no nm")
    out = subprocess.run([nm, "-D", "--defined-only", _gatedmlp.__file__], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"nm failed: {out.stderr.strip()}")
    names = [line.split()[-1] for line in out.stdout.splitlines() if line.strip()]
    assert "PyInit__gatedmlp" in names
    cxx = [n for n in names if n.startswith("_Z")]
    assert not cxx, f"the extension exports {len(cxx)} C++ symbols, e.g. {cxx[:5]}"
