"""The GPU health probe, read-only: asks the card (NVML) or the emulated fault file whether it is fit, and
names the fault when it is not. `monitoring.services.gpu_probe_all` turns outcomes into health changes.

The emulated fault file (`TRAINYARD_EMULATED_FAULTS_FILE`, default `var/emulated-faults.json`) is either a
JSON list of GPU UUIDs (each fails with `probe_failed`) or an object mapping a UUID to the fault to plant:
`"gpu_lost"`, `"driver_reset"`, `"probe_failed"` or `"xid:<code>"`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.conf import settings

from cluster.models import GPU
from cluster.probes import emulated_faults_path
from monitoring.collectors import fault_of_nvml_error, load_nvml
from monitoring.models import Fault


@dataclass(frozen=True)
class ProbeOutcome:
    ok: bool
    fault: str = ""
    reason: str = ""
    xid: int | None = None


PASSED = ProbeOutcome(True)


def planted_faults() -> dict[str, str]:
    try:
        data = json.loads(emulated_faults_path().read_text())
    except (OSError, ValueError):
        return {}
    if isinstance(data, list):
        return {str(uuid): Fault.PROBE_FAILED for uuid in data}
    if isinstance(data, dict):
        return {str(uuid): str(kind) for uuid, kind in data.items()}
    return {}


def xid_fault(xid: int) -> str:
    """The fault a fatal Xid means: 79 is the card falling off the bus, the others are device errors."""
    return Fault.GPU_LOST if xid == 79 else Fault.XID


def _planted(kind: str) -> ProbeOutcome:
    if kind.startswith("xid:") and kind[4:].isdigit():
        xid = int(kind[4:])
        return ProbeOutcome(False, xid_fault(xid), f"emulated fault planted: Xid {xid}", xid)
    fault = kind if kind in {Fault.GPU_LOST, Fault.DRIVER_RESET} else Fault.PROBE_FAILED
    return ProbeOutcome(False, fault, f"emulated fault planted: {fault.replace('_', ' ')}")


def probe(gpu: GPU, *, nvml=None) -> ProbeOutcome | None:
    """Probe one card; None when this process cannot reach it (a Kubernetes node: dcgm reports its health)."""
    if gpu.node.emulated or (gpu.node.backend == "local" and not settings.TRAINYARD_NVML_PROBE):
        kind = planted_faults().get(gpu.uuid)
        return PASSED if kind is None else _planted(kind)
    if gpu.node.backend != "local":
        return None
    nvml = nvml or load_nvml()
    if nvml is None:
        return ProbeOutcome(False, Fault.PROBE_FAILED, "NVML is not available on this machine any more")
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
        nvml.nvmlDeviceGetMemoryInfo(handle)
    except nvml.NVMLError as exc:
        fault, reason = fault_of_nvml_error(nvml, exc)
        return ProbeOutcome(False, fault or Fault.PROBE_FAILED, reason)
    return PASSED
