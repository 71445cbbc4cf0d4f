"""The trace: loops recorded by ``par_loop`` and not yet executed, with dependence analysis.

Each entry is a loop and the chain it was recorded in (``None`` outside chains).
Forcing one object runs exactly the entries it depends on, in recording order: the
loops that write it (to read it) or that read or write it (to overwrite it), and,
transitively, every earlier loop those depend on through a read-after-write,
write-after-read or write-after-write on a dat or global (whatever maps the loops
access it through). Everything else stays pending, in order.

Examples
--------
>>> from types import SimpleNamespace as Loop
>>> from meshchain.engine.trace import Trace
>>> a, b, c = object(), object(), object()
>>> t = Trace()
>>> t.append(Loop(name="writes_a", reads=(), writes=(a,)))
>>> t.append(Loop(name="reads_a_writes_b", reads=(a,), writes=(b,)))
>>> t.append(Loop(name="writes_c", reads=(), writes=(c,)))
>>> [e.loop.name for e in t.take_needed(b, write=False)]
['writes_a', 'reads_a_writes_b']
>>> [e.loop.name for e in t.take()]
['writes_c']
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Trace", "Entry", "needed_entries"]


class Entry(NamedTuple):
    """A recorded loop and the chain execution it belongs to (or ``None``)."""

    loop: object
    chain: object = None


class Trace:
    """An ordered list of pending loops."""

    def __init__(self):
        self._entries: list[Entry] = []

    def append(self, loop, chain=None) -> None:
        self._entries.append(Entry(loop, chain))

    def take(self) -> list[Entry]:
        """Remove and return every pending entry, in recording order."""
        entries, self._entries = self._entries, []
        return entries

    def take_needed(self, obj, *, write: bool) -> list[Entry]:
        """Remove and return the entries that must run before ``obj`` is read (or, with
        ``write=True``, overwritten), in recording order."""
        chosen = needed_entries([e.loop for e in self._entries], obj, write=write)
        picked = [e for i, e in enumerate(self._entries) if i in chosen]
        self._entries = [e for i, e in enumerate(self._entries) if i not in chosen]
        return picked

    def take_chain(self, chain) -> list[Entry]:
        """Remove and return the entries of ``chain`` and everything they depend on."""
        loops = [e.loop for e in self._entries]
        seeds = {i for i, e in enumerate(self._entries) if e.chain is chain}
        chosen = _closure(loops, seeds, set(), set())
        picked = [e for i, e in enumerate(self._entries) if i in chosen]
        self._entries = [e for i, e in enumerate(self._entries) if i not in chosen]
        return picked

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __iter__(self):
        return iter(list(self._entries))


def needed_entries(loops, obj, *, write: bool) -> set[int]:
    """Positions of the loops that must run before ``obj`` is read or overwritten.

    A loop is needed if it writes something a needed later access reads or writes, or
    reads something a needed later access writes.
    """
    key = id(obj)
    return _closure(loops, set(), {key}, {key} if write else set())


def _closure(loops, seeds: set[int], reads: set[int], writes: set[int]) -> set[int]:
    """Walk backwards: a loop is taken if it is a seed or conflicts with a later taken one."""
    chosen: set[int] = set()
    reads, writes = set(reads), set(writes)
    for position in range(len(loops) - 1, -1, -1):
        loop = loops[position]
        loop_reads = {id(o) for o in loop.reads}
        loop_writes = {id(o) for o in loop.writes}
        if position in seeds or loop_writes & (reads | writes) or loop_reads & writes:
            chosen.add(position)
            reads |= loop_reads
            writes |= loop_writes
    return chosen
