"""Wake-ups that travel up the layers: the pool, quotas and monitoring ask for a dispatch pass through here, by
task name, so nothing below the scheduler imports it (STYLE.md, "Boundaries and loops").

Requests coalesce: while one pass is queued and not yet started, more requests send nothing. The mark expires
after `WAKE_TTL_S`, so a lost message costs at most that (and the beat's pass comes every 30 s anyway).
"""

from __future__ import annotations

import time

import structlog

log = structlog.get_logger(__name__)

DISPATCH_TASK = "jobs.dispatch_queue"
BEAT_DISPATCH_TASK = "jobs.dispatch_all"
WAKE_KEY = "scheduler:pass-queued"
WAKE_TTL_S = 20
DISPATCH_QUEUE_SUFFIX = ".dispatch"


def dispatch_queue_name(default_queue: str, override: str = "") -> str:
    """The Celery queue dispatch passes travel on: `TRAINYARD_DISPATCH_QUEUE`, else the platform's queue + ".dispatch".

    One process (`ops.processes` "dispatcher": a solo-pool worker) consumes it, so the pool in memory and the
    carried lines stay warm from pass to pass, whichever process asked. A second dispatcher (another host) is
    safe — passes take a database lock and the write re-checks capacity — only slower: each keeps its own view.
    """
    return override.strip() or f"{default_queue}{DISPATCH_QUEUE_SUFFIX}"


def dispatch_queue() -> str:
    from celery import current_app
    from django.conf import settings

    return dispatch_queue_name(current_app.conf.task_default_queue, settings.TRAINYARD_DISPATCH_QUEUE)


def route(name, args, kwargs, options, task=None, **kw):
    """Celery router (`CELERY_TASK_ROUTES`): dispatch passes go to the dispatcher's queue, wherever they are sent
    from (a wake-up, beat, a test); everything else to the default queue."""
    if name in (DISPATCH_TASK, BEAT_DISPATCH_TASK):
        return {"queue": dispatch_queue()}
    return None


def wake_key() -> str:
    """The queued-pass mark, per Celery queue: platforms (and test runs) sharing a Redis never mask each other."""
    from celery import current_app

    return f"{WAKE_KEY}:{current_app.conf.task_default_queue}"


def dispatch_soon() -> None:
    """Ask for a dispatch pass over every queue soon. In a request served by the web server's bridge the message goes
    once the answer has been sent (a millisecond later): the pass it starts then no longer competes for a core with
    the request that asked for it (docs/scheduler.md, "The dispatcher runs first")."""
    from kernel.wsgibridge import after_answer

    if not after_answer(_send_wake):
        _send_wake()


def _send_wake() -> None:
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


_last_pass_began = float("-inf")


def space_passes() -> float:
    """Before a requested pass: wait until `TRAINYARD_DISPATCH_SPACING_S` has gone by since this process's last
    requested pass began; returns the seconds waited (0 when the last one is older).

    The queued mark is still set while this waits, so every submission of those milliseconds joins the coming pass
    instead of queuing one of its own: at 50 submissions/s, one pass (and one message each way) per two or three
    submissions instead of one per submission, for at most the spacing added to a job's admission, and nothing
    added when passes are rarer than that."""
    global _last_pass_began
    from django.conf import settings

    wait = _last_pass_began + settings.TRAINYARD_DISPATCH_SPACING_S - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    _last_pass_began = time.monotonic()
    return max(wait, 0.0)


def dispatch_started() -> None:
    """A queued pass begins: requests from now on queue the next one."""
    from django.core.cache import cache

    try:
        cache.delete(wake_key())
    except Exception:  # noqa: BLE001
        log.warning("dispatch_mark_not_cleared")
