"""Pytest plugin (`-p ops.pytest_workers` in pyproject): parallel test processes apart in Redis, PostgreSQL and the
object store.

`make test` runs the suite in two pytest-xdist workers. pytest-django gives each worker a PostgreSQL database of
its own; this gives each a Redis database of its own (the configured one plus 1, 2, ...), so rate-limit windows,
wake-up marks and channel groups of one worker never meet the other's.

A whole pytest run beside another on the same servers (`scripts/test.sh` runs the real-cluster tests on a second
Kubernetes/Volcano pair at the same time as on the first) names a lane, `TRAINYARD_TEST_LANE=<n>` (1-4): its Redis
database is the configured one plus 4 + n, its PostgreSQL database name gets `_lane<n>` (so pytest-django's test
database does too) and its bucket `-lane<n>`, and the `registry_url` fixture (conftest.py) starts a registry of its
own, so neither run reads, clears, drops or overwrites what the other wrote.

It runs when pytest loads plugins, before pytest-django reads the Django settings, and only changes the environment
of the process it runs in.
"""

import os
from urllib.parse import urlsplit, urlunsplit

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"  # the settings' own defaults when none is configured
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/trainyard"
DEFAULT_BUCKET = "trainyard"
LANES = range(1, 5)


def _redis_db(url: str, offset: int) -> str:
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0) + offset
    return urlunsplit(parts._replace(path=f"/{db % 16}"))


def _worker_redis_url(url: str, worker: str) -> str:
    return _redis_db(url, 1 + int(worker.removeprefix("gw")))


def _lane_database_url(url: str, lane: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{parts.path.strip('/') or 'trainyard'}_lane{lane}"))


def lane_environment(environ: dict[str, str], lane: str) -> dict[str, str]:
    """The variables a run in lane `lane` overrides (ValueError for a lane outside 1-4)."""
    if not lane.isdigit() or int(lane) not in LANES:
        raise ValueError(f"TRAINYARD_TEST_LANE must be one of {LANES.start}-{LANES.stop - 1}, not {lane!r}")
    n = int(lane)
    return {
        "REDIS_URL": _redis_db(environ.get("REDIS_URL", DEFAULT_REDIS_URL), 4 + n),
        "DATABASE_URL": _lane_database_url(environ.get("DATABASE_URL", DEFAULT_DATABASE_URL), n),
        "TRAINYARD_S3_BUCKET": f"{environ.get('TRAINYARD_S3_BUCKET', DEFAULT_BUCKET)}-lane{n}",
    }


_lane = os.environ.get("TRAINYARD_TEST_LANE", "")
if _lane:
    os.environ.update(lane_environment(dict(os.environ), _lane))
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw"):
    os.environ["REDIS_URL"] = _worker_redis_url(os.environ.get("REDIS_URL", DEFAULT_REDIS_URL), _worker)
