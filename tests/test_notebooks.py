"""Execute the notebooks on CPU (small settings) so they cannot rot."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from specjax import assets
from specjax.errors import AssetsMissing

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
# 01 needs the real SmolLM2 (`assets`: skipped until fetched). On a CPU host the notebooks' kernels inherit the
# tests' XLA level (tests/conftest.py): 01 and 03 (which trains) keep XLA's defaults; 02 (a tiny model) takes
# the fast compiles.
MARKS = {"01_quickstart.ipynb": pytest.mark.assets, "03_train_head.ipynb": pytest.mark.execution_bound}


@pytest.mark.parametrize("path", [pytest.param(p, marks=MARKS.get(p.name, ()), id=p.name) for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch, request):
    if request.node.get_closest_marker("assets"):
        try:
            assets.asset_path("smollm2-135m-instruct")
        except AssetsMissing as e:  # asset_path raises rather than return a missing path
            pytest.skip(f"SmolLM2 GGUF not fetched ({e}; `make test` fetches it)")
    monkeypatch.setenv("SPECJAX_NOTEBOOK_SMALL", "1")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
