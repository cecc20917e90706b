"""Usage profiles, idle gpus, leaks: part of `monitoring.services` (see its package docstring)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from jobs import lifecycle
from jobs.models import Attempt, Job, JobEvent
from jobs.states import ATTEMPT_FINISHED, AttemptState, JobState
from monitoring import rightsizing
from monitoring.models import (
    Alert,
    AlertRule,
    GpuSample,
    JobGpuSample,
    UsageProfile,
)
from monitoring.services.alerts import alert_close, notification_send
from monitoring.services.common import alerts_lock, at_or_now, log


@dataclass
class UsageReport:
    attempts: int = 0
    samples: int = 0
    idle_flagged: list[str] = field(default_factory=list)
    idle_stopped: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    host_metrics_error: str = ""  # why no Kubernetes pod had CPU or memory numbers this pass


def _at(t: float) -> datetime:
    return datetime.fromtimestamp(float(t), tz=UTC)


def usage_collect(*, now: datetime | None = None) -> UsageReport:
    """Fold what was sampled since the last pass into each started attempt's usage profile: the local
    supervisor's samples (CPU, host memory, and GPU statements on emulated cards), on Kubernetes the pods' CPU and
    memory from the resource metrics API (read once per namespace for all running attempts), and, for attempts on
    real cards, the telemetry loop's GPU samples (NVML per process, else per card). Then judge idleness and leaks
    on the running ones. Level-triggered: a profile remembers how far it read, so a lost pass costs one period; an
    ended attempt's profile is made final once its last sample is in."""
    from jobs.backends import get_backend

    moment = at_or_now(now)
    report = UsageReport()
    attempts = list(
        Attempt.objects.filter(started_at__isnull=False)
        .exclude(backend_ref="")
        .filter(Q(usage__isnull=True) | Q(usage__final=False))
        .values_list("pk", "backend", "backend_ref", "state")
    )
    live: dict[str, list[str]] = defaultdict(list)
    for _, backend_name, ref, state in attempts:
        if state not in ATTEMPT_FINISHED:
            live[backend_name].append(ref)
    sampled = _usage_sample(live, report=report)
    for attempt_id, backend_name, ref, _ in attempts:
        try:
            backend = get_backend(backend_name)
            with transaction.atomic(durable=True):
                _usage_update(
                    attempt_id=attempt_id,
                    ref=ref,
                    backend=backend,
                    now=moment,
                    report=report,
                    measured=sampled.get((backend_name, ref)),
                )
        except Exception:  # noqa: BLE001 - one attempt's unreadable samples never stop the others'
            log.exception("usage_update_failed", attempt=attempt_id)
        report.attempts += 1
    return report


def _usage_sample(live: dict[str, list[str]], *, report: UsageReport) -> dict[tuple[str, str], dict]:
    """One sample now per running attempt of each backend that measures its attempts from outside (Kubernetes:
    the resource metrics API), keyed by (backend, reference). A backend whose source cannot be read yields
    nothing, and one log line per pass says why."""
    from jobs.backends import get_backend

    sampled: dict[tuple[str, str], dict] = {}
    for backend_name, refs in sorted(live.items()):
        try:
            backend = get_backend(backend_name)
            if not hasattr(backend, "usage_sample"):
                continue
            reading = backend.usage_sample(refs)
        except Exception:  # noqa: BLE001 - no CPU or memory numbers this pass; never a failed telemetry task
            log.exception("usage_sample_failed", backend=backend_name, attempts=len(refs))
            report.host_metrics_error = f"reading {backend_name} usage failed"
            continue
        if reading.unavailable:
            log.warning("pod_metrics_unavailable", backend=backend_name, attempts=len(refs), reason=reading.unavailable)
            report.host_metrics_error = reading.unavailable
        if reading.skipped_pods:
            log.warning("pod_metrics_unreadable", backend=backend_name, pods=reading.skipped_pods[:20])
        sampled.update({(backend_name, ref): sample for ref, sample in reading.samples.items()})
    return sampled


def _telemetry_points(attempt: Attempt, *, since: datetime | None, until: datetime) -> tuple[list[list], str]:
    """GPU points [t, memory per card, utilization, None, None] for an attempt on real cards, from the telemetry
    loop's samples after `since`: memory from NVML's per-process accounting (the busiest card), else the card's
    own memory when the job holds it whole; utilization is always the card's (the busiest of its cards)."""
    uuids = [
        d.get("gpu_uuid", "")
        for d in (attempt.placement or {}).get("devices", [])
        if d.get("gpu_uuid") and not str(d.get("gpu_uuid")).startswith("EMU-")
    ]
    if not uuids:
        return [], ""
    window = Q(at__lte=until) & (Q(at__gt=since) if since else Q())
    memory: dict[datetime, float] = {}
    for at, used in JobGpuSample.objects.filter(
        window, job_id=attempt.job_id, attempt_number=attempt.number
    ).values_list("at", "memory_used_mib"):
        memory[at] = max(memory.get(at, 0.0), used)
    per_process = bool(memory)
    util: dict[datetime, float] = {}
    card_memory: dict[datetime, float] = {}
    source = ""
    for at, pct, used, src in GpuSample.objects.filter(window, gpu__uuid__in=uuids).values_list(
        "at", "utilization_pct", "memory_used_mib", "source"
    ):
        source = source or src
        if pct is not None:
            util[at] = max(util.get(at, 0.0), pct)
        if used is not None:
            card_memory[at] = max(card_memory.get(at, 0.0), used)
    if not per_process and attempt.job.exclusive:
        memory = card_memory
    points = [[at.timestamp(), memory.get(at), util.get(at), None, None] for at in sorted(set(memory) | set(util))]
    return points, source


