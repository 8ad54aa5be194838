"""The test suite's summed durations, per folder, file and test function, from pytest's junit XML.

Usage: ``python scripts/lab/suite_durations.py RUN.xml [MORE.xml ...] [--top 30] [--slow-list] [--write]``

Make the XML with ``pytest --junitxml=RUN.xml`` (with or without ``-n``): a test case's time is its
set-up, call and tear-down, so a module-scoped fixture counts in the first test that uses it. The sum
is what the workers of ``pytest -n N`` divide among themselves; the wall time of the run is not in
the XML (time it with ``time``). ``--slow-list`` compares the functions (parameters summed) with
``tests/slow_tests.txt``: those over 2 s it does not list, and listed ones now under 1 s.
``--write`` rewrites the measured part of ``tests/slow_tests.txt`` (every function over 2 s,
keeping its hand-written companions: tests that share a listed test's slow fixture) and
``tests/file_seconds.txt`` (each file's seconds: ``tests/conftest.py`` hands the longest files
to the xdist workers first). ``--workers N`` replays the run's test times through pytest-xdist's
``--dist loadfile`` rule (a worker gets the next file once at most 2 of its tests are pending)
for xdist's own most-tests-first order and for longest-file-first: the wall time each order
gives, before start-up and collection.
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET
from pathlib import Path

SLOW_LIST = Path(__file__).resolve().parents[2] / "tests" / "slow_tests.txt"
FILE_SECONDS = SLOW_LIST.with_name("file_seconds.txt")
NOT_LISTED = ("real_model", "realmodel", "test_browser", ".ipynb")  # files slow by marker or kind


def by_marker(name: str) -> bool:
    """True for a function of a file whose tests are all slow without the list (notebooks,
    the real-model and browser files), judged by its path: a name may say "real_model" and
    still be a quick test."""
    return any(k in name.split("::")[0] for k in NOT_LISTED)


def file_cases(paths: list[str]) -> dict[str, list[float]]:
    """``file -> [seconds of each test case]``, in the run's order."""
    files: dict[str, list[float]] = {}
    for path in paths:
        for case in ET.parse(path).iter("testcase"):
            files.setdefault(_module(case.get("classname", "").split("."))[0], []).append(
                float(case.get("time") or 0.0)
            )
    return files


def replay(files: dict[str, list[float]], order: list[str], workers: int) -> float:
    """Wall seconds of ``workers`` xdist workers taking whole files in ``order`` (xdist's
    ``LoadScopeScheduling``: a worker is sent the next file while at most 2 of its tests are
    pending), each test taking its measured time."""
    queue = [list(files[f]) for f in order]
    pending: list[list[float]] = [[] for _ in range(workers)]
    clock = [0.0] * workers
    for n in range(workers):
        while queue and len(pending[n]) <= 2:
            pending[n] += queue.pop(0)
    while any(pending):
        n = min((k for k in range(workers) if pending[k]), key=lambda k: clock[k])
        clock[n] += pending[n].pop(0)
        while queue and len(pending[n]) <= 2:
            pending[n] += queue.pop(0)
    return max(clock)


def _module(parts: list[str]) -> tuple[str, int]:
    """``(file path, index of its part)`` of a junit classname split on dots."""
    i = next((k for k, p in enumerate(parts) if p.startswith("test_") or "ipynb" in p), len(parts) - 1)
    notebook = "ipynb" in parts[i]  # notebooks.01_tour.ipynb -> notebooks/01_tour.ipynb
    return "/".join(parts[: i if notebook else i + 1]) + (".ipynb" if notebook else ".py"), i


def test_seconds(paths: list[str]) -> collections.Counter:
    """``path::function`` (a class's methods as ``path::Class::function``) -> seconds, parameters summed."""
    seconds: collections.Counter = collections.Counter()
    for path in paths:
        for case in ET.parse(path).iter("testcase"):
            parts = case.get("classname", "").split(".")
            module, i = _module(parts)
            name = "::".join([module, *parts[i + 1 :], case.get("name", "").split("[")[0]])
            seconds[name] += float(case.get("time") or 0.0)
    return seconds


def grouped(seconds: collections.Counter, depth: str) -> collections.Counter:
    """Seconds per folder (``depth="folder"``) or per file (``"file"``)."""
    out: collections.Counter = collections.Counter()
    for name, s in seconds.items():
        path = name.split("::")[0]
        out[path.rsplit("/", 1)[0] if depth == "folder" else path] += s
    return out


