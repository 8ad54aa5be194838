"""KV bookkeeping: mlx-lm's caches, what they allocate, what they hold, the prompt cache.

Never imports the engine's core (``workbench.engine``'s own modules) nor its levers."""
