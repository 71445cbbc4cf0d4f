"""Units: what the pipeline runs at once, a single loop or the loops of one chain.

A :class:`Unit` is made once per distinct sequence of recorded loops (and chain options)
and cached: its loops' signature over small integer keys (what the inspectors see), the
objects behind the keys, the storage records of its dats and globals, and the kernels
whose globals a plan freezes. Its *state* is the valid halo depth of each of its dats:
plans are cached by unit and state.

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


class Unit:
    """A loop or a chain of loops, prepared for planning (see the module docstring).

    Attributes
    ----------
    loops : tuple of ParLoop
    options : ChainOptions or None
        The chain's options (None: a single loop).
    signature : tuple of LoopSig
    objects : dict
        Object key -> the dat or global.
    sets : dict
        Set key -> the set.
    storage : dict
        Object key -> its storage record.
    names : tuple of str
        The loops' names.
    kernels : tuple of Kernel
        The distinct kernels that read globals (a plan checks that those are unchanged).
    """

    __slots__ = ("loops", "options", "signature", "objects", "sets", "storage", "names", "kernels", "_dats",
                 "reads", "writes")

    def __init__(self, loops, options, store):
        self.loops, self.options = tuple(loops), options
        objects, sets, signature = {}, {}, []
        for loop in self.loops:
            args = []
            for arg in loop.args:
                key = objects.setdefault(id(arg.data), (len(objects), arg.data))[0]
                dataset = -1 if arg.data.is_global else sets.setdefault(id(arg.data.dataset),
                                                                       (len(sets), arg.data.dataset))[0]
                args.append(ArgSig(key, arg.data.is_global, arg.map is not None, arg.access, dataset))
            iterset = sets.setdefault(id(loop.iterset), (len(sets), loop.iterset))[0]
            signature.append(LoopSig(loop.name, iterset, tuple(args)))
        self.signature = tuple(signature)
        self.objects = {key: obj for key, obj in objects.values()}
        self.sets = {key: s for key, s in sets.values()}
        self.storage = {key: store.get(obj) for key, obj in self.objects.items()}
        self.names = tuple(loop.name for loop in self.loops)
        kernels = {id(loop.kernel): loop.kernel for loop in self.loops}
        self.kernels = tuple(k for k in kernels.values() if k.free_names)
        self._dats = tuple(self.storage[key] for key, obj in self.objects.items() if not obj.is_global)
        self.reads = {id(o) for loop in self.loops for o in loop.reads}
        self.writes = {id(o) for loop in self.loops for o in loop.writes}

    def state(self) -> tuple:
        """The valid halo depth of each of the unit's dats."""
        return tuple([storage.valid_depth for storage in self._dats])

    def valid(self) -> dict:
        """Object key -> valid depth, for the unit's dats."""
        return {key: self.storage[key].valid_depth for key, obj in self.objects.items() if not obj.is_global}

    def object_names(self) -> dict:
        return {key: obj.name for key, obj in self.objects.items()}

    @property
    def chain(self) -> str | None:
        return None if self.options is None else self.options.name
