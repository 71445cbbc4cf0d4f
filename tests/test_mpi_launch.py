"""The parent's view of a child run of the MPI test harness (``meshchain.testing.launch``),
with a stand-in child: a Python script that writes the records a rank would write."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from meshchain.testing.launch import MISSING_FILE, ChildRun


def start(tmp_path: Path, script: str, nodeids, nprocs: int = 2) -> ChildRun:
    """A run of ``script`` (given ``record(nodeid, rank, outcome="passed")``, ``everywhere(nodeid,
    outcome="passed")`` for both ranks, and ``os``)."""
    directory = tmp_path / "run"
    directory.mkdir()
    prelude = textwrap.dedent(f"""
        import json, os, sys, time
        from pathlib import Path
        DIRECTORY = Path({str(directory)!r})
        def record(nodeid, rank, outcome="passed"):
            line = json.dumps({{"nodeid": nodeid, "rank": rank, "size": 2, "outcome": outcome,
                                "reason": "why" if outcome == "skipped" else None}})
            with open(DIRECTORY / f"rank{{rank}}.jsonl", "a") as records:
                records.write(line + "\\n")
        def everywhere(nodeid, outcome="passed"):
            for rank in (0, 1):
                record(nodeid, rank, outcome)
    """)
    command = [sys.executable, "-c", prelude + textwrap.dedent(script)]
    return ChildRun(command, env=None, cwd=tmp_path, nodeids=nodeids, nprocs=nprocs, directory=directory)


def test_items_done_on_every_rank_pass_and_the_item_where_the_run_ended_gets_its_output(tmp_path):
    run = start(tmp_path, """
        everywhere("a")
        while not (DIRECTORY / "go").exists():  # the parent has seen that a is done
            time.sleep(0.01)
        print("output of b")
        record("b", 0)  # rank 1 never finishes b
        sys.exit(3)
    """, ["a", "b", "c"])
    assert run.covers("a") and not run.covers("b")  # items are waited for in order
    first = run.wait("a", limit=60)
    assert [r["rank"] for r in first.records] == [0, 1] and not first.timed_out and not first.last
    (run.directory / "go").touch()
    assert run.covers("b")  # b is next; if the run ends while doing it, b gets the failure
    second = run.wait("b", limit=60)
    assert len(second.records) == 1 and second.returncode == 3
    assert "output of b" in second.output
    assert run.covers("c")
    run.close()
    assert not run.directory.exists()


def test_a_run_that_finished_its_items_before_the_parent_asked_still_gives_them(tmp_path):
    run = start(tmp_path, """
        everywhere("a")
        everywhere("b", "skipped")
    """, ["a", "b"])
    run.proc.wait(timeout=60)
    assert len(run.wait("a", limit=60).records) == 2
    result = run.wait("b", limit=60)
    assert [r["outcome"] for r in result.records] == ["skipped", "skipped"]
    assert result.last and result.returncode == 0
    run.close()


def test_an_item_the_parent_does_not_wait_for_ends_the_use_of_the_run(tmp_path):
    # the parent skipped b (a skip marker, xfail(run=False)): c must not be blamed for what
    # the child did in b, so c is not this run's to give
    run = start(tmp_path, """
        everywhere("a")
        time.sleep(300)
    """, ["a", "b", "c"])
    assert len(run.wait("a", limit=60).records) == 2
    assert not run.covers("c")
    with pytest.raises(ValueError, match="not the next item"):
        run.wait("c", limit=60)
    run.close()


def test_the_last_item_waits_for_the_run_to_exit_and_carries_its_exit_status(tmp_path):
    run = start(tmp_path, """
        everywhere("a")
        time.sleep(0.3)  # finalizing
        os._exit(7)
    """, ["a"])
    result = run.wait("a", limit=60)
    assert len(result.records) == 2 and result.last and result.returncode == 7
    run.close()


def test_the_wall_clock_kills_the_run_and_fails_only_the_item_that_ran_over(tmp_path):
    run = start(tmp_path, """
        everywhere("a")
        time.sleep(300)
    """, ["a", "b", "c"])
    assert len(run.wait("a", limit=60).records) == 2
    began = time.monotonic()
    result = run.wait("b", limit=1)
    assert result.timed_out and result.returncode is None and result.records == []
    assert time.monotonic() - began < 15
    assert run.proc.poll() is not None
    run.close()


def test_an_item_the_child_did_not_collect_is_reported_at_once(tmp_path):
    run = start(tmp_path, f"""
        (DIRECTORY / {MISSING_FILE!r}).write_text(json.dumps(["b"]))
        everywhere("a")
        time.sleep(300)
    """, ["a", "b"])
    assert len(run.wait("a", limit=60).records) == 2
    result = run.wait("b", limit=60)
    assert result.missing and not result.timed_out
    assert run.proc.poll() is None  # the run goes on with its other items
    began = time.monotonic()
    run.close()  # a run still going is killed
    assert time.monotonic() - began < 15


@pytest.mark.parametrize("partial", ['{"nodeid": "a", "ra', ""])
def test_a_record_being_written_is_not_read(tmp_path, partial):
    run = start(tmp_path, f"""
        record("a", 0)
        with open(DIRECTORY / "rank1.jsonl", "a") as records:
            records.write({partial!r})
    """, ["a"])
    result = run.wait("a", limit=60)
    assert [r["rank"] for r in result.records] == [0] and result.returncode == 0
    run.close()
