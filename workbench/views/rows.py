"""Each running row's text: its prompt and what it generated so far, one line per row.

Knows: snapshots (the rows, their uids and generated-token counts). Must not know: the
engine, tokenizers: the caller passes the texts (the panel decodes them with the
scheduler's tokenizer), so this stays a pure function of a snapshot and strings.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..observe.snapshot import Snapshot

ROW_TEXT_COLUMNS = 110  # a JupyterLab output line at 100% zoom holds about 120 characters
PROMPT_SHARE = 0.35  # of a line's room for text, the prompt's tail gets this share


def one_line(text: str) -> str:
    """``text`` on one line: newlines as ``⏎``, tabs as spaces.

    >>> one_line("def f():\\n\\treturn 1")
    'def f():⏎ return 1'
    """
    return text.replace("\r\n", "⏎").replace("\n", "⏎").replace("\t", " ")


def _clip(text: str, room: int, keep: str) -> str:
    """``text`` in at most ``room`` characters, ``…`` where it was cut (``keep`` = ``"tail"``
    keeps the end, ``"head"`` the start)."""
    if len(text) <= room:
        return text
    return "…" + text[-(room - 1) :] if keep == "tail" else text[: room - 1] + "…"


def rows_text(
    snap: Snapshot, prompts: Mapping[int, str], generated: Mapping[int, str], columns: int = ROW_TEXT_COLUMNS
) -> str:
    """One line per row of ``snap``: ``uid N  "…prompt tail" → "generated"`` with the row's
    generated-token count and ``finished`` for rows waiting for ``filter()``; each line at
    most ``columns`` characters (the prompt keeps its end, the generated text its start).

    Args:
        snap: the rows to show.
        prompts, generated: uid -> the row's prompt text / generated text (decoded); a
            missing uid shows as empty.
        columns: the longest line (characters).

    >>> from workbench.observe.snapshot import Snapshot
    >>> import numpy as np
    >>> snap = Snapshot(2, (0,), (False,), (3,), (7,), np.zeros(1, int), np.full(1, 7), 7, 256, 0)
    >>> rows_text(snap, {0: "def add(a, b):"}, {0: "\\n    return"})
    'uid 0 (3 tokens)  "def add(a, b):" → "⏎    return"'
    >>> rows_text(Snapshot(0, (), (), (), (), np.zeros(0, int), np.zeros(0, int), 0, 0, 0), {}, {})
    'no rows in the batch'
    """
    if not snap.uids:
        return "no rows in the batch"
    u_width = max(len(str(u)) for u in snap.uids)
    n_width = max(len(str(n)) for n in snap.generated_tokens)
    lines = []
    for uid, n, done in zip(snap.uids, snap.generated_tokens, snap.finished):
        head = f"uid {uid:>{u_width}} ({n:>{n_width}} tokens{', finished' if done else ''})  "
        room = max(columns - len(head) - len('"" → ""'), 10)
        prompt = one_line(prompts.get(uid, ""))
        out = one_line(generated.get(uid, ""))
        p_room = min(len(prompt), max(int(room * PROMPT_SHARE), room - len(out)))  # the rest: the output's
        lines.append(f'{head}"{_clip(prompt, p_room, "tail")}" → "{_clip(out, room - p_room, "head")}"')
    return "\n".join(lines)
