"""Views: pure functions from a snapshot, a snapshot history or a report to text or a
matplotlib Figure, and the ipywidgets :class:`Panel` around a live scheduler.

Knows: snapshots, reports, matplotlib. Must not know: the engine's internals; views never
call the engine and never hold engine state (the panel only calls its public methods).

=====================  ==========================  ==============================
view                   text form                   rich form
=====================  ==========================  ==============================
masks (snapshot)       ``mask_text``               ``render_masks``
KV geometry            ``kv_text``,                ``render_kv(snap, history)``
                       ``kv_history_text``
row timeline (events)  ``timeline_text``           ``render_timeline(x=time|step)``
step phases (events)   ``stalls_text``             ``render_phases`` (prefill width in
                                                   tokens and seconds, stalls)
roofline (bench CSVs)  ``roofline_text``           ``render_roofline`` (both roofs, KV)
latency (report)       ``latency_text``            ``render_latency``
live latency (events)  ``live_latency_text``       ``render_live_latency``, and
                                                   ``render_ttft``, ``render_itl``,
                                                   ``render_step_rates`` (``views.live``)
paged vs padded KV     ``paged_text``              ``render_paged(table)``
divergence by layer    ``divergence_text(table)``  ``render_divergence(table)``
2-D masks (forwards)   ``attention_text``          ``render_attention``
slots x steps (events) ``slots_text``              ``render_slots``
ring buffer (snaps)    ``LayerGroup.text``         ``render_ring``
state vs KV (history)  ``state_text``              ``render_state``
mistake vs engine      ``gaps_text``               ``render_gaps`` (Δ log-prob, tolerance)
packed layout (snap)   ``packed_text``,            ``render_packed_mask``,
                       ``budget_text(history)``    ``render_page_table``,
                                                   ``render_token_budget(history)``
drafts (events)        ``drafts_text``             ``render_drafts``
verify forward (snap   ``verify_text``             ``render_verify`` (``views.verify``)
  + events)
pages shared (snaps)   ``sharing_text``            ``render_sharing`` (``views.sharing``)
quantized key (arrays) ``key_error_text``          ``render_key_error`` (``views.quant_error``)
reduction order        ``reduction_text``          ``render_reduction`` (``views.reduction``)
  (vectors)
a step's forwards      ``hybrid_text``             ``render_hybrid`` (``views.hybrid``)
  (events + snap)
LoRA slots (snap)      ``adapters_text``           ``render_adapters``,
                                                   ``render_adapter_slots`` (events)
live panel             ``Panel.static()``          ``Panel(sched)`` (ipywidgets)
a run, replayable      (per frame, in the page)    ``export_html(sched, path)``: one
                                                   HTML file, slider and play button
=====================  ==========================  ==============================

The phases and roofline rows, and the rows after the divergence view, live in their
modules (``views.phases``, ``views.roofline``, ``views.attention``,
``views.slots``, ``views.ring``, ``views.state``, ``views.gaps``, ``views.packed``,
``views.adapters``); the panel shows the packed views for a ``Scheduler(layout="packed")``.
``Panel`` is imported lazily: importing this package does not import ipywidgets.
"""

from .divergence import divergence_text, render_divergence
from .export import export_html
from .kv import kv_history_text, kv_text, render_kv
from .latency import latency_text, render_latency
from .live import live_latency_text, render_live_latency
from .mask import mask_text, render_masks
from .paged import paged_text, render_paged
from .speculative import drafts_text, render_drafts
from .style import figure_png
from .timeline import render_timeline, render_timelines, timeline_text

__all__ = [
    "Panel",
    "divergence_text",
    "drafts_text",
    "export_html",
    "figure_png",
    "kv_history_text",
    "kv_text",
    "latency_text",
    "live_latency_text",
    "mask_text",
    "paged_text",
    "render_divergence",
    "render_kv",
    "render_latency",
    "render_live_latency",
    "render_masks",
    "render_drafts",
    "render_paged",
    "render_timeline",
    "render_timelines",
    "timeline_text",
]


def __getattr__(name: str):
    if name == "Panel":
        from .panel import Panel

        return Panel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
