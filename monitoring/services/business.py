"""Business layer: part of `monitoring.services` (see its package docstring)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Coalesce

from jobs import logstore
from jobs.models import Attempt, Job
from jobs.states import TERMINAL, AttemptState
from kernel.errors import Conflict, ValidationFailed
from kernel.sentences import stored
from kernel.watch import watches_of
from monitoring import business
from monitoring.models import (
    Alert,
    BusinessMetric,
    LogScanCursor,
)
from monitoring.services.common import alerts_lock, at_or_now, log
from monitoring.services.usage import job_alert


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
    moment = at_or_now(now)
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
    moment = at_or_now(now)
    recent = moment - timedelta(minutes=15)
    attempts = (
        Attempt.objects.filter(Q(state__in=[AttemptState.STARTING, AttemptState.RUNNING]) | Q(ended_at__gte=recent))
        .exclude(metric_cursor__done=True)
        .select_related("job__team")
        .order_by("id")
    )
    report = ScanReport()
    for attempt in attempts:
        report.attempts += 1
        cursor = LogScanCursor.objects.filter(attempt=attempt).first() or LogScanCursor(attempt=attempt)
        position = business.ReadPosition(cursor.next_line, cursor.byte_offset, cursor.inode)
        folder = logstore.attempt_dir(str(attempt.job_id), attempt.number)
        watches = watches_of(attempt.job.watch, attempt.job.team.watch)
        result = business.read_new_tagged_lines(folder, position, tuple(w["pattern"] for w in watches))
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
            _log_watch_alerts(attempt, result.watched, watches, now=moment)
            report.watched += len(result.watched)
    return report


def _log_watch_alerts(
    attempt: Attempt, matches: list[tuple[int, str, int]], watches: list[dict], *, now: datetime
) -> None:
    """A watched text (the job's own or its team's default) in the job's log: one alert per (job, text) while it
    lasts, at the level asked for, with the first line that held it and a link to that line; later lines only count
    (`value`). Rate-limited: once resolved, the same text on the same job opens a new alert only
    TRAINYARD_LOG_WATCH_REOPEN_S after the last one opened (until then its lines count on the last one)."""
    job = attempt.job
    counts: dict[int, int] = {}
    first: dict[int, tuple[int, str]] = {}
    for number, text, k in matches:
        counts[k] = counts.get(k, 0) + 1
        first.setdefault(k, (number, text))
    for k, count in counts.items():
        watch = watches[k]
        number, text = first[k]
        name = f"log-watch: {watch['pattern']}"[:100]
        with transaction.atomic():
            alerts_lock()
            fingerprint = f"{name}:{job.id}"[:200]
            last = Alert.objects.filter(fingerprint=fingerprint).order_by("-started_at", "-id").first()
            reopen_after = timedelta(seconds=settings.TRAINYARD_LOG_WATCH_REOPEN_S)
            if last is not None and not last.is_open and now - last.started_at < reopen_after:
                Alert.objects.filter(pk=last.pk).update(value=Coalesce(F("value"), 0.0) + count, last_seen_at=now)
                continue
            # The job's page, and its log from that line on (the log API pages from any line number).
            link = f"/jobs/{job.id}/ — /api/v1/jobs/{job.id}/logs/?attempt={attempt.number}&start={number}"
            alert = job_alert(
                job=job,
                name=name,
                summary=stored(
                    "%(job)s logged '%(pattern)s' (attempt %(attempt)s, line %(line)s): %(text)s — %(link)s",
                    job=job.name,
                    pattern=watch["pattern"],
                    attempt=attempt.number,
                    line=number,
                    text=text.strip()[:300],
                    link=link,
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
