"""The analytic model (equations 1-4), its calibration and the overhead fit."""

from __future__ import annotations

import json
import math

import pytest

import meshchain as mc
from meshchain.model import (
    ChainProfile,
    LoopProfile,
    Machine,
    SegmentProfile,
    ca_segment_time,
    comm_reduction_percent,
    comp_increase_percent,
    gain_percent,
    grouped_message_size,
    op2_chain_time,
    op2_loop_time,
)
from meshchain.model.overheads import Observation, Observations, Residual, fit_overheads

MACHINE = Machine(latency=10e-6, bandwidth=1e9, pack_cost=2e-9)


def test_equation_1_latency_hidden_behind_core():
    # core 1000 x 1 µs = 1 ms hides 2 x 3 x (10 µs + 1 µs); then 200 halo-side iterations
    t = op2_loop_time(g=1e-6, core=1000, iterations=1200, dats=2, neighbours=3, max_message=1000, machine=MACHINE)
    assert t == pytest.approx(1000e-6 + 200e-6)


def test_equation_1_communication_bound_and_opt2_factor_two():
    # 10 core iterations of 1 µs; exchange 1 x 2 x (10 µs + 4 µs) = 28 µs; rest 5 µs
    t = op2_loop_time(g=1e-6, core=10, iterations=15, dats=1, neighbours=2, max_message=4000, machine=MACHINE)
    assert t == pytest.approx(28e-6 + 5e-6)
    t2 = op2_loop_time(g=1e-6, core=10, iterations=15, dats=1, neighbours=2, max_message=4000, machine=MACHINE,
                       messages_per_dat=2)
    assert t2 == pytest.approx(56e-6 + 5e-6)


def test_equation_1_no_exchange_is_just_compute():
    assert op2_loop_time(g=2e-6, core=0, iterations=50, dats=0, neighbours=4, max_message=0,
                         machine=MACHINE) == pytest.approx(100e-6)


def test_equation_2_sums_loops():
    loops = [dict(g=1e-6, core=10, iterations=15, dats=1, neighbours=2, max_message=4000),
             dict(g=1e-6, core=1000, iterations=1200, dats=2, neighbours=3, max_message=1000)]
    assert op2_chain_time(loops, machine=MACHINE) == pytest.approx(33e-6 + 1200e-6)


def test_equation_3_grouped_message_with_pack_cost():
    # p (L + m/B + c m) = 2 (10 + 8 + 16) µs = 68 µs > 2 x 30 x 1 µs of cores; rest 2 x 10 µs
    t = ca_segment_time(g=[1e-6, 1e-6], core=[30, 30], iterations=[40, 40], neighbours=2, max_message=8000,
                        machine=MACHINE)
    assert t == pytest.approx(68e-6 + 20e-6)


def test_equation_3_compute_bound():
    t = ca_segment_time(g=[1e-6, 2e-6], core=[1000, 500], iterations=[1100, 600], neighbours=2, max_message=8000,
                        machine=MACHINE)
    assert t == pytest.approx(2000e-6 + 100e-6 + 200e-6)


def test_equation_4_grouped_message_size():
    # two dats of 4 doubles, 10 and 6 export rows; one int32 dat, 3 rows
    assert grouped_message_size([(10, 32), (6, 32), (3, 4)]) == 16 * 32 + 12


def test_overheads_enter_both_equations():
    m = Machine(latency=0.0, bandwidth=1e12, round_overhead=50e-6, loop_overhead=5e-6)
    assert op2_loop_time(g=0.0, core=0, iterations=0, dats=1, neighbours=2, max_message=8,
                         machine=m) == pytest.approx(55e-6)
    assert ca_segment_time(g=[0.0] * 4, core=[0] * 4, iterations=[0] * 4, neighbours=2, max_message=8,
                           machine=m) == pytest.approx(50e-6 + 4 * 5e-6)


