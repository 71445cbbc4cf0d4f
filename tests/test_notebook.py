"""The profitability notebook executes end to end (small sizes), and what it measured is
plausible: a disturbed timing taken as the truth, or a plot of garbage, fails here."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "chain_profitability.ipynb"

# What the notebook's rows must satisfy: gains are 1 - T_ca / T_loop in percent, so at most 100;
# CA slower than 5x loop by loop on these small chains means a timing was disturbed.
PLAUSIBLE_GAIN = (-400.0, 100.0)

PROBE = """
import json
print("PROBE" + json.dumps([{k: r[k] for k in ("workload", "per_loop", "ca", "measured_gain", "predicted_gain",
                                                "per_loop_spread", "ca_spread", "noisy", "equal")}
                            for r in rows + vertex_rows + airfoil_rows + mgcfd_rows]))
print("KRYLOV" + json.dumps(krylov_rows))
"""


@pytest.mark.alone  # measures CA against loop by loop: runs when no MPI test runs beside it
@pytest.mark.timeout(900)
def test_chain_profitability_notebook_executes_with_plausible_gains(monkeypatch, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("MESHCHAIN_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("MESHCHAIN_CACHE_DIR", os.environ.get("MESHCHAIN_TEST_CACHE_DIR", str(tmp_path)))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    notebook.cells.append(nbformat.v4.new_code_cell(PROBE))  # run in the notebook's kernel, after it
    with client.setup_kernel():
        for index, cell in enumerate(notebook.cells):
            client.execute_cell(cell, index)
    probe = notebook.cells.pop()
    outputs = "".join(o.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                      for o in cell.get("outputs", []))
    assert "synthetic" in outputs and "vertex" in outputs and "airfoil" in outputs and "mgcfd" in outputs
    assert "held-out prediction error of the gain" in outputs
    assert "Krylov model: predicted / measured time per iteration" in outputs and "the model chose sstep-cg" in outputs
    images = [o for cell in notebook.cells for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 5  # the synthetic, vertex and MG-CFD gain plots, the scatter plot and the Krylov model's

    text = "".join(o.get("text", "") for o in probe.outputs)
    krylov = json.loads(text[text.index("KRYLOV") + len("KRYLOV"):])
    text = text[:text.index("KRYLOV")]
    rows = json.loads(text[text.index("PROBE") + len("PROBE"):])
    assert {r["network"] for r in krylov} == {"shm", "tcp"}
    for r in krylov:  # predicted and measured seconds per iteration of converged solves
        assert r["converged"] and 0 < r["measured"] < 1 and 0 < r["predicted"] < 1, r
    for network in ("shm", "tcp"):
        assert sum(r["chosen"] for r in krylov if r["network"] == network) == 1
    assert {r["workload"] for r in rows} == {"synthetic", "vertex", "airfoil", "mgcfd"}
    for r in rows:
        assert r["equal"]
        assert r["per_loop"] > 0 and r["ca"] > 0 and math.isfinite(r["per_loop"]) and math.isfinite(r["ca"])
        assert math.isfinite(r["measured_gain"]) and math.isfinite(r["predicted_gain"])
        low, high = PLAUSIBLE_GAIN
        assert low < r["measured_gain"] <= high, r
        assert low < r["predicted_gain"] <= high, r
        assert r["per_loop_spread"] >= 0 and r["ca_spread"] >= 0


def test_the_committed_notebook_shows_its_outputs():
    """A reader on the web sees the executed notebook: every code cell has run, the plots are stored."""
    import nbformat

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in code)
    assert sum("image/png" in o.get("data", {}) for cell in code for o in cell.outputs) >= 5
    assert not any(o.get("output_type") == "error" for cell in code for o in cell.outputs)
    text = "".join(o.get("text", "") for cell in code for o in cell.outputs)
    assert "MESHCHAIN_NOTEBOOK_SMALL" not in text and "held-out prediction error" in text
    assert "Krylov model: predicted / measured" in text
