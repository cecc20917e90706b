"""Pytest plugin (`-p ops.pytest_workers` in pyproject): parallel test workers apart in Redis.

`make test` runs the suite in two pytest-xdist workers. pytest-django gives each worker a PostgreSQL database of
its own; this gives each a Redis database of its own (the configured one plus 1, 2, ...), so rate-limit windows,
wake-up marks and channel groups of one worker never meet the other's. It runs when pytest loads plugins, before
pytest-django reads the Django settings, and only changes the environment of a worker process.
"""

import os
from urllib.parse import urlsplit, urlunsplit


def _worker_redis_url(url: str, worker: str) -> str:
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0) + 1 + int(worker.removeprefix("gw"))
    return urlunsplit(parts._replace(path=f"/{db % 16}"))


_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw"):
    # The settings' own default when none is configured.
    os.environ["REDIS_URL"] = _worker_redis_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), _worker)
