"""What this process is running now, for hang diagnostics (``hang_timeout``).

The engine notes the plan it runs here (:data:`unit`, :data:`unit_since`), and the
communication layer the wait it is in (:data:`wait`, a :class:`Wait`), only while
:data:`watched` is True (hang diagnostics are on); otherwise the hot paths test that one
name and do nothing else. The watchdog (:mod:`meshchain.comm.hang`) reads these names
from its own thread: everything here is plain Python data, written by the thread that
runs the plans and read, never changed, by the watchdog.

Examples
--------
>>> from meshchain.core import activity
>>> activity.watched, activity.unit, activity.wait
(False, None, None)
>>> with activity.waiting("collective example") as record:   # not watched: nothing noted
...     record is None
True
"""

from __future__ import annotations

from time import perf_counter

__all__ = ["watched", "unit", "unit_since", "wait", "wait_ended", "Wait", "waiting"]

#: True while hang diagnostics watch this process (then :data:`unit` is kept up to date).
watched = False
#: The plan running now (``"loop 'update'"``, ``"chain 'rk'"``), or None.
unit: str | None = None
#: When it began (``time.perf_counter()``).
unit_since = 0.0
#: The wait this process is in now (a :class:`Wait`), or None; noted only while :data:`watched`.
wait: Wait | None = None
#: When the last wait noted ended (``time.perf_counter()``): a plan computes since then.
wait_ended = 0.0


class Wait:
    """One wait of this process, noted in :data:`wait` while it lasts (a context manager).

    Parameters
    ----------
    what : str
        What the process waits in, in words (``"halo exchange of 'q' (forward, transport
        'p2p')"``, ``"collective agree_on_failure"``).
    neighbours : sequence of int, optional
        The ranks whose messages the wait needs (None: every rank of the communicator, as
        in a collective). :attr:`outstanding` starts as all of them.
    note : str, optional
        Said after the outstanding ranks (e.g. that they cannot be observed one by one).

    Attributes
    ----------
    outstanding : tuple of int or None
        The neighbours whose messages to this rank have not arrived yet (the waiter updates
        it as they arrive, where it can tell).
    sending : tuple of int
        The neighbours this rank's messages to have not completed yet (where it can tell).
    since : float
        When the wait began (``time.perf_counter()``).

    Examples
    --------
    >>> from meshchain.core import activity
    >>> with Wait("halo exchange of 'q'", neighbours=[2, 0]) as record:
    ...     activity.wait is record, record.outstanding
    (True, (0, 2))
    >>> activity.wait is None
    True
    """

    __slots__ = ("what", "neighbours", "outstanding", "sending", "note", "since", "_outer")

    def __init__(self, what: str, neighbours=None, note: str = ""):
        self.what, self.note = what, note
        self.neighbours = None if neighbours is None else tuple(sorted(neighbours))
        self.outstanding, self.sending = self.neighbours, ()
        self.since, self._outer = 0.0, None

    def __enter__(self) -> Wait:
        global wait
        self._outer, self.since = wait, perf_counter()
        wait = self
        return self

    def __exit__(self, *exc) -> bool:
        global wait, wait_ended
        wait, wait_ended = self._outer, perf_counter()
        return False


class _NotWatched:
    """The context :func:`waiting` gives while nothing watches: it notes nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> bool:
        return False


_NOT_WATCHED = _NotWatched()


def waiting(what: str, neighbours=None, note: str = ""):
    """A :class:`Wait` to enter around a blocking call while :data:`watched`, else a context
    that does nothing (and gives None).

    >>> from meshchain.core import activity
    >>> activity.watched = True
    >>> with waiting("collective sum_everywhere") as record:
    ...     record.what, record.outstanding
    ('collective sum_everywhere', None)
    >>> activity.watched = False
    """
    if not watched:
        return _NOT_WATCHED
    return Wait(what, neighbours, note)
