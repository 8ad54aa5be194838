"""n samples of one prompt (``Scheduler.submit_n``): which members of a prefilling group
share one prefill, and the seeds of the samples.

``submit_n(request, n)`` queues ``n`` requests, sample ``i`` with seed ``seed + i``, marked
with the first one's uid (``RequestState.sample_group``). Members admitted together with the
same inputs are prefilled once and the row copied at the join
(:func:`workbench.engine.kv.caches.repeat_rows`): every sample's row holds the same KV, bit
for bit. Later groups: :mod:`workbench.engine.shared_prompts`. Example, a group admitting uids
``[4, 5, 6, 9]`` where 4-6 are one ``submit_n`` of 3 and 9 another request::

    members        4  5  6  9        prefill rows   4  9
    shared_rows    0  0  0  3        rows (member -> prefill row)  0 0 0 1

Notes: ``docs/lab/engine-notes.md``, "siblings.py".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .state import RequestState

MAX_SAMPLES = 1024  # most samples one submit_n may ask (each is a row of the batch)


def shared_rows(states: Sequence[RequestState]) -> list[int]:
    """Per member of a prefilling group, the index of the member whose prefill it uses:
    the first member of its ``submit_n`` group with the same inputs, else itself."""
    first: dict[tuple, int] = {}
    out = []
    for b, s in enumerate(states):
        key = (s.sample_group, tuple(s.inputs)) if s.sample_group >= 0 else (None, b)
        out.append(first.setdefault(key, b))
    return out


def check_samples(n: object) -> int:
    """``n`` of ``submit_n``: an int in ``[1, MAX_SAMPLES]`` (a numpy integer returned as a Python int).

    Raises:
        ValueError: naming ``n`` and its limits.
    """
    if not isinstance(n, (int, np.integer)) or isinstance(n, (bool, np.bool_)) or not 1 <= n <= MAX_SAMPLES:
        raise ValueError(f"submit_n: n must be an int in [1, {MAX_SAMPLES}] (MAX_SAMPLES), got {n!r}")
    return int(n)
