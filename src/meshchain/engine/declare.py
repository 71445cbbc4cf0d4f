"""Declarations as the session records them: agreed over ranks, with their storage.

On one process a declaration only needs its storage (a dat's rows, a global's value, a
map's checked values). On several ranks every set, map and dat is also recorded, in
declaration order, with what must be the same on every rank (checked collectively, so a
rank that declares something else raises the same error as every other rank); dats and
maps keep this rank's block of rows until ``mc.partition`` lays the mesh out, and dats
declared afterwards fetch their rows by global id at once.

Examples
--------
>>> import numpy as np, meshchain as mc
>>> cells = mc.Set(3, "cells")
>>> q = mc.Dat(cells, 2, None, "q", dtype=np.float32)
>>> storage = mc.get_runtime().store.get(q)
>>> storage.host.shape, storage.host.dtype, storage.valid_depth
((3, 2), dtype('float32'), 0)
"""

from __future__ import annotations

import weakref

import numpy as np

from ..comm.agree import alive_everywhere, check_agreement, raise_together, values_if_different
from ..comm.blocks import block_offsets
from ..comm.collectives import fetch_rows
from ..comm.inputs import block_rows_or_whole, describe, to_block_rows
from ..core.errors import DataShapeError, DeclarationError, MapError
from ..core.storage import DatStorage, GlobalStorage
from ..types import Dat, GridInterior, Map, Set
from ..types.maps import checked_values

__all__ = ["Declarations"]

_PRUNE_AT = 4096  # dead weak references to declared objects kept at most about this many


