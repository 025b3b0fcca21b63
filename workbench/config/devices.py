"""What accelerators the target machine has, asked without initialising CUDA in this process, and
without importing torch where the machine has no device for it to find: a fresh kernel's first
submit (and every `workbench run`) would otherwise pay torch's import, 2-3 s, to learn "none"."""

from __future__ import annotations

import glob
import os
import sys

GPU_NODES = ("/dev/nvidia*", "/dev/nvhost-*", "/dev/nvmap", "/dev/kfd", "/dev/dxg")
"""Where a GPU shows itself on Linux: NVIDIA's driver (any of its nodes, so that a loaded driver is
always asked), Jetson's (Tegra), ROCm's kernel driver, WSL2's GPU bridge."""
XPU_NODES = ("/dev/dri/renderD*",)
"""Intel GPUs (and other render devices): present, torch is asked."""


def no_device_nodes(patterns: tuple[str, ...]) -> bool:
    """True where torch could not find such a device: a Linux machine with none of these nodes, in a
    process that has not imported torch yet (one that has asks torch, at no cost)."""
    if "torch" in sys.modules or not sys.platform.startswith("linux"):
        return False
    return not any(glob.glob(pattern) for pattern in patterns)


def visible_gpu_count() -> int:
    """CUDA devices visible to this process (0 on CPU builds); never creates a CUDA context."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1") or no_device_nodes(GPU_NODES):
        return 0
    import torch

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return 0
    return int(torch.cuda.device_count())  # NVML-based where available: no context is created


def visible_xpu_count() -> int:
    """Intel XPU devices visible to this process (0 when torch has no XPU support)."""
    if no_device_nodes(XPU_NODES):
        return 0
    import torch

    xpu = getattr(torch, "xpu", None)
    return int(xpu.device_count()) if xpu is not None and xpu.is_available() else 0


def parse_visible_devices(value: str | None, count: int) -> list[str]:
    """The device ids a user made visible (CUDA_VISIBLE_DEVICES), or 0..count-1 when unset."""
    if value is None or value.strip() == "":
        return [str(i) for i in range(count)]
    return [part.strip() for part in value.split(",") if part.strip()]