def test_a_loop_or_segment_without_exchange_pays_no_round_overhead():
    m = Machine(latency=0.0, bandwidth=1e12, round_overhead=50e-6, loop_overhead=5e-6)
    assert op2_loop_time(g=0.0, core=0, iterations=0, dats=0, neighbours=2, max_message=0,
                         machine=m) == pytest.approx(5e-6)
    assert op2_loop_time(g=0.0, core=0, iterations=0, dats=1, neighbours=0, max_message=0,
                         machine=m) == pytest.approx(5e-6)
    assert ca_segment_time(g=[0.0] * 4, core=[0] * 4, iterations=[0] * 4, neighbours=0, max_message=0,
                           machine=m) == pytest.approx(4 * 5e-6)
    # the overhead fit counts the same rounds: loop by loop only the loops that exchange
    direct = LoopProfile("direct", core=10, iterations=10)
    indirect = LoopProfile("indirect", core=5, iterations=10, dats=1, neighbours=2, max_message=80)
    profile = ChainProfile((direct, indirect), (SegmentProfile(("direct", "indirect"), core=(10, 5),
                                                               iterations=(12, 10), neighbours=2, max_message=160),))
    assert Observation(False, 1.0, profile).terms() == (1, 2)
    assert Observation(True, 1.0, profile).terms() == (1, 2)


@pytest.mark.parametrize("row", [
    # OP2 paper, Table 5 (Hydra, 8M mesh): Σ2dpm¹, pm^r, ΣS¹, ΣS^h -> comm reduction %, comp increase %
    (31694400, 21051360, 37538, 135189, 33.58, 72.23),
    (51063200, 3508560, 75076, 271347, 93.12, 72.33),
    (52824000, 105256800, 27106, 123131, -99.26, 77.99),
    (89800800, 45780800, 10432, 10432, 49.02, 0.00),
])
def test_table_5_columns(row):
    loop_bytes, ca_bytes, s1, sh, reduction, increase = row
    assert comm_reduction_percent(loop_bytes, ca_bytes) == pytest.approx(reduction, abs=0.01)  # the paper truncates
    assert comp_increase_percent(s1, sh) == pytest.approx(increase, abs=0.01)


def test_gain_sign_convention():
    assert gain_percent(1.0, 0.5) == 50.0
    assert gain_percent(1.0, 4.0) == -300.0  # the paper's worst case


def test_machine_rejects_nonsense():
    with pytest.raises(mc.ConfigurationError, match="bandwidth"):
        Machine(latency=1e-6, bandwidth=0.0)
    with pytest.raises(mc.ConfigurationError, match="latency"):
        Machine(latency=-1.0, bandwidth=1e9)
    with pytest.raises(mc.ConfigurationError, match="staged_latency"):
        Machine(latency=1e-6, bandwidth=1e9).staged()
    assert Machine(latency=1e-6, bandwidth=1e9, staged_latency=2e-5).staged().latency == 2e-5


def _profile():
    loops = (LoopProfile("a", core=90, iterations=100, dats=1, neighbours=2, max_message=800, messages=2, bytes=1600),
             LoopProfile("b", core=90, iterations=100, dats=1, neighbours=2, max_message=800, messages=2,
                         bytes=1600))
    ca = (SegmentProfile(("a", "b"), core=(85, 80), iterations=(110, 100), neighbours=2, max_message=1600,
                         messages=2, bytes=3200),)
    return ChainProfile(loops, ca)


def test_profile_applies_the_equations_loop_by_loop():
    profile, g = _profile(), {"a": 1e-7, "b": 2e-7}
    expected = (op2_loop_time(g=1e-7, core=90, iterations=100, dats=1, neighbours=2, max_message=800, machine=MACHINE)
                + op2_loop_time(g=2e-7, core=90, iterations=100, dats=1, neighbours=2, max_message=800,
                                machine=MACHINE))
    assert profile.per_loop_time(g, MACHINE) == pytest.approx(expected)
    assert profile.ca_time(g, MACHINE) == pytest.approx(
        ca_segment_time(g=[1e-7, 2e-7], core=[85, 80], iterations=[110, 100], neighbours=2, max_message=1600,
                        machine=MACHINE))
    assert profile.missing({"a": 1.0}) == ["b"]
    assert ChainProfile.from_dict(json.loads(json.dumps(profile.as_dict()))) == profile
    totals = profile.totals()
    assert (totals["per_loop_bytes"], totals["ca_bytes"], totals["ca_iterations"]) == (3200, 3200, 210)


