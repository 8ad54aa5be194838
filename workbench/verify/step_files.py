"""Which files a reader opens to follow one decode step of a layout, found by tracing it.

Knows: ``sys.setprofile``, the bundled model, the Scheduler's public calls. Must not know:
which module does what (the trace finds out).

The rule (issue 38: "one decode step of either layout can be read in at most five files"):

1. Run a plain decode on the CPU (the path every machine runs; on CUDA the default kernels,
   the padded-rows one and the packed decode one, add their own files): the bundled model
   (:func:`workbench.load`), default settings but the layout, two greedy rows admitted and
   :data:`WARM_STEPS` steps run; then trace one more ``Scheduler.step()`` with
   :func:`sys.setprofile`.
2. The trace starts inside the body of ``Scheduler.step``: its decorator ``@transactional``
   (a savepoint before every engine call, a rollback on an exception) is named on the method.
3. A call into one of :data:`INSTRUMENT` is not followed: the step calls it by its name
   and the reader skips it (each entry says why it is the instrument, not the step).
4. A function on the step's path that calls another workbench function *orchestrates*; one
   that calls none is a leaf, read by its name (``Batch.compact``, ``sample_rows``...). A
   comprehension or generator expression is part of its function; a property is read as an
   attribute (``row.finished``: reading it calls nothing), though one whose getter calls
   workbench functions orchestrates like any function.
5. The files to read are those holding an orchestrating function, in the order the step
   first enters them.

``python -m workbench.verify.step_files padded`` (or ``packed``) prints the files, each with
its orchestrating functions; ``docs/architecture.md`` ("One decode step, file by file") holds
the list, checked against the trace by ``tests/architecture/test_step_files.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import mlx.core as mx

from ..engine.request import Request
from ..engine.scheduler import Scheduler
from ..runtime.loading import load

PACKAGE = Path(__file__).resolve().parents[1]
WARM_STEPS = 4
PROMPTS = ("Hello there, how are", "The capital of France is")
# (file, function's qualified name) -> why it is the instrument, not the step
INSTRUMENT: dict[tuple[str, str], str] = {
    ("engine/scheduler.py", "Scheduler._record"): (
        "the step's snapshot and history checkpoint for the views, one call after the step has run"
    ),
    ("observe/recorder.py", "Recorder.log"): (
        "the event log: appends the token's Event to the books, read by its name"
    ),
}
PROPERTIES_READ = True
_COMPREHENSIONS = {"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"}

Key = tuple[str, str]  # (file relative to the package, function's qualified name)


def _key(frame: FrameType) -> Key | None:
    """The workbench function ``frame`` runs, or ``None`` outside the package (comprehensions
    are not functions of their own: ``None``)."""
    code = frame.f_code
    try:
        rel = Path(code.co_filename).resolve().relative_to(PACKAGE)
    except ValueError:
        return None
    if code.co_name in _COMPREHENSIONS:
        return None
    return rel.as_posix(), code.co_qualname


def _is_property(frame: FrameType) -> bool:
    """Whether ``frame`` runs a property's getter (read as an attribute, by its name)."""
    code = frame.f_code
    if code.co_argcount != 1:
        return False
    owner = frame.f_locals.get(code.co_varnames[0])
    for cls in type(owner).__mro__:
        for attr in vars(cls).values():
            if isinstance(attr, property) and getattr(attr.fget, "__code__", None) is code:
                return True
    return False


