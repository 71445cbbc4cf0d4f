"""One ``mpiexec`` run of the MPI test harness, watched from the parent pytest.

A child run executes several test items in a row on every rank (the items of one test file
for one process count, see :mod:`.harness`): starting Python, MPI, numba and the test
module once per group instead of once per item saves seconds per item. The parent waits
for the items one at a time: each rank appends a line to ``rank<r>.jsonl`` in the run's
directory when it has finished an item, and an item is done when every rank has. The
parent's wall clock covers one item at a time; when it expires, or when the run ends (a
failing rank aborts the job) before an item is done, that item fails with the output
written since the previous item was done, and the items after it go to a new run.

Examples
--------
>>> import sys, tempfile
>>> from pathlib import Path
>>> run = ChildRun([sys.executable, "-c", "print('hello')"], env=None, cwd=Path.cwd(),
...                nodeids=["t.py::test"], nprocs=1, directory=Path(tempfile.mkdtemp()))
>>> result = run.wait("t.py::test", limit=60)
>>> result.returncode, result.output.strip(), result.records
(0, 'hello', [])
>>> run.close()
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ChildResult", "ChildRun", "terminate_process_tree", "TERMINATE_GRACE", "MISSING_FILE"]

#: Seconds ``mpiexec`` gets to clean up after SIGTERM before everything is SIGKILLed.
TERMINATE_GRACE = 5.0
#: Seconds a run that has done all its items gets to exit by itself when it is closed.
EXIT_GRACE = 10.0
#: Seconds between two looks at a run's records.
POLL_SECONDS = 0.02
#: The file in which rank 0 of a child lists the node ids it was given but did not collect.
MISSING_FILE = "missing.json"


@dataclass(frozen=True)
class ChildResult:
    """How one item of a child run ended, as far as the parent can see.

    Attributes
    ----------
    returncode : int or None
        ``mpiexec``'s exit status; None while the run goes on (after the item was done)
        or when it was killed at the wall clock.
    elapsed : float
        Seconds the parent waited for the item.
    output : str
        What the ranks and ``mpiexec`` wrote to stdout and stderr while the item ran
        (from the end of the previous item of the run).
    timed_out : bool
        Whether the run was killed at the wall-clock limit while the item ran.
    records : list of dict
        The item's record from each rank that finished it, ordered by rank: ``nodeid``,
        ``rank``, ``size``, ``outcome`` (``"passed"`` or ``"skipped"``) and ``reason``.
    missing : bool
        Whether the child did not collect the item at all.
    """

    returncode: int | None
    elapsed: float
    output: str
    timed_out: bool = False
    records: list = field(default_factory=list)
    missing: bool = False


class ChildRun:
    """A child run of ``nodeids`` (in this order) on ``nprocs`` ranks, started at once.

    Parameters
    ----------
    command : sequence of str
        Run in its own session; stdout and stderr go to a file in ``directory`` (a pipe
        could block the parent on a stray process holding it).
    env : dict or None
    cwd : Path
    nodeids : sequence of str
        The items the child runs, in its order.
    nprocs : int
        The ranks that must each finish an item.
    directory : Path
        Owned by the run (removed by :meth:`close`): its log, the ranks' records and reports.
    """

    def __init__(self, command: Sequence[str], *, env, cwd: Path, nodeids: Sequence[str], nprocs: int,
                 directory: Path) -> None:
        self.command = list(command)
        self.nodeids = list(nodeids)
        self.nprocs = nprocs
        self.directory = directory
        self.log = directory / "output.log"
        self._offset = 0  # where the output of the item now running begins in the log
        self._done: set[str] = set()
        self._missing: set[str] | None = None
        with open(self.log, "wb") as sink:
            self.proc = subprocess.Popen(
                self.command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=sink,
                stderr=subprocess.STDOUT, start_new_session=True,
            )

    def covers(self, nodeid: str) -> bool:
        """Whether this run has run or will run ``nodeid``: it is one of the run's items, the
        child collected it, and the run is alive or ended no earlier than at ``nodeid`` (a run
        that ended at ``nodeid`` reports its failure there; it is not run again)."""
        if nodeid not in self.nodeids or nodeid in self._read_missing():
            return False
        if self.proc.poll() is None:
            return True
        return all(len(self._records(other)) == self.nprocs for other in self.nodeids[:self.nodeids.index(nodeid)])

    def wait(self, nodeid: str, *, limit: float) -> ChildResult:
        """Wait until every rank has finished ``nodeid``, the run has ended, or ``limit``
        seconds have passed (then the run is killed).

        Parameters
        ----------
        nodeid : str
        limit : float
            Wall-clock seconds.

        Returns
        -------
        ChildResult
        """
        start = time.monotonic()
        timed_out = False
        records = self._records(nodeid)
        while len(records) < self.nprocs and nodeid not in self._read_missing():
            if self.proc.poll() is not None:
                records = self._records(nodeid)  # written just before the end
                break
            remaining = start + limit - time.monotonic()
            if remaining <= 0:
                terminate_process_tree(self.proc)
                timed_out = True
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=min(POLL_SECONDS, remaining))
            records = self._records(nodeid)
        output = self._output()
        if len(records) == self.nprocs:
            self._done.add(nodeid)
        return ChildResult(returncode=None if timed_out else self.proc.poll(), elapsed=time.monotonic() - start,
                           output=output, timed_out=timed_out, records=records,
                           missing=nodeid in self._read_missing())

    def close(self) -> None:
        """End the run (waiting a little if it has done all its items) and remove its directory."""
        if self.proc.poll() is None and self._done.issuperset(self.nodeids):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=EXIT_GRACE)
        if self.proc.poll() is None:
            terminate_process_tree(self.proc)
        shutil.rmtree(self.directory, ignore_errors=True)

    def _records(self, nodeid: str) -> list[dict]:
        """The records of ``nodeid`` the ranks have written so far, ordered by rank."""
        found = []
        for path in self.directory.glob("rank*.jsonl"):
            with contextlib.suppress(OSError):
                for line in path.read_text().splitlines(keepends=True):
                    if line.endswith("\n"):  # a line being written is not one yet
                        record = json.loads(line)
                        if record["nodeid"] == nodeid:
                            found.append(record)
        return sorted(found, key=lambda record: record["rank"])

    def _read_missing(self) -> set[str]:
        """The node ids the child reported it did not collect (empty until it reports)."""
        if self._missing is None:
            path = self.directory / MISSING_FILE
            with contextlib.suppress(OSError, ValueError):
                self._missing = set(json.loads(path.read_text()))
        return self._missing or set()

    def _output(self) -> str:
        """The log from the start of the current item; the next item's output starts after it."""
        with open(self.log, "rb") as log:
            log.seek(self._offset)
            text = log.read()
        self._offset += len(text)
        return text.decode(errors="replace")


def terminate_process_tree(proc: subprocess.Popen) -> None:
    """End ``mpiexec`` and everything it started.

    MPICH's hydra starts its proxy and every rank in sessions of their own,
    so killing ``mpiexec``'s process group is not enough.  ``mpiexec`` is
    asked first (SIGTERM: it then kills its ranks); after
    :data:`TERMINATE_GRACE` seconds whatever is left of the process tree,
    as found before signalling, is SIGKILLed.

    Parameters
    ----------
    proc : subprocess.Popen
        Started with ``start_new_session=True``.
    """
    descendants = _descendant_pids(proc.pid)
    _signal_group(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=TERMINATE_GRACE)
    _signal_group(proc.pid, signal.SIGKILL)
    for pid in descendants:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def _signal_group(pgid: int, signum: int) -> None:
    """Send ``signum`` to a process group that may already be gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _descendant_pids(root: int) -> list[int]:
    """Process ids of all descendants of ``root`` (Linux ``/proc``; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat_file.parent.name))
    found, frontier = [], [root]
    while frontier:
        kids = children.get(frontier.pop(), [])
        found += kids
        frontier += kids
    return found
