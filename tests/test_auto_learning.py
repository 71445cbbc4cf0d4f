"""``ca="auto"`` keeps learning: the :class:`~meshchain.engine.auto.Learner` re-checks the
model's decision from timed executions (probes of the other variant, one agreed check),
switches only beyond the margin, backs off while the decision holds, and takes every step
at the same execution on every rank; a plan's first run is never timed."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import meshchain as mc
from meshchain.engine import auto
from meshchain.engine.auto import FIRST_CHECK, LONGEST_INTERVAL, PROBES, Learner
from meshchain.model.policy import SWITCH_MARGIN, choose_ca, probing, recheck

pytestmark = pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")

MODEL_CA = choose_ca(per_loop_time=2e-3, ca_time=1e-3, basis="test model")  # predicts CA
MODEL_PER_LOOP = choose_ca(per_loop_time=1e-3, ca_time=2e-3, basis="test model")  # predicts loop by loop


def alone(values):
    """One rank's agreement: nothing to agree with."""
    return values


def drive(learner, executions: int, seconds, agree=alone) -> list[bool]:
    """Run ``executions`` executions: ask the learner the way, time it with ``seconds(ca, n)``."""
    ways = []
    for _ in range(executions):
        ca = learner.next(agree)
        ways.append(ca)
        learner.record(ca, seconds(ca, learner.executions))
    return ways


def constant(ca_time: float, per_loop_time: float):
    return lambda ca, n: ca_time if ca else per_loop_time


# --- the policy's comparison and its texts ------------------------------------------------------------

@pytest.mark.parametrize("faster_by, switches", [(0.0, False), (SWITCH_MARGIN - 1, False),
                                                  (SWITCH_MARGIN + 1, True), (50.0, True)])
def test_recheck_switches_only_beyond_the_margin(faster_by, switches):
    current = 1e-3
    other = current * (1 - faster_by / 100)
    decision = recheck(MODEL_CA, basis=MODEL_CA.why, use_ca=True, at=20, ca_time=current, per_loop_time=other,
                       per_loop_runs=3, ca_runs=8)
    assert decision.use_ca is (not switches)
    assert decision.per_loop_time == other and decision.ca_time == current  # measured, not predicted
    word = "switched" if switches else "confirmed"
    assert f"{word}" in decision.why and "at execution 20" in decision.why


def test_recheck_texts_say_when_and_why():
    switched = recheck(MODEL_PER_LOOP, basis=MODEL_PER_LOOP.why, use_ca=False, at=48, ca_time=0.301e-3,
                       per_loop_time=0.405e-3, per_loop_runs=8, ca_runs=3)
    assert switched.use_ca
    assert switched.why == ("ca: switched at execution 48: measured 0.301 ms per execution communication-avoiding "
                            "against 0.405 ms loop by loop (median of 3 and 8 runs, slowest rank); the model had "
                            "predicted loop by loop (2.000 ms against 1.000 ms loop by loop)")
    confirmed = recheck(MODEL_CA, basis=MODEL_CA.why, use_ca=True, at=32, ca_time=1e-3, per_loop_time=2e-3,
                        per_loop_runs=3, ca_runs=8)
    assert confirmed.why.startswith(MODEL_CA.why + "; confirmed by measurement at execution 32: measured 1.000 ms")
    assert confirmed.gain == pytest.approx(50.0)
    untimed = recheck(MODEL_CA, basis=MODEL_CA.why, use_ca=True, at=32, ca_time=1e-3, per_loop_time=0.0,
                      per_loop_runs=0, ca_runs=8)
    assert untimed.use_ca and "not checked at execution 32: loop by loop was not timed" in untimed.why
    assert probing("ca: x", use_ca=True, at=17, executions=4) == \
        "ca: x; probing loop by loop at executions 17-20 to check the choice by measurement"


# --- the learner, one rank, injected timings --------------------------------------------------------

def test_learner_probes_then_switches_when_the_other_variant_is_faster():
    learner = Learner(MODEL_CA)
    ways = drive(learner, 45, constant(ca_time=2e-3, per_loop_time=1e-3))
    first_probe = FIRST_CHECK + 1
    probes = PROBES + 1  # loop by loop has not run yet: its first run is not timed
    assert ways[:FIRST_CHECK] == [True] * FIRST_CHECK
    assert ways[FIRST_CHECK:FIRST_CHECK + probes] == [False] * probes
    check = first_probe + probes
    assert learner.switches == [check]
    # the check's own execution runs the new choice; CA is probed again FIRST_CHECK executions later
    assert ways[check - 1:check - 1 + FIRST_CHECK] == [False] * FIRST_CHECK
    assert ways[check - 1 + FIRST_CHECK:check - 1 + FIRST_CHECK + PROBES] == [True] * PROBES
    assert learner.use_ca is False and learner.probes == probes + PROBES
    assert learner.why.startswith(f"per-loop: switched at execution {check}: measured 2.000 ms per execution "
                                  f"communication-avoiding against 1.000 ms loop by loop")
    assert "the model had predicted communication-avoiding" in learner.why


