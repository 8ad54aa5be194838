"""The main job, ``workbench demo``, as a user runs it."""

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.cli_process import run_workbench
from workbench.cli import main
from workbench.demo import run_demo

pytestmark = pytest.mark.model


def test_demo_prints_table_and_oracle_and_writes_outputs(tmp_path, capsys):
    lines = []
    code = run_demo(out_dir=tmp_path, echo=lines.append, progress=True)
    text = "\n".join(lines)
    assert code == 0
    bar = capsys.readouterr().err  # not a terminal (a log): the bar's last state stays, ended by a newline
    assert "demo: 100%" in bar and bar.endswith("]\n"), repr(bar[-200:])
    assert "oracle: 14/14 rows match solo, 14/14 match mlx-lm BatchGenerator" in text
    assert "summary: 14 requests" in text and "tok/s" in text
    requests = pd.read_csv(tmp_path / "requests.csv")
    assert len(requests) == 14 and set(requests.finish_reason) <= {"stop", "length"}
    assert requests.prompt_tokens.min() == 1 and requests.prompt_tokens.max() == 200
    events = pd.read_csv(tmp_path / "events.csv")
    assert (events.kind == "token").sum() == requests.generated_tokens.sum()
    assert (tmp_path / "timeline.png").stat().st_size > 10_000


def test_demo_console_script_runs_with_mlx_lm_style_flags(tmp_path):
    args = ("--max-batch", "2", "--max-tokens", "8", "--prefill-step-size", "32", "--out", str(tmp_path))
    out = run_workbench("demo", *args, timeout_s=600)
    assert out.returncode == 0, out.stderr
    assert "max_batch 2" in out.stdout and "oracle: 14/14 rows match solo" in out.stdout


@pytest.mark.parametrize("value,shown", [("0", "0"), ("abc", "'abc'")])
def test_demo_refuses_a_bad_batch_size_with_a_clear_message(capsys, value, shown):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--max-batch", value])
    assert exc.value.code == 2
    assert f"--max-batch: must be an int >= 1, got {shown}" in capsys.readouterr().err


