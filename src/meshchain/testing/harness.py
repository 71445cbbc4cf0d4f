"""Run MPI tests under plain ``pytest``: the machinery of :mod:`meshchain.testing`'s plugin.

Usage
-----
Mark a test with ``parallel`` (mpi-pytest's spelling, ids ``[nprocs=N]``, default 3
processes) or ``mpi`` (meshchain's own suite, ids ``[npN]``, default 2)::

    @pytest.mark.parallel(nprocs=[1, 2, 3], timeout=120)
    def test_halo_exchange(comm):
        ...

``nprocs`` is an int or a sequence of ints; ``timeout`` is in
seconds (default ``120``) and bounds the test's setup, call and teardown on
every rank. ``alone=True`` marks a test whose assertions depend on measured times:
it runs only when no other test does (see below).  The marker may also be put on a class or module (``pytestmark``),
and composes with ``@pytest.mark.parametrize`` and hypothesis' ``@given``.

How it works
------------
*Parent* (the ``pytest`` you run).  Every marked test is parametrized into one
item per process count, with ids such as ``test_halo_exchange[np2]``.  The
parameter belongs to a hidden autouse fixture, so it never appears in the test
signature.  The marked items run after every other test, ordered by process
count (otherwise in their order); after collection each is replaced by a
launcher item with the same node id and markers, and consecutive launchers of
one process count form a group, whatever their files.  A launcher with no child
run to join executes, in a fresh session (process group) and with the rootdir
as working directory::

    mpiexec -n N python -m pytest <files> -q -p no:cacheprovider -x \
        -p meshchain.testing.plugin --runxfail --timeout=<timeout> --timeout-method=thread ...

with ``MESHCHAIN_MPI_CHILD=1``, ``MESHCHAIN_MPI_NPROCS=N`` and
``MESHCHAIN_MPI_NODEIDS=<a file listing its node id and those after it in its
group>`` in the environment: one child run for the rest of the group, which
saves starting Python, MPI, numba and the test modules for every item and every
file (see :mod:`.launch`).  The next launchers of the group join that run, each waiting
for its own outcome, in order; a launcher the parent skips ends the run's use
(the next one starts a new run).  The parent never sets up the test's
fixtures and never imports ``mpi4py``.  An item fails when the run ends before
every rank finished it (showing the output written since the previous item;
a failing rank aborts the run), when the run exits non-zero after its last
item, when the child did not collect it, or when its wall-clock limit
``timeout + 30 s`` expires, in which case ``mpiexec`` and every process it
started are killed.  The items after a failure go to a new run; a failed item
is never run again.  If every rank skipped the test, the parent item is
skipped.

While the parent runs the ordinary tests (one process: one core on a small machine), the
child runs of at most :data:`PRESTART_MAX_NPROCS` ranks start in the background, one after
the other in the order the parent will reach them, so the MPI tests use the cores the
ordinary ones leave idle; their launchers then find their outcomes recorded. Nothing more
starts in the background once the parent reaches its first MPI item. The items of a test
marked ``alone=True`` form groups of their own (after the other items of their process
count), which never start in the background; an ordinary test that measures times is
marked ``@pytest.mark.alone`` and runs after every MPI item.  ``skip``/``skipif``/``xfail`` markers are judged by the parent (the
child runs with ``--runxfail``).  ``pytest --mpi-isolate`` gives every item a
run of its own.

*Child* (``MESHCHAIN_MPI_CHILD=1``, one pytest per rank).  Collection is
narrowed to the items whose node ids ``MESHCHAIN_MPI_NODEIDS`` lists, in that
order, each with its marker's timeout; the test bodies run on every rank, and
the harness checks that ``COMM_WORLD.size`` is the requested ``N``.  No rank
starts an item before every rank has recorded the one before (and the ranks
check that it was the same item).  Items of one
run share the process: module- and session-scoped fixtures, imported
modules and MPI itself.  When any phase (setup, call, teardown) or the
collection fails on a rank, that rank writes the failure report to stderr (and
to a file, which the parent shows when ``mpiexec`` dropped the output in flight
at the abort; ``PYTHONFAULTHANDLER`` makes a crashing rank print its stack) and
calls ``MPI.COMM_WORLD.Abort(1)``, so ranks blocked in a collective die too
and the parent fails at once instead of hanging.  A rank stuck inside MPI (not
running Python code) is ended by pytest-timeout's ``thread`` method, which
dumps the stacks and exits the process; ``mpiexec`` then kills the others.

To debug, run a child by hand: ``MESHCHAIN_MPI_CHILD=1 mpiexec -n 2 python -m
pytest tests/test_x.py`` runs the ``np2`` items of the file (and nothing
else); the first failure aborts the run.  Items of one run share their
processes across files, so a test must leave no state behind that changes
another's outcome (the ``reset_meshchain`` fixture restarts the runtime); to
find one that does, compare with ``pytest --mpi-isolate``.

Fixtures
--------
``comm``
    ``MPI.COMM_WORLD`` in an MPI child, ``MPI.COMM_SELF`` in any other test.
``mpi_nprocs``
    The requested number of processes in an MPI child, ``None`` elsewhere.

Both are session-scoped, so hypothesis' function-scoped-fixture health check
does not object to them.

Hypothesis
----------
Every rank must draw the same examples, or the ranks' collectives no longer
match.  In the child the harness therefore loads a hypothesis settings profile
(``meshchain-mpi``) built on the active profile with ``derandomize=True``,
``database=None``, ``deadline=None``, ``report_multiple_bugs=False`` and the
``too_slow`` health check suppressed: nothing hypothesis decides may depend on
the clock, which differs between ranks.  (With ``report_multiple_bugs`` on, after
a first failing example hypothesis keeps generating until 10 s have passed on its
clock; a failure on every rank then sent the ranks into different examples, and
their collectives blocked until the timeout; the one clock left is the shrinker's
5-minute limit, longer than most tests' timeouts.)  Nor may it depend on the modules a
rank imported: hypothesis draws some values from the literals of the project's
modules in ``sys.modules`` (meshchain's generated loops among them, which ranks need
not import alike), so the child empties that pool (:func:`ignore_module_constants`).
Tests keep their own
``@settings(max_examples=...)`` etc., but must not set ``derandomize=False``,
a ``database``, a ``deadline`` or ``report_multiple_bugs``; if in doubt, write
``@settings(derandomize=True, database=None, deadline=None)``.  Strategies must
not depend on the rank.  A failure on only some ranks makes hypothesis shrink
on those ranks alone; collectives then mismatch or block, and the test ends by
the timeout instead of at once.  Make such checks collective (e.g. allreduce
the condition) when that matters.

Registration
------------
Installing meshchain registers the plugin (the ``pytest11`` entry point
``meshchain.testing.plugin``); :func:`register` (from a conftest's
``pytest_configure``) or ``-p meshchain.testing.plugin`` load it where entry
points are not loaded (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``).  Any of these may be combined.

Notes
-----
- ``mpiexec`` is the one next to ``sys.executable`` if present, else the one on
  ``PATH``; without one, MPI tests are skipped.  Open MPI gets
  ``--oversubscribe``; MPICH's hydra oversubscribes by default.
- ``tmp_path`` differs between ranks (each rank is its own pytest session).
- ``skipif`` conditions given as strings cannot use the test module's globals
  in the parent (the launcher item has no ``obj``).
- Do not run the parent pytest itself under ``mpiexec``.
- With ``PYTHONDONTWRITEBYTECODE`` set, children write bytecode under
  ``PYTHONPYCACHEPREFIX=<tempdir>/meshchain-pycache-<uid>`` instead
  (see :func:`redirect_bytecode`); otherwise each rank spends seconds
  re-compiling and assertion-rewriting hypothesis and the project.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from .launch import MISSING_FILE, NODEIDS_FILE, TERMINATE_GRACE, ChildResult, ChildRun

#: Markers, with their default process counts and the ids of their parameters.
MARKERS = {"parallel": ((3,), "nprocs={}"), "mpi": ((2,), "np{}")}
MARKER_HELP = (
    "{}(nprocs={}, timeout=120, alone=False): run the test under `mpiexec -n N` for each N in "
    "nprocs (an int or a sequence); timeout in seconds bounds the test on every rank; alone: it "
    "measures times, so it runs when no other test does"
)
ALONE_HELP = ("alone: an ordinary test whose assertions depend on measured times runs after every other test, "
              "when no MPI test runs beside it")
DEFAULT_TIMEOUT = 120.0
#: The plugin module (also the name of its pytest11 entry point).
PLUGIN = "meshchain.testing.plugin"

#: Seconds the parent allows on top of the marker's timeout (startup, collection).
WALL_CLOCK_SLACK = 30.0
#: How much of the child's output a failure message shows.
TAIL_CHARS = 12_000

ENV_CHILD = "MESHCHAIN_MPI_CHILD"
ENV_NPROCS = "MESHCHAIN_MPI_NPROCS"
ENV_NODEIDS = "MESHCHAIN_MPI_NODEIDS"  # a file: the node ids to run, one per line
ENV_RESULTS = "MESHCHAIN_MPI_RESULTS"
#: Where a rank that aborts the job from meshchain's own code (``meshchain.comm.agree.abort_all``,
#: whose ``ABORT_REPORTS_VARIABLE`` this is) also writes its report; set to the results directory.
ENV_ABORT_REPORTS = "MESHCHAIN_ABORT_REPORTS"
#: Overrides :data:`WALL_CLOCK_SLACK` (seconds); used by the harness' own tests.
ENV_WALL_SLACK = "MESHCHAIN_MPI_WALL_SLACK"

#: Environment variables that must not leak from the parent into ``mpiexec``.
_SCRUBBED_PREFIXES = ("MESHCHAIN_MPI_", "PMI_")

NPROCS_FIXTURE = "_meshchain_mpi_nprocs"
HYPOTHESIS_PROFILE = "meshchain-mpi"
#: Where ``--mpi-isolate`` is stored on the config.
ISOLATE_DEST = "meshchain_mpi_isolate"
PRESTART_MAX_NPROCS = 2
"""Child runs of at most this many ranks start in the background while the parent runs the
ordinary tests (see the module docstring)."""
ABORT_GRACE_SECONDS = 0.5  # time for mpiexec to forward a failing rank's report before the abort


# --------------------------------------------------------------------------
# The marker
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class MpiSpec:
    """What an ``mpi`` marker asks for.

    Attributes
    ----------
    nprocs : tuple of int
        Process counts; the test runs once for each.
    timeout : float
        Seconds allowed for setup, call and teardown on every rank.
    alone : bool
        The test measures times: it runs when no other test runs.
    """

    nprocs: tuple[int, ...]
    timeout: float
    alone: bool = False

    @classmethod
    def from_marker(cls, marker: pytest.Mark) -> MpiSpec:
        """Validate an ``mpi`` marker.

        Parameters
        ----------
        marker : pytest.Mark
            ``mpi``, ``mpi(3)``, ``mpi(nprocs=(1, 2), timeout=60)``, ...

        Returns
        -------
        MpiSpec

        Raises
        ------
        TypeError
            Unknown or repeated arguments.
        ValueError
            A process count that is not a positive int, or a timeout that is
            not a positive number.
        """
        kwargs = dict(marker.kwargs)
        if len(marker.args) > 1 or (marker.args and "nprocs" in kwargs):
            raise TypeError(f"{marker.name} marker: give nprocs once, got {marker.args!r} {kwargs!r}")
        if marker.args:
            kwargs["nprocs"] = marker.args[0]
        unknown = set(kwargs) - {"nprocs", "timeout", "alone"}
        if unknown:
            raise TypeError(f"{marker.name} marker: unknown arguments {sorted(unknown)}")
        alone = kwargs.get("alone", False)
        if not isinstance(alone, bool):
            raise TypeError(f"{marker.name} marker: alone must be True or False, got {alone!r}")
        return cls(
            nprocs=_validate_nprocs(kwargs.get("nprocs", MARKERS[marker.name][0]), marker.name),
            timeout=_validate_timeout(kwargs.get("timeout", DEFAULT_TIMEOUT), marker.name),
            alone=alone,
        )


def marker_of(node) -> pytest.Mark | None:
    """The ``parallel`` or ``mpi`` marker closest to ``node`` (an item or a definition)."""
    for name in MARKERS:
        marker = node.get_closest_marker(name)
        if marker is not None:
            return marker
    return None


def _validate_nprocs(nprocs: int | Sequence[int], name: str) -> tuple[int, ...]:
    """Return ``nprocs`` as a tuple of distinct positive ints."""
    counts = (nprocs,) if isinstance(nprocs, int) else tuple(nprocs)
    valid = all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts)
    if not counts or not valid or len(set(counts)) != len(counts):
        raise ValueError(f"{name} marker: nprocs must be distinct positive ints, got {nprocs!r}")
    return counts


def _validate_timeout(timeout: float, name: str) -> float:
    """Return ``timeout`` as a positive float."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"{name} marker: timeout must be a positive number, got {timeout!r}")
    return float(timeout)


