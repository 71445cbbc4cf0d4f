"""Binding a plan to new objects: plans are made per structure, objects are bound at run time.

A plan is built for its unit's objects of that moment (:mod:`.assemble`): its compiled
calls take their storage arrays as arguments, its exchanges pack and unpack their rows,
its reductions and validity marks name their storage records. When the unit runs again
with other objects declared alike (a new Global per reduction, a temporary Dat per step:
the same set, dim, dtype, path and mode, :mod:`.units`), :meth:`Binding.rebind` swaps the
new storage in at those places, nothing else: no schedule, colouring, compilation or
message set-up is made again.

A global whose reduction over ranks this plan started and nobody finished yet (its value
not read) has it finished before the plan takes another global: the plan's reduction
buffers are then free to be used again.

A plan can be rebound when every part of it can: a backend call says so by having a
``rebind(substitutions)`` method and its ``arguments`` (the numba backend's prepared calls
and chunked interiors do), an exchange by its ``rebindable`` property (host exchanges; not
those staging rows through a device). Boundary tasks and sparse tiles cannot, nor the
reference and GPU backends' calls: a plan with them is built again for the new objects
(counted as a plan built, as before structural reuse).

Rebinding checks that every new array has the shape, strides and dtype of the one it
replaces (the compiled calls were specialised to them) and refuses otherwise (the plan
is built again).

Examples
--------
>>> import numpy as np
>>> from meshchain.core.storage import GlobalStorage
>>> from meshchain.engine.plans import Plan, Step
>>> old, new = GlobalStorage(np.zeros(1)), GlobalStorage(np.ones(1))
>>> class Call:
...     arguments = (old.value,)
...     def __call__(self): print(self.arguments[0])
...     def rebind(self, substitutions):
...         self.arguments = tuple(array for _, array in substitutions)
>>> plan = Plan([Step(core=Call(), core_share=-1)], None)
>>> plan.binding = Binding((old,), steps=plan.steps)
>>> plan.binding.rebind(plan, (new,)), plan.steps[0].core.arguments[0] is new.value
(True, True)
"""

from __future__ import annotations

from itertools import compress, count
from operator import is_not

import numpy as np

from ..backends.base import readonly
from ..core.storage import GlobalStorage

__all__ = ["Binding", "argument_recipe"]


def _array(record) -> np.ndarray:
    return record.value if isinstance(record, GlobalStorage) else record.host


class Binding:
    """What a plan bound of its unit's objects (``records``, in object-key order) and how to
    bind others (see the module docstring). ``supported``: whether it can (on several ranks
    the plan's builder makes every rank agree on it).

    ``exchanges``: ``[(exchange, object keys of its items)]``; ``prepared``: ``[(object key,
    write)]`` given to ``prepare(record, write=...)`` (the backend's ``prepare_data``) for
    new records, as the build did. Only what changed is bound again."""

    __slots__ = ("records", "_exchanges", "_prepared", "_prepare", "_steps", "_calls", "_uses", "_named", "supported")

    def __init__(self, records, *, steps, exchanges=(), prepared=(), prepare=None):
        self.records = tuple(records)
        key_of = {id(record): key for key, record in enumerate(self.records)}
        self._exchanges = tuple(exchanges)
        self._prepare, self._prepared = prepare, {}  # object key -> the write flags the build prepared it with
        for key, write in prepared:
            self._prepared.setdefault(key, []).append(write)
        self._steps = [(step, tuple(key_of[id(r)] for r in step.settle),
                        tuple((key_of[id(r)], depth) for r, depth in step.validity),
                        tuple((reduction, key_of[id(reduction.storage)]) for reduction in step.reductions))
                       for step in steps if step.settle or step.validity or step.reductions]
        self._calls = [call for step in steps for call in (step.core, step.rest, step.tail) if call is not None]
        self.supported = (all(step.tasks is None for step in steps)
                          and all(callable(getattr(call, "rebind", None)) for call in self._calls)
                          and all(getattr(exchange, "rebindable", False) for exchange, _ in self._exchanges))
        self._uses: dict = {}  # object key -> [(call number, argument position, read-only)]
        if self.supported:
            for number, call in enumerate(self._calls):
                recipe = argument_recipe(call.arguments, self.records)
                if recipe is None:
                    self.supported = False
                    break
                for position, key, ro in recipe:
                    self._uses.setdefault(key, []).append((number, position, ro))
        self._named = _places(self._steps, self._exchanges)

    def rebind(self, plan, records) -> bool:
        """Bind ``plan`` to ``records`` (the unit's, in object-key order); False (and nothing
        changed) when it cannot be: the plan is then built again."""
        old = self.records
        if not self.supported or len(records) != len(old):
            return False
        changed = list(compress(count(), map(is_not, old, records)))
        if len(changed) == 1:  # the common case (a new Global or Dat): see _rebind_one
            return self._rebind_one(changed[0], records)
        return self._rebind_many(changed, records)

    def _rebind_many(self, changed: list, records) -> bool:
        """:meth:`rebind` where the objects of the keys ``changed`` are new (any number of them):
        every step, exchange and call argument is looked at."""
        arrays = _alike(self.records, records, changed)
        if arrays is None:
            return False
        moved = set(changed)
        self._prepare_new(changed, records)
        _update(self._steps, [(e, keys) for e, keys in self._exchanges if moved.intersection(keys)], records)
        self._substitute(changed, arrays)
        self.records = tuple(records)
        return True

    def _rebind_one(self, key: int, records) -> bool:
        """:meth:`rebind` where only the object of ``key`` is new (a new Global or Dat in a step
        otherwise alike): the same, at the steps, exchanges and call arguments that name it."""
        array = _alike_array(self.records[key], records[key])
        if array is None:
            return False
        self._prepare_new((key,), records)
        _update(*self._named.get(key, _NOWHERE), records)
        calls = self._calls
        for number, position, ro in self._uses.get(key, ()):
            calls[number].rebind(((position, readonly(array) if ro else array),))
        self.records = tuple(records)
        return True

    def _prepare_new(self, changed, records) -> None:
        """``prepare`` the new records of ``changed`` as the build prepared the old ones."""
        if self._prepared:
            for key in changed:
                for write in self._prepared.get(key, ()):
                    self._prepare(records[key], write=write)

    def _substitute(self, changed: list, arrays: list) -> None:
        """Put ``arrays`` (the new arrays of the ``changed`` object keys) in the calls' arguments."""
        calls, uses = self._calls, self._uses
        substitutions: dict = {}
        for key, array in zip(changed, arrays):
            for number, position, ro in uses.get(key, ()):
                substitutions.setdefault(number, []).append((position, readonly(array) if ro else array))
        for number, pairs in substitutions.items():
            calls[number].rebind(pairs)


