"""When each control loop last ran: beat's heartbeat and every beat-scheduled task, kept in the cache (Redis).

A worker records a loop's run when its task ends (Celery's task_postrun signal), so a loop counts as running only
when beat sent it and a worker carried it out. `/readyz` reports every loop and fails when the heartbeat is stale.
"""

from __future__ import annotations

import time

from celery.signals import task_postrun
from django.conf import settings
from django.core.cache import cache

KEY = "loop-last-run:{}"
HEARTBEAT = "trainyard.heartbeat"


def _schedule() -> dict[str, float]:
    """Each beat-scheduled task and its period in seconds."""
    return {entry["task"]: float(entry["schedule"]) for entry in settings.CELERY_BEAT_SCHEDULE.values()}


def loop_ran(name: str, *, at: float | None = None) -> None:
    cache.set(KEY.format(name), at if at is not None else time.time(), timeout=None)


def loops_status(*, now: float | None = None) -> dict[str, dict]:
    """For each loop: period, last run (epoch seconds or None), age and whether it is overdue."""
    now = time.time() if now is None else now
    schedule = _schedule()
    last = cache.get_many([KEY.format(name) for name in schedule])
    out = {}
    for name, period in sorted(schedule.items()):
        at = last.get(KEY.format(name))
        stale_after = settings.TRAINYARD_BEAT_STALE_S if name == HEARTBEAT else max(3 * period, period + 60)
        age = None if at is None else round(now - at, 1)
        out[name] = {"every_s": period, "last_run": at, "age_s": age, "overdue": age is None or age > stale_after}
    return out


@task_postrun.connect
def _record(sender=None, **_kwargs) -> None:
    name = getattr(sender, "name", "")
    if name in _schedule():
        try:
            loop_ran(name)
        except Exception:  # noqa: BLE001 - a cache that is down must not fail the task that just ran
            pass
