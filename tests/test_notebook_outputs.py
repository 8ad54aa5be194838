"""No notebook's compared output depends on the environment (issue 42): every stored output that
nbval compares is checked for what changes with the machine rather than the engine.

What nbval compares is decided by nbval itself (:func:`nbval.plugin.find_comment_markers`,
:func:`nbval.plugin.find_metadata_tags`): a code cell is compared unless tagged
``nbval-ignore-output`` or ``nbval-skip`` (or carrying the ``# NBVAL_IGNORE_OUTPUT`` /
``# NBVAL_SKIP`` comment); of its outputs, the streams (stdout and stderr), an error's name and
value, and every MIME type of a result except images and widget ids. The project sets no
sanitize patterns (``pyproject.toml``), so what is stored is what must come back.

Volatile in a compared output: a matplotlib figure's repr (``<Figure size 900x300 ...>``: its
pixel size follows ``figure.dpi``, which a user's matplotlibrc or the inline backend sets), any
object repr with a memory address, IPython's timings (``%time``, ``%timeit``), a Python warning
(which shows once per process and depends on versions and the BLAS), and a path of this machine.
A compared cell that reads a clock or the load average prints a measurement: it belongs in a cell
tagged ``nbval-ignore-output`` (CONTRIBUTING.md's notebook rule: figures and timings in their own
ignored cells, their deterministic text form in a compared one).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
from nbval.plugin import find_comment_markers, find_metadata_tags

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
NOT_COMPARED_MIME = {"image/png", "image/jpeg", "application/vnd.jupyter.widget-view+json"}  # nbval's skips

VOLATILE_OUTPUT = {
    "a figure repr (its pixel size follows figure.dpi)": r"<Figure size [\d.]+x[\d.]+",
    "a matplotlib object repr": r"<matplotlib\.|<Axes: ",
    "a memory address": r"\bat 0x[0-9a-fA-F]{6,}|\b0x[0-9a-fA-F]{8,}\b",
    "an IPython timing": r"\bWall time: |\bCPU times: |per loop \(mean",
    "a Python warning": r"\b\w*Warning: ",
    "a path of this machine": "|".join(
        re.escape(p) for p in {str(ROOT), str(Path.home()), tempfile.gettempdir() + "/", "/Users/"}
    ),
}
CLOCK_IN_SOURCE = r"perf_counter|\btime\.time\(|\bmonotonic\(|getloadavg|^\s*%%?time(it)?\b"


def compared(cell) -> bool:
    """True when nbval compares this code cell's outputs (no ignore-output or skip marker)."""
    options = dict(find_comment_markers(cell.source))
    options.update(dict(find_metadata_tags(cell.metadata)))
    return options.get("check", True) and not options.get("skip", False)


def compared_texts(output) -> list[str]:
    """The strings of one stored output that nbval compares."""
    if output.output_type == "stream":
        return [output.text]
    if output.output_type == "error":
        return [output.ename, output.evalue]
    data = output.get("data", {})
    return [v if isinstance(v, str) else "".join(v) for k, v in data.items() if k not in NOT_COMPARED_MIME]


def volatile_outputs(nb) -> list[str]:
    """``cell N: what (excerpt)`` for every volatile value in a compared output of ``nb``
    (cells numbered from 0 over all cells, as JupyterLab's cell index)."""
    found = []
    for n, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not compared(cell):
            continue
        if cell.outputs and re.search(CLOCK_IN_SOURCE, cell.source, re.M):
            found.append(f"cell {n}: reads a clock or the load and its output is compared")
        for output in cell.outputs:
            for text in compared_texts(output):
                for what, pattern in VOLATILE_OUTPUT.items():
                    hit = re.search(pattern, text)
                    if hit:
                        excerpt = text[max(hit.start() - 20, 0) : hit.end() + 20].replace("\n", " ")
                        found.append(f"cell {n}: {what} ({excerpt!r})")
    return found


def code_cell(source: str, *outputs, tags=()):
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": list(tags)} if tags else {})
    cell.outputs = list(outputs)
    return cell