def _usage_update(
    *, attempt_id: int, ref: str, backend, now: datetime, report: UsageReport, measured: dict | None = None
) -> None:
    attempt = Attempt.objects.select_related("job__queue", "job__owner").get(pk=attempt_id)
    profile = UsageProfile.objects.select_for_update().filter(attempt=attempt).first()
    if profile is None:
        profile = UsageProfile.objects.create(attempt=attempt, job=attempt.job)
        profile = UsageProfile.objects.select_for_update().get(pk=profile.pk)
    if hasattr(backend, "read_usage"):
        samples, offset, ended = backend.read_usage(ref, profile.cursor)
    else:  # no supervisor samples on this backend: the attempt's own state says when it is over
        samples, offset, ended = [], profile.cursor, attempt.is_finished
    points = [
        [s["t"], s.get("gpu_memory_mib"), s.get("gpu_util_pct"), s.get("cpu_milli"), s.get("rss_mib")] for s in samples
    ]
    emulated = any(p[1] is not None or p[2] is not None for p in points)
    if any(p[3] is not None or p[4] is not None for p in points):
        profile.host_source = "proc"  # the local supervisor's /proc readings
    if measured is not None and not ended:
        measured_at = _at(measured["t"])
        # metrics-server refreshes every scrape interval: a pass that sees the same measurement adds nothing
        if profile.metrics_at is None or measured_at > profile.metrics_at:
            points.append([measured["t"], None, None, measured.get("cpu_milli"), measured.get("rss_mib")])
            profile.metrics_at = measured_at
            profile.host_source = "metrics"
            report.samples += 1
    telemetry, source = _telemetry_points(attempt, since=profile.telemetry_at, until=now)
    if telemetry:
        points.extend(telemetry)
        profile.telemetry_at = _at(telemetry[-1][0])
        profile.gpu_source = source
    elif emulated:
        profile.gpu_source = "emulated"  # the emulated inventory's only GPU numbers (jobs/backends/usage_sampler.py)
    points.sort(key=lambda p: p[0])
    queue = attempt.job.queue
    threshold = queue.idle_threshold_pct
    series = list(profile.series)
    peaks = rightsizing.Stats(
        gpu_memory_peak_mib=profile.gpu_memory_peak_mib,
        cpu_peak_milli=profile.cpu_peak_milli,
        host_memory_peak_mib=profile.host_memory_peak_mib,
    )
    for point in points:
        t, mem, util, cpu, rss = point
        series.append(point)
        profile.samples += 1
        at = _at(t)
        profile.first_at = min(profile.first_at, at) if profile.first_at else at
        profile.last_at = max(profile.last_at, at) if profile.last_at else at
        peaks.gpu_memory_peak_mib = rightsizing._max(peaks.gpu_memory_peak_mib, mem)
        peaks.cpu_peak_milli = rightsizing._max(peaks.cpu_peak_milli, cpu)
        peaks.host_memory_peak_mib = rightsizing._max(peaks.host_memory_peak_mib, rss)
        if util is not None:
            profile.gpu_samples += 1
            profile.gpu_util_sum += util
            if threshold > 0 and util < threshold:
                profile.idle_since = profile.idle_since or at
            else:
                profile.idle_since = None
    series.sort(key=lambda p: p[0])
    profile.series = rightsizing.thin(series)
    stats = rightsizing.stats_of(
        profile.series, peaks=peaks, gpu_util_sum=profile.gpu_util_sum, gpu_samples=profile.gpu_samples
    )
    for name, value in stats.__dict__.items():
        setattr(profile, name, value)
    profile.cursor = offset
    profile.final = ended
    report.samples += len(samples)
    live = attempt.state == AttemptState.RUNNING and attempt.job.state == JobState.RUNNING and not ended
    if live:
        _idle_judge(profile, attempt=attempt, now=now, report=report)
        _leak_judge(profile, attempt=attempt, now=now, report=report)
    elif profile.idle_flagged_at is not None and ended:
        _idle_alert_resolve(attempt.job_id, note="the job ended", now=now)
    profile.save()


