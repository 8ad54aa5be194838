"""Every script and notebook imports ``workbench`` before ``mlx`` or ``mlx_lm``: ``import
workbench`` loads an optimized BLAS before MLX (:mod:`workbench.runtime.blas`), and a process
that imports MLX first keeps MLX's reference BLAS on Linux (about 10x slower CPU matmuls, and a
warning). ``scripts/ruff.toml`` orders the scripts' imports so (first-party before third-party).

Import statements are taken in the order they run: a script's lines top to bottom (an import
inside a function counts where it is written), a notebook's code cells in order, each cell's
IPython magics translated to Python first.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

ROOT = Path(__file__).resolve().parents[1]
MLX_PACKAGES = {"mlx", "mlx_lm"}


def imported_roots(code: str) -> list[tuple[int, str]]:
    """``(line, top-level package)`` of every absolute import in ``code``, in line order.

    >>> imported_roots("import os\\nfrom mlx_lm import load\\ndef f():\\n    import workbench.views")
    [(1, 'os'), (2, 'mlx_lm'), (4, 'workbench')]
    """
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return sorted(found)


def mlx_before_workbench(roots: list[str]) -> str | None:
    """Why ``roots`` (imported packages in the order they run) break the rule, or ``None``:
    the first ``mlx``/``mlx_lm`` import must come after a ``workbench`` import."""
    for root in roots:
        if root == "workbench":
            return None
        if root in MLX_PACKAGES:
            return f"imports {root} before workbench"
    return None


def notebook_code(path: Path) -> str:
    """The notebook's code cells as one Python text, magics translated (``%matplotlib`` etc.)."""
    cells = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    transform = TransformerManager().transform_cell
    return "\n".join(transform(source) for source in cells)


SCRIPTS = sorted((ROOT / "scripts").rglob("*.py"))
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_the_rule_finds_mlx_first_and_accepts_workbench_first():
    bad = "import mlx.core as mx\nimport workbench as wb\n"
    assert mlx_before_workbench([r for _, r in imported_roots(bad)]) == "imports mlx before workbench"
    late = "import os\nfrom workbench.bench import files\nfrom mlx_lm import load\n"
    assert mlx_before_workbench([r for _, r in imported_roots(late)]) is None
    assert mlx_before_workbench(["numpy", "pandas"]) is None
    assert "import mlx" in notebook_code(ROOT / "notebooks" / "11_divergence_by_layer.ipynb")


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_script_imports_workbench_before_mlx(path):
    assert len(SCRIPTS) >= 40
    why = mlx_before_workbench([root for _, root in imported_roots(path.read_text())])
    assert why is None, f"{path.relative_to(ROOT)} {why}: put `import workbench` first"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_imports_workbench_before_mlx(path):
    assert len(NOTEBOOKS) >= 18
    why = mlx_before_workbench([root for _, root in imported_roots(notebook_code(path))])
    assert why is None, f"{path.name} {why}: put `import workbench as wb` first in its first code cell"
