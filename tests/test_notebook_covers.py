"""Every notebook opens with a picture of the engine's state (issue 43: the README says so): its
first cell shows ``docs/covers/<stem>.png`` under the title, and that PNG is byte for byte a
figure stored in the same notebook (``scripts/notebook_covers.py``, run by
``scripts/execute_notebooks.py``), so a cover never shows another run than the one beside it."""

import base64
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _covers():
    spec = importlib.util.spec_from_file_location("notebook_covers", ROOT / "scripts" / "notebook_covers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stored_pngs(nb: dict) -> list[bytes]:
    return [
        base64.b64decode(out["data"]["image/png"])
        for cell in nb["cells"]
        if cell["cell_type"] == "code"
        for out in cell.get("outputs", [])
        if "image/png" in out.get("data", {})
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_opens_with_a_cover_from_its_own_stored_run(path):
    nb = json.loads(path.read_text())
    first = "".join(nb["cells"][0]["source"])
    title, _, rest = first.partition("\n")
    assert title.startswith("# "), f"{path.name}: the first cell opens with its title"
    line = _covers().cover_line(path.stem)
    assert rest.lstrip("\n").startswith(line), (
        f"{path.name}: no cover under the title (scripts/notebook_covers.py)"
    )
    png = (ROOT / "docs" / "covers" / f"{path.stem}.png").read_bytes()
    assert png in _stored_pngs(nb), (
        f"{path.name}: docs/covers/{path.stem}.png is no figure of the stored run: "
        "python scripts/notebook_covers.py " + str(path.relative_to(ROOT))
    )


def test_the_cover_is_the_tagged_figure_else_the_first(tmp_path):
    covers = _covers()

    def fig(data: bytes, tags=()):
        return {
            "cell_type": "code",
            "metadata": {"tags": list(tags)},
            "outputs": [
                {"output_type": "display_data", "data": {"image/png": base64.b64encode(data).decode()}}
            ],
            "source": "",
            "execution_count": 1,
        }

    import nbformat

    nb = nbformat.from_dict(
        {
            "cells": [fig(b"first"), fig(b"second", ["cover"])],
            "metadata": {},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )
    assert covers.first_figure(nb) == b"second"
    nb.cells[1].metadata.tags = []
    assert covers.first_figure(nb) == b"first"
    nb.cells = []
    with pytest.raises(ValueError, match="execute the notebook first"):
        covers.first_figure(nb)