def job_alert(
    *, job: Job, name: str, summary: str, value: float | None, now: datetime, level: str = AlertRule.Level.WARNING
) -> Alert:
    """Open (once) an alert about one job, tell its owner and the admins, and note it on the job."""
    alerts_lock()
    fingerprint = f"{name}:{job.id}"[:200]
    alert = Alert.objects.filter(fingerprint=fingerprint).exclude(state=Alert.State.RESOLVED).first()
    if alert is not None:
        Alert.objects.filter(pk=alert.pk).update(last_seen_at=now, **({} if value is None else {"value": value}))
        return alert
    alert = Alert.objects.create(
        rule_name=name,
        level=level,
        fingerprint=fingerprint,
        subject=f"job {job.name} ({job.id})",
        queue_id=job.queue_id,
        job_ids=[str(job.id)],
        summary=summary[:500],
        value=value,
        started_at=now,
        last_seen_at=now,
    )
    actions = [notification_send(alert, owners=[job.owner_id])]
    Alert.objects.filter(pk=alert.pk).update(actions_taken=actions)
    log.warning("job_alert_opened", alert=alert.id, rule=name, job_id=str(job.id), team=job.team_id)
    return alert


def _idle_alert_resolve(job_id, *, note: str, now: datetime) -> None:
    alerts_lock()
    for alert in Alert.objects.filter(fingerprint=f"job-gpu-idle:{job_id}").exclude(state=Alert.State.RESOLVED):
        alert_close(alert, by="auto", note=note, now=now)


def _idle_judge(profile: UsageProfile, *, attempt: Attempt, now: datetime, report: UsageReport) -> None:
    job, queue = attempt.job, attempt.job.queue
    if profile.idle_since is None:
        if profile.idle_flagged_at is not None:
            profile.idle_flagged_at = None
            JobEvent.objects.create(
                job=job,
                attempt=attempt,
                kind="gpu_idle_ended",
                actor="monitoring",
                message="its GPUs are busy again; no longer idle",
            )
            _idle_alert_resolve(job.id, note="busy again", now=now)
        return
    idle_s = (now - profile.idle_since).total_seconds()
    if profile.idle_flagged_at is None and idle_s >= queue.idle_after_s:
        profile.idle_flagged_at = now
        threshold = f"{queue.idle_threshold_pct:g}%"
        summary = f"GPU utilization below {threshold} for {round(idle_s / 60, 1):g} min"
        if queue.idle_action == queue.IdleAction.STOP:
            stop_at = now + timedelta(seconds=queue.idle_stop_after_s)
            summary += f"; queue {queue.name} stops it at {stop_at:%Y-%m-%d %H:%M:%S} UTC unless its GPUs get busy"
        JobEvent.objects.create(
            job=job,
            attempt=attempt,
            kind="gpu_idle",
            level="warning",
            actor="monitoring",
            message=summary,
            data={
                "idle_since": profile.idle_since.isoformat(),
                "threshold_pct": queue.idle_threshold_pct,
                "action": queue.idle_action,
                "stop_after_s": queue.idle_stop_after_s if queue.idle_action == queue.IdleAction.STOP else None,
            },
        )
        job_alert(job=job, name="job-gpu-idle", summary=summary, value=profile.gpu_util_mean_pct, now=now)
        report.idle_flagged.append(f"{job.id}#{attempt.number}")
        return
    if (
        profile.idle_flagged_at is not None
        and queue.idle_action == queue.IdleAction.STOP
        and (now - profile.idle_flagged_at).total_seconds() >= queue.idle_stop_after_s
    ):
        message = (
            f"stopped by queue {queue.name}: GPUs idle since {profile.idle_since:%H:%M:%S} UTC, "
            f"notice given at {profile.idle_flagged_at:%H:%M:%S} UTC"
        )
        lifecycle.job_cancel(job_id=job.id, actor="monitoring", reason="idle_gpu", message=message)
        report.idle_stopped.append(f"{job.id}#{attempt.number}")


def _leak_judge(profile: UsageProfile, *, attempt: Attempt, now: datetime, report: UsageReport) -> None:
    if profile.leak_flagged_at is not None:
        return
    found = []
    for index, what in ((1, "GPU memory"), (4, "host memory")):
        values = [p[index] for p in profile.series if p[index] is not None]
        if rightsizing.leak_suspected(
            values, min_samples=settings.TRAINYARD_LEAK_MIN_SAMPLES, min_growth=settings.TRAINYARD_LEAK_MIN_GROWTH
        ):
            found.append(f"{what} grew from {values[0]:.0f} to {values[-1]:.0f} MiB without levelling off")
    if not found:
        return
    profile.leak_flagged_at = now
    job = attempt.job
    summary = f"possible memory leak in attempt {attempt.number}: " + "; ".join(found)
    JobEvent.objects.create(
        job=job, attempt=attempt, kind="memory_leak", level="warning", actor="monitoring", message=summary
    )
    job_alert(job=job, name="job-memory-leak", summary=summary, value=profile.gpu_memory_peak_mib, now=now)
    report.leaks.append(f"{job.id}#{attempt.number}")
