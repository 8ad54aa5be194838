"""A row's text: mlx-lm's streaming detokenizer over its tokens, and stop strings.

*Visible text* is what the detokenizer has settled (never half a multi-byte character), cut
before the first stop string; *ready text* is what a stream may hand out now (a tail that
could still become a stop string held back). Stop strings are matched by one Aho-Corasick
automaton per stop list (:class:`StopAutomaton`). A :class:`RowText` is re-derivable from the
row's tokens (:func:`row_text`). Glossary and design: ``docs/lab/engine-notes.md``, "text.py".

Example (stop ``["\\n\\n"]``; tokens decode to ``"x = 1"``, ``"\\n"``, ``"\\n"``)::

    feed "x = 1"  visible "x = 1"     ready "x = 1"
    feed "\\n"     visible "x = 1\\n"   ready "x = 1"   ("\\n" may start "\\n\\n": held back)
    feed "\\n"     stop hit at 5      visible "x = 1"  ready "x = 1"  -> finish reason stop
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class StopAutomaton:
    """An Aho-Corasick automaton over stop strings: its state is the longest tail of the text
    fed that is a prefix of some stop string.

    Args:
        stops: non-empty stop strings.

    Attributes:
        depth: per state, the length of the prefix it stands for (characters).
        match: per state, the length of the longest stop string ending there (0: none).

    Example (stops ``["ab", "bc"]``): feeding ``"xab"`` ends in the state of ``"ab"``
    (depth 2, match 2: ``"ab"`` ends at index 2, so it starts at 1).
    """

    def __init__(self, stops: Sequence[str]):
        goto: list[dict[str, int]] = [{}]
        self.depth, self.match = [0], [0]
        for stop in stops:  # the trie of every stop string's prefixes
            node = 0
            for ch in stop:
                if ch not in goto[node]:
                    goto[node][ch] = len(goto)
                    goto.append({})
                    self.depth.append(self.depth[node] + 1)
                    self.match.append(0)
                node = goto[node][ch]
            self.match[node] = len(stop)
        self._goto, self._fail = goto, [0] * len(goto)
        queue = deque(goto[0].values())
        while queue:  # breadth first: a state's failure link is the longest proper tail that is a state
            node = queue.popleft()
            for ch, child in goto[node].items():
                self._fail[child] = self.step(self._fail[node], ch)
                self.match[child] = max(self.match[child], self.match[self._fail[child]])
                queue.append(child)

    def step(self, state: int, ch: str) -> int:
        """The state after one more character ``ch`` (amortized O(1))."""
        goto, fail = self._goto, self._fail
        while state and ch not in goto[state]:
            state = fail[state]
        return goto[state].get(ch, 0)


@functools.lru_cache(maxsize=64)
def stop_automaton(stops: tuple[str, ...]) -> StopAutomaton:
    """The shared automaton of a stop list, built once per list."""
    return StopAutomaton(stops)


class RowText:
    """One row's streaming detokenizer (mlx-lm's ``tokenizer.detokenizer``) and stop strings.

    Args:
        tokenizer: an mlx-lm ``TokenizerWrapper``, or any object with ``decode(ids) -> str``.
        stops: non-empty stop strings, matched across token boundaries.

    Attributes:
        n_tokens: text tokens fed so far. closed: True once finalized (the row finished).
        stop_at: character index where the first stop string begins, or ``None``.
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str] = ()):
        self._detok = _detokenizer(tokenizer)
        self._decode = tokenizer.decode
        self.stops = tuple(stops)
        self._automaton = stop_automaton(self.stops) if self.stops else None
        self.n_tokens, self.closed, self.stop_at = 0, False, None
        self._state, self._searched = (
            0,
            0,
        )  # the automaton's state after the settled text's first _searched characters
        self._lead: str | None = None  # leading space the detokenizer trimmed (tokenizer.decode keeps it)
        self._tokens: list[int] = []

    def feed(self, token: int) -> bool:
        """Add one text token; True when the visible text ends at a stop string."""
        self.n_tokens += 1
        if self.stop_at is not None or self.closed:
            return self.stop_at is not None
        self._detok.add_token(int(token))
        self._note_lead(token)
        return self._search()

    def close(self) -> None:
        """Flush the detokenizer (``finalize``) and search the rest; the text is final after."""
        if not self.closed:
            self._detok.finalize()
            self._note_lead(None)
            self.closed = True
            if self.stop_at is None:
                self._search()

    @property
    def text(self) -> str:
        """The visible text (settled, cut before a stop string)."""
        text = self._settled()
        return text if self.stop_at is None else text[: self.stop_at]

    @property
    def ready(self) -> str:
        """The visible text minus a tail that may still grow into a stop string (grows only)."""
        text = self.text
        if self.closed or self.stop_at is not None or not self.stops:
            return text
        hold = self._automaton.depth[self._scan(text)[0]]  # the tail that begins a stop string
        return text[: len(text) - hold]

    def _note_lead(self, token: int | None) -> None:
        """Note the leading whitespace the detokenizer trims at its first flush (kept in text)."""
        if self._lead is not None:
            return
        if token is not None:
            self._tokens.append(int(token))
        text = self._detok.text
        if text or self.closed or token is None:
            head = self._decode(self._tokens)
            lead = head[: len(head) - len(text)]
            self._lead = lead if head.endswith(text) and lead.isspace() else ""
            self._tokens = []

    def _settled(self) -> str:
        return (self._lead or "") + self._detok.text

    def _scan(self, text: str) -> tuple[int, int | None]:
        """``(state after text, start of the earliest new stop string or None)``; changes nothing."""
        state, searched, first = self._state, self._searched, None
        if searched > len(text):  # the settled text shrank (never for mlx-lm's detokenizers): from the start
            state, searched = 0, 0
        for i in range(searched, len(text)):
            state = self._automaton.step(state, text[i])
            if self._automaton.match[state]:
                start = i + 1 - self._automaton.match[state]
                first = start if first is None else min(first, start)
        return state, first

    def _search(self) -> bool:
        if not self.stops:
            return False
        text = self._settled()
        state, first = self._scan(text)
        self._state, self._searched, self.stop_at = state, len(text), self.stop_at if first is None else first
        return self.stop_at is not None


