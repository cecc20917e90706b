"""The health loop's view of a probe: `cluster.probes.probe_card` for one GPU row. The probe itself (NVML, the
planted-fault file) lives in `cluster.probes`, shared with the dispatcher's hand-out check."""

from __future__ import annotations

import functools
import re

import structlog
from django.conf import settings

from cluster.models import GPU
from cluster.probes import PASSED, ProbeOutcome, planted_faults, probe_card, xid_fault  # noqa: F401 - read through this module


def probe(gpu: GPU, *, nvml=None) -> ProbeOutcome | None:
    """Probe one card; None when this process cannot reach it (a Kubernetes node: dcgm reports its health)."""
    return probe_card(uuid=gpu.uuid, emulated=gpu.node.emulated, backend=gpu.node.backend, nvml=nvml)


log = structlog.get_logger(__name__)
_UUID = re.compile(r"^[A-Za-z0-9-]+$")


def dcgm_hand_out_health(uuids: list[str] | None) -> dict[str, ProbeOutcome]:
    """Right before cards of a Kubernetes node are handed out: their current dcgm-exporter series through
    Prometheus (one instant query, `TRAINYARD_HAND_OUT_CHECK_TIMEOUT_S`); `uuids` None asks for every card's (a
    pass that hands out many cards reads them once). A card whose last Xid is fatal (`TRAINYARD_FATAL_XIDS`) and not
    the one the telemetry loop already acted on fails; the others pass. Nothing is known (empty) without Prometheus,
    or when it does not answer in time (logged): the hand-out goes ahead."""
    from monitoring.collectors import CollectorUnavailable, PrometheusCollector, httpx_get
    from monitoring.models import GpuStatus

    if not settings.TRAINYARD_PROMETHEUS_URL or settings.TRAINYARD_TELEMETRY_SOURCE not in ("auto", "prometheus"):
        return {}
    if uuids is None:
        wanted = None
        query = "DCGM_FI_DEV_XID_ERRORS"
    else:
        wanted = {u for u in uuids if _UUID.match(u)}
        if not wanted:
            return {}
        cards = "|".join(sorted(wanted))
        query = " or ".join(f'DCGM_FI_DEV_XID_ERRORS{{{label}=~"{cards}"}}' for label in ("UUID", "uuid"))
    http_get = functools.partial(httpx_get, timeout_s=settings.TRAINYARD_HAND_OUT_CHECK_TIMEOUT_S)
    try:
        readings = PrometheusCollector(settings.TRAINYARD_PROMETHEUS_URL, http_get=http_get).collect(query)
    except CollectorUnavailable as exc:
        log.warning("hand_out_check_unavailable", cards=len(wanted) if wanted is not None else "all", error=str(exc))
        return {}
    statuses = GpuStatus.objects.filter(last_xid__isnull=False)
    if wanted is not None:
        statuses = statuses.filter(gpu__uuid__in=wanted)
    seen = dict(statuses.values_list("gpu__uuid", "last_xid"))
    fatal = set(settings.TRAINYARD_FATAL_XIDS)
    out = {}
    for reading in readings:
        if wanted is not None and reading.uuid not in wanted:
            continue
        if reading.xid in fatal and reading.xid != seen.get(reading.uuid):
            why = f"Xid {reading.xid} reported by dcgm-exporter when the card was about to be handed out"
            out[reading.uuid] = ProbeOutcome(False, xid_fault(reading.xid), why, reading.xid)
        else:
            out[reading.uuid] = PASSED
    return out
