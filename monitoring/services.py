"""Every write of the monitoring app: GPU health (probe, fault, quarantine, return to service), telemetry
records, alert evaluation and its actions, acknowledgement and resolution, webhook delivery, business
metrics, scheduling samples and pruning.

Any transaction that may open an alert takes the alerts advisory lock first, before any row lock, so health
reports, telemetry and the periodic evaluation serialise without deadlocking and never open two alerts for
one incident.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import F, OuterRef, Q, Subquery
from django.utils import timezone

from cluster import services as pool
from cluster.models import GPU, LogicalDevice
from jobs import logstore
from jobs import services as jobs_services
from jobs.models import Attempt, Job, JobEvent
from jobs.states import ACTIVE, ATTEMPT_FINISHED, TERMINAL, AttemptState, JobState
from monitoring import business, collectors, health, rightsizing, rules, selectors
from monitoring.collectors import GpuReading
from monitoring.health import ProbeOutcome
from monitoring.models import (
    Alert,
    AlertRule,
    BusinessMetric,
    Fault,
    GpuHealthEvent,
    GpuSample,
    GpuStatus,
    JobGpuSample,
    LogScanCursor,
    MonitorCursor,
    Notification,
    QueueWaitStats,
    SchedulingSample,
    UsageProfile,
    WebhookDelivery,
)
from quotas.models import Queue
from trainyard.errors import Conflict, Forbidden, NotFound, ValidationFailed
from trainyard.sentences import stored

log = structlog.get_logger(__name__)
ALERTS_LOCK_KEY = 0x6D6F_6E69  # advisory lock id for "opening and resolving alerts"
FAULT_SEVERITY = {Fault.GPU_LOST: 4, Fault.DRIVER_RESET: 3, Fault.XID: 2, Fault.PROBE_FAILED: 1, Fault.UNHEALTHY: 0}
WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)


def _alerts_lock() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ALERTS_LOCK_KEY])


def _now(now: datetime | None) -> datetime:
    return now or timezone.now()


# ------------------------------------------------------------------------------------------------ health


def _health_event(gpu: GPU, *, previous: str, fault: str, reason: str, actor: str, now: datetime) -> None:
    GpuHealthEvent.objects.create(
        gpu=gpu,
        at=now,
        from_health=previous,
        to_health=gpu.health,
        quarantined=gpu.quarantined,
        fault=fault,
        reason=reason[:300],
        actor=actor[:150],
    )


def _health_apply(*, gpu_id: int, outcome: ProbeOutcome, actor: str, now: datetime, probed: bool) -> bool:
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
            _health_event(
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
            _health_event(gpu, previous=previous, fault=fault, reason=outcome.reason, actor=actor, now=now)
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
        moment = _now(now)
        alerting = not outcome.ok or gpu.health != GPU.Health.HEALTHY  # a healthy card that passes opens nothing
        with transaction.atomic(durable=True):
            if alerting:
                _alerts_lock()
            if _health_apply(gpu_id=gpu.id, outcome=outcome, actor="health-probe", now=moment, probed=True):
                report.left_service.append(gpu.uuid)
            if alerting:
                _evaluate(now=moment, gpu_ids=[gpu.id], metrics=[AlertRule.Metric.GPU_FAULT])
    return report


def gpu_probe_one(*, gpu_uuid: str, actor: str, now: datetime | None = None, nvml=None) -> ProbeOutcome | None:
    gpu = GPU.objects.select_related("node").filter(uuid=gpu_uuid).first()
    if gpu is None:
        raise NotFound(f"GPU {gpu_uuid} does not exist", code="unknown_gpu")
    outcome = health.probe(gpu, nvml=nvml)
    if outcome is None:
        return None
    moment = _now(now)
    with transaction.atomic(durable=True):
        _alerts_lock()
        _health_apply(gpu_id=gpu.id, outcome=outcome, actor=actor, now=moment, probed=True)
        _evaluate(now=moment, gpu_ids=[gpu.id], metrics=[AlertRule.Metric.GPU_FAULT])
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
    moment = _now(now)
    with transaction.atomic(durable=True):
        _alerts_lock()
        gpu = GPU.objects.select_for_update().select_related("node").get(pk=gpu.pk)
        previous = gpu.health
        pool.gpu_return_to_service(gpu=gpu)
        GpuStatus.objects.filter(gpu=gpu).update(fault="", fault_reason="", fault_since=None, failures=0)
        _health_event(
            gpu,
            previous=previous,
            fault="",
            actor=actor,
            now=moment,
            reason=stored("returned to service without a passing probe (forced)")
            if force
            else stored("returned to service"),
        )
        _evaluate(now=moment, gpu_ids=[gpu.id])
        transaction.on_commit(_enqueue_dispatch_all)
    log.info("gpu_returned_to_service", gpu=gpu.uuid, actor=actor, forced=force)
    return gpu


def _enqueue_dispatch_all() -> None:
    from trainyard.wake import dispatch_soon

    dispatch_soon()


# --------------------------------------------------------------------------------------------- telemetry


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
    moment = _now(now)
    report = CollectReport(source=source)
    fatal = set(settings.TRAINYARD_FATAL_XIDS)
    with transaction.atomic(durable=True):
        _alerts_lock()
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
            _health_apply(gpu_id=gpu.id, outcome=outcome, actor=f"telemetry:{source}", now=moment, probed=False)
        if faults:
            _evaluate(now=moment, gpu_ids=[g.id for g, _ in faults], metrics=[AlertRule.Metric.GPU_FAULT])
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
        jobs_services.attempt_stop_on_commit(attempt, reason="GpuShareExceeded", robust=True)
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


# ------------------------------------------------------------------------------------------------ alerts


@dataclass
class EvaluateReport:
    opened: list[int] = field(default_factory=list)
    resolved: list[int] = field(default_factory=list)
    updated: int = 0


def alerts_evaluate(*, now: datetime | None = None) -> EvaluateReport:
    """Evaluate every rule: open an alert per new incident (and act), update open ones, resolve cleared ones."""
    with transaction.atomic(durable=True):
        _alerts_lock()
        return _evaluate(now=_now(now))


def _evaluate(*, now: datetime, gpu_ids: list[int] | None = None, metrics: list[str] | None = None) -> EvaluateReport:
    report = EvaluateReport()
    rules_qs = AlertRule.objects.all()
    if metrics:
        rules_qs = rules_qs.filter(metric__in=metrics)
    for rule in rules_qs:
        open_alerts = Alert.objects.select_for_update().filter(rule=rule).exclude(state=Alert.State.RESOLVED)
        if gpu_ids is not None:
            open_alerts = open_alerts.filter(gpu_id__in=gpu_ids)
        if not rule.enabled:
            for alert in open_alerts:
                _resolve(alert, by="auto", note="the rule was disabled", now=now)
                report.resolved.append(alert.id)
            continue
        found = {b.fingerprint: b for b in rules.breaches(rule, now=now, gpu_ids=gpu_ids)}
        for alert in open_alerts:
            breach = found.pop(alert.fingerprint, None)
            if breach is None:
                _resolve(alert, by="auto", note="the condition cleared", now=now)
                report.resolved.append(alert.id)
            else:
                Alert.objects.filter(pk=alert.pk).update(
                    value=breach.value, summary=breach.summary[:500], last_seen_at=now
                )
                report.updated += 1
        for breach in found.values():
            report.opened.append(_open(rule, breach, now=now).id)
    return report


def _live_attempts_on(gpu_id: int) -> list[Attempt]:
    return list(
        Attempt.objects.filter(slices__gpu_id=gpu_id, slices__released_at__isnull=True)
        .exclude(
            state__in=[
                AttemptState.SUCCEEDED,
                AttemptState.FAILED,
                AttemptState.CANCELLED,
                AttemptState.TIMED_OUT,
                AttemptState.LOST,
            ]
        )
        .select_related("job")
        .distinct()
    )


def _open(rule: AlertRule, breach: rules.Breach, *, now: datetime) -> Alert:
    attempts = _live_attempts_on(breach.gpu_id) if breach.gpu_id else []
    job_ids = sorted({str(a.job_id) for a in attempts})
    alert = Alert.objects.create(
        rule=rule,
        rule_name=rule.name,
        level=rule.level,
        fingerprint=breach.fingerprint,
        subject=breach.subject,
        gpu_id=breach.gpu_id,
        queue_id=breach.queue_id,
        job_ids=job_ids,
        summary=breach.summary[:500],
        value=breach.value,
        started_at=now,
        last_seen_at=now,
    )
    actions: list[dict[str, Any]] = []
    if rule.quarantine_gpu and breach.gpu_id:
        actions.append(_quarantine(breach.gpu_id, rule=rule, summary=breach.summary, now=now))
    if rule.restart_job and attempts:
        actions.append(_restart(attempts, rule=rule, summary=breach.summary))
    for job_id in job_ids:
        JobEvent.objects.create(
            job_id=job_id,
            kind="alert",
            level="error" if rule.level == "fatal" else "warning",
            actor="monitoring",
            message=stored(
                "%(level)s alert %(rule)s: %(summary)s",
                level=stored(rule.level),
                rule=rule.name,
                summary=breach.summary,
            )[:2000],
            data={"alert": alert.id, "rule": rule.name, "level": rule.level},
        )
    if rule.notify:
        actions.append(_notify(alert, owners=[a.job.owner_id for a in attempts]))
    url = rule.webhook_url or settings.TRAINYARD_ALERT_WEBHOOK_URL
    if rule.webhook and url:
        actions.append(_queue_webhook(alert, event="firing", url=url))
    Alert.objects.filter(pk=alert.pk).update(actions_taken=actions)
    alert.actions_taken = actions
    log.warning("alert_opened", alert=alert.id, rule=rule.name, alert_level=rule.level, subject=breach.subject)
    return alert


def _quarantine(gpu_id: int, *, rule: AlertRule, summary: str, now: datetime) -> dict[str, Any]:
    gpu = GPU.objects.select_for_update().select_related("node").get(pk=gpu_id)
    if gpu.quarantined:
        return {
            "action": "quarantine_gpu",
            "detail": stored("%(gpu)s was already quarantined", gpu=gpu),
            "at": now.isoformat(),
        }
    reason = stored("alert %(rule)s: %(summary)s", rule=rule.name, summary=summary)[:300]
    GPU.objects.filter(pk=gpu.pk).update(quarantined=True, quarantine_reason=reason, health_changed_at=now)
    gpu.quarantined = True
    _health_event(gpu, previous=gpu.health, fault="", reason=reason, actor=f"alert:{rule.name}", now=now)
    return {
        "action": "quarantine_gpu",
        "detail": stored("%(gpu)s quarantined: no new job is placed on it", gpu=gpu),
        "at": now.isoformat(),
    }


def _restart(attempts: list[Attempt], *, rule: AlertRule, summary: str) -> dict[str, Any]:
    """Stop each live attempt; the lifecycle classifies the failure and retries the job (elsewhere when the card
    is unhealthy). Attempts not handed to the backend yet have nothing to stop."""
    stopped = []
    for attempt in attempts:
        if attempt.state not in {AttemptState.STARTING, AttemptState.RUNNING} or not attempt.backend_ref:
            continue
        JobEvent.objects.create(
            job_id=attempt.job_id,
            attempt=attempt,
            kind="restart_requested",
            level="warning",
            actor=f"alert:{rule.name}",
            message=stored(
                "stopping attempt %(n)s so the job is retried: %(summary)s", n=attempt.number, summary=summary
            )[:2000],
        )
        jobs_services.attempt_stop_on_commit(attempt, robust=True)
        stopped.append(f"{attempt.job_id}#{attempt.number}")
    detail = (
        stored("stopped %(attempts)s for a retry", attempts=", ".join(stopped))
        if stopped
        else stored("no running attempt to stop")
    )
    return {"action": "restart_job", "detail": detail, "attempts": stopped}


def _notify(alert: Alert, *, owners: list[int]) -> dict[str, Any]:
    User = get_user_model()
    recipients = set(
        User.objects.filter(is_active=True).filter(Q(is_staff=True) | Q(pk__in=owners)).values_list("pk", flat=True)
    )
    message = stored(
        "[%(level)s] %(rule)s: %(summary)s", level=alert.level, rule=alert.rule_name, summary=alert.summary
    )[:500]
    Notification.objects.bulk_create(
        [Notification(user_id=pk, alert=alert, message=message) for pk in recipients], ignore_conflicts=True
    )
    return {"action": "notify", "detail": stored("in-app notification to %(n)s user(s)", n=len(recipients))}


def _queue_webhook(alert: Alert, *, event: str, url: str) -> dict[str, Any]:
    delivery = WebhookDelivery.objects.create(alert=alert, event=event, url=url)
    transaction.on_commit(lambda: _enqueue_webhook(delivery.id))
    return {"action": "webhook", "detail": f"POST {event} to {url}", "delivery": delivery.id}


def _enqueue_webhook(delivery_id: int) -> None:
    from monitoring.tasks import deliver_webhook

    deliver_webhook.delay(delivery_id)


def _resolve(alert: Alert, *, by: str, note: str, now: datetime) -> None:
    Alert.objects.filter(pk=alert.pk).update(
        state=Alert.State.RESOLVED, resolved_at=now, resolved_by=by[:150], resolution=note[:300]
    )
    alert.state, alert.resolved_at, alert.resolved_by, alert.resolution = Alert.State.RESOLVED, now, by, note
    rule = alert.rule
    url = (rule.webhook_url if rule else "") or settings.TRAINYARD_ALERT_WEBHOOK_URL
    if rule is not None and rule.webhook and url:
        _queue_webhook(alert, event="resolved", url=url)
    log.info("alert_resolved", alert=alert.id, rule=alert.rule_name, by=by)


def alert_acknowledge(*, alert_id: int, user) -> Alert:
    with transaction.atomic(durable=True):
        alert = _alert_for_update(alert_id, user)
        if alert.state == Alert.State.RESOLVED:
            raise Conflict("the alert is already resolved", code="alert_resolved")
        if alert.state == Alert.State.FIRING:
            alert.state = Alert.State.ACKNOWLEDGED
            alert.acknowledged_at = timezone.now()
            alert.acknowledged_by = user.username
            alert.save(update_fields=["state", "acknowledged_at", "acknowledged_by"])
    return alert


def alert_resolve(*, alert_id: int, user, note: str = "", now: datetime | None = None) -> Alert:
    """Resolve by hand. Refused while the condition still holds: the next evaluation would only reopen it."""
    moment = _now(now)
    with transaction.atomic(durable=True):
        _alerts_lock()
        alert = _alert_for_update(alert_id, user)
        if alert.state == Alert.State.RESOLVED:
            return alert
        rule = alert.rule
        if rule is not None and rule.enabled:
            gpu_ids = [alert.gpu_id] if alert.gpu_id else None
            if any(b.fingerprint == alert.fingerprint for b in rules.breaches(rule, now=moment, gpu_ids=gpu_ids)):
                hint = " (return the GPU to service first)" if rule.metric == AlertRule.Metric.GPU_FAULT else ""
                raise Conflict(f"the condition of {rule.name} still holds{hint}", code="condition_still_holds")
        _resolve(alert, by=user.username, note=note or "resolved by hand", now=moment)
    return alert


def _alert_for_update(alert_id: int, user) -> Alert:
    alert = Alert.objects.select_for_update(of=("self",)).select_related("rule").filter(pk=alert_id).first()
    if alert is None or not selectors.alert_visible(alert, user):
        raise NotFound("alert not found", code="unknown_alert")
    if not selectors.may_handle_alert(alert, user):
        raise Forbidden("only an admin may acknowledge or resolve alerts")
    return alert


def webhook_payload(alert: Alert, event: str) -> dict[str, Any]:
    gpu = alert.gpu
    return {
        "version": 1,
        "event": event,
        "alert": {
            "id": alert.id,
            "rule": alert.rule_name,
            "level": alert.level,
            "state": alert.state,
            "subject": alert.subject,
            "summary": alert.summary,
            "value": alert.value,
            "gpu": gpu.uuid if gpu else None,
            "node": gpu.node.name if gpu else None,
            "job_ids": alert.job_ids,
            "started_at": alert.started_at.isoformat(),
            "resolved_at": alert.resolved_at.isoformat() if alert.resolved_at else None,
            "url": f"/monitoring/alerts/#alert-{alert.id}",
        },
    }


def webhook_deliver(*, delivery_id: int) -> bool:
    """POST one delivery (outside any transaction), then record the outcome; False means: retry later."""
    import httpx

    delivery = WebhookDelivery.objects.select_related("alert__gpu__node").get(pk=delivery_id)
    if delivery.status == WebhookDelivery.Status.DELIVERED:
        return True
    payload = webhook_payload(delivery.alert, delivery.event)
    code, error = None, ""
    try:
        response = httpx.post(
            delivery.url, json=payload, timeout=10.0, headers={"User-Agent": f"trainyard/{settings.PLATFORM_VERSION}"}
        )
        code = response.status_code
        if code >= 300:
            error = f"HTTP {code}"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    with transaction.atomic(durable=True):
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            attempts=F("attempts") + 1,
            response_code=code,
            error=error[:300],
            status=WebhookDelivery.Status.FAILED if error else WebhookDelivery.Status.DELIVERED,
            delivered_at=None if error else timezone.now(),
        )
    if error:
        log.warning("alert_webhook_failed", delivery=delivery.id, url=delivery.url, error=error)
    return not error


def notification_mark_read(*, notification_id: int, user) -> Notification:
    with transaction.atomic(durable=True):
        note = Notification.objects.select_for_update().filter(pk=notification_id, user=user).first()
        if note is None:
            raise NotFound("notification not found", code="unknown_notification")
        if note.read_at is None:
            note.read_at = timezone.now()
            note.save(update_fields=["read_at"])
    return note


def alert_rule_validate(data: dict[str, Any]) -> None:
    """Cross-field checks of a rule an admin writes (field types are the serializer's job)."""
    metric = data.get("metric")
    faults = data.get("faults") or []
    if metric == AlertRule.Metric.GPU_FAULT:
        if not faults:
            raise ValidationFailed(
                "a gpu_fault rule lists the faults it matches", code="faults_required", field="faults"
            )
        unknown = [f for f in faults if f not in Fault.values]
        if unknown:
            raise ValidationFailed(
                f"unknown fault(s) {', '.join(map(str, unknown))}; known: {', '.join(Fault.values)}",
                code="unknown_fault",
                field="faults",
            )
    elif faults:
        raise ValidationFailed("faults apply to gpu_fault rules only", code="faults_not_applicable", field="faults")
    threshold = data.get("threshold")
    if threshold is not None and not math.isfinite(threshold):
        raise ValidationFailed("the threshold must be a finite number", code="invalid_threshold", field="threshold")
    if (
        metric
        in {AlertRule.Metric.GPU_MEMORY_PCT, AlertRule.Metric.GPU_UTILIZATION_PCT, AlertRule.Metric.JOB_FAILURE_RATE}
        and threshold is not None
        and not 0 <= threshold <= 100
    ):
        raise ValidationFailed(
            "a percentage threshold is between 0 and 100", code="invalid_threshold", field="threshold"
        )
    if data.get("webhook_url") and not str(data["webhook_url"]).startswith(("http://", "https://")):
        raise ValidationFailed("the webhook URL must be http(s)", code="invalid_webhook_url", field="webhook_url")
    # A queue-wide failure rate has no card and no attempt of a card: neither action could ever act on it.
    if metric == AlertRule.Metric.JOB_FAILURE_RATE and (data.get("restart_job") or data.get("quarantine_gpu")):
        raise ValidationFailed(
            "a job_failure_rate breach concerns a queue, not a GPU: it cannot restart a job or quarantine a card "
            "(notify, or a webhook, can act on it)",
            code="action_not_applicable",
            field="restart_job" if data.get("restart_job") else "quarantine_gpu",
        )


def alert_rule_save(*, data: dict[str, Any], rule: AlertRule | None = None) -> AlertRule:
    merged = {**({f.name: getattr(rule, f.name) for f in AlertRule._meta.fields} if rule else {}), **data}
    alert_rule_validate(merged)
    with transaction.atomic(durable=True):
        if rule is None:
            if AlertRule.objects.filter(name=data.get("name")).exists():
                raise Conflict(f"a rule named {data.get('name')} exists", code="rule_exists")
            rule = AlertRule.objects.create(**data)
        else:
            for key, value in data.items():
                setattr(rule, key, value)
            rule.save()
    return rule


# ---------------------------------------------------------------------------------------- business layer


def business_metrics_report(*, job: Job, data: Any, now: datetime | None = None) -> list[BusinessMetric]:
    """Reports a job POSTs about itself (one object or a list of up to 1000); 400 with a code when malformed, 409
    `job_not_running` when none of its attempts is live. A report belongs to the attempt that sent it: it is taken
    while the job's latest attempt is starting or running, which includes the last moments of a job being cancelled
    (its process still runs while it stops); a report for a job that is waiting or finished fits no attempt."""
    items = data if isinstance(data, list) else [data]
    if not items or len(items) > 1000:
        raise ValidationFailed("send one report or a list of 1 to 1000", code="invalid_metric_report")
    reports = []
    for item in items:
        try:
            reports.append(business.parse_report(item, strict=True))
        except business.MetricRejected as exc:
            raise ValidationFailed(str(exc), code=exc.code, field=exc.field)
    moment = _now(now)
    with transaction.atomic(durable=True):
        job = Job.objects.get(pk=job.pk)
        latest = job.attempts.order_by("-number").values_list("number", "state").first()
        if job.state in TERMINAL or latest is None or latest[1] not in (AttemptState.STARTING, AttemptState.RUNNING):
            raise Conflict(
                stored(
                    "job %(job)s is %(state)s: metrics are taken only while one of its attempts runs",
                    job=str(job.id)[:8],
                    state=job.state,
                ),
                code="job_not_running",
                state=job.state,
            )
        attempt = latest[0]
        job_id = str(job.id)
        transaction.on_commit(lambda: _metrics_changed(job_id), robust=True)
        return BusinessMetric.objects.bulk_create(
            [
                BusinessMetric(
                    job=job,
                    attempt_number=attempt,
                    at=r.at or moment,
                    step=r.step,
                    values=r.values,
                    source=BusinessMetric.Source.API,
                )
                for r in reports
            ]
        )


@dataclass
class ScanReport:
    attempts: int = 0
    metrics: int = 0
    malformed: int = 0
    watched: int = 0  # log lines holding a text their job watches for


def business_metrics_scan(*, now: datetime | None = None) -> ScanReport:
    """Read what each live (or just finished) attempt logged since the last pass and store its tagged lines."""
    moment = _now(now)
    recent = moment - timedelta(minutes=15)
    attempts = (
        Attempt.objects.filter(Q(state__in=[AttemptState.STARTING, AttemptState.RUNNING]) | Q(ended_at__gte=recent))
        .exclude(metric_cursor__done=True)
        .select_related("job")
        .order_by("id")
    )
    report = ScanReport()
    for attempt in attempts:
        report.attempts += 1
        cursor = LogScanCursor.objects.filter(attempt=attempt).first() or LogScanCursor(attempt=attempt)
        position = business.ReadPosition(cursor.next_line, cursor.byte_offset, cursor.inode)
        folder = logstore.attempt_dir(str(attempt.job_id), attempt.number)
        watch = tuple(w["pattern"] for w in attempt.job.watch or ())
        result = business.read_new_tagged_lines(folder, position, watch)
        if result is None:
            continue
        rows, malformed = [], 0
        for number, text in result.lines:
            try:
                parsed = business.parse_line(text)
            except business.MetricRejected:
                malformed += 1
                continue
            if parsed is not None:
                rows.append(
                    BusinessMetric(
                        job_id=attempt.job_id,
                        attempt_number=attempt.number,
                        at=parsed.at or moment,
                        step=parsed.step,
                        values=parsed.values,
                        source=BusinessMetric.Source.LOG,
                        line=number,
                    )
                )
        finished = attempt.ended_at is not None and (result.closed and result.at_end or attempt.ended_at < recent)
        with transaction.atomic(durable=True):
            saved, _ = LogScanCursor.objects.select_for_update().get_or_create(attempt=attempt)
            if (saved.next_line, saved.byte_offset, saved.inode) != (
                cursor.next_line,
                cursor.byte_offset,
                cursor.inode,
            ):
                continue  # another pass got here first; it stored these lines
            BusinessMetric.objects.bulk_create(rows, ignore_conflicts=True)
            saved.next_line = result.position.next_line
            saved.byte_offset = result.position.byte_offset
            saved.inode = result.position.inode
            saved.malformed += malformed
            saved.done = finished
            saved.save()
        report.metrics += len(rows)
        report.malformed += malformed
        if rows:
            _metrics_changed(str(attempt.job_id))
        if result.watched:
            _log_watch_alerts(attempt, result.watched, now=moment)
            report.watched += len(result.watched)
    return report


def _log_watch_alerts(attempt: Attempt, matches: list[tuple[int, str, int]], *, now: datetime) -> None:
    """A watched text in the job's log: one alert per (job, text) while it lasts, at the level the job asked for,
    with the first line that held it; later lines only count (`value`) and move `last_seen_at`."""
    job = attempt.job
    counts: dict[int, int] = {}
    first: dict[int, tuple[int, str]] = {}
    for number, text, k in matches:
        counts[k] = counts.get(k, 0) + 1
        first.setdefault(k, (number, text))
    for k, count in counts.items():
        watch = job.watch[k]
        number, text = first[k]
        with transaction.atomic():
            alert = _job_alert(
                job=job,
                name=f"log-watch: {watch['pattern']}"[:100],
                summary=stored(
                    "%(job)s logged '%(pattern)s' (attempt %(attempt)s, line %(line)s): %(text)s",
                    job=job.name,
                    pattern=watch["pattern"],
                    attempt=attempt.number,
                    line=number,
                    text=text.strip()[:300],
                ),
                value=None,
                now=now,
                level=watch.get("level", "warning"),
            )
            Alert.objects.filter(pk=alert.pk).update(value=F("value") + count if alert.value is not None else count)


def _metrics_changed(job_id: str) -> None:
    """Tell the job page's open sockets (after commit); a lost notice costs a stale chart until the next one."""
    from jobs.realtime import job_metrics_changed

    try:
        job_metrics_changed(job_id=job_id)
    except Exception:  # noqa: BLE001 - the rows are stored; a channel layer that is down must not fail the pass
        log.warning("metrics_notify_failed", job_id=job_id, exc_info=True)


# -------------------------------------------------------------------------------------- scheduling layer


def _wait_bucket_counts(waits: list[float], previous: dict[str, int]) -> dict[str, int]:
    buckets = dict(previous)
    for bound in WAIT_BUCKETS:
        key = str(bound)
        buckets[key] = buckets.get(key, 0) + sum(1 for w in waits if w <= bound)
    return buckets


def scheduling_sample(*, now: datetime | None = None) -> int:
    """Record queue depth, running jobs, admissions and their waits per queue, and the pool's allocation and
    fragmentation; fold new admission waits into the cumulative histogram /metrics exports."""
    moment = _now(now)
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
    cutoff = _now(now) - timedelta(days=settings.TRAINYARD_METRICS_RETENTION_DAYS)
    with transaction.atomic(durable=True):
        counts = {
            "gpu_samples": GpuSample.objects.filter(at__lt=cutoff).delete()[0],
            "job_gpu_samples": JobGpuSample.objects.filter(at__lt=cutoff).delete()[0],
            "scheduling_samples": SchedulingSample.objects.filter(at__lt=cutoff).delete()[0],
            "business_metrics": BusinessMetric.objects.filter(at__lt=cutoff, job__finished_at__lt=cutoff).delete()[0],
        }
    return counts


# ------------------------------------------------------------------------ usage profiles, idle GPUs, leaks


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

    moment = _now(now)
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


def _job_alert(
    *, job: Job, name: str, summary: str, value: float | None, now: datetime, level: str = AlertRule.Level.WARNING
) -> Alert:
    """Open (once) an alert about one job, tell its owner and the admins, and note it on the job."""
    _alerts_lock()
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
    actions = [_notify(alert, owners=[job.owner_id])]
    Alert.objects.filter(pk=alert.pk).update(actions_taken=actions)
    log.warning("job_alert_opened", alert=alert.id, rule=name, job_id=str(job.id), team=job.team_id)
    return alert


def _idle_alert_resolve(job_id, *, note: str, now: datetime) -> None:
    _alerts_lock()
    for alert in Alert.objects.filter(fingerprint=f"job-gpu-idle:{job_id}").exclude(state=Alert.State.RESOLVED):
        _resolve(alert, by="auto", note=note, now=now)


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
        _job_alert(job=job, name="job-gpu-idle", summary=summary, value=profile.gpu_util_mean_pct, now=now)
        report.idle_flagged.append(f"{job.id}#{attempt.number}")
        return
    if (
        profile.idle_flagged_at is not None
        and queue.idle_action == queue.IdleAction.STOP
        and (now - profile.idle_flagged_at).total_seconds() >= queue.idle_stop_after_s
    ):
        from jobs import lifecycle

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
    _job_alert(job=job, name="job-memory-leak", summary=summary, value=profile.gpu_memory_peak_mib, now=now)
    report.leaks.append(f"{job.id}#{attempt.number}")
