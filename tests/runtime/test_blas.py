"""The optimized-BLAS path: found, loaded before mlx, and the oracles still agree (at the
design's 1e-4 tolerance: an optimized BLAS is not bit-exact across batch shapes)."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from workbench.runtime.blas import find_blas

SCRIPT = textwrap.dedent("""
    import workbench as wb
    from workbench.runtime import blas
    from workbench.verify import oracle
    from workbench.workloads.workload import prompt_of_length
    print("BLAS:", blas.STATUS.note)
    assert blas.STATUS.library, blas.STATUS.note
    model, tok = wb.load()
    sched = wb.Scheduler(model, tok, max_batch=4)
    for i, n in enumerate((1, 5, 17, 40)):
        sched.submit(wb.Request(prompt=prompt_of_length(tok, n, 29 * n), max_tokens=20))
    sched.run()
    check = oracle.solo_check(model, sched, atol=1e-4)
    print(check.text())
    assert check.ok
    print("matmul_s", blas.matmul_seconds(512, 1))
""")


def run_with(env_blas):
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_BLAS"}
    if env_blas is not None:
        env["WORKBENCH_BLAS"] = env_blas
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MLX uses Accelerate on macOS")
def test_an_optimized_blas_is_found_loaded_first_and_the_oracle_still_agrees(monkeypatch):
    monkeypatch.delenv("WORKBENCH_BLAS", raising=False)  # the suite itself runs with it off
    if find_blas() is None:
        pytest.skip("no optimized BLAS installed here (.ci/run installs Debian's libopenblas0-pthread)")
    out = run_with(None)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"BLAS: (loaded \S+ before mlx|\S+ loaded at interpreter start)", out.stdout), out.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the start-up hook is for Linux")
def test_the_start_up_hook_gives_mlx_the_optimized_blas_even_when_mlx_is_imported_first(monkeypatch):
    monkeypatch.delenv("WORKBENCH_BLAS", raising=False)  # the suite itself runs with it off
    env = {k: v for k, v in os.environ.items() if k not in ("WORKBENCH_BLAS", "LD_PRELOAD", "WORKBENCH_BLAS_HOOK")}
    subprocess.run([sys.executable, "-c", "import workbench"], env=env, check=True, timeout=300)  # installs the hook
    if find_blas() is None:
        pytest.skip("no optimized BLAS installed here (.ci/run installs Debian's libopenblas0-pthread)")
    code = "import mlx.core, workbench.runtime.blas as b; print(b.STATUS.library); print(b.matmul_seconds(1024, 2))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    library, seconds = out.stdout.split()
    assert library == find_blas() and float(seconds) < 0.1, out.stdout  # the reference BLAS: ~0.4 s here


def test_workbench_blas_off_keeps_mlx_reference_blas():
    out = run_with("off")
    assert out.returncode != 0 and "WORKBENCH_BLAS=off" in out.stdout + out.stderr


def test_importing_mlx_first_without_the_hook_is_reported_loudly_not_hidden():
    code = "import mlx.core, workbench.runtime.blas as b; print(b.STATUS.note)"
    env = {k: v for k, v in os.environ.items() if k not in ("WORKBENCH_BLAS", "LD_PRELOAD")}
    env["WORKBENCH_BLAS_HOOK"] = "off"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    if not sys.platform.startswith("linux"):
        assert "not Linux" in out.stdout
    elif find_blas() is not None:
        assert "mlx was imported before workbench" in out.stdout
        assert "RuntimeWarning: workbench: mlx was imported before workbench" in out.stderr
