"""Each notebook opens with a picture of the engine's state: its cover, the notebook's own first
stored figure (from its last execution; a code cell tagged ``cover`` picks another), shown
under the title of its first cell.

Usage: ``python scripts/notebook_covers.py [notebooks/NN.ipynb ...]`` (default: every notebook).
``scripts/execute_notebooks.py`` calls :func:`write_cover` after executing a notebook, so a
cover is always a figure of the run stored beside it; ``tests/test_notebook_covers.py`` checks
that (byte for byte).

Writes ``docs/covers/<notebook stem>.png`` and the line ``![...](../docs/covers/<stem>.png)``
after the first cell's ``# title`` line (once; rewritten in place on later runs).
"""

from __future__ import annotations

import base64
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
COVERS = ROOT / "docs" / "covers"
ALT = "a figure of this notebook's stored run"
LINE = re.compile(r"^!\[[^\]]*\]\(\.\./docs/covers/[^)]*\.png\)\n?", re.MULTILINE)


def first_figure(nb) -> bytes:
    """The PNG bytes of the notebook's cover: the first stored ``image/png`` output of the
    first code cell tagged ``cover``, else of the whole notebook.

    Raises:
        ValueError: the notebook has no stored figure (execute it first).
    """
    code = [c for c in nb.cells if c.cell_type == "code"]
    tagged = [c for c in code if "cover" in c.get("metadata", {}).get("tags", [])]
    for cell in tagged + code:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "image/png" in data:
                return base64.b64decode(data["image/png"])
    raise ValueError("no stored image/png output: execute the notebook first")


def cover_line(stem: str) -> str:
    """The markdown line that shows notebook ``stem``'s cover (relative to ``notebooks/``)."""
    return f"![{ALT}](../docs/covers/{stem}.png)"


def write_cover(path: Path) -> Path:
    """Write ``path``'s cover PNG and put its line under the first cell's title; returns the PNG's path.

    Raises:
        ValueError: no stored figure, or the first cell is not a markdown cell opening with ``# ``.
    """
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    if first.cell_type != "markdown" or not first.source.startswith("# "):
        raise ValueError(f"{path}: the first cell must be markdown opening with '# title'")
    png = COVERS / f"{path.stem}.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    png.write_bytes(first_figure(nb))
    title, _, rest = LINE.sub("", first.source).partition("\n")
    first.source = f"{title}\n\n{cover_line(path.stem)}\n{rest}"
    first.source = re.sub(r"\n{3,}", "\n\n", first.source)
    nbformat.write(nb, path)
    return png


if __name__ == "__main__":
    for name in sys.argv[1:] or sorted(str(p) for p in (ROOT / "notebooks").glob("*.ipynb")):
        print(f"cover {write_cover(Path(name)).relative_to(ROOT)}")
