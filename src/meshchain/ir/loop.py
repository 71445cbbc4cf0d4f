"""Parallel-loop records: validated at ``par_loop`` time, executed by a backend later.

Examples
--------
>>> import meshchain as mc
>>> from meshchain.ir.loop import make_loop
>>> cells = mc.Set(2, "cells")
>>> q = mc.Dat(cells, 1, [1.0, 2.0], "q")
>>> @mc.kernel
... def twice(a):
...     a[0] *= 2
>>> loop = make_loop(twice, cells, (q(mc.RW),))
>>> loop.name, [s.kind for s in loop.specs]
('twice', ['direct'])
"""

from __future__ import annotations

import dataclasses
import functools
import types
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..core.access import Access
from ..core.cache import memo
from ..core.errors import AccessModeError, ArgumentCountError, LoopError, SetMismatchError
from .kernel import Kernel
from ..types import Arg, ExtrudedSet, Grid, GridInterior, Set
from ..types.layers import layered as every_layer
from ..types.maps import ColumnsMap, ExtrudedMap
from ..types.args import DIRECT, GLOBAL, STENCIL, ShapeKey

__all__ = ["ParLoop", "ArgSpec", "make_loop", "exclusivity_error", "argument_rows", "map_rows_of"]


class ArgSpec(NamedTuple):
    """What code generation needs to know of one argument (hashable).

    ``slot`` numbers the distinct dats/globals of the loop, ``map_slot`` the distinct maps.
    """

    kind: str
    access: Access
    dim: int
    dtype: str
    arity: int
    index: int
    slot: int
    map_slot: int
    offsets: tuple = ()  # a stencil argument's offsets, as differences of row numbers
    grid: tuple = ()  # loops over grid.interior(w): (grid shape, corner, interior shape) to find the row:
    # element e is the point ``corner + unravel(e, interior shape)`` of a row-major array of the grid shape
    # (on one process the whole grid, corner (w, ..., w); on a rank the block's arithmetic part, see
    # meshchain.engine.grids)
    layers: tuple = ()  # an argument through an extruded map, in a loop over every layer that finds each layer's
    # targets by arithmetic: (layers, the offset of its map column) for map[i], (layers, every offset) for a whole map;
    # the loop then gets the map's bottom-layer rows (see meshchain.types.extruded)


@dataclass(frozen=True, eq=False)
class ParLoop:
    """One recorded parallel loop."""

    kernel: Kernel
    iterset: Set
    args: tuple
    name: str
    specs: tuple
    data: tuple  # distinct Dat/Global objects, in slot order
    maps: tuple  # distinct Map objects, in map_slot order
    origin: object = None  # the recorded loop this one runs a part of (a grid loop's arithmetic part)
    written: object = None  # a grid loop lowered to maps: the loop as the program wrote it

    @property
    def recorded(self) -> "ParLoop":
        """The loop as the program recorded it: :attr:`origin`, or this one."""
        return self if self.origin is None else self.origin

    @functools.cached_property
    def shape(self) -> ShapeKey:
        """What plans for this loop depend on besides its objects: the kernel, set, name, the
        arguments' specs and maps, the objects' sets (and for a grid loop lowered to maps,
        the loop as written). Equal for a loop over new objects declared alike."""
        datasets = tuple(None if obj.is_global else obj.dataset for obj in self.data)
        related = tuple(None if other is None else other.shape for other in (self.origin, self.written))
        return ShapeKey((self.kernel, self.iterset, self.name, self.specs, self.maps, datasets, related))

    @functools.cached_property
    def indirect_writes(self) -> tuple:
        """``(map, index)`` pairs (index ``None`` = every column) through which the loop writes."""
        return tuple(
            (a.map, a.index) for a in self.args if a.map is not None and a.access is not Access.READ
        )

    @functools.cached_property
    def reads(self) -> tuple:
        """Dats and globals whose values before the loop it may use (every mode but WRITE;
        an increment adds to the old value)."""
        return _distinct(a.data for a in self.args if a.access is not Access.WRITE)

    @functools.cached_property
    def writes(self) -> tuple:
        """Dats and globals the loop may change."""
        return _distinct(a.data for a in self.args if a.access.writes)

    @functools.cached_property
    def read_ids(self) -> frozenset:
        """The ``id`` of each object in :attr:`reads` (the loop holds them, so the ids stay theirs)."""
        return frozenset(map(id, self.reads))

    @functools.cached_property
    def write_ids(self) -> frozenset:
        """The ``id`` of each object in :attr:`writes`."""
        return frozenset(map(id, self.writes))

    @functools.cached_property
    def with_stored_rows(self) -> "ParLoop":
        """This loop reading every layer's stored map rows instead of finding an extruded map's
        targets per layer by arithmetic (:attr:`ArgSpec.layers`; this loop itself where it does not):
        what a rank runs where its local numbering breaks the arithmetic (see
        :meth:`~meshchain.partition.layout.MeshLayout.follows_layers`)."""
        if not any(spec.layers for spec in self.specs):
            return self
        return dataclasses.replace(self, specs=tuple(spec._replace(layers=()) for spec in self.specs),
                                   origin=self.recorded)

    def __repr__(self) -> str:
        return f"par_loop({self.name}, {self.iterset.name}, {', '.join(map(repr, self.args))})"


