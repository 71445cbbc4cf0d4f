"""Loops with mixed arguments, as loops over their components.

``mixed_dat(mode, mixed_map)`` hands the user's kernel one flat view of every component's
values (:mod:`meshchain.types.mixed`). :func:`expanded` turns such a loop into an ordinary
one: each mixed argument becomes its component arguments, and the kernel becomes a
generated *wrapper* that gathers the components' views into a flat local array, calls the
user's kernel on it (a helper function, as any kernel may call), and writes the array back
(``=`` for WRITE and RW, ``+=`` for INC). The wrapper is made once per kernel and argument
structure, so a loop called again finds its plan as any loop does, and every backend,
chain and communication-avoiding schedule sees plain arguments.

Examples
--------
>>> import meshchain as mc
>>> nodes, cells = mc.Set(3, "nodes"), mc.Set(1, "cells")
>>> c2n = mc.Map(cells, nodes, 3, [[0, 1, 2]], "c2n")
>>> x = mc.MixedDat(mc.MixedSet([nodes, nodes]), 1, None, "x")
>>> @mc.kernel
... def fill(v):
...     for k in range(6):
...         v[k] = k
>>> kernel, args, name = expanded(fill, (x(mc.WRITE, mc.MixedMap([c2n, c2n])),))
>>> kernel.name, len(args), name
('fill_mixed', 2, 'fill')
"""

from __future__ import annotations

import numpy as np

from ..core.access import Access
from ..core.errors import ArgumentCountError
from ..types.mixed import MixedArg
from ..types.mixed_mat import MixedMatArg
from .kernel import Kernel
from .loop import check_kernel, as_kernel

__all__ = ["expanded", "has_mixed"]

def has_mixed(args) -> bool:
    """True when one of ``args`` is a mixed argument."""
    return any(type(a) is MixedArg or type(a) is MixedMatArg for a in args)


def expanded(kernel, args, name=None) -> tuple:
    """``(wrapper kernel, component arguments, loop name)`` of a loop with mixed arguments
    (the loop keeps the user's kernel's name)."""
    kernel = as_kernel(kernel)
    name = name or kernel.name
    if len(kernel.params) != len(args):
        raise ArgumentCountError(
            f"par_loop {name!r}: kernel {kernel.name!r} takes {len(kernel.params)} argument(s) "
            f"({', '.join(kernel.params)}) but the loop passes {len(args)}; pass one loop argument per kernel parameter.")
    if all(hasattr(a, "view_shape") and hasattr(a, "access") for a in args):  # else make_loop names the bad one
        check_kernel(kernel, args, name)  # the user's kernel on its own views (the wrapper is checked as a loop)
    groups = [a.parts() if type(a) in (MixedArg, MixedMatArg) else (a,) for a in args]
    structure = tuple(_structure(a, parts) for a, parts in zip(args, groups))
    wrapper = kernel.derived.get(("mixed", structure))
    if wrapper is None:  # kept with the kernel: the wrapper refers to it, so a weak memo would never let go
        wrapper = kernel.derived[("mixed", structure)] = _wrapper(kernel, structure)
    return wrapper, tuple(p for parts in groups for p in parts), name


def _structure(arg, parts) -> tuple | None:
    """What the wrapper does with one argument: None (passes it through); ``("flat", mode,
    dtype, view shapes)`` for a mixed dat; ``("blocks", mode, dtype, (view shape, corners,
    block shapes))`` for a block matrix; ``("local", mode, dtype, (view shape,))`` for an
    increment or a matrix block, which the wrapper accumulates in a local array of its own
    (a kernel may only increment those, so it cannot hand them to the user's kernel)."""
    if type(arg) is MixedArg:
        return ("flat", arg.access, np.dtype(arg.data.dtype).name, tuple(p.view_shape for p in parts))
    if type(arg) is MixedMatArg:
        return ("blocks", arg.access, "float64", (arg.view_shape, arg.block_corners(), tuple(p.view_shape for p in parts)))
    data = getattr(arg, "data", getattr(arg, "mat", None))
    if getattr(arg, "access", None) is Access.INC or hasattr(arg, "mat"):
        return ("local", arg.access, np.dtype(data.dtype).name, (tuple(arg.view_shape),))
    return None


def _wrapper(kernel: Kernel, structure) -> Kernel:
    params, before, call, after = [], [], [], []
    for k, item in enumerate(structure):
        if item is None:
            params.append(f"_mc_a{k}")
            call.append(f"_mc_a{k}")
            continue
        how, access, dtype, shapes = item
        names = [f"_mc_a{k}_{i}" for i in range(len(shapes) if how != "blocks" else len(shapes[2]))]
        params += names
        buffer = f"_mc_b{k}"
        if how == "blocks":
            shape = f"({shapes[0][0]}, {shapes[0][1]})"
            pairs = [(f"{r0 + r}, {c0 + c}", f"{name}[{r}, {c}]") for name, (r0, c0), part in zip(names, *shapes[1:])
                     for r, c in np.ndindex(*part)]
        elif how == "flat":
            shape = str(sum(int(np.prod(s)) for s in shapes))
            pairs = list(_flat_pairs(names, shapes))
        else:
            shape = f"({', '.join(map(str, shapes[0]))},)"
            pairs = [(", ".join(map(str, index)), f"{names[0]}[{', '.join(map(str, index))}]")
                     for index in np.ndindex(*shapes[0])]
        before.append(f"{buffer} = mixed_np.zeros({shape}, dtype=mixed_np.{dtype})")
        if access in (Access.READ, Access.RW):
            before += [f"{buffer}[{at}] = {view}" for at, view in pairs]
        if access is not Access.READ:
            op = "+=" if access is Access.INC else "="
            after += [f"{view} {op} {buffer}[{at}]" for at, view in pairs]
        call.append(buffer)
    body = [*before, f"mixed_user({', '.join(call)})", *after]
    name = f"{kernel.name}_mixed"
    source = f"def {name}({', '.join(params)}):\n" + "".join(f"    {line}\n" for line in body)
    return Kernel.from_source(source, name=name, namespace={"mixed_np": np, "mixed_user": kernel})


def _flat_pairs(names, shapes):
    """``(flat position, component view element)`` for every value of the flat view."""
    at = 0
    for name, shape in zip(names, shapes):
        for index in np.ndindex(*shape):
            yield at, f"{name}[{', '.join(map(str, index))}]"
            at += 1
