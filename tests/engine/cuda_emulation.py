"""Run an ``mx.fast.cuda_kernel`` source on the CPU, for machines without a GPU: the kernel body,
wrapped as MLX's CUDA backend wraps it (``mlx/backend/cuda/custom_kernel.cpp``: the inputs as
``const T*``, the outputs as ``T*``, the template arguments as ``constexpr int`` / ``using``),
compiled by g++ against CUDA's ``cuda_bf16.h`` / ``cuda_fp16.h`` with an emulation of what the
workbench's kernels use: one ``std::thread`` per CUDA thread of a block (blocks one after the
other), ``__shfl_xor_sync`` through a barrier per warp, ``__syncthreads`` through a block
barrier, ``__shared__`` as a function's static storage, MLX's ``AlignedVector`` / ``is_aligned``.

It checks a kernel's logic (indices, lane groups, shuffles, merges, the launch the Python
wrapper computes), not the GPU's compiler, timing or memory model. Inside :func:`emulated`,
``mx.fast.cuda_kernel`` builds :class:`EmulatedKernel` s, so a wrapper such as
``workbench.engine.packed.cuda_attention.paged_decode_attention`` runs unchanged.
``shifts`` (input name -> bytes) misaligns an input's pointer (the kernels' scalar-load path).
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import numpy as np

CUDA_INCLUDE = Path("/usr/local/cuda/include")
CUDA_TYPES = {mx.float32: "float", mx.bfloat16: "__nv_bfloat16", mx.float16: "__half", mx.int32: "int32_t"}
BUILD = Path(tempfile.gettempdir()) / "workbench-cuda-emulation"

HEADER = """
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
namespace cuda { namespace std { using ::std::numeric_limits; } }
struct EmuDim { unsigned x, y, z; };
thread_local EmuDim threadIdx, blockIdx;
struct EmuBlock { std::barrier<>* block; std::vector<std::barrier<>*> warps; float slots[64][32]; };
EmuBlock* g_block = nullptr;
#define __device__
#define __global__
#define __shared__ static
#define __syncthreads() g_block->block->arrive_and_wait()
inline float __shfl_xor_sync(unsigned, float v, int off) {
  int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  g_block->slots[w][lane] = v;
  g_block->warps[w]->arrive_and_wait();
  float r = g_block->slots[w][lane ^ off];
  g_block->warps[w]->arrive_and_wait();
  return r;
}
namespace mlx { namespace core { namespace cu {
template <typename T, int N> struct alignas(sizeof(T) * N) AlignedVector { T val[N]; };
template <int N, typename T> inline bool is_aligned(T* x) {
  return (reinterpret_cast<uintptr_t>(x) % (N * sizeof(T))) == 0;
}
}}}
static char* load(const char* path, size_t n, int shift, std::vector<char>& keep) {
  keep.assign(n + 128, 0);
  char* p = keep.data() + (64 - reinterpret_cast<uintptr_t>(keep.data()) % 64) % 64 + shift;
  FILE* f = fopen(path, "rb");
  if (n && fread(p, 1, n, f) != n) exit(2);
  fclose(f);
  return p;
}
"""

DRIVER = """
int main(int argc, char** argv) {
  int n_blocks = atoi(argv[1]), n_threads = atoi(argv[2]);
  std::vector<std::vector<char>> keep(argc);
  std::vector<char*> ptr(argc);
  for (int i = 0; i < N_IN; ++i)
    ptr[i] = load(argv[3 + 3 * i], strtoull(argv[4 + 3 * i], 0, 10), atoi(argv[5 + 3 * i]), keep[i]);
  for (int i = 0; i < N_OUT; ++i) {  // outputs start as 0x7f7f... bytes: a slot never written shows
    std::vector<char>& out = keep[N_IN + i];
    out.assign(strtoull(argv[4 + 3 * (N_IN + i)], 0, 10) + 128, 0x7f);
    ptr[N_IN + i] = out.data() + (64 - reinterpret_cast<uintptr_t>(out.data()) % 64) % 64;
  }
  int n_warps = (n_threads + 31) / 32;
  for (int b = 0; b < n_blocks; ++b) {
    EmuBlock blk;
    std::barrier<> whole(n_threads);
    blk.block = &whole;
    for (int w = 0; w < n_warps; ++w) blk.warps.push_back(new std::barrier<>(32));
    g_block = &blk;
    std::vector<std::thread> threads;
    for (int t = 0; t < n_threads; ++t)
      threads.emplace_back([&, t, b]() {
        threadIdx = {unsigned(t), 0, 0};
        blockIdx = {unsigned(b), 0, 0};
        mlx::core::cu::emulated_kernel(ARGS);
      });
    for (auto& t : threads) t.join();
    for (auto* w : blk.warps) delete w;
  }
  for (int i = 0; i < N_OUT; ++i) {
    FILE* f = fopen(argv[3 + 3 * (N_IN + i)], "wb");
    fwrite(ptr[N_IN + i], 1, strtoull(argv[4 + 3 * (N_IN + i)], 0, 10), f);
    fclose(f);
  }
  return 0;
}
"""


def available() -> str:
    """``""`` where kernels can be emulated here, else why not (the test's skip reason)."""
    if shutil.which("g++") is None:
        return "no g++ on this machine"
    if not (CUDA_INCLUDE / "cuda_bf16.h").exists():
        return f"no CUDA headers at {CUDA_INCLUDE} (cuda_bf16.h)"
    return ""


def _raw(a: mx.array) -> bytes:
    return np.array(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a).tobytes()


def _array(raw: bytes, shape, dtype) -> mx.array:
    if dtype == mx.bfloat16:
        return mx.array(np.frombuffer(raw, np.uint16).reshape(shape)).view(mx.bfloat16)
    return mx.array(
        np.frombuffer(raw, {mx.float32: np.float32, mx.float16: np.float16}[dtype]).reshape(shape)
    )


class EmulatedKernel:
    """What ``mx.fast.cuda_kernel(name, input_names, output_names, source, header)`` returns,
    run on the CPU (1-D grids and threadgroups only, as the workbench's kernels launch)."""

    shifts: dict[str, int] = {}

    def __init__(self, name, input_names, output_names, source, header="", **_):
        self.inputs, self.outputs, self.source, self.header = input_names, output_names, source, header

    def program(self, in_dtypes, out_dtypes, template) -> str:
        """The C++ program: the kernel as MLX wraps it, and a driver launching its blocks."""
        params = [f"const {CUDA_TYPES[d]}* {n}" for n, d in zip(self.inputs, in_dtypes, strict=True)]
        params += [f"{CUDA_TYPES[d]}* {n}" for n, d in zip(self.outputs, out_dtypes, strict=True)]
        consts = "".join(
            f"  using {n} = {CUDA_TYPES[v]};\n"
            if isinstance(v, mx.Dtype)
            else f"  constexpr int {n} = {v};\n"
            for n, v in template
        )
        args = [f"reinterpret_cast<{p.rsplit(' ', 1)[0]}>(ptr[{i}])" for i, p in enumerate(params)]
        driver = DRIVER.replace("N_IN", str(len(self.inputs))).replace("N_OUT", str(len(self.outputs)))
        return (
            HEADER
            + self.header
            + "namespace mlx::core::cu {\nvoid emulated_kernel("
            + ", ".join(params)
            + ") {\n"
            + consts
            + self.source
            + "\n}\n}\n"
            + driver.replace("ARGS", ", ".join(args))
        )

    def _binary(self, program: str) -> Path:
        exe = BUILD / hashlib.sha1(program.encode()).hexdigest()[:20]
        if not exe.exists():
            BUILD.mkdir(parents=True, exist_ok=True)
            src = exe.with_suffix(".cpp")
            src.write_text(program)
            cmd = [
                "g++",
                "-O1",
                "-std=c++20",
                "-pthread",
                "-w",
                f"-I{CUDA_INCLUDE}",
                str(src),
                "-o",
                str(exe),
            ]
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        return exe

    def __call__(self, inputs, template, grid, threadgroup, output_shapes, output_dtypes, **_):
        inputs = [mx.contiguous(x) for x in inputs]
        exe = self._binary(self.program([x.dtype for x in inputs], list(output_dtypes), template))
        threads = threadgroup[0]
        argv = [str(exe), str(-(-grid[0] // threads)), str(threads)]
        with tempfile.TemporaryDirectory() as d:
            for name, x in zip(self.inputs, inputs, strict=True):
                path = Path(d) / name
                path.write_bytes(_raw(x))
                argv += [str(path), str(x.nbytes), str(self.shifts.get(name, 0))]
            outs = [Path(d) / name for name in self.outputs]
            for path, shape, dtype in zip(outs, output_shapes, output_dtypes, strict=True):
                argv += [str(path), str(int(np.prod(shape)) * dtype.size), "0"]
            subprocess.run(argv, check=True)
            return [
                _array(p.read_bytes(), s, dt)
                for p, s, dt in zip(outs, output_shapes, output_dtypes, strict=True)
            ]


@contextlib.contextmanager
def emulated(shifts: dict[str, int] | None = None, caches: tuple = ()) -> Iterator[None]:
    """Within the block ``mx.fast.cuda_kernel`` makes :class:`EmulatedKernel` s (``shifts``:
    input name -> bytes its pointer is moved by); ``caches`` (``functools.lru_cache`` d kernel
    makers) are cleared on entry and exit."""
    original = mx.fast.cuda_kernel
    EmulatedKernel.shifts = dict(shifts or {})
    for c in caches:
        c.cache_clear()
    mx.fast.cuda_kernel = EmulatedKernel
    try:
        yield
    finally:
        mx.fast.cuda_kernel = original
        EmulatedKernel.shifts = {}
        for c in caches:
            c.cache_clear()