def _distinct(objects) -> tuple:
    seen = {}
    for obj in objects:
        seen.setdefault(id(obj), obj)
    return tuple(seen.values())


_wrapped = memo("kernels of plain functions", weak=True)


def as_kernel(kernel) -> Kernel:
    """Accept a :class:`Kernel` or wrap a plain Python function (once)."""
    if isinstance(kernel, Kernel):
        return kernel
    if isinstance(kernel, types.FunctionType):
        if kernel not in _wrapped:
            _wrapped[kernel] = Kernel(kernel)
        return _wrapped[kernel]
    raise LoopError(f"par_loop: the first argument must be a kernel (decorate it with @mc.kernel), got {type(kernel).__name__}.")


def make_loop(kernel, iterset, args, name=None, *, exclusive=None, geometry=None, layered=False) -> ParLoop:
    """Validate a ``par_loop`` call and build its record.

    ``exclusive(arg, name)`` checks an indirect ``RW`` argument's path (see
    :func:`exclusivity_error`); the session passes one that agrees over ranks.
    ``geometry`` ``(shape, corner, inner)``: for a loop over a grid's interior, where its
    elements lie in the grid dats' rows (see :attr:`ArgSpec.grid`); by default the whole
    grid's, ``(grid.shape, (w, ..., w), interior.shape)``. ``layered``: a loop over every layer of
    an :class:`~meshchain.ExtrudedSet` finds the targets of its extruded maps by arithmetic
    (:attr:`ArgSpec.layers`; the session asks for it on backends that can; a rank whose local
    numbering breaks the arithmetic runs :attr:`ParLoop.with_stored_rows`).
    """
    kernel = as_kernel(kernel)
    name = name or kernel.name
    if not isinstance(iterset, Set):
        raise SetMismatchError(f"par_loop {name!r}: the iteration set must be a meshchain.Set, got {type(iterset).__name__}.")
    for position, arg in enumerate(args):
        _check_arg(arg, position, iterset, name)
    if len(args) != len(kernel.params):
        raise ArgumentCountError(
            f"par_loop {name!r}: kernel {kernel.name!r} takes {len(kernel.params)} argument(s) "
            f"({', '.join(kernel.params)}) but the loop passes {len(args)}; pass one loop argument per kernel parameter."
        )
    _check_races(args, name)
    check_kernel(kernel, args, name)
    if exclusive is not None:
        for arg in args:
            if arg.access is Access.RW and arg.map is not None:
                exclusive(arg, name)
    data_slots = _slots(a.data for a in args)
    map_slots = _slots(a.map for a in args if a.map is not None)
    if geometry is None and isinstance(iterset, GridInterior):
        geometry = (iterset.grid.shape, (iterset.width,) * len(iterset.shape), iterset.shape)
    layers = iterset.layers if layered and isinstance(iterset, ExtrudedSet) else 0
    specs = tuple(_spec(a, data_slots, map_slots, geometry)._replace(layers=_layers(a, iterset, layers)) for a in args)
    return ParLoop(kernel, iterset, tuple(args), name, specs, _objects(data_slots), _objects(map_slots))


def _check_arg(arg, position: int, iterset: Set, name: str) -> None:
    if not isinstance(arg, Arg):
        if hasattr(arg, "is_global"):
            raise LoopError(
                f"par_loop {name!r}: argument {position} is {type(arg).__name__} {arg.name!r} without an access "
                f"mode; pass {arg.name}(mc.READ) (or another mode) instead."
            )
        raise LoopError(f"par_loop {name!r}: argument {position} is a {type(arg).__name__}, not a loop argument.")
    if arg.data.is_global:
        return
    if arg.stencil is not None or (isinstance(iterset, GridInterior) and not isinstance(arg.map, ColumnsMap)):
        _check_grid_arg(arg, position, iterset, name)
        return
    if arg.map is None and arg.data.dataset is not iterset:
        raise SetMismatchError(
            f"par_loop {name!r} over {iterset.name!r}: direct argument {position} (Dat {arg.data.name!r}) lives on "
            f"{arg.data.dataset.name!r}; reach it through a map from {iterset.name!r}."
        )
    if arg.map is not None and arg.map.source is not iterset:
        raise SetMismatchError(
            f"par_loop {name!r} over {iterset.name!r}: argument {position} uses map {arg.map.name!r}, whose source set "
            f"is {arg.map.source.name!r}; use a map from {iterset.name!r}."
        )