class Declarations:
    """The sets, maps and dats of one session, in declaration order (weakly held), and the
    maps' declared values (whole on one process, this rank's block on several)."""

    def __init__(self, mesh):
        self._mesh = mesh
        self._declared: list = []
        self._prune_at = _PRUNE_AT  # the list's length at which dead references are dropped
        self._count = 0  # objects declared on several ranks: a declaration's position (the same on every rank)
        self.map_rows: dict = {}  # map uid -> values (global numbering)

    @property
    def comm(self):
        return self._mesh.comm

    # --- declaring ------------------------------------------------------------------------------

    def set(self, s: Set) -> None:
        mesh = self._mesh
        if not mesh.distributed:
            self._remember(s)  # one process: nothing to agree on
        else:
            if mesh.partitioned:
                hint = (f"call {s.grid.name}.interior({s.width}) once before mc.partition (loops may then use it)"
                        if isinstance(s, GridInterior) else "declare every set and map before partitioning")
                raise_together(self.comm, DeclarationError(f"Set {s.name!r} is declared after mc.partition; {hint}."))
            self._record(s, (s.size, s.name))

    def map(self, m: Map, values) -> None:
        mesh = self._mesh
        if not mesh.distributed:
            self.map_rows[m.uid] = checked_values(values, m.source, m.target, m.arity, m.name)
            _forget(self.map_rows, m)
            self._remember(m)
            return
        if mesh.partitioned:
            raise_together(self.comm, DeclarationError(
                f"Map {m.name!r} is declared after mc.partition; declare every set and map before partitioning."))
        error, rows = None, None
        try:
            rows = to_block_rows(self.comm, values, m.source.size, f"Map {m.name!r}")
            if rows is None:
                raise MapError(f"Map {m.name!r}: values are missing; pass an integer array of shape "
                               f"{(m.source.size, m.arity)}.")
            rows = checked_values(rows, m.source, m.target, m.arity, m.name, rows=len(rows))
        except MapError as exc:
            error = exc
        raise_together(self.comm, error)
        self.map_rows[m.uid] = rows.astype(np.int64)
        _forget(self.map_rows, m)
        self._record(m, (m.name, m.source.name, m.target.name, m.arity))

    def dat(self, d: Dat, data, dtype) -> tuple[np.dtype, DatStorage]:
        """The dat's dtype and storage (block rows before partitioning, local rows after)."""
        mesh = self._mesh
        if not mesh.distributed:
            chosen, rows = d.rows(data, dtype, d.dataset.size)
            self._remember(d)
            return chosen, DatStorage(rows, n_owned=d.dataset.size)
        data = d.as_rows(data)
        described = describe(data)
        alike, chosen = self._agreed_alike(d, data, dtype, described)
        if alike and data is None:  # a temporary, declared alike everywhere: one small Allreduce
            return chosen, self._zeros(d, chosen, self._append(d) % 32000 + 1)
        if alike:  # the same array on every rank: the same Allreduce, no messages
            return self._from_whole(d, data, dtype)
        comm, n = self.comm, d.dataset.size
        offsets = block_offsets(n, comm.size)
        rows, whole = block_rows_or_whole(comm, data, n, f"Dat {d.name!r} on {d.dataset.name!r}", described=described)
        if whole is not None and mesh.partitioned:  # every rank holds every row: each takes its own, no messages
            rows, count = whole, n
        else:
            whole, count = None, _block_count(offsets, comm.rank)
        error = None
        try:
            chosen, block = d.rows(rows, dtype, count)
        except DataShapeError as exc:
            error = exc
        raise_together(comm, error)
        tag = self._record(d, (d.name, d.dataset.name, d.dim, chosen.str)) % 32000 + 1
        if not mesh.partitioned:
            return chosen, DatStorage(block, n_owned=len(block), tag=tag)
        layout = mesh.layout.of(d.dataset)
        local = block[layout.global_ids] if whole is not None else fetch_rows(comm, offsets, block, layout.global_ids)
        return chosen, DatStorage(local, n_owned=layout.n_owned, valid_depth=mesh.layout.depth, tag=tag)

    def _from_whole(self, d: Dat, data, dtype) -> tuple[np.dtype, DatStorage]:
        """The dtype and storage of a dat every rank passed the same array for (agreed by
        :meth:`_agreed_alike`): this rank's rows taken from it, no messages. Every rank checks
        and copies the whole array, so a check fails alike everywhere."""
        mesh, n = self._mesh, d.dataset.size
        chosen, rows = d.rows(data, dtype, n)
        tag = self._append(d) % 32000 + 1
        if not mesh.partitioned:
            offsets = block_offsets(n, self.comm.size)
            block = rows[offsets[self.comm.rank]:offsets[self.comm.rank + 1]].copy()
            return chosen, DatStorage(block, n_owned=len(block), tag=tag)
        layout = mesh.layout.of(d.dataset)
        return chosen, DatStorage(rows[layout.global_ids], n_owned=layout.n_owned, valid_depth=mesh.layout.depth,
                                  tag=tag)

    def _zeros(self, d: Dat, dtype, tag: int) -> DatStorage:
        """The storage of a dat no rank passed data for: zeros, halos included (valid)."""
        mesh = self._mesh
        if not mesh.partitioned:
            count = _block_count(block_offsets(d.dataset.size, self.comm.size), self.comm.rank)
            block = np.zeros((count, d.dim), dtype=dtype)
            return DatStorage(block, n_owned=len(block), tag=tag)
        layout = mesh.layout.of(d.dataset)
        local = np.zeros((len(layout.global_ids), d.dim), dtype=dtype)
        return DatStorage(local, n_owned=layout.n_owned, valid_depth=mesh.layout.depth, tag=tag)

    def _agreed_alike(self, d: Dat, data, dtype, described: tuple) -> tuple:
        """``(alike, dtype)``: whether every rank declared ``d`` alike (the same name, set,
        dim and dtype, and no data, a temporary, or the same array, by
        :func:`~meshchain.comm.inputs.describe`), checked on every rank in one small
        ``Allreduce`` (not alike: checked the long way); the dtype of a temporary (else None)."""
        error = chosen = None
        if data is None:
            try:
                chosen, _ = d.rows(None, dtype, 0)
            except DataShapeError as exc:
                error = exc
        agreed = (described, (d.name, d.dataset.name, d.dim, repr(dtype) if chosen is None else chosen.str))
        differing = values_if_different(self.comm, agreed, error)
        if differing is None:
            return described[0] != "block", chosen
        if data is not None or not all(kind[0] == "none" for kind, _ in differing):
            return False, None
        raise DataShapeError(f"Dat declaration {agreed[1]!r} differs between ranks: "
                             f"{[value for _, value in differing]}; every rank must pass the same value.")

    def adopt(self, other: "Declarations") -> None:
        """Take over ``other``'s record of declarations (one process, ``mc.reset_runtime``)."""
        self._declared = [r for r in other._declared if r() is not None]
        self._count = other._count

    @staticmethod
    def global_(value: np.ndarray) -> GlobalStorage:
        return GlobalStorage(value)

    def _remember(self, obj) -> None:
        """Record ``obj``: a weak reference, dead ones dropped now and then (a program that makes a
        temporary per step keeps a short list)."""
        self._declared.append(weakref.ref(obj))
        if len(self._declared) >= self._prune_at:
            self._declared = [r for r in self._declared if r() is not None]
            self._prune_at = max(_PRUNE_AT, 2 * len(self._declared))

    def _record(self, obj, agreed) -> int:
        """Check that ``agreed`` is the same on every rank and record ``obj``; returns its
        position in the declaration order (the same on every rank)."""
        check_agreement(self.comm, (type(obj).__name__, agreed), f"{type(obj).__name__} declaration {agreed!r}")
        return self._append(obj)

    def _append(self, obj) -> int:
        """Record ``obj`` (on several ranks, after every rank agreed to); its position in the
        declaration order."""
        self._remember(obj)
        self._count += 1
        return self._count

    # --- what was declared ----------------------------------------------------------------------

    def declared(self, *, agreed: bool = False):
        """The live sets, maps and dats declared so far, in declaration order.

        With ``agreed=True`` (collective) only the objects alive on every rank: garbage
        collection frees unreferenced objects at different times on different ranks, and
        collective steps (building halos) must see the same list everywhere.
        """
        objects = [r() for r in self._declared]
        if agreed and self._mesh.distributed:
            objects = alive_everywhere(self.comm, objects)
        objects = [o for o in objects if o is not None]
        pick = lambda kind: [o for o in objects if isinstance(o, kind)]  # noqa: E731
        return pick(Set), pick(Map), pick(Dat)

    def dats(self) -> list:
        return self.declared()[2]


def _forget(table: dict, obj) -> None:
    """Drop ``obj``'s entry from ``table`` when ``obj`` is garbage-collected."""
    weakref.finalize(obj, table.pop, obj.uid, None)


def _block_count(offsets, rank: int) -> int:
    """Rows ``rank`` holds in the block distribution of ``offsets`` (:func:`block_offsets`)."""
    return int(offsets[rank + 1] - offsets[rank])