def test_learner_keeps_a_choice_within_the_margin_and_doubles_the_interval():
    learner = Learner(MODEL_CA)
    slightly = 1 - (SWITCH_MARGIN - 1) / 100  # loop by loop faster, but within the margin
    checks, probe_starts, last = [], [], True
    total = 6000
    for _ in range(total):
        ca = learner.next(alone)
        if learner.checks > len(checks):
            checks.append(learner.executions)
        if not ca and last:
            probe_starts.append(learner.executions)
        last = ca
        learner.record(ca, 1e-3 if ca else 1e-3 * slightly)
    assert learner.switches == [] and learner.use_ca
    # from one probe to the next: the probes, then the interval, doubled after every check
    assert [b - a for a, b in zip(probe_starts, probe_starts[1:])] == [
        (PROBES + 1 if i == 0 else PROBES) + min(FIRST_CHECK * 2 ** (i + 1), LONGEST_INTERVAL)
        for i in range(len(probe_starts) - 1)]
    # each check right after its probes (one agreement each), the same number as probe phases
    assert checks == [start + (PROBES + 1 if i == 0 else PROBES) for i, start in enumerate(probe_starts)]
    assert learner.interval == LONGEST_INTERVAL
    assert learner.probes == PROBES * len(probe_starts) + 1
    assert learner.probes / total < 0.01  # a stable decision costs a few probes per thousand executions
    assert "confirmed by measurement at execution" in learner.why
    assert learner.why.count("confirmed") == 1  # the latest confirmation only


def test_learner_explains_probes_while_they_run():
    learner = Learner(MODEL_PER_LOOP, interval=4)
    drive(learner, 4, constant(1e-3, 1e-3))
    assert learner.next(alone) is True  # execution 5: the first probe of CA
    assert learner.why == probing(MODEL_PER_LOOP.why, use_ca=False, at=5, executions=PROBES + 1)
    assert "probing communication-avoiding" in learner.why


def test_learner_switches_back_when_measurements_change():
    learner = Learner(MODEL_CA, interval=8)
    ways = drive(learner, 200, lambda ca, n: (2e-3 if ca else 1e-3) if n < 30 else (1e-3 if ca else 2e-3))
    assert len(learner.switches) == 2 and learner.switches[0] < 30 < learner.switches[1]
    assert learner.use_ca and ways[-1]
    assert learner.why.startswith(f"ca: switched at execution {learner.switches[1]}")


def test_learner_does_not_check_a_variant_never_timed():
    learner = Learner(MODEL_CA, interval=4)
    ways = []
    for _ in range(12):  # loop by loop's timings never arrive (as if every run were a first one)
        ca = learner.next(alone)
        ways.append(ca)
        if ca:
            learner.record(ca, 1e-3)
    assert learner.switches == [] and learner.use_ca
    assert learner.interval == 4  # not confirmed: no doubling
    assert "not checked at execution 9: loop by loop was not timed on some rank" in learner.why


class ThreadRanks:
    """A maximum over ``size`` threads standing for ranks (an ``Allreduce(MAX)``)."""

    def __init__(self, size: int):
        self.barrier = threading.Barrier(size)
        self.values = [None] * size
        self.calls = [[] for _ in range(size)]

    def agree(self, rank: int, learner):
        def agree(values):
            self.calls[rank].append(learner.executions)
            self.values[rank] = values.copy()
            self.barrier.wait(timeout=30)
            values[:] = np.max(self.values, axis=0)
            self.barrier.wait(timeout=30)
            return values
        return agree


def test_learners_on_ranks_with_different_timings_take_every_step_together():
    ranks = ThreadRanks(2)
    learners = [Learner(MODEL_CA, interval=8), Learner(MODEL_CA, interval=8)]
    ways = [None, None]
    # rank 0 finds CA slower, rank 1 finds it faster: the slowest rank's medians decide
    timings = [constant(ca_time=3e-3, per_loop_time=1e-3), constant(ca_time=1e-3, per_loop_time=1.5e-3)]

    def rank(r):
        ways[r] = drive(learners[r], 120, timings[r], agree=ranks.agree(r, learners[r]))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert ways[0] == ways[1]
    assert ranks.calls[0] == ranks.calls[1] and ranks.calls[0]
    assert learners[0].switches == learners[1].switches == [8 + (PROBES + 1) + 1]
    assert learners[0].why == learners[1].why
    assert "measured 3.000 ms per execution communication-avoiding against 1.500 ms loop by loop" in learners[0].why


# --- on two ranks: real chains -------------------------------------------------------------------------

@mc.kernel
def churn(u):
    u[0] = (u[0] * 3 + 1) % 7 - 3


