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

__all__ = ["ChildResult", "ChildRun", "terminate_process_tree", "TERMINATE_GRACE", "MISSING_FILE", "NODEIDS_FILE"]

#: Seconds ``mpiexec`` gets to clean up after SIGTERM before everything is SIGKILLed.
TERMINATE_GRACE = 5.0
#: Seconds between two looks at a run's records.
POLL_SECONDS = 0.02
#: The file in which rank 0 of a child lists the node ids it was given but did not collect.
MISSING_FILE = "missing.json"
#: The file that gives a child the node ids to run, one per line.
NODEIDS_FILE = "nodeids.txt"


@dataclass(frozen=True)
class ChildResult:
    """How one item of a child run ended, as far as the parent can see.

    Attributes
    ----------
    returncode : int or None
        ``mpiexec``'s exit status once the run has ended; None while it goes on (after the
        item was done) or when it was killed at the wall clock.
    elapsed : float
        Seconds the parent waited for the item.
    output : str
        What the ranks and ``mpiexec`` wrote to stdout and stderr since the parent finished
        waiting for the run's previous item.
    timed_out : bool
        Whether the run was killed at the wall-clock limit while the item ran.
    records : list of dict
        The item's record from each rank that finished it, ordered by rank: ``nodeid``,
        ``rank``, ``size``, ``outcome`` (``"passed"`` or ``"skipped"``) and ``reason``.
    missing : bool
        Whether the child did not collect the item at all.
    last : bool
        Whether the item was the run's last: the parent then also waited for the run to
        exit, and ``returncode`` is its exit status (None: killed at the wall clock).
    """

    returncode: int | None
    elapsed: float
    output: str
    timed_out: bool = False
    records: list = field(default_factory=list)
    missing: bool = False
    last: bool = False


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
        self._next = 0  # the index of the item the parent waits for next
        self._offset = 0  # where the output of the item now running begins in the log
        self._missing: set[str] | None = None
        with open(self.log, "wb") as sink:
            self.proc = subprocess.Popen(
                self.command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=sink,
                stderr=subprocess.STDOUT, start_new_session=True,
            )

    def covers(self, nodeid: str) -> bool:
        """Whether ``nodeid`` is the item this run does next, in the parent's order: every item
        before it has been waited for (a run that ended while doing it reports that there;
        an item the parent did not wait for, one it skipped, ends the run's use)."""
        return self._next < len(self.nodeids) and self.nodeids[self._next] == nodeid

    def wait(self, nodeid: str, *, limit: float) -> ChildResult:
        """Wait until every rank has finished ``nodeid`` (the run's next item, see :meth:`covers`),
        the run has ended, or ``limit`` seconds have passed (then the run is killed). After the
        run's last item, also wait for the run to exit: its exit status is the item's too.

        Parameters
        ----------
        nodeid : str
        limit : float
            Wall-clock seconds.

        Returns
        -------
        ChildResult
        """
        if not self.covers(nodeid):
            raise ValueError(f"{nodeid!r} is not the next item of this run")
        self._next += 1
        start = time.monotonic()
        deadline = start + limit
        last = self._next == len(self.nodeids)
        timed_out = False
        records = self._records(nodeid)
        while not (len(records) == self.nprocs and not last) and nodeid not in self._read_missing():
            if self.proc.poll() is not None:
                records = self._records(nodeid)  # written just before the end
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                terminate_process_tree(self.proc)
                timed_out = True
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=min(POLL_SECONDS, remaining))
            records = self._records(nodeid)
        return ChildResult(returncode=None if timed_out else self.proc.poll(),
                           elapsed=time.monotonic() - start, output=self._output(),
                           timed_out=timed_out, records=records, missing=nodeid in self._read_missing(), last=last)

    def close(self) -> None:
        """End the run (if it is still going) and remove its directory."""
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
