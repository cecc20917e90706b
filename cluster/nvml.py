"""NVML, the one way the platform talks to local NVIDIA cards: loading it once per process, and what its errors
mean. The inventory, the GPU probe and the telemetry collector all go through here."""

from __future__ import annotations

from typing import Any

_initialised: Any = None


def load_nvml():
    """The pynvml module, initialised once per process, or None when this machine has no NVIDIA driver."""
    global _initialised
    try:
        import pynvml
    except ImportError:
        return None
    if _initialised is pynvml:
        return pynvml
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver, no device: all mean "no NVML here"
        return None
    _initialised = pynvml
    return pynvml


def fault_of_nvml_error(nvml, exc: Exception) -> tuple[str, str]:
    """(fault, reason) for an NVML error raised by a device call; fault is '' when it says nothing fatal."""
    value = getattr(exc, "value", None)
    if value == getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15):
        return "gpu_lost", f"NVML: GPU is lost ({exc})"
    if value == getattr(nvml, "NVML_ERROR_RESET_REQUIRED", 16):
        return "driver_reset", f"NVML: GPU requires a reset ({exc})"
    return "", f"NVML: {exc}"
