"""Top-k log-probs from the event log, as a long table (one row per token and rank).

Knows: the event log frame (``token`` events and their ``top_logprobs``). Must not know: the
scheduler, MLX. A pure function, tested on hand-built events.

Columns (:data:`TOP_LOGPROBS_COLUMNS`): ``uid``; ``step`` (the decode step of the token
event); ``position`` (0-based index of the generated token within its request); ``rank``
(0 = most likely); ``token`` (the candidate's id); ``logprob`` (its log-prob, natural log);
``chosen`` (True where the candidate is the token the row generated). Example, uid 3 asked
``top_logprobs=2`` and generated token 7 then 9::

    uid step position rank token logprob chosen
      3    0        0    0     7   -0.10   True
      3    0        0    1     2   -2.40  False
      3    1        1    0     5   -0.70  False
      3    1        1    1     9   -0.90   True
"""

from __future__ import annotations

import pandas as pd

TOP_LOGPROBS_COLUMNS = ["uid", "step", "position", "rank", "token", "logprob", "chosen"]


def top_logprobs_frame(events: pd.DataFrame) -> pd.DataFrame:
    """One row per (token event, candidate) of requests that asked ``top_logprobs``, in
    event order (:data:`TOP_LOGPROBS_COLUMNS`); empty (those columns) when none asked."""
    rows = []
    if "top_logprobs" in events:
        tokens = events[events.kind == "token"]
        positions = tokens.groupby("uid").cumcount()
        for (_, e), position in zip(tokens.iterrows(), positions):
            for rank, (token, logprob) in enumerate(e.top_logprobs or ()):
                rows.append(
                    (
                        int(e.uid),
                        int(e.step),
                        int(position),
                        rank,
                        int(token),
                        float(logprob),
                        int(token) == int(e.token),
                    )
                )
    return pd.DataFrame(rows, columns=TOP_LOGPROBS_COLUMNS)
