"""Telemetry: part of `monitoring.services` (see its package docstring)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction

from cluster.models import GPU, LogicalDevice
from jobs import lifecycle
from jobs.models import Job, JobEvent
from jobs.states import AttemptState
from kernel.sentences import stored
from monitoring import collectors, health
from monitoring.collectors import GpuReading
from monitoring.health import ProbeOutcome
from monitoring.models import (
    AlertRule,
    GpuSample,
    GpuStatus,
    JobGpuSample,
)
from monitoring.services.alerts import evaluate
from monitoring.services.common import alerts_lock, at_or_now, log
from monitoring.services.health import health_apply


@dataclass
class CollectReport:
    source: str
    samples: int = 0
    unknown: int = 0
    error: str = ""
    stopped: list[str] = field(default_factory=list)  # attempts stopped for holding more than their GPU share


def telemetry_collect(*, now: datetime | None = None) -> CollectReport:
    """Read the active telemetry source and record what it says; with no source, record nothing."""
    source = collectors.active_source()
    if source == "none":
        return CollectReport(source="none")
    try:
        if source == "prometheus":
            if not settings.TRAINYARD_PROMETHEUS_URL:
                return CollectReport(source=source, error="TRAINYARD_PROMETHEUS_URL is not set")
            readings = collectors.PrometheusCollector(settings.TRAINYARD_PROMETHEUS_URL).collect()
        else:
            collector = collectors.nvml_collector()
            if collector is None:
                return CollectReport(source=source, error="NVML is not available on this machine")
            readings = collector.collect()
    except collectors.CollectorUnavailable as exc:
        log.warning("telemetry_source_unavailable", source=source, error=str(exc))
        return CollectReport(source=source, error=str(exc))
    return telemetry_record(readings=readings, source="dcgm" if source == "prometheus" else "nvml", now=now)


def _match_gpus(readings: list[GpuReading]) -> dict[int, GPU]:
    """Readings (by position) to cards: by UUID, else by node name + index (dcgm's Hostname/hostname)."""
    by_uuid = {g.uuid: g for g in GPU.objects.select_related("node").filter(uuid__in=[r.uuid for r in readings])}
    matched = {}
    for i, reading in enumerate(readings):
        gpu = by_uuid.get(reading.uuid)
        if gpu is None and reading.hostname and reading.index is not None:
            gpu = GPU.objects.select_related("node").filter(node__name=reading.hostname, index=reading.index).first()
        if gpu is not None and not gpu.node.emulated:
            matched[i] = gpu
    return matched


def telemetry_record(*, readings: list[GpuReading], source: str, now: datetime | None = None) -> CollectReport:
    """Store readings as samples (and per-job process memory); fatal Xids and lost cards leave service."""
    moment = at_or_now(now)
    report = CollectReport(source=source)
    fatal = set(settings.TRAINYARD_FATAL_XIDS)
    with transaction.atomic(durable=True):
        alerts_lock()
        matched = _match_gpus(readings)
        report.unknown = len(readings) - len(matched)
        samples, job_samples, faults = [], [], []
        job_ids = {p.job_id for r in readings for p in r.processes if p.job_id}
        known_jobs = {str(pk) for pk in Job.objects.filter(pk__in=_uuids(job_ids)).values_list("pk", flat=True)}
        statuses = {s.gpu_id: s for s in GpuStatus.objects.filter(gpu__in=list(matched.values()))}
        for i, gpu in matched.items():
            r = readings[i]
            status = statuses.get(gpu.id) or GpuStatus.objects.create(gpu=gpu)
            if r.fault and r.memory_used_mib is None and r.utilization_pct is None:
                faults.append((gpu, ProbeOutcome(False, r.fault, r.fault_reason)))
                continue  # the card answered nothing but its fault: no sample to keep
            samples.append(
                GpuSample(
                    gpu=gpu,
                    at=moment,
                    source=source,
                    utilization_pct=r.utilization_pct,
                    memory_used_mib=r.memory_used_mib,
                    memory_total_mib=r.memory_total_mib,
                    temperature_c=r.temperature_c,
                    power_w=r.power_w,
                    ecc_uncorrected=r.ecc_uncorrected,
                    xid=r.xid,
                )
            )
            per_job: dict[tuple[str, int | None], list[float]] = defaultdict(list)
            for proc in r.processes:
                if proc.job_id in known_jobs:
                    per_job[(proc.job_id, proc.attempt_number)].append(proc.memory_used_mib)
            for (job_id, attempt_number), used in per_job.items():
                job_samples.append(
                    JobGpuSample(
                        job_id=job_id,
                        attempt_number=attempt_number,
                        gpu=gpu,
                        at=moment,
                        memory_used_mib=sum(used),
                        processes=len(used),
                    )
                )
            news = r.xid is not None and r.xid != 0 and (r.xid_is_event or r.xid != status.last_xid)
            updates: dict[str, Any] = {"last_sample_at": moment}
            if r.xid is not None:
                updates["last_xid"] = r.xid
            GpuStatus.objects.filter(pk=status.pk).update(**updates)
            if r.fault:
                faults.append((gpu, ProbeOutcome(False, r.fault, r.fault_reason)))
            elif news and r.xid in fatal:
                faults.append(
                    (gpu, ProbeOutcome(False, health.xid_fault(r.xid), f"Xid {r.xid} reported by {source}", r.xid))
                )
        GpuSample.objects.bulk_create(samples)
        JobGpuSample.objects.bulk_create(job_samples)
        report.stopped = _enforce_memory_shares(job_samples)
        for gpu, outcome in faults:
            health_apply(gpu_id=gpu.id, outcome=outcome, actor=f"telemetry:{source}", now=moment, probed=False)
        if faults:
            evaluate(now=moment, gpu_ids=[g.id for g, _ in faults], metrics=[AlertRule.Metric.GPU_FAULT])
    report.samples = len(samples)
    return report


def _enforce_memory_shares(job_samples: list[JobGpuSample]) -> list[str]:
    """Stop each running attempt whose processes hold more memory on a shared card than its slice's share
    (plus `TRAINYARD_SHARE_MEMORY_TOLERANCE_MIB`): its neighbours on that card were promised the rest. The backend
    stops it with the reason `GpuShareExceeded`, which the classifier fails as the user's, without a retry, and
    with a suggestion. Whole (exclusive) cards are never policed: the job owns all of their memory."""
    if not settings.TRAINYARD_SHARE_MEMORY_ENFORCE:
        return []
    tolerance = settings.TRAINYARD_SHARE_MEMORY_TOLERANCE_MIB
    # The live shared slices of the sampled jobs, and the attempts already being stopped: one query each.
    slices_by_key: dict[tuple, list[LogicalDevice]] = defaultdict(list)
    for device in LogicalDevice.objects.filter(
        gpu_id__in={s.gpu_id for s in job_samples},
        attempt__job_id__in={s.job_id for s in job_samples},
        released_at__isnull=True,
        exclusive=False,
    ).select_related("attempt", "gpu"):
        slices_by_key[(device.gpu_id, str(device.attempt.job_id))].append(device)
    flagged = set(
        JobEvent.objects.filter(
            kind="gpu_share_exceeded", attempt__in=[d.attempt_id for ds in slices_by_key.values() for d in ds]
        ).values_list("attempt_id", flat=True)
    )
    stopped = []
    for sample in job_samples:
        slices = [
            d
            for d in slices_by_key.get((sample.gpu_id, str(sample.job_id)), [])
            if sample.attempt_number is None or d.attempt.number == sample.attempt_number
        ]
        share = sum(d.memory_mib for d in slices)
        if not slices or sample.memory_used_mib <= share + tolerance:
            continue
        attempt, gpu = slices[0].attempt, slices[0].gpu
        if attempt.state not in {AttemptState.STARTING, AttemptState.RUNNING} or not attempt.backend_ref:
            continue
        if attempt.pk in flagged:
            continue  # already being stopped
        used = round(sample.memory_used_mib)
        JobEvent.objects.create(
            job_id=attempt.job_id,
            attempt=attempt,
            kind="gpu_share_exceeded",
            level="error",
            actor="monitoring",
            message=stored(
                "attempt %(n)s held %(used)s MiB of GPU memory on %(gpu)s, over its share of %(share)s MiB; "
                "stopping it",
                n=attempt.number,
                used=used,
                gpu=gpu,
                share=share,
            ),
            data={"gpu": gpu.uuid, "used_mib": used, "share_mib": share, "tolerance_mib": tolerance},
        )
        lifecycle.attempt_stop_on_commit(attempt, reason="GpuShareExceeded", robust=True)
        stopped.append(f"{attempt.job_id}#{attempt.number}")
        log.warning(
            "gpu_share_exceeded",
            job_id=str(attempt.job_id),
            attempt=attempt.number,
            used_mib=used,
            share_mib=share,
            gpu=gpu.uuid,
        )
    return stopped


def _uuids(values) -> list[str]:
    import uuid

    out = []
    for value in values:
        try:
            out.append(str(uuid.UUID(str(value))))
        except ValueError:
            continue
    return out
