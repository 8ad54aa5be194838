"""The packed (ragged) layout: every in-flight token of an iteration in one ``[1, T]``
forward, prefill chunks fused with decode tokens, KV in fixed-size pages.

``Scheduler(layout="packed", page_size=16, max_num_batched_tokens=...)`` selects it; the
padded layout (mlx-lm's left-padded batch caches) stays the default.

Modules (each one concept):

- :mod:`.pages` the page table, free list, reference counts and cached pages (pure Python;
  vLLM's ``BlockManager``, nano-vllm's ``block_manager``); :mod:`.prefix` the prefix index of
  full pages (prefix caching);
- :mod:`.plan` one iteration's chunks under the token budget (decode first, then
  prefill chunks: Sarathi-Serve's stall-free batches); :mod:`.steady` the same plan when every
  row decodes, and the rows' lengths, without a Python call a row (the step's host cost);
- :mod:`.attention` the packed forward: the paged cache object each layer's own ``Attention``
  calls (``update_and_fetch`` / ``make_mask``), per-token RoPE positions, and each layer's
  attention chosen (by groups, :mod:`.grouped`; decode rows alone; the CUDA kernel,
  :mod:`.cuda_attention`);
- :mod:`.batch` the running requests, their pages and the pools, with
  ``filter`` / ``clone`` like :class:`workbench.engine.batch.Batch`;
- :mod:`.decode_rows` a forward of decode tokens only, run as ``[R, 1]`` rows (the steady state);
- :mod:`.row_prefill` a forward whose only chunk is one row's prefill, run as mlx-lm runs a
  prompt (a prompt alone: scalar RoPE offset, one causal attention, the last layer for the
  last token);
- :mod:`.ledger` the KV books in pages; :mod:`.families` which models it admits;
- :mod:`.adapters` LoRA adapters per packed token; :mod:`.quantized_pages` pools of
  quantized keys and values (``kv_bits``), a row's first forward on float keys.

Knows: mlx-lm's llama-family modules (``self_attn.rope``, ``model.norm``), the core's
request state and the forward's sampling (:mod:`workbench.engine.forward`). Must not know: the queue, admission, events.
"""
