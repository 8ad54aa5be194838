"""The live panel: an ipywidgets shell around a :class:`~workbench.engine.scheduler.Scheduler`.

Knows: the scheduler's public calls (``submit / admit / step / filter / run / snapshot /
report`` and its ``history``), the views, ipywidgets. Must not know: the engine's
internals. This is the only module of the workbench that imports ipywidgets.

The panel holds no engine state: everything it shows is read from ``panel.sched``, its
snapshots (``sched.history``) and its report. Every button calls the engine *outside* any
output widget, then takes a snapshot and re-renders; an engine error (e.g. a request that
fails validation, which changes nothing) is shown in the panel's error label.

Widgets (``panel.widget`` is the whole box)::

    [prompt ..........] [max tokens] [Submit]
    [Admit] [Step] [Filter] [steps N] [Run N steps] [Reset] [batch|latency]  <- which images show
    engine now: step 3 · 2 row(s) · KV 1.00 MiB · queue []   <- status (class wb-status)
    Step: no running row to decode (...)                      <- notice (class wb-notice): an
                                                                 Admit/Step/Filter that did nothing
    error: ...                                                <- error  (class wb-error)
    history [----o---] showing: snapshot 5 of 9 (step 3) [Restore]  <- scrubs sched.history;
                                                                 Restore returns the engine there
    [decode masks (wb-mask-image)] [2-D mask of the last prefill (wb-attention-image)]
    [KV geometry (wb-kv-image)]    [row timeline (wb-timeline-image)]  <- each step's prefill and
                                     decode phases (views.phases): a prefill as wide as its tokens,
                                     a decoding row waiting through it hatched (stalled)
    or, with "latency" toggled (views.live, drawn only while shown, the same size):
    [TTFT per row: queued, prefill, first token (wb-ttft-image)] [tok/s per step, wall time (wb-rates-image)]
    [ITL per row and step (wb-itl-image)]   [the same numbers as text (wb-latency-text)]
    uid 0 (5 tokens)  "def add(a, b):" → "⏎    return a + b"   <- each row's text (wb-rows)
    row 1 uid 1  ' x'  -0.40 | ' y'  -2.00                    <- top log-probs (wb-top-logprobs) of
                                                                   rows that asked top_logprobs
    [draft tokens per row and step (wb-drafts-image)]          <- only while the scheduler speculates:
    uid 0 | ++++ ++-  +--- .    | 7/11 accepted (64%), ...        accepted (+) / rejected (-) drafts
                                                                   of the shown snapshot's rows, the
                                                                   latest DRAFT_STEPS steps (wb-drafts)
    > text masks (ASCII)                                       <- folded: the nbval-style text form

The latency view reads the events of the decode steps the shown snapshot had completed, and
the arrivals it had seen (:func:`~workbench.views.live.events_seen`), so it follows the engine as it steps and the
slider as it moves back: a row's TTFT bar appears with its first token.

The images are PNGs at ``IMAGE_DPI``, ``IMAGE_WIDTH_IN`` inches wide: 470 pixels, two side
by side in a JupyterLab output area of a 1400 px window (968 px), each shown at its own
size, so their smallest text (``fontsize="small"``, 8.3 pt) is 11.6 pixels at 100% zoom
(``style.smallest_text_px``). The controls and both rows of images fit a 1400 x 900
screen together. Where the output area is narrower, the images wrap one under another.

*Restore* returns the engine to the snapshot the slider shows (``sched.restore`` of the
checkpoint kept with it): enabled when the scheduler keeps checkpoints with its history
(``Scheduler(history_checkpoints=N)``, or ``sched.fork(history_checkpoints=N)``, which keeps
one of the state it forks) and the slider is not at the latest snapshot (the engine now); the
later snapshots then leave the history, and the notice says how many.

``Panel(server)`` follows a served engine (``wb.serve``, docs/serve.md): a follower thread
takes a copy every ``FOLLOW_S`` seconds through ``server.between`` (on the engine thread,
between two engine calls) and redraws from it; the buttons that call the engine are off
(a label, class wb-follow, says which server it follows) until ``server.stop()``.

*Reset* replaces ``panel.sched`` by a fresh scheduler with the same model, tokenizer and
configuration (``reset_scheduler``, or the ``reset`` callable given to the panel); the old
scheduler is left untouched. In a headless run (nbclient, nbval, static HTML) the widget
does not render; :meth:`Panel.static` gives the same views as PNG images and text.
"""

from __future__ import annotations

import base64
import html
import threading
from collections.abc import Callable
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

try:
    import ipywidgets as W
    from IPython.display import HTML
except ImportError as exc:  # the engine and the figure views do not need them
    raise ImportError(
        f"wb.views.Panel needs ipywidgets and IPython ({exc}); install them with "
        'pip install -e ".[notebooks]" (or pip install ipywidgets)'
    ) from exc

