#!/usr/bin/env bash
# The whole test suite on the lent GPU machine (browser tests and notebooks aside), its result in
# $OUT: junit.xml (per test), pytest.log (the run, -rfEs summary last) and environment.txt (Python,
# packages, MLX's device), for docs/gpu.md.
#
# Here, once (network): ../shared/tools/gpu-wheels.sh (mlx, mlx-cuda-13, mlx-lm as .gpu-N parts),
# then `scripts/gpu_suite.sh --prepare`: the pure-Python test needs the machine's image lacks
# (ipywidgets, IPython, nbformat, nbconvert, nbval and their requirements) as wheels in .gpu-extra/ (git-ignored),
# and it prints the device call that carries them (to ~/gpu-extra, like the .gpu-N parts).
# There, from the repo root, after gpu-wheels.sh's calls (mlx in ~/gpu-site):
#     export PYTHONPATH=~/gpu-site:$PWD && scripts/gpu_suite.sh [PYTEST ARGS ...]
# PYTEST ARGS default to `tests`; pass folders to split the suite across calls (one device call
# runs at most 10 minutes: SUITE_TIMEOUT_S, default 540, interrupts pytest before that, and the
# junit xml and log of the tests run so far still come back). WORKERS (default 8) sets pytest-xdist's
# -n where the image has it (it does: KINDS.md), 0 for none.
#
# MLX_ENABLE_TF32 is unset, as a user's shell would leave it: `import workbench` then sets it to 0
# (full float32 matmuls, workbench.runtime.precision), the project's own default, which the
# oracle tests rely on; a value left over from another run would change what is measured.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
PY=${PYTHON:-python3}
# what tests import beyond the image (KINDS.md's package list); llguidance at pyproject's pin
# (1.6, which pip picks without it, takes no list of EOS ids: 40 structured-output tests failed)
EXTRAS=(ipywidgets nbformat nbconvert nbval "llguidance>=1.9,<2")
# their requirements the image already holds (KINDS.md): not carried, so nothing shadows its versions
IMAGE_HAS="pytest pluggy iniconfig attrs jinja2 markupsafe packaging psutil pygments python_dateutil typing_extensions six pyyaml numpy"

if [ "${1:-}" = "--prepare" ]; then
  rm -rf .gpu-extra && mkdir .gpu-extra
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_35_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu-extra "${EXTRAS[@]}" || exit 2
  for name in $IMAGE_HAS; do rm -f .gpu-extra/"$name"-[0-9]*.whl; done
  exclude="$(git rev-parse --git-common-dir)/info/exclude"
  grep -qx '/.gpu-extra/' "$exclude" 2>/dev/null || echo '/.gpu-extra/' >> "$exclude"
  echo "$(ls .gpu-extra | wc -l) wheels, $(du -sh .gpu-extra | cut -f1) in .gpu-extra/. Device call (before the suite):"
  echo "  carry [\".gpu-extra\"], command: mkdir -p ~/gpu-extra && cp .gpu-extra/*.whl ~/gpu-extra/"
  exit 0
fi

OUT=${OUT:-$root/gpu-suite-out}
mkdir -p "$OUT"
unset MLX_ENABLE_TF32
export PYTHONUNBUFFERED=1
for wheels in "$HOME/gpu-extra" "$root/.gpu-extra"; do  # the carried test needs, installed beside mlx
  if ls "$wheels"/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$HOME/gpu-extra-site" "$wheels"/*.whl \
      && export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$HOME/gpu-extra-site" \
      && export JUPYTER_PATH="$HOME/gpu-extra-site/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"  # nbconvert's templates
    break
  fi
done

$PY - > "$OUT/environment.txt" 2>&1 <<'EOF'
import importlib, os, platform, sys
print("python", sys.version.split()[0], platform.machine(), "PYTHONPATH", os.environ.get("PYTHONPATH", ""))
for name in ("mlx.core", "mlx_lm", "numpy", "pandas", "pyarrow", "matplotlib", "tqdm", "tokenizers", "transformers",
             "pytest", "xdist", "hypothesis", "ipywidgets", "IPython", "nbformat", "nbval", "dask"):
    try:
        module = importlib.import_module(name)
        print(f"{name:12s} {getattr(module, '__version__', '?')}  {os.path.dirname(module.__file__ or '')}")
    except Exception as exc:
        print(f"{name:12s} MISSING ({type(exc).__name__}: {exc})")
import mlx.core as mx
print("mlx cuda available", mx.cuda.is_available(), "default device", mx.default_device())
print("MLX_ENABLE_TF32 before import workbench:", os.environ.get("MLX_ENABLE_TF32"))
import workbench  # noqa: F401
print("MLX_ENABLE_TF32 after import workbench:", os.environ.get("MLX_ENABLE_TF32"))
EOF
cat "$OUT/environment.txt"
if ! $PY -c "import sys, mlx.core as mx; sys.exit(0 if mx.cuda.is_available() else 1)"; then
  echo "MLX's CUDA backend is not available here (see $OUT/environment.txt): run ../shared/tools/gpu-wheels.sh's calls first"
  exit 2
fi

args=("$@")
[ ${#args[@]} -gt 0 ] || args=(tests)
parallel=()
if [ "${WORKERS:-8}" != 0 ] && $PY -c "import xdist" 2>/dev/null; then
  parallel=(-n "${WORKERS:-8}" --dist loadfile)  # a file's tests on one worker: its module-level model caches stay warm
fi
echo "pytest ${args[*]} -o addopts= -m 'not browser' -rfEs ${parallel[*]} (at most ${SUITE_TIMEOUT_S:-540} s)"
timeout -s INT -k 30 "${SUITE_TIMEOUT_S:-540}" $PY -m pytest "${args[@]}" -o addopts= -p no:cacheprovider -m "not browser" \
  -rfEs "${parallel[@]}" --junitxml="$OUT/junit.xml" 2>&1 | tee "$OUT/pytest.log"
status=${PIPESTATUS[0]}
[ "$status" = 124 ] && echo "stopped at SUITE_TIMEOUT_S: split the suite (pass folders)" | tee -a "$OUT/pytest.log"
exit "$status"
