"""Held-out validation of the model and robust timings, on injected numbers (no clocks)."""

from __future__ import annotations

import pytest

from meshchain import ConfigurationError
from meshchain.apps.report import format_table
from meshchain.model.profile import ChainProfile, LoopProfile, SegmentProfile
from meshchain.model.timing import measure_interleaved, spread_of, summarise
from meshchain.model.validate import calibration_rows, held_out, summary

G = 1e-8
O_R, O_L = 5e-6, 1e-6  # the overheads the calibration rows are built with


def _row(size, loops, per_loop, ca, *, noisy=False, spread=0.0, ranks=2, network="shm"):
    """A report row whose equations give ``loops * size * G`` both ways (every loop and the
    segment exchange with one neighbour, at no cost: ``L = 0``, empty messages), so what the
    measured times add is the overheads alone."""
    per_loop_profile = tuple(LoopProfile("a", core=size, iterations=size, dats=1, neighbours=1) for _ in range(loops))
    segment = (SegmentProfile(("a",) * loops, core=(size,) * loops, iterations=(size,) * loops, neighbours=1),)
    return {"workload": "w", "ranks": ranks, "network": network, "per_rank": size, "loops": loops,
            "per_loop": per_loop, "ca": ca, "noisy": noisy, "per_loop_spread": spread, "ca_spread": spread,
            "calibration": {"machine": {"latency": 0.0, "bandwidth": 1e9, "pack_cost": 0.0},
                            "loop_costs": {"a": G}},
            "profiles": [ChainProfile(per_loop_profile, segment).as_dict()] * ranks}


def _exact(size, loops):
    """Times the model with ``O_R``, ``O_L`` gives exactly (loop by loop, CA)."""
    work = loops * size * G
    return work + loops * (O_R + O_L), work + O_R + loops * O_L


def test_held_out_model_takes_each_execution_kinds_own_loop_costs():
    # the calibration rows computed CA at half the loop-by-loop rate: (1000, 2) is predicted with
    # G loop by loop and G / 2 in its segment, and the overheads still come out exact
    def row(size, loops, per_loop, ca):
        found = _row(size, loops, per_loop, ca)
        found["calibration"]["ca_loop_costs"] = {"a": G / 2}
        return found

    def exact(size, loops):
        per_loop, ca = _exact(size, loops)
        return per_loop, ca - loops * size * G / 2

    rows = [row(1000, 2, *exact(1000, 2)), row(4000, 8, *exact(4000, 8)), row(1000, 8, *exact(1000, 8)),
            row(4000, 2, *exact(4000, 2))]
    first = held_out(rows)[0]
    assert first["predicted_per_loop"] == pytest.approx(2 * 1000 * G + 2 * (O_R + O_L))
    assert first["predicted_ca"] == pytest.approx(2 * 1000 * G / 2 + O_R + 2 * O_L)
    assert first["held_out_machine"]["round_overhead"] == pytest.approx(O_R)
    assert first["error"] == pytest.approx(0.0, abs=1e-9)


def test_calibration_rows_differ_in_every_swept_dimension_and_skip_noisy_and_other_groups():
    rows = [_row(s, n, *_exact(s, n)) for s in (1000, 4000) for n in (2, 8)]
    rows.append(_row(9000, 4, *_exact(9000, 4), noisy=True))
    rows.append(_row(9000, 4, *_exact(9000, 4), network="tcp"))
    basis = calibration_rows(rows[0], rows)  # (1000, 2): only (4000, 8) qualifies; the noisy row does not
    assert [(r["per_rank"], r["loops"]) for r in basis] == [(4000, 8)]
    assert calibration_rows(rows[-1], rows) == []  # alone in its group: nothing to calibrate on


def test_held_out_error_is_computed_from_a_model_fitted_on_other_rows_only():
    # (1000, 2) measured 25 % faster CA; its model comes from (4000, 8) alone, whose times
    # are exact for O_R, O_L: predicted 3.2e-5 loop by loop, 2.7e-5 CA, a gain of 15.625 %.
    rows = [_row(1000, 2, 3.2e-5, 2.4e-5), _row(4000, 8, *_exact(4000, 8)),
            _row(1000, 8, *_exact(1000, 8)), _row(4000, 2, *_exact(4000, 2))]
    first = held_out(rows)[0]
    assert first["calibrated_on"] == 1
    assert first["predicted_per_loop"] == pytest.approx(3.2e-5)
    assert first["predicted_ca"] == pytest.approx(2.7e-5)
    assert first["held_out_machine"]["round_overhead"] == pytest.approx(O_R)
    assert first["held_out_machine"]["loop_overhead"] == pytest.approx(O_L)
    assert first["predicted_gain"] == pytest.approx(15.625)
    assert first["measured_gain"] == pytest.approx(25.0)
    assert first["error"] == pytest.approx(9.375)
    assert first["right_choice"] is True