from ..engine.request import Request
from ..engine.scheduler import Scheduler
from ..observe.events import events_frame
from ..observe.forward_masks import ForwardMask, prefill_forwards
from ..observe.snapshot import Snapshot
from . import style
from .attention import render_attention
from .follow import seen_by
from .kv import bytes_text, render_kv
from .live import events_seen, live_latency_text, render_itl, render_step_rates, render_ttft
from .mask import mask_text, render_masks
from .packed import packed_text, render_packed_mask, render_page_table
from .phases import render_phases
from .rows import rows_text
from .served import EngineCopy, engine_copy
from .speculative import drafts_text, render_drafts
from .top_logprobs import top_logprobs_text

IMAGE_DPI = 100  # with IMAGE_WIDTH_IN: images of 470 px whose smallest text is 11.6 px
# images at most 260 px tall: the buttons, the status and both rows of images (2 x 260 px) fit the
# ~770 px notebook area of a 1400 x 900 JupyterLab window; a taller figure is drawn shorter
IMAGE_MAX_HEIGHT_IN = 2.6
IMAGE_WIDTH_IN = 4.7  # two images side by side (940 px and their margins) in a 968 px output area
TIMELINE_EVENTS = 4000  # the timeline image draws the latest events only: its cost stays flat over a session
TIMELINE_UIDS = 24
DRAFT_STEPS = 16  # the draft view shows the latest decode steps: it moves as the user steps
FOLLOW_S = 0.5  # Panel(server): seconds between two copies of the served engine (a redraw at most that often)
COPY_TIMEOUT_S = 30.0  # how long the panel waits for the engine thread to hand over a copy
BY_HAND = (  # under the latency text while the panel drives the engine (a step's wall_s: views.live)
    "stepped by hand, a step's wall time (from the previous\n"
    "step's end) includes the pause between two clicks;\nRun N steps times the engine alone"
)


VIEWS = ("batch", "latency")  # what the panel's images show: the toggle in its second row of buttons
VIEW_TOOLTIPS = (
    "masks, the last prefill, KV geometry and the row timeline",
    "each row's TTFT (queued, prefill, first token), tokens per second per step with its wall "
    "time, ITL per row and step",
)


def capped(figures: dict) -> dict:
    """``figures`` with every figure taller than ``IMAGE_MAX_HEIGHT_IN`` drawn that tall
    (constrained layout packs the axes into the shorter figure; the text keeps its size)."""
    for fig in figures.values():
        if fig.get_figheight() > IMAGE_MAX_HEIGHT_IN:
            fig.set_size_inches(fig.get_figwidth(), IMAGE_MAX_HEIGHT_IN)
    return figures


def reset_scheduler(sched: Scheduler) -> Scheduler:
    """A fresh scheduler with ``sched``'s model, tokenizer and configuration
    (``Scheduler.fresh``)."""
    return sched.fresh()


def nothing_to_do(call: str, snap: Snapshot) -> str:
    """What the panel says when ``call`` (``"admit"``, ``"step"`` or ``"filter"``) returned
    no event on the engine ``snap`` shows (after the call): why, and what to press instead.

    >>> nothing_to_do("filter", Snapshot(0, (), (), (), (), (), (), 0, 0, 0))
    'Filter: no finished row to evict.'
    """
    queued = f"queue {list(snap.queue)}: press Admit" if snap.queue else "submit a prompt, then Admit"
    if call == "admit" and snap.queue:
        return (
            f"Admit: queue {list(snap.queue)} waits: the {snap.batch_size} running row(s) hold the "
            "batch's rows or its KV budget (press Step until a row finishes, then Filter)."
        )
    if call == "admit":
        return "Admit: nothing to admit (the queue is empty" + (
            f"; {snap.batch_size} row(s) running: press Step)."
            if snap.batch_size
            else "; submit a prompt first)."
        )
    if call == "step":
        return f"Step: no running row to decode ({queued})."
    if call == "filter":
        return "Filter: no finished row to evict."
    raise ValueError(f"call must be 'admit', 'step' or 'filter', got {call!r}")


NO_CHECKPOINTS = "Scheduler(history_checkpoints=N) keeps checkpoints to restore"


def restore_note(history, index: int, kept: int, owner: str | None = None, short: bool = False) -> str | None:
    """Why ``history[index]`` cannot be restored, in words (``None``: it can): no
    checkpoints kept (``kept == 0``); the snapshot is the latest, which the panel records
    after every action, so the engine is there already; or no checkpoint of ``owner``
    (the scheduler's id; ``None``: any) is kept with it: only the ``kept`` latest snapshots
    since the scheduler began keeping them (for a fork, from the state it forked) have one.
    ``short``: the few words the slider's label has room for (the tooltip gives the rest).

    >>> from workbench.observe.recorder import History
    >>> restore_note(History([1, 2, 3]), 0, 0) == NO_CHECKPOINTS
    True
    """
    if not kept:
        return NO_CHECKPOINTS
    if index == len(history) - 1:
        return (
            "the engine now: nothing to restore"
            if short
            else "the engine is at this snapshot: nothing to restore"
        )
    cp = history.checkpoint(index)
    if cp is not None and (owner is None or cp.scheduler_id == owner):
        return None
    have = [
        i
        for i in range(len(history))
        if history.checkpoint(i) is not None
        and (owner is None or history.checkpoint(i).scheduler_id == owner)
    ]
    if not have or have[0] == len(history) - 1:  # none, or only the engine now's: nothing older to go back to
        return (
            "Restore greyed: no older checkpoint; act, then come back"
            if short
            else "no checkpoint kept before the engine now: after your next action, its snapshot can be restored"
        )
    if short:
        return f"Restore greyed here: checkpoints from snapshot {have[0] + 1} on"
    return f"no checkpoint kept this far back: move the slider to snapshot {have[0] + 1} or later to restore"


