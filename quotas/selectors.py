"""Reads about quotas: what a team or queue holds now, who may see what."""

from django.db.models import Count, Q, Sum
from django.db.models.functions import Coalesce

from quotas.models import Membership, Queue, Team

VECTOR_FIELDS = ("gpu_milli", "gpu_memory_mib", "cpu_milli", "memory_mib")


def _usage(qs) -> dict[str, int]:
    agg = qs.aggregate(
        gpu_milli=Coalesce(Sum("total_gpu_milli"), 0),
        gpu_memory_mib=Coalesce(Sum("total_gpu_memory_mib"), 0),
        cpu_milli=Coalesce(Sum("total_cpu_milli"), 0),
        memory_mib=Coalesce(Sum("total_memory_mib"), 0),
        jobs=Count("id"),
    )
    return {k: int(v) for k, v in agg.items()}


def queue_usage(queue: Queue) -> dict[str, int]:
    from jobs.models import Job

    return _usage(Job.objects.filter(queue=queue, reserved=True, preemptible=False))  # preemptible: no quota held


def team_usage(team: Team) -> dict[str, int]:
    from jobs.models import Job

    return _usage(Job.objects.filter(team=team, reserved=True, preemptible=False))


def team_usage_by_spec(team: Team) -> list[dict]:
    from jobs.models import Job

    rows = (
        Job.objects.filter(team=team, reserved=True)
        .values("spec__name")
        .annotate(
            jobs=Count("id"),
            gpu_milli=Coalesce(Sum("total_gpu_milli"), 0),
            gpu_memory_mib=Coalesce(Sum("total_gpu_memory_mib"), 0),
        )
        .order_by("spec__name")
    )
    return [
        {"spec": r["spec__name"] or "explicit", **{k: r[k] for k in ("jobs", "gpu_milli", "gpu_memory_mib")}}
        for r in rows
    ]


def user_running_jobs(team: Team, user_id: int) -> int:
    from jobs.models import Job

    return Job.objects.filter(team=team, owner_id=user_id, reserved=True).count()


def teams_of(user) -> "Q":
    return Q(memberships__user=user)


def visible_teams(user):
    if user.is_staff:
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user).distinct()


def is_member(user, team: Team) -> bool:
    return user.is_staff or Membership.objects.filter(user=user, team=team).exists()


def is_maintainer(user, team: Team) -> bool:
    return user.is_staff or Membership.objects.filter(user=user, team=team, role=Membership.Role.MAINTAINER).exists()


def fits(vector: dict[str, int], used: dict[str, int], limit: dict[str, int]) -> str | None:
    """The first resource that would go over the limit, or None when the request fits."""
    for name in VECTOR_FIELDS:
        if used.get(name, 0) + vector.get(name, 0) > limit[name]:
            return name
    return None