def _check_grid_arg(arg, position: int, iterset: Set, name: str) -> None:
    """A direct or stencil argument of a loop over a grid or a grid's interior."""
    grid = iterset.grid if isinstance(iterset, GridInterior) else iterset
    width = iterset.width if isinstance(iterset, GridInterior) else 0
    where = f"par_loop {name!r} over {iterset.name!r}: argument {position} (Dat {arg.data.name!r})"
    if arg.map is not None:
        raise SetMismatchError(f"{where} goes through map {arg.map.name!r}; loops over a grid's interior read grid "
                               f"dats directly or through a Stencil.")
    if arg.data.dataset is not grid:
        raise SetMismatchError(f"{where} lives on {arg.data.dataset.name!r}, not on the grid {grid.name!r}.")
    if arg.stencil is None:
        return
    if not isinstance(grid, Grid):
        raise SetMismatchError(f"{where}: stencil {arg.stencil.name!r} needs a loop over a Grid or its interior.")
    too_far = [d for d, r in enumerate(arg.stencil.reach) if r > width]
    if too_far:
        d = too_far[0]
        raise SetMismatchError(
            f"{where}: stencil {arg.stencil.name!r} reaches {arg.stencil.reach[d]} point(s) along axis {d}, beyond "
            f"the grid {grid.name!r} from the loop's outermost points; run the loop over "
            f"{grid.name}.interior({max(arg.stencil.reach)}) (reads outside the grid are not defined).")


def _check_races(args, name: str) -> None:
    """One object may be written by several args only if all of them increment it (or all take
    its minimum, or all its maximum: the order of the contributions does not matter)."""
    modes: dict[int, list] = {}
    for arg in args:
        modes.setdefault(id(arg.data), []).append(arg)
    for uses in modes.values():
        written = [a for a in uses if a.access.writes]
        if not written or len(uses) == 1:
            continue
        kinds = {a.access for a in uses}
        if len(kinds) != 1 or not next(iter(kinds)).is_reduction:
            raise AccessModeError(
                f"par_loop {name!r}: {uses[0].data.name!r} is passed {len(uses)} times with modes "
                f"{', '.join(a.access.value for a in uses)}; an object written in a loop may appear more than once "
                f"only if every use is INC (or every use MIN, or MAX) — split the loop or pass it once."
            )


def check_kernel(kernel: Kernel, args, name: str) -> None:
    """Backend-independent kernel checks: its globals resolve, its constant indices fit the
    views, and it does not assign to an argument declared READ."""
    kernel.constants()
    kernel.index_safety(a.view_shape for a in args)
    for param, arg in zip(kernel.params, args):
        if arg.access is Access.INC:
            _check_increment_only(kernel, param, arg, name)
        if arg.access is Access.READ and param in kernel.written_params:
            raise AccessModeError(
                f"kernel {kernel.name!r} in loop {name!r} writes to {param!r}, an argument declared READ "
                f"({arg!r}); declare it WRITE, RW or INC, or stop writing to it."
            )


def _check_increment_only(kernel: Kernel, param: str, arg: Arg, name: str) -> None:
    bad = kernel.non_increment_uses(param)
    if bad:
        raise AccessModeError(
            f"kernel {kernel.name!r} in loop {name!r} at {kernel.where(bad[0])}: {param!r} is passed as INC "
            f"({arg!r}) but is used other than through '{param}[...] += ...' or '-= ...'; an INC argument may "
            f"only be incremented — declare it RW to read it, or accumulate into a local first."
        )


