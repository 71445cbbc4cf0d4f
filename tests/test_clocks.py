"""The clocks compiled code times itself with (``comm/by_address.py``): the time-stamp counter
where the machine keeps time by it, else ``clock_gettime``; and the stamps a compiled replay
reads (``backends/numba_replay.py``)."""

from __future__ import annotations

import time

import pytest

from meshchain.backends.numba_replay import replay_source
from meshchain.comm import by_address


@pytest.fixture
def fresh_rate():
    """:func:`by_address.cycle_seconds` measured again in the test (and again after it)."""
    by_address.cycle_seconds.cache_clear()
    yield
    by_address.cycle_seconds.cache_clear()


def test_the_counter_read_at_its_measured_rate_agrees_with_perf_counter(fresh_rate):
    """Over 50 ms, ticks times the measured seconds per tick equal ``time.perf_counter``'s
    seconds to 0.1 % (both clocks read the same interval: no time is asserted)."""
    tick = by_address.cycle_seconds()
    if tick is None:
        pytest.skip("the time-stamp counter is not trusted on this machine (compiled code reads clock_gettime)")
    first, began = by_address.read_ticks(), time.perf_counter()
    time.sleep(0.05)
    last, ended = by_address.read_ticks(), time.perf_counter()
    assert (last - first) * tick == pytest.approx(ended - began, rel=1e-3)


@pytest.mark.parametrize("machine, source, flags", [
    ("aarch64", "tsc", "constant_tsc nonstop_tsc"),  # another processor: its counter instruction may trap
    ("x86_64", "kvm-clock", "constant_tsc nonstop_tsc"),  # the kernel does not keep time by the counter
    ("x86_64", "tsc", "constant_tsc"),  # the counter may stop in deep sleep
])
def test_the_counter_is_not_used_where_it_may_not_count_wall_time(fresh_rate, monkeypatch, tmp_path, machine,
                                                                 source, flags):
    clocksource, cpuinfo = tmp_path / "clocksource", tmp_path / "cpuinfo"
    clocksource.write_text(source + "\n")
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: fpu tsc {flags}\n")
    monkeypatch.setattr(by_address.platform, "machine", lambda: machine)
    monkeypatch.setattr(by_address, "_CLOCKSOURCE", str(clocksource))
    monkeypatch.setattr(by_address, "_CPUINFO", str(cpuinfo))
    assert by_address.counter_is_steady() is False
    assert by_address.cycle_seconds() is None


def test_the_counter_is_used_where_the_kernel_keeps_time_by_a_steady_one(fresh_rate, monkeypatch, tmp_path):
    clocksource, cpuinfo = tmp_path / "clocksource", tmp_path / "cpuinfo"
    clocksource.write_text("tsc\n")
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu tsc constant_tsc nonstop_tsc\n")
    monkeypatch.setattr(by_address.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(by_address, "_CLOCKSOURCE", str(clocksource))
    monkeypatch.setattr(by_address, "_CPUINFO", str(cpuinfo))
    assert by_address.counter_is_steady() is True


def test_a_replay_reads_the_clock_it_was_written_for():
    program = [("stamp", 0), ("call", 0), ("stamp", 1)]
    by_counter = replay_source(["(int64,)"], 0, program, ticks=True)
    by_clock = replay_source(["(int64,)"], 0, program, ticks=False)
    assert by_counter.count("_mc_ticks()") == 2 and "_mc_clock(_mc_functions" not in by_counter
    assert by_clock.count("_mc_clock(_mc_functions, _mc_scratch)") == 2 and "_mc_ticks()" not in by_clock
