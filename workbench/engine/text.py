"""A row's text: mlx-lm's streaming detokenizer over its tokens, and stop strings.

Knows: the tokenizer's streaming detokenizer (``tokenizer.detokenizer``, one per row: mlx-lm's
``BPEStreamingDetokenizer`` / ``SPMStreamingDetokenizer`` / ``NaiveStreamingDetokenizer``),
a request's stop strings. Must not know: the scheduler, caches, MLX, events.

Glossary:
- *text tokens*: the generated tokens that are text: all of them, except a final stop id
  (a row finished by a stop *id* does not show that token).
- *settled text*: what the detokenizer has flushed: never half a multi-byte character (it
  holds back bytes until the character is complete) nor a lone trailing space.
- *visible text*: the settled text, cut before the first stop string; after the row
  finished, the detokenizer is finalized (everything flushed).
- *ready text*: the part of the visible text that a stream may hand out now: while the
  row runs, a tail that could still become a stop string is held back.

A :class:`RowText` is a cache: it is always re-derivable from the row's tokens
(:func:`row_text` feeds it the tokens it has not seen), so rolling back, restoring or
forking an engine drops it and the next read rebuilds it, with the same result.

Example (stop ``["\\n\\n"]``; tokens decode to ``"x = 1"``, ``"\\n"``, ``"\\n"``)::

    feed "x = 1"  visible "x = 1"     ready "x = 1"
    feed "\\n"     visible "x = 1\\n"   ready "x = 1"   ("\\n" may start "\\n\\n": held back)
    feed "\\n"     stop hit at 5      visible "x = 1"  ready "x = 1"  -> finish reason stop
"""

from __future__ import annotations

from typing import Any, Sequence


class RowText:
    """One row's streaming detokenizer (mlx-lm's ``tokenizer.detokenizer``) and stop strings.

    Args:
        tokenizer: an mlx-lm ``TokenizerWrapper`` (``detokenizer`` gives a fresh copy) or any
            object with ``decode(ids) -> str`` (then mlx-lm's ``NaiveStreamingDetokenizer``).
        stops: stop strings (non-empty), matched on the settled text across token boundaries.

    Attributes:
        n_tokens: text tokens fed so far. closed: True once finalized (the row finished).
        stop_at: character index where the first stop string begins, or ``None``.
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str] = ()):
        self._detok = _detokenizer(tokenizer)
        self._decode = tokenizer.decode
        self.stops = tuple(stops)
        self._longest = max((len(s) for s in self.stops), default=0)
        self.n_tokens, self.closed, self.stop_at = 0, False, None
        self._searched = 0  # characters of settled text already searched for stop strings
        self._lead: str | None = None  # leading space the detokenizer trimmed (tokenizer.decode keeps it)
        self._tokens: list[int] = []

    def feed(self, token: int) -> bool:
        """Add one text token (mlx-lm's ``detokenizer.add_token``). Returns True when the
        visible text now ends at a stop string (found in this or an earlier call)."""
        self.n_tokens += 1
        if self.stop_at is not None or self.closed:
            return self.stop_at is not None
        self._detok.add_token(int(token))
        self._note_lead(token)
        return self._search()

    def close(self) -> None:
        """Flush what the detokenizer held back (mlx-lm's ``finalize``), search it for a stop
        string too; the visible text is final after this."""
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
        """The visible text minus a tail that may still grow into a stop string (nothing is
        held back once the row is closed or stopped). Only ever grows while tokens are fed."""
        text = self.text
        if self.closed or self.stop_at is not None or not self.stops:
            return text
        hold = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        return text[: len(text) - hold]

    def _note_lead(self, token: int | None) -> None:
        """At the detokenizer's first flush, note the leading whitespace it trimmed (mlx-lm's
        detokenizers drop a completion's leading space; ``tokenizer.decode`` keeps it, and so
        does the workbench's text)."""
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

    def _search(self) -> bool:
        if not self.stops:
            return False
        text = self._settled()
        start = max(0, self._searched - self._longest + 1)
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        self._searched = len(text)
        if hits:
            self.stop_at = min(hits)
        return self.stop_at is not None


def _detokenizer(tokenizer: Any) -> Any:
    """A fresh streaming detokenizer: mlx-lm's ``tokenizer.detokenizer`` (a reset copy of the
    wrapper's one), else mlx-lm's ``NaiveStreamingDetokenizer`` over ``tokenizer``."""
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
    """Feed ``text`` the text tokens it has not seen (``tokens[text.n_tokens:]``) and close it
    once the row finished. Returns ``text``. Raises nothing."""
    for token in tokens[text.n_tokens:]:
        text.feed(token)
    if finished:
        text.close()
    return text


def visible_text(tokenizer: Any, tokens: Sequence[int], finish_reason: str | None, stop_ids: Any,
                 stops: Sequence[str] = (), closed: bool = True) -> str:
    """A row's visible text from its tokens alone (a fresh :class:`RowText`, finalized unless
    ``closed`` is False): what the report's ``text`` column shows, and ``Scheduler.text``
    of a finished row."""
    text = RowText(tokenizer, stops)
    return sync(text, text_tokens(tokens, finish_reason, stop_ids), closed).text