def test_held_out_summary_counts_errors_wrong_choices_and_ties():
    rows = [_row(1000, 2, 3.2e-5, 3.3e-5, spread=0.05), _row(4000, 8, *_exact(4000, 8)),
            _row(1000, 8, *_exact(1000, 8)), _row(4000, 2, *_exact(4000, 2))]
    out = held_out(rows)
    # row 0: predicted +15.6 %, measured -3.1 %: a wrong choice, but within its 5 % spread (a tie)
    assert out[0]["right_choice"] is False and out[0]["tie"] is True
    assert out[0]["error"] == pytest.approx(15.625 + 100 * (3.3 / 3.2 - 1))
    # row 1 is calibrated on row 0 alone, whose CA run was the slower: the difference of its two
    # runs leaves no round overhead, so row 1 is predicted no gain (a wrong choice, spread 0: no tie)
    assert out[1]["held_out_machine"]["round_overhead"] == 0.0 and out[1]["predicted_gain"] == pytest.approx(0.0)
    assert out[1]["right_choice"] is False and out[1]["tie"] is False
    assert [r["right_choice"] for r in out[2:]] == [True, True]
    s = summary(out)
    assert s["rows"] == 4 and s["right_choices"] == 2 and s["right_or_tie"] == 3
    assert s["mean_error"] == pytest.approx(sum(r["error"] for r in out) / 4)
    assert s["worst_error"] == pytest.approx(out[0]["error"])


def test_spread_is_robust_to_one_outlier_and_zero_for_one_sample():
    assert spread_of([1.0]) == 0.0
    assert spread_of([1.0, 1.0, 1.0, 1.0, 100.0]) == 0.0
    assert summarise([1.0, 1.5, 2.0], threshold=0.1).noisy


def test_a_noisy_timing_is_measured_again_up_to_the_limit_and_the_quietest_attempt_is_kept():
    calls = {"loop": 0, "ca": 0}
    # 'ca' is disturbed in every attempt, least in the second one
    ca_samples = iter([1, 5, 9, 1, 1.2, 1.4, 1, 3, 5])

    def take(name):
        calls[name] += 1
        return 1.0 if name == "loop" else float(next(ca_samples))

    timings = measure_interleaved({"loop": lambda: take("loop"), "ca": lambda: take("ca")}, repeats=3,
                                  threshold=0.1, max_attempts=3)
    assert calls == {"loop": 9, "ca": 9}  # three attempts, both variants every time
    assert timings["ca"].samples == (1.0, 1.2, 1.4) and timings["ca"].noisy
    assert timings["ca"].attempts == 3 and timings["loop"].median == 1.0


def test_a_quiet_timing_is_measured_once():
    calls = []
    timings = measure_interleaved({"x": lambda: calls.append(1) or 2.0}, repeats=4, threshold=0.1)
    assert len(calls) == 4 and timings["x"].median == 2.0 and not timings["x"].noisy


@pytest.mark.parametrize("options", [dict(repeats=0), dict(max_attempts=0), dict(threshold=0.0)])
def test_bad_timing_options_are_refused(options):
    with pytest.raises(ConfigurationError, match="timing"):
        measure_interleaved({"x": lambda: 1.0}, **options)


def test_the_report_table_marks_noisy_rows():
    row = dict(workload="synthetic", ranks=2, per_rank=1000, loops=8, per_loop_bytes=1, ca_bytes=1, per_loop_core=1,
               per_loop_iterations=1, ca_core=1, ca_iterations=1, comm_reduction=0.0, comp_increase=0.0,
               paper_gain=0.0, predicted_gain=1.0, predicted_per_loop=1e-3, predicted_ca=1e-3, per_loop=1e-3,
               ca=1e-3, measured_gain=-3.0, equal=True, per_loop_spread=0.3, ca_spread=0.01)
    quiet, noisy = format_table([dict(row, noisy=False), dict(row, noisy=True)]).splitlines()[2:]
    assert "30.0" in quiet and "-3.0 " in quiet + " " and "-3.0*" not in quiet
    assert "-3.0*" in noisy
