"""Can the batch-invariant mode's prefill attend every prompt of a forward in ONE
``mx.fast.scaled_dot_product_attention`` call (issue 39, prefill on CUDA)? Today each prompt's
chunk attends alone (``invariant_prefill.PromptChunks.attend``: a slice, a contiguous copy, the
call and a zero pad per prompt per layer). With causal masking, right padding is never attended
by a real query (query ``i`` sees keys ``<= i + S - L``), so one call over the prompts' chunks
right-padded to the longest gives each real query its own keys only; the question is whether
its **bits** are those of the call alone (``[1, H, n, D]``), whatever the neighbours, the
padded length and the batch size. Per case: rows bit-equal to their call alone, out of rows.
Then the launch (inside ``mx.async_eval``) and the time of 16 layers' attention both ways.
JSON lines.

    python scripts/lab/gpu_prefill_sdpa.py --device gpu
"""

import argparse
import json
import random
import statistics
import time

import workbench  # noqa: F401

import mlx.core as mx


def rows(n_rows, lengths, H, Hkv, D, dtype, seed, offset=0):
    """Per row ``(q [1, H, n, D], k [1, Hkv, offset + n, D], v)``, the layout the model makes
    (``[1, n, H, D]`` transposed)."""
    out = []
    for b in range(n_rows):
        n, key = lengths[b], mx.random.key(seed + b)
        kq, kk, kv = mx.random.split(key, 3)
        q = mx.random.normal((1, n, H, D), key=kq).astype(dtype).transpose(0, 2, 1, 3)
        k = mx.random.normal((1, offset + n, Hkv, D), key=kk).astype(dtype).transpose(0, 2, 1, 3)
        v = mx.random.normal((1, offset + n, Hkv, D), key=kv).astype(dtype).transpose(0, 2, 1, 3)
        out.append((q, k, v))
    mx.eval(out)
    return out


def pad_to(x, axis_len, axis=2):
    n = x.shape[axis]
    if n == axis_len:
        return x
    shape = list(x.shape)
    shape[axis] = axis_len - n
    return mx.concatenate([x, mx.zeros(shape, x.dtype)], axis=axis)


def batched(data, L, offset, scale, contiguous):
    q = mx.concatenate([pad_to(q, L) for q, _, _ in data])
    k = mx.concatenate([pad_to(k, offset + L) for _, k, _ in data])
    v = mx.concatenate([pad_to(v, offset + L) for _, _, v in data])
    if not contiguous:  # the model's layout: [B, L, H, D] transposed
        q = mx.contiguous(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")


def alone(data, scale):
    return [
        mx.fast.scaled_dot_product_attention(mx.contiguous(q), k, v, scale=scale, mask="causal")
        for q, k, v in data
    ]


def equal_rows(data, L, offset, scale, contiguous=True):
    o = batched(data, L, offset, scale, contiguous)
    solo = alone(data, scale)
    mx.eval(o, solo)
    return sum(bool(mx.array_equal(o[b : b + 1, :, : s.shape[2]], s).item()) for b, s in enumerate(solo))


def timed(fn, reps):
    launch, total = [], []
    for _ in range(reps):
        mx.synchronize()
        t0 = time.perf_counter()
        out = fn()
        mx.async_eval(out)
        t1 = time.perf_counter()
        mx.eval(out)
        mx.synchronize()
        launch.append(t1 - t0)
        total.append(time.perf_counter() - t0)
    return round(statistics.median(launch) * 1e3, 3), round(statistics.median(total) * 1e3, 3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    dtype = mx.bfloat16 if args.device == "gpu" else mx.float32
    H, Hkv, D = 32, 8, 64
    scale = D**-0.5
    rng = random.Random(0)
    head = {"device": args.device, "mlx": mx.__version__, "dtype": str(dtype), "H": H, "Hkv": Hkv, "D": D}
    cases = []
    for n_rows in (2, 4, 16, 32):
        lengths = [rng.randint(160, 486) for _ in range(n_rows)]
        cases.append(("first chunk, right-padded", n_rows, lengths, 0, max(lengths)))
    lengths = [rng.randint(2, 64) for _ in range(8)]
    cases.append(("short chunks", 8, lengths, 0, max(lengths)))
    for L in (300, 512, 1024):
        cases.append((f"one row padded to {L}", 1, [297], 0, L))
    lengths = [512] * 6 + [rng.randint(20, 511) for _ in range(6)]
    cases.append(("second chunk (offset 512)", 12, lengths, 512, 512))
    cases.append(("equal lengths", 8, [384] * 8, 0, 384))
    for name, n_rows, lengths, offset, L in cases:
        data = rows(n_rows, lengths, H, Hkv, D, dtype, seed=100 * n_rows + L, offset=offset)
        line = dict(head, case=name, rows=n_rows, L=L, offset=offset)
        line["equal"] = equal_rows(data, L, offset, scale)
        line["equal_model_layout"] = equal_rows(data, L, offset, scale, contiguous=False)
        print(json.dumps(line), flush=True)
    # the cost: 16 layers of 16 prompts' attention, per prompt (today) against one call
    lengths = [rng.randint(160, 486) for _ in range(16)]
    data = rows(16, lengths, H, Hkv, D, dtype, seed=7)
    L = max(lengths)
    qb = mx.concatenate([pad_to(q, L) for q, _, _ in data])
    kb = mx.concatenate([pad_to(k, L) for _, k, _ in data])
    vb = mx.concatenate([pad_to(v, L) for _, _, v in data])
    mx.eval(qb, kb, vb)

    def per_prompt():
        outs = []
        for _ in range(16):
            per = []
            for b, n in enumerate(lengths):
                q = mx.contiguous(qb[b : b + 1, :, :n])
                o = mx.fast.scaled_dot_product_attention(
                    q, kb[b : b + 1, :, :n], vb[b : b + 1, :, :n], scale=scale, mask="causal"
                )
                per.append(pad_to(o, L))
            outs.append(mx.concatenate(per))
        return outs

    def one_call():
        return [
            mx.fast.scaled_dot_product_attention(qb, kb, vb, scale=scale, mask="causal") for _ in range(16)
        ]

    for name, fn in (("per prompt", per_prompt), ("one call", one_call)):
        fn()
        launch, total = timed(fn, args.reps)
        print(
            json.dumps(dict(head, timing=name, prompts=16, layers=16, launch_ms=launch, total_ms=total)),
            flush=True,
        )


if __name__ == "__main__":
    main()
