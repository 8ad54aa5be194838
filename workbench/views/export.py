"""A run as one self-contained HTML file: its snapshots step by step with a slider and a
play button, for any browser, with no kernel and no server (``file://`` works).

Knows: snapshots, the event log and the views that draw them. Must not know: the engine
(a run is anything with ``history`` and ``events``, e.g. a
:class:`~workbench.engine.scheduler.Scheduler`).

What a frame (one snapshot of the history) shows, as the panel does:

- the decode masks (:func:`~workbench.views.mask.render_masks`) and the KV geometry with the
  history up to it (:func:`~workbench.views.kv.render_kv`); in the packed layout the latest
  forward's mask and the page table (:func:`~workbench.views.packed.render_packed_mask`,
  :func:`~workbench.views.packed.render_page_table`);
- each row's TTFT and its parts (:func:`~workbench.views.live.render_ttft`) and the live
  latency text, from the events of the steps it had completed and the arrivals it had seen
  (:func:`~workbench.views.live.events_seen`);
- the row timeline with each step's prefill and decode phases
  (:func:`~workbench.views.phases.render_phases`: a prefill as wide as its tokens on the step
  axis and as its seconds on the wall axis, side by side; a decoding row waiting through
  another request's prefill hatched), tokens per second per step with the wall time and the
  ITL per row and step: drawn once for the whole run, with what the frame had not seen
  veiled (a white veil from where the frame stands to the axes' right edge, moved by the
  script), so they grow as it plays. On the timeline the veil starts where the last phase
  the snapshot had seen ends (:func:`phases_seen`, by
  :func:`~workbench.views.follow.seen_by`: the snapshot after an ``admit()`` shows that
  step's prefill, the one before it does not); on the other two at the frame's step.

Size: every image is a PNG quantized to ``COLOURS`` colours, stored once however many
frames show it (a TTFT figure changes only when a first token lands) and embedded as
base64; the script is a few lines of vanilla JavaScript. Notebook 01's run (155
snapshots) is measured in ``docs/views.md``.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..observe.events import events_frame
from ..observe.snapshot import Snapshot
from .follow import seen_by
from .kv import bytes_text, render_kv
from .live import (
    events_seen,
    live_latency_text,
    render_itl,
    render_step_rates,
    render_ttft,
    ttft_parts,
    waiting_uids,
)
from .mask import render_masks
from .packed import render_packed_mask, render_page_table
from .phases import PREFILL_KINDS, render_phases, step_phases

WIDTH_IN = 4.7  # the panel's image width: two side by side in a 1000 px page
MAX_HEIGHT_IN = 2.8
WIDE_MAX_HEIGHT_IN = 3.6  # the whole-run figures: a timeline of 14 rows keeps its labels apart
TIMELINE_AXES = ("step", "time")  # the replay's timeline: both axes side by side, twice WIDTH_IN wide
DPI = 90  # 423 px wide images, their smallest text (8.3 pt) 10.4 px: notebook 01's run fits 3 MB
COLOURS = 32  # palette size of the embedded PNGs (the views use a few dozen colours)
WIDE_COLOURS = 256  # the whole-run figures, drawn once: small markers keep their colours
FRAME_MS = 400  # the play button's pace: one snapshot every FRAME_MS milliseconds


def quantized_png(fig: Figure, dpi: int = DPI, colours: int = COLOURS) -> bytes:
    """``fig`` as a PNG of at most ``colours`` palette colours (Pillow's median cut,
    ``optimize``): a third of the size of matplotlib's RGBA PNG for these flat figures."""
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    image = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    out = io.BytesIO()
    image.quantize(colors=colours, method=Image.Quantize.MEDIANCUT).save(out, format="png", optimize=True)
    return out.getvalue()


