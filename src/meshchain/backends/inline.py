"""Inline a kernel's body into a generated loop, indexing the loop's arrays directly.

Compiled loops are fastest when the kernel body sits inside the iteration loop with
no per-element array views: ``q[n]`` on a direct argument becomes ``_mc_d1[_mc_u, n]`` (``_mc_u``
is the element ``_mc_e`` as an unsigned integer: an index whose sign the compiler cannot know
costs a negative-index test per access, which also keeps loops from vectorizing),
``x1[0]`` through ``pedge[0]`` becomes ``_mc_d0[_mc_i0_0, 0]`` (the map value is loaded
once per iteration), and a reduction ``rms[0] += ...`` becomes a scalar local that
stays in a register. Values of READ dat arguments indexed by constants are loaded into
scalar locals once per element, so the compiler need not reload them after every store
to a written argument (a dat read in a loop is never written in it, so this is exact).
A kernel whose views escape (passed to a function, aliased,
indexed with a non-constant reduction index) or that uses ``return`` is not inlined:
the code generator then calls it as a function instead.

Examples
--------
>>> import meshchain as mc
>>> from meshchain.ir.loop import make_loop
>>> from meshchain.backends.inline import inline_body
>>> cells = mc.Set(2, "cells")
>>> q, s = mc.Dat(cells, 2, None, "q"), mc.Global(1, 0.0, "s")
>>> k = mc.Kernel.from_source("def f(a, t):\\n    t[0] += a[1]\\n")
>>> print("\\n".join(inline_body(make_loop(k, cells, (q(mc.READ), s(mc.INC))))))
_mc_v0_1 = _mc_d0[_mc_u, 1]
_mc_r1_0 += _mc_v0_1
"""

from __future__ import annotations

import ast
import copy

import numpy as np

from ..core.access import Access
from ..types.args import DIRECT, INDIRECT, STENCIL, WHOLE_MAP

__all__ = ["inline_body", "increment_name", "index_name", "map_target", "scalar_reduction"]


def index_name(spec) -> str:
    """The local holding ``map[e, index]`` for an indirect argument."""
    return f"_mc_i{spec.map_slot}_{spec.index}"


def map_target(spec, column: int) -> str:
    """The row map column ``column`` of an indirect or whole-map argument points at for element
    ``_mc_e``: read from the map, or for an extruded map found per layer (``spec.layers``, see
    :attr:`~meshchain.ir.loop.ArgSpec.layers`) the column's bottom-layer value
    (``_mc_c<map>_<column>``, loaded once per column) plus the layer ``_mc_lay`` times its offset."""
    if not spec.layers:
        return f"_mc_m{spec.map_slot}[_mc_u, {column}]"
    offset = spec.layers[1] if spec.kind == INDIRECT else spec.layers[1 + column]
    step = "" if offset == 0 else " + _mc_lay" if offset == 1 else f" + _mc_lay * _mc_np.uint64({offset})"
    return f"_mc_c{spec.map_slot}_{column}{step}"


def offset_row(spec, offset: int) -> str:
    """The row ``offset`` rows away from a direct or stencil argument's point: the element
    ``_mc_u``, or the grid row ``_mc_g`` (both unsigned, so no wraparound test per read)."""
    row = "_mc_g" if spec.grid else "_mc_u"
    if offset == 0:
        return row
    return f"{row} {'+' if offset > 0 else '-'} _mc_np.uint64({abs(offset)})"


def scalar_reduction(i: int, component: int) -> str:
    """The scalar local accumulating component ``component`` of reduction argument ``i``."""
    return f"_mc_r{i}_{component}"


def inline_body(loop) -> list[str] | None:
    """The kernel body rewritten for the generated loop, or None when it cannot be inlined."""
    tree = copy.deepcopy(loop.kernel.tree)
    if any(isinstance(n, ast.Return) for n in ast.walk(tree)):
        return None
    if any(isinstance(n, ast.Name) and n.id.startswith("_mc_") for n in ast.walk(tree)):
        return None
    rewriter = _Rewriter(dict(zip(loop.kernel.params, enumerate(loop.specs))), _scalar_increments(tree, loop))
    body = [rewriter.visit(statement) for statement in tree.body]
    if rewriter.escaped:
        return None
    loads = [f"{name} = {source}" for name, source in rewriter.loads.items()]
    return loads + [line for statement in body for line in ast.unparse(statement).splitlines()]


def increment_name(position: int, row: int, component: int) -> str:
    """The scalar local accumulating ``t[row, component]`` of whole-map INC argument ``position``."""
    return f"_mc_s{position}_{row}_{component}"


