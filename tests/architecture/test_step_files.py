"""One decode step of either layout reads in at most five files (issue 38), and
``docs/architecture.md`` lists them: the trace of :mod:`workbench.verify.step_files` (its
module docstring states the rule) against the page's generated list."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.verify import step_files as sf

DOCS = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
MAX_FILES = 5
# The instrument the trace skips, each with why: a new entry needs a reason a reviewer accepts.
INSTRUMENT = {
    (
        "engine/scheduler.py",
        "Scheduler._record",
    ): "the snapshot and history checkpoint, one named call after the step",
    ("observe/recorder.py", "Recorder.log"): "the event log, appended to by name",
}


@pytest.fixture(scope="module")
def traced() -> dict[str, dict[str, list[str]]]:
    return {layout: sf.step_files(layout) for layout in sf.LAYOUTS}


@pytest.mark.parametrize("layout", sf.LAYOUTS)
def test_one_decode_step_reads_in_at_most_five_files(traced, layout):
    files = traced[layout]
    assert files and len(files) <= MAX_FILES, (
        f"one {layout} decode step reads in {len(files)} files (at most {MAX_FILES}): {list(files)}"
    )
    assert next(iter(files)) == "engine/scheduler.py"


def test_the_docs_list_the_traced_files(traced):
    assert sf.documented(DOCS.read_text()) == sf.markdown(traced), (
        "docs/architecture.md's step-files list is stale: paste `python -m workbench.verify.step_files --markdown`"
    )


def test_the_instrument_is_the_named_list_and_each_entry_is_a_function_that_exists():
    assert set(sf.INSTRUMENT) == set(INSTRUMENT)
    assert all(reason.strip() for reason in sf.INSTRUMENT.values())
    for path, qualname in sf.INSTRUMENT:
        module = __import__("workbench." + path.removesuffix(".py").replace("/", "."), fromlist=["_"])
        owner, name = qualname.split(".")
        assert callable(getattr(getattr(module, owner), name)), (path, qualname)


def test_orchestrating_keeps_callers_in_order_and_leaves_out_leaves_and_the_instrument():
    a, b, leaf = ("x.py", "a"), ("y.py", "b"), ("z.py", "leaf")
    record = ("engine/scheduler.py", "Scheduler._record")
    calls = {a: [b, record], b: [leaf], leaf: [], record: [leaf]}
    assert sf.orchestrating(calls) == {"x.py": ["a"], "y.py": ["b"]}


def test_markdown_and_documented_round_trip():
    text = "intro\n" + sf.markdown({"padded": {"engine/scheduler.py": ["Scheduler.step"]}}) + "\nmore"
    assert sf.documented(text) == sf.markdown({"padded": {"engine/scheduler.py": ["Scheduler.step"]}})
    assert "padded, 1 file:\n1. `engine/scheduler.py`: `Scheduler.step`" in text
    with pytest.raises(ValueError, match="step-files list"):
        sf.documented("no markers")
