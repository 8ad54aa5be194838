"""Shared fixtures: the bundled model (loaded once), a fake clock, prompt helpers.

The oracle tests hold the engine to bit-exact (full attention) and 1e-5 (ring buffer, SSM)
agreement with mlx-lm, which is a property of MLX's own CPU kernels: an optimized BLAS
(OpenBLAS, MKL) picks different kernels for ``[B, ...]`` and ``[1, ...]`` matmuls and
differs in the last bits. So the suite runs with ``WORKBENCH_BLAS=off`` unless the caller
sets it; ``tests/runtime/test_blas.py`` checks the optimized path separately (at the design's
1e-4 tolerance).
"""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path


def _optimized_blas_mapped() -> bool:
    """True when OpenBLAS or MKL is already in this process (the start-up hook of
    ``workbench.runtime.blas`` loads it at interpreter start)."""
    try:
        with open("/proc/self/maps") as maps:
            return any(re.search(r"/lib(openblas[^/]*|mkl_rt)\.so", line) for line in maps)
    except OSError:
        return False


# A process that started with an optimized BLAS already loaded (the start-up hook) restarts
# once, the same command with WORKBENCH_BLAS=off, in pytest_configure (output capture undone).
RESTART_WITHOUT_BLAS = "WORKBENCH_BLAS" not in os.environ and _optimized_blas_mapped()
os.environ.setdefault("WORKBENCH_BLAS", "off")  # before workbench (and mlx) is imported

import pytest  # noqa: E402 (the imports follow the environment set above)

import workbench as wb  # noqa: E402
from workbench.runtime.loading import RANDOM_MODEL  # noqa: E402
from workbench.workloads.workload import prompt_maker  # noqa: E402


class FakeClock:
    """A clock that advances by ``tick_s`` seconds on every read."""

    def __init__(self, tick_s: float = 0.5):
        self.now_s = 0.0
        self.tick_s = tick_s

    def __call__(self) -> float:
        self.now_s += self.tick_s
        return self.now_s


@pytest.fixture
def fake_clock_class():
    """The :class:`FakeClock` class, for tests that build several clocks."""
    return FakeClock


@pytest.fixture(scope="session")
def bundled():
    """``(model, tokenizer)`` of the bundled default model (the trained tiny-code), loaded
    through mlx_lm.load."""
    return wb.load()


@pytest.fixture(scope="session")
def random_llama():
    """``(model, tokenizer)`` of tiny-llama, the random-weight model of another shape."""
    return wb.load(RANDOM_MODEL)


# A chat template that refuses through raise_exception, as real ones do ("Conversation roles must alternate").
REFUSING_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] not in ['user', 'assistant', 'system'] %}{{ raise_exception('bad role ' + m['role']) }}{% endif %}"
    "{% if loop.first and m['role'] == 'assistant' %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{{ m['content'] }}{% endfor %}"
)


