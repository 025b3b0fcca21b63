"""What accelerators the target machine has, asked without initialising CUDA in this process."""

from __future__ import annotations

import os


def visible_gpu_count() -> int:
    """CUDA devices visible to this process (0 on CPU builds); never creates a CUDA context."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return 0
    import torch

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return 0
    return int(torch.cuda.device_count())  # NVML-based where available: no context is created


def visible_xpu_count() -> int:
    """Intel XPU devices visible to this process (0 when torch has no XPU support)."""
    import torch

    xpu = getattr(torch, "xpu", None)
    return int(xpu.device_count()) if xpu is not None and xpu.is_available() else 0


def parse_visible_devices(value: str | None, count: int) -> list[str]:
    """The device ids a user made visible (CUDA_VISIBLE_DEVICES), or 0..count-1 when unset."""
    if value is None or value.strip() == "":
        return [str(i) for i in range(count)]
    return [part.strip() for part in value.split(",") if part.strip()]
