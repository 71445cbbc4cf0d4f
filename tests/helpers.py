"""Peeking at the session's internals from tests (what user code never needs)."""

from __future__ import annotations

import numpy as np

import meshchain as mc
from meshchain.testing import parallel_assert


def host_rows(obj):
    """The array behind a dat (owned and halo rows) or a global (its value), as it is now:
    nothing is run or synchronised first."""
    storage = mc.get_runtime().storage(obj)
    return storage.value if obj.is_global else storage.host


def layout_of(s):
    """The set's layout on this rank (None on several ranks before mc.partition)."""
    return mc.get_runtime().layout_of(s)


def failure_on_every_rank(comm, action) -> str:
    """Run ``action()``, which must raise a :class:`meshchain.MeshchainError` on every rank of
    ``comm`` (checked collectively); return this rank's message."""
    try:
        action()
    except mc.MeshchainError as exc:
        message = str(exc)
    else:
        message = ""
    messages = comm.allgather(message)
    assert all(messages), f"not every rank raised: {messages}"
    return message


def launch_script(arguments: list, env: dict, *, nprocs: int, timeout: float, what: str,
                  detail=None) -> tuple[int, str]:
    """Run ``python arguments...`` under ``mpiexec -n nprocs`` with ``env`` (from the repository
    root; ``PYTHONUNBUFFERED`` set); (exit status, output). Killed, with everything it started,
    after ``timeout`` seconds (the test then fails, naming ``what``, with ``detail()`` if given);
    skipped without mpiexec."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    from meshchain.testing import harness as mpi_harness

    mpiexec = mpi_harness.find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec next to sys.executable or on PATH")
    command = [mpiexec, *mpi_harness.oversubscribe_flags(mpiexec), "-n", str(nprocs), sys.executable, *arguments]
    process = subprocess.Popen(command, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True,
                               cwd=Path(__file__).resolve().parents[1])
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{what}: mpiexec did not finish in {timeout} s:\n{output[-6000:]}\n{detail() if detail else ''}")
    return process.returncode, output


def example_module(name: str):
    """``examples/<name>.py`` imported as a module (its ``main(argv)`` runs it)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def equal_on_rank_0(comm, pairs, what):
    """Each ``(want, have)`` pair (gathered: rank 0 holds them) equal bit for bit, asserted on
    every rank at once: a mismatch fails every rank, so hypothesis shrinks in step on all of them
    (rank 0 shrinking alone would run other examples than the rest: their collectives hang)."""
    pairs = list(pairs)

    def equal():
        for want, have in pairs if comm.rank == 0 else ():
            np.testing.assert_array_equal(have, want)
        return True

    parallel_assert(equal, what, comm=comm)
