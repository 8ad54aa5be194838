"""The device MLX computes on: CPU, an NVIDIA GPU (mlx's CUDA backend) or Apple's GPU (Metal).

Knows: ``mlx.core``'s device queries (``default_device``, ``device_info``,
``cuda.is_available``, ``metal.is_available``), the operating system's page counts.
Must not know: models, requests.

``mx.device_info()`` keys differ by backend: CUDA gives ``device_name``, ``architecture``
(``sm_90`` on an H100/H200), ``total_memory`` and ``free_memory`` (bytes); Metal gives
``memory_size``; the CPU only ``device_name`` and ``architecture``, so the CPU's memory is
the machine's RAM (``os.sysconf``).

mlx's backends are separate wheels that each install ``mlx/lib/libmlx.so``: ``mlx-cpu``
(this project's Linux dependency) and ``mlx-cuda-13`` (its ``cuda`` extra). Whichever
was installed last is the one MLX loads; :func:`cuda_install_note` notices when the CUDA
wheel is installed but MLX runs on the CPU, and says how to fix it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

import mlx.core as mx


@dataclass(frozen=True)
class DeviceReport:
    """The default device: ``kind`` (``"gpu"`` or ``"cpu"``), ``backend`` (``"cuda"``,
    ``"metal"`` or ``"cpu"``), ``name`` (e.g. ``"NVIDIA H200"``), ``architecture``
    (e.g. ``"sm_90"``), ``memory_bytes`` (the device's memory, or the machine's RAM on the
    CPU; ``None`` when unknown) and ``free_memory_bytes`` (``None`` when not reported)."""

    kind: str
    backend: str
    name: str
    architecture: str
    memory_bytes: int | None
    free_memory_bytes: int | None

    def text(self) -> str:
        """One line, e.g. ``gpu (cuda): NVIDIA H200, sm_90, 150.0 GB memory (149.3 GB free)``."""
        mem = "memory unknown" if self.memory_bytes is None else f"{self.memory_bytes / 1e9:.1f} GB memory"
        if self.free_memory_bytes is not None:
            mem += f" ({self.free_memory_bytes / 1e9:.1f} GB free)"
        return f"{self.kind} ({self.backend}): {self.name}, {self.architecture}, {mem}"


def backend() -> str:
    """``"cuda"``, ``"metal"`` or ``"cpu"``: what the default device runs on."""
    if mx.default_device() == mx.cpu:
        return "cpu"
    if mx.cuda.is_available():
        return "cuda"
    return "metal" if mx.metal.is_available() else "cpu"


def on_gpu() -> bool:
    """True when MLX's default device is a GPU (CUDA or Metal)."""
    return backend() != "cpu"


def _ram_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def device_report() -> DeviceReport:
    """The :class:`DeviceReport` of MLX's default device (see the module docstring)."""
    kind_of = backend()
    info = mx.device_info()
    memory = info.get("total_memory", info.get("memory_size"))
    if kind_of == "cpu" and memory is None:
        memory = _ram_bytes()
    free = info.get("free_memory")
    return DeviceReport(
        "cpu" if kind_of == "cpu" else "gpu",
        kind_of,
        str(info.get("device_name", "unknown")),
        str(info.get("architecture", "unknown")),
        None if memory is None else int(memory),
        None if free is None else int(free),
    )


CUDA_WHEELS = ("mlx-cuda-13", "mlx-cuda-12")


def cuda_install_note() -> str | None:
    """A one-line fix when a CUDA wheel of mlx is installed but MLX has no CUDA backend
    (``mlx-cpu``'s ``libmlx.so`` was installed over it); ``None`` otherwise."""
    for name in CUDA_WHEELS:
        try:
            wheel_version = version(name)
        except PackageNotFoundError:
            continue
        if not mx.cuda.is_available():
            return (
                f"{name} {wheel_version} is installed but MLX has no CUDA backend: mlx-cpu's libmlx.so was "
                f"installed over it; run pip install --force-reinstall --no-deps {name}=={wheel_version}"
            )
    return None
