"""Keep the Volcano Queue of a platform queue in step with it (only when the Volcano backend is on)."""

from django.conf import settings
from django.db import transaction


def queue_changed(queue) -> None:
    if settings.TRAINYARD_BACKEND != "volcano":
        return
    queue_id = queue.id

    def send() -> None:
        from jobs.tasks import sync_volcano_queue

        sync_volcano_queue.delay(queue_id)

    transaction.on_commit(send)