def test_the_check_finds_each_kind_of_volatile_output_and_honours_nbvals_markers():
    figure = nbformat.v4.new_output("execute_result", {"text/plain": "<Figure size 900x300 with 1 Axes>"})
    table = nbformat.v4.new_output("stream", name="stdout", text="tokens equal: 5 of 5 requests\n")
    warned = nbformat.v4.new_output("stream", name="stderr", text="x.py:3: RuntimeWarning: slow BLAS\n")
    address = nbformat.v4.new_output("execute_result", {"text/plain": "<Foo object at 0x7f6b17a2ec30>"})
    timed = nbformat.v4.new_output("stream", name="stdout", text="Wall time: 1.2 s\n")
    nb = nbformat.v4.new_notebook(
        cells=[
            code_cell("render(snap)", figure),
            code_cell("print(ok)", table),
            code_cell("run()", warned),
            code_cell("obj", address),
            code_cell("%time run()", timed),
            code_cell("t0 = time.perf_counter()\nprint(t)", table),
            code_cell("render(snap)", figure, tags=["nbval-ignore-output"]),
            code_cell("# NBVAL_IGNORE_OUTPUT\nrender(snap)", figure),
            code_cell("render(snap)", figure, tags=["nbval-skip"]),
        ]
    )
    found = volatile_outputs(nb)
    assert [f.split(":")[0] for f in found] == ["cell 0", "cell 2", "cell 3", "cell 4", "cell 4", "cell 5"]
    assert "figure repr" in found[0] and "Python warning" in found[1] and "memory address" in found[2]
    assert "IPython timing" in found[4] and "reads a clock" in found[5]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_compared_output_of_a_notebook_depends_on_the_environment(path):
    assert len(NOTEBOOKS) >= 18
    found = volatile_outputs(nbformat.read(path, as_version=4))
    assert not found, (
        f"{path.name}: compared outputs that change with the machine; move the figure or measurement into a "
        f"cell tagged nbval-ignore-output and compare its text form instead: {found}"
    )


# A sentence quoting the size of a measurement ("about 10⁻⁷", "a few 10⁻⁶", "~1e-5") states a
# fact of the run that stored the outputs, which a fresh run on another BLAS or load contradicts
# (issue 43: notebook 15's "about 10⁻⁷" read 1.5×10⁻⁸ in a fresh run). Prose states a bound
# ("below the 1e-4 the check allows") or points at a number a cell prints.
APPROXIMATE_MAGNITUDE = (
    r"(?:\b(?:about|around|roughly|approximately|a few|some)\s+|~\s*)"
    r"(?:[\d.]+\s*[×x]\s*)?(?:10[⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+|\d+(?:\.\d+)?e-\d+)"
)


def approximate_magnitudes(nb) -> list[str]:
    """``cell N: 'excerpt'`` for every approximate magnitude in ``nb``'s markdown."""
    return [
        f"cell {n}: {hit.group(0)!r}"
        for n, cell in enumerate(nb.cells)
        if cell.cell_type == "markdown"
        for hit in re.finditer(APPROXIMATE_MAGNITUDE, cell.source, re.I)
    ]