def prefill_figure(fm: ForwardMask | None) -> Figure:
    """The panel's 2-D mask image: ``fm``'s rows (query x key, :func:`render_attention`),
    at most three, or an empty state that says what makes one."""
    if fm is None:
        fig = Figure(figsize=(IMAGE_WIDTH_IN, 2.4), layout="constrained")
        fig.suptitle("2-D mask of the last prefill", fontsize="medium")
        style.empty(fig.add_subplot(), "no prefill yet: submit a prompt, then Admit")
        return fig
    more = f" (first 3 of {len(fm.uids)} rows)" if len(fm.uids) > 3 else ""
    label = fm.label.replace("prefill ", "last prefill: ", 1) + more
    shown = ForwardMask(
        label, fm.uids[:3], fm.mask[:3], fm.n_cached, fm.query_padding[:3], fm.key_padding[:3], fm.first_event
    )
    return render_attention([shown], columns=len(shown.uids), width_in=IMAGE_WIDTH_IN)


def draft_events(events: pd.DataFrame, snap: Snapshot) -> pd.DataFrame:
    """The events of ``snap``'s rows logged by the decode steps before it (``step <
    snap.step``): what the draft view of that snapshot reads."""
    return events[(events.step < snap.step) & events.uid.isin(list(snap.uids))]


def drafts_figure(events: pd.DataFrame, snap: Snapshot, num_draft_tokens: int | None = None) -> Figure:
    """The panel's draft image for ``snap``: accepted / rejected draft tokens of its rows
    over the latest ``DRAFT_STEPS`` decode steps (:func:`render_drafts` of
    :func:`draft_events`; a box holds ``num_draft_tokens``, the scheduler's setting),
    ``IMAGE_WIDTH_IN`` wide, or an empty state that says what makes drafts."""
    ev = draft_events(events, snap)
    drafting = ev[ev.kind == "draft"].uid.nunique()
    if not drafting:
        fig = Figure(figsize=(IMAGE_WIDTH_IN, 2.0), layout="constrained")
        fig.suptitle("draft tokens per row and step", fontsize="medium")
        style.empty(fig.add_subplot(), "no drafts yet: Step rows whose context repeats itself")
        return fig
    return render_drafts(
        ev,
        title=f"drafts of the rows at step {snap.step}",
        width_in=IMAGE_WIDTH_IN,
        height_in=min(3.4, 1.9 + 0.3 * drafting),
        last_steps=DRAFT_STEPS,
        num_draft_tokens=num_draft_tokens,
    )


def status_text(snap: Snapshot) -> str:
    """The status line of the engine now (its latest snapshot ``snap``): step, rows, KV
    bytes (KiB / MiB, :func:`~workbench.views.kv.bytes_text`) and the queue.

    >>> status_text(Snapshot(3, (), (), (), (), (), (), 0, 0, 0))
    'engine now: step 3 · 0 row(s) · KV 0 bytes · queue []'
    """
    return (
        f"engine now: step {snap.step} · {snap.batch_size} row(s) · KV {bytes_text(snap.kv_bytes)} "
        f"· queue {list(snap.queue)}"
    )


def shown_prompt(valid: Any, decode: Callable[[list[int]], str]) -> str:
    """What the rows' text shows of a request's prompt: the last user message of a chat
    request (``messages``), not its chat template's tail; else the prompt ids ``decode`` d."""
    messages = valid.request.messages
    if messages:
        users = [m["content"] for m in messages if m.get("role") == "user"]
        return users[-1] if users else messages[-1]["content"]
    return decode(list(valid.prompt_ids))


def recorded_copy(sched: Scheduler) -> EngineCopy:
    """Record a snapshot of ``sched`` as it is now, then :func:`engine_copy` it: what a Panel
    opened on a served engine asks its engine thread for first."""
    sched.snapshot(record=True)
    return engine_copy(sched)


