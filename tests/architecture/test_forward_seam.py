"""Every forward of both layouts takes its levers in one place
(:meth:`workbench.engine.forward.ForwardLevers.applied`): no forward site stacks
the levers' context managers by hand, so a lever cannot reach one site and miss another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import workbench

ENGINE = Path(workbench.__file__).parent / "engine"
SITES = [ENGINE / "runner.py", *sorted((ENGINE / "layouts").glob("*.py"))]
# the levers' own context managers, entered only by engine/forward.py
LEVERS = {
    "selected",
    "selected_tokens",
    "invariant_forward",
    "packed_invariant_forward",
    "attention_path",
    "decode_fast_path",
}


def lever_calls(source: str) -> list[str]:
    """``name@line`` of each call in Python ``source`` to one of :data:`LEVERS` (plain or dotted)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in LEVERS:
                found.append(f"{name}@{node.lineno}")
    return found


def test_lever_calls_finds_plain_and_dotted_calls():
    source = "with selected(b, n), lora.attention_path(m, p):\n    pass\nselected_tokens\n"
    assert lever_calls(source) == ["selected@1", "attention_path@1"]


@pytest.mark.parametrize("path", SITES, ids=lambda p: p.relative_to(ENGINE).as_posix())
def test_no_forward_site_enters_a_lever_by_hand(path):
    calls = lever_calls(path.read_text())
    assert not calls, (
        f"{path.relative_to(ENGINE)} calls {calls}: describe the forward "
        "(workbench.engine.forward.Forward) and enter ForwardLevers.applied instead"
    )


def test_the_runner_and_the_packed_layout_enter_the_one_context_manager():
    for path in (ENGINE / "runner.py", ENGINE / "layouts" / "packed.py"):
        applied = [
            n
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "applied"
        ]
        assert len(applied) >= (5 if path.name == "runner.py" else 2), path.name
