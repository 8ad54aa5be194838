"""The bundled random-weight model of each cache family the engine batches, for the tests that
run every family (the interrupt tests, the stateful fuzzer): name -> (folder under
``data/models``, ``max_kv_size``)."""

CACHE_FAMILIES = {
    "llama": ("tiny-llama", None),  # full attention: BatchKVCache
    "gemma3": ("tiny-gemma3", None),  # sliding window + global: BatchRotatingKVCache + BatchKVCache
    "qwen3next": ("tiny-qwen3-next", None),  # gated delta + attention: ArraysCache + BatchKVCache
    "mamba2": ("tiny-mamba2", None),  # SSM: ArraysCache
    "qwen3-max-kv": ("tiny-qwen3", 8),  # full attention bounded by max_kv_size: BatchRotatingKVCache
}
