"""Lazy evaluation, loop chains and the chain inspector on one process."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.core.access import Access
from meshchain.inspector.chain import ArgSig, LoopSig, SetFacts, core_thresholds, plan_chain, validity_after
from meshchain.engine.chains import parse_chain_config

from chain_programs import Program, programs


# --------------------------------------------------------------------------- #
# Lazy trace
# --------------------------------------------------------------------------- #
@mc.kernel
def add_one(a):
    a[0] += 1


@mc.kernel
def copy_into(a, b):
    b[0] = a[0]


def small_world():
    s = mc.Set(3, "s")
    a, b, c = (mc.Dat(s, 1, np.arange(3), name, dtype=np.int64) for name in "abc")
    return s, a, b, c


def test_par_loop_records_and_returns():
    s, a, _, _ = small_world()
    mc.par_loop(add_one, s, a(mc.RW))
    assert len(mc.get_runtime().trace) == 1
    assert a.data_ro[:, 0].tolist() == [1, 2, 3]
    assert len(mc.get_runtime().trace) == 0


def test_forcing_one_dat_runs_only_what_it_depends_on():
    s, a, b, c = small_world()
    mc.par_loop(add_one, s, a(mc.RW), name="a1")
    mc.par_loop(add_one, s, c(mc.RW), name="c1")
    mc.par_loop(copy_into, s, a(mc.READ), b(mc.WRITE), name="a_to_b")
    assert b.data_ro[:, 0].tolist() == [1, 2, 3]
    assert [e.loop.name for e in mc.get_runtime().trace] == ["c1"]
    assert mc.get_runtime().recorder.loops["a1"].calls == 1 and "c1" not in mc.get_runtime().recorder.loops


def test_overwriting_a_dat_first_runs_the_loops_that_read_it():
    s, a, b, _ = small_world()
    mc.par_loop(copy_into, s, a(mc.READ), b(mc.WRITE), name="a_to_b")
    a.data[:] = 100  # write-after-read: the copy must see the old values
    assert b.data_ro[:, 0].tolist() == [0, 1, 2]


def test_setting_a_global_runs_the_loops_that_use_it_first():
    s, a, _, _ = small_world()
    total = mc.Global(1, 0, "total", dtype=np.int64)

    @mc.kernel
    def add_to(x, t):
        t[0] += x[0]

    mc.par_loop(add_to, s, a(mc.READ), total(mc.INC))
    total.value = 10
    assert total.value[0] == 10
    mc.par_loop(add_to, s, a(mc.READ), total(mc.INC))
    assert total.value[0] == 13


def test_trace_length_bounds_the_trace():
    mc.configure(trace_length=2)
    s, a, _, _ = small_world()
    mc.par_loop(add_one, s, a(mc.RW))
    assert len(mc.get_runtime().trace) == 1
    mc.par_loop(add_one, s, a(mc.RW))
    assert len(mc.get_runtime().trace) == 0


NAMES = "abcd"


@st.composite
def lazy_programs(draw):
    """Steps: loops over 4 dats and a global, interleaved with reads and writes by the user."""
    steps = []
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["loop", "loop", "loop", "read", "write", "global", "set_global", "flush"]))
        if kind == "loop":
            src, dst = draw(st.sampled_from(NAMES)), draw(st.sampled_from(NAMES))
            mode = draw(st.sampled_from(["copy", "inc", "sum"]))
            steps.append(("loop", src, dst, mode))
        elif kind in ("read", "write"):
            steps.append((kind, draw(st.sampled_from(NAMES)), draw(st.integers(-3, 3))))
        else:
            steps.append((kind,))
    return steps


@mc.kernel
def scaled_copy(a, b):
    b[0] = 3 * a[0] + 1


@mc.kernel
def add_from(a, b):
    b[0] += a[0] - 1


@mc.kernel
def into_global(a, g):
    g[0] += a[0] * a[0]


def execute(steps, trace_length):
    mc.reset_runtime(trace_length=trace_length)
    s = mc.Set(5, "s")
    dats = {n: mc.Dat(s, 1, np.arange(5) + i, n, dtype=np.int64) for i, n in enumerate(NAMES)}
    g = mc.Global(1, 0, "g", dtype=np.int64)
    seen, loops = [], 0
    for step in steps:
        if step[0] == "loop":
            _, src, dst, mode = step
            loops += 1
            if mode == "sum":
                mc.par_loop(into_global, s, dats[src](mc.READ), g(mc.INC))
            elif src == dst:
                mc.par_loop(add_one, s, dats[dst](mc.RW))
            else:
                kernel = scaled_copy if mode == "copy" else add_from
                mc.par_loop(kernel, s, dats[src](mc.READ), dats[dst](mc.WRITE if mode == "copy" else mc.INC))
        elif step[0] == "read":
            seen.append(dats[step[1]].data_ro.copy())
        elif step[0] == "write":
            dats[step[1]].data[1] = step[2]
        elif step[0] == "global":
            seen.append(g.value)
        elif step[0] == "set_global":
            g.value = 1
        else:
            mc.flush()
    seen += [d.data_ro.copy() for d in dats.values()] + [g.value]
    calls = sum(r.calls for r in mc.stats().loops.values())
    return seen, calls, loops


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=lazy_programs(), trace_length=st.sampled_from([2, 5, 256]))
def test_lazy_evaluation_matches_eager_and_runs_each_loop_once(steps, trace_length):
    eager, eager_calls, loops = execute(steps, 1)
    lazy, lazy_calls, _ = execute(steps, trace_length)
    assert eager_calls == lazy_calls == loops  # nothing twice, nothing lost
    for want, got in zip(eager, lazy):
        np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- #
# Chains on one process
# --------------------------------------------------------------------------- #
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=programs())
def test_random_chains_equal_loop_by_loop_on_one_process(spec):
    results = []
    for mode in (None, True, False, "auto"):
        mc.reset_runtime()
        program = Program(spec)
        program.run(mode)
        results.append(program.results())
    for other in results[1:]:
        for want, got in zip(results[0], other):
            np.testing.assert_array_equal(got, want)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=programs(max_loops=5), mode=st.sampled_from([None, True, False, "auto"]))
def test_new_objects_each_execution_reuse_the_plans_bit_for_bit(spec, mode):
    """Plans are kept by structure: executions with new dats and globals declared alike give
    the bits of executions with the objects reused, and build no plan after the first; a
    captured step replayed gives them too."""
    results = []
    for renew in (False, True):
        mc.reset_runtime()
        program = Program(spec)
        program.run(mode, executions=1)
        mc.stats(reset=True)
        program.run(mode, executions=3, renew=renew)
        plans = mc.stats().caches["plans"]
        assert plans.misses == 0 and plans.hits > 0, (renew, plans)
        results.append(program.results())
    mc.reset_runtime()  # the same executions captured: one capture, three replays, the same bits
    program = Program(spec)
    program.run(mode, executions=4, captured=True)
    assert (program.step.captures, program.step.replays) == (1, 3)
    results.append(program.results())
    for other in results[1:]:
        for want, got in zip(results[0], other):
            np.testing.assert_array_equal(got, want)


def test_a_chain_run_again_binds_the_objects_of_each_execution():
    """A chain executed again with the same loops finds its unit by those loops; with a new
    dat in between, and then the first one again, each execution writes to its own objects."""
    s, a, b, _ = small_world()
    pipeline = mc.get_runtime().pipeline

    def pair(target):
        with mc.loop_chain("pair"):
            mc.par_loop(add_one, s, a(mc.RW))
            mc.par_loop(copy_into, s, a(mc.READ), target(mc.WRITE))

    pair(b)
    hits = pipeline.units.hits
    pair(b)
    assert pipeline.units.hits == hits + 1
    fresh = mc.Dat(s, 1, None, "fresh", dtype=np.int64)
    pair(fresh)
    assert fresh.data_ro[:, 0].tolist() == [3, 4, 5] and b.data_ro[:, 0].tolist() == [2, 3, 4]
    pair(b)
    assert b.data_ro[:, 0].tolist() == [4, 5, 6] and fresh.data_ro[:, 0].tolist() == [3, 4, 5]
    assert a.data_ro[:, 0].tolist() == [4, 5, 6]


def test_loop_chain_runs_when_the_block_ends():
    s, a, b, _ = small_world()
    with mc.loop_chain("pair"):
        mc.par_loop(add_one, s, a(mc.RW))
        mc.par_loop(copy_into, s, a(mc.READ), b(mc.WRITE))
        assert len(mc.get_runtime().trace) == 2
    assert len(mc.get_runtime().trace) == 0
    chain = mc.stats().chains["pair"]
    assert (chain.executions, chain.loops, chain.mode) == (1, 2, "serial")
    assert b.data_ro[:, 0].tolist() == [1, 2, 3]


def test_an_error_inside_a_chain_block_leaves_its_loops_pending():
    s, a, _, _ = small_world()
    with pytest.raises(ZeroDivisionError):
        with mc.loop_chain("broken"):
            mc.par_loop(add_one, s, a(mc.RW))
            1 / 0  # noqa: B018
    assert len(mc.get_runtime().trace) == 1
    assert a.data_ro[:, 0].tolist() == [1, 2, 3]


def test_chains_cannot_be_nested():
    with mc.loop_chain("outer"):
        with pytest.raises(mc.LoopError, match="cannot be nested"):
            with mc.loop_chain("inner"):
                pass


@pytest.mark.parametrize(("options", "message"), [
    (dict(ca="yes"), r"ca must be True, False or 'auto'"),
    (dict(max_halo=0), r"max_halo must be a positive integer"),
    (dict(tile_size=-1), r"tile_size must be a positive integer"),
])
def test_bad_chain_options_are_refused(options, message):
    with pytest.raises(mc.ConfigurationError, match=message):
        mc.loop_chain("x", **options)


def test_configured_chains_group_loops_by_name(tmp_path):
    path = tmp_path / "chains.toml"
    path.write_text('[[chain]]\nname = "pair"\nloops = ["inc_a", "copy_ab"]\nrepeat = 2\n')
    mc.configure(chains=path)
    s, a, b, _ = small_world()
    for _ in range(2):
        mc.par_loop(add_one, s, a(mc.RW), name="inc_a")
        mc.par_loop(copy_into, s, a(mc.READ), b(mc.WRITE), name="copy_ab")
    assert len(mc.get_runtime().trace) == 0  # the completed pattern ran at once
    assert mc.stats().chains["pair"].loops == 4
    assert b.data_ro[:, 0].tolist() == [2, 3, 4]


def test_a_broken_configured_pattern_runs_as_a_shorter_chain_and_warns(tmp_path):
    path = tmp_path / "chains.toml"
    path.write_text('[[chain]]\nname = "pair"\nloops = ["inc_a", "copy_ab"]\n')
    mc.configure(chains=path)
    s, a, b, _ = small_world()
    mc.par_loop(add_one, s, a(mc.RW), name="inc_a")
    with pytest.warns(mc.MeshchainWarning, match=r"\[chain-incomplete\].*expected loop 'copy_ab'"):
        mc.par_loop(add_one, s, b(mc.RW), name="other")
    assert a.data_ro[:, 0].tolist() == [1, 2, 3]
    assert mc.stats().chains["pair"].loops == 1


def test_chain_configuration_from_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "chains.toml"
    path.write_text('[[chain]]\nname = "one"\nloops = ["inc_a"]\n')
    monkeypatch.setenv("MESHCHAIN_CHAINS", str(path))
    mc.reset_runtime()
    s, a, _, _ = small_world()
    mc.par_loop(add_one, s, a(mc.RW), name="inc_a")
    assert mc.stats().chains["one"].executions == 1


@pytest.mark.parametrize(("text", "message"), [
    ("[[chain]\n", r"not valid TOML"),
    ('[[chain]]\nname = "x"\n', r"'loops' must be a non-empty list"),
    ('[[chain]]\nname = "x"\nloops = ["a"]\nrepeat = 0\n', r"'repeat' must be a positive integer"),
    ('[[chain]]\nname = "x"\nloops = ["a"]\ncolour = 1\n', r"unknown key\(s\) \['colour'\]"),
    ('[[chain]]\nname = "x"\nloops = ["a"]\nca = "maybe"\n', r"chain #1: .*ca must be"),
    ('[something]\n', r"unknown table"),
])
def test_bad_chain_configuration_is_refused(text, message):
    with pytest.raises(mc.ConfigurationError, match=message):
        parse_chain_config(text, "test.toml")


def test_missing_chain_configuration_file_is_refused(tmp_path):
    with pytest.raises(mc.ConfigurationError, match="cannot read the chain configuration"):
        mc.configure(chains=tmp_path / "absent.toml")


# --------------------------------------------------------------------------- #
# Inspector (pure)
# --------------------------------------------------------------------------- #
EDGES, NODES, CELLS = 0, 1, 2
RES, PRES, FLUX, CW, G = 0, 1, 2, 3, 4
FACTS = {EDGES: SetFacts((0, 0, 1, 2)), NODES: SetFacts((0, 1, 2, 3)), CELLS: SetFacts((0, 1, 2, 3))}


def update():
    return LoopSig("update", EDGES, (ArgSig(RES, False, True, Access.INC, NODES), ArgSig(PRES, False, True, Access.READ, NODES)))


def edge_flux():
    return LoopSig("edge_flux", EDGES, (ArgSig(FLUX, False, True, Access.INC, NODES),
                                        ArgSig(RES, False, True, Access.READ, NODES),
                                        ArgSig(CW, False, True, Access.READ, CELLS)))


@pytest.mark.parametrize("nchains", [1, 2, 8, 16])
def test_synthetic_chain_needs_two_layers_whatever_its_length(nchains):
    """The paper's MG-CFD chain: r = 2 (§4.1.2), one segment."""
    plan = plan_chain((update(), edge_flux()) * nchains, FACTS, built=3, limit=16)
    (segment,) = plan.segments
    assert segment.depths == (2, 1) * nchains
    assert dict(segment.required) == {RES: 1, PRES: 2, CW: 1}
    assert plan.depth == 2 and plan.more_layers is None


