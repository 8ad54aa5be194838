"""Full float32 matmuls for honest oracles (workbench.runtime.precision) and the device
report (workbench.runtime.device); the GPU-only checks carry the ``gpu`` marker."""

import os

import mlx.core as mx
import pytest

from tests.cli_process import run_workbench
from workbench.runtime import device, precision


def test_import_set_mlx_enable_tf32_to_zero_unless_the_user_set_it(monkeypatch):
    assert os.environ[precision.ENV] == precision.STATUS.env_value
    monkeypatch.delenv(precision.ENV)
    status = precision.full_float32()
    assert status.set_by_workbench and os.environ[precision.ENV] == "0" and "set by workbench" in status.note
    monkeypatch.setenv(precision.ENV, "1")
    status = precision.full_float32()
    assert not status.set_by_workbench and os.environ[precision.ENV] == "1" and "by the user" in status.note


def test_float32_matmul_error_is_measured_against_float64_and_classified():
    error = precision.float32_matmul_error(64)
    assert 0 < error < precision.TF32_ERROR  # the CPU has no TF32
    assert precision.tf32_in_force(3e-4) and not precision.tf32_in_force(1e-7)
    assert precision.describe().startswith("float32 matmuls: full float32 (measured relative error")


def test_device_report_names_the_device_and_its_memory():
    report = device.device_report()
    assert report.kind in ("cpu", "gpu") and report.backend in ("cpu", "cuda", "metal")
    assert report.memory_bytes is None or report.memory_bytes > 2**30
    assert report.name in report.text() and report.backend in report.text()


def test_an_installed_cuda_wheel_without_a_cuda_backend_is_named_with_its_fix(monkeypatch):
    monkeypatch.setattr(
        device,
        "version",
        lambda name: (
            "0.32.4" if name == "mlx-cuda-13" else (_ for _ in ()).throw(device.PackageNotFoundError(name))
        ),
    )
    monkeypatch.setattr(mx.cuda, "is_available", lambda: False)
    note = device.cuda_install_note()
    assert "mlx-cuda-13 0.32.4 is installed but MLX has no CUDA backend" in note
    assert "--force-reinstall --no-deps mlx-cuda-13==0.32.4" in note


@pytest.mark.gpu
def test_on_the_gpu_float32_matmuls_run_at_full_precision_and_info_says_so():
    assert device.device_report().backend == "cuda" and device.cuda_install_note() is None
    assert precision.float32_matmul_error() < precision.TF32_ERROR
    out = run_workbench("info")
    assert out.returncode == 0, out.stderr
    assert "device: gpu (cuda)" in out.stdout and "float32 matmuls: full float32" in out.stdout


@pytest.mark.gpu
def test_on_the_gpu_a_user_who_allows_tf32_gets_it_and_info_says_so():
    env = {**os.environ, precision.ENV: "1"}
    out = run_workbench("info", env=env)
    assert out.returncode == 0, out.stderr
    assert "float32 matmuls: TF32 (reduced precision)" in out.stdout and "set by the user" in out.stdout


@pytest.mark.gpu
def test_on_the_gpu_with_tf32_allowed_the_demo_explains_every_mismatch_by_precision(tmp_path):
    env = {**os.environ, precision.ENV: "1"}
    out = run_workbench("demo", "--out", str(tmp_path), timeout_s=600, env=env)
    assert "float32 matmuls: TF32 (reduced precision)" in out.stdout, out.stdout + out.stderr
    assert "MISMATCH (divergence)" not in out.stdout, out.stdout
