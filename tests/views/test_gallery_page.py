"""``workbench gallery``'s page (``workbench.gallery.write_gallery``): a rewrite keeps the sections
written by hand after :data:`~workbench.gallery.HAND_WRITTEN`, and the timings say where they were
measured. (The whole gallery, drawn from live runs: ``tests/test_cli.py``.)"""

from __future__ import annotations

import os
import platform

from workbench.gallery import HAND_WRITTEN, measured_on, write_gallery


def test_a_rewrite_keeps_the_sections_written_by_hand_after_the_marker(tmp_path):
    md = tmp_path / "views.md"
    md.write_text(f"# old gallery\n\nstale numbers\n\n{HAND_WRITTEN}\n\n## By hand\n\nkept as it is\n")
    write_gallery(tmp_path, entries=[], echo=lambda line: None)
    text = md.read_text()
    assert text.startswith("# Views gallery\n") and "stale numbers" not in text
    assert text.endswith(f"\n\n{HAND_WRITTEN}\n\n## By hand\n\nkept as it is\n")
    write_gallery(tmp_path, entries=[], echo=lambda line: None)
    assert md.read_text() == text  # a second rewrite changes nothing


def test_a_page_without_the_marker_is_rewritten_whole(tmp_path):
    (tmp_path / "views.md").write_text("# old\n\n## By hand, unmarked\n")
    text = write_gallery(tmp_path, entries=[], echo=lambda line: None).read_text()
    assert "unmarked" not in text and HAND_WRITTEN not in text


def test_timings_say_the_machine_its_load_and_the_day():
    text = measured_on()
    assert text.startswith(f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs")
    assert ("load average" in text) == hasattr(os, "getloadavg") and text[-10:-6].isdigit()