@pytest.fixture(scope="session")
def refusing_tokenizer():
    """The bundled tokenizer (a copy of its own) with :data:`REFUSING_TEMPLATE` as its chat template."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from workbench.runtime.loading import BUNDLED_MODEL

    tokenizer = load_tokenizer(Path(BUNDLED_MODEL))
    tokenizer._tokenizer.chat_template = REFUSING_TEMPLATE
    tokenizer.has_chat_template = True
    return tokenizer


@pytest.fixture
def make_sched(bundled):
    """``make_sched(**kwargs)`` -> a Scheduler on the bundled model."""
    model, tokenizer = bundled

    def make(**kwargs):
        return wb.Scheduler(model, tokenizer, **kwargs)

    return make


@pytest.fixture
def prompt(bundled):
    """``prompt(n, start=0)`` -> n token ids from the bundled prompt set."""
    _, tokenizer = bundled
    return prompt_maker(tokenizer)


@functools.cache
def _solo_references():
    from tests.references import SoloReferences

    return SoloReferences()


@pytest.fixture
def solo_references_once(monkeypatch):
    """``oracle.solo_reference`` (and so ``oracle.solo_check``) through the session's memo
    (``tests/references.py``): each mlx-lm solo run once per model, request and settings. For
    modules that patch nothing the reference runs through (``pytest.mark.usefixtures``)."""
    from workbench.verify import oracle

    monkeypatch.setattr(oracle, "solo_reference", _solo_references())


@pytest.fixture
def two_request_events():
    """A hand-written event log of two requests (times in seconds, steps 0..3).

    uid 0: submitted at 0 s, joins at step 0, tokens at steps 0, 1, 2 (2, 3, 4 s), evicted at step 3.
    uid 1: submitted at 1 s, joins at step 0, tokens at steps 0, 1 (2, 3 s), evicted at step 2.
    """
    from workbench.observe.events import Event, events_frame

    return events_frame(
        [
            Event("submit", 0, 0, 0.0, n_tokens=4),
            Event("submit", 1, 0, 1.0, n_tokens=2),
            Event("admit", 0, 0, 1.5, row=0, n_tokens=4),
            Event("admit", 1, 0, 1.5, row=1, n_tokens=2),
            Event("join", 0, 0, 1.8, row=0),
            Event("join", 1, 0, 1.8, row=1),
            Event("token", 0, 0, 2.0, row=0, token=5, logprob=-1.0),
            Event("token", 1, 0, 2.0, row=1, token=6, logprob=-1.0),
            Event("token", 0, 1, 3.0, row=0, token=7, logprob=-1.0),
            Event("token", 1, 1, 3.0, row=1, token=8, logprob=-1.0),
            Event("finish", 1, 1, 3.0, row=1, finish_reason="length"),
            Event("evict", 1, 2, 3.5, row=1),
            Event("token", 0, 2, 4.0, row=0, token=9, logprob=-1.0),
            Event("finish", 0, 2, 4.0, row=0, finish_reason="length"),
            Event("evict", 0, 3, 4.5, row=0),
        ]
    )


def pytest_configure(config):
    if RESTART_WITHOUT_BLAS:
        config.pluginmanager.getplugin("capturemanager").suspend_global_capture(in_=True)
        os.execv(sys.executable, list(sys.orig_argv))


def pytest_addoption(parser):
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help="run the stateful fuzzer long enough for >= 10,000 operations",
    )


def _counts() -> dict:
    """This process's counts for the summary: the fuzzer's (``tests.verify.test_fuzz.STATS``)
    and the solo-reference memo's (``tests/references.py``); empty where neither ran."""
    module = sys.modules.get("tests.verify.test_fuzz")
    counts = dict(module.STATS) if module else {}
    if _solo_references.cache_info().currsize:
        counts |= {"solo_runs": _solo_references().runs, "solo_reused": _solo_references().reused}
    return counts


# Under pytest-xdist (pyproject's ``-n``) the workers run the tests and the controller prints the
# summary: each worker hands over its GPU skips and counts when it finishes.
WORKER_COUNTS: dict[str, int] = {}


def pytest_sessionfinish(session):
    output = getattr(session.config, "workeroutput", None)  # set in an xdist worker only
    if output is not None:
        output["gpu_skipped"] = list(GPU_SKIPPED)
        output["counts"] = _counts()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    output = getattr(node, "workeroutput", None) or {}
    GPU_SKIPPED[:] = sorted(set(GPU_SKIPPED) | set(output.get("gpu_skipped", ())))
    for name, count in output.get("counts", {}).items():
        WORKER_COUNTS[name] = WORKER_COUNTS.get(name, 0) + count


def pytest_terminal_summary(terminalreporter):
    if GPU_SKIPPED:
        terminalreporter.write_line(f"gpu: {len(GPU_SKIPPED)} test(s) skipped: {GPU_SKIP}")
    stats = _counts()
    for name, count in WORKER_COUNTS.items():
        stats[name] = stats.get(name, 0) + count
    if stats.get("solo_runs"):
        terminalreporter.write_line(
            f"solo references (tests/references.py): {stats['solo_runs']} mlx-lm runs, "
            f"{stats.get('solo_reused', 0)} reused"
        )
    if stats.get("operations"):
        n = lambda name: stats.get(name, 0)
        terminalreporter.write_line(
            f"fuzzer: {n('operations')} operations, {n('rows_checked')} finished rows checked "
            f"against solo, {n('divergences')} divergences, {n('restores')} checkpoint restores "
            f"repeated their continuation, {n('interrupts')} interrupted operations left the engine unchanged, "
            f"{n('hostile_errors')} hostile rows ended alone with their error, "
            f"{n('constrained_checked')} constrained rows kept their grammar"
        )


# Notebooks that read data from outside the repository are skipped, with a clear message,
# when it is absent (nbval would fail on their first cell). (Tests never ``from conftest
# import``: this file is the module ``tests.conftest`` (tests/ and its folders are packages,
# so test files of one name in two folders do not clash), and notebooks/conftest.py is a
# plain ``conftest``.)
NOTEBOOKS_NEEDING_TRACES = {"06_policies_on_a_real_trace.ipynb": "conv", "12_paged_kv.ipynb": "conv"}


QUANTIZED_KV_NOTEBOOKS = {"13_quantized_kv.ipynb"}


