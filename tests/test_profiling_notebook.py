"""The profiling notebook executes end to end (small sizes): a 2-rank Airfoil run profiled
through ``mpiexec``, its timeline drawn whole and zoomed, and its bandwidth bars, with the
summary naming Airfoil's loops."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "profiling.ipynb"

PROBE = """
import json
print("PROBE" + json.dumps({"summary": summary, "ranks": sorted({e["pid"] for e in events if e["ph"] == "X"}),
                            "window": [start, end], "iterations": len(iterations)}))
"""


@pytest.mark.timeout(300)
def test_the_profiling_notebook_executes_and_draws_the_run(monkeypatch, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("MESHCHAIN_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("MESHCHAIN_CACHE_DIR", os.environ.get("MESHCHAIN_TEST_CACHE_DIR", str(tmp_path)))
    monkeypatch.setenv("MESHCHAIN_MPI_CHILD", "1")  # as under the MPI harness: the notebook must not pass it on
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(notebook, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    notebook.cells.append(nbformat.v4.new_code_cell(PROBE))
    with client.setup_kernel():
        for index, cell in enumerate(notebook.cells):
            client.execute_cell(cell, index)
    probe = notebook.cells.pop()
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert not any(o.get("output_type") == "error" for cell in code for o in cell.outputs)
    images = [o for cell in code for o in cell.outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 3  # the whole run, one iteration, the bandwidth bars
    text = "".join(o.get("text", "") for cell in code for o in cell.outputs)
    assert "meshchain summary: 2 rank(s)" in text and "update" in text

    probed = "".join(o.get("text", "") for o in probe.outputs)
    found = json.loads(probed[probed.index("PROBE") + len("PROBE"):])
    assert found["ranks"] == [0, 1] and found["iterations"] == 3
    start, end = found["window"]
    assert 0 <= start < end
    summary = found["summary"]
    assert summary["ranks"] == 2
    assert {"save_soln", "adt_calc", "res_calc", "bres_calc", "update"} <= set(summary["loops"])
    update = summary["loops"]["update"]
    assert update["calls"] == 2 * 3 and update["bytes_moved"] > 0 and update["gbytes_per_second"] > 0


def test_the_committed_notebook_shows_its_outputs():
    """A reader on the web sees the executed notebook: every code cell has run, the plots are stored."""
    import nbformat

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in code)
    assert sum("image/png" in o.get("data", {}) for cell in code for o in cell.outputs) >= 3
    assert not any(o.get("output_type") == "error" for cell in code for o in cell.outputs)
    text = "".join(o.get("text", "") for cell in code for o in cell.outputs)
    assert "meshchain summary: 2 rank(s)" in text and "30x45" not in text  # run at full size
