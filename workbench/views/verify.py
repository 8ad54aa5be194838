"""The speculative verify forward as a mask: one forward over ``[B, 1 + K]`` (each row's
pending token ``t0``, its drafts, padding), which drafts each row accepted, which it
rejected, and the bonus token its last accepted position chose
(:mod:`workbench.engine.levers.speculative`).

Knows: snapshots (the ``full`` group's decode mask) and the event log (``draft`` and
``token`` events). Must not know: the scheduler, MLX. Every form is a pure function of the
snapshot taken before the step and the log.

A step ``s`` reads each row's pending token ``t0`` (its first ``token`` event of step
``s``), feeds ``[t0, d1..dn]`` plus padding up to ``K`` (the most drafts of any row), and
accepts ``d1..da`` (the next ``token`` events of step ``s``); query ``j`` chose the token
after input ``j``, so the query of ``da`` chose the *bonus* token, read as the row's first
token of step ``s + 1``. The rejected drafts' ids are not logged (only their number).

Text form (:func:`verify_text`), per row: the fed tokens with their role, then the mask's
last ``context`` cached keys and the forward's own keys (``c`` cached, ``@`` the query's own
key, ``#`` a key of this forward, ``.`` later, ``p`` padding) and what each query chose::

    verify forward of step 1: 2 rows, K = 3 drafts, keys 0-33 (30 cached)
    uid 0: fed t0=618 d1=12+ d2=618+, accepted 2 of 2, bonus 454
      q 30 t0  | c c @ . . . | chose 12: d1 accepted
      q 31 d1  | c c # @ . . | chose 618: d2 accepted
      q 32 d2  | c c # # @ . | chose 454: the bonus token
      q 33 pad | c c p p p p | (padding)

Rich form (:func:`render_verify`): one heatmap per row, the own-key diagonal coloured by
the fed token's role (pending token, accepted draft, rejected draft, padding) and each
query's choice written at its right.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from ..observe.events import Event
from ..observe.snapshot import Snapshot
from . import style
from .attention import LEGEND as MASK_LEGEND

__all__ = [
    "VerifyForward",
    "render_verify",
    "snapshot_before",
    "verify_cells",
    "verify_forward",
    "verify_text",
]

LATER, PAD, NEW, CACHED, T0, ACCEPTED, REJECTED = range(7)  # cell codes of :func:`verify_cells`
SYMBOLS = ".p#c@@@"
CMAP = ListedColormap(
    [style.LATER, style.PADDING, style.NEW_KEY, style.ATTENDED, style.FED, style.GOOD, style.BAD]
)
LEGEND = [  # by cell code: the 2-D mask view's entries, then the fed token's roles
    *MASK_LEGEND[:4],
    ("pending token t0 (own key)", style.FED),
    ("accepted draft (own key)", style.GOOD),
    ("rejected draft (own key)", style.BAD),
]


@dataclass(frozen=True)
class VerifyForward:
    """One verify forward, per row ``b`` of ``B``.

    Attributes:
        step: the decode step (``Snapshot.step`` before it).
        uids: ``[B]``.
        n_cached: key slots ``0 .. n_cached - 1`` held before the forward (the batch cache's
            KV width); the forward's ``1 + K`` keys follow.
        cached_mask: ``[B, n_cached]`` bool, the cached keys each row attends (False: its
            left padding).
        drafted, accepted: ``[B]`` drafts fed and accepted (``0 <= accepted <= drafted <= K``).
        t0: ``[B]`` the pending token fed first.
        accepted_tokens: per row its ``accepted`` draft tokens (the drafts it emitted).
        bonus: ``[B]`` the token the last accepted position chose (``None``: the row finished
            before reading it).
        K: the most drafts of any row of the forward: it feeds ``1 + K`` tokens per row.
    """

    step: int
    uids: tuple[int, ...]
    n_cached: int
    cached_mask: np.ndarray
    drafted: tuple[int, ...]
    accepted: tuple[int, ...]
    t0: tuple[int, ...]
    accepted_tokens: tuple[tuple[int, ...], ...]
    bonus: tuple[int | None, ...]
    K: int

    def only(self, uids: Sequence[int]) -> VerifyForward:
        """The same forward with only ``uids``' rows (in that order; ``K`` stays the
        forward's, so the others' padding shows).

        Raises:
            ValueError: for a uid not in the forward.
        """
        missing = [u for u in uids if u not in self.uids]
        if missing:
            raise ValueError(
                f"uids {missing} are not rows of the verify forward of step {self.step} {self.uids}"
            )
        rows = [self.uids.index(u) for u in uids]
        pick = lambda xs: tuple(xs[b] for b in rows)  # noqa: E731
        return replace(
            self,
            uids=tuple(uids),
            cached_mask=self.cached_mask[rows],
            drafted=pick(self.drafted),
            accepted=pick(self.accepted),
            t0=pick(self.t0),
            accepted_tokens=pick(self.accepted_tokens),
            bonus=pick(self.bonus),
            K=self.K,
        )

    def mask(self) -> np.ndarray:
        """``[B, 1 + K, n_cached + 1 + K]`` bool: what the layers receive (mlx-lm's
        ``create_causal_mask(1 + K, offset=n_cached, left_padding=...)``)."""
        N = 1 + self.K
        causal = np.tril(np.ones((N, N), bool))
        cached = np.repeat(self.cached_mask[:, None, :], N, axis=1)
        return np.concatenate([cached, np.broadcast_to(causal, (len(self.uids), N, N))], axis=2)


def verify_forward(snap: Snapshot, events: Sequence[Event]) -> VerifyForward:
    """The verify forward of step ``snap.step`` from the snapshot taken before it (its
    ``full`` group's mask: the cached keys and left padding) and the event log.

    Raises:
        ValueError: when no row drafted at that step (naming the steps that drafted).
        KeyError: when the snapshot has no ``full`` group.
    """
    s = snap.step
    drafts = {e.uid: (e.n_tokens, e.n_accepted) for e in events if e.kind == "draft" and e.step == s}
    if not drafts:
        steps = sorted({e.step for e in events if e.kind == "draft"})
        raise ValueError(f"no row drafted at step {s}; steps with drafts: {steps}")
    rows = {e.uid: e.row for e in events if e.kind == "draft" and e.step == s}
    if any(u not in snap.uids or snap.uids.index(u) != r for u, r in rows.items()):
        raise ValueError(
            f"the snapshot (step {s}, uids {snap.uids}) is not the batch of step {s}'s verify forward "
            f"(drafting uids at rows {rows}): take the last snapshot of the step (snapshot_before)"
        )

    def tokens(u: int, step: int) -> list[int]:
        return [e.token for e in events if e.kind == "token" and e.uid == u and e.step == step]

    mask = np.asarray(snap.group("full").mask, bool)  # [B, n_cached + 1]: the fed slot last
    drafted = tuple(drafts.get(u, (0, 0))[0] for u in snap.uids)
    accepted = tuple(drafts.get(u, (0, 0))[1] for u in snap.uids)
    return VerifyForward(
        step=s,
        uids=tuple(snap.uids),
        n_cached=mask.shape[1] - 1,
        cached_mask=mask[:, :-1],
        drafted=drafted,
        accepted=accepted,
        t0=tuple(tokens(u, s)[0] for u in snap.uids),
        accepted_tokens=tuple(tuple(tokens(u, s)[1 : 1 + a]) for u, a in zip(snap.uids, accepted)),
        bonus=tuple((tokens(u, s + 1) or [None])[0] for u in snap.uids),
        K=max(drafted),
    )


def snapshot_before(history: Sequence[Snapshot], step: int) -> Snapshot:
    """The snapshot the forward of ``step`` saw: the last one of ``history`` recorded at
    that step (after the step's admissions and filters).

    Raises:
        ValueError: when the history holds no snapshot of ``step`` (naming the steps it holds).
    """
    found = [s for s in history if s.step == step]
    if not found:
        raise ValueError(
            f"no snapshot of step {step} in the history (steps {sorted({s.step for s in history})})"
        )
    return found[-1]


def verify_cells(vf: VerifyForward, context: int | None = None) -> np.ndarray:
    """``[B, 1 + K, C + 1 + K]`` int cell codes, ``C`` the last ``context`` cached keys
    (default: all): ``CACHED`` / ``NEW`` where a query attends a cached key / a key of this
    forward, ``LATER`` where causality masks, ``PAD`` for left padding and a row's pad
    positions (past its drafts), and on the own-key diagonal the fed token's role: ``T0``,
    ``ACCEPTED`` or ``REJECTED``.
    """
    B, N = len(vf.uids), 1 + vf.K
    C = vf.n_cached if context is None else min(context, vf.n_cached)
    mask = vf.mask()[:, :, vf.n_cached - C :]
    keys = np.arange(C + N)[None, None, :]
    cells = np.where(mask, np.where(keys < C, CACHED, NEW), LATER)
    pad_cached = ~vf.cached_mask[:, vf.n_cached - C :]
    cells[:, :, :C] = np.where(pad_cached[:, None, :], PAD, cells[:, :, :C])
    for b in range(B):
        n, a = vf.drafted[b], vf.accepted[b]
        cells[b, n + 1 :, :] = PAD  # pad queries
        cells[b, :, C + n + 1 :] = PAD  # pad keys
        for j in range(n + 1):
            cells[b, j, C + j] = T0 if j == 0 else ACCEPTED if j <= a else REJECTED
    return cells


def _fed(vf: VerifyForward, b: int) -> list[str]:
    """Row ``b``'s fed positions as labels: ``t0=618``, ``d1=12+`` (accepted), ``d2-``
    (rejected: its id is not logged), ``pad``."""
    n, a = vf.drafted[b], vf.accepted[b]
    out = [f"t0={vf.t0[b]}"] + [f"d{j}={vf.accepted_tokens[b][j - 1]}+" for j in range(1, a + 1)]
    return out + [f"d{j}-" for j in range(a + 1, n + 1)] + ["pad"] * (vf.K - n)


def _choices(vf: VerifyForward, b: int) -> list[str]:
    """What each query of row ``b`` chose: the next draft (accepted), the bonus token, or
    a choice dropped after the first rejection."""
    n, a = vf.drafted[b], vf.accepted[b]
    out = []
    for j in range(1 + vf.K):
        if j < a:
            out.append(f"chose {vf.accepted_tokens[b][j]}: d{j + 1} accepted")
        elif j == a:
            bonus = "?" if vf.bonus[b] is None else vf.bonus[b]
            why = f", not d{j + 1}: rejected" if j < n else ""
            out.append(f"chose {bonus}: the bonus token{why}")
        elif j <= n:
            out.append("dropped (after a rejection)")
        else:
            out.append("(padding)")
    return out


def verify_text(vf: VerifyForward, context: int = 2) -> str:
    """Deterministic text form (the module docstring's example): per row its fed tokens,
    then per query the mask over the last ``context`` cached keys and the forward's keys,
    and what the query chose."""
    cells = verify_cells(vf, context)
    C = cells.shape[2] - 1 - vf.K
    lines = [
        f"verify forward of step {vf.step}: {len(vf.uids)} rows, K = {vf.K} drafts, "
        f"keys 0-{vf.n_cached + vf.K} ({vf.n_cached} cached, the last {C} shown)"
    ]
    for b, u in enumerate(vf.uids):
        fed = _fed(vf, b)
        bonus = "-" if vf.bonus[b] is None else vf.bonus[b]
        lines.append(
            f"uid {u}: fed {' '.join(fed[: vf.drafted[b] + 1])}, accepted {vf.accepted[b]} of "
            f"{vf.drafted[b]}, bonus {bonus}"
        )
        width = max(len(f.split("=")[0].rstrip("+-")) for f in fed)
        for j, choice in enumerate(_choices(vf, b)):
            name = fed[j].split("=")[0].rstrip("+-")
            grid = " ".join(SYMBOLS[c] for c in cells[b, j])
            lines.append(f"  q {vf.n_cached + j} {name:<{width}} | {grid} | {choice}")
    return "\n".join(lines)


def render_verify(
    vf: VerifyForward, context: int = 4, title: str | None = None, width_in: float = 9.2
) -> Figure:
    """One heatmap per row (query position down, key slot across: the last ``context``
    cached keys, then the forward's ``1 + K``), the own-key diagonal in the fed token's
    role's colour, each query's label its fed token and, at its right, what it chose."""
    cells = verify_cells(vf, context)
    B, N, W = cells.shape
    C = W - N
    fig = Figure(figsize=(width_in, B * (0.3 * N + 0.55) + 1.4), layout="constrained")
    fig.suptitle(
        title or f"verify forward of step {vf.step}: each row feeds [t0, its drafts, padding], K = {vf.K}",
        fontsize="medium",
    )
    axes = fig.subplots(B, 1, squeeze=False)[:, 0]
    for b, ax in enumerate(axes):
        ax.imshow(cells[b], cmap=CMAP, vmin=0, vmax=len(SYMBOLS) - 1, aspect="equal", interpolation="nearest")
        style.cell_borders(ax, W, N)
        first = vf.n_cached - C
        ax.set_xticks(range(W), [str(first + k) for k in range(W)], fontsize="small")
        labels = [
            f.replace("+", " \u2713").replace("-", " \u2717") for f in _fed(vf, b)
        ]  # check / cross marks
        ax.set_yticks(range(N), labels, fontsize="small")
        for j, choice in enumerate(_choices(vf, b)):
            ax.text(W - 0.2, j, "  " + choice, va="center", fontsize="small")
        n = vf.drafted[b]
        head = (
            f"accepted {vf.accepted[b]} of {n} drafts"
            if n
            else "no drafts: t0 only, its pad positions unused"
        )
        ax.set_title(f"uid {vf.uids[b]}: {head}", fontsize="small", loc="left")
        ax.axvline(C - 0.5, color="black", linewidth=1.5)
    axes[-1].set_xlabel(f"key slot (left of the line: the last {C} of {vf.n_cached} cached keys)")
    present = {int(c) for c in np.unique(cells)}
    order = [CACHED, NEW, LATER, PAD, T0, ACCEPTED, REJECTED]
    style.legend(fig, [LEGEND[code] for code in order if code in present], ncol=4)
    return fig