_NOWHERE = ((), ())


def _places(steps, exchanges) -> dict:
    """Object key -> ``([entries of steps], [(exchange, keys)])``: where rebinding that one
    object makes a change (:meth:`Binding._rebind_one`)."""
    places: dict = {}
    for entry in steps:
        _, settle, validity, reductions = entry
        for key in {*settle, *(k for k, _ in validity), *(k for _, k in reductions)}:
            places.setdefault(key, ([], []))[0].append(entry)
    for exchange, keys in exchanges:
        for key in set(keys):
            places.setdefault(key, ([], []))[1].append((exchange, keys))
    return places


def _update(steps, exchanges, records) -> None:
    """Name ``records`` (by object key) in ``steps`` (entries of ``Binding._steps``) and
    ``exchanges`` (``(exchange, keys)``): the in-flight reduction over ranks of a record let go
    is finished first."""
    for step, settle, validity, reductions in steps:
        step.settle = tuple([records[key] for key in settle])
        step.validity = tuple([(records[key], depth) for key, depth in validity])
        for reduction, key in reductions:
            if records[key] is not reduction.storage:
                reduction.storage.settle()  # its reduction over ranks may be in flight: finished before reuse
                reduction.storage = records[key]
    for exchange, keys in exchanges:
        exchange.rebind([_array(records[key]) for key in keys])


def _alike(old, new, changed) -> list | None:
    """The arrays of the ``changed`` new records, or None unless each is alike the old one's
    (:func:`_alike_array`)."""
    arrays = []
    for key in changed:
        array = _alike_array(old[key], new[key])
        if array is None:
            return None
        arrays.append(array)
    return arrays


def _alike_array(old, new):
    """``new``'s array, or None unless it has the kind, shape, strides and dtype of ``old``'s
    (the compiled calls were specialised to them)."""
    if type(old) is not type(new):
        return None
    x, y = (old.value, new.value) if type(new) is GlobalStorage else (old.host, new.host)
    if x.shape != y.shape or x.strides != y.strides or x.dtype != y.dtype:
        return None
    return y


def argument_recipe(arguments, records):
    """``[(position, record key, read-only)]``: the arguments that are a record's array or a
    read-only view of all of it; None if some argument shares memory with a record's array
    otherwise (it could not be rebound)."""
    whole = {}
    for key, record in enumerate(records):
        array = _array(record)
        whole[(array.ctypes.data, array.shape, array.strides, array.dtype.str)] = key
    recipe = []
    for position, value in enumerate(arguments):
        if not isinstance(value, np.ndarray):
            continue
        key = whole.get((value.ctypes.data, value.shape, value.strides, value.dtype.str))
        if key is not None:
            recipe.append((position, key, not value.flags.writeable))
        elif any(np.may_share_memory(value, _array(record)) for record in records):
            return None
    return recipe