def _quantized_kv_skip_reason():
    """On a GPU whose MLX runs no quantized attention path for the test models' head dims
    (neither ``quantized_matmul`` nor the dequantizing path), why ``quantized_kv`` tests cannot
    run there; ``None`` where they can (always on the CPU)."""
    import mlx.core as mx

    from workbench.runtime.device import on_gpu

    if not on_gpu():
        return None
    from workbench.engine.levers.quantized_attention import choose_attention

    bad = []
    for d in (32, 64):
        try:
            choose_attention(2, d, mx.float32, 32, 4)
        except ValueError:
            bad.append(d)
    return (
        (
            f"MLX on {mx.default_device()} runs no quantized attention path for head dim(s) {bad}, so "
            "Scheduler(kv_bits=...) refuses them at construction (docs/gpu.md)"
        )
        if bad
        else None
    )


@pytest.fixture(autouse=True)
def _references_attend_as_the_engine_does(monkeypatch):
    """Where MLX lacks ``quantized_matmul`` for the test models (CUDA, head dim 32), a scheduler
    with ``kv_bits`` attends by dequantizing; mlx-lm's references (``generate_step(kv_bits=...)``)
    then take the same path, or they could not run at all. Nothing changes on the CPU."""
    if _lacks_quantized_matmul():
        import mlx_lm.models.base as mlx_base

        from workbench.engine.levers.quantized_attention import dequantized_attention

        monkeypatch.setattr(mlx_base, "quantized_scaled_dot_product_attention", dequantized_attention)
    yield


@functools.cache
def _lacks_quantized_matmul() -> bool:
    from workbench.runtime.device import on_gpu

    if not on_gpu():
        return False
    from workbench.engine.levers.quantized_kv import device_runs_quantized_attention

    return not device_runs_quantized_attention(32)


GPU_SKIP = (
    'needs an NVIDIA GPU through mlx\'s CUDA backend (pip install -e ".[cuda]"); mx.cuda.is_available() '
    "is False here. Results on the lent H200 are recorded in docs/gpu.md"
)
GPU_SKIPPED = []


# The `slow` tier: `pytest -m "not slow"` is the quick check (README). Every executed notebook, every
# test of the fetched real model and the real-browser test are slow, and so is every test function
# listed in tests/slow_tests.txt (over 2 s in a whole-suite run: `scripts/lab/suite_durations.py RUN.xml --write`).
SLOW_MARKERS = ("realmodel", "browser")
SLOW_TESTS_FILE = Path(__file__).resolve().parent / "slow_tests.txt"


FILE_SECONDS_FILE = SLOW_TESTS_FILE.with_name("file_seconds.txt")


def file_seconds() -> dict[str, float]:
    """``path -> seconds`` from tests/file_seconds.txt: each test file's (and notebook's)
    measured seconds in a run of the whole suite."""
    rows = [line.split() for line in FILE_SECONDS_FILE.read_text().splitlines()]
    return {row[0]: float(row[1]) for row in rows if row and not row[0].startswith("#")}


def longest_files_first(items: list) -> None:
    """Order ``items`` in place file by file, the longest measured file first (0 s for a file
    tests/file_seconds.txt does not list), each file's own order kept. pytest-xdist, with
    pyproject's ``--dist loadfile --no-loadscope-reorder``, hands files to the workers in this
    order, so the last files to run are short ones and the two workers finish together."""
    seconds = file_seconds()
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))


def slow_tests() -> set[str]:
    """The test functions listed in tests/slow_tests.txt (``path::name``, no parameters)."""
    lines = SLOW_TESTS_FILE.read_text().splitlines()
    return {line.split()[0] for line in lines if line.strip() and not line.startswith("#")}


def slow_item(item, listed: set[str]) -> bool:
    """True for a collected item of the `slow` tier (SLOW_MARKERS, a notebook, or ``listed``)."""
    return (
        item.path.suffix == ".ipynb"
        or any(item.get_closest_marker(m) for m in SLOW_MARKERS)
        or item.nodeid.split("[")[0] in listed
    )


def pytest_collection_modifyitems(config, items):
    import mlx.core as mx

    from workbench.workloads.traces import trace_path

    listed = slow_tests()
    for item in items:
        if slow_item(item, listed):
            item.add_marker(pytest.mark.slow)
    longest_files_first(items)

    if not mx.cuda.is_available():
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(pytest.mark.skip(reason=GPU_SKIP))
                GPU_SKIPPED.append(item.nodeid)
    quantized = [
        item
        for item in items
        if item.get_closest_marker("quantized_kv") or item.path.name in QUANTIZED_KV_NOTEBOOKS
    ]
    reason = _quantized_kv_skip_reason() if quantized else None
    if reason:
        for item in quantized:
            item.add_marker(pytest.mark.skip(reason=reason))
    for item in items:
        name = NOTEBOOKS_NEEDING_TRACES.get(item.path.name)
        if name is None:
            continue
        try:
            trace_path(name)
        except FileNotFoundError as e:
            item.add_marker(pytest.mark.skip(reason=f"needs the shared Azure trace: {e}"))
