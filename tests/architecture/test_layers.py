"""The package's shape: subpackages import only lower ones, ``observe`` never imports
MLX, one module touches mlx-lm's private cache fields, no engine function is longer than
one screen; inside the engine, ``kv/`` never imports the core or the levers, only the
runner, the scheduler and ``forward.py`` (which installs a forward's levers) import ``levers/``
from the core, only the scheduler imports
``layouts/`` and a layout never imports the scheduler or the other layout, and ``packed/``
(the packed layout's parts) imports no lever, runner or padded batch and is imported only by
``layouts/packed.py`` and the config; no
import circle anywhere (imports inside functions count)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "workbench"
ENGINE = PACKAGE / "engine"
LAYERS = ["runtime", "observe", "engine", "workloads", "verify", "sim", "bench", "views", "serving"]
PRIVATE_CACHE_FIELDS = {"_idx", "rotated", "_trie", "_lru", "_offset"}
SCREEN_LINES = 50


def modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def imported_packages(path: Path) -> set[str]:
    """Our subpackages ``path`` imports (relative or absolute imports)."""
    rel = path.relative_to(PACKAGE).parts
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(rel[:-1])[: len(rel) - node.level] if node.level > 1 else list(rel[:-1])
                parts = base + (node.module.split(".") if node.module else [n.name for n in node.names][:1])
            elif node.module and node.module.startswith("workbench."):
                parts = node.module.split(".")[1:]
            else:
                continue
            if parts:
                out.add(parts[0])
    return out


@pytest.mark.parametrize(
    "path", [p for p in modules() if p.parent != PACKAGE], ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_a_subpackage_imports_only_itself_and_lower_subpackages(path):
    own = path.relative_to(PACKAGE).parts[0]
    allowed = set(LAYERS[: LAYERS.index(own) + 1])
    upward = {p for p in imported_packages(path) if p in LAYERS} - allowed
    assert not upward, f"{path.relative_to(PACKAGE)} imports higher subpackage(s) {sorted(upward)}"


def test_observe_never_imports_mlx():
    for path in (PACKAGE / "observe").glob("*.py"):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.startswith("mlx")], f"{path.name} imports MLX"


def test_only_cache_internals_reads_mlx_lm_private_cache_fields():
    readers = set()
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in PRIVATE_CACHE_FIELDS:
                readers.add(path.relative_to(PACKAGE).as_posix())
    assert readers == {"engine/kv/cache_internals.py"}


def engine_imports(path: Path) -> set[str]:
    """The engine modules ``path`` imports, relative to ``engine/`` without ``.py``
    (``"runner"``, ``"kv/caches"``; ``"levers"`` for the package itself)."""
    package = list(path.relative_to(PACKAGE).parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            module = package[: len(package) - (node.level - 1)] + (
                node.module.split(".") if node.module else []
            )
        elif node.module and node.module.startswith("workbench."):
            module = node.module.split(".")[1:]
        else:
            continue
        if module[:1] != ["engine"]:
            continue
        for (
            alias
        ) in node.names:  # ``from . import caches`` names a module; ``from .kv.caches import X`` a name
            named = PACKAGE.joinpath(*module, alias.name)
            found = module + [alias.name] if named.is_dir() or named.with_suffix(".py").exists() else module
            out.add("/".join(found[1:]))
    return out


@pytest.mark.parametrize("path", sorted((ENGINE / "kv").glob("*.py")), ids=lambda p: p.name)
def test_kv_never_imports_the_engine_core_or_its_levers(path):
    outside = {m for m in engine_imports(path) if not m.startswith("kv/")}
    assert not outside, (
        f"kv/{path.name} imports {sorted(outside)}: kv/ must stand below the core and the levers"
    )


def core_importers(folder: str) -> set[str]:
    """The engine's core modules (``engine/*.py``) that import engine subpackage ``folder``
    (the package or any module in it)."""
    return {
        p.relative_to(ENGINE).as_posix()
        for p in ENGINE.glob("*.py")
        if any(m == folder or m.startswith(folder + "/") for m in engine_imports(p))
    }


def test_only_the_runner_the_scheduler_and_the_forward_import_the_levers():
    assert core_importers("levers") == {"runner.py", "scheduler.py", "forward.py"}


def test_engine_modules_live_in_the_core_kv_levers_layouts_or_packed():
    folders = {p.parent.relative_to(ENGINE).as_posix() for p in ENGINE.rglob("*.py")}
    assert folders == {".", "kv", "levers", "layouts", "packed"}


@pytest.mark.parametrize("path", sorted((ENGINE / "packed").glob("*.py")), ids=lambda p: p.name)
def test_packed_never_imports_the_levers_the_runner_or_the_scheduler(path):
    bad = {
        m
        for m in engine_imports(path)
        if m == "levers" or m.startswith("levers/") or m in ("runner", "scheduler", "batch", "prefill")
    }
    assert not bad, (
        f"packed/{path.name} imports {sorted(bad)}: the packed layout stands beside the padded one"
    )


def engine_importers(folder: str) -> set[str]:
    """The engine modules outside subpackage ``folder`` that import it (the package or any
    module in it), relative to ``engine/``."""
    return {
        p.relative_to(ENGINE).as_posix()
        for p in ENGINE.rglob("*.py")
        if p.parent != ENGINE / folder
        and any(m == folder or m.startswith(folder + "/") for m in engine_imports(p))
    }


def test_only_the_packed_layout_and_the_config_import_packed():
    assert engine_importers("packed") == {"layouts/packed.py", "config.py"}


def test_only_the_scheduler_imports_the_layouts():
    assert engine_importers("layouts") == {"scheduler.py"}


@pytest.mark.parametrize("path", sorted((ENGINE / "layouts").glob("*.py")), ids=lambda p: p.name)
def test_a_layout_never_imports_the_scheduler_or_the_other_layout(path):
    bad = {
        m
        for m in engine_imports(path)
        if m == "scheduler"
        or (m.startswith("layouts/") and m not in ("layouts/layout", f"layouts/{path.stem}"))
    }
    assert not bad, f"layouts/{path.name} imports {sorted(bad)}: a layout never calls back into the scheduler"


def body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's lines from its first statement (the docstring, if any) to its end: the
    signature is left out, as ``ruff format`` lays a long one out one parameter a line."""
    return node.end_lineno - node.body[0].lineno + 1


