"""Units: what the pipeline runs at once, a single loop or the loops of one chain.

A :class:`Unit` is made once per distinct *structure* of recorded loops (and chain
options): its loops' kernels, sets, maps and per argument the kind, dim, dtype and mode
(:attr:`~meshchain.ir.loop.ParLoop.shape`), and which arguments share an object
(:func:`unit_key`). It holds the loops' signature over small integer keys (what the
inspectors see) and the kernels whose globals a plan freezes. Its *binding* is the
objects of its latest execution and their storage records: a unit executed with new
objects declared alike (a new Global per reduction, a temporary Dat per step) is bound
to them (:meth:`Unit.bind`) and its plans rebound, never made again. Its *state* is the
valid halo depth of each of its dats: plans are cached by unit and state.

Examples
--------
>>> import meshchain as mc
>>> from meshchain.engine.units import Unit
>>> from meshchain.ir.loop import make_loop
>>> cells = mc.Set(2, "cells")
>>> q = mc.Dat(cells, 1, None, "q")
>>> k = mc.Kernel.from_source("def bump(a):\\n    a[0] += 1.0\\n")
>>> unit = Unit((make_loop(k, cells, (q(mc.RW),)),), None, mc.get_runtime().store)
>>> [loop.name for loop in unit.signature], unit.names, unit.state()
(['bump'], ('bump',), (0,))
"""

from __future__ import annotations

from ..inspector.chain import ArgSig, LoopSig

__all__ = ["Unit"]


def unit_key(loops, options):
    """The cache key of the unit running ``loops`` (with chain ``options``, or None): equal
    for loops of equal structure whose objects are shared between arguments alike."""
    if options is None:
        return loops[0].shape
    keys: dict = {}
    sharing = tuple(keys.setdefault(id(obj), len(keys)) for loop in loops for obj in loop.data)
    return (options, tuple(loop.shape for loop in loops), sharing)


class Unit:
    """A loop or a chain of loops, prepared for planning (see the module docstring).

    Attributes
    ----------
    loops : tuple of ParLoop
        The loops of the latest execution (:meth:`bind`).
    options : ChainOptions or None
        The chain's options (None: a single loop).
    signature : tuple of LoopSig
    objects : dict
        Object key -> the dat or global (of the latest execution).
    sets : dict
        Set key -> the set.
    storage : dict
        Object key -> its storage record (of the latest execution).
    records : tuple
        The storage records in object-key order (plans compare theirs with it).
    names : tuple of str
        The loops' names.
    kernels : tuple of Kernel
        The distinct kernels that read globals (a plan checks that those are unchanged).
    """

    __slots__ = ("loops", "options", "signature", "sets", "names", "kernels", "_dats", "records", "store", "_is_dat",
                 "_objects", "_by_key")

    def __init__(self, loops, options, store):
        self.options, self.store = options, store
        objects, sets, signature = {}, {}, []
        for loop in loops:
            args = []
            for arg in loop.args:
                key = objects.setdefault(id(arg.data), (len(objects), arg.data))[0]
                dataset = -1 if arg.data.is_global else sets.setdefault(id(arg.data.dataset),
                                                                       (len(sets), arg.data.dataset))[0]
                args.append(ArgSig(key, arg.data.is_global, arg.map is not None, arg.access, dataset))
            iterset = sets.setdefault(id(loop.iterset), (len(sets), loop.iterset))[0]
            signature.append(LoopSig(loop.name, iterset, tuple(args)))
        self.signature = tuple(signature)
        self.sets = {key: s for key, s in sets.values()}
        self.names = tuple(loop.name for loop in loops)
        kernels = {id(loop.kernel): loop.kernel for loop in loops}
        self.kernels = tuple(k for k in kernels.values() if k.free_names)
        self._is_dat = tuple(not obj.is_global for _, obj in objects.values())
        self.loops = None
        self.bind(loops)

    def bind(self, loops) -> None:
        """Make ``loops`` (of this unit's structure) the latest execution's: its objects and
        their storage records (nothing is done for the loops already bound)."""
        loops = tuple(loops)
        if loops == self.loops:
            return
        if len(loops) == 1:  # one loop: its distinct objects, in order, are the unit's
            objects = loops[0].data
        else:
            distinct = {}
            for loop in loops:
                for obj in loop.data:
                    distinct.setdefault(id(obj), obj)
            objects = tuple(distinct.values())
        self.loops, self._objects, self._by_key, self._dats = loops, objects, None, None
        self.records = self.store.records_of(objects)

    @property
    def objects(self) -> dict:
        """Object key -> the dat or global of the latest execution (made when planning asks)."""
        return self._maps()[0]

    @property
    def storage(self) -> dict:
        """Object key -> its storage record of the latest execution."""
        return self._maps()[1]

    def _maps(self) -> tuple:
        if self._by_key is None:
            self._by_key = (dict(enumerate(self._objects)), dict(enumerate(self.records)))
        return self._by_key

    def state(self) -> tuple:
        """The valid halo depth of each of the unit's dats."""
        return tuple([storage.valid_depth for storage in self.dats()])

    def dats(self) -> tuple:
        """The storage records of the unit's dats, in the order of :meth:`state`."""
        dats = self._dats
        if dats is None:  # made when asked (on one process, never): a new dat per step pays nothing for it
            dats = self._dats = tuple([record for record, is_dat in zip(self.records, self._is_dat) if is_dat])
        return dats

    def valid(self) -> dict:
        """Object key -> valid depth, for the unit's dats."""
        return {key: self.storage[key].valid_depth for key, obj in self.objects.items() if not obj.is_global}

    def object_names(self) -> dict:
        return {key: obj.name for key, obj in self.objects.items()}

    @property
    def chain(self) -> str | None:
        return None if self.options is None else self.options.name