def is_child() -> bool:
    """Whether this process is a rank of an MPI child run.

    Returns
    -------
    bool
        True when ``MESHCHAIN_MPI_CHILD=1``.
    """
    return os.environ.get(ENV_CHILD) == "1"


def wall_clock_limit(spec: MpiSpec) -> float:
    """Seconds the parent waits for an item (from the end of the one before it in its child
    run, or the run's start) before killing the run.

    Parameters
    ----------
    spec : MpiSpec

    Returns
    -------
    float
        ``spec.timeout`` plus :data:`WALL_CLOCK_SLACK` (or ``MESHCHAIN_MPI_WALL_SLACK``).
    """
    return spec.timeout + float(os.environ.get(ENV_WALL_SLACK, WALL_CLOCK_SLACK))


# --------------------------------------------------------------------------
# Plugin registration and hooks common to parent and child
# --------------------------------------------------------------------------


def register(config: pytest.Config) -> None:
    """Register this module as a pytest plugin unless it already is.

    Parameters
    ----------
    config : pytest.Config
        Call from a conftest's ``pytest_configure``.  A no-op when the module
        is already loaded (e.g. by its entry point or ``-p meshchain.testing.plugin``).
    """
    manager = config.pluginmanager
    module = importlib.import_module(PLUGIN)
    if not manager.is_registered(module) and manager.get_plugin(PLUGIN) is None:
        manager.register(module, PLUGIN)


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``mpi`` marker and the parent's or the child's hooks."""
    for name, (nprocs, _) in MARKERS.items():
        config.addinivalue_line("markers", MARKER_HELP.format(name, nprocs[0]))
    config.addinivalue_line("markers", ALONE_HELP)
    roles = [_ChildSession(config)] if is_child() else [_ParentSession(config), _LaunchOrder()]
    for role in roles:
        config.pluginmanager.register(role, f"{__name__}-{type(role).__name__}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize each ``mpi`` test over its process counts (ids ``np1``, ``np2``, ...)."""
    marker = marker_of(metafunc.definition)
    if marker is None:
        return
    try:
        spec = MpiSpec.from_marker(marker)
    except (TypeError, ValueError) as error:
        problem = f"{metafunc.definition.nodeid}: {error}"
    else:
        problem = None
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    metafunc.parametrize(
        NPROCS_FIXTURE, spec.nprocs, ids=[MARKERS[marker.name][1].format(n) for n in spec.nprocs], indirect=True
    )


