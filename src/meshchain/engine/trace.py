"""The trace: loops recorded by ``par_loop`` and not yet executed, with dependence analysis.

Each entry is a loop and the chain it was recorded in (``None`` outside chains).
Forcing one object runs exactly the entries it depends on, in recording order: the
loops that write it (to read it) or that read or write it (to overwrite it), and,
transitively, every earlier loop those depend on through a read-after-write,
write-after-read or write-after-write on a dat or global (whatever maps the loops
access it through). Everything else stays pending, in order.

Examples
--------
>>> from types import SimpleNamespace
>>> def Loop(name, reads, writes):  # what the trace reads of a loop (a ParLoop has all four)
...     return SimpleNamespace(name=name, reads=reads, writes=writes, read_ids=frozenset(map(id, reads)),
...                            write_ids=frozenset(map(id, writes)))
>>> from meshchain.engine.trace import Trace
>>> a, b, c = object(), object(), object()
>>> t = Trace()
>>> t.append(Loop(name="writes_a", reads=(), writes=(a,)))
1
>>> t.append(Loop(name="reads_a_writes_b", reads=(a,), writes=(b,)))
2
>>> t.append(Loop(name="writes_c", reads=(), writes=(c,)))
3
>>> [loop.name for loop, _ in t.take_needed(b, write=False)]
['writes_a', 'reads_a_writes_b']
>>> [loop.name for loop, _ in t.take()]
['writes_c']
"""

from __future__ import annotations

import operator
from typing import NamedTuple

__all__ = ["Trace", "Entry", "needed_entries", "dependents"]


class Entry(NamedTuple):
    """A recorded loop and the chain execution it belongs to (or ``None``). The trace keeps
    plain ``(loop, chain)`` tuples; iterating over it gives :class:`Entry` objects."""

    loop: object
    chain: object = None


_loop_of = operator.itemgetter(0)


class Trace:
    """An ordered list of pending loops: ``entries``, ``(loop, chain)`` tuples.

    ``removals`` counts the times entries were taken out: a chain that opened on an empty
    trace owns every entry as long as nothing was taken meanwhile (:meth:`take_only`).
    """

    def __init__(self):
        self.entries: list = []
        self.removals = 0

    def append(self, loop, chain=None) -> int:
        """Record ``loop`` (in ``chain``, or None); returns how many loops are pending."""
        entries = self.entries
        entries.append((loop, chain))
        return len(entries)

    def extend(self, entries) -> None:
        """Put entries back (loops that stay pending after a failure), in order."""
        self.entries.extend((entry[0], entry[1]) for entry in entries)

    def take(self) -> list:
        """Remove and return every pending entry, in recording order."""
        entries, self.entries = self.entries, []
        self.removals += 1
        return entries

    def take_only(self, chain) -> list | None:
        """The loops of ``chain`` when they are all that is pending (the trace is emptied),
        else None: ``chain`` opened on an empty trace (``chain.opened == (0, removals)``) and
        nothing was taken since."""
        if chain.opened != (0, self.removals) or not self.entries:
            return None
        entries, self.entries = self.entries, []
        self.removals += 1
        return list(map(_loop_of, entries))

    def take_needed(self, obj, *, write: bool) -> list:
        """Remove and return the entries that must run before ``obj`` is read (or, with
        ``write=True``, overwritten), in recording order."""
        return self._take(needed_entries(list(map(_loop_of, self.entries)), obj, write=write))

    def take_chain(self, chain) -> list:
        """Remove and return the entries of ``chain`` and everything they depend on."""
        loops = [e[0] for e in self.entries]
        seeds = {i for i, e in enumerate(self.entries) if e[1] is chain}
        return self._take(_closure(loops, seeds, set(), set()))

    def _take(self, chosen: set) -> list:
        if len(chosen) == len(self.entries):  # all of them (a value read after the loops that make it)
            return self.take()
        picked = [e for i, e in enumerate(self.entries) if i in chosen]
        self.entries = [e for i, e in enumerate(self.entries) if i not in chosen]
        self.removals += 1
        return picked

    def __len__(self) -> int:
        return len(self.entries)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __iter__(self):
        return iter([Entry(*entry) for entry in self.entries])


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
        loop_reads, loop_writes = loop.read_ids, loop.write_ids
        if (position in seeds or not loop_writes.isdisjoint(reads) or not loop_writes.isdisjoint(writes)
                or not loop_reads.isdisjoint(writes)):
            chosen.add(position)
            reads |= loop_reads
            writes |= loop_writes
    return chosen


def dependents(failed, later) -> list[bool]:
    """For each loop of ``later`` (in order), whether it depends on a loop of ``failed`` or on
    an earlier dependent one: it reads or overwrites what they wrote. (Overwriting what they
    only read is no dependence: they will not run again.)

    >>> from types import SimpleNamespace as Loop
    >>> a, b, c = object(), object(), object()
    >>> bad = Loop(reads=(), writes=(a,))
    >>> dependents([bad], [Loop(reads=(a,), writes=(b,)), Loop(reads=(b,), writes=()), Loop(reads=(c,), writes=(c,))])
    [True, True, False]
    """
    written = {id(o) for loop in failed for o in loop.writes}
    flags = []
    for loop in later:
        hit = any(id(o) in written for o in loop.reads) or any(id(o) in written for o in loop.writes)
        flags.append(hit)
        if hit:
            written.update(id(o) for o in loop.writes)
    return flags
