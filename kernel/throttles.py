"""Rate limits per token (or per user for browser sessions), answered with 429 and Retry-After.

Each limit is a sliding window kept in Redis as a sorted set of request times, trimmed, counted and extended by
one server-side script. DRF's stock throttle reads the whole history, appends in Python and writes it back, so
two requests arriving together (threads or web processes) could both take the last slot; the script makes the
check-and-take one atomic step, on the Redis server's clock, and costs one round trip.
"""

from __future__ import annotations

import secrets

from django.core.cache import cache
from rest_framework.throttling import ScopedRateThrottle

# KEYS[1]: the window; ARGV: limit, window in seconds, a unique member. Returns {allowed, seconds to wait}.
_SLIDING_WINDOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) < limit then
    redis.call('ZADD', KEYS[1], now, ARGV[3])
    redis.call('PEXPIRE', KEYS[1], math.ceil(window * 1000))
    return {1, '0'}
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {0, tostring(tonumber(oldest[2]) + window - now)}
"""


_scripts: dict[int, object] = {}


def _script(client):
    """The window script registered with this client: sent by its SHA (EVALSHA), in full only when Redis lacks it."""
    script = _scripts.get(id(client))
    if script is None:
        script = _scripts[id(client)] = client.register_script(_SLIDING_WINDOW)
    return script


class PerTokenThrottle(ScopedRateThrottle):
    _wait: float | None = None

    def get_cache_key(self, request, view):
        token = getattr(request, "api_token", None)
        if token is not None:
            ident = f"token-{token.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"user-{request.user.pk}"
        else:
            ident = self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}

    def allow_request(self, request, view):
        self.scope = getattr(view, self.scope_attr, None)
        if not self.scope:
            return True
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        allowed, wait = _script(cache.redis_client())(
            keys=[cache.make_key(key)], args=[self.num_requests, self.duration, secrets.token_hex(8)]
        )
        self._wait = None if allowed else max(0.0, float(wait))
        return bool(allowed)

    def wait(self):
        return self._wait
