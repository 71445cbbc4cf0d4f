"""The profitability notebook executes end to end (small sizes)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "chain_profitability.ipynb"


@pytest.mark.timeout(900)
def test_chain_profitability_notebook_executes(monkeypatch, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("MESHCHAIN_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("MESHCHAIN_CACHE_DIR", os.environ.get("MESHCHAIN_TEST_CACHE_DIR", str(tmp_path)))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(o.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                      for o in cell.get("outputs", []))
    assert "synthetic" in outputs and "airfoil" in outputs
    assert "prediction error of the gain" in outputs
    images = [o for cell in notebook.cells for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 2  # the gain plot and the scatter plot