def test_a_chain_of_reads_after_writes_deepens_one_layer_per_loop():
    """Each loop reads through a map what the previous one incremented: depths n, n-1, ..., 1."""
    loops = tuple(LoopSig(f"l{i}", EDGES, (ArgSig(i, False, True, Access.READ, NODES),
                                           ArgSig(i + 1, False, True, Access.INC, NODES))) for i in range(4))
    plan = plan_chain(loops, FACTS, built=5, limit=16)
    assert plan.segments[0].depths == (4, 3, 2, 1)
    assert plan.segments[0].thresholds == (1, 2, 3, 4)  # the core shrinks along the chain


def test_more_layers_are_requested_when_the_chain_is_deeper_than_built():
    plan = plan_chain((update(), edge_flux()), FACTS, built=1, limit=16)
    assert plan.more_layers == 2


def test_a_limit_splits_the_chain_and_says_why():
    plan = plan_chain((update(), edge_flux()) * 2, FACTS, built=3, limit=1)
    # edge_flux then update need no exchange between them: they share a segment
    assert [(s.start, s.end) for s in plan.segments] == [(0, 1), (1, 3), (3, 4)]
    assert all(max(s.depths) <= 1 for s in plan.segments)
    assert "allowed: 1" in plan.segments[-1].reason


