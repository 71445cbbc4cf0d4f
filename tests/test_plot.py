"""``meshchain.plot``: the timeline draws one bar per event of a real profile, in one lane per
rank and thread; the bandwidth bars come from a real summary, beside the copy bandwidth; bad
input is refused with a message that says what was expected."""

from __future__ import annotations

import json
import sys

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

import meshchain as mc  # noqa: E402
from meshchain import plot  # noqa: E402
from meshchain.apps import airfoil  # noqa: E402
from meshchain.meshes import naca0012  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::meshchain.MeshchainWarning")


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def profiled(tmp_path_factory, meshchain_cache_dir):
    """A small Airfoil profiled on one process: two iterations, the first with its builds (the
    reference backend: nothing to compile, whatever the cache holds). Made once: the record
    and the summary are plain data."""
    mc.reset_runtime(cache_dir=meshchain_cache_dir, backend="reference")
    problem = airfoil.declare(naca0012(20, 30))
    with mc.profile(tmp_path_factory.mktemp("profile") / "trace.json") as profile:
        airfoil.run(problem, 2, out=None, ca=True)
    summary = mc.stats(summary=True)
    mc.reset_runtime(cache_dir=meshchain_cache_dir)
    return profile, summary


def rectangles(ax):
    return [p for p in ax.patches if isinstance(p, Rectangle)]


def complete(events, categories=plot.CATEGORIES):
    return [e for e in events if e["ph"] == "X" and e["cat"] in categories]


def test_the_timeline_draws_one_rectangle_per_event_of_a_real_profile(profiled):
    profile, _ = profiled
    events = complete(profile.events)
    assert {e["cat"] for e in events} >= {"unit", "phase", "build"}
    for trace in (profile, profile.path, json.loads(profile.path.read_text()), profile.events):
        ax = plot.timeline(trace)
        assert len(rectangles(ax)) == len(events)
        assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0"]
        assert ax.get_xlabel() == "time (ms)"
        runs = [p for p in rectangles(ax) if not p.get_fill()]
        assert len(runs) == len(complete(events, ("unit",)))  # the runs are outlined, the rest filled
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "run of a loop or chain" in legend and plot.KINDS["core"][1] in legend


def test_the_timeline_draws_the_categories_and_the_window_asked_for(profiled):
    profile, _ = profiled
    events = complete(profile.events)
    phases = complete(events, ("phase",))
    assert len(rectangles(plot.timeline(profile, categories=["phase"]))) == len(phases)
    assert len(rectangles(plot.timeline(profile, categories="phase"))) == len(phases)
    run = [e for e in events if e["cat"] == "unit"][-1]
    start, end = run["ts"] / 1e3, (run["ts"] + run["dur"]) / 1e3
    ax = plot.timeline(profile, start=start, end=end)
    inside = [e for e in events if e["ts"] / 1e3 <= end and (e["ts"] + e["dur"]) / 1e3 >= start]
    assert 2 <= len(rectangles(ax)) == len(inside) < len(events)
    assert tuple(ax.get_xlim()) == pytest.approx((start, end))


def test_nested_events_are_drawn_lower_and_above_what_encloses_them(profiled):
    profile, _ = profiled
    ax = plot.timeline(profile, categories=["unit", "phase"])
    runs = [p for p in rectangles(ax) if not p.get_fill()]
    phases = [p for p in rectangles(ax) if p.get_fill()]
    assert runs and phases
    assert max(p.get_height() for p in phases) < min(p.get_height() for p in runs)
    assert min(p.get_zorder() for p in phases) > max(p.get_zorder() for p in runs)