@pytest.fixture(autouse=True)
def _meshchain_mpi_nprocs(request: pytest.FixtureRequest) -> int | None:
    """Carry the ``npN`` parameter of ``mpi`` tests; in the child, check the world size.

    Autouse so that the parameter never has to appear in a test's signature.
    """
    nprocs = getattr(request, "param", None)
    if nprocs is not None and is_child():
        _check_world_size(nprocs)
    return nprocs


@pytest.fixture(scope="session")
def comm():
    """``MPI.COMM_WORLD`` in an MPI child run, ``MPI.COMM_SELF`` in any other test."""
    from mpi4py import MPI

    return MPI.COMM_WORLD if is_child() else MPI.COMM_SELF


@pytest.fixture(scope="session")
def mpi_nprocs() -> int | None:
    """The process count requested of this MPI child run; ``None`` outside one."""
    return int(os.environ[ENV_NPROCS]) if is_child() else None


# --------------------------------------------------------------------------
# Parent: launch mpiexec
# --------------------------------------------------------------------------


class _LaunchOrder:
    """The parent's first hook on the collected items (a plugin of its own: pytest takes one
    implementation of a hook per plugin)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Put the ``mpi`` items after the others, ordered by process count (see
        :func:`in_launch_order`); first, so that plugins that select by position (stepwise)
        see the order the items run in."""
        items[:] = in_launch_order(items)


