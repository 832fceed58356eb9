"""What a Python-defined PyTorch operator costs per call by itself, by the
shape of its schema (h86), and which arguments torch.compile's generated
code passes it. No GPU needed: the kernels do nothing, the tensors are on
the CPU.

    python3 scripts/experiments/op-boxing-cost.py [--compile] [--cpp]

Prints host µs per call (median of 15 x 5000) for no-op operators of 2
tensors, of gate_up's 13 arguments, of the same with schema defaults
(called with 2 and with 13 arguments), and of 5 tensors and one string of
options; with --compile, the line of Inductor's output code that calls an
operator whose schema has defaults; with --cpp, the same 13-argument schema
with a C++ kernel (built with torch.utils.cpp_extension, a minute or two):
the dispatcher's trip without Python in the kernel.
"""

import statistics
import sys
import time

import torch

GATE_UP = ("Tensor x, Tensor w, Tensor? w_up, Tensor? bias, Tensor? bias_up, str activation, float clamp_alpha, "
           "float clamp_limit, int group, str first, str storage, float alpha, ScalarType? out_dtype")
DEFAULTS = ("Tensor x, Tensor w, Tensor? w_up=None, Tensor? bias=None, Tensor? bias_up=None, str activation='silu', "
            "float clamp_alpha=1.702, float clamp_limit=7.0, int group=0, str first='gate', str storage='out_in', "
            "float alpha=1.0, ScalarType? out_dtype=None")


def main():
    lib = torch.library.Library("gatedmlp_boxing_probe", "DEF")
    schemas = {"two": "Tensor x, Tensor w", "gate_up": GATE_UP, "defaults": DEFAULTS,
               "options": "Tensor x, Tensor w, Tensor? w_up, Tensor? bias, Tensor? bias_up, str options"}
    for name, args in schemas.items():
        lib.define(f"{name}({args}) -> Tensor")
        lib.impl(name, lambda x, w, *rest: x.new_empty(x.shape[0], w.shape[0] // 2), "CompositeExplicitAutograd")
        torch.library.register_fake(f"gatedmlp_boxing_probe::{name}",
                                    lambda x, w, *rest: x.new_empty(x.shape[0], w.shape[0] // 2), lib=lib)
    P = torch.ops.gatedmlp_boxing_probe
    x, w = torch.randn(1, 8), torch.randn(16, 8)
    full = (None, None, None, "silu", 1.702, 7.0, 0, "gate", "out_in", 1.0, None)
    cpp = _cpp_op() if "--cpp" in sys.argv else None
    entries = {
        "python call of the kernel": lambda: x.new_empty(x.shape[0], w.shape[0] // 2),
        "2 tensors": lambda: P.two.default(x, w),
        "gate_up's 13 arguments": lambda: P.gate_up.default(x, w, *full),
        "with schema defaults, called with 2": lambda: P.defaults.default(x, w),
        "with schema defaults, called with 13": lambda: P.defaults.default(x, w, *full),
        "5 tensors and an options string": lambda: P.options.default(x, w, None, None, None,
                                                                     "silu;1.702;7.0;0;gate;out_in;1.0"),
    }
    if cpp is not None:
        entries["gate_up's 13 arguments, C++ kernel"] = lambda: cpp(x, w, *full)
    res = {n: [] for n in entries}
    with torch.inference_mode():
        for _ in range(15):
            for n, f in entries.items():
                t0 = time.perf_counter()
                for _ in range(5000):
                    f()
                res[n].append((time.perf_counter() - t0) / 5000 * 1e6)
    print("host µs per call, median of 15 x 5000")
    for n in entries:
        print(f"  {n:40s} {statistics.median(res[n]):7.2f}")
    if "--compile" in sys.argv:
        from torch._inductor.utils import run_and_get_code

        torch._dynamo.reset()
        _, codes = run_and_get_code(torch.compile(lambda a, b: P.defaults(a, b)), x, w)
        print("Inductor's call of an operator called with 2 of its 13 arguments:")
        for c in codes:
            for line in c.splitlines():
                if "gatedmlp_boxing_probe" in line and "=" in line and "assert" not in line:
                    print("  " + line.strip())


_CPP = r"""
#include <torch/library.h>
#include <ATen/ATen.h>

// gate_up's schema, a kernel that only allocates its result: what the
// dispatcher costs when the kernel is C++.
at::Tensor probe_gate_up(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>&,
                         const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, c10::string_view,
                         double, double, int64_t, c10::string_view, c10::string_view, double,
                         std::optional<at::ScalarType>) {
  return at::empty({x.size(0), w.size(0) / 2}, x.options());
}

TORCH_LIBRARY(gatedmlp_boxing_probe_cpp, m) {
  m.def("gate_up(Tensor x, Tensor w, Tensor? w_up, Tensor? bias, Tensor? bias_up, str activation, "
        "float clamp_alpha, float clamp_limit, int group, str first, str storage, float alpha, "
        "ScalarType? out_dtype) -> Tensor");
  m.impl("gate_up", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(probe_gate_up));
}
"""


def _cpp_op():
    from torch.utils.cpp_extension import load_inline

    load_inline("gatedmlp_boxing_probe_cpp", cpp_sources=_CPP, is_python_module=False, verbose=False)
    return torch.ops.gatedmlp_boxing_probe_cpp.gate_up.default


if __name__ == "__main__":
    main()
