"""The two layouts of a running batch, one chosen at construction (``layout=``).

- :mod:`.padded` (the default): mlx-lm's left-padded batch caches, ``[B, 1]`` decode steps,
  prefill in groups joined by mlx-lm's ``extend`` (the oracle's twin);
- :mod:`.packed`: every in-flight token of an iteration in one ``[1, T]`` forward, KV in
  pages (:mod:`workbench.engine.packed`).

Both have the face of :class:`.layout.Layout`: the scheduler keeps the life of requests
(queue, admission, statuses, events, reading tokens), a layout owns the batch's caches and
the forward, admits the rows the scheduler hands it and yields the tokens it read. It never
calls back into the scheduler (nano-vllm's ``schedule -> run -> postprocess``, with the
layout inside the model runner).
"""