def _detokenizer(tokenizer: Any) -> Any:
    """A fresh streaming detokenizer (mlx-lm's, else ``NaiveStreamingDetokenizer``)."""
    detok = getattr(tokenizer, "detokenizer", None)
    if detok is not None:
        return detok
    from mlx_lm.tokenizer_utils import NaiveStreamingDetokenizer

    return NaiveStreamingDetokenizer(tokenizer)


def text_tokens(tokens: Sequence[int], finish_reason: str | None, stop_ids: Any) -> Sequence[int]:
    """The tokens that are text: ``tokens`` without a final stop id (finish reason ``stop``)."""
    if finish_reason == "stop" and tokens and tokens[-1] in stop_ids:
        return tokens[:-1]
    return tokens


def sync(text: RowText, tokens: Sequence[int], finished: bool) -> RowText:
    """Feed ``text`` the text tokens it has not seen, closed once ``finished``; returns it."""
    for token in tokens[text.n_tokens :]:
        text.feed(token)
    if finished:
        text.close()
    return text


def visible_text(
    tokenizer: Any,
    tokens: Sequence[int],
    finish_reason: str | None,
    stop_ids: Any,
    stops: Sequence[str] = (),
    closed: bool = True,
) -> str:
    """A row's visible text from its tokens alone (finalized unless ``closed`` is False)."""
    text = RowText(tokenizer, stops)
    return sync(text, text_tokens(tokens, finish_reason, stop_ids), closed).text


def report_text(requests: Callable[[], Mapping[int, Any]], tokenizer: Any) -> Callable[[list[int], int], str]:
    """The report's ``text(tokens, uid)`` from its token events (unknown uids decode plainly)."""

    def text(tokens: list[int], uid: int) -> str:
        state = requests().get(uid)
        if state is None:
            return tokenizer.decode(tokens)
        done = len(tokens) == len(state.tokens) and state.finished
        return visible_text(
            tokenizer,
            tokens,
            state.finish_reason if done else None,
            state.valid.stop_ids,
            state.valid.stop,
        )  # finalized: all its tokens shown

    return text
