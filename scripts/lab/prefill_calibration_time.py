"""How long the batch-invariant mode's prefill-block calibration takes (issue 39, the 4-bit prefill's
wider blocks): per quantized projection shape of SmolLM2-135M at 4 bits (random weights: shapes and
dtypes decide the kernels and the sweep's cost, values do not) and per first choice of row blocks,
the seconds of ``invariant_prefill._device_blocks`` (``clean_range``'s sweep, then the fixed-call or
``rows_agree`` checks): what a model's first prefill in the mode pays once per shape, and the blocks
it finds. JSON lines; the last one sums each choice over the model's five shapes.

    python scripts/lab/prefill_calibration_time.py --device gpu --hi 256 2048 8192
"""

import argparse
import time

from workbench.bench.files import print_json_line
from workbench.engine.levers import invariant_prefill
from workbench.engine.levers.invariant import RowBlocks
from workbench.runtime.device import backend

import mlx.core as mx
import mlx.nn as nn

# SmolLM2-135M: hidden 576, 9 heads / 3 KV heads of 64, MLP 1536, vocabulary 49,152 read out by the
# tied embedding; 4-bit projections and an 8-bit embedding in groups of 32, bf16 scales (as shipped)
SHAPES = {"q_proj, o_proj": (576, 576), "k_proj, v_proj": (576, 192), "gate_proj, up_proj": (576, 1536)}
SHAPES["down_proj"] = (1536, 576)


def modules(group_size: int = 32):
    """``(name, module)`` of every distinct quantized projection shape, the read-out last."""
    for name, (n_in, n_out) in SHAPES.items():
        linear = nn.Linear(n_in, n_out, bias=False)
        linear.set_dtype(mx.bfloat16)
        yield name, nn.QuantizedLinear.from_linear(linear, group_size, 4)
    embedding = nn.Embedding(49152, 576)
    embedding.set_dtype(mx.bfloat16)
    yield "read-out (tied embedding)", nn.QuantizedEmbedding.from_embedding(embedding, group_size, 8)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "gpu"), default="gpu")
    ap.add_argument("--hi", type=int, nargs="+", default=[256, 2048], help="first choices RowBlocks(8, hi)")
    ap.add_argument(
        "--as-backend", default=None, help="calibrate as this backend (a CPU check of the script)"
    )
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    mx.set_default_device(mx.gpu if a.device == "gpu" else mx.cpu)
    where = a.as_backend or backend()
    key = (where, "quantized")
    mods = list(modules())
    for _, m in mods:
        mx.eval(m.parameters())
    head = {"device": str(mx.default_device()), "mlx": mx.__version__, "backend": where}
    totals = {}
    for hi in a.hi:
        saved = invariant_prefill.PREFILL_ROW_BLOCKS.get(key)
        invariant_prefill.PREFILL_ROW_BLOCKS[key] = RowBlocks(8, hi)
        try:
            for name, m in mods:
                mx.synchronize()
                t0 = time.perf_counter()
                found = invariant_prefill._device_blocks(m, where)
                mx.synchronize()
                s = time.perf_counter() - t0
                totals[hi] = totals.get(hi, 0.0) + s
                blocks = None if found is None else [found.min_rows, found.max_rows]
                print_json_line(
                    {**head, "first": [8, hi], "shape": name, "seconds": round(s, 2), "blocks": blocks}, a.out
                )
        finally:
            if saved is None:
                invariant_prefill.PREFILL_ROW_BLOCKS.pop(key, None)
            else:
                invariant_prefill.PREFILL_ROW_BLOCKS[key] = saved
    print_json_line(
        {
            **head,
            "what": "total seconds per first choice",
            "totals": {str(k): round(v, 2) for k, v in totals.items()},
        },
        a.out,
    )


if __name__ == "__main__":
    main()