def flux_step(step):
    """Vertex-centred finite volume: edge fluxes of ``u`` incremented into ``r``, then
    ``u += r; r = 0`` on the nodes (a direct loop on a set no map starts from)."""
    U, R = 10, 11
    flux = LoopSig(f"flux{step}", EDGES, (ArgSig(U, False, True, Access.READ, NODES), ArgSig(R, False, True, Access.INC, NODES)))
    node = LoopSig(f"update{step}", NODES, (ArgSig(U, False, False, Access.RW, NODES), ArgSig(R, False, False, Access.RW, NODES)))
    return flux, node


@pytest.mark.parametrize("steps", [1, 2, 3, 5])
def test_a_vertex_centred_chain_is_one_segment_as_deep_as_its_steps(steps):
    """k (edge flux, node update) steps: the node updates run redundantly on the nodes' halo,
    one layer less per step, so one exchange serves the chain: u k layers deep, and r (added
    to, never read before the first flux) k - 1 layers deep."""
    loops = tuple(loop for step in range(steps) for loop in flux_step(step))
    facts = {EDGES: SetFacts((0, *range(steps))), NODES: SetFacts(tuple(range(steps + 1)))}
    plan = plan_chain(loops, facts, built=steps, limit=16)
    (segment,) = plan.segments
    assert segment.depths == tuple(d for k in range(steps, 0, -1) for d in (k, k - 1))
    assert dict(segment.required) == {10: steps, **({11: steps - 1} if steps > 1 else {})}
    assert plan.depth == steps and plan.more_layers is None


