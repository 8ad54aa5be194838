"""Every notebook ends a concept with an exercise whose solution nbval runs (issue 43: "per
notebook, one or two exercises with their solutions in collapsed cells that nbval executes").

An exercise is a markdown cell that opens with ``**Exercise.**`` (the question), followed at once by
its solution: a code cell whose source and output JupyterLab shows collapsed (cell metadata
``"jupyter": {"source_hidden": true, "outputs_hidden": true}``), that opens with ``# Solution`` and
checks its answer against the engine with ``assert`` (so nbval fails where the answer does not
hold). nbval executes every code cell that is not marked ``nbval-skip`` (tag or ``# NBVAL_SKIP``);
an ``nbval-ignore-output`` solution still runs its asserts. Its stored output holds no error.
The docs index (``docs/README.md``, its "Exercises" section) lists every notebook's exercise.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from nbval.plugin import find_comment_markers, find_metadata_tags

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXERCISE = "**Exercise.**"


def executed_by_nbval(cell) -> bool:
    """True when nbval runs this code cell (no ``nbval-skip`` tag or ``# NBVAL_SKIP`` comment)."""
    options = dict(find_comment_markers(cell.source))
    options.update(dict(find_metadata_tags(cell.metadata)))
    return not options.get("skip", False)


def asserts(source: str) -> int:
    """How many ``assert`` statements the cell's Python has (IPython magics, ``%...``, left out)."""
    python = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    return sum(isinstance(node, ast.Assert) for node in ast.walk(ast.parse(python)))


def exercise_problems(nb) -> tuple[int, list[str]]:
    """``(exercises, problems)``: how many well-formed exercises ``nb`` has, and ``cell N: what``
    for every exercise whose solution cell is missing, shown, not run by nbval or unchecked
    (cells numbered from 0 over all cells, as JupyterLab's cell index)."""
    found, problems = 0, []
    for n, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown" or not cell.source.lstrip().startswith(EXERCISE):
            continue
        solution = nb.cells[n + 1] if n + 1 < len(nb.cells) else None
        if solution is None or solution.cell_type != "code":
            problems.append(f"cell {n}: the exercise is not followed by a code cell (its solution)")
            continue
        hidden = solution.metadata.get("jupyter", {})
        wrong = [
            "its source is shown (needs metadata jupyter.source_hidden: true)"
            * (not hidden.get("source_hidden")),
            "its output is shown (needs metadata jupyter.outputs_hidden: true)"
            * (not hidden.get("outputs_hidden")),
            "it does not open with '# Solution'" * (not solution.source.lstrip().startswith("# Solution")),
            "nbval skips it" * (not executed_by_nbval(solution)),
            "it asserts nothing, so nbval cannot fail on a wrong answer" * (not asserts(solution.source)),
            "it was not executed (no stored output)" * (not solution.outputs),
            "its stored output is an error" * any(o.output_type == "error" for o in solution.outputs),
        ]
        wrong = [w for w in wrong if w]
        if wrong:
            problems.append(f"cell {n + 1}: " + "; ".join(wrong))
        else:
            found += 1
    return found, problems


def test_the_check_counts_a_collapsed_asserting_solution_and_names_what_is_wrong_with_others():
    question = lambda: nbformat.v4.new_markdown_cell(f"{EXERCISE} How many rows?")  # noqa: E731
    hidden = {"jupyter": {"source_hidden": True, "outputs_hidden": True}}
    printed = nbformat.v4.new_output("stream", name="stdout", text="3 rows\n")

    def solution(source, metadata=hidden, outputs=(printed,)):
        cell = nbformat.v4.new_code_cell(source, metadata=dict(metadata))
        cell.outputs = list(outputs)
        return cell

    good = "# Solution\nassert snap.batch_size == 3\nprint('3 rows')"
    nb = nbformat.v4.new_notebook(
        cells=[
            question(),
            solution(good),
            question(),
            solution("# Solution\nprint(snap.batch_size)"),
            question(),
            solution(good, metadata={}),
            question(),
            solution("# Solution\n# NBVAL_SKIP\nassert snap.batch_size == 3"),
            question(),
            solution(good, outputs=[nbformat.v4.new_output("error", ename="AssertionError", evalue="")]),
            question(),
            nbformat.v4.new_markdown_cell("the answer: 3"),
        ]
    )
    found, problems = exercise_problems(nb)
    assert found == 1
    assert [p.split(":")[0] for p in problems] == ["cell 3", "cell 5", "cell 7", "cell 9", "cell 10"]
    assert "asserts nothing" in problems[0]
    assert "source is shown" in problems[1] and "output is shown" in problems[1]
    assert "nbval skips it" in problems[2] and "error" in problems[3] and "not followed" in problems[4]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_notebook_has_an_exercise_with_a_collapsed_solution_that_nbval_checks(path):
    assert len(NOTEBOOKS) >= 19
    found, problems = exercise_problems(nbformat.read(path, as_version=4))
    assert not problems, f"{path.name}: {problems}"
    assert found >= 1, (
        f"{path.name} has no exercise: a markdown cell opening with {EXERCISE!r} (the question), then its "
        "solution in a code cell with jupyter.source_hidden and outputs_hidden, opening with '# Solution', "
        "that asserts its answer"
    )


def test_the_docs_index_lists_every_notebooks_exercise():
    index = (ROOT / "docs" / "README.md").read_text()
    section = index.split("## Exercises", 1)[1].split("\n## ", 1)[0] if "## Exercises" in index else ""
    listed = re.findall(r"\]\(\.\./notebooks/([\w.-]+\.ipynb)\) \| \S", section)
    assert listed == [p.name for p in NOTEBOOKS], (
        "docs/README.md's Exercises section: one row per notebook, in order"
    )
