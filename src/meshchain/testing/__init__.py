"""Regression testing of meshchain programs with pytest, on any number of ranks.

Installing meshchain installs a pytest plugin (:mod:`.plugin`): mark a test
``@pytest.mark.parallel(nprocs=[1, 2, 3])`` and plain ``pytest`` runs it under
``mpiexec -n N`` once per count (ids ``[nprocs=N]``, as mpi-pytest names them), every rank
running the test body with the ``comm`` fixture as ``MPI.COMM_WORLD``. A wall clock
(``timeout=``, default 120 s) kills the whole process tree of a hanging test; a rank that
fails aborts the communicator, so the others do not wait for it, and its traceback is shown
in the report. Collective assertions (:func:`parallel_assert`,
:func:`assert_same_on_all_ranks`, :func:`assert_gathered_close`) fail on every rank together;
:func:`same_on_one_and_all_ranks` checks meshchain's promise that N ranks give one rank's
answer; the plugin's fixtures give small meshes (see :mod:`.fixtures`).

Examples
--------
>>> from meshchain.testing import parallel_assert
>>> parallel_assert(True)
"""

from .asserts import assert_gathered_close, assert_same_on_all_ranks, parallel_assert
from .compare import same_on_one_and_all_ranks

__all__ = ["parallel_assert", "assert_same_on_all_ranks", "assert_gathered_close", "same_on_one_and_all_ranks"]
