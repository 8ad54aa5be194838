"""The packed layout's CUDA decode kernel through the real scheduler without a GPU: its own CUDA
source run on the CPU by ``tests/engine/cuda_emulation.py`` (g++ and CUDA's headers needed),
selected for every decode forward, over ``tests/engine/test_packed.py``'s staggered arrivals
(bundled tiny-code, pages of 4); prints whether every row equals its run alone through mlx-lm
(``oracle.solo_check``, log-probs within 1e-4), the largest log-prob difference, and how many
kernel calls served which ``[1, H, R, D]`` shapes. About a minute on two cores.

Usage: ``python scripts/lab/packed_cuda_emulated.py``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import workbench as wb  # noqa: E402
from workbench.engine.packed import attention  # noqa: E402
from workbench.engine.packed import cuda_attention as ca  # noqa: E402
from workbench.verify import oracle  # noqa: E402

from tests.engine.cuda_emulation import available, emulated  # noqa: E402
from tests.engine.test_packed import SPECS, packed, staggered  # noqa: E402


def main() -> None:
    why = available()
    if why:
        sys.exit(f"cannot emulate CUDA kernels here: {why}")
    model, tok = wb.load()
    calls, kernel = [], ca.paged_decode_attention

    def counted(*args, **kwargs):
        calls.append(tuple(args[0].shape))
        return kernel(*args, **kwargs)

    ca.paged_decode_attention = counted
    attention.selected = lambda choice, n_heads, pool: choice is not False and ca.serves(n_heads, pool)
    start = time.perf_counter()
    with emulated(caches=(ca._kernel, ca._reduce_kernel)):
        sched = packed(model, tok)
        uids = staggered(sched, tok, SPECS[:4])
    check = oracle.solo_check(model, sched, uids, atol=1e-4)
    print(
        f"rows equal their solo runs: {check.ok} (largest log-prob difference {check.noise:.2g}); "
        f"{len(calls)} kernel calls, shapes {sorted(set(calls))}; {time.perf_counter() - start:.0f} s"
    )
    if not check.ok:
        print(check.text())


if __name__ == "__main__":
    main()
