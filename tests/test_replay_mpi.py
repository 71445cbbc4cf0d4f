"""A captured step replayed by one compiled call on several ranks (``engine/replay.py``): the
same bits, the same statistics and the same messages as the step replayed step by step in
Python, and as the step not captured at all (run by the MPI harness)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.backends import numba_backend
from meshchain.comm import by_address
from meshchain.engine import replay
from meshchain.meshes import structured_tris

from chain_programs import Program, programs

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ZERO = "def zero(r):\n    r[0] = 0.0\n"
FLUX = ("def flux(ua, ub, ra, rb):\n"
        "    f = 0.25 * (ub[0] - ua[0])\n"
        "    ra[0] += f\n"
        "    rb[0] -= f\n")
UPDATE = "def update(r, u):\n    u[0] = u[0] + r[0] + 0.001 * u[0] * u[0]\n"
TOTAL = "def total(u, s):\n    s[0] += u[0] * u[0]\n"
LARGEST = "def largest(u, m):\n    m[0] = max(m[0], u[0])\n"
SCALE = "def scale(m, u):\n    u[0] = u[0] - 0.01 * m[0]\n"
HOWS = ("uncaptured", "python", "compiled")


def diffusion_steps(comm, ca, *, pairs: int = 1, rereads: bool = False):
    """A new session with ``pairs`` argument sets of a diffusion step (zero, flux over facets,
    update, a sum and a maximum into globals made inside the step; with ``rereads`` a hundredth of
    that maximum then taken from the field, which is summed into the same global again); returns ``run(how,
    steps)``, which runs ``steps`` steps ``how`` (not captured, or captured: replayed in
    Python, or compiled from the first replay, as :data:`replay.COMPILE_AFTER` says), the
    argument sets used in turn (each replay then binds the shared plan to other objects),
    and returns the globals' values after each step, and the fields."""
    mc.reset_runtime(comm=comm, transport="persistent")
    d = structured_tris(9, 7).declare()
    n = d.nodes.size
    fields = [(mc.Dat(d.nodes, 1, np.sin(np.arange(n, dtype=np.float64) + k), f"u{k}"),
               mc.Dat(d.nodes, 1, None, f"r{k}")) for k in range(pairs)]
    mc.partition("kway", seed_set=d.cells)
    zero, flux, update, total, largest, scale = (mc.Kernel.from_source(s)
                                                 for s in (ZERO, FLUX, UPDATE, TOTAL, LARGEST, SCALE))

    def step(u, r):
        mc.par_loop(zero, d.nodes, r(mc.WRITE))
        mc.par_loop(flux, d.facets, u(mc.READ, d.facet2node[0]), u(mc.READ, d.facet2node[1]),
                    r(mc.INC, d.facet2node[0]), r(mc.INC, d.facet2node[1]))
        mc.par_loop(update, d.nodes, r(mc.READ), u(mc.RW))
        s, m = mc.Global(1, 0.0, "s"), mc.Global(1, -1.0e300, "m")
        mc.par_loop(total, d.nodes, u(mc.READ), s(mc.INC))
        mc.par_loop(largest, d.nodes, u(mc.READ), m(mc.MAX))
        if rereads:  # the maximum read by a later loop of the step, the sum reduced a second time
            mc.par_loop(scale, d.nodes, m(mc.READ), u(mc.RW))
            mc.par_loop(total, d.nodes, u(mc.READ), s(mc.INC))
        return s, m

    captured = mc.capture(step, name="diffusion", ca=ca)

    def run(how: str, steps: int):
        values = []
        for k in range(steps):
            u, r = fields[k % pairs]
            if how == "uncaptured":
                with mc.loop_chain("diffusion", ca=ca):
                    s, m = step(u, r)
            else:
                s, m = captured(u, r)
            values.append((float(s.value[0]), float(m.value[0])))
        return values

    run.captured = captured  # for step.repeat
    return run, fields


def diffusion(comm, ca, how, *, pairs: int = 1, steps: int = 6, rereads: bool = False):
    """:func:`diffusion_steps` run ``how``: the dats gathered, the globals' values after each
    step, the statistics (:func:`counts`, and the compute (a chain's: core) and flight
    seconds by loop and chain name) and the plans."""
    run, fields = diffusion_steps(comm, ca, pairs=pairs, rereads=rereads)
    values = run(how, steps)
    gathered = [dat.gather() for pair in fields for dat in pair]
    stats = mc.stats()
    times = {**{name: (r.time_compute, r.time_flight) for name, r in stats.loops.items()},
             **{name: (r.time_core, r.time_flight) for name, r in stats.chains.items()}}
    return gathered, values, (counts(stats), times), list(mc.get_runtime().pipeline.plans.values())


