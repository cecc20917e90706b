"""Pushed failures: an attempt that failed for the user's reason is told to its owner with the last lines of its
stderr — in the portal (a notification), and to the webhook (signed) and email address the owner set.

Level-triggered: each pass looks at the attempts that ended in the last hour, and one that has no `job-failed`
alert yet gets one; a lost message or a restart costs one pass, never a missed push, and never a second one.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import socket
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlparse

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.utils import timezone

from jobs import logstore
from jobs.models import Attempt
from kernel.errors import ValidationFailed
from kernel.sentences import stored
from monitoring.models import Alert, AlertRule, Notification, PushSettings, WebhookDelivery
from monitoring.services.common import alerts_lock, at_or_now, log

LOOK_BACK = timedelta(hours=1)
SIGNATURE_HEADER = "X-Trainyard-Signature"
TIMESTAMP_HEADER = "X-Trainyard-Timestamp"
MIN_SECRET = 16


def failure_fingerprint(job_id, number: int) -> str:
    return f"job-failed:{job_id}:{number}"


def last_stderr(attempt: Attempt, count: int | None = None) -> tuple[str, list[str]]:
    """("stderr", its last lines), or ("log", the merged log's last lines) where stderr was not kept apart."""
    count = count or settings.TRAINYARD_FAILURE_PUSH_LINES
    folder = logstore.attempt_dir(str(attempt.job_id), attempt.number)
    lines = logstore.stderr_lines(folder, tail=count)
    if lines or logstore.LogMeta.read(folder).stderr_lines:
        return "stderr", [x.text for x in lines]
    merged, _ = logstore.tail_lines(folder, count)
    return "log", [x.text for x in merged]


def failures_push(*, now: datetime | None = None) -> int:
    """Push every attempt that ended failed for the user's reason and was not pushed yet; how many were."""
    moment = at_or_now(now)
    attempts = list(
        Attempt.objects.filter(failure_class=Attempt.FailureClass.USER, ended_at__gte=moment - LOOK_BACK)
        .select_related("job__owner")
        .order_by("ended_at", "id")
    )
    if not attempts:
        return 0
    done = set(
        Alert.objects.filter(fingerprint__in=[failure_fingerprint(a.job_id, a.number) for a in attempts]).values_list(
            "fingerprint", flat=True
        )
    )
    pushed = 0
    for attempt in attempts:
        if failure_fingerprint(attempt.job_id, attempt.number) in done:
            continue
        with transaction.atomic(durable=True):
            alerts_lock()
            if Alert.objects.filter(fingerprint=failure_fingerprint(attempt.job_id, attempt.number)).exists():
                continue  # another pass pushed it first
            _push(attempt, now=moment)
            pushed += 1
    return pushed


def _push(attempt: Attempt, *, now: datetime) -> Alert:
    job = attempt.job
    source, lines = last_stderr(attempt)
    exit_text = f"exit {attempt.exit_code}" if attempt.exit_code is not None else f"signal {attempt.signal}"
    head = stored(
        "%(job)s failed (attempt %(attempt)s, %(exit)s): %(reason)s — /jobs/%(id)s/",
        job=job.name,
        attempt=attempt.number,
        exit=exit_text,
        reason=attempt.reason or attempt.failure_class,
        id=job.id,
    )
    tail = "\n".join(lines[-5:])
    summary = f"{head}\n{tail}"[:500] if tail else head[:500]
    alert = Alert.objects.create(
        rule_name="job-failed",
        level=AlertRule.Level.WARNING,
        fingerprint=failure_fingerprint(job.id, attempt.number),
        subject=f"job {job.name} ({job.id})",
        queue_id=job.queue_id,
        job_ids=[str(job.id)],
        summary=summary,
        value=attempt.number,
        started_at=now,
        last_seen_at=now,
        # A notice of something that happened, not a condition that lasts: nothing is left to resolve.
        state=Alert.State.RESOLVED,
        resolved_at=now,
        resolved_by="auto",
        resolution="a notice of a failed attempt",
    )
    Notification.objects.create(user_id=job.owner_id, alert=alert, message=summary)
    actions: list[dict[str, Any]] = [{"action": "notify", "detail": stored("in-app notification to the owner")}]
    wanted = PushSettings.objects.filter(user_id=job.owner_id).first()
    if wanted is not None and wanted.webhook_url:
        delivery = WebhookDelivery.objects.create(
            alert=alert, event="job_failed", url=wanted.webhook_url, user_id=job.owner_id
        )
        transaction.on_commit(lambda: _enqueue_webhook(delivery.id))
        actions.append({"action": "webhook", "detail": f"POST job_failed to {wanted.webhook_url}"})
    if wanted is not None and wanted.email:
        transaction.on_commit(lambda: _enqueue_mail(alert.id))
        actions.append({"action": "email", "detail": f"mail to {wanted.email}"})
    Alert.objects.filter(pk=alert.pk).update(actions_taken=actions)
    log.info("failure_pushed", job_id=str(job.id), attempt=attempt.number, owner=job.owner_id, source=source)
    return alert


def _enqueue_webhook(delivery_id: int) -> None:
    from monitoring.tasks import deliver_webhook

    deliver_webhook.delay(delivery_id)


def _enqueue_mail(alert_id: int) -> None:
    from monitoring.tasks import mail_failure

    mail_failure.delay(alert_id)


def _attempt_of(alert: Alert) -> Attempt | None:
    if not alert.job_ids or alert.value is None:
        return None
    return Attempt.objects.select_related("job").filter(job_id=alert.job_ids[0], number=int(alert.value)).first()


def failure_payload(alert: Alert) -> dict[str, Any]:
    """What a user's webhook receives for one failed attempt."""
    attempt = _attempt_of(alert)
    job = attempt.job if attempt else None
    source, lines = last_stderr(attempt) if attempt else ("stderr", [])
    return {
        "version": 1,
        "event": "job_failed",
        "job": {
            "id": str(job.id) if job else (alert.job_ids or [None])[0],
            "name": job.name if job else "",
            "team": job.team.slug if job else "",
            "attempt": attempt.number if attempt else None,
            "exit_code": attempt.exit_code if attempt else None,
            "signal": attempt.signal if attempt else None,
            "failure_class": attempt.failure_class if attempt else "",
            "reason": attempt.reason if attempt else "",
            "url": f"/jobs/{job.id}/" if job else "",
        },
        "lines_from": source,
        "last_lines": lines,
        "alert": {"id": alert.id, "summary": alert.summary, "at": alert.started_at.isoformat()},
    }


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """HMAC-SHA256 over `<timestamp>.<body>` with the user's secret, hex: what `X-Trainyard-Signature` carries."""
    return hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def signed_headers(secret: str, body: bytes, *, now: datetime | None = None) -> dict[str, str]:
    timestamp = str(int(at_or_now(now).timestamp()))
    return {TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: f"sha256={signature(secret, timestamp, body)}"}


def private_address(host: str) -> str:
    """The loopback, private or link-local address `host` is or resolves to ("" when it is public or unknown).
    A user's webhook is posted from inside the platform: it must not reach the platform's own services."""
    try:
        candidates = [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        if host.lower() == "localhost" or host.lower().endswith(".localhost"):
            return host
        try:
            candidates = [ipaddress.ip_address(info[4][0]) for info in socket.getaddrinfo(host, None)]
        except (OSError, ValueError):
            return ""
    for address in candidates:
        if address.is_loopback or address.is_private or address.is_link_local or address.is_unspecified:
            return str(address)
    return ""


def failure_mail(*, alert_id: int) -> bool:
    """Mail one failure notice to the address its owner set (Django's mail framework); False: nothing to send."""
    from django.core.mail import send_mail

    alert = Alert.objects.filter(pk=alert_id).first()
    attempt = _attempt_of(alert) if alert else None
    if attempt is None:
        return False
    wanted = PushSettings.objects.filter(user_id=attempt.job.owner_id).first()
    if wanted is None or not wanted.email:
        return False
    source, lines = last_stderr(attempt)
    head = alert.summary.split("\n", 1)[0]
    body = "\n".join([head, "", f"Last {len(lines)} line(s) of its {source}:", "", *lines, ""])
    send_mail(
        subject=f"[trainyard] {attempt.job.name} failed (attempt {attempt.number})"[:200],
        message=body,
        from_email=settings.DEFAULT_FROM_EMAIL,
        recipient_list=[wanted.email],
    )
    log.info("failure_mailed", alert=alert.id, job_id=str(attempt.job_id))
    return True


# ------------------------------------------------------------------------------------- the user's settings


def push_settings_save(*, user, data: dict[str, Any]) -> PushSettings:
    """Set (a partial update) the user's webhook URL, its secret, and email; 400 with a code for each bad one."""
    current = PushSettings.objects.filter(user=user).first() or PushSettings(user=user)
    url = str(data.get("webhook_url", current.webhook_url) or "").strip()
    secret = str(data.get("webhook_secret", current.webhook_secret) or "")
    email = str(data.get("email", current.email) or "").strip()
    if url:
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname or len(url) > 500 or re.search(r"\s", url):
            raise ValidationFailed(
                stored("the webhook URL must be an http:// or https:// URL"),
                code="invalid_webhook_url",
                field="webhook_url",
            )
        if not settings.TRAINYARD_PUSH_WEBHOOK_ALLOW_PRIVATE and private_address(parsed.hostname):
            raise ValidationFailed(
                stored("the webhook URL must name a public address, not one inside the platform's network"),
                code="webhook_url_not_public",
                field="webhook_url",
            )
        if len(secret) < MIN_SECRET or len(secret) > 200:
            raise ValidationFailed(
                stored("a webhook needs a secret of %(min)s to 200 characters to sign its body", min=MIN_SECRET),
                code="invalid_webhook_secret",
                field="webhook_secret",
            )
    elif "webhook_secret" in data and secret and len(secret) < MIN_SECRET:
        raise ValidationFailed(
            stored("a webhook needs a secret of %(min)s to 200 characters to sign its body", min=MIN_SECRET),
            code="invalid_webhook_secret",
            field="webhook_secret",
        )
    if email:
        try:
            validate_email(email)
        except DjangoValidationError:
            raise ValidationFailed(
                stored("'%(email)s' is not an email address", email=email[:100]), code="invalid_email", field="email"
            ) from None
    with transaction.atomic(durable=True):
        current.webhook_url, current.webhook_secret, current.email = url, secret if url else "", email
        current.updated_at = timezone.now()
        current.save()
    return current
