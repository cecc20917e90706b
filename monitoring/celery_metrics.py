"""Celery task latency for /metrics: how long each task waited in the broker and how long it ran.

Workers are separate processes from the web server that answers /metrics, so the histograms live in Redis
(cumulative bucket counters, a sum and a count per task) rather than in process memory. Recording never
breaks a task: a Redis hiccup costs a sample, nothing else.
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from celery import signals
from django.conf import settings

log = structlog.get_logger(__name__)
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
SENT_HEADER = "trainyard_sent_at"
_started: dict[str, float] = {}
_clients: dict[str, Any] = {}


def prefix() -> str:
    configured = getattr(settings, "TRAINYARD_TASK_METRICS_PREFIX", "")
    return configured or f"{settings.CACHES['default'].get('KEY_PREFIX', 'trainyard')}:task-metrics"


def redis_client():
    import redis

    url = settings.REDIS_URL
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    return _clients[url]


def observe(kind: str, task: str, seconds: float) -> None:
    """Add one observation to the `kind` (runtime | wait) histogram of `task`: one counter, the bucket it falls in
    (`histograms` adds them up into Prometheus's cumulative ones), besides the count and the sum. A cumulative
    counter per bound cost up to fifteen commands a task; the dispatcher runs hundreds of passes a minute."""
    key = f"{prefix()}:{kind}:{task}"
    try:
        pipe = redis_client().pipeline(transaction=False)
        bucket = next((bound for bound in BUCKETS if seconds <= bound), None)
        if bucket is not None:
            pipe.hincrby(key, f"in:{bucket}", 1)
        pipe.hincrby(key, "count", 1)
        pipe.hincrbyfloat(key, "sum", seconds)
        pipe.sadd(f"{prefix()}:tasks", task)
        pipe.execute()
    except Exception:  # noqa: BLE001 - metrics must never fail a task
        log.warning("task_metric_not_recorded", task=task, kind=kind)


def histograms(kind: str) -> dict[str, tuple[list[tuple[float, int]], int, float]]:
    """Per task: ([(bucket bound, cumulative count)], count, sum). Counts kept cumulatively by an earlier version
    (`le:` fields) still add in."""
    out = {}
    client = redis_client()
    for raw in sorted(client.smembers(f"{prefix()}:tasks")):
        task = raw.decode()
        data = {k.decode(): v.decode() for k, v in client.hgetall(f"{prefix()}:{kind}:{task}").items()}
        if not data:
            continue
        buckets, below = [], 0
        for bound in BUCKETS:
            below += int(data.get(f"in:{bound}", 0))
            buckets.append((bound, below + int(data.get(f"le:{bound}", 0))))
        out[task] = (buckets, int(data.get("count", 0)), float(data.get("sum", 0.0)))
    return out


def _on_publish(sender=None, headers=None, **_: Any) -> None:
    if headers is not None:
        headers[SENT_HEADER] = time.time()


def _on_prerun(task_id=None, task=None, **_: Any) -> None:
    _started[task_id] = time.perf_counter()
    request = getattr(task, "request", None)
    sent = getattr(request, SENT_HEADER, None) or (getattr(request, "headers", None) or {}).get(SENT_HEADER)
    if sent and task is not None:
        observe("wait", task.name, max(0.0, time.time() - float(sent)))


def _on_postrun(task_id=None, task=None, **_: Any) -> None:
    started = _started.pop(task_id, None)
    if started is not None and task is not None:
        observe("runtime", task.name, time.perf_counter() - started)


def connect() -> None:
    signals.before_task_publish.connect(_on_publish, weak=False, dispatch_uid="trainyard-task-sent-at")
    signals.task_prerun.connect(_on_prerun, weak=False, dispatch_uid="trainyard-task-prerun")
    signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="trainyard-task-postrun")
