"""The platform keeps each team's Kubernetes namespace (Volcano backend, `TRAINYARD_K8S_MANAGE_NAMESPACES`): on a
team's change (`quotas.signals.team_changed`) and on a beat (`jobs.sync_team_namespaces`), level-triggered, so a
lost message or a hand-deleted quota costs one period. What a namespace holds: jobs/backends/team_namespace.py."""

from __future__ import annotations

import structlog
from django.conf import settings

from quotas.models import Team

log = structlog.get_logger(__name__)


def namespaces_managed() -> bool:
    return settings.TRAINYARD_BACKEND == "volcano" and bool(settings.TRAINYARD_K8S_MANAGE_NAMESPACES)


def team_namespaces_sync(*, team_ids: list[int] | None = None) -> dict[str, list[str]]:
    """Create or repair the namespace of each team (all when `team_ids` is None); returns, per namespace, what was
    changed. A team whose namespace the cluster refuses is logged (`team_namespace_sync_failed`, with the API
    server's words) and the others still go ahead."""
    if not namespaces_managed():
        return {}
    from jobs.backends import get_backend

    backend = get_backend("volcano")
    teams = Team.objects.order_by("id")
    if team_ids is not None:
        teams = teams.filter(id__in=team_ids)
    changed: dict[str, list[str]] = {}
    failures = []
    for team in teams:
        try:
            changes = backend.team_namespace_sync(team)
        except Exception as exc:  # noqa: BLE001 - one team's refusal must not strand the others
            log.warning("team_namespace_sync_failed", team=team.slug, namespace=team.namespace, error=str(exc))
            failures.append(exc)
            continue
        if changes:
            changed[team.namespace] = changes
    if failures and team_ids is not None:
        raise failures[0]  # an on-change sync is retried by its task; the beat pass comes back anyway
    return changed