def slow_list_report(seconds: collections.Counter) -> list[str]:
    """Functions over 2 s that tests/slow_tests.txt does not list, and listed ones under 1 s."""
    listed = {
        line.split()[0] for line in SLOW_LIST.read_text().splitlines() if line.strip() and line[0] != "#"
    }
    lines = ["over 2 s, not in tests/slow_tests.txt:"]
    lines += [
        f"  {s:8.1f}  {n}"
        for n, s in seconds.most_common()
        if s > 2.0 and n not in listed and not by_marker(n)
    ]
    lines += ["listed, under 1 s here:"]
    lines += [f"  {seconds[n]:8.2f}  {n}" for n in sorted(listed) if n in seconds and seconds[n] < 1.0]
    quick = sum(s for n, s in seconds.items() if n not in listed and not by_marker(n))
    return [*lines, f"the quick check's tests (not listed, not slow by marker): {quick:.1f} s"]


SLOW_HEADER = """\
# The `slow` tier's hand-picked part (tests/conftest.py reads it; notebooks, `realmodel` and `browser`
# tests are slow without being listed). One test function a line, with its seconds summed over its
# parameters and fixture set-up: every function over 2 s in a `pytest --junitxml` run of the whole
# suite, written by `python scripts/lab/suite_durations.py RUN.xml --write SOURCE`; this one:
# {source}.
# `pytest -m "not slow"` runs the rest. Regenerate after adding a slow test.
"""
COMPANIONS = """\
# Tests that share a slow module-scoped fixture with a test above (deselecting only that one would
# move the fixture's set-up to them):
"""


def write_lists(seconds: collections.Counter, source: str) -> None:
    """Rewrite tests/slow_tests.txt (functions over 2 s, companions kept) and tests/file_seconds.txt."""
    companions = [
        line
        for line in SLOW_LIST.read_text().splitlines()
        if line.strip() and line[0] != "#" and len(line.split()) > 1 and not _is_number(line.split()[1])
    ]
    slow = sorted(n for n, s in seconds.items() if s > 2.0 and not by_marker(n))
    lines = [f"{n}  {seconds[n]:.1f}" for n in slow] + ["", COMPANIONS.rstrip("\n"), *companions]
    SLOW_LIST.write_text(SLOW_HEADER.format(source=source) + "\n".join(lines) + "\n")
    files = grouped(seconds, "file")
    FILE_SECONDS.write_text(
        "# Seconds per test file and notebook (`python scripts/lab/suite_durations.py RUN.xml --write`):\n"
        "# the longest go to the xdist workers first (tests/conftest.py); a file missing here counts 0 s.\n"
        f"# This one: {source}.\n" + "".join(f"{path}  {s:.1f}\n" for path, s in sorted(files.items()))
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xml", nargs="+", help="junit XML files of pytest runs")
    parser.add_argument("--top", type=int, default=30, help="files and functions listed, slowest first")
    parser.add_argument("--slow-list", action="store_true", help="compare with tests/slow_tests.txt")
    parser.add_argument("--workers", type=int, default=0, help="replay the run on N xdist workers")
    parser.add_argument(
        "--write",
        metavar="SOURCE",
        help="rewrite tests/slow_tests.txt and tests/file_seconds.txt; SOURCE says which run",
    )
    args = parser.parse_args()
    seconds = test_seconds(args.xml)
    print(f"{sum(seconds.values()):.1f} s summed over {len(seconds)} test functions")
    for depth in ("folder", "file"):
        print(f"\nper {depth}:")
        rows = grouped(seconds, depth).most_common(None if depth == "folder" else args.top)
        print("\n".join(f"  {s:8.1f}  {name}" for name, s in rows))
    print("\nper function:")
    print("\n".join(f"  {s:8.1f}  {name}" for name, s in seconds.most_common(args.top)))
    if args.slow_list:
        print("\n" + "\n".join(slow_list_report(seconds)))
    if args.workers:
        files = file_cases(args.xml)
        most_tests = sorted(files, key=lambda f: -len(files[f]))
        longest = sorted(files, key=lambda f: -sum(files[f]))
        print(f"\n{args.workers} workers, --dist loadfile, this run's test times:")
        print(f"  xdist's order (most tests first): {replay(files, most_tests, args.workers):.0f} s")
        print(f"  longest file first: {replay(files, longest, args.workers):.0f} s")
        print(
            f"  the longest file: {max(sum(t) for t in files.values()):.0f} s; 1/{args.workers} of the sum: "
            f"{sum(seconds.values()) / args.workers:.0f} s"
        )
    if args.write:
        write_lists(seconds, args.write)


if __name__ == "__main__":
    main()
