"""The prefix index of the packed layout's pages: which page holds the KV of which full
page of tokens after which prefix (vLLM's automatic prefix caching, nano-vllm's
``hash_to_block_id``; SGLang's radix tree, at page granularity). No model, pools or requests.

A page is keyed by ``(parent page, its page_size tokens)``, the parent being the indexed
page of the tokens before it (``-1`` for a prompt's first page): vLLM's chained block hash
with the parent's page id in place of its hash, so a lookup is exact. Evicting a page forgets
its subtree; an entry whose page was handed out again since it was indexed never matches
(why: ``docs/lab/engine-notes.md``, "packed/prefix.py").

Example (pages of 2 tokens; ``a b`` in page 0, ``c d`` in page 3)::

    ix = PrefixIndex(); ix.add(0, -1, (a, b), 1); ix.add(3, 0, (c, d), 1)
    ix.match([a, b, c, d, e], 2, handouts) -> [0, 3]; ix.match([a, b, x, y, z], 2, handouts) -> [0]
    ix.forget(0) -> [0, 3]   (page 3 was keyed under page 0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Key = tuple[int, tuple[int, ...]]


class PrefixIndex:
    """Full pages by their ``(parent page, tokens)`` key.

    Attributes:
        page_of: key -> page. key_of: page -> its key. children: page -> the pages keyed
            under it. epoch: page -> its hand-out count when it was indexed.
    """

    def __init__(self):
        self.page_of: dict[Key, int] = {}
        self.key_of: dict[int, Key] = {}
        self.children: dict[int, set[int]] = {}
        self.epoch: dict[int, int] = {}

    def __contains__(self, page: int) -> bool:
        return page in self.key_of

    def add(self, page: int, parent: int, tokens: Sequence[int], epoch: int) -> bool:
        """Index ``page`` as holding ``tokens`` after ``parent``'s prefix (``-1``: none); False
        (nothing indexed) for a taken key, an indexed page or an unindexed parent."""
        key = (parent, tuple(tokens))
        if key in self.page_of or page in self.key_of or (parent != -1 and parent not in self.key_of):
            return False
        self.page_of[key], self.key_of[page], self.epoch[page] = page, key, epoch
        self.children.setdefault(parent, set()).add(page)
        return True

    def match(self, tokens: Sequence[int], page_size: int, handouts: Mapping[int, int]) -> list[int]:
        """The indexed pages of ``tokens``' longest cached prefix of whole pages, at most
        ``len(tokens) - 1`` tokens; a stale entry ends the match and is forgotten."""
        out, parent = [], -1
        for i in range((len(tokens) - 1) // page_size):
            page = self.page_of.get((parent, tuple(tokens[i * page_size : (i + 1) * page_size])))
            if page is None:
                break
            if handouts.get(page, 0) != self.epoch[page]:  # its slots were written again
                self.forget(page)
                break
            out.append(page)
            parent = page
        return out

    def forget(self, page: int) -> list[int]:
        """Drop ``page`` and its subtree; returns the pages dropped (``page`` first)."""
        if page not in self.key_of:
            return []
        key = self.key_of.pop(page)
        del self.page_of[key], self.epoch[page]
        self.children.get(key[0], set()).discard(page)
        out = [page]
        for child in sorted(self.children.pop(page, ())):
            out += self.forget(child)
        return out

    def clone(self) -> "PrefixIndex":
        """An independent copy."""
        out = PrefixIndex()
        out.page_of, out.key_of, out.epoch = dict(self.page_of), dict(self.key_of), dict(self.epoch)
        out.children = {p: set(c) for p, c in self.children.items()}
        return out
