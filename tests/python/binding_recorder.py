"""A stand-in for the binding's launches, for the CPU tests of what the
Python wrappers hand the binding (test_moe.py, test_grouped.py)."""

import torch

import gatedmlp


def imported(v):
    """A DLPack capsule the wrappers hand the binding, as the tensor it
    shares memory with (a capsule can be consumed once: done here)."""
    return torch.utils.dlpack.from_dlpack(v) if type(v).__name__ == "PyCapsule" else v


class Recorder:
    """Stands in for the binding's launches: records what they were given
    (capsules as tensors), runs `compute` on them if given, and reports the
    index check (position, value) it is told to. fail: any launch is an
    error (argument errors must come first)."""

    def __init__(self, bad=(-1, 0), fail=False, compute=None):
        self.calls = []
        self.bad = bad
        self.fail = fail
        self.compute = compute
        self.defaults = {}

    def launch(self, name):
        defaults = self.defaults.get(name, {})

        def call(*args, **kw):
            if self.fail:
                raise AssertionError(f"_C.{name} was called: an argument error must come before any launch")
            # The keywords as the binding sees them: the wrappers pass only
            # those that differ from its defaults.
            kw = {**defaults, **kw}
            args, kw = [imported(a) for a in args], {k: imported(v) for k, v in kw.items()}
            self.calls.append((name, args, kw))
            if self.compute is not None:
                self.compute(name, args, kw)
        return call

    def read(self, index_error, stream=0):
        return self.bad


def keyword_defaults(fn):
    """{name: default} of a binding function's keyword-only parameters, read
    off its nanobind signature (the text names them, in order; the values
    are the defaults of the parameters that have one, in the same order)."""
    text, _, values = fn.__nb_signature__[0]
    params = text[text.index("(") + 1:text.rindex(")")].split(", ")
    with_default = [p.split(":")[0] for p in params if " = " in p]
    named = dict(zip(with_default, values))
    kw_only = params[params.index("*") + 1:]
    return {p.split(":")[0]: named[p.split(":")[0]] for p in kw_only if p.split(":")[0] in named}


def record(monkeypatch, **kw):
    """A Recorder in place of _C.gate_up, _C.down and _C.read_index_error."""
    rec = Recorder(**kw)
    for name in ("gate_up", "down"):
        rec.defaults[name] = keyword_defaults(getattr(gatedmlp._C, name))
        monkeypatch.setattr(gatedmlp._C, name, rec.launch(name))
    monkeypatch.setattr(gatedmlp._C, "read_index_error", rec.read)
    return rec