def test_a_vertex_centred_chain_splits_where_the_allowed_depth_ends():
    """With at most L layers, k steps need ceil(k / L) exchanges: one per L steps (planned
    from the end, so each split falls between a flux and the update before it)."""
    loops = tuple(loop for step in range(5) for loop in flux_step(step))
    plan = plan_chain(loops, FACTS, built=3, limit=2)
    assert [(s.start, s.end) for s in plan.segments] == [(0, 1), (1, 5), (5, 10)]
    assert [s.depths for s in plan.segments] == [(1,), (2, 2, 1, 1), (2, 2, 1, 1, 0)]
    assert [s.reason for s in plan.segments[1:]] == [f"loop {name!r} would have to run 3 halo layers deep (allowed: 2)"
                                                     for name in ("flux0", "flux2")]


def test_a_direct_write_whose_set_covers_too_little_splits_the_chain_and_says_why():
    """A set whose exec layers never cover the data layer a later loop needs (here: no layer
    at all) cannot produce it redundantly: the chain splits, naming the loop and the dat."""
    facts = {**FACTS, NODES: SetFacts((0, 0, 0, 0))}
    scale = LoopSig("scale", NODES, (ArgSig(PRES, False, False, Access.RW, NODES),))
    plan = plan_chain((scale, update()), facts, built=3, limit=3, names={PRES: "pres"})
    assert [(s.start, s.end) for s in plan.segments] == [(0, 1), (1, 2)]
    assert plan.segments[1].reason == ("loop 'scale' writes 'pres' directly but a later loop needs it valid 1 "
                                       "layer(s) into the halo, and covering data layer 1 needs more than 3 layers")
    deeper = plan_chain((scale, update()), facts, built=3, limit=16)
    assert deeper.more_layers == 4  # below the limit, more layers may cover it: build one more and look again


