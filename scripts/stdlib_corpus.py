"""The training corpus of ``train_tiny.py``: this interpreter's standard-library sources.

Knows: which ``*.py`` files of ``sysconfig.get_paths()["stdlib"]`` are in the corpus, their
order, and the held-out split. Must not know: tokenizers or models.

The file list is deterministic for a given CPython version: every ``*.py`` under the
stdlib folder, sorted by relative POSIX path, minus third-party packages, test suites,
the codec tables of ``encodings/``, the generated docs of ``pydoc_data/`` and the
build-specific ``_sysconfigdata_*``. Every ``HELD_OUT_EVERY``-th file of that list (index
``HELD_OUT_EVERY - 1``, ``2 * HELD_OUT_EVERY - 1``, ...) is held out for evaluation; the
model never trains on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from model_folder import stdlib_dir

EXCLUDED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "encodings", "pydoc_data", "__pycache__"}
)
HELD_OUT_EVERY = 20


@dataclass(frozen=True)
class Corpus:
    """Relative paths (POSIX) of the training and held-out files, in corpus order."""

    root: Path
    train_files: tuple[str, ...]
    held_out_files: tuple[str, ...]

    def texts(self, files: tuple[str, ...]) -> list[str]:
        """The files' contents, in order (UTF-8; undecodable bytes replaced)."""
        return [(self.root / f).read_text(encoding="utf-8", errors="replace") for f in files]

    def n_bytes(self, files: tuple[str, ...]) -> int:
        """Total size of ``files`` in bytes."""
        return sum((self.root / f).stat().st_size for f in files)


def corpus_files(root: Path) -> list[str]:
    """Every corpus file under ``root``, sorted by relative POSIX path."""
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if EXCLUDED_DIRS.isdisjoint(rel.parts[:-1]) and not rel.name.startswith("_sysconfigdata"):
            files.append(rel.as_posix())
    return sorted(files)


def stdlib_corpus(root: Path | None = None) -> Corpus:
    """The corpus of ``root`` (default: this interpreter's stdlib) with its held-out split."""
    root = root or stdlib_dir()
    files = corpus_files(root)
    held = tuple(f for i, f in enumerate(files) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1)
    train = tuple(f for i, f in enumerate(files) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1)
    return Corpus(root, train, held)
