"""Reads about jobs: what a user may see, queue positions, estimated waits."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Avg, F, QuerySet
from django.utils import timezone

from jobs.models import Job
from jobs.states import JobState
from quotas.models import Membership


def jobs_visible_to(user) -> QuerySet[Job]:
    qs = Job.objects.select_related("owner", "team", "queue", "spec")
    if user.is_staff:
        return qs
    # The user's team ids as constants (one small query): joined through memberships instead, the planner misjudges
    # how many jobs match and sorts every visible job rather than walking the newest-first index (see bench/api.py).
    return qs.filter(team_id__in=list(Membership.objects.filter(user=user).values_list("team_id", flat=True)))


def queue_waiting(queue) -> list[Job]:
    return list(
        Job.objects.filter(queue=queue, state=JobState.PENDING)
        .select_related("owner", "team", "spec")
        .order_by("-priority", "submitted_at", "id")
    )


def estimated_waits(queue, waiting: list[Job]) -> dict:
    """Seconds until each waiting job could start: running jobs end by their deadline (or the typical
    run time seen in this queue, whichever is sooner), and each job ahead holds its share for that long."""
    now = timezone.now()
    recent = Job.objects.filter(
        queue=queue, state=JobState.SUCCEEDED, finished_at__gte=now - timedelta(days=7), started_at__isnull=False
    )
    typical = recent.aggregate(d=Avg(F("finished_at") - F("started_at")))["d"]
    typical_s = typical.total_seconds() if typical else None
    running = list(
        Job.objects.filter(queue=queue, reserved=True).values(
            "gpu_milli", "gpu_count", "replicas", "deadline", "started_at", "timeout_s"
        )
    )
    ends = []
    for r in running:
        left = (r["deadline"] - now).total_seconds() if r["deadline"] else r["timeout_s"]
        if typical_s and r["started_at"]:
            left = min(left, max(0.0, typical_s - (now - r["started_at"]).total_seconds()))
        ends.append(max(0.0, left))
    ends.sort()
    waits = {}
    clock = 0.0
    for i, job in enumerate(waiting):
        if i < len(ends):
            clock = max(clock, ends[i])
        else:
            clock += typical_s or job.timeout_s
        waits[job.id] = int(clock)
    return waits