class _ParentSession:
    """Hooks of the parent pytest: replace ``mpi`` items by launcher items, group them, start
    the small groups' child runs in the background (see the module docstring), and keep the
    one child run the parent is taking its outcomes from."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.run: ChildRun | None = None
        self._lock = threading.Lock()
        self._started: dict[int, ChildRun] = {}  # id of a group -> its run started in the background
        self._entered = False  # the parent reached its first MPI item: nothing more starts in the background

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Swap each ``mpi`` item for an :class:`MpiLauncherItem` (after selection by -k/-m)."""
        items[:] = [_launcher_for(item, self) for item in items]

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Group the launchers in the final list of items (after ``--lf``, ``--ff`` and the like)."""
        assign_groups(session.items, isolate=bool(self.config.getoption(ISOLATE_DEST, False)))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        """Start the background runs of the groups :func:`background_groups` picks, one after
        the other, while the parent runs the ordinary tests."""
        groups = background_groups(session.items)
        if groups and not self.config.option.collectonly and find_mpiexec() is not None \
                and importlib.util.find_spec("mpi4py") is not None:
            threading.Thread(target=self._start_in_turn, args=(groups,), name="meshchain-mpi-prestart",
                             daemon=True).start()

    def _start_in_turn(self, groups: list) -> None:
        for group in groups:
            with self._lock:
                if self._entered:
                    return
                run = self._started[id(group)] = self._start(group)
            run.proc.wait()

    def run_for(self, item: MpiLauncherItem) -> ChildRun:
        """The child run that runs ``item``: the current one if the item is its next, the one
        started in the background for its group if the item is its next, else a new run of
        the item and those after it in its group (the current run is closed)."""
        if self.run is not None and self.run.covers(item.nodeid):
            return self.run
        self.close()
        with self._lock:
            self._entered = True
            started = self._started.pop(id(item.group), None)
        if started is not None and started.covers(item.nodeid):
            self.run = started
            return started
        if started is not None:
            started.close()
        self.run = self._start(item.group[item.group.index(item):])
        return self.run

    def _start(self, group: list) -> ChildRun:
        """A child run of ``group`` (launchers of one process count), started now."""
        nodeids = [member.nodeid for member in group]
        files = list(dict.fromkeys(nodeid.split("::")[0] for nodeid in nodeids))
        command = child_command(find_mpiexec(), group[0].nprocs, child_pytest_args(
            self.config, files, max(member.spec.timeout for member in group)))
        directory = Path(tempfile.mkdtemp(prefix="meshchain-mpi-"))
        try:
            (directory / NODEIDS_FILE).write_text("".join(f"{nodeid}\n" for nodeid in nodeids))
            return ChildRun(command, env=child_environment(group[0].nprocs, directory), cwd=self.config.rootpath,
                            nodeids=nodeids, nprocs=group[0].nprocs, directory=directory)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise

    def close(self) -> None:
        """End the current child run, if any."""
        if self.run is not None:
            run, self.run = self.run, None
            run.close()

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        """The parent finished the run's next item without waiting for it (it skipped it, or
        the item is ``xfail(run=False)``, which the child runs under ``--runxfail``): end the
        run now rather than let it run that item beside the tests that follow."""
        if self.run is not None and self.run.covers(nodeid):
            self.close()

    def pytest_sessionfinish(self) -> None:
        """A run still going on (``-x``, an interrupt) ends with the session, and so do the
        background runs the parent did not reach."""
        with self._lock:
            self._entered = True
            started, self._started = list(self._started.values()), {}
        for run in started:
            run.close()
        self.close()


def background_groups(items: list[pytest.Item]) -> list[list]:
    """The groups of launchers whose child runs start in the background, in the order the
    parent reaches them: those of at most :data:`PRESTART_MAX_NPROCS` ranks, not ``alone``,
    when ordinary tests run before them (otherwise there is nothing to overlap)."""
    if not any(not isinstance(item, MpiLauncherItem) for item in items):
        return []
    groups = list({id(item.group): item.group for item in items if isinstance(item, MpiLauncherItem)}.values())
    return [g for g in groups if g[0].nprocs <= PRESTART_MAX_NPROCS and not g[0].spec.alone]


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--mpi-isolate``: one ``mpiexec`` launch per MPI test item."""
    parser.getgroup("meshchain").addoption(
        "--mpi-isolate", action="store_true", dest=ISOLATE_DEST, default=False,
        help="launch mpiexec once per MPI test item instead of once per process count",
    )