def test_one_lane_per_rank_and_thread_with_each_kind_in_its_colour():
    def event(name, cat, ts, pid, tid=0, **args):
        return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": 10, "pid": pid, "tid": tid, "args": args}

    events = [{"name": "process_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}} for r in (0, 1)]
    events += [{"name": "thread_name", "ph": "M", "pid": 1, "tid": t, "args": {"name": n}}
               for t, n in ((0, "main"), (1, "thread 1"))]
    events += [event("rk: core", "phase", 0, 0, phase="core"), event("rk: halo", "phase", 10, 0, phase="halo"),
               event("rk: post", "exchange", 0, 1), event("rk: wait", "exchange", 10, 1),
               event("rk: boundary tasks", "phase", 0, 1, 1, phase="tasks"), event("compile f", "compile", 20, 1, 1)]
    ax = plot.timeline(events)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1 main", "rank 1 thread 1"]
    colours = [matplotlib.colors.to_hex(p.get_facecolor()) for p in rectangles(ax)]
    expected = ["core", "halo", "post", "wait", "boundary", "build/compile"]
    assert sorted(colours) == sorted(plot.KINDS[k][0] for k in expected)
    assert len(set(colours)) == len(expected)


def test_the_bandwidth_bars_of_a_real_summary_beside_the_copy_bandwidth(profiled):
    _, summary = profiled
    measured = {name: row for name, row in summary.loops.items() if row.compute_max > 0}
    assert "update" in measured
    for given in (summary, json.loads(json.dumps(summary.as_dict()))):
        ax = plot.bandwidth(given)
        assert len(rectangles(ax)) == len(measured)
        names = [t.get_text() for t in ax.get_yticklabels()]
        assert names == sorted(measured, key=lambda n: -measured[n].time_max)  # the slowest loop on top
        widths = {name: bar.get_width() for name, bar in zip(names, sorted(rectangles(ax), key=lambda b: b.get_y()))}
        assert widths == pytest.approx({n: r.gbytes_per_second for n, r in measured.items()})
        copy = [line for line in ax.get_lines() if line.get_label().startswith("copy")]
        assert len(copy) == 1 and copy[0].get_xdata()[0] == pytest.approx(summary.copy_bandwidth / 1e9)


def test_on_several_ranks_the_copy_bandwidth_is_drawn_per_rank_and_for_all_ranks():
    summary = {"ranks": 2, "copy_bandwidth": 5e9, "loops": {"a": {"gbytes_per_second": 7.0, "time_max": 1.0}}}
    lines = {line.get_label(): line.get_xdata()[0] for line in plot.bandwidth(summary).get_lines()}
    assert lines == {"copy 5.0 GB/s per rank": 5.0, "2 ranks x copy: 10.0 GB/s": 10.0}


def test_drawing_into_a_given_axes():
    fig, (top, bottom) = plt.subplots(2)
    events = [{"name": "loop a", "cat": "unit", "ph": "X", "ts": 0, "dur": 5, "pid": 0, "tid": 0}]
    assert plot.timeline(events, ax=top) is top
    summary = {"loops": {"a": {"gbytes_per_second": 1.0, "time_max": 1.0}}, "copy_bandwidth": 0}
    assert plot.bandwidth(summary, ax=bottom) is bottom
    assert not bottom.get_lines()  # no copy bandwidth known: no line


@pytest.mark.parametrize("trace, message", [
    (42, "not int"),
    ({"events": []}, "traceEvents"),
    ([{"name": "a", "ph": "X", "ts": 0, "dur": -1, "pid": 0, "tid": 0}], r"not a meshchain trace: event 0 \(a\): dur"),
    ([], "no events to draw"),
])
def test_the_timeline_refuses_what_is_not_a_trace(trace, message):
    with pytest.raises(mc.ConfigurationError, match=message):
        plot.timeline(trace)


def test_the_timeline_refuses_missing_or_unreadable_files_and_bad_options(tmp_path):
    with pytest.raises(mc.ConfigurationError, match="there is no trace file .*missing.json"):
        plot.timeline(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(mc.ConfigurationError, match="cannot read the trace .*bad.json as trace-event JSON"):
        plot.timeline(str(tmp_path / "bad.json"))
    events = [{"name": "loop a", "cat": "unit", "ph": "X", "ts": 0, "dur": 5, "pid": 0, "tid": 0}]
    with pytest.raises(mc.ConfigurationError, match=r"unknown event categories \['phases'\]"):
        plot.timeline(events, categories=["phases"])
    with pytest.raises(mc.ConfigurationError, match="the time window is empty"):
        plot.timeline(events, start=2.0, end=1.0)


@pytest.mark.parametrize("summary, message", [
    ("summary", "mc.stats\\(summary=True\\).*not str"),
    ({"loops": {"a": {"time_max": 1.0}}}, "loop 'a' of the summary has no bandwidth"),
    ({"loops": {"a": {"gbytes_per_second": float("nan")}}}, "no loop with a measured bandwidth"),
])
def test_the_bandwidth_bars_refuse_what_is_not_a_summary(summary, message):
    with pytest.raises(mc.ConfigurationError, match=message):
        plot.bandwidth(summary)


def test_without_matplotlib_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)  # import matplotlib.pyplot fails
    events = [{"name": "loop a", "cat": "unit", "ph": "X", "ts": 0, "dur": 5, "pid": 0, "tid": 0}]
    with pytest.raises(mc.ConfigurationError, match="pip install matplotlib"):
        plot.timeline(events)
