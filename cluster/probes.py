"""The GPU probe: is this card fit to be handed out and to stay in service? One probe for both uses — right
before the dispatcher hands a local card out (`scheduler.dispatch`), and in the health loop
(`monitoring.services.gpu_probe_all`, which turns outcomes into health changes and alerts).

On a local card the probe asks NVML for the device by UUID and reads its memory. An emulated card (or any local
card when `TRAINYARD_NVML_PROBE` is off) has no device to ask: the probe reads the planted-fault file
(`TRAINYARD_EMULATED_FAULTS_FILE`, default `var/emulated-faults.json`), either a JSON list of GPU UUIDs (each fails
with `probe_failed`) or an object mapping a UUID to the fault to plant: `"gpu_lost"`, `"driver_reset"`,
`"probe_failed"` or `"xid:<code>"`. NVML's probe reads no Xid events and no retired or remapped pages: Xids
come from the telemetry loop (NVML's event set, or dcgm-exporter), and a card that fails its probe is marked suspect.

Cards of a Kubernetes node cannot be probed from here: `probe_card` answers None. Right before the dispatcher hands
them out, it asks `remote_health` instead: the source the monitoring app registers at start-up
(`monitoring.health.dcgm_hand_out_health`: the node's current dcgm-exporter series through Prometheus), which fails a
card that reports a fatal Xid the platform has not acted on yet.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from cluster.nvml import fault_of_nvml_error, load_nvml
from kernel.paths import VAR_DIR

# The fault names a probe reports; `monitoring.models.Fault` stores the same values.
XID = "xid"
GPU_LOST = "gpu_lost"
DRIVER_RESET = "driver_reset"
PROBE_FAILED = "probe_failed"


@dataclass(frozen=True)
class ProbeOutcome:
    ok: bool
    fault: str = ""
    reason: str = ""
    xid: int | None = None


PASSED = ProbeOutcome(True)


def emulated_faults_path() -> Path:
    return Path(getattr(settings, "TRAINYARD_EMULATED_FAULTS_FILE", "") or VAR_DIR / "emulated-faults.json")


def planted_faults() -> dict[str, str]:
    try:
        data = json.loads(emulated_faults_path().read_text())
    except (OSError, ValueError):
        return {}
    if isinstance(data, list):
        return {str(uuid): PROBE_FAILED for uuid in data}
    if isinstance(data, dict):
        return {str(uuid): str(kind) for uuid, kind in data.items()}
    return {}


def xid_fault(xid: int) -> str:
    """The fault a fatal Xid means: 79 is the card falling off the bus, the others are device errors."""
    return GPU_LOST if xid == 79 else XID


def _planted(kind: str) -> ProbeOutcome:
    if kind.startswith("xid:") and kind[4:].isdigit():
        xid = int(kind[4:])
        return ProbeOutcome(False, xid_fault(xid), f"emulated fault planted: Xid {xid}", xid)
    fault = kind if kind in {GPU_LOST, DRIVER_RESET} else PROBE_FAILED
    return ProbeOutcome(False, fault, f"emulated fault planted: {fault.replace('_', ' ')}")


def probes_planted(*, emulated: bool, backend: str = "local") -> bool:
    """Whether `probe_card` answers for such a card from the planted faults (`planted_faults`) instead of NVML."""
    return emulated or (backend == "local" and not settings.TRAINYARD_NVML_PROBE)


def planted_outcome(uuid: str, faults: dict[str, str]) -> ProbeOutcome:
    """What the probe of an emulated card says, given the planted faults read once (`planted_faults`)."""
    kind = faults.get(uuid)
    return PASSED if kind is None else _planted(kind)


def probe_card(*, uuid: str, emulated: bool, backend: str = "local", nvml=None) -> ProbeOutcome | None:
    """Probe one card; None when this process cannot reach it (a Kubernetes node's)."""
    if probes_planted(emulated=emulated, backend=backend):
        return planted_outcome(uuid, planted_faults())
    if backend != "local":
        return None
    nvml = nvml or load_nvml()
    if nvml is None:
        return ProbeOutcome(False, PROBE_FAILED, "NVML is not available on this machine any more")
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        nvml.nvmlDeviceGetMemoryInfo(handle)
    except nvml.NVMLError as exc:
        fault, reason = fault_of_nvml_error(nvml, exc)
        return ProbeOutcome(False, fault or PROBE_FAILED, reason)
    return PASSED


# Cards of cluster nodes: GPU UUIDs (None: every card the source reports) -> what a health source knows of them now
# (a card left out: nothing known).
RemoteHealth = Callable[[list[str] | None], dict[str, ProbeOutcome]]
_remote_health: RemoteHealth | None = None


def register_remote_health(source: RemoteHealth | None) -> None:
    """Named once at start-up by the app that reads cluster telemetry (it sits above this one)."""
    global _remote_health
    _remote_health = source


def remote_health(uuids: list[str] | None) -> dict[str, ProbeOutcome]:
    """The current health of cards the platform cannot probe itself (a Kubernetes node's), by UUID, or of every card
    the source reports (`uuids` None: one read for a pass that hands out many); empty when no source is registered.
    A source that cannot answer returns nothing: the hand-out goes ahead on what the health loop last saw."""
    if _remote_health is None or (uuids is not None and not uuids):
        return {}
    return _remote_health(None if uuids is None else list(uuids))
