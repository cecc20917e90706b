"""Celery task latency for /metrics: how long each task waited in the broker and how long it ran.

Workers are separate processes from the web server that answers /metrics, so the histograms live in Redis
(cumulative bucket counters, a sum and a count per task) rather than in process memory. Recording never
breaks a task: a Redis hiccup costs samples, nothing else.

A process adds its observations up in memory and a thread of its own writes them to Redis once a second in one
pipeline (`FLUSH_EVERY_S`), and at shutdown. Written per task, two pipelines of ~17 commands for every task were
~15% of the dispatcher's CPU while submissions arrived at 50/s (each submission is a dispatch task); the counters
are sums, so adding them up first changes nothing but when /metrics sees them (up to a second later). What a
process held when it was killed is lost.
"""

from __future__ import annotations

import os
import threading
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


FLUSH_EVERY_S = 1.0


class _Pending:
    """Observations not yet in Redis: (histogram key, task-set key, task) -> [cumulative bucket counts, count, sum]."""

    lock = threading.Lock()
    rows: dict[tuple[str, str, str], list] = {}
    pid = 0  # the process whose flusher thread runs (a forked child starts its own and drops what it inherited)


def _forked() -> None:
    _Pending.lock = threading.Lock()
    _Pending.rows = {}
    _Pending.pid = 0


os.register_at_fork(after_in_child=_forked)


def observe(kind: str, task: str, seconds: float) -> None:
    """Add one observation to the `kind` (runtime | wait) histogram of `task` (written within FLUSH_EVERY_S)."""
    base = prefix()
    key = (f"{base}:{kind}:{task}", f"{base}:tasks", task)
    with _Pending.lock:
        row = _Pending.rows.get(key)
        if row is None:
            row = _Pending.rows[key] = [[0] * len(BUCKETS), 0, 0.0]
        counts = row[0]
        for i, bound in enumerate(BUCKETS):
            if seconds <= bound:
                counts[i] += 1
        row[1] += 1
        row[2] += seconds
    if _Pending.pid != os.getpid():
        _start_flusher()


def flush() -> None:
    """Write what this process has observed to Redis now, in one pipeline."""
    with _Pending.lock:
        rows, _Pending.rows = _Pending.rows, {}
    if not rows:
        return
    try:
        pipe = redis_client().pipeline(transaction=False)
        for (key, tasks, task), (counts, count, total) in rows.items():
            for bound, n in zip(BUCKETS, counts, strict=True):
                if n:
                    pipe.hincrby(key, f"le:{bound}", n)
            pipe.hincrby(key, "count", count)
            pipe.hincrbyfloat(key, "sum", total)
            pipe.sadd(tasks, task)
        pipe.execute()
    except Exception:  # noqa: BLE001 - metrics must never fail a task
        log.warning("task_metrics_not_recorded", histograms=len(rows), observations=sum(r[1] for r in rows.values()))


def _start_flusher() -> None:
    with _Pending.lock:
        if _Pending.pid == os.getpid():
            return
        _Pending.pid = os.getpid()
    threading.Thread(target=_flush_every, daemon=True, name="task-metrics").start()


def _flush_every() -> None:
    me = os.getpid()
    while _Pending.pid == me:
        time.sleep(FLUSH_EVERY_S)
        flush()


def histograms(kind: str) -> dict[str, tuple[list[tuple[float, int]], int, float]]:
    """Per task: ([(bucket bound, cumulative count)], count, sum)."""
    out = {}
    client = redis_client()
    for raw in sorted(client.smembers(f"{prefix()}:tasks")):
        task = raw.decode()
        data = {k.decode(): v.decode() for k, v in client.hgetall(f"{prefix()}:{kind}:{task}").items()}
        if not data:
            continue
        buckets = [(bound, int(data.get(f"le:{bound}", 0))) for bound in BUCKETS]
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


def _on_shutdown(**_: Any) -> None:
    flush()


def connect() -> None:
    signals.worker_process_shutdown.connect(_on_shutdown, weak=False, dispatch_uid="trainyard-task-metrics-child")
    signals.worker_shutdown.connect(_on_shutdown, weak=False, dispatch_uid="trainyard-task-metrics-worker")
    signals.before_task_publish.connect(_on_publish, weak=False, dispatch_uid="trainyard-task-sent-at")
    signals.task_prerun.connect(_on_prerun, weak=False, dispatch_uid="trainyard-task-prerun")
    signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="trainyard-task-postrun")
