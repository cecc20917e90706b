"""Wake-ups that travel up the layers: the pool, quotas and monitoring ask for a dispatch pass through here, by
task name, so nothing below the scheduler imports it (STYLE.md, "Boundaries and loops").

Requests coalesce: while one pass is queued and not yet started, more requests send nothing. The mark expires
after `WAKE_TTL_S`, so a lost message costs at most that (and the beat's pass comes every 30 s anyway).
"""

from __future__ import annotations

import structlog

log = structlog.get_logger(__name__)

DISPATCH_TASK = "jobs.dispatch_queue"
WAKE_KEY = "scheduler:pass-queued"
WAKE_TTL_S = 20


def wake_key() -> str:
    """The queued-pass mark, per Celery queue: platforms (and test runs) sharing a Redis never mask each other."""
    from celery import current_app

    return f"{WAKE_KEY}:{current_app.conf.task_default_queue}"


def dispatch_soon() -> None:
    """Ask for a dispatch pass over every queue soon."""
    from django.core.cache import cache

    try:
        queued = cache.add(wake_key(), 1, timeout=WAKE_TTL_S)
    except Exception:  # noqa: BLE001 - without Redis the beat's pass still comes within 30 s
        log.warning("dispatch_request_unsent")
        return
    if not queued:
        return
    from celery import current_app

    try:
        current_app.send_task(DISPATCH_TASK, args=[None])
    except Exception:  # noqa: BLE001 - the beat's pass still comes; let the next request try again
        cache.delete(wake_key())
        log.warning("dispatch_request_unsent")


def dispatch_started() -> None:
    """A queued pass begins: requests from now on queue the next one."""
    from django.core.cache import cache

    try:
        cache.delete(wake_key())
    except Exception:  # noqa: BLE001
        log.warning("dispatch_mark_not_cleared")