def test_overhead_fit_recovers_known_constants_despite_an_outlier():
    profile = _profile()
    g = {"a": 1e-7, "b": 2e-7}
    bare = Machine(latency=10e-6, bandwidth=1e9, pack_cost=2e-9)
    true = Machine(latency=10e-6, bandwidth=1e9, pack_cost=2e-9, round_overhead=40e-6, loop_overhead=7e-6)
    observations = Observations()
    for ca in (False, True):
        seconds = profile.ca_time(g, true) if ca else profile.per_loop_time(g, true)
        observations.add(Observation(ca, seconds * 5, profile))  # a cold first execution
        for _ in range(3):
            observations.add(Observation(ca, seconds, profile))
    assert observations.missing() == []
    o_r, o_l = fit_overheads(observations.residuals(g, bare))
    assert o_r == pytest.approx(40e-6, rel=1e-6)
    assert o_l == pytest.approx(7e-6, rel=1e-6)


@pytest.mark.parametrize("long_loops", [8, 16])
def test_overhead_fit_is_relative_and_cancels_an_error_both_variants_share(long_loops):
    """A long chain whose loop costs the equations underestimate by 200 µs in both variants
    (an interpolated ``g_l`` a few per cent off) beside a short chain they explain exactly: the
    fit relative to the times, with each pair's difference, finds the true overheads; the
    absolute fit of the residual seconds (``(rounds, loops, residual)`` rows) does not."""
    o_r, o_l, shared = 5e-6, 1e-6, 200e-6
    rows = [Residual(8, 8, 8 * o_r + 8 * o_l, 100e-6, False, "short"),
            Residual(1, 8, o_r + 8 * o_l, 50e-6, True, "short"),
            Residual(long_loops, long_loops, long_loops * (o_r + o_l) + shared, 3e-3, False, "long"),
            Residual(1, long_loops, o_r + long_loops * o_l + shared, 2.9e-3, True, "long")]
    assert fit_overheads(rows) == pytest.approx((o_r, o_l), rel=0.02)
    absolute = fit_overheads([row[:3] for row in rows])
    assert absolute[1] > 10 * o_l  # the long chain's shared error taken for a cost per loop


def test_overhead_fit_never_negative():
    assert fit_overheads([(4, 4, -1e-3), (1, 4, -2e-3)]) == (0.0, 0.0)
    assert fit_overheads([]) == (0.0, 0.0)


def test_calibrate_measures_plausible_positive_constants(tmp_path):
    mc.configure(cache_dir=str(tmp_path))
    calibration = mc.model.calibrate(repeats=5)
    m = calibration.machine
    assert 1e-9 < m.latency < 1e-2          # between a nanosecond and 10 ms per message
    assert 1e7 < m.bandwidth < 1e13         # 10 MB/s .. 10 TB/s
    assert 1e-13 < m.pack_cost < 1e-6       # per byte
    assert calibration.ranks == 1 and not calibration.overheads
    saved = mc.model.load_calibration()
    assert saved == calibration
    assert mc.get_runtime().calibration is calibration


def test_calibrate_takes_loop_costs_from_timed_runs(tmp_path):
    import numpy as np

    mc.configure(cache_dir=str(tmp_path))
    cells = mc.Set(20000, "cells")
    q = mc.Dat(cells, 1, np.arange(20000.0), "q")

    @mc.kernel
    def square(a):
        a[0] = a[0] * a[0] * 0.5

    for _ in range(3):
        mc.par_loop(square, cells, q(mc.RW))
    mc.flush()
    calibration = mc.model.calibrate(repeats=3)
    g = calibration.loop_costs["square"]
    assert 1e-12 < g < 1e-4  # seconds per iteration
    assert calibration.costs(ca=True) == calibration.costs(ca=False)  # one process: no CA segment ran
    # a later run on this host with as many ranks finds it
    mc.reset_runtime(cache_dir=str(tmp_path))
    assert mc.model.load_calibration().loop_costs["square"] == g


def test_broken_calibration_file_is_an_error(tmp_path):
    mc.configure(cache_dir=str(tmp_path))
    from meshchain.model.calibrate import calibration_path

    path = calibration_path(tmp_path, mc.get_runtime().calibration_key())  # this host, one rank, ...
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(mc.ConfigurationError, match="not a meshchain calibration"):
        mc.model.load_calibration()


