"""The MPI test harness of meshchain's pytest plugin (``meshchain.testing``) does what it promises.

MPI tests here run under ``mpiexec`` through the harness itself; failure
modes (a failure on one rank, a hang, a child that collects nothing, a hang
where pytest-timeout cannot act) are checked by running pytest in a
subprocess on small test files, in the parent mode a developer would see.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshchain.testing import harness as mpi_harness

needs_mpiexec = pytest.mark.skipif(
    mpi_harness.find_mpiexec() is None, reason="no mpiexec next to sys.executable or on PATH"
)


# --------------------------------------------------------------------------
# MPI tests run through the harness
# --------------------------------------------------------------------------


@pytest.mark.mpi(nprocs=(1, 2, 3, 4), timeout=60)
def test_world_size_is_the_requested_nprocs(comm, mpi_nprocs, request):
    from mpi4py import MPI

    assert mpi_harness.is_child()
    assert comm is MPI.COMM_WORLD
    assert comm.size == mpi_nprocs == int(os.environ["MESHCHAIN_MPI_NPROCS"])
    assert request.node.name == f"test_world_size_is_the_requested_nprocs[np{comm.size}]"
    # A file with the node ids of the child run, one per line; unset only in a child started by hand.
    listed = os.environ.get("MESHCHAIN_MPI_NODEIDS")
    assert listed is None or request.node.nodeid in Path(listed).read_text().splitlines()


@pytest.mark.mpi(nprocs=3, timeout=60)
@pytest.mark.parametrize("scale", [1, 10])
def test_allreduce_sum_composes_with_parametrize(comm, scale, request):
    from mpi4py import MPI

    total = comm.allreduce(scale * (comm.rank + 1), op=MPI.SUM)
    assert total == scale * comm.size * (comm.size + 1) // 2
    assert request.node.name == f"test_allreduce_sum_composes_with_parametrize[np3-{scale}]"


@pytest.mark.mpi(nprocs=2, timeout=60)
@settings(max_examples=30)
@given(values=st.lists(st.integers(), max_size=5))
def test_hypothesis_draws_the_same_examples_on_every_rank(comm, values):
    assert settings.default.derandomize
    assert settings.default.database is None
    assert settings.default.deadline is None
    assert not settings.default.report_multiple_bugs  # no clock decides what runs after a failure
    assert comm.allgather(values) == [values] * comm.size


def _drawn_integers() -> list:
    """The integers a derandomized hypothesis test draws (the same test each call)."""
    seen = []

    @settings(max_examples=300, derandomize=True, database=None, deadline=None)
    @given(value=st.integers(0, 10**6))
    def record(value):
        seen.append(value)

    record()
    return seen


@pytest.mark.mpi(nprocs=2, timeout=120)
def test_hypothesis_draws_do_not_depend_on_the_modules_a_rank_imported(comm, tmp_path):
    """Hypothesis draws some values from the literals of the local modules in ``sys.modules``
    (6.131 and later); a module only one rank imported (a generated loop, say) must not change
    what that rank draws."""
    before = _drawn_integers()
    if comm.rank == 0:
        probe = tmp_path / "meshchain_constants_probe.py"
        probe.write_text("VALUES = [" + ", ".join(str(v) for v in range(1001, 10**6, 9973)) + "]\n")
        sys.path.insert(0, str(tmp_path))
    try:
        if comm.rank == 0:
            assert len(__import__("meshchain_constants_probe").VALUES) > 100
        after = _drawn_integers()
    finally:
        if comm.rank == 0:
            sys.path.remove(str(tmp_path))
            sys.modules.pop("meshchain_constants_probe", None)
    assert after == before
    assert comm.allgather(after) == [after] * comm.size


def test_the_child_empties_hypothesis_pool_of_module_constants(monkeypatch):
    """What the child does to hypothesis (:func:`~meshchain.testing.harness.ignore_module_constants`),
    done here in the parent: the patched function is put back afterwards (monkeypatch), and the
    pool cache it clears is recomputed on the next draw."""
    providers = pytest.importorskip("hypothesis.internal.conjecture.providers")
    if not hasattr(providers, "_get_local_constants"):
        pytest.skip("this hypothesis draws no constants from modules")
    monkeypatch.setattr(providers, "_get_local_constants", providers._get_local_constants)
    assert mpi_harness.ignore_module_constants()
    pool = providers._get_local_constants()
    assert not any(pool.set_for_type(kind) for kind in (int, float, bytes, str))


@pytest.mark.parallel(nprocs=[1, 2], timeout=60)
def test_parallel_marker_names_its_items_like_mpi_pytest(comm, mpi_nprocs, request):
    assert mpi_harness.is_child() and comm.size == mpi_nprocs
    assert request.node.name == f"test_parallel_marker_names_its_items_like_mpi_pytest[nprocs={comm.size}]"


@pytest.mark.parallel
def test_bare_parallel_marker_runs_on_three_ranks(comm):
    assert comm.size == 3


def test_comm_is_self_outside_mpi_tests(comm, mpi_nprocs):
    from mpi4py import MPI

    assert not mpi_harness.is_child()
    assert comm is MPI.COMM_SELF
    assert mpi_nprocs is None


# --------------------------------------------------------------------------
# The marker
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mark", "nprocs", "timeout"),
    [
        (pytest.mark.mpi, (2,), 120.0),
        (pytest.mark.mpi(3), (3,), 120.0),
        (pytest.mark.mpi(nprocs=(1, 2, 4), timeout=5), (1, 2, 4), 5.0),
        (pytest.mark.mpi(nprocs=[2], timeout=0.5), (2,), 0.5),
        (pytest.mark.parallel, (3,), 120.0),
        (pytest.mark.parallel([1, 2, 3]), (1, 2, 3), 120.0),
        (pytest.mark.parallel(nprocs=4, timeout=9), (4,), 9.0),
    ],
)
def test_marker_arguments(mark, nprocs, timeout):
    spec = mpi_harness.MpiSpec.from_marker(mark.mark)
    assert spec == mpi_harness.MpiSpec(nprocs, timeout)


def test_a_test_that_measures_times_is_marked_alone():
    assert mpi_harness.MpiSpec.from_marker(pytest.mark.mpi(nprocs=2, alone=True).mark).alone
    assert not mpi_harness.MpiSpec.from_marker(pytest.mark.mpi(nprocs=2).mark).alone


@pytest.mark.parametrize(
    ("mark", "error"),
    [
        (pytest.mark.mpi(nprocs=0), ValueError),
        (pytest.mark.mpi(nprocs=()), ValueError),
        (pytest.mark.mpi(nprocs=(2, 2)), ValueError),
        (pytest.mark.mpi(nprocs=True), ValueError),
        (pytest.mark.mpi(nprocs=2, timeout=0), ValueError),
        (pytest.mark.mpi(2, nprocs=2), TypeError),
        (pytest.mark.mpi(nprocs=2, tiemout=3), TypeError),
        (pytest.mark.mpi(nprocs=2, alone="yes"), TypeError),
        (pytest.mark.parallel(nprocs=[1, 1]), ValueError),
    ],
)
def test_marker_rejects_bad_arguments(mark, error):
    with pytest.raises(error, match=f"{mark.mark.name} marker"):
        mpi_harness.MpiSpec.from_marker(mark.mark)


# --------------------------------------------------------------------------
# Failure modes, seen from a parent pytest in a subprocess
# --------------------------------------------------------------------------

SCENARIOS = """
    import os
    import time

    import pytest

    CHILD = os.environ.get("MESHCHAIN_MPI_CHILD") == "1"


    @pytest.mark.mpi(nprocs=2, timeout=60)
    def test_rank1_fails_while_rank0_waits(comm):
        if comm.rank == 1:
            time.sleep(0.5)
            assert comm.rank == 0, "rank 1 fails on purpose"
        comm.Barrier()


    @pytest.mark.mpi(nprocs=3, timeout=60)
    def test_meshchain_aborts_the_job_from_rank2(comm):
        from meshchain.comm.agree import abort_all

        if comm.rank == 2:
            abort_all(comm, "a step on purpose", RuntimeError("rank 2 gives up"))
        comm.Barrier()


    @pytest.mark.mpi(nprocs=2, timeout=5)
    def test_hangs_on_every_rank(comm):
        time.sleep(300)


    @pytest.mark.mpi(nprocs=1, timeout=30)
    @pytest.mark.parametrize("where", ["child"] if CHILD else ["parent"])
    def test_child_collects_nothing(where):
        pass


    @pytest.mark.mpi(nprocs=2, timeout=30)
    def test_skipped_on_every_rank(comm):
        pytest.skip("nothing to see")


    @pytest.mark.parallel(nprocs=3, timeout=60)
    def test_ranks_disagree_in_parallel_assert(comm):
        from meshchain.testing import parallel_assert

        parallel_assert(comm.rank != 1, "rank 1 disagrees")
        comm.Barrier()


    @pytest.mark.mpi(nprocs=2, timeout=30)
    @pytest.mark.xfail(strict=True, reason="known to fail on rank 1")
    def test_xfail_failing_on_rank1(comm):
        assert comm.rank == 0
        comm.Barrier()


    @pytest.mark.mpi(nprocs=2, timeout=30)
    @pytest.mark.xfail(run=False, reason="the parent does not run it")
    def test_not_run_by_the_parent(comm):
        assert comm.rank == 0, "a child that ran it fails here"
        comm.Barrier()


    @pytest.mark.mpi(nprocs=2, timeout=30)
    def test_passes_after_failures_in_its_group(comm):
        comm.Barrier()


    @pytest.mark.mpi(nprocs=1, timeout=30)
    def test_exits_non_zero_after_the_last_item(comm):
        import atexit

        atexit.register(os._exit, 3)
