"""Alert rule evaluation, read-only: for one rule at one moment, which subjects breach it. Opening, updating
and resolving alerts from these breaches is `monitoring.services.alerts_evaluate`.

Sample rules behave like Prometheus' `for:`: a card breaches once its latest sample (no older than the
staleness limit) and every sample before it, back to at least `for_seconds` ago, cross the threshold.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count

from cluster.models import GPU
from jobs.models import Job
from jobs.states import JobState
from kernel.sentences import stored
from monitoring.models import AlertRule, Fault, GpuSample, GpuStatus

M = AlertRule.Metric
SAMPLE_METRICS = {M.GPU_MEMORY_PCT, M.GPU_TEMPERATURE_C, M.GPU_POWER_W, M.GPU_UTILIZATION_PCT}
UNITS = {
    M.GPU_MEMORY_PCT: "%",
    M.GPU_TEMPERATURE_C: " °C",
    M.GPU_POWER_W: " W",
    M.GPU_UTILIZATION_PCT: "%",
    M.JOB_FAILURE_RATE: "%",
    M.QUEUE_DEPTH: " jobs",
}
WORDS = {
    M.GPU_MEMORY_PCT: "memory used",
    M.GPU_TEMPERATURE_C: "temperature",
    M.GPU_POWER_W: "power draw",
    M.GPU_UTILIZATION_PCT: "utilization",
}
SYMBOLS = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}
FAULT_WORDS = {
    Fault.XID: "fatal Xid error",
    Fault.GPU_LOST: "GPU lost",
    Fault.DRIVER_RESET: "driver reset required",
    Fault.PROBE_FAILED: "health probe failing",
    Fault.UNHEALTHY: "device unhealthy",
}


@dataclass(frozen=True)
class Breach:
    fingerprint: str
    subject: str
    value: float | None
    summary: str
    gpu_id: int | None = None
    queue_id: int | None = None


def compare(comparator: str, value: float, threshold: float) -> bool:
    return {"gt": value > threshold, "ge": value >= threshold, "lt": value < threshold, "le": value <= threshold}[
        comparator
    ]


def stale_after() -> timedelta:
    """A sample older than this no longer says anything about the card (three missed collections)."""
    return timedelta(seconds=max(60.0, 3 * settings.TRAINYARD_TELEMETRY_INTERVAL_S))


def sample_value(metric: str, sample: GpuSample, card_mib: int) -> float | None:
    if metric == M.GPU_MEMORY_PCT:
        total = sample.memory_total_mib or card_mib
        return None if sample.memory_used_mib is None or not total else 100.0 * sample.memory_used_mib / total
    field = {M.GPU_TEMPERATURE_C: "temperature_c", M.GPU_POWER_W: "power_w", M.GPU_UTILIZATION_PCT: "utilization_pct"}[
        metric
    ]
    return getattr(sample, field)


def _duration(seconds: float) -> str:
    if seconds >= 120:
        return stored("%(n)s min", n=f"{seconds / 60:.0f}")
    return stored("%(n)s s", n=f"{seconds:.0f}")


def _sample_breaches(rule: AlertRule, now: datetime, gpu_ids: Iterable[int] | None) -> list[Breach]:
    stale = stale_after()
    since = now - timedelta(seconds=rule.for_seconds) - stale
    samples = (
        GpuSample.objects.filter(at__gt=since, at__lte=now, gpu__node__emulated=False)
        .select_related("gpu__node")
        .order_by("gpu_id", "at")
    )
    if gpu_ids is not None:
        samples = samples.filter(gpu_id__in=list(gpu_ids))
    series: dict[int, list[GpuSample]] = defaultdict(list)
    for sample in samples:
        series[sample.gpu_id].append(sample)
    found = []
    for points in series.values():
        latest = points[-1]
        gpu = latest.gpu
        if now - latest.at > stale:
            continue
        value = sample_value(rule.metric, latest, gpu.memory_mib)
        if value is None or not compare(rule.comparator, value, rule.threshold):
            continue
        start = latest.at
        for point in reversed(points):
            v = sample_value(rule.metric, point, gpu.memory_mib)
            if v is None or not compare(rule.comparator, v, rule.threshold):
                break
            start = point.at
        held = (latest.at - start).total_seconds()
        if held < rule.for_seconds:
            continue
        unit = UNITS[rule.metric]
        values = dict(
            gpu=gpu,
            model=gpu.model,
            what=stored(WORDS[rule.metric]),
            value=f"{value:.0f}",
            unit=unit,
            op=SYMBOLS[rule.comparator],
            threshold=f"{rule.threshold:g}",
        )
        found.append(
            Breach(
                fingerprint=f"{rule.pk}:gpu:{gpu.uuid}",
                subject=f"gpu:{gpu.uuid}",
                value=round(value, 2),
                gpu_id=gpu.id,
                summary=stored(
                    "%(gpu)s (%(model)s): %(what)s %(value)s%(unit)s for %(held)s (rule: %(op)s %(threshold)s%(unit)s)",
                    held=_duration(held),
                    **values,
                )
                if rule.for_seconds
                else stored(
                    "%(gpu)s (%(model)s): %(what)s %(value)s%(unit)s (rule: %(op)s %(threshold)s%(unit)s)", **values
                ),
            )
        )
    return found


def _failure_rate(rule: AlertRule, now: datetime) -> list[Breach]:
    since = now - timedelta(seconds=rule.window_seconds)
    counted = [JobState.SUCCEEDED, JobState.FAILED, JobState.TIMED_OUT]
    by_state = dict(
        Job.objects.filter(finished_at__gt=since, finished_at__lte=now, state__in=counted)
        .values_list("state")
        .annotate(n=Count("id"))
        .values_list("state", "n")
    )
    total = sum(by_state.values())
    if total == 0 or total < rule.min_samples:
        return []
    failed = by_state.get(JobState.FAILED, 0)
    rate = 100.0 * failed / total
    if not compare(rule.comparator, rate, rule.threshold):
        return []
    return [
        Breach(
            fingerprint=f"{rule.pk}:cluster",
            subject="cluster",
            value=round(rate, 2),
            summary=stored(
                "%(failed)s of %(total)s jobs finished in the last %(window)s failed "
                "(%(rate)s%%; rule: %(op)s %(threshold)s%%)",
                failed=failed,
                total=total,
                window=_duration(rule.window_seconds),
                rate=f"{rate:.1f}",
                op=SYMBOLS[rule.comparator],
                threshold=f"{rule.threshold:g}",
            ),
        )
    ]


def _queue_depth(rule: AlertRule) -> list[Breach]:
    from quotas.models import Queue

    depth = dict(
        Job.objects.filter(state=JobState.PENDING)
        .values_list("queue_id")
        .annotate(n=Count("id"))
        .values_list("queue_id", "n")
    )
    found = []
    for queue in Queue.objects.all():
        n = depth.get(queue.id, 0)
        if compare(rule.comparator, n, rule.threshold):
            found.append(
                Breach(
                    fingerprint=f"{rule.pk}:queue:{queue.name}",
                    subject=f"queue:{queue.name}",
                    value=n,
                    queue_id=queue.id,
                    summary=stored(
                        "queue %(queue)s: %(n)s pending jobs (rule: %(op)s %(threshold)s)",
                        queue=queue.name,
                        n=n,
                        op=SYMBOLS[rule.comparator],
                        threshold=f"{rule.threshold:g}",
                    ),
                )
            )
    return found


def effective_fault(status: GpuStatus | None) -> str:
    return (status.fault if status is not None else "") or Fault.UNHEALTHY


def _gpu_faults(rule: AlertRule, gpu_ids: Iterable[int] | None) -> list[Breach]:
    gpus = GPU.objects.filter(health=GPU.Health.UNHEALTHY).select_related("node")
    if gpu_ids is not None:
        gpus = gpus.filter(pk__in=list(gpu_ids))
    statuses = {s.gpu_id: s for s in GpuStatus.objects.filter(gpu__in=gpus)}
    wanted = set(rule.faults or [])
    found = []
    for gpu in gpus:
        status = statuses.get(gpu.id)
        fault = effective_fault(status)
        if fault not in wanted:
            continue
        reason = (status.fault_reason if status else "") or gpu.quarantine_reason or stored("marked unhealthy")
        failures = status.failures if status else 0
        values = dict(gpu=gpu, model=gpu.model, fault=stored(FAULT_WORDS.get(fault, fault)), reason=reason)
        if status and status.fault_since:
            summary = stored(
                "%(gpu)s (%(model)s): %(fault)s — %(reason)s; %(n)s failed check(s) since %(since)s UTC; quarantined",
                n=failures,
                since=f"{status.fault_since:%Y-%m-%d %H:%M}",
                **values,
            )
        else:
            summary = stored("%(gpu)s (%(model)s): %(fault)s — %(reason)s; quarantined", **values)
        found.append(
            Breach(
                fingerprint=f"{rule.pk}:gpu:{gpu.uuid}",
                subject=f"gpu:{gpu.uuid}",
                value=failures,
                gpu_id=gpu.id,
                summary=summary,
            )
        )
    return found


def breaches(rule: AlertRule, *, now: datetime, gpu_ids: Iterable[int] | None = None) -> list[Breach]:
    """Subjects breaching `rule` at `now`; with `gpu_ids`, only those cards are looked at."""
    if rule.metric in SAMPLE_METRICS:
        return _sample_breaches(rule, now, gpu_ids)
    if rule.metric == M.GPU_FAULT:
        return _gpu_faults(rule, gpu_ids)
    if gpu_ids is not None:
        return []
    if rule.metric == M.JOB_FAILURE_RATE:
        return _failure_rate(rule, now)
    if rule.metric == M.QUEUE_DEPTH:
        return _queue_depth(rule)
    return []