def test_a_calibration_taken_on_one_network_is_not_used_on_another(tmp_path, monkeypatch):
    for name in ("MPIR_CVAR_NOLOCAL", "MPIR_CVAR_CH4_NETMOD", "FI_PROVIDER"):
        monkeypatch.delenv(name, raising=False)
    mc.configure(cache_dir=str(tmp_path))
    shm = mc.model.calibrate(repeats=2, sizes=(8, 64))
    assert shm.network == "default" and mc.model.load_calibration() == shm
    monkeypatch.setenv("MPIR_CVAR_NOLOCAL", "1")
    monkeypatch.setenv("MPIR_CVAR_CH4_NETMOD", "ofi")
    monkeypatch.setenv("FI_PROVIDER", "tcp")
    assert mc.model.load_calibration() is None  # saved under another network: not used
    mc.reset_runtime(cache_dir=str(tmp_path))
    assert mc.get_runtime().model.current_calibration() is None
    tcp = mc.model.calibrate(repeats=2, sizes=(8, 64))
    assert tcp.network == "nolocal.1-ch4_netmod.ofi-fi_provider.tcp"
    assert mc.model.load_calibration() == tcp
    assert "network nolocal.1-ch4_netmod.ofi-fi_provider.tcp" in tcp.describe()
    monkeypatch.delenv("MPIR_CVAR_NOLOCAL")
    monkeypatch.delenv("MPIR_CVAR_CH4_NETMOD")
    monkeypatch.delenv("FI_PROVIDER")
    mc.reset_runtime(cache_dir=str(tmp_path))
    assert mc.model.load_calibration() == shm  # each kept apart
    assert len(list((tmp_path / "model").glob("*.json"))) == 2


def test_a_calibration_taken_with_other_threads_is_not_used(tmp_path):
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one thread only")
    mc.configure(cache_dir=str(tmp_path), threads=1)
    one = mc.model.calibrate(repeats=2, sizes=(8, 64))
    assert one.threads == 1
    mc.configure(threads=2)
    assert mc.model.load_calibration() is None and mc.get_runtime().model.current_calibration() is None
    mc.configure(threads=1)
    assert mc.get_runtime().model.current_calibration() == one


def test_the_overheads_are_fitted_under_the_measured_overlap(monkeypatch):
    """Executions that ran with no overlap (φ = 0) and known overheads: fitted under the
    measured φ, the overheads come out exact; fitted as if φ = 1 (the fault this replaced)
    the message time that did not overlap would be counted as overhead a second time."""
    import importlib

    from mpi4py import MPI

    from meshchain.model.keys import CalibrationKey

    calibrate = importlib.import_module("meshchain.model.calibrate")  # the module (mc.model.calibrate is the function)

    profile, g = _profile(), {"a": 1e-7, "b": 2e-7}
    true = Machine(latency=10e-6, bandwidth=1e9, pack_cost=2e-9, round_overhead=11e-6, loop_overhead=3e-6,
                   overlap=0.0)
    observations = Observations()
    for ca in (False, True):
        for _ in range(3):
            observations.add(Observation(ca, profile.ca_time(g, true) if ca else profile.per_loop_time(g, true),
                                         profile))
    monkeypatch.setattr(calibrate, "measure_network", lambda comm, **_: (10e-6, 1e9))
    monkeypatch.setattr(calibrate, "measure_packing", lambda comm: 2e-9)
    monkeypatch.setattr(calibrate, "measure_overlap", lambda comm, **_: ({"none": 1e-4, "poll": 5e-5},
                                                                         {"none": 0.0, "poll": 0.9}))
    monkeypatch.setattr(calibrate, "measure_copy_bandwidth", lambda comm: 1e10)
    key = CalibrationKey("host", 1, "default", "persistent", "none", 1)
    measured = calibrate.measure(MPI.COMM_SELF, costs=g, observations=observations, previous=None, path=None,
                                 key=key, repeats=1)
    assert measured.machine.overlap == 0.0  # the mode the session uses ("none"), not the fastest ("poll")
    assert measured.progress == "poll" and measured.session_progress == "none" and measured.key == key
    assert measured.machine.round_overhead == pytest.approx(11e-6, rel=1e-6)
    assert measured.machine.loop_overhead == pytest.approx(3e-6, rel=1e-6)
    as_if_overlapped = fit_overheads(observations.residuals(g, Machine(10e-6, 1e9, 2e-9, overlap=1.0)))
    assert as_if_overlapped[0] + as_if_overlapped[1] > 11e-6 + 3e-6 + 1e-6  # what φ = 1 would have fitted