def _scalar_increments(tree, loop) -> set:
    """Positions of whole-map INC arguments that the kernel indexes with constants only: they
    accumulate in scalar locals (``increment_name``), added to their targets after the body as
    the gathered view's rows would be. Only float64 and signed data: a float32 local would
    accumulate in float64 where the view rounds to float32 at every store (signed sums wrap to
    the same bits, however wide), and unsigned ones would be typed as floats."""
    found = set()
    for position, (param, spec) in enumerate(zip(loop.kernel.params, loop.specs)):
        dtype = np.dtype(spec.dtype)
        if spec.kind != WHOLE_MAP or spec.access is not Access.INC or not (dtype.kind == "i" or dtype == np.float64):
            continue
        uses = [n for n in ast.walk(tree) if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)
                and n.value.id == param]
        if all(_constant_pair(n.slice, spec) is not None for n in uses):
            found.add(position)
    return found


def _constant_pair(index, spec):
    """``(row, component)`` of a constant two-index subscript of a whole-map view, else None."""
    if not (isinstance(index, ast.Tuple) and len(index.elts) == 2):
        return None
    row, component = _constant_index(index.elts[0], spec.arity), _constant_index(index.elts[1], spec.dim)
    return None if row is None or component is None else (row, component)


class _Rewriter(ast.NodeTransformer):
    def __init__(self, params, scalar_increments=frozenset()):
        self.params = params  # name -> (argument position, spec)
        self.scalar_increments = scalar_increments  # whole-map INC positions accumulating in scalar locals
        self.escaped = False
        self.loads: dict[str, str] = {}  # scalar local -> the array element it holds

    def visit_Subscript(self, node):
        if not (isinstance(node.value, ast.Name) and node.value.id in self.params):
            return self.generic_visit(node)
        position, spec = self.params[node.value.id]
        node.slice = self.visit(node.slice)
        if spec.kind == STENCIL:
            return self._stencil(node, position, spec)
        if spec.kind in (DIRECT, INDIRECT):
            row = ("_mc_g" if spec.grid else "_mc_u") if spec.kind == DIRECT else index_name(spec)
            component = _constant_index(node.slice, spec.dim)
            if spec.access is Access.READ and component is not None and isinstance(node.ctx, ast.Load):
                local = f"_mc_v{position}_{component}"
                self.loads[local] = f"_mc_d{spec.slot}[{row}, {component}]"
                return ast.copy_location(ast.Name(local, ast.Load()), node)
            node.value = ast.Name(f"_mc_d{spec.slot}", ast.Load())
            node.slice = ast.Tuple([ast.Name(row, ast.Load()), node.slice], ast.Load())
            return node
        if spec.kind == WHOLE_MAP:
            return self._whole_map(node, position, spec)
        if spec.access is Access.READ:
            node.value = ast.Name(f"_mc_d{spec.slot}", ast.Load())
            return node
        component = _constant_index(node.slice, spec.dim)
        if component is None:
            self.escaped = True
            return node
        return ast.copy_location(ast.Name(scalar_reduction(position, component), type(node.ctx)()), node)

    def _whole_map(self, node, position: int, spec):
        """``t[k, c]`` of a whole-map READ argument with constant ``k`` and ``c``: a scalar local
        loaded from target ``k``'s row; of an INC argument indexed so throughout, its scalar
        accumulator; any other use the gathered ``_mc_w<position>``."""
        pair = _constant_pair(node.slice, spec)
        if position in self.scalar_increments:
            return ast.copy_location(ast.Name(increment_name(position, *pair), type(node.ctx)()), node)
        if spec.access is Access.READ and isinstance(node.ctx, ast.Load) and pair is not None:
            local = f"_mc_v{position}_{pair[0]}_{pair[1]}"
            self.loads[local] = f"_mc_d{spec.slot}[{map_target(spec, pair[0])}, {pair[1]}]"
            return ast.copy_location(ast.Name(local, ast.Load()), node)
        node.value = ast.Name(f"_mc_w{position}", ast.Load())
        return node

    def _stencil(self, node, position: int, spec):
        """``u[k, c]`` with constant ``k`` and ``c``: the grid point ``k`` of the stencil, read
        from the dat at a constant row offset (a scalar local loaded once per element)."""
        index = node.slice
        if not (isinstance(index, ast.Tuple) and len(index.elts) == 2):
            self.escaped = True
            return node
        point = _constant_index(index.elts[0], len(spec.offsets))
        component = _constant_index(index.elts[1], spec.dim)
        if point is None or component is None:
            self.escaped = True
            return node
        row = offset_row(spec, spec.offsets[point])
        local = f"_mc_v{position}_{point}_{component}"
        self.loads[local] = f"_mc_d{spec.slot}[{row}, {component}]"
        return ast.copy_location(ast.Name(local, ast.Load()), node)

    def visit_Name(self, node):
        if node.id in self.params:
            self.escaped = True  # the whole view is used (call argument, alias, len, ...)
        return node


def _constant_index(index, dim: int) -> int | None:
    if isinstance(index, ast.Constant) and type(index.value) is int and -dim <= index.value < dim:
        return index.value % dim
    return None
