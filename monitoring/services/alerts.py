"""Alerts: part of `monitoring.services` (see its package docstring)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from cluster.models import GPU
from jobs import lifecycle
from jobs.models import Attempt, JobEvent
from jobs.states import AttemptState
from kernel.errors import Conflict, Forbidden, NotFound, ValidationFailed
from kernel.sentences import stored
from monitoring import rules, selectors
from monitoring.models import (
    Alert,
    AlertRule,
    Fault,
    Notification,
    PushSettings,
    WebhookDelivery,
)
from monitoring.services.common import alerts_lock, at_or_now, health_event, log


@dataclass
class EvaluateReport:
    opened: list[int] = field(default_factory=list)
    resolved: list[int] = field(default_factory=list)
    updated: int = 0


def alerts_evaluate(*, now: datetime | None = None) -> EvaluateReport:
    """Evaluate every rule: open an alert per new incident (and act), update open ones, resolve cleared ones."""
    with transaction.atomic(durable=True):
        alerts_lock()
        return evaluate(now=at_or_now(now))


def evaluate(*, now: datetime, gpu_ids: list[int] | None = None, metrics: list[str] | None = None) -> EvaluateReport:
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
                alert_close(alert, by="auto", note="the rule was disabled", now=now)
                report.resolved.append(alert.id)
            continue
        found = {b.fingerprint: b for b in rules.breaches(rule, now=now, gpu_ids=gpu_ids)}
        for alert in open_alerts:
            breach = found.pop(alert.fingerprint, None)
            if breach is None:
                alert_close(alert, by="auto", note="the condition cleared", now=now)
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
        actions.append(notification_send(alert, owners=[a.job.owner_id for a in attempts]))
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
    health_event(gpu, previous=gpu.health, fault="", reason=reason, actor=f"alert:{rule.name}", now=now)
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
        lifecycle.attempt_stop_on_commit(attempt, robust=True)
        stopped.append(f"{attempt.job_id}#{attempt.number}")
    detail = (
        stored("stopped %(attempts)s for a retry", attempts=", ".join(stopped))
        if stopped
        else stored("no running attempt to stop")
    )
    return {"action": "restart_job", "detail": detail, "attempts": stopped}


def notification_send(alert: Alert, *, owners: list[int]) -> dict[str, Any]:
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


def alert_close(alert: Alert, *, by: str, note: str, now: datetime) -> None:
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
    moment = at_or_now(now)
    with transaction.atomic(durable=True):
        alerts_lock()
        alert = _alert_for_update(alert_id, user)
        if alert.state == Alert.State.RESOLVED:
            return alert
        rule = alert.rule
        if rule is not None and rule.enabled:
            gpu_ids = [alert.gpu_id] if alert.gpu_id else None
            if any(b.fingerprint == alert.fingerprint for b in rules.breaches(rule, now=moment, gpu_ids=gpu_ids)):
                hint = " (return the GPU to service first)" if rule.metric == AlertRule.Metric.GPU_FAULT else ""
                raise Conflict(f"the condition of {rule.name} still holds{hint}", code="condition_still_holds")
        alert_close(alert, by=user.username, note=note or "resolved by hand", now=moment)
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
    headers = {"User-Agent": f"trainyard/{settings.PLATFORM_VERSION}", "Content-Type": "application/json"}
    from monitoring.services import push  # the user's own webhooks; imported here: push imports this module's peers

    if delivery.user_id is not None:  # a user's own webhook: a failure notice, signed with their secret
        body = json.dumps(push.failure_payload(delivery.alert)).encode()
        wanted = PushSettings.objects.filter(user_id=delivery.user_id).first()
        headers.update(push.signed_headers(wanted.webhook_secret if wanted else "", body))
    else:
        body = json.dumps(webhook_payload(delivery.alert, delivery.event)).encode()
        if settings.TRAINYARD_ALERT_WEBHOOK_SECRET:  # an alert rule's webhook: signed with the platform's secret
            headers.update(push.signed_headers(settings.TRAINYARD_ALERT_WEBHOOK_SECRET, body))
    code, error = None, ""
    if delivery.user_id is not None and not settings.TRAINYARD_PUSH_WEBHOOK_ALLOW_PRIVATE:
        inside = push.private_address(urlparse(delivery.url).hostname or "")
        if inside:  # looked up again when sending: a name may point inside since it was saved
            WebhookDelivery.objects.filter(pk=delivery.pk).update(
                attempts=F("attempts") + 1, status=WebhookDelivery.Status.FAILED,
                error=f"refused: {inside} is inside the platform's network"[:300],
            )  # fmt: skip
            log.warning("user_webhook_refused", delivery=delivery.id, address=inside)
            return True  # not worth a retry
    try:
        response = httpx.post(delivery.url, content=body, timeout=10.0, headers=headers)
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
