"""The test suite's summed durations, per folder, file and test function, from pytest's junit XML.

Usage: ``python scripts/lab/suite_durations.py RUN.xml [MORE.xml ...] [--top 30] [--slow-list]``

Make the XML with ``pytest --junitxml=RUN.xml`` (with or without ``-n``): a test case's time is its
set-up, call and tear-down, so a module-scoped fixture counts in the first test that uses it. The sum
is what the workers of ``pytest -n N`` divide among themselves; the wall time of the run is not in
the XML (time it with ``time``). ``--slow-list`` compares the functions (parameters summed) with
``tests/slow_tests.txt``: those over 2 s it does not list, and listed ones now under 1 s.
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET
from pathlib import Path

SLOW_LIST = Path(__file__).resolve().parents[2] / "tests" / "slow_tests.txt"
NOT_LISTED = ("real_model", "realmodel", "test_browser", ".ipynb")  # slow by marker or kind, not by list


def test_seconds(paths: list[str]) -> collections.Counter:
    """``path::function`` (a class's methods as ``path::Class::function``) -> seconds, parameters summed."""
    seconds: collections.Counter = collections.Counter()
    for path in paths:
        for case in ET.parse(path).iter("testcase"):
            parts = case.get("classname", "").split(".")
            i = next(
                (k for k, p in enumerate(parts) if p.startswith("test_") or "ipynb" in p), len(parts) - 1
            )
            module = "/".join(parts[: i + 1]) + ("" if "ipynb" in parts[i] else ".py")
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
    lines += [f"  {s:8.1f}  {n}" for n, s in seconds.most_common() if s > 2.0 and n not in listed]
    lines = [line for line in lines if not any(k in line for k in NOT_LISTED)]
    lines += ["listed, under 1 s here:"]
    lines += [f"  {seconds[n]:8.2f}  {n}" for n in sorted(listed) if n in seconds and seconds[n] < 1.0]
    quick = sum(s for n, s in seconds.items() if n not in listed and not any(k in n for k in NOT_LISTED))
    return [*lines, f"the quick check's tests (not listed, not slow by marker): {quick:.1f} s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xml", nargs="+", help="junit XML files of pytest runs")
    parser.add_argument("--top", type=int, default=30, help="files and functions listed, slowest first")
    parser.add_argument("--slow-list", action="store_true", help="compare with tests/slow_tests.txt")
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


if __name__ == "__main__":
    main()
