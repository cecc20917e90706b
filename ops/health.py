"""Liveness (`/healthz`) and readiness (`/readyz`: database, Redis, a Celery worker, beat's heartbeat, and when
each control loop last ran) probes."""

import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import redis
from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.views.decorators.http import require_GET


@require_GET
def healthz(request):
    return JsonResponse({"status": "ok"})


def _check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _check_redis() -> None:
    timeout = settings.TRAINYARD_READY_TIMEOUT
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        client.ping()
    finally:
        client.close()


def _check_worker() -> None:
    from celery import current_app as app  # the platform's (trainyard.celery), set up with Django

    replies = app.control.ping(timeout=settings.TRAINYARD_READY_TIMEOUT, limit=1)
    if not replies:
        raise RuntimeError("no Celery worker answered")


def missing_tools() -> list[tuple[str, str]]:
    """The programs this configuration needs that the machine lacks, as (program, Debian package)."""
    import os
    import shutil

    from ops.embedded import registry_binary

    needed: list[tuple[str, str]] = []
    sandboxed = str(settings.TRAINYARD_SANDBOX).lower() not in {"off", "0", "false", "no"}
    if settings.TRAINYARD_BACKEND == "local" and sandboxed:
        # slirp4netns too: any queue may be given outbound network, and its jobs would then fail to start.
        needed.append((settings.TRAINYARD_SANDBOX_BWRAP, "bubblewrap"))
        needed.append((settings.TRAINYARD_SANDBOX_SLIRP4NETNS, "slirp4netns"))
    if settings.TRAINYARD_IMAGE_BUILDER == "podman":
        needed.append(("podman", "podman"))
        if os.geteuid() == 0:
            needed += [("newuidmap", "uidmap"), ("newgidmap", "uidmap")]
        # `allowlist` needs no program beyond the jail's: its proxy runs in the worker, its relay in the jail's Python.
        if settings.TRAINYARD_BUILD_NETWORK == "outbound":
            needed.append((settings.TRAINYARD_SANDBOX_SLIRP4NETNS, "slirp4netns"))
    missing = [(tool, package) for tool, package in dict.fromkeys(needed) if shutil.which(tool) is None]
    if not settings.TRAINYARD_REGISTRY_URL and registry_binary(settings.TRAINYARD_REGISTRY_BINARY) is None:
        # No registry configured: the embedded one (Debian's docker-registry) holds every image built here.
        missing.append((settings.TRAINYARD_REGISTRY_BINARY, "docker-registry"))
    return missing


def _check_tools() -> None:
    missing = missing_tools()
    if missing:
        packages = " ".join(sorted({p for _, p in missing}))
        raise RuntimeError(
            f"missing {', '.join(t for t, _ in missing)}: run 'apt-get install {packages}' (jobs or builds fail "
            "until then)"
        )


@require_GET
def readyz(request):
    timeout = settings.TRAINYARD_READY_TIMEOUT
    checks = {"database": _check_database, "redis": _check_redis, "worker": _check_worker}
    results: dict[str, dict] = {}
    # The database check runs here: Django connections belong to their thread.
    started = time.monotonic()
    try:
        _check_database()
        results["database"] = {"ok": True}
    except Exception as exc:  # noqa: BLE001 - any failure means not ready; say which
        results["database"] = {"ok": False, "error": str(exc).strip().splitlines()[0][:200]}
    results["database"]["ms"] = round((time.monotonic() - started) * 1000, 1)
    try:
        _check_tools()
        results["tools"] = {"ok": True}
    except RuntimeError as exc:
        results["tools"] = {"ok": False, "error": str(exc)}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: (pool.submit(fn), time.monotonic()) for name, fn in checks.items() if name != "database"}
        for name, (future, t0) in futures.items():
            try:
                future.result(timeout=timeout + 0.5)
                results[name] = {"ok": True}
            except FutureTimeout:
                results[name] = {"ok": False, "error": f"no answer within {timeout:g} s"}
            except Exception as exc:  # noqa: BLE001
                results[name] = {"ok": False, "error": str(exc).strip().splitlines()[0][:200] or type(exc).__name__}
            results[name]["ms"] = round((time.monotonic() - t0) * 1000, 1)
    loops_report: dict = {}
    try:
        from ops import loops

        loops_report = loops.loops_status()
        beat = loops_report[loops.HEARTBEAT]
        if beat["last_run"] is None:
            results["beat"] = {"ok": False, "error": "no heartbeat from beat yet"}
        elif beat["overdue"]:
            results["beat"] = {"ok": False, "error": f"last heartbeat {beat['age_s']:g} s ago"}
        else:
            results["beat"] = {"ok": True, "age_s": beat["age_s"]}
    except Exception as exc:  # noqa: BLE001
        results["beat"] = {"ok": False, "error": str(exc).strip().splitlines()[0][:200] or type(exc).__name__}
    ready = all(r["ok"] for r in results.values())
    failed = [name for name, r in results.items() if not r["ok"]]
    response = JsonResponse(
        {"status": "ready" if ready else "not_ready", "failed": failed, "checks": results, "loops": loops_report},
        status=200 if ready else 503,
    )
    if not ready:
        from kernel.errors import OUTAGE_RETRY_AFTER_S  # DRF underneath needs the apps loaded: not at import time

        response["Retry-After"] = str(OUTAGE_RETRY_AFTER_S)  # every 503 of the platform says when to come back
    return response
