"""Execute the notebooks on CPU (small settings) so they cannot rot."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from specjax import assets
from specjax.errors import AssetsMissing

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
MARKS = {"01_quickstart.ipynb": pytest.mark.assets}  # 01 needs the real SmolLM2 (skipped until fetched)


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
