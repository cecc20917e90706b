"""Django's Redis cache with one client and connection pool per process.

Django keeps a cache object per request context; under the web process's thread pool every request runs in a
fresh context, so the stock backend built a new client, a new connection pool and so a new Redis connection
for every request (the rate limiter reads and writes the cache on each one). Here every cache object of the
process shares one client, created once (redis-py clients and pools are thread-safe).
"""

from __future__ import annotations

import threading

from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from django.utils.functional import cached_property

_clients: dict[tuple, RedisCacheClient] = {}
_lock = threading.Lock()


class _SharedClient(RedisCacheClient):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._redis: dict[bool, object] = {}

    def get_client(self, key=None, *, write=False):
        client = self._redis.get(write)
        if client is None:
            client = self._redis[write] = super().get_client(key, write=write)
        return client


class SharedRedisCache(RedisCache):
    def redis_client(self):
        """The process's redis-py client for this cache's server (for atomic scripts the cache API lacks)."""
        return self._cache.get_client(write=True)

    @cached_property
    def _cache(self):
        key = (tuple(self._servers), tuple(sorted((k, repr(v)) for k, v in self._options.items())))
        client = _clients.get(key)
        if client is None:
            with _lock:
                client = _clients.get(key)
                if client is None:
                    client = _clients[key] = _SharedClient(self._servers, **self._options)
        return client
