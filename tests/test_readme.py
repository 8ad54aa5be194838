"""The README's completion example reproduces: its code, run, prints its shown output."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

import workbench as wb

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.model
def test_the_readme_completion_example_prints_what_the_readme_shows(bundled):
    text = README.read_text()
    found = re.search(r"Three greedy completions.*?```python\n(.*?)```\n\nprints\n\n```python\n(.*?)```", text, re.S)
    assert found, "the README's completion example (code, then 'prints' and its output) is missing"
    code, shown = found.groups()
    assert '"import os\\n"' in code  # the prompt with its newline, as the output needs
    model, tokenizer = bundled
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {"wb": wb, "model": model, "tokenizer": tokenizer})
    assert out.getvalue() == shown
