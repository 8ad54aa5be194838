"""Opt-in levers of the engine: pacing and its cost model, decode fast paths and the padded
attention kernel, quantized KV, LoRA adapters. Imported from the core only by the runner, the scheduler and
``forward.py`` (:class:`~workbench.engine.forward.ForwardLevers` installs a forward's levers)."""
