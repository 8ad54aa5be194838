"""The documents' references hold: every ``scripts/...`` file a document names exists, and every
relative link (a file, and a ``#anchor`` in a Markdown file) resolves, as GitHub renders it.

A break-it pass (2026-12-08) found ``scripts/gpu_step_profile.py`` and ``scripts/latency_floors.py``
named after they moved to ``scripts/lab/``, a deleted script run as if it were there, and a link to a
heading renamed since."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md")])

# (document, script) pairs where the document names a script deleted since, on purpose: it says so
# and how to see it (``git show <commit>^:<path>``). Anything else named must exist.
REMOVED_SCRIPTS = {
    # the size rule's A/B, deleted with the rule in 2923ed4; its numbers stay in the doc's record
    ("docs/batch-invariance.md", "scripts/lab/invariant_blocks_ab.py"),
}

SCRIPT = re.compile(r"(?<![\w.-])scripts/[\w./-]+\.(?:py|sh)\b")
LINK = re.compile(r"\]\(([^)\s#]*)(?:#([^)\s]*))?\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: its text (links reduced to their text, code marks
    dropped), lower-cased, every character but letters, digits, spaces, ``-`` and ``_`` removed,
    each space a ``-``: ``"Cost (goals: decode step <= 1.10x)"`` -> ``"cost-goals-decode-step--110x"``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of ``path``: one per heading outside code fences (a repeated one numbered
    ``-1``, ``-2``, ... as GitHub does), and every ``<a name=...>`` / ``id=...``."""
    text = FENCE.sub("", path.read_text())
    seen: dict[str, int] = {}
    out = set(re.findall(r"<a (?:name|id)=\"([^\"]+)\"", text))
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        s = slug(heading)
        out.add(f"{s}-{seen[s]}" if s in seen else s)
        seen[s] = seen.get(s, 0) + 1
    return out


def test_the_slug_is_githubs():
    assert slug("Cost (goals: decode step <= 1.10x the default path, prefill <= 1.25x)") == (
        "cost-goals-decode-step--110x-the-default-path-prefill--125x"
    )
    assert slug("The KV budget: bytes the caches really hold") == "the-kv-budget-bytes-the-caches-really-hold"
    assert slug("`wb.serve` and [the Panel](views.md)") == "wbserve-and-the-panel"


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_script_a_document_names_exists(doc):
    name = doc.relative_to(ROOT).as_posix()
    named = set(SCRIPT.findall(doc.read_text()))
    missing = sorted(p for p in named if not (ROOT / p).exists() and (name, p) not in REMOVED_SCRIPTS)
    assert not missing, f"{name} names scripts that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_of_a_document_resolves(doc):
    broken = []
    for target, anchor in LINK.findall(FENCE.sub("", doc.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:, file:
            continue
        path = (doc.parent / target).resolve() if target else doc
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}#{anchor}: no such heading")
    assert not broken, f"{doc.relative_to(ROOT)}: {broken}"


def test_the_removed_scripts_allowed_are_removed_and_still_named():
    for doc, script in REMOVED_SCRIPTS:
        assert not (ROOT / script).exists(), f"{script} exists again: take it off REMOVED_SCRIPTS"
        assert script in (ROOT / doc).read_text(), f"{doc} no longer names {script}: take it off"