def counts(stats) -> dict:
    """What the runs added up, but for times."""
    loops = {name: (r.calls, r.iterations, r.exchanges, r.messages, r.bytes_sent) for name, r in stats.loops.items()}
    chains = {name: (r.executions, r.exchanges, r.messages, r.bytes_sent) for name, r in stats.chains.items()}
    return {"loops": loops, "chains": chains}


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
@pytest.mark.parametrize("ca", [False, True])
@pytest.mark.parametrize("pairs", [1, 2])
def test_compiled_replays_equal_python_replays_and_the_uncaptured_steps(comm, monkeypatch, ca, pairs):
    """The same bits (dats and the globals after every step) three ways, one and two argument
    sets in turn; the compiled replay ran; its statistics count what the Python replays count
    and its times are there (taken inside the compiled call)."""
    found = {}
    for how in HOWS:
        monkeypatch.setattr(replay, "COMPILE_AFTER", 0 if how == "compiled" else 10**9)
        found[how] = diffusion(comm, ca, how, pairs=pairs)
    gathered, values, _, _ = found["uncaptured"]
    for how in ("python", "compiled"):
        assert found[how][1] == values, how
        for want, got in zip(gathered, found[how][0]):
            np.testing.assert_array_equal(got, want)
    plans = found["compiled"][3]
    assert any(plan.compiled for plan in plans), "no plan replayed compiled"
    assert not any(plan.compiled for plan in found["python"][3])
    (python_counts, python_times), (compiled_counts, compiled_times) = found["python"][2], found["compiled"][2]
    assert compiled_counts == python_counts
    for name in compiled_counts["loops"]:
        assert compiled_times[name][0] > 0, name
    flown = {name for name, (_, flight) in python_times.items() if flight > 0}
    assert flown and flown == {name for name, (_, flight) in compiled_times.items() if flight > 0}


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
@pytest.mark.parametrize("ca", [False, True])
def test_a_step_that_reads_or_reduces_again_a_global_it_reduced_replays_compiled(comm, monkeypatch, ca):
    """A step that shifts its field by a maximum it reduced and sums into a global twice:
    its plan replays compiled (its reductions over ranks reset, started and waited for inside
    the compiled calls where the Python path does so), with the bits of the uncaptured steps
    and of the Python replays: as one compiled piece, as a piece per prepared call (exchanges
    and reductions begun in one piece and finished in another), and when rank 0 replays
    compiled and the other ranks in Python (both start the same collectives in the same
    order); with one and two argument sets in turn."""
    hows = (("uncaptured", 10**9, replay.PIECE), ("python", 10**9, replay.PIECE), ("compiled", 0, replay.PIECE),
            ("pieces", 0, 1), ("mixed", 0 if comm.rank == 0 else 10**9, replay.PIECE))
    for pairs in (1, 2):
        found, compiled = {}, {}
        for how, compile_after, piece in hows:
            monkeypatch.setattr(replay, "COMPILE_AFTER", compile_after)
            monkeypatch.setattr(replay, "PIECE", piece)
            found[how] = diffusion(comm, ca, how if how in HOWS else "compiled", pairs=pairs, rereads=True)
            # (the next session closes the plans): how many compiled pieces each plan ran as
            compiled[how] = sorted(len(plan.compiled.pieces) for plan in found[how][3] if plan.compiled)
        gathered, values, _, _ = found["uncaptured"]
        assert len(set(values)) == len(values), "every step's globals differ: the test would see a stale value"
        for how in ("python", "compiled", "pieces", "mixed"):
            assert found[how][1] == values, how
            for want, got in zip(gathered, found[how][0]):
                np.testing.assert_array_equal(got, want)
        assert compiled["uncaptured"] == compiled["python"] == [] and compiled["compiled"], compiled
        assert compiled["mixed"] == (compiled["compiled"] if comm.rank == 0 else []), compiled
        assert min(compiled["pieces"]) > max(compiled["compiled"]), compiled
        assert found["compiled"][2][0] == found["python"][2][0] == found["pieces"][2][0]