def test_a_direct_write_on_a_set_no_map_starts_from_extends_the_chain():
    scale = LoopSig("scale", NODES, (ArgSig(PRES, False, False, Access.RW, NODES),))
    plan = plan_chain((scale, update()), FACTS, built=3, limit=16)
    (segment,) = plan.segments
    assert segment.depths == (1, 1) and dict(segment.required) == {PRES: 1}


def test_a_direct_write_on_a_runnable_set_extends_the_chain():
    weights = LoopSig("weights", CELLS, (ArgSig(CW, False, False, Access.WRITE, CELLS),))
    plan = plan_chain((weights, update(), edge_flux()), FACTS, built=3, limit=16)
    assert len(plan.segments) == 1 and plan.segments[0].depths == (1, 2, 1)


def test_a_reduction_used_later_splits_the_chain():
    reduce = LoopSig("norm", EDGES, (ArgSig(PRES, False, True, Access.READ, NODES), ArgSig(G, True, False, Access.INC, -1)))
    use = LoopSig("use", EDGES, (ArgSig(G, True, False, Access.READ, -1), ArgSig(RES, False, True, Access.INC, NODES)))
    plan = plan_chain((reduce, use), FACTS, built=3, limit=16)
    assert len(plan.segments) == 2 and "reduced by loop 'norm'" in plan.segments[1].reason
    deferred = plan_chain((use, reduce), FACTS, built=3, limit=16)
    assert len(deferred.segments) == 1  # a reduction nobody uses later runs inside the chain


def test_core_thresholds_keep_phase_one_away_from_arriving_halos():
    assert core_thresholds((update(),), (1,), {PRES: 1}) == (1,)
    assert core_thresholds((update(),), (1,), {}) == (0,)


def test_validity_after_writes():
    inc = LoopSig("inc", EDGES, (ArgSig(RES, False, True, Access.INC, NODES),))
    write = LoopSig("w", CELLS, (ArgSig(CW, False, False, Access.WRITE, CELLS),))
    assert validity_after(inc, 3, {RES: 1}, lambda e: e) == {RES: 1}
    assert validity_after(inc, 3, {RES: 5}, lambda e: e) == {RES: 2}
    assert validity_after(write, 2, {CW: 0}, lambda e: e - 1) == {CW: 1}
