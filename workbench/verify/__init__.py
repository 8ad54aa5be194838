"""Verification: oracles against mlx-lm, the mask oracle, goldens, margins, and where a
row's numbers first diverge (by layer).

``wb.verify.localize(sched, uid, token=t)`` re-runs the forward that computed token ``t``
batched and alone with every layer recorded (:mod:`workbench.verify.layers`);
:mod:`workbench.verify.faults` plants known batching bugs to show it finding them.
``wb.verify.adapter_check(model_path, sched)`` holds rows with per-request LoRA adapters
to the same requests alone through ``mlx_lm.load(..., adapter_path=...)``
(:mod:`workbench.verify.adapter_oracle`).
"""

from .adapter_oracle import adapter_check
from .layers import DEFAULT_RTOL, LayerDivergence, first_suspect_token, layer_table, localize

__all__ = [
    "DEFAULT_RTOL",
    "adapter_check",
    "LayerDivergence",
    "first_suspect_token",
    "layer_table",
    "localize",
]
