"""Realtime notifications to browsers (Channels groups), sent after commit by the services.

Each process sends through one event loop of its own, run by a thread that lives as long as the process. The Redis
channel layer keeps a connection pool per event loop, so `async_to_sync` (a new loop for every call) opened and
closed a Redis connection for every notice: 2.6 ms of CPU per send in the sending process against 0.3 ms on the
kept loop (measured in process against the embedded Redis), paid by every transition and by every dispatch pass
that admitted a job. A forked child (a prefork worker) starts its own loop on its first send. One task on the loop
sends every call's notices in turn, so they arrive in the order they were sent.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterable
from concurrent.futures import Future

import structlog
from channels.layers import get_channel_layer

log = structlog.get_logger(__name__)

LISTENERS_ASKED_FROM = 20  # a call with this many notices or more first asks which groups have members
SEND_TIMEOUT_S = 10.0  # a caller that waits gives up after this (the channel layer's Redis is down or stalled)


class _Sender:
    loop: asyncio.AbstractEventLoop | None = None
    inbox: asyncio.Queue | None = None
    pid: int | None = None
    lock = threading.Lock()


def _start() -> tuple[asyncio.AbstractEventLoop, asyncio.Queue]:
    with _Sender.lock:
        if _Sender.loop is None or _Sender.pid != os.getpid():
            loop = asyncio.new_event_loop()
            inbox: asyncio.Queue = asyncio.Queue()
            threading.Thread(target=loop.run_forever, daemon=True, name="realtime-sender").start()
            asyncio.run_coroutine_threadsafe(_drain(inbox), loop)
            _Sender.loop, _Sender.inbox, _Sender.pid = loop, inbox, os.getpid()
        assert _Sender.inbox is not None
        return _Sender.loop, _Sender.inbox


async def _drain(inbox: asyncio.Queue) -> None:
    """Send what `send` handed over, one call's notices after another's: notices reach a group in the order they
    were sent, whether or not their senders waited (concurrent sends on the loop overtook each other)."""
    while True:
        layer, messages, done = await inbox.get()
        try:
            messages = list(messages)
            if len(messages) >= LISTENERS_ASKED_FROM:
                messages = await _listened(layer, messages)
            for group, message in messages:
                await layer.group_send(group, message)
        except Exception as exc:  # noqa: BLE001 - handed to the sender (raised when it waits, logged when not)
            if not done.done():
                done.set_exception(exc)
        else:
            if not done.done():
                done.set_result(None)


async def _listened(layer, messages: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The messages whose group has a member, asked of Redis in one pipeline per host: a group send costs two round
    trips even to a group nobody is in (~0.3 ms of CPU), and a pass that admits thousands of jobs sent a notice to
    each job's page, nearly all of them closed (seconds of the dispatcher's CPU). A page that opens meanwhile reads
    the job's state when it loads. Layers other than Redis's are sent everything."""
    if not (hasattr(layer, "_group_key") and hasattr(layer, "consistent_hash") and hasattr(layer, "connection")):
        return messages
    by_host: dict[int, list[int]] = {}
    for k, (group, _message) in enumerate(messages):
        by_host.setdefault(layer.consistent_hash(group), []).append(k)
    keep: set[int] = set()
    for index, positions in by_host.items():
        pipe = layer.connection(index).pipeline(transaction=False)
        for k in positions:
            pipe.exists(layer._group_key(messages[k][0]))
        keep.update(k for k, found in zip(positions, await pipe.execute(), strict=True) if found)
    return [m for k, m in enumerate(messages) if k in keep]


def send(messages: Iterable[tuple[str, dict]], *, wait: bool = True) -> None:
    """Send each (group, message) through the channel layer, in order, on this process's sender loop (an iterator
    is consumed there). `wait`: return once sent (raising what the layer raised); otherwise return at once and log
    a failure."""
    layer = get_channel_layer()
    if layer is None or (isinstance(messages, list | tuple) and not messages):
        return
    loop, inbox = _start()
    done: Future = Future()
    loop.call_soon_threadsafe(inbox.put_nowait, (layer, messages, done))
    if wait:
        done.result(SEND_TIMEOUT_S)
    else:
        done.add_done_callback(_log_failure)


def _log_failure(future: Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("realtime_send_failed", error=str(future.exception()))


def job_group(job_id: str) -> str:
    return f"job.{job_id}"


def state_notice(job_id: str, state: str, **extra: str) -> tuple[str, dict]:
    """The (group, message) that tells a job's open pages its state changed (`extra`: a waiting job's reason)."""
    return job_group(job_id), {"type": "job.state", "job_id": job_id, "state": state, **extra}


def job_changed(*, job_id: str, state: str) -> None:
    send([state_notice(job_id, state)])


def job_metrics_changed(*, job_id: str) -> None:
    """New business metrics for the job: the log sockets of its page redraw the metrics charts."""
    send([(job_group(job_id), {"type": "job.metrics", "job_id": job_id})])
