"""How gatedmlp's PyTorch operators are defined: torch.library at its own
level, one Python kernel for the call and one for autograd.

``torch.library.custom_op`` would define them in one line, but its calls
cross the dispatcher three times in Python (an autograd wrapper that
re-dispatches, a checking wrapper, the kernel): 13.5 us over the kernel's
own Python under ``torch.no_grad()`` on an x86 build machine, more than a
decode-sized launch. Defined here, a call costs one dispatcher trip and one
Python kernel (4.3 us there), which is what a compiled model (without CUDA
graphs) and a direct ``torch.ops.gatedmlp.*`` caller pay per call
(docs/notes/drop-in-and-decode.md, h74).

Each operator gets:

- its schema, inferred from the annotated Python function as custom_op
  infers it;
- that function as the kernel of every backend (CompositeExplicitAutograd):
  it is the one that launches, on CUDA tensors, and reaches the library's
  own error for any other;
- a fake (meta) implementation, for torch.compile, export and meta tensors;
- an Autograd kernel. There is no backward pass yet, so a call that would
  need one (grad enabled and a tensor argument requiring grad) raises here,
  before anything runs, instead of returning a result without a gradient.
  Otherwise it runs the kernel itself on plain CUDA tensors (the dispatch
  below autograd would only reach the same function through a second
  trip), and re-dispatches below autograd for anything else: fake and
  functional tensors while tracing, a dispatch mode, meta and CPU tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

import gatedmlp as _g

_LIB = torch.library.Library("gatedmlp", "FRAGMENT")
# custom_op's schema inference: public from PyTorch 2.5, private in 2.4 (the
# oldest torch this package takes).
_infer_schema = getattr(torch.library, "infer_schema", None)
if _infer_schema is None:  # pragma: no cover - PyTorch 2.4
    from torch._library.infer_schema import infer_schema as _infer_schema


def _tensor_positions(schema) -> tuple:
    """The positions of the Tensor and Tensor? arguments of a schema."""
    return tuple(i for i, a in enumerate(schema.arguments)
                 if isinstance(a.type, torch.TensorType) or
                 (isinstance(a.type, torch.OptionalType) and isinstance(a.type.getElementType(), torch.TensorType)))


class Operator:
    """gatedmlp::<name>, defined from `fn` (see the module's text), called as
    torch.ops.gatedmlp.<name>; register_fake is custom_op's decorator."""

    def __init__(self, name: str, fn):
        self.name = name
        _LIB.define(name + _infer_schema(fn, mutates_args=()))
        _LIB.impl(name, fn, "CompositeExplicitAutograd")
        op = getattr(torch.ops.gatedmlp, name).default
        tensors = _tensor_positions(op._schema)
        below = torch._C._AutoDispatchBelowAutograd
        modes = torch._C._len_torch_dispatch_stack

        def autograd(*args):
            # The dispatcher leaves out trailing arguments that equal their
            # schema defaults: args may be shorter than the schema.
            if torch.is_grad_enabled():
                for i in tensors:
                    t = args[i] if i < len(args) else None
                    if t is not None and t.requires_grad:
                        raise RuntimeError(_g._NO_BACKWARD)
            x = args[0]
            if type(x) is Tensor and x.is_cuda and not modes():
                return fn(*args)
            with below():
                return op(*args)

        _LIB.impl(name, autograd, "Autograd")

    def register_fake(self, fake):
        torch.library.register_fake(f"gatedmlp::{self.name}", fake, lib=_LIB)
        return fake


def operator(name: str):
    """Decorator: the annotated function as gatedmlp::<name> (an Operator)."""
    return lambda fn: Operator(name, fn)
