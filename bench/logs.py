"""Log benchmark: ingestion into the store and delivery to WebSocket clients, at 1, 10 and 50 jobs.

Ingestion: K real local runners (the same supervisor the local backend uses), each running a process
that prints as fast as it can; lines/s = all lines stored / wall time. Delivery: K runners printing at a
fixed rate with the print time in each line, K WebSocket clients on the real ASGI server (uvicorn, one of
the web processes `make run` starts: the harder case, every socket lands on it); latency = time shown in the
client - time printed.

Run with `make bench-logs`; prints a table and writes bench/results/logs.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from urllib.parse import urlparse

BASE = Path(__file__).resolve().parent.parent
RESULTS = BASE / "bench" / "results" / "logs.json"
PROCESS_MODEL = (
    "real local runners (the local backend's supervisor) as processes of their own; for delivery, the web server "
    "(uvicorn, one of the processes `make run` starts) and the WebSocket clients in the benchmark's process; "
    "PostgreSQL and Redis on the same machine"
)
LEVELS = (1, 10, 50)
INGEST_TOTAL_LINES = 500_000
DELIVERY_SECONDS = 8
DELIVERY_TOTAL_RATE = 5000  # lines/s across all jobs at each level
START_DELAY_S = 3.0  # long enough for 50 runners to start on 2 cores
TARGET_LINES_PER_S = 50_000
TARGET_P99_MS = 500

FAST_PRINTER = (
    "import sys\n"
    "n = int(sys.argv[1]); w = sys.stdout.write\n"
    "for i in range(n): w('step %d loss 0.12345 throughput 1234.5 samples/s lr 0.0001 padding-to-100-bytes\\n' % i)\n"
)
# Every printer waits for a shared start time, so the 50 processes' start-up (Python imports on 2 cores) is
# not counted as delivery latency; then it prints at its rate, sleeping until each line is due.
PACED_PRINTER = (
    "import sys, time\n"
    "rate = float(sys.argv[1]); seconds = float(sys.argv[2]); start = float(sys.argv[3])\n"
    "time.sleep(max(0.0, start - time.time())); i = 0\n"
    "while True:\n"
    "    now = time.time()\n"
    "    if now - start > seconds: break\n"
    "    due = int((now - start) * rate)\n"
    "    while i < due:\n"
    "        print('T %.6f line %d' % (time.time(), i), flush=True); i += 1\n"
    "    time.sleep(max(0.0, start + (i + 1) / rate - time.time()))\n"
)


def _setup_django() -> None:
    url = urlparse(os.environ["DATABASE_URL"])
    bench_url = url._replace(path="/trainyard_bench_logs").geturl()
    from ops.embedded import ensure_database

    ensure_database(bench_url)
    os.environ["DATABASE_URL"] = bench_url
    os.environ["TRAINYARD_CELERY_QUEUE"] = f"bench-logs-{uuid.uuid4().hex[:8]}"
    os.environ.setdefault("TRAINYARD_LOG_ROOT", str(BASE / "var" / "bench-logs" / "logs"))
    os.environ.setdefault("TRAINYARD_WORK_ROOT", str(BASE / "var" / "bench-logs" / "work"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trainyard.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _make_jobs(count: int):
    from django.contrib.auth import get_user_model

    from jobs.models import Attempt
    from jobs.services import job_submit
    from ops.seed import seed

    seed(admin_password="bench-admin-123", demo_password="bench-demo-123")
    user = get_user_model().objects.get(username="demo")
    jobs = []
    for i in range(count):
        job, _ = job_submit(
            user=user,
            data={
                "team": "demo",
                "queue": "train",
                "spec": "shared",
                "image": "python-3.11",
                "command": ["bench"],
                "name": f"bench-{i}",
            },
        )
        Attempt.objects.create(job=job, number=1, backend="local")
        jobs.append(job)
    return user, jobs


def _start_runner(job_id: str, argv: list[str], root: Path) -> subprocess.Popen:
    from django.conf import settings

    from jobs import logstore

    folder = root / job_id / "attempt-1"
    # A fresh supervisor folder per run: the supervisor treats a folder that already holds a finished run as done
    # (a repeated start is a no-op), so a job reused by the next level or phase printed nothing at all.
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    log_dir = logstore.attempt_dir(job_id, 1)
    if log_dir.exists():
        for f in log_dir.iterdir():
            f.unlink()
    spec = {
        "argv": argv,
        "env": {"PATH": os.environ["PATH"]},
        "cwd": str(folder / "cwd"),
        "log_dir": str(log_dir),
        "budget_bytes": settings.TRAINYARD_LOG_DAILY_BYTES,
        "budget_lines": settings.TRAINYARD_LOG_DAILY_LINES,
        "grace_s": 2,
    }
    (folder / "spec.json").write_text(json.dumps(spec))
    return subprocess.Popen(
        [sys.executable, "-m", "jobs.backends.local_runner", str(folder)],
        cwd=BASE,
        env={**os.environ, "PYTHONPATH": str(BASE)},
    )


def bench_ingestion(jobs, level: int, root: Path) -> dict:
    from jobs import logstore

    chosen = jobs[:level]
    per_job = INGEST_TOTAL_LINES // level
    started = time.perf_counter()
    runners = [_start_runner(str(j.id), [sys.executable, "-c", FAST_PRINTER, str(per_job)], root) for j in chosen]
    for r in runners:
        r.wait()
    elapsed = time.perf_counter() - started
    stored = sum(logstore.LogMeta.read(logstore.attempt_dir(str(j.id), 1)).lines_seen for j in chosen)
    return {
        "jobs": level,
        "lines": stored,
        "expected": per_job * level,
        "seconds": round(elapsed, 3),
        "lines_per_s": round(stored / elapsed),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session_cookie(user) -> str:
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.save()
    return f"{settings.SESSION_COOKIE_NAME}={session.session_key}"


async def _client(url: str, cookie: str, latencies: list[float], expected: int, deadline: float) -> int:
    import websockets

    received = 0
    async with websockets.connect(
        url, additional_headers={"Cookie": cookie, "Origin": "http://127.0.0.1"}, max_size=None
    ) as ws:
        while time.time() < deadline and received < expected:
            try:
                raw = await asyncio.wait_for(ws.recv(), timeout=max(0.1, deadline - time.time()))
            except TimeoutError:
                break
            now = time.time()
            message = json.loads(raw)
            if message.get("type") != "lines":
                continue
            for line in message["lines"]:
                if line["text"].startswith("T "):
                    latencies.append(now - float(line["text"].split()[1]))
                    received += 1
    return received


async def _delivery(jobs, level: int, root: Path, base_url: str, cookie: str, start_delay: float) -> dict:
    chosen = jobs[:level]
    rate = DELIVERY_TOTAL_RATE / level
    expected = int(rate * DELIVERY_SECONDS)
    latencies: list[float] = []
    deadline = time.time() + start_delay + DELIVERY_SECONDS + 15
    from jobs import logstore

    for j in chosen:  # the stream starts on an empty log
        folder = logstore.attempt_dir(str(j.id), 1)
        folder.mkdir(parents=True, exist_ok=True)
        for f in folder.iterdir():
            f.unlink()
    clients = [
        asyncio.create_task(_client(f"{base_url}/ws/jobs/{j.id}/logs/?tail=0", cookie, latencies, expected, deadline))
        for j in chosen
    ]
    await asyncio.sleep(1.0)  # let every client subscribe before the first line
    start_at = time.time() + start_delay
    runners = [
        _start_runner(
            str(j.id), [sys.executable, "-c", PACED_PRINTER, str(rate), str(DELIVERY_SECONDS), str(start_at)], root
        )
        for j in chosen
    ]
    received = sum(await asyncio.gather(*clients))
    for r in runners:
        r.wait()
    printed = sum(logstore.LogMeta.read(logstore.attempt_dir(str(j.id), 1)).lines_seen for j in chosen)
    latencies.sort()

    def pct(p: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 1) if latencies else None

    return {
        "jobs": level,
        "lines_printed_expected": printed,
        "lines_received": received,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": round(latencies[-1] * 1000, 1) if latencies else None,
    }


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Log ingestion and WebSocket delivery benchmark")
    parser.add_argument(
        "--levels",
        default=",".join(map(str, LEVELS)),
        help="comma-separated numbers of concurrent jobs (default: %(default)s)",
    )
    parser.add_argument("--no-ingestion", action="store_true", help="measure delivery only")
    parser.add_argument(
        "--start-delay",
        type=float,
        default=START_DELAY_S,
        help="seconds between starting the runners and their first line (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        args.levels = tuple(int(x) for x in args.levels.split(",") if x.strip())
    except ValueError:
        parser.error("--levels takes whole numbers separated by commas, e.g. 1,10,50")
    if not args.levels or min(args.levels) < 1:
        parser.error("--levels needs at least one level, each 1 or more")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(sys.argv[1:] if argv is None else argv)
    levels = args.levels
    _setup_django()
    from django.conf import settings

    from ops import processes

    user, jobs = _make_jobs(max(levels))
    root = Path(settings.TRAINYARD_WORK_ROOT) / "bench"
    ingestion = [] if args.no_ingestion else [bench_ingestion(jobs, level, root) for level in levels]

    port = _free_port()
    web = subprocess.Popen(
        # The web process as `make run` starts it, but one of it: every socket lands on the same process.
        [sys.executable, "-m", *processes.command("web", host="127.0.0.1", port=port), "--log-level", "warning"],
        cwd=BASE,
        env={**os.environ, "WEB_CONCURRENCY": "1"},
        start_new_session=True,
    )
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        cookie = _session_cookie(user)
        delivery = [
            asyncio.run(_delivery(jobs, level, root, f"ws://127.0.0.1:{port}", cookie, args.start_delay))
            for level in levels
        ]
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        try:
            web.wait(timeout=20)
        except subprocess.TimeoutExpired:
            print("web server did not stop within 20 s of SIGTERM; killed")
            os.killpg(web.pid, signal.SIGKILL)
            web.wait()
        import redis

        redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(settings.CELERY_TASK_DEFAULT_QUEUE)

    print(f"\nLog ingestion (real local runners, {INGEST_TOTAL_LINES:,} lines of ~100 bytes per level)")
    print(f"{'jobs':>5} {'lines stored':>13} {'seconds':>8} {'lines/s':>10}")
    for row in ingestion:
        print(f"{row['jobs']:>5} {row['lines']:>13,} {row['seconds']:>8} {row['lines_per_s']:>10,}")
    print(
        f"\nDelivery: printed -> shown in a WebSocket client ({DELIVERY_TOTAL_RATE} lines/s in all, "
        f"{DELIVERY_SECONDS} s)"
    )
    print(f"{'jobs':>5} {'printed':>9} {'received':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for row in delivery:
        printed = row["lines_printed_expected"]
        print(
            f"{row['jobs']:>5} {printed if printed is not None else '-':>9} {row['lines_received']:>9,} "
            f"{row['p50_ms'] if row['p50_ms'] is not None else '-':>8} "
            f"{row['p99_ms'] if row['p99_ms'] is not None else '-':>8} "
            f"{row['max_ms'] if row['max_ms'] is not None else '-':>8}"
        )
    ingest_ok = bool(ingestion) and all(
        r["lines_per_s"] >= TARGET_LINES_PER_S and r["lines"] == r["expected"] for r in ingestion
    )
    delivery_ok = all(
        r["p99_ms"] is not None and r["p99_ms"] < TARGET_P99_MS and r["lines_received"] == r["lines_printed_expected"]
        for r in delivery
    )
    print(
        f"\ntarget >= {TARGET_LINES_PER_S:,} lines/s ingested: {'met' if ingest_ok else 'MISSED'}; "
        f"p99 delivery < {TARGET_P99_MS} ms with nothing lost: {'met' if delivery_ok else 'MISSED'}"
    )
    # Only the full default run replaces the recorded results; a partial run writes beside them.
    full = levels == LEVELS and not args.no_ingestion and args.start_delay == START_DELAY_S
    results = RESULTS if full else RESULTS.with_name("logs-partial.json")
    results.parent.mkdir(parents=True, exist_ok=True)
    from bench.allocator import provenance

    results.write_text(
        json.dumps(
            {
                "process_model": PROCESS_MODEL,
                "machine": {"cores": os.cpu_count()},
                "provenance": provenance(),
                "ingestion": ingestion,
                "delivery": delivery,
                "targets": {"lines_per_s": TARGET_LINES_PER_S, "p99_ms": TARGET_P99_MS},
                "met": {"ingestion": ingest_ok, "delivery": delivery_ok},
                "settings": {
                    "ingest_total_lines": INGEST_TOTAL_LINES,
                    "delivery_total_rate": DELIVERY_TOTAL_RATE,
                    "delivery_seconds": DELIVERY_SECONDS,
                    "levels": list(levels),
                    "start_delay_s": args.start_delay,
                },
            },
            indent=2,
        )
    )
    print(f"wrote {results.relative_to(BASE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
