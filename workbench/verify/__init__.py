"""Verification: oracles against mlx-lm, the mask oracle, goldens, margins, and where a
row's numbers first diverge (by layer).

``wb.verify.localize(sched, uid, token=t)`` re-runs the forward that computed token ``t``
batched and alone with every layer recorded (:mod:`workbench.verify.layers`);
:mod:`workbench.verify.faults` plants known batching bugs to show it finding them.
"""

from .layers import DEFAULT_RTOL, LayerDivergence, first_suspect_token, layer_table, localize

__all__ = ["DEFAULT_RTOL", "LayerDivergence", "first_suspect_token", "layer_table", "localize"]
