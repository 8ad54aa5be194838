"""Docstring lines per code line, per file and in all, for a folder of Python modules.

Usage: ``python scripts/lab/doc_ratio.py [workbench/engine] [--top 15]``

A docstring line is a line of a module, class or function docstring; a code line is a
non-blank line outside docstrings that is not only a comment. Comments count as neither.
The review behind issue 26 measured 0.61 for ``workbench/engine`` (nanochat 0.25, mlx-lm's
``generate.py`` 0.15); CONTRIBUTING.md's docstring rule aims at 0.35 or less.
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from pathlib import Path


def doc_and_code_lines(source: str) -> tuple[int, int]:
    """``(docstring lines, code lines)`` of one module's source."""
    doc: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    doc.update(range(first.lineno, first.end_lineno + 1))
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            continue
        code.update(line for line in range(tok.start[0], tok.end[0] + 1) if line not in doc)
    return len(doc), len(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default="workbench/engine")
    parser.add_argument("--top", type=int, default=15, help="files listed, highest docstring lines first")
    args = parser.parse_args()
    rows = []
    for path in sorted(Path(args.folder).rglob("*.py")):
        doc, code = doc_and_code_lines(path.read_text())
        rows.append((doc, code, path))
    total_doc, total_code = sum(r[0] for r in rows), sum(r[1] for r in rows)
    print(
        f"{args.folder}: {total_doc} docstring lines / {total_code} code lines = {total_doc / total_code:.2f}"
    )
    for doc, code, path in sorted(rows, key=lambda r: -r[0])[: args.top]:
        print(f"  {doc:5d} / {code:5d} = {doc / max(code, 1):.2f}  {path}")


if __name__ == "__main__":
    main()
