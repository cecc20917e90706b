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


def connect() -> None:
    quota_signals.queue_changed.connect(_push_volcano_queue, dispatch_uid="jobs.push_volcano_queue")
