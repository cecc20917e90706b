"""What the jobs app does when a lower app says something happened (signals named in `quotas.signals`)."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from quotas import signals as quota_signals


def _push_volcano_queue(sender, queue, **_kwargs) -> None:
    """A queue changed: keep its Volcano Queue in step, once the change is committed (Volcano backend only)."""
    if settings.TRAINYARD_BACKEND != "volcano":
        return
    queue_id = queue.id

    def send() -> None:
        from jobs.tasks import sync_volcano_queue

        sync_volcano_queue.delay(queue_id)

    transaction.on_commit(send)


def _push_team_namespace(sender, team, **_kwargs) -> None:
    """A team was created or changed: create or update its namespace once committed (Volcano backend, namespaces
    kept by the platform)."""
    from jobs.team_namespaces import namespaces_managed

    if not namespaces_managed():
        return
    team_id = team.id

    def send() -> None:
        from jobs.tasks import sync_team_namespace

        sync_team_namespace.delay(team_id)

    transaction.on_commit(send)


def cluster_runtime_classes() -> set[str] | None:
    """The cluster's RuntimeClass names (Volcano backend), for a queue's `runtime_class`; None without a cluster."""
    if settings.TRAINYARD_BACKEND != "volcano":
        return None
    from jobs.backends import get_backend

    return get_backend("volcano").runtime_classes()


def connect() -> None:
    quota_signals.queue_changed.connect(_push_volcano_queue, dispatch_uid="jobs.push_volcano_queue")
    quota_signals.team_changed.connect(_push_team_namespace, dispatch_uid="jobs.push_team_namespace")