def step_veil(fig: Figure, axes: Sequence[Any], dpi: int = DPI) -> dict[str, float]:
    """Where an x value falls on ``fig`` drawn at ``dpi``, as shares of the image: the veil
    at ``x`` (a step, or on the timeline's wall axis seconds) covers ``x0 + x * dx`` to
    ``right`` and ``top`` to ``bottom`` (the union of ``axes``, which share their x axis, in
    image shares from the top left)."""
    fig.set_dpi(dpi)
    FigureCanvasAgg(fig).draw()
    w, h = fig.bbox.width, fig.bbox.height
    x0, x1 = (axes[0].transData.transform((s, 0))[0] for s in (0, 1))
    boxes = [ax.get_window_extent() for ax in axes]
    return {
        "x0": x0 / w,
        "dx": (x1 - x0) / w,
        "right": max(b.x1 for b in boxes) / w,
        "top": 1 - max(b.y1 for b in boxes) / h,
        "bottom": 1 - min(b.y0 for b in boxes) / h,
    }


def phases_seen(phases: pd.DataFrame, seen: pd.DataFrame) -> dict[str, float]:
    """Where the phases of a run (:func:`~workbench.views.phases.step_phases`) that a
    snapshot had seen end, on each axis of ``TIMELINE_AXES`` (tokens on the step axis,
    seconds since the first submit on the wall axis; 0 before any): a step's prefill phase
    once ``seen`` (the events the snapshot had seen) holds one of its prefill chunks or
    joins, its decode phase once it holds one of its tokens.

    >>> ph = pd.DataFrame({"step": [0, 0], "phase": ["prefill", "decode"], "step_left": [0, 5],
    ...     "step_width": [5, 1], "time_left": [0.0, 0.5], "time_width": [0.5, 0.1]})
    >>> seen = pd.DataFrame({"kind": ["submit", "join"], "step": [0, 0]})
    >>> phases_seen(ph, seen)
    {'step': 5.0, 'time': 0.5}
    """
    pre = set(seen.step[seen.kind.isin(PREFILL_KINDS)])
    dec = set(seen.step[seen.kind == "token"])
    done = phases[[s in (pre if p == "prefill" else dec) for s, p in zip(phases.step, phases.phase)]]
    return {
        x: float((done[f"{x}_left"] + done[f"{x}_width"]).max()) if len(done) else 0.0 for x in TIMELINE_AXES
    }


def _short(fig: Figure, max_height_in: float = MAX_HEIGHT_IN) -> Figure:
    if fig.get_figheight() > max_height_in:
        fig.set_size_inches(fig.get_figwidth(), max_height_in)
    return fig


def frame_status(i: int, n: int, snap: Snapshot) -> str:
    """The line over a frame's images: which snapshot of how many, its step, rows, KV
    bytes and queue.

    >>> frame_status(2, 9, Snapshot(1, (0, 4), (False, False), (1, 1), (3, 3), (), (), 4, 8, 2048))
    'snapshot 3 of 9 · step 1 · 2 row(s): uid 0, 4 · KV 2.00 KiB · queue []'
    """
    rows = f": uid {', '.join(map(str, snap.uids))}" if snap.uids else ""
    return (
        f"snapshot {i + 1} of {n} · step {snap.step} · {snap.batch_size} row(s){rows} · "
        f"KV {bytes_text(snap.kv_bytes)} · queue {list(snap.queue)}"
    )


def _run_parts(run: Any, events: Any) -> tuple[list[Snapshot], pd.DataFrame]:
    """The snapshots and the events frame of ``run`` (see :func:`export_html`)."""
    if hasattr(run, "history") and hasattr(run, "events"):
        snaps, events = list(run.history), run.events if events is None else events
    else:
        snaps = list(run)
    if events is None:
        raise ValueError("export_html: events is required with a list of snapshots (a run's events)")
    if not snaps:
        raise ValueError(
            "export_html: the run has no snapshot (history_size=0?); create the Scheduler with "
            "history_size=N to keep N snapshots"
        )
    if not all(isinstance(s, Snapshot) for s in snaps):
        raise TypeError("export_html: run must be a Scheduler (history and events) or a list of Snapshots")
    return snaps, events if isinstance(events, pd.DataFrame) else events_frame(list(events))


