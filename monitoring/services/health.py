"""Health: part of `monitoring.services` (see its package docstring)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction

from cluster import services as pool
from cluster.models import GPU
from kernel.errors import Conflict, NotFound
from kernel.sentences import stored
from monitoring import health
from monitoring.health import ProbeOutcome
from monitoring.models import (
    AlertRule,
    Fault,
    GpuStatus,
)
from monitoring.services.alerts import evaluate
from monitoring.services.common import FAULT_SEVERITY, alerts_lock, at_or_now, health_event, log


def health_apply(*, gpu_id: int, outcome: ProbeOutcome, actor: str, now: datetime, probed: bool) -> bool:
    """Apply one probe outcome or fault report to a card (inside the caller's transaction, alerts lock held).
    A failure marks the card unhealthy and quarantines it at once; a card already out counts one more failure
    in the same incident. Returns True when the card left service just now."""
    gpu = GPU.objects.select_for_update().select_related("node").get(pk=gpu_id)
    status, _ = GpuStatus.objects.get_or_create(gpu=gpu)
    if probed:
        status.last_probe_at = now
        status.last_probe_ok = outcome.ok
        status.last_probe_reason = outcome.reason[:300]
    left_service = False
    if outcome.ok:
        if gpu.health == GPU.Health.SUSPECT and not gpu.quarantined:
            previous = gpu.health
            GPU.objects.filter(pk=gpu.pk).update(health=GPU.Health.HEALTHY, health_changed_at=now)
            gpu.health = GPU.Health.HEALTHY
            health_event(
                gpu, previous=previous, fault="", reason=stored("the health probe passes again"), actor=actor, now=now
            )
    else:
        fault = outcome.fault or Fault.PROBE_FAILED
        if gpu.health != GPU.Health.UNHEALTHY or status.fault_since is None:
            status.fault, status.fault_reason, status.fault_since, status.failures = fault, "", now, 0
        if FAULT_SEVERITY.get(fault, 0) >= FAULT_SEVERITY.get(status.fault, 0):
            status.fault = fault
            status.fault_reason = outcome.reason[:300]
        status.failures += 1
        if gpu.health != GPU.Health.UNHEALTHY or not gpu.quarantined:
            previous = gpu.health
            pool.gpu_mark_unhealthy(gpu=gpu, reason=outcome.reason or fault)
            health_event(gpu, previous=previous, fault=fault, reason=outcome.reason, actor=actor, now=now)
            left_service = True
    status.save()
    return left_service


@dataclass
class ProbeReport:
    probed: int = 0
    failed: int = 0
    left_service: list[str] = field(default_factory=list)
    skipped: int = 0


def gpu_probe_all(*, now: datetime | None = None, nvml=None) -> ProbeReport:
    """Probe every card this process can reach; failing cards leave service and their fault rules fire."""
    report = ProbeReport()
    for gpu in GPU.objects.select_related("node").order_by("node__name", "index"):
        outcome = health.probe(gpu, nvml=nvml)
        if outcome is None:
            report.skipped += 1
            continue
        report.probed += 1
        report.failed += not outcome.ok
        moment = at_or_now(now)
        alerting = not outcome.ok or gpu.health != GPU.Health.HEALTHY  # a healthy card that passes opens nothing
        with transaction.atomic(durable=True):
            if alerting:
                alerts_lock()
            if health_apply(gpu_id=gpu.id, outcome=outcome, actor="health-probe", now=moment, probed=True):
                report.left_service.append(gpu.uuid)
            if alerting:
                evaluate(now=moment, gpu_ids=[gpu.id], metrics=[AlertRule.Metric.GPU_FAULT])
    return report


def gpu_probe_one(*, gpu_uuid: str, actor: str, now: datetime | None = None, nvml=None) -> ProbeOutcome | None:
    gpu = GPU.objects.select_related("node").filter(uuid=gpu_uuid).first()
    if gpu is None:
        raise NotFound(f"GPU {gpu_uuid} does not exist", code="unknown_gpu")
    outcome = health.probe(gpu, nvml=nvml)
    if outcome is None:
        return None
    moment = at_or_now(now)
    with transaction.atomic(durable=True):
        alerts_lock()
        health_apply(gpu_id=gpu.id, outcome=outcome, actor=actor, now=moment, probed=True)
        evaluate(now=moment, gpu_ids=[gpu.id], metrics=[AlertRule.Metric.GPU_FAULT])
    return outcome


def gpu_return_to_service(
    *, gpu_uuid: str, actor: str, force: bool = False, now: datetime | None = None, nvml=None
) -> GPU:
    """An admin puts a card back: it must pass a fresh probe (unless forced); its fault alerts resolve."""
    gpu = GPU.objects.select_related("node").filter(uuid=gpu_uuid).first()
    if gpu is None:
        raise NotFound(f"GPU {gpu_uuid} does not exist", code="unknown_gpu")
    if gpu.health == GPU.Health.HEALTHY and not gpu.quarantined:
        return gpu
    if not force:
        outcome = health.probe(gpu, nvml=nvml)
        if outcome is not None and not outcome.ok:
            raise Conflict(
                f"{gpu} still fails its health probe: {outcome.reason}", code="probe_failing", fault=outcome.fault
            )
    moment = at_or_now(now)
    with transaction.atomic(durable=True):
        alerts_lock()
        gpu = GPU.objects.select_for_update().select_related("node").get(pk=gpu.pk)
        previous = gpu.health
        pool.gpu_return_to_service(gpu=gpu)
        GpuStatus.objects.filter(gpu=gpu).update(fault="", fault_reason="", fault_since=None, failures=0)
        health_event(
            gpu,
            previous=previous,
            fault="",
            actor=actor,
            now=moment,
            reason=stored("returned to service without a passing probe (forced)")
            if force
            else stored("returned to service"),
        )
        evaluate(now=moment, gpu_ids=[gpu.id])
        transaction.on_commit(_enqueue_dispatch_all)
    log.info("gpu_returned_to_service", gpu=gpu.uuid, actor=actor, forced=force)
    return gpu


def _enqueue_dispatch_all() -> None:
    from kernel.wake import dispatch_soon

    dispatch_soon()