"""

#: Three tests on 2 ranks and one on 3 record the process ids of their ranks.
PROCESS_IDS = """
    import json
    import os
    from pathlib import Path

    import pytest


    def record(comm, name):
        pids = comm.allgather(os.getpid())
        if comm.rank == 0:
            Path(name + ".json").write_text(json.dumps(pids))


    @pytest.mark.mpi(nprocs=(2, 3), timeout=30)
    def test_first(comm):
        record(comm, f"first{comm.size}")


    @pytest.mark.mpi(nprocs=2, timeout=30)
    @pytest.mark.parametrize("which", ["a", "b"])
    def test_second(comm, which):
        record(comm, f"second{which}")


    def test_serial():
        Path("serial.json").write_text(json.dumps([os.getpid()]))
"""

#: A second file for :data:`PROCESS_IDS`: its 2-rank item joins the first file's launch.
MORE_PROCESS_IDS = """
    from test_cases import record

    import pytest


    @pytest.mark.mpi(nprocs=2, timeout=30)
    def test_third(comm):
        record(comm, "third")
"""

#: An ordinary test that waits for a 2-rank test to have run (it can only if that run started in
#: the background), and tests that must not start before the ordinary ones end.
BACKGROUND = """
    import json
    import time
    from pathlib import Path

    import pytest


    def stamp(comm, name):
        if comm.rank == 0:
            Path(name + ".json").write_text(json.dumps(time.time()))


    def test_ordinary():
        deadline = time.time() + 120
        while not Path("early.json").exists() and time.time() < deadline:
            time.sleep(0.1)
        Path("ordinary.json").write_text(json.dumps(time.time()))
        assert Path("early.json").exists(), "the 2-rank test did not run while this one ran"


    @pytest.mark.mpi(nprocs=2, timeout=60)
    def test_early(comm):
        stamp(comm, "early")


    @pytest.mark.mpi(nprocs=2, timeout=60, alone=True)
    def test_measuring(comm):
        stamp(comm, "measuring")


    @pytest.mark.mpi(nprocs=3, timeout=60)
    def test_larger(comm):
        stamp(comm, "larger")


    @pytest.mark.alone
    def test_timed():
        Path("timed.json").write_text(json.dumps(time.time()))
