"""The views gallery, ``workbench gallery``: one PNG per view of the live engine, and
``views.md`` that shows each next to its text form.

Knows: the scheduler's public contract, the bundled models and workloads, the views.
Must not know: argument parsing (see :mod:`workbench.cli`).

Two runs feed the gallery:

- *join and evict* on the bundled tiny-gemma3 (sliding-window and full-attention layers):
  two rows decode past the window, a third joins, a row finishes and is filtered; a
  snapshot after every call, so the KV view has a history;
- the demo's staggered workload on the bundled tiny-code (``Scheduler.run``), for the
  timeline and the latency views; their captions say where it was measured (:func:`measured_on`).

``views.md`` may go on by hand after :data:`HAND_WRITTEN`: a rewrite keeps that part.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from . import views
from .engine.request import Request
from .engine.scheduler import Scheduler
from .observe.snapshot import Snapshot
from .runtime.loading import DATA_DIR, load
from .views import live
from .workloads.workload import demo_workload, prompt_of_length

WINDOW_MODEL = DATA_DIR / "models" / "tiny-gemma3"
GALLERY_DPI = 100
# views.md's sections after this line are written by hand; write_gallery keeps them
HAND_WRITTEN = "<!-- written by hand from here on: `workbench gallery` keeps what follows -->"


@dataclass(frozen=True)
class Entry:
    """One gallery item: a view's file stem, heading, caption, figure and text form."""

    stem: str
    title: str
    caption: str
    figure: Figure
    text: str


def join_evict_history(sched: Scheduler) -> tuple[Snapshot, list[Snapshot]]:
    """Drive ``sched`` through join-and-evict (a snapshot after every call); returns the
    snapshot right after the third row joined, and the whole history."""
    tok = sched.tokenizer
    sched.submit(Request(prompt=prompt_of_length(tok, 6), max_tokens=20))
    sched.submit(Request(prompt=prompt_of_length(tok, 3, start=50), max_tokens=20))
    calls = [sched.admit] + [sched.step] * 8
    calls += [
        lambda: sched.submit(Request(prompt=prompt_of_length(tok, 5, start=90), max_tokens=3)),
        sched.admit,
    ]
    joined_at = len(calls)
    calls += [sched.step] * 3 + [sched.filter] + [sched.step] * 2
    snaps = []
    for call in calls:
        call()
        snaps.append(sched.snapshot())
    return snaps[joined_at - 1], snaps


def measured_on() -> str:
    """Where and when timings are measured: ``"Linux x86_64, 2 CPUs, load average 0.4, 2026-12-08"``
    (the 1-minute load average, where the OS gives one; the UTC date). No mlx-lm counterpart."""
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    day = time.strftime("%Y-%m-%d", time.gmtime())
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs{load}, {day}"


def gallery_entries(window_model: tuple | None = None, demo_model: tuple | None = None) -> list[Entry]:
    """The gallery's entries, from fresh runs of the bundled models (or the given
    ``(model, tokenizer)`` pairs)."""
    joined, history = join_evict_history(Scheduler(*(window_model or load(WINDOW_MODEL)), max_batch=3))
    model, tokenizer = demo_model or load()
    where = f"measured by `workbench gallery` on {measured_on()}"
    report = Scheduler(model, tokenizer, max_batch=4).run(demo_workload(tokenizer))
    return [
        Entry(
            "masks",
            "Attention masks",
            "The next step's mask per layer group and row, right after a "
            "third row joined tiny-gemma3's batch (window group: temporal order).",
            views.render_masks(joined),
            views.mask_text(joined),
        ),
        Entry(
            "kv",
            "KV cache geometry",
            "Per row padding, valid tokens, expired ring slots and unused "
            "capacity; padding waste and KV bytes over the snapshot history (join and evict).",
            views.render_kv(joined, history),
            views.kv_text(joined) + "\n\n" + views.kv_history_text(history),
        ),
        Entry(
            "timeline_steps",
            "Row timeline over decode steps",
            "The demo workload on tiny-code: queued, decoding, finished spans; joins and evictions marked.",
            views.render_timeline(report.events, "demo workload", x="step"),
            views.timeline_text(report.events),
        ),
        Entry(
            "timeline_time",
            "Row timeline over time",
            "The same run over wall-clock time, where prefill has a width.",
            views.render_timeline(report.events, "demo workload", x="time"),
            "(the text form is the one over steps, above)",
        ),
        Entry(
            "latency",
            "Latency and throughput",
            f"TTFT and TPOT per request with p50/p95, decode tok/s per step, batch size per step ({where}).",
            views.render_latency(report, "demo workload"),
            views.latency_text(report),
        ),
        Entry(
            "live_latency",
            "Latency and throughput, live",
            "What the panel's latency view (the batch | latency toggle) and the HTML replay draw as the "
            "engine steps, from the events of the completed steps: each row's TTFT split into queued, "
            "prefill and first token; the ITL per row and step (a dark column: a step stalled by a "
            "prefill); tokens per second per step, decode and prefill apart, with the step's wall time "
            f"({where}).",
            live.render_live_latency(report.events, "demo workload"),
            live.live_latency_text(report.events),
        ),
    ]


def write_gallery(
    out_dir: Path, entries: list[Entry] | None = None, echo: Callable[[str], None] = print
) -> Path:
    """Write ``out_dir/views/<stem>.png`` per entry and ``out_dir/views.md``; returns the
    Markdown file's path. An existing ``views.md``'s part from :data:`HAND_WRITTEN` on is kept
    at the end (``--out docs``: the sections written by hand)."""
    entries = gallery_entries() if entries is None else entries
    (out_dir / "views").mkdir(parents=True, exist_ok=True)
    parts = [
        "# Views gallery",
        "",
        "Every picture is drawn by `workbench.views` from the live engine's own snapshots and "
        "events. Written by `workbench gallery --out docs` (edit by hand only the sections after the last "
        "view: it keeps them); each view's text form "
        "follows its picture. See `notebooks/02_join_evict.ipynb` for the story step by step "
        "and `wb.views.Panel(sched)` for the live widget.",
        "",
    ]
    for e in entries:
        e.figure.savefig(out_dir / "views" / f"{e.stem}.png", dpi=GALLERY_DPI)
        parts += [
            f"## {e.title}",
            "",
            e.caption,
            "",
            f"![{e.title}](views/{e.stem}.png)",
            "",
            "```",
            e.text,
            "```",
            "",
        ]
    md = out_dir / "views.md"
    old = md.read_text() if md.is_file() else ""
    kept = old[old.index(HAND_WRITTEN) :] if HAND_WRITTEN in old else ""
    md.write_text("\n".join(parts) + ("\n" + kept if kept else ""))
    echo(f"wrote {md} and {len(entries)} PNGs in {out_dir / 'views'}")
    return md