def in_launch_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """``items`` with the ``mpi`` items after the others, ordered by process count (those
    marked ``alone`` last within a count; otherwise in their order), so that those of one
    count are consecutive and one child run can take them all: starting ``mpiexec``, Python,
    MPI and numba on every rank costs seconds. Ordinary items marked ``alone`` come last of
    all, when no child run goes on beside them.

    Parameters
    ----------
    items : list of pytest.Item

    Returns
    -------
    list of pytest.Item
    """
    others = [item for item in items if _mpi_nprocs_of(item) is None]
    measuring = [item for item in others if item.get_closest_marker("alone") is not None]
    return [item for item in others if item.get_closest_marker("alone") is None] + sorted(
        (item for item in items if _mpi_nprocs_of(item) is not None),
        key=lambda item: (_mpi_nprocs_of(item), _alone(item))) + measuring


def assign_groups(items: list[pytest.Item], *, isolate: bool = False) -> None:
    """Set the ``group`` of each launcher: the run of consecutive launchers of its process
    count (from any files; ``alone`` ones apart) that one child run executes (with
    ``isolate``, the launcher alone).

    Parameters
    ----------
    items : list of pytest.Item
        The session's items, in the order they run.
    isolate : bool
    """
    launchers = [item for item in items if isinstance(item, MpiLauncherItem)]
    positions = {id(item): n for n, item in enumerate(items)}
    group: list[MpiLauncherItem] = []
    for launcher in launchers:
        previous = group[-1] if group else None
        if isolate or previous is None or positions[id(previous)] + 1 != positions[id(launcher)] \
                or previous.nprocs != launcher.nprocs or previous.spec.alone != launcher.spec.alone:
            group = []
        group.append(launcher)
        launcher.group = group


def _alone(item: pytest.Item) -> bool:
    marker = marker_of(item)
    return bool(marker is not None and marker.kwargs.get("alone", False))


def _mpi_nprocs_of(item: pytest.Item) -> int | None:
    """The ``npN`` parameter of an ``mpi`` item, or None for any other item."""
    callspec = getattr(item, "callspec", None)
    return None if callspec is None else callspec.params.get(NPROCS_FIXTURE)


def _launcher_for(item: pytest.Item, session: _ParentSession) -> pytest.Item:
    """Return the launcher item for an ``mpi`` item, any other item unchanged."""
    nprocs = _mpi_nprocs_of(item)
    if nprocs is None:
        return item
    spec = MpiSpec.from_marker(marker_of(item))
    return MpiLauncherItem.from_parent(
        item.parent, name=item.name, original=item, spec=spec, nprocs=nprocs, session_hooks=session
    )


class MpiLauncherItem(pytest.Item):
    """Stands in for an ``mpi`` test in the parent and runs it under ``mpiexec``.

    Parameters
    ----------
    original : pytest.Function
        The collected test; node id, markers and keywords are taken from it.
    spec : MpiSpec
        The test's ``mpi`` marker.
    nprocs : int
        The number of processes of this item.
    session_hooks : _ParentSession
        Starts and keeps the child runs.
    **kwargs
        Passed on to :class:`pytest.Item`.
    """

    def __init__(self, *, original: pytest.Item, spec: MpiSpec, nprocs: int, session_hooks: _ParentSession,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.nprocs = nprocs
        self.session_hooks = session_hooks
        self.group: list[MpiLauncherItem] = [self]
        self.originalname = getattr(original, "originalname", original.name)
        self._reportinfo = original.reportinfo()
        self.own_markers.extend(original.own_markers)
        self.keywords.update({key: original.keywords[key] for key in original.keywords})
        self.extra_keyword_matches.update(original.extra_keyword_matches)
        if self.config.pluginmanager.has_plugin("timeout"):
            # The parent's own pytest-timeout must not fire before our wall clock does.
            parent_timeout = wall_clock_limit(spec) + TERMINATE_GRACE + 30
            self.add_marker(pytest.mark.timeout(parent_timeout), append=False)

    def reportinfo(self):
        """Report the original test's location."""
        return self._reportinfo

    def runtest(self) -> None:
        """Run the test under ``mpiexec -n nprocs`` (in its group's child run) and judge the result."""
        if find_mpiexec() is None:
            pytest.skip("no mpiexec next to sys.executable or on PATH")
        if importlib.util.find_spec("mpi4py") is None:
            pytest.skip("mpi4py is not installed")
        run = self.session_hooks.run_for(self)
        try:
            result = run.wait(self.nodeid, limit=wall_clock_limit(self.spec))
        except BaseException:  # interrupted: the items after this one go to a new run
            self.session_hooks.close()
            raise
        if len(result.records) < self.nprocs and not result.missing:
            result = with_rank_reports(result, run.directory)
            self.session_hooks.close()  # the items after this one go to a new run
        elif result.last:
            self.session_hooks.close()
        judge(self, result, run.command)

    def repr_failure(self, excinfo, style=None):
        """Show the message only: the traceback would be the harness'."""
        if isinstance(excinfo.value, pytest.fail.Exception):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)


