"""The per-token rate limit: a sliding window that concurrent requests cannot overrun."""

import uuid
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from django.db import connections

from kernel.throttles import PerTokenThrottle


def test_concurrent_requests_never_take_more_than_the_limit(settings, monkeypatch):
    settings.CACHES = {"default": dict(settings.CACHES["default"], KEY_PREFIX=f"throttle-{uuid.uuid4().hex}")}
    monkeypatch.setattr(PerTokenThrottle, "THROTTLE_RATES", {"submit": "5/min"})
    view = SimpleNamespace(throttle_scope="submit")
    request = SimpleNamespace(api_token=SimpleNamespace(pk=7), user=None)

    def one(_):
        try:
            return PerTokenThrottle().allow_request(request, view)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(16) as pool:
        allowed = list(pool.map(one, range(48)))
    assert sum(allowed) == 5
    refused = PerTokenThrottle()
    assert not refused.allow_request(request, view)
    assert 55 < refused.wait() <= 60  # the oldest of the five leaves the one-minute window first
    other = SimpleNamespace(api_token=SimpleNamespace(pk=8), user=None)
    assert PerTokenThrottle().allow_request(other, view)  # each token has its own window