#: Loops put around a random program: globals reduced first and read (or reduced again) later.
@pytest.mark.mpi(nprocs=(2,), timeout=300)
@pytest.mark.parametrize("counter", [True, False])
def test_a_compiled_replay_after_a_write_to_the_field_it_reads_exchanges_again_and_times_in_seconds(comm, monkeypatch,
                                                                                                 counter):
    """A step reads a field through a map and does not write it: from its second replay on, the
    field's halo is valid and its plan sends nothing for it. Writing the field's owned values
    between replays makes the halo stale: the next replay may not run that compiled plan again
    (its quick way checks the halo depths), and the sums stay those of the uncaptured steps with
    the same writes, bit for bit. The times the compiled call took (by the time-stamp counter
    where it is trusted, else by ``clock_gettime``: ``counter``) are seconds: the chain's total lies
    within the wall-clock time around the replays."""
    monkeypatch.setattr(replay, "COMPILE_AFTER", 0)
    if not counter:
        monkeypatch.setattr(replay, "cycle_seconds", lambda: None)  # where the replay reads it
    found = {}
    for how in ("uncaptured", "compiled"):
        mc.reset_runtime(comm=comm, transport="persistent")
        d = structured_tris(9, 7).declare()
        u = mc.Dat(d.nodes, 1, np.sin(np.arange(d.nodes.size, dtype=np.float64)), "u")
        r = mc.Dat(d.nodes, 1, None, "r")
        mc.partition("kway", seed_set=d.cells)
        zero, flux, total = (mc.Kernel.from_source(source) for source in (ZERO, FLUX, TOTAL))

        def step():
            mc.par_loop(zero, d.nodes, r(mc.WRITE))
            mc.par_loop(flux, d.facets, u(mc.READ, d.facet2node[0]), u(mc.READ, d.facet2node[1]),
                        r(mc.INC, d.facet2node[0]), r(mc.INC, d.facet2node[1]))
            s = mc.Global(1, 0.0, "s")
            mc.par_loop(total, d.nodes, r(mc.READ), s(mc.INC))
            return s

        captured = mc.capture(step, name="fluxes", ca=False)
        values = []
        began = time.perf_counter()
        for k in range(9):
            if how == "uncaptured":
                with mc.loop_chain("fluxes", ca=False):
                    s = step()
            else:
                s = captured()
            values.append(float(s.value[0]))
            if k % 3 == 2:
                u.data[:] = u.data * 0.5 + 1.0  # a host write, on every rank: halo copies now stale
        elapsed = time.perf_counter() - began
        found[how] = values, r.gather(), mc.stats().chains["fluxes"].time_total, elapsed
    (want, want_r, _, _), (got, got_r, total, elapsed) = found["uncaptured"], found["compiled"]
    assert got == want
    np.testing.assert_array_equal(got_r, want_r)
    compiled = [plan.compiled for plan in mc.get_runtime().pipeline.plans.values() if plan.compiled]
    assert compiled
    ticks = counter and by_address.cycle_seconds() is not None
    assert all(replayed._fixed[1].dtype == (np.int64 if ticks else np.float64) for replayed in compiled)  # the stamps
    assert 0.0 < total < elapsed


REDUCED_FIRST = (("nodes", (("na", mc.READ, None, None), ("g", mc.INC, None, None))),
                 ("cells", (("ca", mc.READ, None, None), ("hi", mc.MAX, None, None))))
READ_LATER = (("cells", (("cb", mc.RW, None, None), ("g", mc.READ, None, None))),
              ("nodes", (("nb", mc.RW, None, None), ("hi", mc.READ, None, None), ("g", mc.INC, None, None))))


@pytest.mark.mpi(nprocs=(2, 3), timeout=600)
@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec=programs(max_loops=3), mode=st.sampled_from([None, True, False]), piece=st.sampled_from([1, 12]))
def test_random_steps_that_read_globals_they_reduced_replay_compiled_with_the_bits(comm, spec, mode, piece):
    """Random programs between loops that reduce globals and loops that read them (or reduce
    them again), captured as a step: replayed compiled (in pieces of ``piece`` calls), the
    results of the Python replays and of the uncaptured executions, bit for bit."""
    mesh, loops = spec
    spec = (mesh, REDUCED_FIRST + loops + READ_LATER)
    results, compiled = [], []
    for how in ("uncaptured", "python", "compiled"):
        mc.reset_runtime(comm=comm)
        program = Program(spec)
        saved = replay.COMPILE_AFTER, replay.PIECE
        replay.COMPILE_AFTER, replay.PIECE = (0 if how == "compiled" else 10**9), piece
        try:
            program.run(mode, executions=5, captured=how != "uncaptured")
        finally:
            replay.COMPILE_AFTER, replay.PIECE = saved
        results.append(program.results())
        compiled.append(any(plan.compiled for plan in mc.get_runtime().pipeline.plans.values()))
    assert compiled == [False, False, True], compiled
    for other in results[1:]:
        for want, got in zip(results[0], other):
            if got is not None:
                np.testing.assert_array_equal(got, want)