@functools.cache
def find_mpiexec() -> str | None:
    """Locate ``mpiexec``.

    Returns
    -------
    str or None
        The ``mpiexec`` next to ``sys.executable`` (a virtual environment's, as
        installed by the ``mpich`` wheel) if it exists, else the one on ``PATH``.
    """
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mpiexec")


@functools.cache
def oversubscribe_flags(mpiexec: str) -> tuple[str, ...]:
    """Flags letting ``mpiexec`` start more ranks than there are cores.

    Parameters
    ----------
    mpiexec : str

    Returns
    -------
    tuple of str
        ``("--oversubscribe",)`` for Open MPI; nothing for MPICH's hydra,
        which oversubscribes by default.
    """
    try:
        version = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return ("--oversubscribe",) if "Open MPI" in version or "OpenRTE" in version else ()


def child_command(mpiexec: str, nprocs: int, pytest_args: Sequence[str]) -> list[str]:
    """The ``mpiexec`` command line of a child run.

    Parameters
    ----------
    mpiexec : str
    nprocs : int
    pytest_args : sequence of str
        Arguments after ``python -m pytest``.

    Returns
    -------
    list of str
    """
    return [
        mpiexec, *oversubscribe_flags(mpiexec), "-n", str(nprocs),
        sys.executable, "-m", "pytest", *pytest_args,
    ]


def child_pytest_args(config: pytest.Config, targets: Sequence[str], timeout: float) -> list[str]:
    """The pytest arguments of a child run.

    Parameters
    ----------
    config : pytest.Config
        The parent's; rootdir, inifile and import mode are passed on.
    targets : sequence of str
        The test files, relative to the rootdir.
    timeout : float
        pytest-timeout's default (each item gets its marker's timeout in the child).

    Returns
    -------
    list of str
    """
    args = [*targets, "-q", "-p", "no:cacheprovider", "-x", "-p", PLUGIN, "--runxfail"]
    args += ["--rootdir", str(config.rootpath), f"--import-mode={config.option.importmode}"]
    if config.inipath is not None:
        args += ["-c", str(config.inipath)]
    if config.pluginmanager.has_plugin("timeout"):
        args += [f"--timeout={timeout:g}", "--timeout-method=thread"]
    return args


