"""Garbage-collector tuning for the web process.

CPython's cyclic collector walks every tracked object in a full (oldest-generation) collection. A Django process
holds a few hundred thousand long-lived objects (modules, URL patterns, models, serializers), so each full
collection paused whatever request was running for 50-120 ms on the development VM, which was most of the API's
p99. `gc.freeze()` moves the objects alive at that moment into a permanent generation that collections skip.

We freeze twice: once after start-up (settings, URL conf and every view imported), and once more after the first
`REFREEZE_AFTER` requests, which import and build the rest lazily (renderers, serializer fields, query compilers).
A `gc.collect()` first makes sure no garbage is frozen. Objects created later are collected as usual.
"""

from __future__ import annotations

import gc
import threading

REFREEZE_AFTER = 50


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
