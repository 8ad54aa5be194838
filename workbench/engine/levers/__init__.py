"""Opt-in levers of the engine: pacing and its cost model, decode fast paths and the padded
attention kernel, quantized KV, LoRA adapters. Imported only by the runner and the scheduler."""
