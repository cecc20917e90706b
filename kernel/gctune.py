"""Garbage-collector tuning for the web process and for the process that runs dispatch passes.

CPython's cyclic collector walks every tracked object in a full (oldest-generation) collection. A Django process
holds a few hundred thousand long-lived objects (modules, URL patterns, models, serializers), so each full
collection paused whatever request was running for 50-120 ms on the development VM, which was most of the API's
p99. `gc.freeze()` moves the objects alive at that moment into a permanent generation that collections skip.

We freeze twice: once after start-up (settings, URL conf and every view imported), and once more after the first
`REFREEZE_AFTER` requests, which import and build the rest lazily (renderers, serializer fields, query compilers).
A `gc.collect()` first makes sure no garbage is frozen. Objects created later are collected as usual.

A worker process that runs dispatch passes keeps more alive than a web process: the pool, its allocator and the
carried waiting lines, about 200,000 tracked objects at trace scale, and a pass creates tens of thousands more that
outlive it. A full collection then took 90-120 ms, and the passes that admit thousands met one or two of them
(an admitting pass of 6,839 jobs: 2.0 s, 1.75 s with what the previous pass left frozen; measured in process,
docs/scheduler.md). So such a process freezes after each pass that kept new state (`after_pass`: a collection of the
young generations, then `gc.freeze()`, which moves lists), and every `FULL_EVERY_S` it unfreezes, collects
everything and freezes again, so that a cycle frozen while alive and dropped later is freed within minutes.

What a frozen cycle holds stays held until then. Django's connection objects refer to themselves, so a thread that
opened a database connection and ended leaves a session open until the next full collection; the processes that
freeze after passes run their tasks on threads that live as long as they do (the solo pool's, the starters), and a
test that starts a worker in its own process undoes the freezing afterwards (conftest.py).
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Iterator

import structlog

log = structlog.get_logger(__name__)

REFREEZE_AFTER = 50
FULL_EVERY_S = 300.0  # a process freezing after its passes collects everything this often


def freeze_after_startup() -> None:
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - imports every view module now rather than on a first request
    gc.collect()
    gc.freeze()


class RefreezeAfterWarmup:
    """WSGI wrapper: after the first REFREEZE_AFTER requests, collect and freeze once more, then step aside."""

    def __init__(self, app, after: int = REFREEZE_AFTER):
        self.app = app
        self.after = after
        self.seen = 0
        self.done = False
        self._lock = threading.Lock()

    def __call__(self, environ, start_response):
        if not self.done:
            with self._lock:
                self.seen += 1
                due = self.seen >= self.after and not self.done
                if due:
                    self.done = True
            if due:
                gc.collect()
                gc.freeze()
        return self.app(environ, start_response)


class _Passes:
    enabled = False
    full_at = 0.0  # monotonic time of the last unfreeze, collect and freeze


def freeze_passes() -> None:
    """In a worker process at start: collect and freeze what it loaded, and freeze again after each dispatch pass
    it runs (`after_pass`). Processes that never call this (the web process, tests) keep the collector as it is."""
    gc.collect()
    gc.freeze()
    _Passes.enabled = True
    _Passes.full_at = time.monotonic()


@contextlib.contextmanager
def pass_collection_paused() -> Iterator[None]:
    """Around a dispatch pass in a process that freezes after its passes: no automatic collection while it runs.

    A pass that admits thousands makes hundreds of thousands of objects (placements, slices, admissions, rows), and
    the collections they set off walked them again and again while the pass was deciding: 50-60 ms of a 1-second
    pass (docs/scheduler.md). What the pass drops is reference-counted away as usual; the cycles it leaves are
    collected right after it (`after_pass`, or the next automatic collection, which the counts built up during the
    pass bring at once). A pass is bounded (a few seconds at the most), so what it holds meanwhile is too. Does
    nothing unless enabled, or when the collector is already off."""
    if not _Passes.enabled or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def after_pass(*, kept: bool = True) -> None:
    """After a dispatch pass: when it `kept` new long-lived state (read or decided the lines again, rebuilt the
    allocator, admitted many), collect the young generations (what the pass dropped) and freeze what is alive;
    every FULL_EVERY_S, whatever the pass, collect everything first, so that frozen garbage cannot pile up. A pass
    that only admitted a newcomer or two freezes nothing: what it made is young and collected as usual (the
    threads a pass starts to tell browsers leave ~90 objects in cycles each time, 27,000 in 300 passes if frozen).
    Does nothing unless enabled."""
    if not _Passes.enabled:
        return
    now = time.monotonic()
    if now - _Passes.full_at < FULL_EVERY_S:
        if kept:
            gc.collect(1)
            gc.freeze()
        return
    t0 = time.perf_counter()
    gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    _Passes.full_at = now
    ms = round((time.perf_counter() - t0) * 1000, 1)
    log.info("gc_refrozen", collected=found, frozen=gc.get_freeze_count(), ms=ms)


def stop_freezing_passes() -> None:
    """Undo `freeze_passes` (tests): every frozen object is the collector's again, and what is garbage is freed now."""
    _Passes.enabled = False
    gc.unfreeze()
    gc.collect()
