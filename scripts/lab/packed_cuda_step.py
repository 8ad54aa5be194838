"""The packed layout's decode step on CUDA with its decode rows' attention by the paged kernel
(the default, ``workbench.engine.packed.cuda_attention``) or by the gather path (``--decode-kernel
off``: ``attention.selected`` answers False, as on the CPU): the readings of
``scripts/lab/gpu_step_anatomy.py`` (its arguments after ``--``) under either, to put the two
side by side.

Usage (on a CUDA machine)::

    python scripts/lab/packed_cuda_step.py --decode-kernel on -- --batch 128 --parts packed packed_anatomy
    python scripts/lab/packed_cuda_step.py --decode-kernel off -- --batch 128 --parts packed packed_anatomy
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from workbench.engine.packed import attention  # noqa: E402

import gpu_step_anatomy  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode-kernel", choices=["on", "off"], default="on")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="-- then gpu_step_anatomy.py's arguments")
    a = ap.parse_args()
    if a.decode_kernel == "off":
        attention.selected = lambda choice, n_heads, pool: False  # the gather path, as on the CPU
    gpu_step_anatomy.emit("decode_kernel", setting=a.decode_kernel)
    sys.argv = [sys.argv[0], *[x for x in a.rest if x != "--"]]
    gpu_step_anatomy.main()


if __name__ == "__main__":
    main()
