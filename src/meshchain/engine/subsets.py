"""Loops over subsets: their arguments reached through the subsets' injection maps.

A loop over a :class:`~meshchain.types.subsets.Subset` may pass dats of the sets the subset
is part of, directly or through maps that start at them. It is *lowered* before it is checked
(:meth:`SubsetLowering.lowered_args`): a direct dat of an ancestor set is reached through the
injection path from the subset to that set (arity 1, index 0: the kernel sees the same view),
and a map from an ancestor through that map composed with the path (a
:class:`~meshchain.types.maps.ComposedMap`). Chains, communication-avoiding execution, tiling,
the exchanges and every backend then treat it as a loop over a mesh set.

On one process a composed map is made on first use, its values from the declared ones. On
several ranks every composition a loop can ask for (each subset with each declared map from
one of its ancestors, and the paths to its ancestors) is made when the mesh is partitioned
(:meth:`SubsetLowering.derive`, collective): the layout then builds the subsets' halo layers
from those rows too, so a subset element run redundantly has every target its loops read.
"""

from __future__ import annotations

import weakref

from ..comm.blocks import block_offsets
from ..comm.collectives import fetch_rows
from ..core.errors import DeclarationError
from ..types import Arg, MatArg
from ..types.maps import ComposedMap, composed_rows
from ..types.subsets import Subset, ancestors

__all__ = ["SubsetLowering"]


class SubsetLowering:
    """The composed maps of one session's subsets, by ``(subset uid, map uid or ancestor uid)``.

    Parameters
    ----------
    declarations : Declarations
        The session's; its ``map_rows`` holds every map's rows (the whole map on one process,
        this rank's block rows on several), and receives the composed maps' rows.
    distributed : bool
    """

    def __init__(self, declarations, *, distributed: bool):
        self.declarations = declarations
        self.distributed = distributed
        self.composed: dict = {}
        # an argument as written -> (subset, the argument lowered): the same lowered argument
        # again while the written one lives, so a loop called again is found by its arguments
        self._lowered_args = weakref.WeakKeyDictionary()

    def lowered_args(self, iterset, args) -> tuple:
        """``args`` of a loop over ``iterset`` with ancestors' dats and maps reached from it."""
        if not isinstance(iterset, Subset):
            return args
        return tuple(self._lowered_arg(iterset, arg) for arg in args)

    def _lowered_arg(self, subset, arg):
        try:
            found = self._lowered_args.get(arg)
        except TypeError:  # not weakly referable: not a loop argument (the loop's checks say so)
            return arg
        if found is not None and found[0] is subset:
            return found[1]
        lowered = self._lowered(subset, arg)
        if lowered is not arg:
            self._lowered_args[arg] = (subset, lowered)
        return lowered

    def lowered_mat_arg(self, subset, arg) -> MatArg:
        """Matrix argument ``arg`` of a loop over ``subset`` with maps from its ancestors
        composed with the path to them (the matrix's rows and columns stay the ancestors')."""
        lineage = ancestors(subset)
        row_map, col_map = (self._through(subset, m) if m.source in lineage else m for m in (arg.row_map, arg.col_map))
        if row_map is arg.row_map and col_map is arg.col_map:
            return arg
        return MatArg(arg.mat, arg.access, row_map, col_map)

    def _lowered(self, subset, arg) -> Arg:
        if not isinstance(arg, Arg) or arg.data.is_global or arg.stencil is not None:
            return arg
        lineage = ancestors(subset)
        if arg.map is None:
            if arg.data.dataset not in lineage:
                return arg  # a dat of the subset itself, or a mismatch the loop's checks name
            return Arg(arg.data, arg.access, self._path(subset, arg.data.dataset), 0)
        if arg.map.source not in lineage:
            return arg
        return Arg(arg.data, arg.access, self._through(subset, arg.map), arg.index)

    def _path(self, subset, ancestor):
        """The map from ``subset`` to ``ancestor``: its injection, or the injections composed."""
        if ancestor is subset.parent:
            return subset.injection
        return self._made(subset, ancestor.uid, _injections(subset, ancestor))

    def _through(self, subset, m):
        """Map ``m`` (from an ancestor of ``subset``) composed with the path to its source."""
        return self._made(subset, m.uid, (*_injections(subset, m.source), m))

    def _made(self, subset, key, parts):
        found = self.composed.get((subset.uid, key))
        if found is not None:
            return found
        if self.distributed:  # made at partition, with every map declared before it
            raise DeclarationError(
                f"subset {subset.name!r} meets {parts[-1].name!r} after mc.partition, which composes every map "
                f"declared before it; declare the subset, its ancestors and their maps before partitioning.")
        return self._register(subset, key, parts, composed_rows(parts, self._whole_rows))

    def _register(self, subset, key, parts, rows):
        m = self.composed[(subset.uid, key)] = ComposedMap(parts)
        rows = rows.astype(self.declarations.map_rows[parts[-1].uid].dtype, copy=False)
        rows.flags.writeable = False
        self.declarations.map_rows[m.uid] = rows
        return m

    def _whole_rows(self, m, ids):
        rows = self.declarations.map_rows[m.uid]
        return rows if ids is None else rows[ids]

    def maps(self) -> list:
        """The composed maps, in the order they were made (the same on every rank)."""
        return list(self.composed.values())

    def derive(self, comm, sets, maps) -> list:
        """Make every composition of the declared ``sets`` and ``maps`` (collective, in the
        same order on every rank); return the composed maps, which the layouts take with the
        declared ones."""
        size = comm.size

        def block_rows(m, ids):
            rows = self.declarations.map_rows[m.uid]
            return rows if ids is None else fetch_rows(comm, block_offsets(m.source.size, size), rows, ids)

        from_set: dict = {}
        for m in maps:
            if not isinstance(m, ComposedMap) and not _is_injection(m):
                from_set.setdefault(m.source.uid, []).append(m)
        made = []
        for subset in (s for s in sets if isinstance(s, Subset)):
            for ancestor in ancestors(subset):
                wanted = [(m.uid, (*_injections(subset, m.source), m)) for m in from_set.get(ancestor.uid, [])]
                if ancestor is not subset.parent:
                    wanted.insert(0, (ancestor.uid, _injections(subset, ancestor)))
                for key, parts in wanted:
                    found = self.composed.get((subset.uid, key))
                    made.append(found if found is not None else
                                self._register(subset, key, parts, composed_rows(parts, block_rows)))
        return made


def _injections(subset, ancestor) -> tuple:
    """The injection maps from ``subset`` up to ``ancestor``, nearest first."""
    parts, s = [], subset
    while s is not ancestor:
        parts.append(s.injection)
        s = s.parent
    return tuple(parts)


def _is_injection(m) -> bool:
    return isinstance(m.source, Subset) and m.source.injection is m
