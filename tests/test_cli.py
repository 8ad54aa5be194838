"""The main job, ``workbench demo``, as a user runs it."""

import subprocess
import sys

import pandas as pd
import pytest

from workbench.cli import main
from workbench.demo import run_demo

pytestmark = pytest.mark.model


def test_demo_prints_table_and_oracle_and_writes_outputs(tmp_path):
    lines = []
    code = run_demo(out_dir=tmp_path, echo=lines.append)
    text = "\n".join(lines)
    assert code == 0
    assert "oracle: 14/14 rows match solo" in text
    assert "throughput:" in text
    requests = pd.read_csv(tmp_path / "requests.csv")
    assert len(requests) == 14 and set(requests.finish_reason) <= {"stop", "length"}
    assert requests.prompt_tokens.min() == 1 and requests.prompt_tokens.max() == 200
    events = pd.read_csv(tmp_path / "events.csv")
    assert (events.kind == "token").sum() == requests.generated_tokens.sum()
    assert (tmp_path / "timeline.png").stat().st_size > 10_000


def test_demo_console_script_runs_with_mlx_lm_style_flags(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "demo", "--max-batch", "2", "--max-tokens", "8",
         "--prefill-step-size", "32", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert "max_batch 2" in out.stdout and "oracle: 14/14 rows match solo" in out.stdout


def test_demo_refuses_a_zero_batch_with_a_clear_message(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--max-batch", "0"])
    assert exc.value.code == 2
    assert "--max-batch: must be an int >= 1, got 0" in capsys.readouterr().err


def test_demo_refuses_a_missing_model_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        run_demo(model=str(tmp_path / "nope"), out_dir=tmp_path)


def test_gallery_writes_one_png_per_view_and_a_markdown_page_that_shows_them(tmp_path):
    assert main(["gallery", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "views.md").read_text()
    pngs = sorted(p.name for p in (tmp_path / "views").glob("*.png"))
    assert pngs == ["kv.png", "latency.png", "masks.png", "timeline_steps.png", "timeline_time.png"]
    for name in pngs:
        assert f"](views/{name})" in md
        assert (tmp_path / "views" / name).stat().st_size > 10_000
    assert "uid 2 | . . . # # # # @" in md  # the joiner's window mask, in temporal order
