"""Reads about jobs: what a user may see, queue positions, estimated waits."""

from __future__ import annotations

from django.db.models import QuerySet

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
    """When each waiting job may start: job id -> jobs.eta.Estimate (a range, or unknown)."""
    from jobs import eta

    return eta.estimate_starts(queue, waiting)


def line_clears(waiting: list[Job], waits: dict):
    """When the last job of the line may start (the line has cleared), or None for an empty line."""
    return waits.get(waiting[-1].id) if waiting else None
