"""Without the serve extra, ``wb.serve`` names the extra to install (not a raw ModuleNotFoundError)."""

import subprocess
import sys

import pytest

SCRIPT = """
import sys
sys.modules[sys.argv[1]] = None  # as if the serve extra were not installed
import workbench as wb
model, tokenizer = wb.load()
try:
    wb.serve(wb.Scheduler(model, tokenizer), port=0)
except ImportError as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize("missing", ["starlette", "uvicorn", "prometheus_client"])
def test_serving_without_the_serve_extra_names_the_extra(missing):
    out = subprocess.run([sys.executable, "-c", SCRIPT, missing], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused: wb.serve needs the serve extra: pip install -e '.[serve]'" in out.stdout
    assert missing in out.stdout
