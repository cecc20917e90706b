"""Reads about quotas: who may see what, and whether a request fits a quota. What a team or queue holds now is
asked of `quotas.usage` (jobs hold it)."""

from django.db.models import Q

from quotas.models import Membership, Team

VECTOR_FIELDS = ("gpu_milli", "gpu_memory_mib", "cpu_milli", "memory_mib")


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
