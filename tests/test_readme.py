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
    found = re.search(
        r"Three greedy completions.*?```python\n(.*?)```\n\nprints\n\n```python\n(.*?)```", text, re.S
    )
    assert found, "the README's completion example (code, then 'prints' and its output) is missing"
    code, shown = found.groups()
    assert '"import os\\n"' in code  # the prompt with its newline, as the output needs
    model, tokenizer = bundled
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {"wb": wb, "model": model, "tokenizer": tokenizer})
    assert out.getvalue() == shown


def test_the_readme_is_a_front_page_of_at_most_12_kb():
    assert len(README.read_bytes()) <= 12 * 1024


def test_every_file_the_readme_links_or_names_exists():
    text = README.read_text()
    root = README.parent
    linked = re.findall(r"\]\(((?:docs|notebooks|data|scripts)/[^)#\s]*)", text)
    named = re.findall(r"`((?:docs|scripts|notebooks)/[\w./-]+\.(?:md|py|ipynb|png))`", text)
    named += [f"notebooks/{n}" for n in re.findall(r"`(\d\d_\w+\.ipynb)`", text)]
    assert len(linked) >= 12 and named
    missing = sorted({p for p in linked + named if not (root / p).exists()})
    assert not missing, missing


def test_the_readme_install_includes_what_its_panel_line_needs():
    import tomllib

    text = README.read_text()
    assert 'pip install -e ".[notebooks]" && .venv/bin/workbench demo' in text
    extras = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("ipywidgets") for dep in extras["notebooks"])
    assert any(dep.startswith("jupyterlab") for dep in extras["notebooks"])  # `jupyter lab notebooks/`
    # notebooks 16 (Request(json_schema=...)) and 18 (wb.serve), run in order, need these extras too
    assert set(extras["structured"]) | set(extras["serve"]) <= set(extras["notebooks"])


def test_the_dev_extra_installs_every_other_extra_but_cuda():
    import tomllib

    extras = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name in set(extras) - {"dev", "cuda"}:
        assert set(extras[name]) <= set(extras["dev"]), name


def test_the_readme_names_every_workbench_command():
    from workbench.cli import build_parser

    found = re.search(r"`workbench --help`: the commands \(([^)]*)\)", README.read_text())
    assert found, "the README's list of commands is missing"
    listed = re.findall(r"`([\w-]+)`", found.group(1))
    assert sorted(listed) == sorted(build_parser()._subparsers._group_actions[0].choices)


@pytest.mark.model
def test_the_30_second_example_runs_to_its_last_line_the_panel():
    text = README.read_text()
    found = re.search(r"## 30 seconds\n\n```python\n(.*?)```", text, re.S)
    assert found, "the README's 30-second example is missing"
    code = found.group(1)
    assert code.rstrip().splitlines()[-1].startswith("wb.views.Panel(sched)")
    scope = {}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(code.replace("wb.views.Panel(sched)", "panel = wb.views.Panel(sched)"), scope)
    assert "step 1: 2 row(s), KV width 8 tokens" in out.getvalue()
    listed = re.search(r"report\.requests\.to_string\(\)\)  # (.*)", code).group(1).split(", ")
    listed = listed[:-1] if listed[-1] == "..." else listed
    assert listed == list(scope["report"].requests.columns)[: len(listed)]  # the comment names real columns
    assert type(scope["panel"]).__name__ == "Panel"


@pytest.mark.model
def test_the_readme_snapshot_printout_is_what_the_snippet_prints(bundled):
    text = README.read_text()
    shown = re.search(r"`snapshot\(\)` prints.*?```\n(.*?)```", text, re.S).group(1)
    model, tokenizer = bundled
    sched = wb.Scheduler(model, tokenizer, max_batch=4)
    sched.submit(wb.Request(prompt="def add(a, b):", max_tokens=24))
    sched.submit(wb.Request(prompt=[401, 17, 9], max_tokens=8))
    sched.admit()
    sched.step()
    assert str(sched.snapshot()) + "\n" == shown


def test_the_docs_index_links_every_document_and_only_documents_that_exist():
    docs = README.parent / "docs"
    index = (docs / "README.md").read_text()
    linked = set(re.findall(r"\]\(([^)#\s]+)\)", index))
    assert all((docs / p).exists() for p in linked), sorted(p for p in linked if not (docs / p).exists())
    pages = {p.relative_to(docs).as_posix() for p in [*docs.glob("*.md"), *docs.glob("lab/*.md")]} - {
        "README.md"
    }
    assert pages <= linked, sorted(pages - linked)