def child_environment(nprocs: int, results_dir: Path) -> dict[str, str]:
    """The environment of a child run.

    Parameters
    ----------
    nprocs : int
    results_dir : Path
        Where each rank records its outcomes, and where :data:`~.launch.NODEIDS_FILE` lists
        the exact node ids the child must run, in this order.

    Returns
    -------
    dict
        The parent's environment without MPI launcher variables, plus the
        ``MESHCHAIN_MPI_*`` variables and this module's directory on ``PYTHONPATH``.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES)}
    pythonpath = [str(_import_root()), *filter(None, [env.get("PYTHONPATH")])]
    env.update(
        {
            ENV_CHILD: "1",
            ENV_NPROCS: str(nprocs),
            ENV_NODEIDS: str(results_dir / NODEIDS_FILE),
            ENV_RESULTS: str(results_dir),
            ENV_ABORT_REPORTS: str(results_dir),
            "PYTHONPATH": os.pathsep.join(pythonpath),
            "PYTHONUNBUFFERED": "1",
            "PYTHONFAULTHANDLER": "1",  # a rank that crashes leaves its Python stack
        }
    )
    redirect_bytecode(env)
    return env


def redirect_bytecode(env: dict[str, str]) -> None:
    """Let the child cache bytecode in a private directory despite ``PYTHONDONTWRITEBYTECODE``.

    With ``PYTHONDONTWRITEBYTECODE`` set, every rank of every child re-compiles
    and re-rewrites (pytest's assertion rewriting, which also covers
    hypothesis) everything it imports: seconds of CPU per rank.  The variable's
    purpose, keeping ``__pycache__`` out of source trees, is kept by writing
    the bytecode under ``PYTHONPYCACHEPREFIX`` instead.  Nothing changes when
    ``PYTHONPYCACHEPREFIX`` is already set or no private directory can be had.

    Parameters
    ----------
    env : dict
        Modified in place.
    """
    if not env.get("PYTHONDONTWRITEBYTECODE") or env.get("PYTHONPYCACHEPREFIX"):
        return
    cache = private_pycache_dir()
    if cache is not None:
        del env["PYTHONDONTWRITEBYTECODE"]
        env["PYTHONPYCACHEPREFIX"] = str(cache)


def private_pycache_dir() -> Path | None:
    """A bytecode cache directory only this user can write, or None.

    Returns
    -------
    Path or None
        ``<tempdir>/meshchain-pycache-<uid>``, created with mode 0700; None if
        it exists but is not a directory owned by this user and private to it.
    """
    getuid = getattr(os, "getuid", None)
    if getuid is None:
        return None
    path = Path(tempfile.gettempdir()) / f"meshchain-pycache-{getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = path.lstat()
    except OSError:
        return None
    private = stat.S_ISDIR(info.st_mode) and info.st_uid == getuid() and not info.st_mode & 0o077
    return path if private else None


def _import_root() -> Path:
    """The ``sys.path`` entry from which this module imports as ``__name__``."""
    root = Path(__file__).resolve().parent
    for _ in range(__name__.count(".")):
        root = root.parent
    return root


def with_rank_reports(result: ChildResult, results_dir: Path) -> ChildResult:
    """``result`` with the failure reports the ranks wrote to files appended to its output
    when ``mpiexec`` did not forward them (it drops output in flight when a job aborts).

    Parameters
    ----------
    result : ChildResult
    results_dir : Path
        Where failing ranks write ``rank<r>.failure.txt``.

    Returns
    -------
    ChildResult
    """
    missing = []
    for path in sorted(results_dir.glob("rank*.failure.txt")):
        report = path.read_text(errors="replace")
        if report.strip() and report.strip() not in result.output:
            missing.append(f"\n---- {path.stem.removesuffix('.failure')}'s report, from its file "
                           f"(mpiexec did not forward it) ----{report}")
    if not missing:
        return result
    return dataclasses.replace(result, output=result.output + "".join(missing))


def judge(item: MpiLauncherItem, result: ChildResult, command: Sequence[str]) -> None:
    """Turn what the child run did with ``item`` into the parent item's outcome.

    Parameters
    ----------
    item : MpiLauncherItem
    result : ChildResult
    command : sequence of str
        The run's command line, shown on failure.

    Raises
    ------
    pytest.fail.Exception
        Timeout, the run ending before every rank finished the item (or, after its last
        item, exiting non-zero), or the item not collected.
    pytest.skip.Exception
        The item was skipped on every rank.
    """
    done = result.records
    if result.timed_out:
        after = ", after every rank had finished it (the run's last)," if len(done) == item.nprocs else ""
        _fail(item, result, command,
              f"killed{after} after the wall-clock limit of {wall_clock_limit(item.spec):g} s "
              f"(mpi timeout={item.spec.timeout:g} s)")
    if len(done) == item.nprocs:
        if result.last and result.returncode != 0:
            _fail(item, result, command, f"finished on every rank, but then the child run (this was its last "
                                         f"item) {_exit_reason(result, item.spec)}")
        if all(r["outcome"] == "skipped" for r in done):
            pytest.skip(f"on all {item.nprocs} ranks: {done[0]['reason']}")
        return
    if result.missing:
        _fail(item, result, command, "was not collected by the child (node id mismatch?)")
    if result.returncode not in (0, None):
        _fail(item, result, command, _exit_reason(result, item.spec))
    _fail(item, result, command,
          f"ended: the child exited 0 but {len(done)} of {item.nprocs} ranks ran {item.nodeid!r}")


def _exit_reason(result: ChildResult, spec: MpiSpec) -> str:
    """Explain a non-zero exit status of ``mpiexec``."""
    if result.returncode == pytest.ExitCode.NO_TESTS_COLLECTED:
        return "exited with code 5: the child collected no test (node id mismatch?)"
    if "+ Timeout +" in result.output:
        return f"exceeded the mpi timeout of {spec.timeout:g} s (code {result.returncode})"
    if not result.output.strip():
        return (f"exited with code {result.returncode}; no rank printed anything or left a report "
                "(an MPI_Abort or a crash whose output mpiexec dropped)")
    return f"exited with code {result.returncode}"


def _fail(item: MpiLauncherItem, result: ChildResult, command: Sequence[str], why: str) -> None:
    """Fail the parent item with the child's command and the tail of its output."""
    output = result.output
    if len(output) > TAIL_CHARS:
        output = "[...]\n" + output[-TAIL_CHARS:]
    pytest.fail(
        f"MPI test {item.nodeid} on {item.nprocs} process(es) {why} "
        f"after {result.elapsed:.1f} s\ncommand: {shlex.join(command)}\n"
        f"---- child output (tail) ----\n{output}",
        pytrace=False,
    )


# --------------------------------------------------------------------------
# Child: run the item on every rank, abort the world on failure
# --------------------------------------------------------------------------