def test_demo_refuses_a_missing_model_path_in_one_line(tmp_path, capsys):
    assert main(["demo", "--model", str(tmp_path / "nope"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"workbench demo: error: model path '{tmp_path / 'nope'}' does not exist"


def test_demo_checks_the_output_folder_before_running(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["demo", "--out", str(blocker / "sub")]) == 2
    assert "workbench demo: error:" in capsys.readouterr().err


def test_gallery_writes_one_png_per_view_and_a_markdown_page_that_shows_them(tmp_path):
    assert main(["gallery", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "views.md").read_text()
    pngs = sorted(p.name for p in (tmp_path / "views").glob("*.png"))
    assert pngs == [
        "kv.png",
        "latency.png",
        "live_latency.png",
        "masks.png",
        "timeline_steps.png",
        "timeline_time.png",
    ]
    for name in pngs:
        assert f"](views/{name})" in md
        assert (tmp_path / "views" / name).stat().st_size > 10_000
    assert "uid 2 | . . # # # # # @" in md  # the joiner (5 prompt tokens) in temporal window order
    assert md.count("measured by `workbench gallery` on ") == 2  # the latency views say where and when


SUBCOMMANDS = (
    "demo",
    "goldens",
    "gallery",
    "bench",
    "margins",
    "models",
    "families",
    "calibrate",
    "blas",
    "serve",
    "invariance",
    "replay-html",
    "info",
)


def _help_modules(args):
    """``main(args + ['--help'])`` in a fresh interpreter: its stdout and whether mlx, pandas or the engine
    were imported (the heavy stack, seconds of start-up)."""
    code = (
        "import sys\nfrom workbench.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print('IMPORTED', sorted(m for m in ('mlx', 'mlx.core', 'mlx_lm', 'pandas', 'workbench.engine') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *args, "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_top_level_help_lists_every_sub_command_and_imports_no_mlx():
    text = _help_modules([])
    assert text.rstrip().endswith("IMPORTED []"), text
    for name in SUBCOMMANDS:
        assert f"    {name}" in text


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_sub_command_help_describes_it_and_imports_no_mlx(name):
    from workbench.cli import build_parser

    text = _help_modules([name])
    assert text.rstrip().endswith("IMPORTED []"), text
    sub = build_parser()._subparsers._group_actions[0].choices[name]
    assert sub.description and len(sub.description) > 20  # a sentence, not only the usage line


def test_ctrl_c_prints_one_line_and_exits_130(tmp_path):
    import os
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench.cli", "families", "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # a shell without job control starts background jobs with SIGINT ignored, and a child
        # inherits that (then Python installs no KeyboardInterrupt handler): give it the default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    seen = b""
    while b"arch/s" not in seen:  # the walk's progress bar: imports done, architectures being tried
        chunk = os.read(proc.stderr.fileno(), 4096)
        assert chunk, seen.decode(errors="replace")
        seen += chunk
    assert proc.poll() is None, "the walk ended before the signal could be sent"
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    stderr = (seen + rest).decode(errors="replace")
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert stderr.rstrip().splitlines()[-1] == "workbench families: interrupted (Ctrl-C)"
    assert not (tmp_path / "families.md").exists()


def test_families_writes_into_the_output_folder_not_the_docs(tmp_path, monkeypatch):
    from workbench.verify import families

    monkeypatch.setattr(families, "architectures", lambda: ["llama", "Klear"])
    assert main(["families", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "families.md").read_text()
    assert (
        "| llama | batches | 2 rows of 3 and 7 tokens, 2/2 match solo |" in text
        and "| Klear | not built |" in text
    )


def test_the_commands_that_write_files_default_to_workbench_out():
    from workbench.cli import build_parser

    parser = build_parser()
    for args in (["bench"], ["bench", "--quick"], ["families"], ["gallery"], ["demo"]):
        assert parser.parse_args(args).out == "workbench-out", args


def test_demo_in_the_batch_invariant_mode_prints_every_row_bit_exact(tmp_path):
    lines = []
    code = run_demo(max_batch=3, max_tokens=6, out_dir=tmp_path, echo=lines.append, batch_invariant=True)
    text = "\n".join(lines)
    assert code == 0, text
    assert "batch-invariant mode" in lines[0]
    assert re.search(r"bit-exact: (\d+)/\1 rows equal to their run alone", text), text


def test_the_invariance_audit_command_prints_the_operations_and_exits_0_when_the_mode_holds(capsys):
    assert main(["invariance", "--batch-sizes", "3", "--max-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "operation | rows tried" in out and "attention" in out and "invariant B =   3: 3/3" in out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["calibrate", "--out", "{dir}"], "is a folder; give a file name"),
        (["invariance", "--cost", "--out", "{dir}"], "is a folder; give a file name"),
        (["demo", "--out", "{file}"], "is a file; give a folder"),
        (["replay-html", "--out", "{file}"], "is a file; give a folder"),
        (["goldens", "--out", "{file}/sub"], "{file} is a file, not a folder to write into"),
    ],
)
def test_an_unwritable_out_is_refused_before_any_work_naming_the_flag(tmp_path, capsys, argv, words):
    """A break-it pass (2026-12-07): ``calibrate`` worked ~20 s, ``replay-html`` 44 s, before an
    ``--out`` they could not write failed with an ``[Errno]`` that did not name ``--out``."""
    (tmp_path / "f").write_text("x")
    filled = [a.format(dir=tmp_path, file=tmp_path / "f") for a in argv]
    assert main(filled) == 2
    err = capsys.readouterr().err
    words = words.format(file=tmp_path / "f")
    assert f"error: --out {filled[-1]}: {words}" in err and err.count("\n") == 1, err


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux's /proc: a folder that takes no new file")
def test_an_out_in_a_folder_that_takes_no_file_is_refused_naming_it(capsys):
    assert main(["demo", "--out", "/proc/x"]) == 2
    assert "error: --out /proc/x: /proc takes no new file" in capsys.readouterr().err


@pytest.mark.parametrize(
    "port, shown",
    [
        ("99999", "99999"),
        ("-1", "-1"),
        ("http", "'http'"),
        # int() took these (a break-it pass, 2026-12-08): ASCII digits only.
        (" 80 ", "' 80 '"),
        ("8_000", "'8_000'"),
        ("+80", "'+80'"),
        ("\uff18\uff10", "'\uff18\uff10'"),  # full-width 80
    ],
)
def test_serve_refuses_a_port_outside_0_65535_at_parse_time_naming_the_flag(monkeypatch, capsys, port, shown):
    """A break-it pass (2026-12-07): ``--port 99999`` failed only after the model loaded, not naming ``--port``."""
    import workbench.serving.server as server

    monkeypatch.setattr(server, "serve_command", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--port", port])
    assert exc.value.code == 2
    assert (
        f"argument --port: must be an int in [0, 65535] (0: a free one), got {shown}"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "argv, extra, module",
    [
        (["serve"], "serve", "uvicorn"),
        (["serve"], "serve", "starlette"),
        (["invariance", "--coverage"], "structured", "llguidance"),
        (["compose"], "structured", "llguidance"),
    ],
)
def test_a_command_without_its_extra_says_so_in_one_line_before_loading_the_model(
    monkeypatch, capsys, argv, extra, module
):
    """A new user's run (2026-12-08): ``invariance --coverage`` printed the audit, then died in a
    traceback without llguidance; ``serve`` loaded the model, then died without uvicorn."""
    import workbench.runtime.loading as loading

    monkeypatch.setitem(sys.modules, module, None)  # `import module` fails, as when it is not installed
    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"workbench {argv[0]}: error: ") and err.count("\n") == 1, err
    assert f"needs the {extra} extra: pip install -e '.[{extra}]'" in err and module in err


def test_invariance_help_says_the_batch_sizes_set_only_the_end_to_end_rows():
    from workbench.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices["invariance"]
    text = " ".join(sub.format_help().split())
    assert "batch sizes B of the end-to-end rows" in text and "per-operation table keeps its own" in text
