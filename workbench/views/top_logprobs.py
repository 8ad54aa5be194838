"""Top-k log-probs of each running row's latest token, as text (the Panel shows it).

Knows: a snapshot (which uids hold rows) and the event log frame (``token`` events and
their ``top_logprobs``). Must not know: the engine. Pure: the same inputs give the same text.

Example (uid 0 asked ``top_logprobs=2``, uid 1 none; ``decode`` shows token text)::

    top log-probs of each row's latest token (best first)
    row 0 uid 0  '\\n'  -0.40 | ' x'  -2.00
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from ..observe.snapshot import Snapshot


def top_logprobs_text(
    snap: Snapshot, events: pd.DataFrame, decode: Callable[[int], str] | None = None
) -> str:
    """One line per row of ``snap`` whose latest token (a ``token`` event before decode
    step ``snap.step``) carries top-k log-probs: ``row b uid u`` then ``token logprob``
    pairs best first, tokens shown by ``decode(id)`` (default: the id). ``""`` when no
    row of ``snap`` asked for them."""
    if "top_logprobs" not in events or not len(events):
        return ""
    tokens = events[(events.kind == "token") & (events.step < snap.step) & events.uid.isin(list(snap.uids))]
    latest = tokens.groupby("uid").tail(1).set_index("uid")
    show = decode or str
    lines = []
    for row, uid in enumerate(snap.uids):
        top = latest.top_logprobs.get(uid, ()) if uid in latest.index else ()
        if top:
            pairs = " | ".join(f"{show(int(t))} {lp:6.2f}" for t, lp in top)
            lines.append(f"row {row} uid {uid}  {pairs}")
    return "\n".join(["top log-probs of each row's latest token (best first)", *lines]) if lines else ""
