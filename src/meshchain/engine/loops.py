"""Checked loops, found again by their structure.

Every ``par_loop`` call becomes a checked :class:`~meshchain.ir.loop.ParLoop` (the set,
maps, modes and the kernel's uses of its arguments are checked). What the checks depend
on is the call's *structure*: the kernel, the set, the name and per argument its kind,
set, dim, dtype, path and mode (:attr:`~meshchain.types.Arg.shape`), and which arguments
share an object. A call of a structure checked before (the same objects again, or new
ones declared alike: a new Global per reduction, a temporary Dat per step) skips the
checks: its loop is made from the first one's specs and maps with its own objects bound.
The same arguments again find the loop made last time, held weakly. No cache holds a dat
or global.

Grid loops lowered to maps (several ranks, or a backend without index arithmetic) are
checked per call. A loop over a subset has its arguments lowered first (ancestors' dats and
maps reached from the subset, :mod:`.subsets`); the structure is that of the lowered ones.

Examples
--------
>>> import meshchain as mc
>>> cells = mc.Set(3, "cells")
>>> k = mc.Kernel.from_source("def one(a):\\n    a[0] = 1.0\\n")
>>> records = mc.get_runtime().loop_records
>>> first = records.loop(k, cells, (mc.Dat(cells, 1, None, "a")(mc.WRITE),), None)
>>> second = records.loop(k, cells, (mc.Dat(cells, 1, None, "b")(mc.WRITE),), None)
>>> first is second, first.shape == second.shape, second.data[0].name
(False, True, 'b')
"""

from __future__ import annotations

import operator
import weakref

from ..ir.loop import ParLoop

__all__ = ["LoopRecords"]

_RECENT = 4096  # loops found again by their arguments (weakly held: a dead entry costs its key)


class LoopRecords:
    """A session's checked loops (see the module docstring). ``check(kernel, iterset, args,
    name)`` makes a checked loop the long way (the session's: it refuses loops before
    partitioning, lowers grid loops and checks exclusive paths over ranks); ``declared(obj)``
    raises unless the object belongs to the session; ``lower(iterset, args)`` gives the
    arguments of a loop over a subset as they reach the ancestors' objects."""

    def __init__(self, caches, check, declared, lower=None):
        self._check, self._declared = check, declared
        self._lower = lower
        self._structures = caches.cache("loop structures", limit=4096, events=("configure",),
                                        on_drop=lambda _: self._recent.clear())
        self._recent: dict = {}  # (kernel, set, name, argument ids) -> weak reference to the loop made last

    def loop(self, kernel, iterset, args, name) -> ParLoop:
        """The checked loop of ``par_loop(kernel, iterset, *args, name=name)``: the loop made
        for the same arguments last time while it lives (the trace or a unit holds it: then its
        arguments, and so their ids, are alive too), else by structure."""
        if self._lower is not None:
            args = self._lower(iterset, args)
        recent = self._recent
        key = (kernel, iterset, name, *map(id, args))
        found = recent.get(key)
        if found is not None:
            loop = found()
            if loop is not None and (loop.args if loop.written is None else loop.written.args) == args:
                return loop  # (a grid loop lowered to maps: its arguments as written)
        loop = self._loop(kernel, iterset, args, name)
        if len(recent) >= _RECENT:
            recent.clear()
        recent[key] = weakref.ref(loop)
        return loop

    def _loop(self, kernel, iterset, args, name) -> ParLoop:
        try:
            objects = tuple(map(_data, args))
            key = (kernel, iterset, name, tuple(map(_shape, args)), _sharing(objects))
            structure = self._structures.get(key)
        except (AttributeError, TypeError):  # not loop arguments: make_loop says what is wrong
            return self._check(kernel, iterset, args, name)
        if structure is None:
            loop = self._check(kernel, iterset, args, name)
            self._structures[key] = _Structure(loop)
            return loop
        if structure.lowered:
            return self._check(kernel, iterset, args, name)
        data = objects if structure.firsts is None else structure.firsts(objects)
        declared = self._declared
        for obj in data:
            declared(obj)
        return structure.bind(args, data)


_data, _shape = operator.attrgetter("data"), operator.attrgetter("shape")


def _sharing(objects: tuple):
    """Which arguments share an object: None when none do (the commonest), else each
    argument's slot (its object's place in order of first use)."""
    ids = tuple(map(id, objects))
    if len(set(ids)) == len(ids):
        return None
    slots: dict = {}
    return tuple([slots.setdefault(i, len(slots)) for i in ids])


def _picker(positions: tuple):
    """A function of a tuple giving the tuple of its items at ``positions`` (C's itemgetter
    where it returns a tuple)."""
    if len(positions) >= 2:
        return operator.itemgetter(*positions)
    if len(positions) == 1:
        only = positions[0]
        return lambda items: (items[only],)
    return lambda items: ()


class _Structure:
    """What the first checked loop of one structure gives the later ones: its kernel, set,
    name, specs, maps and shape, which argument first names each object (``firsts``), and
    which objects it reads and writes (by slot). A grid loop lowered to maps is ``lowered``:
    checked per call."""

    __slots__ = ("fields", "lowered", "firsts", "reads", "writes")

    def __init__(self, loop):
        self.lowered = loop.written is not None or loop.origin is not None
        self.fields = dict(kernel=loop.kernel, iterset=loop.iterset, name=loop.name, specs=loop.specs, maps=loop.maps,
                           origin=None, written=None, shape=loop.shape, indirect_writes=loop.indirect_writes)
        slot = {id(obj): i for i, obj in enumerate(loop.data)}
        firsts: dict = {}
        for position, arg in enumerate(loop.args):
            firsts.setdefault(slot[id(arg.data)], position)
        positions = tuple(firsts[i] for i in range(len(loop.data)))
        self.firsts = None if positions == tuple(range(len(loop.args))) else _picker(positions)  # None: all distinct
        self.reads = _picker(tuple(slot[id(obj)] for obj in loop.reads))
        self.writes = _picker(tuple(slot[id(obj)] for obj in loop.writes))

    def bind(self, args, data: tuple) -> ParLoop:
        """The loop of this structure over ``args`` (``data``: their distinct objects, in slot
        order); what the trace asks of every loop (the ids it reads and writes) is set now."""
        loop = object.__new__(ParLoop)  # the fields of a checked loop, unchanged: no __init__ to run
        fields = self.fields.copy()
        fields["args"], fields["data"] = tuple(args), data
        fields["reads"] = reads = self.reads(data)
        fields["writes"] = writes = self.writes(data)
        fields["read_ids"] = frozenset(map(id, reads))
        fields["write_ids"] = frozenset(map(id, writes))
        object.__setattr__(loop, "__dict__", fields)
        return loop