@pytest.mark.mpi(nprocs=(2,), timeout=300)
def test_phases_and_replays_call_their_loops_by_address_and_give_the_bits(comm, monkeypatch):
    """Every generated phase and compiled replay calls the compiled loops (and phases) by the
    address it is given (``call_native``), never by name (which would compile the callee into
    it again): not captured, replayed in Python and replayed compiled, the same dats and
    globals, bit for bit."""
    want = {how: diffusion(comm, True, how)[:2] for how in HOWS}
    generated = []
    for name in ("phase_source", "replay_source"):
        source = getattr(numba_backend, name)
        monkeypatch.setattr(numba_backend, name,
                            lambda *a, _source=source, **k: generated.append(_source(*a, **k)) or generated[-1])
    for how in HOWS:
        monkeypatch.setattr(replay, "COMPILE_AFTER", 0 if how == "compiled" else 10**9)
        gathered, values = diffusion(comm, True, how)[:2]
        assert values == want[how][1], how
        for got, expected in zip(gathered, want[how][0]):
            np.testing.assert_array_equal(got, expected)
    phases = [text for text in generated if "def _mc_phase(" in text]
    replays = [text for text in generated if "def _mc_replay(" in text]
    assert phases and replays, "no phase or no replay was generated"
    for text in phases + replays:
        assert "sys.modules" not in text and "_mc_call(_mc_" in text, text


@pytest.mark.mpi(nprocs=(2,), timeout=300)
def test_a_profiled_replay_runs_step_by_step_and_still_gives_the_same_bits(comm, monkeypatch):
    """While ``mc.profile()`` records, a compiled plan's replays go through Python (which
    reports each step); the values are those of the uncaptured steps."""
    monkeypatch.setattr(replay, "COMPILE_AFTER", 0)
    want = diffusion(comm, True, "uncaptured", steps=6)[1]
    run, _ = diffusion_steps(comm, True)
    got = run("compiled", 3)
    assert any(plan.compiled for plan in mc.get_runtime().pipeline.plans.values())
    with mc.profile() as profile:
        got += run("compiled", 3)
    assert got == want
    names = {event["name"] for event in profile.events}
    assert any("wait" in name for name in names), sorted(names)


@pytest.mark.mpi(nprocs=(2,), timeout=300)
def test_a_ca_auto_step_is_never_replayed_compiled_and_its_model_decides(comm, monkeypatch):
    """A ``ca="auto"`` step keeps replaying step by step: its learner times every run and its
    decisions are collective (a rank replaying compiled would skip them while the others wait).
    The model decides, and the values are those of the uncaptured steps: the dats bit for bit,
    the maxima exactly, the sums to rounding (CA and loop by loop add the owned rows in other
    orders, and which one a run of ``"auto"`` takes depends on its timings)."""
    monkeypatch.setattr(replay, "COMPILE_AFTER", 0)
    gathered, want = diffusion(comm, "auto", "uncaptured", steps=40)[:2]
    run, fields = diffusion_steps(comm, "auto")
    got = run("compiled", 40)
    assert [m for _, m in got] == [m for _, m in want]
    np.testing.assert_allclose([s for s, _ in got], [s for s, _ in want], rtol=1e-12, atol=0)
    for dat, expected in zip((dat for pair in fields for dat in pair), gathered):
        np.testing.assert_array_equal(dat.gather(), expected)
    assert not any(plan.compiled for plan in mc.get_runtime().pipeline.plans.values())
    decision = mc.stats().chains["diffusion"].decision
    assert decision and "measuring" not in decision, decision


@pytest.mark.mpi(nprocs=(2, 3), timeout=300)
@pytest.mark.parametrize("ca", [False, True])
def test_repeat_on_ranks_equals_the_calls_and_refuses_times_that_differ_on_every_rank(comm, monkeypatch, ca):
    """``step.repeat(n)`` on several ranks replays one by one (compiled from the first replay
    here): the bits, the last globals and the statistics of ``n`` calls. A bad ``times`` on one
    rank, or ``times`` that differ between ranks, raise on every rank before anything runs."""
    monkeypatch.setattr(replay, "COMPILE_AFTER", 0)
    found = {}
    for how in ("calls", "repeat"):
        run, fields = diffusion_steps(comm, ca)
        if how == "calls":
            last = run("compiled", 6)[-1]
        else:
            s, m = run.captured.repeat(6, *fields[0])
            last = (float(s.value[0]), float(m.value[0]))
            before = [dat.gather() for pair in fields for dat in pair]
            for bad in (2 + comm.rank, 0 if comm.rank == comm.size - 1 else 3):
                with pytest.raises(mc.CaptureError, match="repeat's times"):
                    run.captured.repeat(bad, *fields[0])
            for want, got in zip(before, [dat.gather() for pair in fields for dat in pair]):
                np.testing.assert_array_equal(got, want)  # nothing ran
        found[how] = ([dat.gather() for pair in fields for dat in pair], last, counts(mc.stats()))
    assert found["repeat"][1:] == found["calls"][1:]
    for want, got in zip(found["calls"][0], found["repeat"][0]):
        np.testing.assert_array_equal(got, want)
