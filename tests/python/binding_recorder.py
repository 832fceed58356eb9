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

    def launch(self, name):
        def call(*args, **kw):
            if self.fail:
                raise AssertionError(f"_C.{name} was called: an argument error must come before any launch")
            args, kw = [imported(a) for a in args], {k: imported(v) for k, v in kw.items()}
            self.calls.append((name, args, kw))
            if self.compute is not None:
                self.compute(name, args, kw)
        return call

    def read(self, index_error, stream=0):
        return self.bad


def record(monkeypatch, **kw):
    """A Recorder in place of _C.gate_up, _C.down and _C.read_index_error."""
    rec = Recorder(**kw)
    for name in ("gate_up", "down"):
        monkeypatch.setattr(gatedmlp._C, name, rec.launch(name))
    monkeypatch.setattr(gatedmlp._C, "read_index_error", rec.read)
    return rec
