"""``workbench bench --device gpu``: its numbers from iterations (pure), its quick config
through the same code on the CPU, and the real command on a GPU (``gpu`` marker). No
timing thresholds: the measured numbers are in docs/gpu.md."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from tests.cli_process import run_workbench
from workbench.bench.gpu import (
    GPU_CONFIG,
    GPU_QUICK_CONFIG,
    full_batch_step_s,
    gpu_markdown,
    prompt_lengths,
    run_gpu_bench,
)
from workbench.runtime.device import on_gpu

pytestmark = pytest.mark.model


def test_decode_step_is_the_median_of_full_batch_iterations_after_a_full_one():
    it = pd.DataFrame({"time_s": [1.0, 3.0, 4.0, 5.5, 6.0, 9.0], "tokens": [0, 2, 2, 2, 1, 1]})
    assert full_batch_step_s(it, 2) == 1.25 and full_batch_step_s(it, 1) == 3.0
    assert np.isnan(full_batch_step_s(it, 3))


def test_prompt_lengths_are_seeded_and_within_the_configured_range():
    lengths = prompt_lengths(GPU_CONFIG, 128)
    assert lengths == prompt_lengths(GPU_CONFIG, 128) and len(lengths) == 128
    assert min(lengths) >= 64 and max(lengths) <= 512 and len(set(lengths)) > 50


@pytest.mark.skipif(on_gpu(), reason="the GPU runs the real command below")
def test_quick_config_runs_through_the_same_code_on_the_cpu_and_both_engines_agree():
    result = run_gpu_bench(GPU_QUICK_CONFIG, echo=lambda _: None, require_gpu=False)
    assert result.runs.same_tokens.dropna().eq(1.0).all()
    assert result.table.B.tolist() == [1, 8] and (result.table.workbench_step_ms > 0).all()
    assert (result.roofline.bound_s > 0).all() and "| 8 |" in gpu_markdown(result)


def test_device_gpu_on_the_cpu_is_refused_with_a_one_line_error(tmp_path):
    if on_gpu():
        pytest.skip("this machine has a GPU")
    out = run_workbench("bench", "--device", "gpu", "--quick", "--out", str(tmp_path))
    assert out.returncode == 2 and "--device gpu needs a GPU" in out.stderr


@pytest.mark.gpu
def test_quick_gpu_bench_runs_on_the_gpu_and_writes_its_files(tmp_path):
    out = run_workbench("bench", "--device", "gpu", "--quick", "--out", str(tmp_path), timeout_s=600)
    assert out.returncode == 0, out.stderr
    assert "| 8 |" in out.stdout and "% of bound" in out.stdout
    assert {p.name for p in (tmp_path / "gpu-bench").iterdir()} == {
        "runs.csv",
        "roofline.csv",
        "table.csv",
        "meta.csv",
    }
    runs = pd.read_csv(tmp_path / "gpu-bench" / "runs.csv")
    assert runs.same_tokens.dropna().eq(1.0).all()


def test_the_gpu_bench_takes_a_loaded_model_through_the_same_code(capsys):
    """``--model``: a real model instead of the random 1B shape (here the bundled tiny-llama
    on whatever device this is, with the quick sizes); every engine gives the same tokens."""
    cfg = replace(GPU_QUICK_CONFIG, model="tiny-llama", pairs=1, batch_sizes=(2,), decode_tokens=4)
    result = run_gpu_bench(cfg, echo=lambda _: None, require_gpu=False)
    assert (
        result.meta["model"].startswith("tiny-llama: llama,") and result.meta["dtype"] == "weights as loaded"
    )
    assert set(result.runs.engine) == {"workbench", "workbench, fast decode off", "mlx-lm"}
    assert result.runs.same_tokens.dropna().eq(1.0).all()
    assert "tiny-llama" in gpu_markdown(result)


def test_model_without_device_gpu_is_refused():
    out = run_workbench("bench", "--model", "tiny-llama", timeout_s=120)
    assert out.returncode != 0 and "--model is for --device gpu" in out.stderr
