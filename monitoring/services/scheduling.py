"""Scheduling layer: part of `monitoring.services` (see its package docstring)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, OuterRef, Subquery

from jobs.models import JobEvent
from jobs.states import ACTIVE, JobState
from monitoring import selectors
from monitoring.models import (
    BusinessMetric,
    GpuSample,
    JobGpuSample,
    MonitorCursor,
    QueueWaitStats,
    SchedulingSample,
)
from monitoring.services.common import WAIT_BUCKETS, at_or_now
from quotas.models import Queue


def _wait_bucket_counts(waits: list[float], previous: dict[str, int]) -> dict[str, int]:
    buckets = dict(previous)
    for bound in WAIT_BUCKETS:
        key = str(bound)
        buckets[key] = buckets.get(key, 0) + sum(1 for w in waits if w <= bound)
    return buckets


def scheduling_sample(*, now: datetime | None = None) -> int:
    """Record queue depth, running jobs, admissions and their waits per queue, and the pool's allocation and
    fragmentation; fold new admission waits into the cumulative histogram /metrics exports."""
    moment = at_or_now(now)
    settle = moment - timedelta(seconds=5)  # let transactions that took an earlier event id commit first
    with transaction.atomic(durable=True):
        cursor, _ = MonitorCursor.objects.select_for_update().get_or_create(name="admission-events")
        queued_at = (
            JobEvent.objects.filter(job_id=OuterRef("job_id"), to_state=JobState.PENDING, id__lt=OuterRef("id"))
            .order_by("-id")
            .values("at")[:1]
        )
        events = list(
            JobEvent.objects.filter(id__gt=cursor.position, to_state=JobState.ADMITTED, at__lte=settle)
            .annotate(queued_at=Subquery(queued_at), queue_id=F("job__queue_id"))
            .order_by("id")
            .values("id", "at", "queued_at", "queue_id")[:10000]
        )
        waits: dict[int, list[float]] = defaultdict(list)
        for event in events:
            if event["queued_at"] is not None:
                waits[event["queue_id"]].append(max(0.0, (event["at"] - event["queued_at"]).total_seconds()))
        if events:
            cursor.position = events[-1]["id"]
            cursor.save(update_fields=["position"])
        for queue_id, queue_waits in waits.items():
            stats, _ = QueueWaitStats.objects.select_for_update().get_or_create(queue_id=queue_id)
            stats.buckets = _wait_bucket_counts(queue_waits, stats.buckets)
            stats.count += len(queue_waits)
            stats.sum_s += sum(queue_waits)
            stats.save()
        last = SchedulingSample.objects.filter(queue__isnull=True).order_by("-at").values_list("at", flat=True).first()
        interval = (moment - last).total_seconds() if last else 0.0
        depth = selectors.jobs_by_queue_and_state()
        rows = []
        for queue in Queue.objects.all():
            states = depth.get(queue.name, {})
            queue_waits = waits.get(queue.id, [])
            rows.append(
                SchedulingSample(
                    at=moment,
                    queue=queue,
                    pending=states.get(JobState.PENDING, 0),
                    running=sum(states.get(s, 0) for s in ACTIVE),
                    admissions=len(queue_waits),
                    interval_s=interval,
                    wait_avg_s=sum(queue_waits) / len(queue_waits) if queue_waits else None,
                )
            )
        allocation = selectors.pool_allocation()
        rows.append(
            SchedulingSample(
                at=moment,
                queue=None,
                pending=sum(r.pending for r in rows),
                running=sum(r.running for r in rows),
                admissions=sum(r.admissions for r in rows),
                interval_s=interval,
                wait_avg_s=_mean([w for ws in waits.values() for w in ws]),
                allocation_ratio=allocation.allocation_ratio,
                memory_allocation_ratio=allocation.memory_allocation_ratio,
                fragmentation=allocation.fragmentation,
            )
        )
        SchedulingSample.objects.bulk_create(rows)
    return len(rows)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def monitoring_prune(*, now: datetime | None = None) -> dict[str, int]:
    """Drop samples, and business metrics of jobs finished before the retention window; alerts are kept."""
    cutoff = at_or_now(now) - timedelta(days=settings.TRAINYARD_METRICS_RETENTION_DAYS)
    with transaction.atomic(durable=True):
        counts = {
            "gpu_samples": GpuSample.objects.filter(at__lt=cutoff).delete()[0],
            "job_gpu_samples": JobGpuSample.objects.filter(at__lt=cutoff).delete()[0],
            "scheduling_samples": SchedulingSample.objects.filter(at__lt=cutoff).delete()[0],
            "business_metrics": BusinessMetric.objects.filter(at__lt=cutoff, job__finished_at__lt=cutoff).delete()[0],
        }
    return counts