def _world():
    """``MPI.COMM_WORLD`` (imports mpi4py, initializing MPI)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _check_world_size(nprocs: int) -> None:
    """Fail unless this child runs on exactly ``nprocs`` processes."""
    size = _world().size
    requested = os.environ.get(ENV_NPROCS)
    if size != nprocs or requested != str(nprocs):
        pytest.fail(f"item is for {nprocs} processes, but COMM_WORLD.size={size} "
                    f"and {ENV_NPROCS}={requested}", pytrace=False)


def load_hypothesis_profile() -> None:
    """Make every rank draw the same hypothesis examples (see the module docstring)."""
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:
        return
    base = settings.default
    settings.register_profile(
        HYPOTHESIS_PROFILE,
        parent=base,
        derandomize=True,
        database=None,
        deadline=None,
        report_multiple_bugs=False,  # else generation goes on for 10 s of each rank's clock after a failure
        suppress_health_check=[*base.suppress_health_check, HealthCheck.too_slow],
    )
    settings.load_profile(HYPOTHESIS_PROFILE)
    ignore_module_constants()


def ignore_module_constants() -> bool:
    """Keep hypothesis from drawing constants found in this process's modules (see the
    module docstring); whether there was such a pool to empty (hypothesis 6.131 and later).

    Hypothesis draws about one value in 20 from the literals of the "local" modules in
    ``sys.modules`` (the project's, the tests', meshchain's generated loops), collected when
    ``sys.modules`` grows and within a time limit. Ranks that imported different modules, or
    reached a draw at a different moment of their imports, would draw different examples.
    """
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:
        return False
    if not callable(getattr(providers, "_get_local_constants", None)) or not hasattr(providers, "Constants"):
        return False
    empty = providers.Constants()
    providers._get_local_constants = lambda: empty
    cache = getattr(getattr(providers, "CONSTANTS_CACHE", None), "cache", None)
    if cache is not None:
        cache.clear()  # pools of permitted constants worked out before
    return True


class _ChildSession:
    """Hooks of one rank of a child run."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        listed = os.environ.get(ENV_NODEIDS)
        self.nodeids = None if listed is None else Path(listed).read_text().splitlines()
        self.results_dir = os.environ.get(ENV_RESULTS)
        self.skip_reason: str | None = None

    def pytest_sessionstart(self) -> None:
        """Initialize MPI and load the hypothesis profile before test modules are imported."""
        os.environ.setdefault(ENV_NPROCS, str(_world().size))  # for a child started by hand
        load_hypothesis_profile()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Keep only the items whose node ids the parent asked for, in its order, each with its
        marker's timeout; tell the parent which of them were not collected.

        Without ``MESHCHAIN_MPI_NODEIDS`` (a child started by hand), keep the
        ``mpi`` items for the size of ``COMM_WORLD``.
        """
        if self.nodeids is not None:
            collected = {item.nodeid: item for item in items}
            kept = [collected[nodeid] for nodeid in self.nodeids if nodeid in collected]
            self._tell_missing([nodeid for nodeid in self.nodeids if nodeid not in collected])
        else:
            kept = [item for item in items if _mpi_nprocs_of(item) == _world().size]
        if self.config.pluginmanager.has_plugin("timeout"):
            for item in kept:
                if item.get_closest_marker("timeout") is None:
                    item.add_marker(pytest.mark.timeout(MpiSpec.from_marker(marker_of(item)).timeout))
        chosen = set(map(id, kept))
        dropped = [item for item in items if id(item) not in chosen]
        if dropped:
            self.config.hook.pytest_deselected(items=dropped)
        items[:] = kept

    def _tell_missing(self, nodeids: list[str]) -> None:
        """Rank 0 writes the node ids it was given but did not collect (see :mod:`.launch`)."""
        if self.results_dir is not None and _world().rank == 0:
            path = Path(self.results_dir) / MISSING_FILE
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps(nodeids))
            os.replace(temporary, path)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """Abort the world when collection fails on this rank."""
        if report.failed:
            self._report_and_abort(f"collecting {report.nodeid or 'tests'}", report)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Abort the world on a failure; remember a skip."""
        if report.failed:
            self._report_and_abort(f"{report.nodeid} ({report.when})", report)
        if report.skipped and self.skip_reason is None:
            self.skip_reason = _skip_reason(report)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        """Record for the parent that this rank ran ``nodeid`` to the end."""
        if self.results_dir is None:
            return
        world = _world()
        record = {
            "nodeid": nodeid,
            "rank": world.rank,
            "size": world.size,
            "outcome": "passed" if self.skip_reason is None else "skipped",
            "reason": self.skip_reason,
        }
        self.skip_reason = None
        with open(Path(self.results_dir) / f"rank{world.rank}.jsonl", "a") as records:
            records.write(json.dumps(record) + "\n")  # one write: the parent reads whole lines
        # no rank starts the next item before every rank has recorded this one (a failure
        # there then never leaves this item unfinished on some rank, and blamed for it), and
        # every rank has finished the same item
        finished = world.allgather(nodeid)
        if len(set(finished)) != 1:
            self._abort([f"\n==== meshchain MPI: rank {world.rank}/{world.size}: the ranks finished different "
                         f"items: {finished} ====\n"])

    def _report_and_abort(
        self, what: str, report: pytest.TestReport | pytest.CollectReport
    ) -> None:
        """Write the failure to stderr and abort ``COMM_WORLD``."""
        world = _world()
        text = [f"\n==== meshchain MPI: rank {world.rank}/{world.size} failed: {what} ====\n",
                report.longreprtext, "\n"]
        for title, content in report.sections:
            text += [f"---- {title} ----\n", content, "\n"]
        self._abort(text)

    def _abort(self, text: list[str]) -> None:
        """Write ``text`` to stderr and to this rank's report file, then abort ``COMM_WORLD``."""
        world = _world()
        # MPICH's own "application called MPI_Abort" line is printed as the rank dies and
        # mpiexec sometimes drops it; say it here, where the grace period below covers it.
        text = [*text, f"==== meshchain MPI: rank {world.rank} calls MPI_Abort(COMM_WORLD, 1) ====\n"]
        if self.results_dir is not None:  # in case mpiexec drops the output below
            with contextlib.suppress(OSError):
                (Path(self.results_dir) / f"rank{world.rank}.failure.txt").write_text("".join(text))
        try:
            capman = self.config.pluginmanager.getplugin("capturemanager")
            guard = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
            with guard:
                sys.stderr.write("".join(text))
                sys.stderr.flush()
            # mpiexec forwards the ranks' output asynchronously and drops what is still in flight
            # when the job is aborted: give it a moment, so the report reaches the parent.
            time.sleep(ABORT_GRACE_SECONDS)
        finally:
            world.Abort(1)
            os._exit(1)  # MPICH's MPI_Abort may return before the job is torn down: never go on


def _skip_reason(report: pytest.TestReport) -> str:
    """The reason of a skip report."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")
