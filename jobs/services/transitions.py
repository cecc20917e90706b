"""Transitions: part of `jobs.services` (see its package docstring)."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from cluster import services as pool
from jobs.models import Attempt, Job, JobEvent
from jobs.services.common import InvalidTransition, log
from jobs.states import ALLOWED, TERMINAL, JobState
from kernel.wake import dispatch_soon


def event_record(
    job: Job,
    kind: str,
    *,
    actor: str,
    message: str = "",
    level: str = "info",
    data=None,
    attempt: Attempt | None = None,
    from_state: str = "",
    to_state: str = "",
) -> JobEvent:
    return JobEvent.objects.create(
        job=job,
        attempt=attempt,
        kind=kind,
        actor=actor,
        message=message[:2000],
        level=level,
        data=data or {},
        from_state=from_state,
        to_state=to_state,
    )


def _release(job: Job, *, why: str) -> None:
    """Give back the job's quota reservation and its slices; safe to call again (releases once)."""
    for attempt in job.attempts.all():
        pool.slices_release(attempt_id=attempt.id, reason=why)
    if job.reserved:
        job.reserved = False
        transaction.on_commit(dispatch_soon, robust=True)


def job_transition(
    *,
    job_id,
    to: str,
    actor: str,
    reason: str = "",
    message: str = "",
    data=None,
    attempt: Attempt | None = None,
    level: str = "info",
    started_at: datetime | None = None,
) -> Job:
    """Move a job to `to`: row lock, allowed-transition table, idempotent, one event, releases on terminal.
    `started_at`: when the attempt's process began, where the backend read it (moving to running)."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state == to:
            return job
        if to not in ALLOWED[job.state]:
            raise InvalidTransition(f"a {job.state} job cannot become {to}", from_state=job.state, to_state=to)
        previous = job.state
        now = timezone.now()
        job.state = to
        if reason or to in TERMINAL or to == JobState.RUNNING:
            job.reason = reason
        if message:
            job.message = message
        if to == JobState.ADMITTED:
            job.admitted_at = now
            job.reserved = True
        if to == JobState.RUNNING and job.started_at is None:
            # The process's own start where the backend read it: a job noticed running late still began on time.
            job.started_at = started_at if started_at is not None and started_at <= now else now
        if to in TERMINAL:
            # The attempt's own times where it has them: a job noticed late ended when its process did, and one
            # that ended before anyone saw it run still started when its attempt did.
            ended = getattr(attempt, "ended_at", None)
            job.finished_at = ended if ended is not None and ended <= now else now
            began = getattr(attempt, "started_at", None)
            if job.started_at is None and began is not None and began <= job.finished_at:
                job.started_at = began
            _release(job, why=to)
            if job.tensorboard:
                from jobs.tensorboard import route_expire

                route_expire(job_id=job.id)
        if to == JobState.RETRYING:
            _release(job, why="retrying")
        job.save()
        event_record(
            job,
            "state",
            actor=actor,
            from_state=previous,
            to_state=to,
            message=message or reason,
            data={**(data or {}), "reason": reason} if reason else data,
            attempt=attempt,
            level=level,
        )
    _broadcast(job)
    return job


def _broadcast(job: Job) -> None:
    job_id, state = str(job.id), job.state

    def send() -> None:
        try:
            from jobs.realtime import job_changed

            job_changed(job_id=job_id, state=state)
        except Exception:  # noqa: BLE001 - a missing listener must never fail a transition
            log.debug("broadcast_failed", job_id=job_id)

    transaction.on_commit(send)