def test_calibrate_changes_nothing_in_the_session_unless_applied(tmp_path):
    mc.configure(cache_dir=str(tmp_path))
    before = mc.get_runtime().config
    calibration = mc.model.calibrate(repeats=2, sizes=(8, 64))
    assert mc.get_runtime().config == before and calibration.applied == {}
    assert "applied" not in calibration.describe()
    applied = mc.model.calibrate(repeats=2, sizes=(8, 64), apply=True)
    assert applied.applied == {"nothing": "one process sends no messages"}
    assert "applied nothing: one process sends no messages" in applied.describe()
    assert mc.get_runtime().config == before
    loaded = mc.model.load_calibration()
    assert loaded.applied == {}  # the file holds what was measured; applying is this session's


def test_calibrate_rejects_bad_options():
    with pytest.raises(mc.ConfigurationError, match="two positive message sizes"):
        mc.model.calibrate(sizes=(8,), save=False)
    assert math.isfinite(mc.model.calibrate(sizes=(8, 64), repeats=1, save=False).machine.latency)


def test_report_refuses_bad_options():
    from meshchain.apps.report import run_report

    with pytest.raises(mc.ConfigurationError, match=">= 2"):
        run_report("synthetic", ranks=[1], per_rank=[100], loops=[2])
    with pytest.raises(mc.ConfigurationError, match="unknown workload"):
        run_report("hydra", ranks=[2], per_rank=[100], loops=[2])
    with pytest.raises(mc.ConfigurationError, match="unknown network"):
        run_report("synthetic", ranks=[2], per_rank=[100], loops=[2], network="infiniband")


def test_info_prints_the_versions_and_the_settings_a_session_takes(tmp_path):
    import os
    import subprocess
    import sys

    import numba
    import numpy as np

    env = dict(os.environ, MESHCHAIN_CACHE_DIR=str(tmp_path), MESHCHAIN_BACKEND="reference")
    done = subprocess.run([sys.executable, "-m", "meshchain", "info"], capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line[:16].strip(): line[16:].strip() for line in done.stdout.splitlines()}
    assert rows["meshchain"] == mc.__version__ and rows["numpy"] == np.__version__
    assert rows["numba"] == numba.__version__ and rows["mpi library"].startswith("MPICH")
    assert rows["backend"] == "reference" and rows["cache directory"] == str(tmp_path)
    assert rows["calibration"].startswith(f"none ({tmp_path}") and "cupy" in rows and "petsc4py" in rows


def test_the_overlap_phi_turns_the_papers_max_into_a_sum():
    from meshchain.model.equations import Machine, ca_segment_time, op2_loop_time

    terms = dict(g=1e-6, core=1000, iterations=1100, dats=1, neighbours=1, max_message=1000)
    full, none, half = (Machine(latency=5e-4, bandwidth=1e9, overlap=phi) for phi in (1.0, 0.0, 0.5))
    compute, message = 1e-3, 5e-4 + 1e-6
    assert math.isclose(op2_loop_time(machine=full, **terms), max(compute, message) + 1e-4)
    assert math.isclose(op2_loop_time(machine=none, **terms), compute + message + 1e-4)
    assert math.isclose(op2_loop_time(machine=half, **terms), compute + message - 0.5 * message + 1e-4)
    segment = dict(g=[1e-6], core=[1000], iterations=[1100], neighbours=1, max_message=1000)
    assert ca_segment_time(machine=none, **segment) > ca_segment_time(machine=full, **segment)
    with pytest.raises(mc.ConfigurationError, match="overlap"):
        Machine(latency=1e-6, bandwidth=1e9, overlap=1.5)