def export_html(
    run: Any,
    path: str | Path,
    events: Any = None,
    title: str = "workbench replay",
    dpi: int = DPI,
    colours: int = COLOURS,
) -> Path:
    """Write ``run`` as one self-contained HTML file at ``path`` (module docstring): a
    slider over its snapshots, a play button, and per snapshot the masks, the KV geometry
    (or the packed layout's mask and pages), the TTFT per row, and the phases timeline
    (step and wall axes), tokens per second and ITL of the whole run veiled after what the
    snapshot had seen.

    Args:
        run: a :class:`~workbench.engine.scheduler.Scheduler` (its ``history``: the latest
            ``history_size`` snapshots, and its ``events``), or a list of :class:`Snapshot`.
        path: the file to write (its folder is created).
        events: the run's event log (a list of :class:`~workbench.observe.events.Event` or an
            events frame); required with a list of snapshots, else the scheduler's.
        title: the page's heading.
        dpi, colours: the PNGs' resolution and palette size (:func:`quantized_png`).

    Returns:
        The path written.

    Raises:
        ValueError: no snapshot, or a list of snapshots without ``events``.
        TypeError: ``run`` is neither a scheduler nor a list of snapshots.
        OSError: the file cannot be written.
    """
    snaps, ev = _run_parts(run, events)
    images: dict[bytes, int] = {}

    def image(fig: Figure, palette: int = colours) -> int:
        return images.setdefault(quantized_png(fig, dpi, palette), len(images))

    tokens = ev[ev.kind == "token"]
    steps = (0, int(tokens.step.max()) if len(tokens) else 0)  # the timeline's steps: to the last token
    timeline = render_phases(
        ev, axes=TIMELINE_AXES, title="row timeline: prefill and decode phases", width_in=2 * WIDTH_IN
    )
    wide = {  # per figure: the axes of each veil (those of one veil share their x axis)
        "timeline": (timeline, [[ax] for ax in timeline.axes[: len(TIMELINE_AXES)]]),
        "rates": (rates := render_step_rates(ev, width_in=WIDTH_IN, steps=steps), [rates.axes[:2]]),
        "itl": (itl := render_itl(ev, width_in=WIDTH_IN, steps=steps), [itl.axes[:1]]),
    }
    veils = {}
    for name, (fig, groups) in wide.items():
        _short(fig, WIDE_MAX_HEIGHT_IN)  # before the veil: it is measured on the figure as drawn
        drawn = [g for g in groups if g[0].axison]  # an empty run's axes are off: no veil
        veils[name] = {"image": image(fig, WIDE_COLOURS), "veils": [step_veil(fig, g, dpi) for g in drawn]}
    phases = step_phases(ev)
    frames, ttft = [], {}  # TTFT figures by what they draw: one per first token landing
    for i, snap in enumerate(snaps):
        seen = events_seen(ev, snap)
        cut = phases_seen(phases, ev[seen_by(ev, snap)])
        drawn = (tuple(ttft_parts(seen).itertuples(index=False)), tuple(waiting_uids(seen)))
        if drawn not in ttft:
            ttft[drawn] = image(_short(render_ttft(seen, width_in=WIDTH_IN)))
        packed = snap.packed is not None
        mask = (
            render_packed_mask(snap, width_in=WIDTH_IN) if packed else render_masks(snap, width_in=WIDTH_IN)
        )
        kv = (
            render_page_table(snap, width_in=WIDTH_IN)
            if packed
            else render_kv(snap, snaps[: i + 1], WIDTH_IN)
        )
        frames.append(
            {
                "step": snap.step,
                "status": frame_status(i, len(snaps), snap),
                "mask": image(_short(mask)),
                "kv": image(_short(kv)),
                "ttft": ttft[drawn],
                "text": live_latency_text(seen),
                "at": {  # per wide figure, where each of its veils starts (x0 + at * dx)
                    name: [cut[x] for x in TIMELINE_AXES] if name == "timeline" else [snap.step]
                    for name in wide
                },
            }
        )
    uris = [f"data:image/png;base64,{base64.b64encode(png).decode()}" for png in images]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page(title, uris, frames, veils), encoding="utf-8")
    return out


