"""The load client (``python -m workbench.serving.replay``) starts without the engine: importing
``workbench.serving`` imported the server, the Scheduler, mlx-lm and transformers (seconds of a
notebook's time: notebook 18 starts the client as a process of its own), and the client needs
none of them. ``wb.serve`` and ``workbench.serving.Server`` still resolve."""

import subprocess
import sys

import pytest

import workbench as wb

SCRIPT = """
import sys
import workbench.serving.replay
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"mlx", "mlx_lm", "transformers", "pandas"})
print("heavy:", heavy)
"""


def test_the_load_client_imports_neither_mlx_nor_the_engine():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "heavy: []", out.stdout


def test_serve_and_server_still_resolve_from_the_package():
    import workbench.serving as serving
    from workbench.serving.server import Server, serve

    assert serving.serve is serve and serving.Server is Server and wb.serve is serve
    with pytest.raises(AttributeError, match="has no attribute 'Serve'"):
        serving.Serve  # noqa: B018