def test_the_prose_check_finds_quoted_magnitudes_and_lets_bounds_pass():
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("attention differs, less (about 10⁻⁷ above)"),
            nbformat.v4.new_markdown_cell("the log-probs differ by a few 10⁻⁶ nats, or ~1e-5"),
            nbformat.v4.new_markdown_cell(
                "within the oracle's tolerance, 10⁻⁴ nats; below the 1e-4 it allows"
            ),
        ]
    )
    assert approximate_magnitudes(nb) == ["cell 0: 'about 10⁻⁷'", "cell 1: 'a few 10⁻⁶'", "cell 1: '~1e-5'"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_notebook_prose_quotes_the_size_of_one_runs_measurement(path):
    found = approximate_magnitudes(nbformat.read(path, as_version=4))
    assert not found, (
        f"{path.name}: print the number in a cell, or state a bound that holds on any BLAS: {found}"
    )


# nbval runs the notebooks on MLX's reference BLAS (notebooks/conftest.py), so a compared output that
# only holds there (01 printed a log-prob difference of 0.0 that OpenBLAS makes 3.3×10⁻⁶) is never
# seen failing (and 15 printed the kernel's BLAS in a compared cell). The tour, every engine feature
# in one notebook, 11, whose compared verdicts weigh each layer's float32 difference against a
# tolerance, and 15, the BLAS lesson, run here on the users' BLAS too.
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="OpenBLAS is the Linux CPU's optimized BLAS")
@pytest.mark.parametrize(
    "name", ["01_tour.ipynb", "11_divergence_by_layer.ipynb", "15_batch_invariance.ipynb"]
)
def test_a_notebooks_compared_outputs_hold_on_the_optimized_blas(monkeypatch, name):
    from workbench.runtime.blas import find_blas
    from workbench.runtime.device import on_gpu

    monkeypatch.delenv("WORKBENCH_BLAS", raising=False)  # the suite itself runs with it off
    library = find_blas()
    if library is None:
        pytest.skip("no optimized BLAS installed here (.ci/run installs Debian's libopenblas0-pthread)")
    if on_gpu():  # 15 prints CPU-BLAS verdicts ("log-probs bit-equal") that a GPU's kernels do not give
        pytest.skip("MLX's default device is a GPU here: the notebooks' matmuls never reach the CPU's BLAS")
    command = [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:randomly", "-q", f"notebooks/{name}"]
    env = {**os.environ, "WORKBENCH_BLAS": library}  # the kernel's `import workbench` loads it
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "failed" not in out.stdout


# A sentence that calls a float difference exact ("the same per-token log-probabilities", "the
# per-layer Δ ... (zero here)") states what MLX's reference BLAS, nbval's, prints; an optimized BLAS
# (OpenBLAS, what `import workbench` loads for users) sums a row's products in another order for
# another number of rows and prints rounding in the last bits (issue 43: 01's oracle read 3.3×10⁻⁶
# beside "the same per-token log-probabilities"; 11's per-layer Δ read 1.7×10⁻⁶ beside "zero here").
# Such a sentence names the BLAS it holds on, or states the bound that holds on any ("within the
# tolerance").
EXACT_CLAIM = (
    r"\b(?:zero|0\.0+|no difference|bit-(?:equal|identical|exact)|bit for bit|(?:the )?same bits|identical bits"
    r"|the same (?:per-token )?log-prob\w*)|(?:\bis|\bare|=)\s*0(?:\.0+)?(?![.,]?\d)"
)
FLOAT_DIFFERENCE = r"Δ|\|d\||\bdifferences?\b|\bdiffers?\b|\blog-?prob"
ON_WHICH_BLAS = (
    r"reference BLAS|OpenBLAS|optimized BLAS|\bMKL\b|any BLAS|every BLAS|the mode\b|tolerance|within"
)


def exact_claims_without_blas(nb) -> list[str]:
    """``cell N: 'sentence'`` for every markdown sentence of ``nb`` that calls a float difference
    exact (zero, bit-equal, the same log-probs) without naming the BLAS or the bound it holds on."""
    found = []
    for n, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for sentence in re.split(r"(?<=[.;!?])\s+(?=[A-Z(*`])", " ".join(cell.source.split())):
            exact, difference = (
                re.search(EXACT_CLAIM, sentence, re.I),
                re.search(FLOAT_DIFFERENCE, sentence, re.I),
            )
            if exact and difference and not re.search(ON_WHICH_BLAS, sentence, re.I):
                found.append(f"cell {n}: {sentence[:160]!r}")
    return found


def test_the_exact_claim_check_finds_both_kinds_and_lets_qualified_ones_pass():
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell(  # 01's oracle before the fix
                "Each finished row, run alone, must give the same tokens\nand the same per-token log-probabilities."
            ),
            nbformat.v4.new_markdown_cell(
                "Below, the per-layer Δ of one row (zero here: the next section draws it)."
            ),
            nbformat.v4.new_markdown_cell("The largest log-prob difference is 0 for every row."),
            nbformat.v4.new_markdown_cell(
                "MLX's reference BLAS gives the row the same bits, so every Δ is 0. Log-probs differ within the "
                "tolerance on any BLAS. Every row gets the same tokens. Slot 0 is the zero delta. A joining row "
                "starts from zero state."
            ),
        ]
    )
    found = exact_claims_without_blas(nb)
    assert [f.split(":")[0] for f in found] == ["cell 0", "cell 1", "cell 2"], found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_notebook_prose_calls_a_float_difference_exact_on_every_blas(path):
    found = exact_claims_without_blas(nbformat.read(path, as_version=4))
    assert not found, (
        f"{path.name}: a float difference is exact only on MLX's reference BLAS; name the BLAS, or state the "
        f"bound that holds on any (the oracle's tolerance): {found}"
    )