"""

HANGS_WHILE_COLLECTING = """
    import os
    import time

    import pytest

    if os.environ.get("MESHCHAIN_MPI_CHILD") == "1":
        time.sleep(300)  # at import: pytest-timeout does not cover collection


    @pytest.mark.mpi(nprocs=2, timeout=1)
    def test_hangs_while_collecting():
        pass
"""


def run_parent_pytest(directory: Path, source: str, *flags: str, expect: int = 1, more: str | None = None,
                      **env: str) -> dict[str, dict]:
    """Run a parent pytest on ``source`` (``test_cases.py``) and ``more`` (``test_more.py``, if
    given) in ``directory`` (with ``flags``, expecting exit code ``expect``); return its test
    cases by name.

    Each test case is a dict with ``time`` (seconds), ``outcome`` (``passed``,
    ``failure``, ``error`` or ``skipped``), ``type`` and ``message`` (failure
    or skip text).
    """
    directory.mkdir()
    (directory / "pytest.ini").write_text("[pytest]\n")
    (directory / "test_cases.py").write_text(textwrap.dedent(source))
    files = ["test_cases.py"]
    if more is not None:
        (directory / "test_more.py").write_text(textwrap.dedent(more))
        files.append("test_more.py")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MESHCHAIN_MPI_")}
    environ.update(env)
    mpi_harness.redirect_bytecode(environ)
    command = [sys.executable, "-m", "pytest", *files, "-p", "meshchain.testing.plugin",
               "-p", "no:cacheprovider", "--junitxml=junit.xml", "--timeout=300", *flags]
    run = subprocess.run(command, cwd=directory, env=environ, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == expect, run.stdout + run.stderr  # 1: some tests fail, none crash
    return parse_junit(directory / "junit.xml")


def parse_junit(path: Path) -> dict[str, dict]:
    """The test cases of a JUnit XML report, by test name."""
    cases = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        result = {"time": float(case.get("time")), "outcome": "passed", "type": "",
                  "message": ""}
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                result.update(outcome=child.tag, type=child.get("type", ""),
                              message=f"{child.get('message', '')}\n{child.text or ''}")
        cases[case.get("name")] = result
    return cases


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    """The outcomes of :data:`SCENARIOS` in a parent pytest."""
    return run_parent_pytest(tmp_path_factory.mktemp("mpi") / "scenarios", SCENARIOS)


@needs_mpiexec
def test_failure_on_one_rank_aborts_all_ranks_promptly(scenarios):
    case = scenarios["test_rank1_fails_while_rank0_waits[np2]"]
    assert case["outcome"] == "failure"
    assert "rank 1 fails on purpose" in case["message"]
    assert "rank 1/2 failed" in case["message"]
    assert "rank 1 calls MPI_Abort(COMM_WORLD, 1)" in case["message"]
    assert "exceeded" not in case["message"]
    assert "wall-clock" not in case["message"]
    assert case["time"] < 20  # the marker's timeout is 60 s


@needs_mpiexec
def test_an_abort_by_meshchain_itself_reaches_the_parent_with_its_report(scenarios):
    # abort_all also leaves its report in the results directory: mpiexec may drop it
    case = scenarios["test_meshchain_aborts_the_job_from_rank2[np3]"]
    assert case["outcome"] == "failure"
    assert "exited with code 1" in case["message"]
    assert "meshchain: rank 2: a step on purpose failed; aborting all ranks." in case["message"]
    assert "RuntimeError: rank 2 gives up" in case["message"]
    assert case["time"] < 30  # the marker's timeout is 60 s


@needs_mpiexec
def test_parallel_assert_with_disagreeing_ranks_fails_every_rank_promptly(scenarios):
    case = scenarios["test_ranks_disagree_in_parallel_assert[nprocs=3]"]
    assert case["outcome"] == "failure"
    assert "parallel assertion failed on rank(s) [1]: rank 1 disagrees" in case["message"]
    assert "wall-clock" not in case["message"] and "exceeded" not in case["message"]
    assert case["time"] < 30  # the marker's timeout is 60 s


@needs_mpiexec
def test_the_items_after_a_failure_in_a_child_run_go_to_a_new_run(scenarios):
    # the 2-rank items of SCENARIOS form one group: failures, a hang, a skip, an xfail and
    # an item the parent does not run (which a child would fail) come first
    assert scenarios["test_passes_after_failures_in_its_group[np2]"]["outcome"] == "passed"
    assert scenarios["test_skipped_on_every_rank[np2]"]["outcome"] == "skipped"
    not_run = scenarios["test_not_run_by_the_parent[np2]"]
    assert not_run["outcome"] == "skipped" and "NOTRUN" in not_run["message"]


@needs_mpiexec
def test_a_run_that_exits_non_zero_after_its_last_item_fails_that_item(scenarios):
    case = scenarios["test_exits_non_zero_after_the_last_item[np1]"]
    assert case["outcome"] == "failure"
    assert "finished on every rank, but then the child run (this was its last item) exited with code" in case[
        "message"]


@needs_mpiexec
@pytest.mark.parametrize("isolate", [False, True])
def test_the_items_of_a_process_count_share_one_launch_across_files_unless_isolated(tmp_path, isolate):
    directory = tmp_path / "pids"
    flags = ("--mpi-isolate",) if isolate else ()
    cases = run_parent_pytest(directory, PROCESS_IDS, *flags, expect=0, more=MORE_PROCESS_IDS)
    assert [case["outcome"] for case in cases.values()] == ["passed"] * 6
    pids = {name: json.loads((directory / f"{name}.json").read_text())
            for name in ("first2", "first3", "seconda", "secondb", "third", "serial")}
    assert len(pids["first2"]) == len(pids["seconda"]) == len(pids["third"]) == 2 and len(pids["first3"]) == 3
    assert set(pids["first3"]).isdisjoint(pids["first2"])
    assert set(pids["serial"]).isdisjoint(pids["first2"] + pids["first3"])
    if isolate:
        launches = [set(pids[name]) for name in ("first2", "seconda", "secondb", "third")]
        assert all(a.isdisjoint(b) for n, a in enumerate(launches) for b in launches[n + 1:])
    else:
        assert pids["first2"] == pids["seconda"] == pids["secondb"] == pids["third"]
    # the parent ran every ordinary test first, then the MPI items by process count
    order = list(cases)
    assert order[0] == "test_serial", order
    assert order.index("test_first[np3]") > max(order.index(n) for n in order if "np2" in n), order


@needs_mpiexec
def test_small_runs_start_in_the_background_while_ordinary_tests_run_and_alone_ones_wait(tmp_path):
    directory = tmp_path / "background"
    cases = run_parent_pytest(directory, BACKGROUND, expect=0)
    assert list(cases) == ["test_ordinary", "test_early[np2]", "test_measuring[np2]", "test_larger[np3]",
                           "test_timed"]
    assert [case["outcome"] for case in cases.values()] == ["passed"] * 5
    times = {name: json.loads((directory / f"{name}.json").read_text())
             for name in ("early", "ordinary", "measuring", "larger", "timed")}
    assert times["early"] < times["ordinary"] < min(times["measuring"], times["larger"])
    assert times["timed"] > max(times["measuring"], times["larger"])  # an ordinary test marked alone: last


@needs_mpiexec
def test_hang_on_every_rank_fails_at_the_timeout(scenarios):
    case = scenarios["test_hangs_on_every_rank[np2]"]
    assert case["outcome"] == "failure"
    assert "exceeded the mpi timeout of 5 s" in case["message"]
    assert 5 <= case["time"] < 30


@needs_mpiexec
def test_child_collecting_no_test_fails(scenarios):
    case = scenarios["test_child_collects_nothing[np1-parent]"]
    assert case["outcome"] == "failure"
    assert "was not collected by the child (node id mismatch?)" in case["message"]


@needs_mpiexec
def test_skip_on_every_rank_skips_the_parent(scenarios):
    case = scenarios["test_skipped_on_every_rank[np2]"]
    assert case["outcome"] == "skipped"
    assert "nothing to see" in case["message"]


@needs_mpiexec
def test_xfail_marker_is_judged_by_the_parent(scenarios):
    case = scenarios["test_xfail_failing_on_rank1[np2]"]
    assert case["outcome"] == "skipped"
    assert case["type"] == "pytest.xfail"


@needs_mpiexec
def test_wall_clock_limit_kills_every_process(tmp_path):
    directory = tmp_path / "wallclock"
    cases = run_parent_pytest(directory, HANGS_WHILE_COLLECTING, MESHCHAIN_MPI_WALL_SLACK="4")
    case = cases["test_hangs_while_collecting[np2]"]
    assert case["outcome"] == "failure"
    assert "wall-clock limit of 5 s" in case["message"]
    assert case["time"] < 5 + mpi_harness.TERMINATE_GRACE + 5
    time.sleep(0.5)
    assert processes_mentioning(str(directory)) == []


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain ``text``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(args)
    return found


def test_rank_reports_that_mpiexec_dropped_are_added_to_the_output(tmp_path):
    """A failing rank also writes its report to a file: when mpiexec dropped it from the
    output (it does for output in flight at an abort), the parent shows it from the file."""
    report = "\n==== meshchain MPI: rank 2/3 failed: t.py::test (call) ====\nboom\n"
    (tmp_path / "rank2.failure.txt").write_text(report)
    (tmp_path / "rank0.json").write_text("{}")
    silent = mpi_harness.ChildResult(returncode=1, elapsed=2.7, output="")
    shown = mpi_harness.with_rank_reports(silent, tmp_path)
    assert "rank2's report, from its file (mpiexec did not forward it)" in shown.output
    assert "rank 2/3 failed" in shown.output and "boom" in shown.output
    forwarded = mpi_harness.ChildResult(returncode=1, elapsed=2.7, output=f"noise{report}more")
    assert mpi_harness.with_rank_reports(forwarded, tmp_path) == forwarded