PAGE_STYLE = """
body { font-family: sans-serif; margin: 12px; max-width: 980px; }
.controls { display: flex; align-items: center; gap: 10px; margin: 6px 0; }
#slider { flex: 1; }
#label { font-size: 14px; margin: 4px 0 8px; }
.grid { display: flex; flex-wrap: wrap; gap: 8px; align-items: flex-start; }
.grid img { display: block; max-width: 100%; }
.veiled { position: relative; }
.veil { position: absolute; background: rgba(255, 255, 255, 0.82); border-left: 2px solid #000; }
pre { font-size: 12px; }
"""

PAGE_SCRIPT = """
const slider = document.getElementById("slider"), play = document.getElementById("play");
let timer = null;
function show(i) {
  const f = FRAMES[i];
  for (const name of ["mask", "kv", "ttft"]) document.getElementById(name).src = IMAGES[f[name]];
  document.getElementById("label").textContent = f.status;
  document.getElementById("text").textContent = f.text;
  for (const [name, w] of Object.entries(WIDE)) w.veils.forEach((v, j) => {
    const veil = document.getElementById(name + "-veil-" + j);
    const left = Math.min(v.right, v.x0 + f.at[name][j] * v.dx);
    Object.assign(veil.style, {left: 100 * left + "%", width: 100 * (v.right - left) + "%",
      top: 100 * v.top + "%", height: 100 * (v.bottom - v.top) + "%"});
  });
}
function stop() { clearInterval(timer); timer = null; play.textContent = "\\u25B6 play"; }
play.addEventListener("click", () => {
  if (timer) return stop();
  if (+slider.value === FRAMES.length - 1) slider.value = 0;
  play.textContent = "\\u275A\\u275A pause";
  timer = setInterval(() => {
    slider.value = +slider.value + 1; show(+slider.value);
    if (+slider.value >= FRAMES.length - 1) stop();
  }, FRAME_MS);
});
slider.addEventListener("input", () => show(+slider.value));
show(0);
"""


def page(title: str, uris: list[str], frames: list[dict], wide: dict) -> str:
    """The HTML page: controls, the frame's images, the veiled whole-run figures, the
    latency text, and the data (``IMAGES``: data URIs; ``FRAMES``: per snapshot its step,
    status line, image indices, text and ``at``: per whole-run figure where each veil starts;
    ``WIDE``: per whole-run figure its image and ``veils``, each one's geometry,
    :func:`step_veil`) with :data:`PAGE_SCRIPT`."""
    wide_html = "".join(
        f'<div class="veiled"><img id="{name}" src="{uris[w["image"]]}" alt="{name}">'
        + "".join(f'<div class="veil" id="{name}-veil-{j}"></div>' for j in range(len(w["veils"])))
        + "</div>"
        for name, w in wide.items()
    )
    data = (
        f"const IMAGES = {json.dumps(uris)};\nconst FRAMES = {json.dumps(frames)};\n"
        f"const WIDE = {json.dumps(wide)};\nconst FRAME_MS = {FRAME_MS};\n"
    )
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{PAGE_STYLE}</style></head><body>\n<h2>{html.escape(title)}</h2>\n"
        '<div class="controls"><button id="play">\u25b6 play</button>'
        f'<input id="slider" type="range" min="0" max="{len(frames) - 1}" value="0" step="1"></div>\n'
        '<div id="label"></div>\n<div class="grid">'
        '<img id="mask" alt="masks"><img id="kv" alt="KV geometry">'
        f'{wide_html}<img id="ttft" alt="TTFT per row"></div>\n<pre id="text"></pre>\n'
        f"<script>\n{data}{PAGE_SCRIPT}</script>\n</body></html>\n"
    )