def test_body_lines_leave_out_the_signature_and_keep_the_docstring():
    source = 'def f(\n    a,\n    b,\n):\n    """Doc."""\n    return a + b\n'
    assert body_lines(ast.parse(source).body[0]) == 2


def test_no_engine_function_is_longer_than_one_screen():
    long = []
    for path in ENGINE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = body_lines(node)
                if n > SCREEN_LINES:
                    long.append(f"{path.relative_to(ENGINE)}:{node.name} ({n} lines)")
    assert not long, f"longer than {SCREEN_LINES} lines: {long}"


# Import circles tolerated, each named with its reason (none today): delete an entry once its circle is broken.
ALLOWED_CIRCLES: list[set[str]] = []


def _resolve(parts: list[str]) -> str | None:
    """The module (``"engine/runner"``, ``"engine/kv/__init__"``) that dotted ``parts`` under
    the package name, or None."""
    path = PACKAGE.joinpath(*parts)
    if path.with_suffix(".py").exists():
        return "/".join(parts)
    if (path / "__init__.py").exists():
        return "/".join([*parts, "__init__"])
    return None


def module_imports(path: Path, source: str | None = None) -> set[str]:
    """Our modules ``path`` (or ``source`` read as if it were ``path``) imports anywhere in
    it, inside functions too, each as :func:`_resolve` names it: ``from . import x`` names
    module ``x`` when it is one."""
    package = list(path.relative_to(PACKAGE).parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] + (
                    node.module.split(".") if node.module else []
                )
            elif node.module and node.module.split(".")[0] == "workbench":
                base = node.module.split(".")[1:]
            else:
                continue
            out |= {m for a in node.names if (m := _resolve([*base, a.name]) or _resolve(base))}
        elif isinstance(node, ast.Import):
            names = [a.name.split(".") for a in node.names if a.name.split(".")[0] == "workbench"]
            out |= {m for n in names if (m := _resolve(n[1:]))}
    return out


def import_circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module of ``graph`` (module ->
    modules it imports): each is a set of modules that import each other round a circle."""
    order, low, stack, circles = {}, {}, [], []

    def visit(v: str) -> None:  # Tarjan's algorithm
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = set()
            while not component or w != v:
                w = stack.pop()
                component.add(w)
            if len(component) > 1:
                circles.append(component)

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return circles


def test_import_circles_are_found_through_imports_inside_functions():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(graph) == [{"a", "b", "c"}]
    assert import_circles({"a": {"b"}, "b": set()}) == []
    source = "import numpy\n\ndef f():\n    from .kv import caches\n    from ..observe.events import Event\n"
    assert module_imports(ENGINE / "checkpoint.py", source) == {"engine/kv/caches", "observe/events"}


def test_no_import_circle():
    graph = {p.relative_to(PACKAGE).with_suffix("").as_posix(): module_imports(p) for p in modules()}
    circles = [c for c in import_circles(graph) if c not in ALLOWED_CIRCLES]
    assert not circles, f"import circles (imports inside functions count): {[sorted(c) for c in circles]}"


SCHEDULER_CLASS_LINES = 600  # issue 38: the Scheduler keeps the life of requests, the layouts the rest


def test_the_scheduler_class_stays_within_its_size():
    """The ``Scheduler`` class (docstrings included) is at most ``SCHEDULER_CLASS_LINES``
    lines: what is not the life of requests lives in a layout, a lever or a helper module."""
    tree = ast.parse((ENGINE / "scheduler.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler"]
    n = cls.end_lineno - cls.lineno + 1
    assert n <= SCHEDULER_CLASS_LINES, f"Scheduler class is {n} lines (at most {SCHEDULER_CLASS_LINES})"
