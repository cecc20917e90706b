"""The health loop's view of a probe: `cluster.probes.probe_card` for one GPU row. The probe itself (NVML, the
planted-fault file) lives in `cluster.probes`, shared with the dispatcher's hand-out check."""

from __future__ import annotations

from cluster.models import GPU
from cluster.probes import PASSED, ProbeOutcome, planted_faults, probe_card, xid_fault  # noqa: F401 - read through this module


def probe(gpu: GPU, *, nvml=None) -> ProbeOutcome | None:
    """Probe one card; None when this process cannot reach it (a Kubernetes node: dcgm reports its health)."""
    return probe_card(uuid=gpu.uuid, emulated=gpu.node.emulated, backend=gpu.node.backend, nvml=nvml)