class Panel:
    """Buttons, a history slider and live mask, KV and timeline images for ``sched``.

    Args:
        sched: the scheduler to drive (``panel.sched``; replaced by Reset), or a running
            server (``wb.serve(sched)``): the panel then *follows* the served engine. Every
            ``follow_s`` seconds its follower thread asks the engine thread for a copy taken
            between two engine calls (``server.between``, :mod:`workbench.views.served`) and
            redraws when the engine changed; it never reads the scheduler while it steps.
            Submit / Admit / Step / Filter / Run / Reset are off (refused with a notice) and
            Restore waits for ``server.stop()``; the slider scrubs the copy. After
            ``server.stop()`` the panel drives the scheduler as usual.
        max_tokens: initial value of the max-tokens box.
        run_steps: initial value of the "steps N" box.
        reset: ``reset(old_sched) -> new_sched`` used by Reset (default
            :func:`reset_scheduler`).
        shown: index into ``sched.history`` of the snapshot to show first (the slider's
            value; drawn once); default: the newest, the one the panel records on opening.
        prompt: initial text of the prompt box.
        chat: Submit sends the prompt box's text as a chat request, one user message
            (``Request(messages=[{"role": "user", "content": text}])``, encoded with the
            tokenizer's chat template: for an instruct model); default: a plain-text prompt.
        follow_s: with a server: seconds between two copies (a redraw at most that often,
            whatever the token rate).

    Raises:
        ValueError: when ``shown`` is not an index of ``sched.history``.
    """

    def __init__(
        self,
        sched: Scheduler | Any,
        max_tokens: int = 16,
        run_steps: int = 8,
        reset: Callable[[Scheduler], Scheduler] = reset_scheduler,
        shown: int | None = None,
        prompt: str = "def add(a, b):",
        chat: bool = False,
        follow_s: float = FOLLOW_S,
    ):
        self.server = sched if not isinstance(sched, Scheduler) and hasattr(sched, "between") else None
        sched = self.server.sched if self.server is not None else sched
        self.follow_s = follow_s
        self._copy: EngineCopy | None = None  # while served: the engine thread's latest copy, what is drawn
        self._lock = threading.RLock()  # one render at a time: the follower's thread or a widget callback
        self._unfollow = threading.Event()
        self.follower: threading.Thread | None = None
        self.follow_error: Exception | None = None  # what ended the follower thread, if it raised
        if shown is not None and not 0 <= shown < len(sched.history):
            raise ValueError(
                f"Panel: shown={shown} is not an index of sched.history (0 to {len(sched.history) - 1})"
            )
        self.sched = sched
        self._reset = reset
        self.chat = chat
        self.prompt = W.Text(value=prompt, description="prompt")
        self.max_tokens = W.IntText(value=max_tokens, description="max tokens")
        self.run_steps = W.IntText(value=run_steps, description="steps N")
        self.buttons = {
            name: W.Button(description=name)
            for name in ("Submit", "Admit", "Step", "Filter", "Run N steps", "Reset", "Restore")
        }
        actions = {
            "Submit": self.on_submit,
            "Admit": self.on_admit,
            "Step": self.on_step,
            "Filter": self.on_filter,
            "Run N steps": self.on_run,
            "Reset": self.on_reset,
            "Restore": self.on_restore,
        }
        for name, button in self.buttons.items():
            button.on_click(lambda _b, act=actions[name]: act())
        self.status = W.Label().add_class("wb-status")
        self.error = W.HTML().add_class("wb-error")
        self.notice = W.Label().add_class("wb-notice")  # an action that had nothing to do says so
        self.follow_note = W.Label().add_class("wb-follow")  # while served: whose engine it follows
        self.slider = W.IntSlider(description="history", min=0, max=0, continuous_update=False, readout=False)
        self.slider_label = W.Label()
        self._quiet = False  # True while the panel itself moves the slider
        self.slider.observe(lambda _change: None if self._quiet else self.on_scrub(), names="value")

        def natural() -> W.Layout:  # the PNG's own size (never stretched, at most the output's width)
            return W.Layout(max_width="100%", height="auto", align_self="flex-start")

        self.mask_image = W.Image(format="png", layout=natural()).add_class("wb-mask-image")
        self.attention_image = W.Image(format="png", layout=natural()).add_class("wb-attention-image")
        self.timeline_image = W.Image(format="png", layout=natural()).add_class("wb-timeline-image")
        self.kv_image = W.Image(format="png", layout=natural()).add_class("wb-kv-image")
        self.rows = W.HTML().add_class("wb-rows")
        self.mask_ascii = W.HTML()
        self.top_ascii = W.HTML().add_class("wb-top-logprobs")
        self.drafts_image = W.Image(format="png", layout=natural()).add_class("wb-drafts-image")
        self.drafts_ascii = W.HTML().add_class("wb-drafts")
        self.drafts_box = W.VBox([self.drafts_image, self.drafts_ascii])  # shown while speculating
        self.ttft_image = W.Image(format="png", layout=natural()).add_class("wb-ttft-image")
        self.rates_image = W.Image(format="png", layout=natural()).add_class("wb-rates-image")
        self.itl_image = W.Image(format="png", layout=natural()).add_class("wb-itl-image")
        self.latency_ascii = W.HTML(
            layout=W.Layout(
                max_height=f"{IMAGE_MAX_HEIGHT_IN * IMAGE_DPI:.0f}px",
                max_width=f"{IMAGE_WIDTH_IN * IMAGE_DPI:.0f}px",
                overflow="auto",
            )
        ).add_class("wb-latency-text")
        self.view = W.ToggleButtons(options=VIEWS, value=VIEWS[0], tooltips=VIEW_TOOLTIPS)
        self.view.style.button_width = "auto"
        self.view.add_class("wb-view")
        self.view.observe(lambda _change: self.render(), names="value")
        ascii_box = W.Accordion([self.mask_ascii], titles=("text masks (ASCII)",))
        compact = W.Layout(width="auto")
        for w in (self.prompt, self.max_tokens, self.run_steps):
            w.style.description_width = "initial"
        self.max_tokens.layout = self.run_steps.layout = W.Layout(width="140px")
        self.prompt.layout = W.Layout(width="420px")
        for b in self.buttons.values():
            b.layout = compact
        images = W.Layout(flex_flow="row wrap", align_items="flex-start")
        self.batch_box = W.VBox(
            [
                W.HBox([self.mask_image, self.attention_image], layout=images),
                W.HBox([self.kv_image, self.timeline_image], layout=images),
            ]
        )
        self.latency_box = W.VBox(
            [
                W.HBox([self.ttft_image, self.rates_image], layout=images),
                W.HBox([self.itl_image, self.latency_ascii], layout=images),
            ]
        )
        self.widget = W.VBox(
            [
                W.HBox([self.prompt, self.max_tokens, self.buttons["Submit"]]),
                W.HBox(
                    [self.buttons[n] for n in ("Admit", "Step", "Filter")]
                    + [self.run_steps, self.buttons["Run N steps"], self.buttons["Reset"], self.view]
                ),
                self.status,
                self.follow_note,
                self.notice,
                self.error,
                W.HBox([self.slider, self.slider_label, self.buttons["Restore"]]),
                self.batch_box,
                self.latency_box,
                self.rows,
                self.top_ascii,
                self.drafts_box,
                ascii_box,
            ]
        )
        for label in (self.notice, self.error, self.follow_note):  # take no room while empty
            label.observe(
                lambda change: setattr(change.owner.layout, "display", "" if change.new else "none"),
                names="value",
            )
            label.layout.display = "none"
        if self.server is not None and self.server.serving:
            self._copy = self.server.between(recorded_copy).result(COPY_TIMEOUT_S)
            self._serving(True)
            self._follow_history(shown)
            self.follower = threading.Thread(target=self._follow, name="workbench-panel-follow", daemon=True)
            self.follower.start()
            return
        self.sched.snapshot(record=True)  # the engine as it is now, whatever was called since the last one
        self._follow_history(shown)

    # -- following a served engine (Panel(server)) -------------------------------------
    @property
    def source(self) -> Scheduler | EngineCopy:
        """What the panel draws: while it follows a served engine, the engine thread's latest
        :class:`~workbench.views.served.EngineCopy`; else the scheduler itself."""
        return self._copy if self._copy is not None else self.sched

    @property
    def following(self) -> bool:
        """Whether the panel follows a served engine now (its follower thread runs)."""
        return self.follower is not None and self.follower.is_alive()

    def unfollow(self, timeout_s: float = 10.0) -> None:
        """Stop following the served engine (the panel keeps the last copy it drew until the
        server stops; ``server.stop()`` ends the following by itself). Idempotent."""
        self._unfollow.set()
        if self.follower is not None and self.follower is not threading.current_thread():
            self.follower.join(timeout_s)

    def _follow(self) -> None:
        """The follower thread: every ``follow_s`` seconds, a copy taken by the engine thread
        between two of its calls (``server.between(engine_copy)``); a redraw only when the
        engine changed and the slider is at the latest snapshot (a user who scrubbed back
        keeps the copy they scrub, until they move to its end). When the server stops, the
        scheduler is the caller's again: the panel draws it (its last snapshot is the engine thread's
        final ``filter``), the buttons back on. No engine call runs on this thread: MLX's
        streams are per thread."""
        try:
            self._follow_loop()
        except Exception as exc:  # shown in the panel, never lost in a thread's stderr
            self.follow_error = exc
            self.error.value = (
                f"<span style='color:#c0392b'>following stopped: {html.escape(type(exc).__name__)}: "
                f"{html.escape(str(exc))}</span>"
            )

    def _follow_loop(self) -> None:
        while not self._unfollow.wait(self.follow_s):
            if not self.server.serving:
                break
            try:
                copy = self.server.between(engine_copy).result(COPY_TIMEOUT_S)
            except TimeoutError:  # the engine thread is in a long call, or has just stopped
                continue
            with self._lock:
                if self._copy is not None and copy.key == self._copy.key:
                    continue
                if self.slider.value < self.slider.max:  # scrubbed back: hold the copy being scrubbed
                    self.follow_note.value = (
                        f"following {self.server.url}: the engine is at step {copy.step_index}; "
                        "move the slider to its end to follow it"
                    )
                    continue
                self._copy = copy
                self._follow_history()
        with self._lock:
            if not self.server.serving:  # the engine thread built every snapshot on its way out
                self._copy = None
                self._serving(False)
                self._follow_history()

    def _serving(self, served: bool) -> None:
        """Disable the buttons that call the engine while it is served (the engine thread
        owns stepping) and say why; turn them back on when it is not."""
        why = f"served at {self.server.url}: its engine thread steps it; server.stop() gives it back"
        for name in ("Submit", "Admit", "Step", "Filter", "Run N steps", "Reset"):
            self.buttons[name].disabled = served
            self.buttons[name].tooltip = why if served else ""
        self.follow_note.value = (
            f"following {self.server.url} every {self.follow_s:g} s (read only: the engine thread steps it)"
            if served
            else ""
        )

    # -- actions: call the engine, then snapshot and re-render ------------------------
    def on_submit(self) -> None:
        """Submit the prompt box's text (a user message when ``chat``) with the max-tokens box's value."""
        text = self.prompt.value
        asked = {"messages": [{"role": "user", "content": text}]} if self.chat else {"prompt": text}
        self._act(lambda s: s.submit(Request(**asked, max_tokens=self.max_tokens.value)))

    def on_admit(self) -> None:
        """``sched.admit()``; with nothing to admit, the notice says so (:func:`nothing_to_do`)."""
        self._act(lambda s: s.admit(), idle_call="admit")

    def on_step(self) -> None:
        """``sched.step()``; with no running row, the notice says so."""
        self._act(lambda s: s.step(), idle_call="step")

    def on_filter(self) -> None:
        """``sched.filter()``; with no finished row, the notice says so."""
        self._act(lambda s: s.filter(), idle_call="filter")

    def on_run(self) -> None:
        """Up to N iterations of the engine's loop (``run(max_steps=1)``: admit, step,
        filter); each engine call records a snapshot, so the slider can scrub every step."""

        def run(s: Scheduler) -> None:
            for _ in range(self.run_steps.value):
                if s.idle:
                    break
                s.run(max_steps=1)

        self._act(run)

    def on_reset(self) -> None:
        """Replace ``panel.sched`` by ``reset(panel.sched)``."""

        def reset(s: Scheduler) -> None:
            self.sched = self._reset(s)

        self._act(reset)

    def on_restore(self) -> None:
        """Restore the engine to the snapshot the slider shows (its kept checkpoint); the
        notice says which step and how many later snapshots left the history."""

        def restore(s: Scheduler) -> None:
            checkpoint = s.history.checkpoint(self.slider.value)
            if checkpoint is None:
                raise ValueError(
                    "no checkpoint was kept with this snapshot; create the scheduler with "
                    "history_checkpoints=N to restore the latest N snapshots"
                )
            before = len(s.history)
            s.restore(checkpoint)
            self.notice.value = (
                f"Restore: restored step {s.step_index}; {before - len(s.history)} later snapshot(s) dropped."
            )

        self._act(restore)

    def on_scrub(self) -> None:
        """The user moved the slider: the last action's notice no longer applies; re-render."""
        with self._lock:
            self.notice.value = ""
            if self.following and self.slider.value == self.slider.max:
                self._serving(True)  # back at the end: following again
            self.render()

    def busy(self, what: str) -> None:
        """Mark the status line busy with ``what`` until the next render sets it (` — what …`)."""
        self.status.value = f"{self.status.value.split(' — ')[0]} — {what} …"

    def _act(self, call: Callable[[Scheduler], Any], idle_call: str | None = None) -> None:
        """Run ``call(sched)``; show its error, if any, in the error label (cleared on
        success), a ``KeyboardInterrupt`` ("Kernel → Interrupt") included; when
        ``idle_call`` names the engine call and it returned no event, the notice says why
        (:func:`nothing_to_do`; cleared by the next action); then snapshot and re-render
        the engine's true state. Each engine call is a transaction, so an
        interrupted call left the engine as before it (Run N steps keeps the steps it
        finished)."""
        self.notice.value = ""
        if self._copy is not None:  # served: the engine thread owns the scheduler (the buttons are off)
            self.notice.value = f"{idle_call or 'that'}: refused: {self.buttons['Step'].tooltip}"
            return
        self.busy(f"{idle_call or 'the engine'} running")
        try:
            events = call(self.sched)
            self.error.value = ""
            if idle_call is not None and not events:
                self.notice.value = nothing_to_do(idle_call, self.sched.snapshot())
        except (Exception, KeyboardInterrupt) as exc:  # shown in the panel, never swallowed silently
            what = "interrupted" if isinstance(exc, KeyboardInterrupt) else "error"
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            self.error.value = (
                f"<span style='color:#c0392b'>{what}: {html.escape(detail)} (engine at step "
                f"{self.sched.step_index}; the call in progress was undone)</span>"
            )
        self.sched.snapshot(record=True)
        self._follow_history()

    # -- rendering ---------------------------------------------------------------------
    def _follow_history(self, index: int | None = None) -> None:
        """Point the slider at snapshot ``index`` of the history (default: the newest) and re-render."""
        last = len(self.source.history) - 1
        self._quiet = True
        try:
            self.slider.max = last
            self.slider.value = last if index is None else index
        finally:
            self._quiet = False
        self.render()

    @property
    def shown(self) -> Snapshot:
        """The snapshot the slider points at."""
        history = self.source.history
        return history[min(self.slider.value, len(history) - 1)]

    def render(self) -> None:
        """Re-render the status, the images and the ASCII masks from the shown snapshot. While
        it draws, the status line says so (the images change one by one; the status is set last)."""
        with self._lock:
            self._render()

    def _render(self) -> None:
        snap, history = self.shown, list(self.source.history)
        self.busy(f"drawing step {snap.step}")
        latency = self.view.value == VIEWS[1]
        self.batch_box.layout.display, self.latency_box.layout.display = (
            ("none", "") if latency else ("", "none")
        )
        figures = self.latency_figures(snap) if latency else self.figures(snap, history)
        for image, fig in figures.items():
            image.value = style.figure_png(fig, dpi=IMAGE_DPI)
        if latency:
            text = live_latency_text(self.latency_events(snap))
            text += f"\n{BY_HAND}" if self._copy is None else ""  # a served engine steps itself
            self.latency_ascii.value = f"<pre style='font-size:11px'>{html.escape(text)}</pre>"
        text = mask_text(snap) if snap.packed is None else packed_text(snap)
        self.mask_ascii.value = f"<pre>{html.escape(text)}</pre>"
        top = top_logprobs_text(
            snap, self.recent_events(snap.step), lambda t: repr(self.source.tokenizer.decode([t]))
        )
        self.top_ascii.value = f"<pre>{html.escape(top)}</pre>" if top else ""
        self.drafts_box.layout.display = "" if self.speculating else "none"
        self.drafts_ascii.value = (
            f"<pre>{html.escape(self.drafts_text(snap))}</pre>" if self.speculating else ""
        )
        self.rows.value = f"<pre>{html.escape(self.rows_text(snap))}</pre>"
        note = (
            self.source.history,
            self.slider.value,
            self.source.config.history_checkpoints,
            self.source.id,
        )
        why, brief = restore_note(*note), restore_note(*note, short=True)
        self.slider_label.value = (
            f"showing: snapshot {self.slider.value + 1} of {len(history)} (step {snap.step})"
            + (f" · {brief}" if why and self.source.config.history_checkpoints else "")
        )
        if self._copy is not None:  # served: a restore would rewrite the log the server's /metrics counts
            why = "served: Restore works after server.stop()"
        self.buttons["Restore"].disabled = why is not None
        self.buttons["Restore"].tooltip = why or "restore the engine to this snapshot"
        self.status.value = status_text(history[-1])  # last: when it changes, the images have too

    def figures(self, snap: Snapshot, history: list[Snapshot]) -> dict[W.Image, Figure]:
        """The figure each image shows for ``snap`` (decode masks, the 2-D mask of the
        last prefill forward up to its step, KV geometry with ``history``, the row timeline of
        :meth:`recent_events` split into prefill and decode phases on the step axis
        (:func:`~workbench.views.phases.render_phases`); while the scheduler speculates, the draft tokens of ``snap``'s
        rows, :func:`drafts_figure`), each ``IMAGE_WIDTH_IN`` wide and at most
        ``IMAGE_MAX_HEIGHT_IN`` tall."""
        events = self.recent_events(snap)
        timeline = render_phases(events, axes=("step",), width_in=IMAGE_WIDTH_IN)
        drafts = (
            {self.drafts_image: drafts_figure(events, snap, self.source.config.num_draft_tokens)}
            if self.speculating
            else {}
        )
        if snap.packed is not None:  # the packed layout: its latest forward's mask and its page table
            figures = {
                self.mask_image: render_packed_mask(snap, width_in=IMAGE_WIDTH_IN),
                self.attention_image: prefill_figure(None),
                self.kv_image: render_page_table(snap, width_in=IMAGE_WIDTH_IN),
                self.timeline_image: timeline,
            }
        else:
            figures = {
                self.mask_image: render_masks(
                    snap, width_in=IMAGE_WIDTH_IN, empty="no rows in the batch: submit a prompt, then Admit"
                ),
                self.attention_image: prefill_figure(self.last_prefill(snap)),
                self.kv_image: render_kv(snap, history, width_in=IMAGE_WIDTH_IN),
                self.timeline_image: timeline,
                **drafts,
            }
        return capped(figures)

    def latency_figures(self, snap: Snapshot) -> dict[W.Image, Figure]:
        """The latency view's figures for ``snap`` (:mod:`workbench.views.live`), from
        :meth:`latency_events`: each row's TTFT and its parts, tokens per second per step
        with the step's wall time, and the ITL per row and step, the last two on the steps
        up to ``snap``'s; each ``IMAGE_WIDTH_IN`` wide, at most ``IMAGE_MAX_HEIGHT_IN`` tall."""
        ev = self.latency_events(snap)
        steps = (int(ev.step.min()), snap.step - 1) if len(ev) else None
        return capped(
            {
                self.ttft_image: render_ttft(ev, width_in=IMAGE_WIDTH_IN),
                self.rates_image: render_step_rates(ev, width_in=IMAGE_WIDTH_IN, steps=steps),
                self.itl_image: render_itl(ev, width_in=IMAGE_WIDTH_IN, steps=steps),
            }
        )

    def latency_events(self, snap: Snapshot) -> pd.DataFrame:
        """The events the latency view of ``snap`` reads: those of the decode steps ``snap``
        had completed and the arrivals it had seen (:func:`~workbench.views.live.events_seen`)
        of the latest ``TIMELINE_UIDS`` uids, from the last ``TIMELINE_EVENTS`` events."""
        ev = events_seen(events_frame(self.source.events[-TIMELINE_EVENTS:]), snap)
        return ev[ev.uid.isin(ev.uid.unique()[-TIMELINE_UIDS:])]

    @property
    def speculating(self) -> bool:
        """Whether the scheduler speculates (``Scheduler(speculative=...)``): the panel
        then shows the draft view."""
        return self.source.config.speculative is not None

    def drafts_text(self, snap: Snapshot) -> str:
        """The draft view's text form for ``snap``: its rows' accepted (+) / rejected (-)
        draft tokens over the latest ``DRAFT_STEPS`` decode steps
        (:func:`~workbench.views.speculative.drafts_text` of :func:`draft_events`)."""
        return drafts_text(draft_events(self.recent_events(snap), snap), last_steps=DRAFT_STEPS)

    def last_prefill(self, at: int | Snapshot) -> ForwardMask | None:
        """The last prefill forward run by snapshot ``at`` (the events it had seen,
        :func:`~workbench.views.follow.seen_by`), or a decode step index: at or before that
        step; read from the last ``TIMELINE_EVENTS`` events (``None``: none there)."""
        events = self.source.events[-TIMELINE_EVENTS:]
        if isinstance(at, Snapshot):
            keep = seen_by(events_frame(events), at)
            events = [e for e, k in zip(events, keep) if k]
        forwards = prefill_forwards([e for e in events if isinstance(at, Snapshot) or e.step <= at])
        return forwards[-1] if forwards else None

    def rows_text(self, snap: Snapshot) -> str:
        """Each row of ``snap``: its prompt (a chat request's last user message,
        :func:`shown_prompt`) and its text generated up to ``snap``
        (:func:`~workbench.views.rows.rows_text`), decoded with the scheduler's tokenizer."""
        decode = self.source.tokenizer.decode
        prompts, generated = {}, {}
        for uid, n in zip(snap.uids, snap.generated_tokens):
            try:
                valid = self.source.request_of(uid)
            except KeyError:  # a restore dropped it from the engine
                continue
            prompts[uid] = shown_prompt(valid, decode)
            generated[uid] = decode(self.source.tokens(uid)[:n])
        return rows_text(snap, prompts, generated)

    def recent_events(self, at: int | Snapshot) -> pd.DataFrame:
        """Events of the latest ``TIMELINE_UIDS`` uids read from the last ``TIMELINE_EVENTS``
        events (so rendering costs the same however long the session): those snapshot ``at``
        had seen (:func:`~workbench.views.follow.seen_by`: the slider's snapshot, call by
        call), or up to decode step ``at``."""
        ev = events_frame(self.source.events[-TIMELINE_EVENTS:])
        ev = ev[seen_by(ev, at)] if isinstance(at, Snapshot) else ev[ev.step <= at]
        return ev[ev.uid.isin(ev.uid.unique()[-TIMELINE_UIDS:])]

    # -- display -----------------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs):
        """The live widget, with a static fallback: ``image/png`` of the four images
        (:meth:`static_png`) and ``text/plain`` of the status, rows and ASCII masks. A
        notebook opened without its kernel (or not trusted) shows those instead of
        ``VBox(children=...)``; JupyterLab with the kernel shows the widget."""
        bundle = self.widget._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        data["image/png"] = base64.b64encode(self.static_png()).decode()
        drafts = [self.drafts_text(self.shown)] if self.speculating else []
        data["text/plain"] = "\n".join(
            [self.status.value, self.rows_text(self.shown), *drafts, mask_text(self.shown)]
        )
        return bundle

    def _images(self) -> list[W.Image]:
        """The images shown now: the four of the batch view, then the draft image while
        speculating; in the latency view its three."""
        if self.view.value == VIEWS[1]:
            return [self.ttft_image, self.rates_image, self.itl_image]
        four = [self.mask_image, self.attention_image, self.kv_image, self.timeline_image]
        return four + ([self.drafts_image] if self.speculating else [])

    def static_png(self) -> bytes:
        """The panel's images as one PNG, in the panel's 2 x 2 layout (and the draft image
        below while speculating): what a stored notebook shows where the live widget
        cannot render."""
        png = [bytes(w.value) for w in self._images()]
        return style.png_grid([png[0:2], png[2:4], png[4:]])

    def static(self) -> HTML:
        """The panel's current views without widgets: status, PNG images and ASCII
        masks as one HTML output (shows in nbclient/nbval runs and static HTML exports)."""
        images = "".join(
            f"<img src='data:image/png;base64,{base64.b64encode(w.value).decode()}' style='max-width:100%'/>"
            for w in self._images()
        )
        return HTML(
            f"<div><p>{html.escape(self.status.value)}</p>{self.error.value}{images}"
            f"{self.rows.value}{self.top_ascii.value}{self.drafts_ascii.value}{self.mask_ascii.value}</div>"
        )