@mc.kernel
def spread(out1, out2, in1, in2):
    out1[0] += in2[0]
    out2[0] += in1[0]


class Graph:
    """Two copies of a two-loop chain on a random graph (small integers: every way of
    running gives the same values exactly); the second reads what the first incremented
    through the map, so CA runs it two layers deep with one exchange."""

    def __init__(self, nodes: int = 400, seed: int = 5):
        rng = np.random.default_rng(seed)
        edges = rng.integers(0, nodes, size=(2 * nodes, 2))
        edges = edges[edges[:, 0] != edges[:, 1]]
        self.nodes = mc.Set(nodes, "nodes")
        self.edges = mc.Set(len(edges), "edges")
        self.e2n = mc.Map(self.edges, self.nodes, 2, edges, "e2n")
        start = rng.integers(-3, 4, size=nodes).astype(np.float64)
        self.copies = {name: [mc.Dat(self.nodes, 1, start if i == 0 else None, f"{name}{i}", dtype=np.float64)
                              for i in range(3)] for name in ("auto", "reference")}
        mc.partition("block", seed_set=self.nodes)

    def step(self, name: str, *, ca) -> None:
        u = self.copies[name]
        mc.par_loop(churn, self.nodes, u[0](mc.RW))  # the chain's inputs are stale again each time
        with mc.loop_chain(name, ca=ca):
            for src, dst in zip(u, u[1:]):
                mc.par_loop(spread, self.edges, dst(mc.INC, self.e2n[0]), dst(mc.INC, self.e2n[1]),
                            src(mc.READ, self.e2n[0]), src(mc.READ, self.e2n[1]))

    def gathered(self, name: str):
        return [dat.gather() for dat in self.copies[name]]


def _chain_plans(name: str) -> int:
    return sum(plan.account.chain_name == name for plan in mc.get_runtime().pipeline.plans.values())


@pytest.mark.mpi(nprocs=2, timeout=300)
def test_first_run_of_a_plan_is_never_observed(comm, meshchain_cache_dir):
    mc.reset_runtime(comm=comm, cache_dir=meshchain_cache_dir)
    graph = Graph()
    model = mc.get_runtime().model
    graph.step("reference", ca=True)
    mc.flush()
    assert model.observations.added == 0  # compiled, inspected and set up: not a timing
    for _ in range(5):
        graph.step("reference", ca=True)
    mc.flush()
    plans = _chain_plans("reference")
    assert 1 <= plans < 6
    assert model.observations.added == 6 - plans
    assert len(model.observations.kinds[True]) == 6 - plans and not model.observations.kinds[False]


@pytest.mark.mpi(nprocs=2, timeout=300)
def test_auto_switches_on_every_rank_at_the_same_execution(comm, meshchain_cache_dir, monkeypatch):
    mc.reset_runtime(comm=comm, cache_dir=meshchain_cache_dir)
    # the model predicts loop by loop at once (no calibration needed); the measurements then
    # find the model's choice one second slower per execution, on this rank only for rank 1
    monkeypatch.setattr(auto.ModelState, "_decide", lambda self, profile: MODEL_PER_LOOP)
    record = Learner.record

    def slowed(self, ca, seconds):
        slow = ca == self.model.use_ca and comm.rank == 1
        record(self, ca, seconds + (1.0 if slow else 0.0))

    monkeypatch.setattr(Learner, "record", slowed)
    graph = Graph()
    executions = FIRST_CHECK + PROBES + 1 + 1 + FIRST_CHECK + PROBES + 1 + 2
    modes = []
    for _ in range(executions):
        graph.step("auto", ca="auto")
        graph.step("reference", ca=False)
        mc.flush()
        modes.append(mc.stats().chains["auto"].mode)
    (learner,) = mc.get_runtime().model.decisions.values()
    switched_at = FIRST_CHECK + PROBES + 1 + 1  # probes of CA (one more: its plan's first run), then the check
    assert learner.switches == [switched_at]
    assert comm.allgather((learner.switches, modes, learner.why)) == [(learner.switches, modes, learner.why)] * 2
    assert modes[:FIRST_CHECK] == ["per-loop"] * FIRST_CHECK
    assert modes[FIRST_CHECK:switched_at] == ["ca"] * (switched_at - FIRST_CHECK)
    assert modes[switched_at - 1] == "ca" and modes[-1] == "ca"
    assert "per-loop" in modes[switched_at:]  # probes of loop by loop, then confirmed
    decision = mc.stats().chains["auto"].decision
    assert decision.startswith(f"ca: switched at execution {switched_at}: measured ")
    assert "slowest rank" in decision and "the model had predicted loop by loop" in decision
    assert "confirmed by measurement at execution" in decision
    auto_values, reference = graph.gathered("auto"), graph.gathered("reference")
    if comm.rank == 0:
        for got, want in zip(auto_values, reference):
            np.testing.assert_array_equal(got, want)
        assert np.abs(reference[2]).sum() > 0