def exclusivity_error(arg: Arg, name: str, values, global_ids=None):
    """The error for an indirect RW argument whose path reaches a target element from more
    than one iteration (the result would depend on the order the iterations run in), or
    None. ``values`` are the map's values on this rank, ``global_ids`` the target set's
    global ids in local numbering (for the message; None on one process).

    Indirect WRITE is allowed: when several iterations write one element, which value
    survives is deterministic for a given mesh and block size, but unspecified. On several
    ranks each rank checks its rows (the owner of a target sees every row reaching it);
    the caller makes the ranks agree.
    """
    picked = values if arg.index is None else values[:, arg.index]
    counts = np.bincount(picked.ravel()) if picked.size else np.zeros(0, dtype=np.int64)
    if not counts.size or counts.max() <= 1:
        return None
    element = int(np.argmax(counts))
    element = element if global_ids is None else int(global_ids[element])
    path = arg.map.name if arg.index is None else f"{arg.map.name}[{arg.index}]"
    return AccessModeError(
        f"par_loop {name!r}: {arg.data.name!r} is accessed RW through {path}, but element {element} of "
        f"{arg.map.target.name!r} is reached more than once, so the result would depend on the iteration "
        f"order; use INC to combine contributions, or READ it here and write it in a loop over "
        f"{arg.map.target.name!r}."
    )


def _slots(objects) -> dict:
    """``id(object) -> (slot, object)`` for the distinct objects, numbered in order of appearance."""
    slots: dict = {}
    for obj in objects:
        if id(obj) not in slots:
            slots[id(obj)] = (len(slots), obj)
    return slots


def _objects(slots: dict) -> tuple:
    return tuple(obj for _, obj in slots.values())


def _spec(arg: Arg, data_slots: dict, map_slots: dict, geometry=None) -> ArgSpec:
    slot = data_slots[id(arg.data)][0]
    map_slot = -1 if arg.map is None else map_slots[id(arg.map)][0]
    arity = 0 if arg.map is None else arg.map.arity
    index = -1 if arg.index is None else arg.index
    kind = GLOBAL if arg.data.is_global else arg.kind
    offsets, grid = (), ()
    if kind == STENCIL:
        shape = arg.data.dataset.shape if geometry is None else geometry[0]
        offsets = tuple(linear_offset(point, shape) for point in arg.stencil.offsets)
    if geometry is not None and kind in (DIRECT, STENCIL):
        grid = geometry
    return ArgSpec(kind, arg.access, arg.data.dim, arg.data.dtype.str, arity, index, slot, map_slot, offsets, grid)


def _layers(arg: Arg, iterset, layers: int) -> tuple:
    """:attr:`ArgSpec.layers` of ``arg`` in a loop over ``layers`` layers of ``iterset`` (0: not by arithmetic)."""
    m = arg.map
    if not layers or not isinstance(m, ExtrudedMap) or m.source is not iterset:
        return ()
    return (layers, m.offset[arg.index]) if arg.index is not None else (layers, *m.offset)


def argument_rows(spec: ArgSpec, elements) -> np.ndarray:
    """The rows a direct or stencil argument reaches for each of ``elements`` (one column per
    stencil point): the elements themselves, or their grid points by the spec's geometry.

    >>> spec = ArgSpec(STENCIL, Access.READ, 1, "<f8", 0, -1, 0, -1, (0, -5, 5), ((4, 5), (1, 1), (2, 3)))
    >>> argument_rows(spec, [0, 4]).tolist()
    [[6, 1, 11], [12, 7, 17]]
    """
    elements = np.asarray(elements, dtype=np.int64)
    rows = elements
    if spec.grid:
        shape, corner, inner = spec.grid
        index = np.unravel_index(elements, inner)
        rows = np.ravel_multi_index(tuple(i + c for i, c in zip(index, corner)), shape).astype(np.int64)
    return rows[:, None] + np.asarray(spec.offsets or (0,), dtype=np.int64)[None, :]


def map_rows_of(spec: ArgSpec, values, elements) -> np.ndarray:
    """The rows an argument through a map reaches for each of ``elements``: ``(n, 1)`` for
    ``map[i]``, ``(n, arity)`` for a whole map. ``values`` is what the loop is given of the map:
    its rows, or for an extruded map found per layer (:attr:`ArgSpec.layers`) the bottom layer's.

    >>> from meshchain.types.args import INDIRECT
    >>> spec = ArgSpec(INDIRECT, Access.READ, 1, "<f8", 2, 1, 0, 0, layers=(3, 2))
    >>> map_rows_of(spec, np.array([[0, 10], [4, 20]]), [0, 2, 4]).tolist()
    [[10], [14], [22]]
    """
    columns = slice(None) if spec.index is None or spec.index < 0 else slice(spec.index, spec.index + 1)
    values = np.asarray(values)[:, columns]
    if spec.layers:
        values = every_layer(values, spec.layers[1:], spec.layers[0])
    return values[np.asarray(elements, dtype=np.int64)]


def linear_offset(point, shape) -> int:
    """The difference of row numbers between a grid point and the point ``point`` away (row-major).

    >>> linear_offset((1, -1), (4, 5))
    4
    """
    offset = 0
    for d, n in zip(point, shape):
        offset = offset * n + d
    return offset
