"""The optimized-BLAS path: found, loaded before mlx, and the oracles still agree (at the
design's 1e-4 tolerance: an optimized BLAS is not bit-exact across batch shapes)."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from workbench.runtime.blas import find_blas
from workbench.runtime.device import on_gpu

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
    return subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600
    )


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
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("WORKBENCH_BLAS", "LD_PRELOAD", "WORKBENCH_BLAS_HOOK")
    }
    if find_blas() is None:
        pytest.skip("no optimized BLAS installed here (.ci/run installs Debian's libopenblas0-pthread)")
    if on_gpu():
        pytest.skip("MLX's default device is a GPU here: its matmuls never reach the CPU's BLAS")
    subprocess.run(
        [sys.executable, "-m", "workbench.cli", "blas", "--install-hook"], env=env, check=True, timeout=300
    )  # the explicit command; the same line as before where it was installed already
    code = "import mlx.core, workbench.runtime.blas as b; print(b.STATUS.library); print(b.matmul_seconds(1024, 2))"

    def hooked(**extra):
        run = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env | extra, timeout=300
        )
        return run.stdout.split()

    library, seconds = hooked()
    reference, reference_seconds = hooked(WORKBENCH_BLAS="off")  # the hook keeps MLX's own BLAS
    # MLX really calls the library: its matmul is several times faster than the reference BLAS's
    # on the same machine at the same time (17-25x on 2 quiet cores; a ratio, not a time, as the
    # cores may be shared)
    assert library == find_blas() and reference == "None", (library, reference)
    assert float(reference_seconds) > 3 * float(seconds), (seconds, reference_seconds)


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
        assert "`workbench blas --install-hook`" in out.stderr  # the warning names the fix


def test_importing_workbench_writes_nothing_into_site_packages(tmp_path):
    site = tmp_path / "site-packages"
    site.mkdir()
    code = (
        "import sysconfig; real = sysconfig.get_paths; "
        f"sysconfig.get_paths = lambda *a, **k: dict(real(*a, **k), purelib={str(site)!r}); "
        "import workbench, workbench.runtime.blas as b; workbench.Scheduler; print(b.hook_path())"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("WORKBENCH_BLAS", "WORKBENCH_BLAS_HOOK")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(
        site / "workbench-blas.pth"
    )  # the patched folder is the one it would use
    assert list(site.iterdir()) == []


def test_the_blas_command_installs_and_removes_the_start_up_hook(tmp_path, monkeypatch, capsys):
    from workbench.cli import main
    from workbench.runtime import blas

    hook = tmp_path / blas.HOOK_NAME
    monkeypatch.setattr(blas, "hook_path", lambda: hook)
    monkeypatch.setattr(blas, "find_blas", lambda: "/usr/lib/libopenblas.so.0")
    assert main(["blas", "--install-hook"]) == 0
    assert hook.read_text() == blas.hook_line("/usr/lib/libopenblas.so.0")
    assert f"installed {hook}" in capsys.readouterr().out
    assert main(["blas", "--remove-hook"]) == 0
    assert not hook.exists() and f"removed {hook}" in capsys.readouterr().out
    assert main(["blas", "--remove-hook"]) == 0
    assert "no start-up hook" in capsys.readouterr().out


def test_the_blas_command_refuses_to_install_a_hook_without_a_library(tmp_path, monkeypatch, capsys):
    from workbench.cli import main
    from workbench.runtime import blas

    monkeypatch.setattr(blas, "hook_path", lambda: tmp_path / blas.HOOK_NAME)
    monkeypatch.setattr(blas, "find_blas", lambda: None)
    assert main(["blas", "--install-hook"]) == 2
    assert "no optimized BLAS found" in capsys.readouterr().err and not (tmp_path / blas.HOOK_NAME).exists()
