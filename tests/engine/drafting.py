"""A draft model for the speculative tests and the fuzzer: a second copy of a bundled model
whose last layer's MLP is zeroed, so it shares the vocabulary and drafts tokens that the
target accepts only in part."""

from __future__ import annotations

import mlx.core as mx

import workbench as wb


def noisy_draft(path=None):
    """A fresh copy of the model at ``path`` (default: the bundled one) with its last
    layer's MLP output projection zeroed."""
    model, _ = wb.load() if path is None else wb.load(path)
    mlp = model.layers[-1].mlp
    mlp.down_proj.weight = mx.zeros_like(mlp.down_proj.weight)
    mx.eval(model.parameters())
    return model
