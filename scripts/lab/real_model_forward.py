"""Seconds of SmolLM2-135M's forwards (the float32 form ``wb.load`` gives on the CPU) under this
process's BLAS: a load, a prefill of one chat prompt at B=1 and B=3, and a decode step.

Usage: ``WORKBENCH_BLAS=off python scripts/lab/real_model_forward.py`` (MLX's own reference BLAS,
as the test suite runs) and ``python scripts/lab/real_model_forward.py`` (the optimized BLAS
``import workbench`` loads, as a user runs). The `realmodel` tests spend their time in these
forwards, so the ratio of the two runs is what an optimized BLAS would save them.
"""

from __future__ import annotations

import time


def main() -> None:
    t = time.perf_counter()
    import workbench as wb
    from workbench.runtime import blas

    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    model, tokenizer = wb.load("smollm2-135m")
    print(f"BLAS: {blas.STATUS.library or 'MLX reference'}; load {time.perf_counter() - t:.2f} s")
    ids = list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "Name a primary colour."}], add_generation_prompt=True
        )
    )
    for batch in (1, 3):
        cache = make_prompt_cache(model)
        t = time.perf_counter()
        mx.eval(model(mx.array([ids] * batch), cache=cache))
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(5):
            mx.eval(model(mx.array([[5]] * batch), cache=cache))
        step = (time.perf_counter() - t) / 5
        print(f"B={batch}: prefill of {len(ids)} tokens {prefill:.2f} s, decode step {step:.3f} s")


if __name__ == "__main__":
    main()
