"""Kept for the references to it: ``python scripts/calibrate_cost_model.py [MODEL_PATH] [OUT.json]`` runs
``workbench calibrate --model MODEL_PATH --out OUT.json`` (defaults: the bundled tiny-llama,
``data/costmodels/<model>-<machine>.json``, the repo's stored cost models).
"""

import platform
import sys
from pathlib import Path

from workbench.cli import main

model = (
    sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parents[1] / "data/models/tiny-llama")
)
machine = f"{platform.system().lower()}-{platform.machine()}"
out = (
    sys.argv[2]
    if len(sys.argv) > 2
    else str(
        Path(__file__).resolve().parents[1] / "data" / "costmodels" / f"{Path(model).name}-{machine}.json"
    )
)
sys.exit(main(["calibrate", "--model", model, "--out", out]))
