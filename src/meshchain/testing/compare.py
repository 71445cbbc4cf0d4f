"""N ranks against one rank: the property meshchain promises, as a test helper.

Examples
--------
>>> import numpy as np, meshchain as mc
>>> from meshchain.testing import same_on_one_and_all_ranks
>>> def program():
...     cells = mc.Set(4, "cells")
...     q = mc.Dat(cells, 1, np.arange(4.0), "q")
...     mc.partition("block")
...     return {"q": q.gather()}
>>> results = same_on_one_and_all_ranks(program)
>>> results["q"][:, 0].tolist()
[0.0, 1.0, 2.0, 3.0]
"""

from __future__ import annotations

import numpy as np

from .asserts import parallel_assert

__all__ = ["same_on_one_and_all_ranks"]


def same_on_one_and_all_ranks(program, *, rtol: float = 0.0, atol: float = 0.0, comm=None, **options):
    """Run ``program()`` on one rank (``MPI.COMM_SELF``, on every rank) and on all ranks of
    ``comm`` (default ``COMM_WORLD``), each in a fresh runtime (``mc.reset_runtime(comm=...,
    **options)``), and assert that the results agree (collective).

    ``program`` declares, partitions, runs and returns a dict of results: gathered arrays
    (``dat.gather()``, ``None`` off rank 0) or values the same on every rank
    (``glob.value``). Arrays are compared on rank 0 (``rtol = atol = 0``: bit for bit),
    values on every rank. Returns the results of the run on all ranks.
    """
    import meshchain as mc  # inside: the plugin (via .fixtures) must not import them at pytest start-up
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    mc.reset_runtime(comm=MPI.COMM_SELF, **options)
    serial = program()
    mc.reset_runtime(comm=comm, **options)
    parallel = program()
    parallel_assert(set(serial) == set(parallel), f"the results' keys differ: {sorted(serial)} vs {sorted(parallel)}",
                    comm=comm)
    problems = [_difference(key, serial[key], parallel[key], rtol, atol) for key in sorted(serial)]
    problems = [p for p in problems if p]
    parallel_assert(not problems, f"{comm.size} ranks differ from one: " + "; ".join(problems), comm=comm)
    return parallel


def _difference(key, one, many, rtol, atol) -> str | None:
    if many is None:  # a gathered array, off rank 0
        return None
    one, many = np.asarray(one), np.asarray(many)
    if one.shape != many.shape:
        return f"{key!r}: shape {many.shape} on all ranks, {one.shape} on one"
    if np.allclose(many, one, rtol=rtol, atol=atol, equal_nan=True):
        return None
    worst = np.unravel_index(int(np.argmax(np.abs(many - one))), one.shape)
    return f"{key!r}: worst at index {tuple(int(i) for i in worst)}: {many[worst]!r} on all ranks, {one[worst]!r} on one"
