"""notebooks/compare_drafters.ipynb is executed on the tiny target so it never rots."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "compare_drafters.ipynb"


def test_notebook_executes() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    os.environ["SPECDRAFT_NOTEBOOK_TARGET"] = "tiny_random"
    os.environ["SPECDRAFT_NOTEBOOK_MAX_NEW"] = "12"
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": str(NOTEBOOK.parent.parent)}}).execute()
    finally:
        for key in ("SPECDRAFT_NOTEBOOK_TARGET", "SPECDRAFT_NOTEBOOK_MAX_NEW"):
            os.environ.pop(key, None)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the plots were drawn
    text = "".join(o.get("text", "") for o in outputs)
    assert "num_draft_tokens=1: speedup" in text and "optimal gamma" in text