def trace_step(step: Callable[[], Any], is_root: Callable[[Key], bool]) -> dict[Key, list[Key]]:
    """Run ``step()`` under :func:`sys.setprofile`: caller -> the workbench functions it
    called, in order, for every call below the first frame :func:`_key` names ``is_root``
    and outside :data:`INSTRUMENT` (the instrument's entry is kept as a leaf)."""
    calls: dict[Key, list[Key]] = {}
    roots: set[int] = set()

    def callers(frame: FrameType) -> tuple[Key | None, bool]:
        """The nearest workbench function above ``frame`` and whether the path reaches a root
        without passing an instrument."""
        nearest, b = None, frame.f_back
        while b is not None:
            k = _key(b)
            if k in INSTRUMENT:
                return None, False
            if nearest is None and k is not None:
                nearest = k
            if id(b) in roots:
                return nearest, True
            b = b.f_back
        return None, False

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or (k := _key(frame)) is None or (PROPERTIES_READ and _is_property(frame)):
            return
        if not roots and is_root(k):
            roots.add(id(frame))
            calls.setdefault(k, [])
            return
        caller, inside = callers(frame)
        if inside and caller is not None:
            calls.setdefault(caller, [])
            if k not in calls[caller]:
                calls[caller].append(k)
            calls.setdefault(k, [])

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return calls


def orchestrating(calls: dict[Key, list[Key]]) -> dict[str, list[str]]:
    """File -> its orchestrating functions (those that called another workbench function),
    files in the order the trace first entered them."""
    out: dict[str, list[str]] = {}
    for f, called in calls.items():
        if called and f not in INSTRUMENT:
            out.setdefault(f[0], []).append(f[1])
    return out


def step_files(layout: str) -> dict[str, list[str]]:
    """File -> orchestrating functions of one traced decode step of ``layout`` (``"padded"``
    or ``"packed"``) by the module's rule, in the order the step enters the files.

    Raises:
        ValueError: an unknown ``layout`` (from the Scheduler).
    """
    device = mx.default_device()
    mx.set_default_device(mx.cpu)
    try:
        model, tokenizer = load()
        sched = Scheduler(model, tokenizer, layout=layout)
        for prompt in PROMPTS:
            sched.submit(Request(prompt=prompt, max_tokens=20))
        sched.admit()
        for _ in range(WARM_STEPS):
            sched.step()
        calls = trace_step(sched.step, lambda k: k == ("engine/scheduler.py", "Scheduler.step"))
    finally:
        mx.set_default_device(device)
    return orchestrating(calls)


LAYOUTS = ("padded", "packed")
BEGIN = "<!-- step files: begin (python -m workbench.verify.step_files --markdown) -->"
END = "<!-- step files: end -->"


def markdown(files: dict[str, dict[str, list[str]]]) -> str:
    """The docs' list (between :data:`BEGIN` and :data:`END`): per layout of ``files``
    (layout -> :func:`step_files`), each file in order with its orchestrating functions.

    Example::

        padded, 1 file:
        1. `engine/scheduler.py`: `Scheduler.step`
    """
    lines = []
    for layout, by_file in files.items():
        n = len(by_file)
        lines.append(f"{layout}, {n} file{'s' if n != 1 else ''}:")
        for i, (f, names) in enumerate(by_file.items(), 1):
            lines.append(f"{i}. `{f}`: " + ", ".join(f"`{name}`" for name in names))
        lines.append("")
    return "\n".join([BEGIN, "", *lines, END])


def documented(text: str) -> str:
    """The part of ``text`` (a docs page) from :data:`BEGIN` to :data:`END`, both included.

    Raises:
        ValueError: ``text`` lacks either marker."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"the page holds no step-files list (markers {BEGIN!r} ... {END!r})")
    return text[text.index(BEGIN) : text.index(END) + len(END)]


def main(argv: list[str] | None = None) -> int:
    """Print each layout's files and their count (``argv``: layouts, default both;
    ``--markdown``: the docs' list instead)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    as_markdown = "--markdown" in argv
    layouts = [a for a in argv if a != "--markdown"] or list(LAYOUTS)
    files = {layout: step_files(layout) for layout in layouts}
    if as_markdown:
        print(markdown(files))
        return 0
    for layout, by_file in files.items():
        print(f"{layout}: {len(by_file)} files")
        for f, names in by_file.items():
            print(f"  {f}: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
