"""The reference backend: plain Python and NumPy, one iteration after another.

It is slow and simple on purpose: every other execution path is tested against it.

Examples
--------
>>> import numpy as np, meshchain as mc
>>> mc.configure(backend="reference")
>>> cells = mc.Set(3, "cells")
>>> q = mc.Dat(cells, 1, [1.0, 2.0, 3.0], "q")
>>> total = mc.Global(1, 0.0, "total")
>>> @mc.kernel
... def add(a, s):
...     s[0] += a[0]
>>> mc.par_loop(add, cells, q(mc.READ), total(mc.INC))
>>> total.value.tolist()
[6.0]
>>> mc.configure(backend="numba")
"""

from __future__ import annotations


import numpy as np

from ..core.access import Access
from ..core.errors import AccessModeError, KernelRuntimeError
from ..ir.loop import argument_rows
from ..types.args import DIRECT, GLOBAL, INDIRECT, STENCIL
from .base import Backend, readonly

__all__ = ["ReferenceBackend"]


class ReferenceBackend(Backend):
    """Runs ``kernel.func`` in Python for each element in order."""

    name = "reference"
    can_tile = True

    def phase(self, runs, report):
        prepared = [(self.listed(run, report), range(run.start, run.end)) for run in runs if run.end > run.start]

        def call():
            for run, elements in prepared:
                run(elements, None)

        return call

    def listed(self, run, report):
        loop = run.loop
        func = loop.kernel.func

        def execute(elements, targets):
            targets = run.targets if targets is None else {**run.targets, **targets}
            accessors = [_accessor(run, i, targets.get(i)) for i in range(len(loop.args))]
            for e in elements:
                e = int(e)
                views = [get(e) for get, _ in accessors]
                try:
                    func(*views)
                except (IndexError, ValueError, ArithmeticError) as exc:
                    raise _kernel_failure(loop, e, exc) from exc
                for (_, put), view in zip(accessors, views):
                    if put is not None:
                        put(e, view)

        return execute


def _accessor(run, position: int, target=None):
    """``(get(e) -> view, put(e, view) or None)`` for argument ``position`` of ``run``'s loop."""
    arg, spec = run.loop.args[position], run.loop.specs[position]
    record = run.data[spec.slot]
    array = target if target is not None else (record.value if arg.kind == GLOBAL else record.host)
    source = readonly(array) if arg.access is Access.READ else array
    if arg.kind == GLOBAL:
        return (lambda e: source), None
    if arg.kind in (DIRECT, STENCIL):
        if arg.kind == DIRECT and not spec.grid:
            return (lambda e: source[e]), None
        if arg.kind == DIRECT:
            return (lambda e: source[argument_rows(spec, [e])[0, 0]]), None
        return (lambda e: source[argument_rows(spec, [e])[0]]), None  # a copy, like the compiled backends' buffer
    values = run.maps[spec.map_slot]
    if arg.kind == INDIRECT:
        column = values[:, arg.index]
        return (lambda e: source[column[e]]), None
    return _whole_map_accessor(arg.access, array, values)


def _whole_map_accessor(access, array, values):
    arity = values.shape[1]
    if access is Access.INC:
        def get(e):
            return np.zeros((arity, array.shape[1]), dtype=array.dtype)

        def put(e, view):
            for r in range(arity):
                array[values[e, r]] += view[r]

        return get, put

    def gather(e):
        return array[values[e]]  # a copy, like the compiled backends' buffers

    if access is Access.READ:
        return gather, None

    combine = {Access.MIN: np.minimum, Access.MAX: np.maximum}.get(access)

    def scatter(e, view):
        for r in range(arity):  # MIN/MAX: a target reached twice keeps the extreme of both
            row = values[e, r]
            array[row] = view[r] if combine is None else combine(array[row], view[r])

    return gather, scatter


def _kernel_failure(loop, element, exc):
    text = str(exc)
    if "read-only" in text:
        return AccessModeError(
            f"kernel {loop.kernel.name!r} in loop {loop.name!r} wrote to an argument declared READ "
            f"(element {element}); declare it WRITE, RW or INC."
        )
    return KernelRuntimeError(
        f"kernel {loop.kernel.name!r} in loop {loop.name!r} failed at element {element} of "
        f"{loop.iterset.name!r}: {type(exc).__name__}: {text}; check the kernel's indexing against the "
        f"argument views {[a.view_shape for a in loop.args]}."
    )
