"""Probe a GPU right before handing it out.

On real hardware the probe asks NVML for the device by UUID and reads its memory and any pending Xid /
retired-page state. In the emulated inventory there is no device to ask: the probe reads the emulated
fault list (`var/emulated-faults.json`, a JSON list of GPU UUIDs) that tests and operators use to plant a
fault, and otherwise passes.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from trainyard.paths import VAR_DIR


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    reason: str = ""


def emulated_faults_path():
    return Path(getattr(settings, "TRAINYARD_EMULATED_FAULTS_FILE", "") or VAR_DIR / "emulated-faults.json")


def emulated_faults() -> set[str]:
    path = emulated_faults_path()
    try:
        return set(json.loads(path.read_text()))
    except (OSError, ValueError):
        return set()


def probe_gpu(*, uuid: str, emulated: bool) -> ProbeResult:
    if emulated or not settings.TRAINYARD_NVML_PROBE:
        if uuid in emulated_faults():
            return ProbeResult(False, "emulated fault planted for this GPU")
        return ProbeResult(True)
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid.encode())
            pynvml.nvmlDeviceGetMemoryInfo(handle)
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - any NVML error means the card is not fit to hand out
        return ProbeResult(False, f"NVML probe failed: {exc}")
    return ProbeResult(True)
