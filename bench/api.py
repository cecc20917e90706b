"""API benchmark: job submission and job listing through the real stack, each against its floor.

What runs: a dedicated database (``<name>_bench_api`` on the server of ``$DATABASE_URL``, dropped and created
afresh, migrated, seeded), the real web server (``ops.processes`` "web": uvicorn with its worker processes, as
``make run`` starts it) on a free loopback port, and a load generator in a second process (``bench._load``,
its own small HTTP/1.1 client on uvloop) that sends requests at a fixed open-loop rate with an API token, at most
32 in flight.

- Submit: ``POST /api/v1/jobs/`` (token auth, throttle, validation, Job + JobEvent rows, enqueue of the
  dispatch task to Redis after commit) at 100/s for 20 s; a step test (25/50/100/200/s) for the knee; and
  8 clients back to back for the most the server does. Floor: the same number of bare ``Job`` inserts (one
  transaction each, the same resolved fields) plus ``dispatch_queue.delay`` after commit, straight from
  Python at the same rate, then back to back.
- List: the job table is filled to 100,000 rows (COPY; ten teams, a mix of states, 90 days), then
  ``GET /api/v1/jobs/?page_size=50`` at 20/s: the first page, cursor pages 2-5, ``state=pending``,
  ``team=demo`` (a team member's token) and the first page as staff (every job visible). Floor: the same ORM
  query (visibility selector, filter, ``select_related``, newest first, limit 51) timed directly.

Latency counts from when a request was due, so a server that falls behind shows its queue. A fixed-rate phase
waits for late answers for half its length at most; what is still unanswered then counts as an error.
No Celery worker runs: the dispatch messages stay in a Redis queue named for this run, are checked against the
jobs created, and are deleted at the end with the run's cache keys. Rate limits are raised to 100000/s.

Run from the repository root (``make bench-api`` wraps it with embedded services when no URLs are set)::

    python -m bench.api            # the full run (about 5 minutes), writes bench/results/api.json
    python -m bench.api --quick    # a smoke run (small table, short phases), writes nothing unless --out
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlsplit

import httpx

from bench._load import PhaseResult, Sample, summarize_phase

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_PATH = REPO_ROOT / "bench" / "results" / "api.json"
SUBMIT_TARGET_RATE = 100.0
SUBMIT_TARGET_P99_MS = 100.0
LIST_TARGET_P99_MS = 50.0
LIST_TABLE_JOBS = 100_000
PAGE_SIZE = 50
MAX_IN_FLIGHT = 32  # the load generator's connection cap (see bench/_load.py)
# High enough never to answer 429 here; a per-second window keeps the throttle's history list short.
BENCH_RATE = "100000/s"

PROCESS_MODEL = (
    "the web server (ops.processes 'web': uvicorn with one worker process per core, as `make run` starts it); load "
    "from bench._load in a process of its own; the floors in the benchmark's process; no Celery worker (the "
    "dispatch messages are counted in Redis); PostgreSQL and Redis on the same machine"
)
SUBMIT_BODY: dict[str, Any] = {
    "name": "bench-train",
    "team": "demo",
    "queue": "train",
    "spec": "shared",
    "image": "pytorch-2.5-cuda12.4",
    "command": ["python", "train.py", "--epochs", "3"],
    "args": ["--lr", "0.001"],
    "env": {"SEED": "7", "WANDB_MODE": "offline"},
    "labels": {"project": "bench", "owner": "ci"},
    "ci": {"commit": "0" * 40, "pipeline": "bench-api"},
}

# The mix of states in the filled table (a platform that has run for a while: mostly finished jobs).
STATE_MIX: list[tuple[str, float]] = [
    ("succeeded", 0.55),
    ("failed", 0.15),
    ("cancelled", 0.06),
    ("timed_out", 0.02),
    ("pending", 0.12),
    ("running", 0.07),
    ("admitted", 0.01),
    ("starting", 0.01),
    ("retrying", 0.01),
]
EXTRA_TEAMS = 9  # besides "demo"; the demo user is a member of demo and of the first extra team


@dataclass
class Config:
    submit_rate: float = SUBMIT_TARGET_RATE
    submit_duration_s: float = 20.0
    steps: list[float] = field(default_factory=lambda: [25.0, 50.0, 100.0, 200.0])
    step_duration_s: float = 8.0
    max_concurrency: int = 8
    max_duration_s: float = 5.0
    list_jobs: int = LIST_TABLE_JOBS
    list_rate: float = 20.0
    list_duration_s: float = 8.0
    warmup_s: float = 1.0

    def drain_s(self, duration_s: float) -> float:
        """How long a fixed-rate phase waits for late answers after its last request was due."""
        return max(2.0, duration_s / 2)


# ------------------------------------------------------------------------------------------- processes

_children: list[subprocess.Popen] = []


def _terminate_children() -> None:
    """End the server and the load generator this run started (their own process groups), then reap them."""
    for proc in reversed(_children):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except (ProcessLookupError, PermissionError):
                pass
    for proc in reversed(_children):
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait(timeout=5)
    _children.clear()


def _exit_on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class WebServer:
    """The real web server (uvicorn and the worker processes `make run` would start) on a free loopback port;
    its output goes to a file."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = env
        self.log_path = log_path
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None
        from ops import processes

        self.argv = [sys.executable, "-m", *processes.command("web", host="127.0.0.1", port=self.port)]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        from ops import processes

        self.proc = subprocess.Popen(
            self.argv,
            env={**self.env, **processes.environment("web", self.env)},
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=processes.lower_priority("web", self.env),
        )
        _children.append(self.proc)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the web server exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                if httpx.get(self.base_url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the web server did not answer /healthz within 60 s:\n{self.log_tail()}")

    def cpu_s(self) -> float:
        """CPU seconds (user + system) used so far by the server's processes (uvicorn and its workers: the
        process group it leads); 0 where /proc is missing."""
        if self.proc is None:
            return 0.0
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.proc.pid:
                total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def settle(self, *, quiet_s: float = 0.5, limit_s: float = 15.0) -> None:
        """Wait until the server has stopped working off requests a cut-off phase left behind."""
        deadline = time.monotonic() + limit_s
        last = self.cpu_s()
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            now = self.cpu_s()
            if now - last < 0.02 * quiet_s:
                return
            last = now

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def run_load(server: WebServer, phases: list[dict[str, Any]], workdir: Path) -> tuple[list[PhaseResult], dict]:
    """Run phases in a fresh load-generator process; returns their results and the server CPU they cost."""
    plan_path = workdir / "plan.json"
    out_path = workdir / "load-out.json"
    out_path.unlink(missing_ok=True)
    plan_path.write_text(json.dumps({"base_url": server.base_url, "phases": phases, "max_connections": MAX_IN_FLIGHT}))
    expected = sum(float(p["duration_s"]) for p in phases)
    cpu0, load0 = server.cpu_s(), _loadavg()
    watcher = ConnectionWatcher(server.env["DATABASE_URL"])
    watcher.start()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench._load", str(plan_path), str(out_path)], cwd=REPO_ROOT, start_new_session=True
    )
    _children.append(proc)
    try:
        code = proc.wait(timeout=expected + 180)
    finally:
        watcher.stop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _children.remove(proc)
    if code != 0:
        raise RuntimeError(f"the load generator failed ({code})")
    data = json.loads(out_path.read_text())
    results = []
    for raw in data["phases"]:
        samples = [Sample(**s) for s in raw.pop("samples")]
        results.append(PhaseResult(samples=samples, **raw))
    server.settle()
    total = sum(1 for r in results for sample in r.samples if sample.status)  # the requests the server answered
    cpu = server.cpu_s() - cpu0
    info = {
        "server_cpu_s": round(cpu, 2),
        "server_cpu_ms_per_request": round(cpu / total * 1000, 2) if total else 0,
        "loadavg_before": load0,
        "loadavg_after": _loadavg(),
        "db_connections_peak": watcher.peak,
        "db_connections_after": watcher.count(),
    }
    return results, info


class ConnectionWatcher:
    """Samples how many connections the benchmark database has (the server's, mostly) while a phase runs."""

    def __init__(self, database_url: str, every_s: float = 0.25) -> None:
        self.dbname = urlparse(database_url).path.lstrip("/")
        self.conninfo = _admin_conninfo(database_url)
        self.every_s = every_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="db-connection-watcher", daemon=True)

    def count(self) -> int:
        import psycopg

        with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [self.dbname]).fetchone()
        return int(row[0]) if row else 0

    def _run(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5) as conn:
                while not self._stop.wait(self.every_s):
                    row = conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [self.dbname]
                    ).fetchone()
                    self.peak = max(self.peak, int(row[0]) if row else 0)
        except psycopg.Error:
            pass  # a diagnostic only; the phase's own figures do not depend on it

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def open_phase(name: str, *, rate: float, duration_s: float, drain_s: float, **request: Any) -> dict[str, Any]:
    return {"name": name, "mode": "open", "rate": rate, "duration_s": duration_s, "drain_s": drain_s, **request}


def closed_phase(name: str, *, concurrency: int, duration_s: float, **request: Any) -> dict[str, Any]:
    return {"name": name, "mode": "closed", "concurrency": concurrency, "duration_s": duration_s, **request}


def measure_api(
    server: WebServer, workdir: Path, phase: dict[str, Any], *, warmup_s: float, expect_status: int
) -> dict[str, Any]:
    """One measured phase after a short warm-up at the same rate (or concurrency), in its own load process."""
    warm = dict(phase, name="warmup", duration_s=warmup_s, drain_s=2.0)
    results, info = run_load(server, [warm, phase], workdir)
    summary = summarize_phase(results[-1], expect_status=expect_status)
    summary.update(info)
    summary["warmup_ok"] = sum(1 for s in results[0].samples if s.status == expect_status)
    summary["created"] = sum(1 for r in results for s in r.samples if s.status == 201)
    return summary


# ------------------------------------------------------------------------------------------- the floor


def measure_direct(
    fn: Callable[[int], Any], *, name: str, rate: float | None, duration_s: float, drain_s: float = 0.0
) -> PhaseResult:
    """Call fn(i) at a fixed open-loop rate (latency from when each call was due), or back to back (rate None).

    At a fixed rate, calls still not started `drain_s` after the last one was due are recorded as unanswered.
    """
    samples: list[Sample] = []
    start = time.perf_counter()
    count = int(round(rate * duration_s)) if rate else None
    deadline = start + duration_s + (drain_s if rate else 0.0)
    i = 0
    while (i < count) if count is not None else (time.perf_counter() < deadline):
        due = start + i / rate if rate else time.perf_counter()
        if rate and time.perf_counter() > deadline:
            ended = time.perf_counter()
            for j in range(i, count or 0):
                late = start + j / rate
                samples.append(
                    Sample(due_s=late - start, latency_s=ended - late, lag_s=0.0, status=0, error="unanswered")
                )
            break
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent = time.perf_counter()
        status, error = 200, ""
        try:
            fn(i)
        except Exception as exc:  # noqa: BLE001 - counted as an error, like a failed request
            status, error = 0, type(exc).__name__
        samples.append(
            Sample(
                due_s=due - start,
                latency_s=time.perf_counter() - due,
                lag_s=max(0.0, sent - due),
                status=status,
                error=error,
            )
        )
        i += 1
    return PhaseResult(
        name=name, mode="open" if rate else "closed", samples=samples, wall_s=time.perf_counter() - start
    )


def direct_summary(result: PhaseResult) -> dict[str, Any]:
    summary = summarize_phase(result, expect_status=200)
    summary.pop("statuses", None)
    summary.pop("generator_cpu_s", None)
    return summary


# ------------------------------------------------------------------------------------------- database


def bench_database_url(url: str, name: str | None = None) -> str:
    """The benchmark's own database on the same server: ``<db>_bench_api`` (``<db>_api`` if <db> ends in _bench)."""
    parsed = urlparse(url)
    base = parsed.path.lstrip("/") or "trainyard"
    if not name:
        name = f"{base if base.endswith('_bench') else base + '_bench'}_api"
    if not re.fullmatch(r"[A-Za-z0-9_]{1,63}", name):
        raise SystemExit(f"bench: unusable database name {name!r}")
    return parsed._replace(path="/" + name).geturl()


def _admin_conninfo(url: str) -> str:
    return urlparse(url)._replace(path="/postgres").geturl().replace("postgres://", "postgresql://", 1)


def recreate_database(url: str) -> None:
    import psycopg
    from psycopg import sql

    name = urlparse(url).path.lstrip("/")
    with psycopg.connect(_admin_conninfo(url), autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_database(url: str) -> None:
    import psycopg
    from django.db import connections
    from psycopg import sql

    connections.close_all()
    name = urlparse(url).path.lstrip("/")
    with psycopg.connect(_admin_conninfo(url), autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trainyard.settings")
    import django

    django.setup()


def prepare_platform() -> dict[str, Any]:
    """Migrate, seed, and make one token for the demo user (a team member) and one for the admin (staff)."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from ops.seed import seed
    from quotas.tokens import token_create

    call_command("migrate", verbosity=0, interactive=False)
    seed(admin_password=secrets.token_urlsafe(16), demo_password=secrets.token_urlsafe(16))
    users = get_user_model().objects
    demo, admin = users.get(username="demo"), users.get(username="admin")
    _, demo_token = token_create(user=demo, name="bench-api")
    _, admin_token = token_create(user=admin, name="bench-api")
    return {"demo": demo, "admin": admin, "demo_token": demo_token, "admin_token": admin_token}


def fill_jobs(total: int, *, demo, seed_value: int = 7) -> dict[str, Any]:
    """Top the job table up to `total` rows with COPY: ten teams, a mix of states, 90 days of submissions."""
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from jobs import services
    from jobs.models import Job, written_fields
    from quotas.models import Membership, Queue, Team

    started = time.perf_counter()
    need = total - Job.objects.count()
    teams = [Team.objects.get(slug="demo")]
    User = get_user_model()
    owners = {teams[0].pk: demo}
    for n in range(1, EXTRA_TEAMS + 1):
        team = Team.objects.create(
            slug=f"bench-{n:02d}",
            name=f"Bench team {n:02d}",
            namespace=f"bench-{n:02d}",
            gpu_milli=4000,
            gpu_memory_mib=96 * 1024,
            cpu_milli=64000,
            memory_mib=256 * 1024,
        )
        user = User(username=f"bench-user-{n:02d}")
        user.set_unusable_password()
        user.save()
        Membership.objects.create(team=team, user=user)
        teams.append(team)
        owners[team.pk] = user
    Membership.objects.create(team=teams[1], user=demo)
    for queue in Queue.objects.all():
        queue.teams.add(*teams)
    template = services.job_validate(user=demo, data=dict(SUBMIT_BODY)).fields
    rng = random.Random(seed_value)
    states, weights = zip(*STATE_MIX, strict=True)
    now = timezone.now()
    fields = written_fields(Job)
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    # One row prepared the way the ORM would write it; each job then differs only in the columns set below.
    model_row = Job(**template, owner=demo, state="pending", submitted_at=now, request_fingerprint="bench")
    base_row = [f.get_db_prep_save(getattr(model_row, f.attname), connection) for f in fields]
    at = {f.attname: n for n, f in enumerate(fields)}
    copy_sql = f"COPY {Job._meta.db_table} ({columns}) FROM STDIN"
    with transaction.atomic(), connection.cursor() as cursor, cursor.cursor.copy(copy_sql) as copy:
        for i in range(max(0, need)):
            team = teams[i % len(teams)]
            state = rng.choices(states, weights)[0]
            submitted = now - timedelta(seconds=rng.uniform(60, 90 * 86400))
            row = list(base_row)
            row[at["id"]] = uuid.uuid4()
            row[at["name"]] = f"bench-{i}"
            row[at["team_id"]] = team.pk
            row[at["owner_id"]] = owners[team.pk].pk
            row[at["state"]] = state
            row[at["reason"]] = "queued" if state == "pending" else ""
            row[at["submitted_at"]] = submitted
            if state != "pending":
                admitted = submitted + timedelta(seconds=rng.uniform(1, 600))
                row[at["admitted_at"]] = admitted
                if state in ("running", "starting", "succeeded", "failed", "timed_out"):
                    row[at["started_at"]] = admitted + timedelta(seconds=5)
                if state in ("succeeded", "failed", "cancelled", "timed_out"):
                    row[at["finished_at"]] = admitted + timedelta(seconds=rng.uniform(60, 36000))
            copy.write_row(row)
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {Job._meta.db_table}")
    return {
        "inserted": max(0, need),
        "total": Job.objects.count(),
        "seconds": round(time.perf_counter() - started, 1),
        "teams": len(teams),
        "visible_to_demo": Job.objects.filter(team__in=teams[:2]).count(),
        "pending": Job.objects.filter(state="pending").count(),
        "vacuum_analyze": True,
    }


def enqueue_check(redis_url: str, queue_name: str) -> dict[str, Any]:
    """Submissions ask for a dispatch pass through `kernel.wake.dispatch_soon`, which coalesces: while a
    requested pass has not started (no worker takes them here) further requests send nothing, until the mark
    expires. So the run must have left at least one request and never more than one per job; the old check (one
    message per job) predates the coalescing and reported MISMATCH on a correct run."""
    import redis
    from django.conf import settings

    from jobs.models import Job
    from kernel.wake import dispatch_queue_name

    # The requests travel on the dispatch queue (kernel.wake), not the run's own: counting the latter found none.
    dispatch = dispatch_queue_name(queue_name, settings.TRAINYARD_DISPATCH_QUEUE)
    client = redis.Redis.from_url(redis_url)
    try:
        messages = int(client.llen(dispatch))
    finally:
        client.close()
    jobs = Job.objects.count()
    return {"jobs": jobs, "queue": dispatch, "messages": messages, "ok": 1 <= messages <= jobs}


def redis_cleanup(redis_url: str, queue_name: str) -> dict[str, int]:
    """Count the dispatch messages this run enqueued, then delete the run's own keys (queue, bindings, cache)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        queued = int(client.llen(queue_name))
        keys = set(client.scan_iter(match=f"{queue_name}*", count=1000))
        keys.add(f"_kombu.binding.{queue_name}".encode())
        deleted = int(client.delete(*keys)) if keys else 0
    finally:
        client.close()
    return {"messages_in_queue": queued, "keys_deleted": deleted}


# ------------------------------------------------------------------------------------------- phases


def bench_submit(server: WebServer, workdir: Path, cfg: Config, ctx: dict[str, Any]) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {ctx['demo_token']}"}
    request = {
        "method": "POST",
        "urls": ["/api/v1/jobs/"],
        "body": SUBMIT_BODY,
        "headers": headers,
        "idempotency_key": True,
    }
    out: dict[str, Any] = {}
    rate = cfg.submit_rate
    print(f"submit: {rate:g}/s for {cfg.submit_duration_s:g} s ...", flush=True)
    out["fixed_rate"] = measure_api(
        server,
        workdir,
        open_phase(
            "submit",
            rate=rate,
            duration_s=cfg.submit_duration_s,
            drain_s=cfg.drain_s(cfg.submit_duration_s),
            **request,
        ),
        warmup_s=cfg.warmup_s,
        expect_status=201,
    )
    out["fixed_rate"]["offered_rps"] = rate
    out["steps"] = []
    for step in cfg.steps:
        print(f"submit step: {step:g}/s for {cfg.step_duration_s:g} s ...", flush=True)
        row = measure_api(
            server,
            workdir,
            open_phase(
                f"step-{step:g}",
                rate=step,
                duration_s=cfg.step_duration_s,
                drain_s=cfg.drain_s(cfg.step_duration_s),
                **request,
            ),
            warmup_s=cfg.warmup_s,
            expect_status=201,
        )
        row["offered_rps"] = step
        out["steps"].append(row)
    print(f"submit max: {cfg.max_concurrency} clients back to back for {cfg.max_duration_s:g} s ...", flush=True)
    out["max"] = measure_api(
        server,
        workdir,
        closed_phase("max", concurrency=cfg.max_concurrency, duration_s=cfg.max_duration_s, **request),
        warmup_s=cfg.warmup_s,
        expect_status=201,
    )
    out["max"]["concurrency"] = cfg.max_concurrency
    out["knee_rps"] = _knee(out["steps"], SUBMIT_TARGET_P99_MS)
    return out


def _knee(steps: list[dict[str, Any]], p99_ms: float) -> float | None:
    """The highest offered rate the server kept up with (95% achieved, no errors) inside the p99 target."""
    kept = [
        s["offered_rps"]
        for s in steps
        if s["rps"] >= 0.95 * s["offered_rps"] and s["errors"] == 0 and s["p99_ms"] < p99_ms
    ]
    return max(kept) if kept else None


def floor_submit(cfg: Config, ctx: dict[str, Any], count: int) -> dict[str, Any]:
    """The bare work the endpoint cannot avoid: one Job row in its own transaction, then the enqueue."""
    from django.db import transaction

    from jobs import services
    from jobs.models import Job
    from jobs.states import JobState, PendingReason
    from jobs.tasks import dispatch_queue

    demo = ctx["demo"]
    fields = services.job_validate(user=demo, data=dict(SUBMIT_BODY)).fields
    fingerprint = services.request_fingerprint(dict(SUBMIT_BODY))
    queue_id = fields["queue"].pk

    def insert_and_enqueue(_i: int) -> None:
        with transaction.atomic(durable=True):
            Job.objects.create(
                owner=demo,
                idempotency_key=secrets.token_hex(16),
                request_fingerprint=fingerprint,
                state=JobState.PENDING,
                reason=PendingReason.QUEUED,
                **fields,
            )
            transaction.on_commit(lambda: dispatch_queue.delay(queue_id))

    duration = count / cfg.submit_rate
    print(f"floor submit: {count} inserts + enqueue at {cfg.submit_rate:g}/s, then back to back ...", flush=True)
    warm = measure_direct(insert_and_enqueue, name="warmup", rate=None, duration_s=cfg.warmup_s)
    fixed = direct_summary(
        measure_direct(
            insert_and_enqueue, name="floor", rate=cfg.submit_rate, duration_s=duration, drain_s=cfg.drain_s(duration)
        )
    )
    fixed["offered_rps"] = cfg.submit_rate
    most = direct_summary(
        measure_direct(insert_and_enqueue, name="floor-max", rate=None, duration_s=cfg.max_duration_s)
    )
    inserted = sum(1 for s in warm.samples if s.status == 200) + fixed["ok"] + most["ok"]
    return {
        "fixed_rate": fixed,
        "max": most,
        "inserted_total": inserted,
        "includes": "Job INSERT in its own transaction + dispatch_queue.delay after commit "
        "(no JobEvent, no validation, no auth, no HTTP)",
    }


def list_scenarios(server: WebServer, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """The list requests and, for each, the ORM query the endpoint cannot avoid."""
    from jobs import selectors
    from jobs.models import Job
    from quotas.models import Team

    demo, admin = ctx["demo"], ctx["admin"]
    newest = ("-submitted_at", "-id")
    limit = PAGE_SIZE + 1  # the cursor paginator reads one row more to know whether a next page exists
    first = f"/api/v1/jobs/?page_size={PAGE_SIZE}"
    demo_headers = {"Authorization": f"Bearer {ctx['demo_token']}"}
    cursor_urls: list[str] = []
    url = first
    with httpx.Client(base_url=server.base_url, headers=demo_headers, timeout=30) as client:
        for _ in range(4):
            response = client.get(url)
            response.raise_for_status()
            nxt = response.json().get("next")
            if not nxt:
                break
            parts = urlsplit(nxt)
            url = f"{parts.path}?{parts.query}"
            cursor_urls.append(url)
    demo_team = Team.objects.get(slug="demo").pk  # a floor knows the id the endpoint looks up by slug
    visible = selectors.jobs_visible_to(demo).order_by(*newest)
    boundaries = [visible[PAGE_SIZE * k - 1].submitted_at for k in range(1, len(cursor_urls) + 1)]

    def cursor_page(i: int) -> list[Job]:
        return list(visible.filter(submitted_at__lt=boundaries[i % len(boundaries)])[:limit])

    return [
        {
            "name": "list first page",
            "who": "demo (team member)",
            "urls": [first],
            "headers": demo_headers,
            "max": True,
            "floor": lambda _i: list(selectors.jobs_visible_to(demo).order_by(*newest)[:limit]),
        },
        {
            "name": "list cursor pages 2-5",
            "who": "demo (team member)",
            "urls": cursor_urls or [first],
            "headers": demo_headers,
            "floor": cursor_page,
        },
        {
            "name": "list state=pending",
            "who": "demo (team member)",
            "urls": [first + "&state=pending"],
            "headers": demo_headers,
            "floor": lambda _i: list(selectors.jobs_visible_to(demo).filter(state="pending").order_by(*newest)[:limit]),
        },
        {
            "name": "list team=demo",
            "who": "demo (team member)",
            "urls": [first + "&team=demo"],
            "headers": demo_headers,
            "floor": lambda _i: list(
                selectors.jobs_visible_to(demo).filter(team_id=demo_team).order_by(*newest)[:limit]
            ),
        },
        {
            "name": "list first page, staff",
            "who": "admin (staff: every job)",
            "urls": [first],
            "headers": {"Authorization": f"Bearer {ctx['admin_token']}"},
            "floor": lambda _i: list(selectors.jobs_visible_to(admin).order_by(*newest)[:limit]),
        },
    ]


def bench_list(server: WebServer, workdir: Path, cfg: Config, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for scenario in list_scenarios(server, ctx):
        print(f"{scenario['name']}: {cfg.list_rate:g}/s for {cfg.list_duration_s:g} s, then the floor ...", flush=True)
        request = {"method": "GET", "urls": scenario["urls"], "headers": scenario["headers"]}
        api = measure_api(
            server,
            workdir,
            open_phase(
                scenario["name"],
                rate=cfg.list_rate,
                duration_s=cfg.list_duration_s,
                drain_s=cfg.drain_s(cfg.list_duration_s),
                **request,
            ),
            warmup_s=cfg.warmup_s,
            expect_status=200,
        )
        api["offered_rps"] = cfg.list_rate
        fn = scenario["floor"]
        measure_direct(fn, name="warmup", rate=None, duration_s=0.5)
        floor = direct_summary(
            measure_direct(
                fn,
                name="floor",
                rate=cfg.list_rate,
                duration_s=cfg.list_duration_s,
                drain_s=cfg.drain_s(cfg.list_duration_s),
            )
        )
        floor["offered_rps"] = cfg.list_rate
        row = {"name": scenario["name"], "who": scenario["who"], "urls": scenario["urls"], "api": api, "floor": floor}
        if scenario.get("max"):  # the most list requests/s, for the first page only (keeps the run short)
            row["api_max"] = measure_api(
                server,
                workdir,
                closed_phase(
                    "max", concurrency=cfg.max_concurrency, duration_s=min(cfg.max_duration_s, 3.0), **request
                ),
                warmup_s=min(cfg.warmup_s, 0.5),
                expect_status=200,
            )
            row["api_max"]["concurrency"] = cfg.max_concurrency
            row["floor_max"] = direct_summary(
                measure_direct(fn, name="floor-max", rate=None, duration_s=min(cfg.max_duration_s, 3.0))
            )
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------- report


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 1) if b else None


def build_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per measured load: the API's figures, the floor's, their ratios, and the target verdict."""
    rows: list[dict[str, Any]] = []
    sub, flo = results["submit"], results["submit_floor"]
    fixed = sub["fixed_rate"]
    met = fixed["p99_ms"] < SUBMIT_TARGET_P99_MS and fixed["rps"] >= 0.95 * fixed["offered_rps"] and not fixed["errors"]
    rows.append(
        _row(
            f"submit @{fixed['offered_rps']:g}/s",
            fixed,
            flo["fixed_rate"],
            target=f"p99 < {SUBMIT_TARGET_P99_MS:g} ms at {SUBMIT_TARGET_RATE:g}/s",
            met=met,
        )
    )
    for step in sub["steps"]:
        rows.append(_row(f"  submit step {step['offered_rps']:g}/s", step, None))
    rows.append(_row(f"submit max ({sub['max']['concurrency']} clients)", sub["max"], flo["max"]))
    for item in results["list"]:
        met = (
            item["api"]["p99_ms"] < LIST_TARGET_P99_MS
            and not item["api"]["errors"]
            and item["api"]["rps"] >= 0.95 * item["api"]["offered_rps"]
        )
        rows.append(
            _row(
                f"{item['name']} @{item['api']['offered_rps']:g}/s",
                item["api"],
                item["floor"],
                target=f"p99 < {LIST_TARGET_P99_MS:g} ms",
                met=met,
            )
        )
        if "api_max" in item:
            rows.append(
                _row(
                    f"  {item['name']} max ({item['api_max']['concurrency']} clients)",
                    item["api_max"],
                    item["floor_max"],
                )
            )
    return rows


def _row(
    name: str, api: dict[str, Any], floor: dict[str, Any] | None, *, target: str = "", met: bool | None = None
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "scenario": name,
        "rps": api["rps"],
        "p50_ms": api["p50_ms"],
        "p99_ms": api["p99_ms"],
        "errors": api["errors"],
    }
    if floor is not None:
        row.update(
            floor_rps=floor["rps"],
            floor_p50_ms=floor["p50_ms"],
            floor_p99_ms=floor["p99_ms"],
            ratio_p50=_ratio(api["p50_ms"], floor["p50_ms"]),
            ratio_p99=_ratio(api["p99_ms"], floor["p99_ms"]),
            ratio_rps=_ratio(floor["rps"], api["rps"]),
        )
    if target:
        row.update(target=target, met=met)
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    def num(value: Any, fmt: str = "{:.1f}") -> str:
        return "-" if value is None else fmt.format(value)

    head = (
        f"{'scenario':<38} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'err':>4} │ {'floor/s':>8} {'p50 ms':>7} "
        f"{'p99 ms':>7} │ {'x p50':>6} {'x p99':>6} {'x r/s':>6} │ target"
    )
    print()
    print(head)
    print("─" * len(head))
    for r in rows:
        verdict = "" if "met" not in r else f"{r['target']}: {'MET' if r['met'] else 'MISSED'}"
        print(
            f"{r['scenario']:<38} {num(r['rps']):>7} {num(r['p50_ms'], '{:.2f}'):>7} {num(r['p99_ms'], '{:.2f}'):>7} "
            f"{r['errors']:>4} │ {num(r.get('floor_rps')):>8} {num(r.get('floor_p50_ms'), '{:.2f}'):>7} "
            f"{num(r.get('floor_p99_ms'), '{:.2f}'):>7} │ {num(r.get('ratio_p50')):>6} {num(r.get('ratio_p99')):>6} "
            f"{num(r.get('ratio_rps')):>6} │ {verdict}"
        )
    print("x p50 / x p99: API latency over the floor's; x r/s: the floor's most requests/s over the API's most.")


def _versions() -> dict[str, str]:
    import django
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg = cursor.fetchone()[0]
    return {
        "python": platform.python_version(),
        "django": django.get_version(),
        "postgres": pg,
        "uvicorn": _dist_version("uvicorn"),
        "httpx": _dist_version("httpx"),
    }


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return ""


QUICK = Config(
    submit_duration_s=3.0,
    steps=[50.0, 200.0],
    step_duration_s=2.0,
    max_duration_s=2.0,
    list_jobs=5000,
    list_duration_s=2.0,
    warmup_s=0.5,
)


def parse_args(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    full = Config()
    p = argparse.ArgumentParser(prog="python -m bench.api", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke run: short phases, 5,000 jobs, no JSON unless --out")
    p.add_argument("--out", type=Path, help=f"where to write the JSON (default {RESULTS_PATH.relative_to(REPO_ROOT)})")
    p.add_argument("--submit-rate", type=float, help=f"submissions/s of the main run (default {full.submit_rate:g})")
    p.add_argument("--submit-duration", type=float, help=f"seconds (default {full.submit_duration_s:g})")
    p.add_argument("--steps", help=f"step-test rates, comma-separated, '' to skip (default {_rates(full.steps)})")
    p.add_argument("--step-duration", type=float, help=f"seconds per step (default {full.step_duration_s:g})")
    p.add_argument("--list-jobs", type=int, help=f"rows in the job table for the list test (default {full.list_jobs})")
    p.add_argument("--list-rate", type=float, help=f"list requests/s (default {full.list_rate:g})")
    p.add_argument("--list-duration", type=float, help=f"seconds per list scenario (default {full.list_duration_s:g})")
    p.add_argument("--database-name", help="the benchmark database's name (default: <db>_bench_api)")
    p.add_argument("--keep-db", action="store_true", help="leave the benchmark database in place afterwards")
    p.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an extra environment variable for the web server only, to compare configurations (repeatable)",
    )
    args = p.parse_args(argv)
    cfg = replace(QUICK if args.quick else full)
    given = {
        "submit_rate": args.submit_rate,
        "submit_duration_s": args.submit_duration,
        "steps": None if args.steps is None else [float(r) for r in args.steps.split(",") if r.strip()],
        "step_duration_s": args.step_duration,
        "list_jobs": args.list_jobs,
        "list_rate": args.list_rate,
        "list_duration_s": args.list_duration,
    }
    return replace(cfg, **{k: v for k, v in given.items() if v is not None}), args


def _rates(rates: list[float]) -> str:
    return ",".join(f"{r:g}" for r in rates)


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(argv)
    out_path: Path | None = args.out or (None if args.quick else RESULTS_PATH)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    configured_db = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/trainyard")
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    db_url = bench_database_url(configured_db, args.database_name)
    run_id = secrets.token_hex(4)
    queue_name = f"bench-api-{run_id}"
    overrides = {
        "DATABASE_URL": db_url,
        "REDIS_URL": redis_url,
        "TRAINYARD_CELERY_QUEUE": queue_name,
        "TRAINYARD_CACHE_PREFIX": queue_name,
        "TRAINYARD_CHANNEL_PREFIX": queue_name,
        "TRAINYARD_RATE_SUBMIT": BENCH_RATE,
        "TRAINYARD_RATE_READ": BENCH_RATE,
        "TRAINYARD_RATE_WRITE": BENCH_RATE,
    }
    server_extra = dict(item.split("=", 1) for item in args.server_env)
    server_env = {**os.environ, **overrides, "PYTHONUNBUFFERED": "1", **server_extra}
    # This process only seeds and measures the floor; its own log lines would only clutter the table.
    os.environ.update(overrides, TRAINYARD_LOG_LEVEL="WARNING")
    print(
        f"bench api: database {urlparse(db_url).path.lstrip('/')}, celery queue {queue_name}, "
        f"{os.cpu_count()} cores, load average {_loadavg()}",
        flush=True,
    )
    recreate_database(db_url)
    setup_django()
    results: dict[str, Any] = {}
    started = time.time()
    cleanup: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp:
            workdir = Path(tmp)
            t = time.perf_counter()
            ctx = prepare_platform()
            print(f"migrated and seeded in {time.perf_counter() - t:.1f} s", flush=True)
            server = WebServer(server_env, workdir / "web.log")
            server.start()
            try:
                results["submit"] = bench_submit(server, workdir, cfg, ctx)
                same_count = int(round(cfg.submit_rate * cfg.submit_duration_s))
                results["submit_floor"] = floor_submit(cfg, ctx, same_count)
                results["enqueue_check"] = enqueue_check(redis_url, queue_name)
                print(f"filling the job table to {cfg.list_jobs:,} rows ...", flush=True)
                results["table"] = fill_jobs(cfg.list_jobs, demo=ctx["demo"])
                print(f"  {results['table']['inserted']:,} rows in {results['table']['seconds']} s", flush=True)
                results["list"] = bench_list(server, workdir, cfg, ctx)
            except Exception:
                print(server.log_tail(), file=sys.stderr)
                raise
            versions = _versions()
            results["server_log_lines"] = len(server.log_path.read_text(errors="replace").splitlines())
    finally:
        _terminate_children()
        try:
            cleanup = redis_cleanup(redis_url, queue_name)
        except Exception as exc:  # noqa: BLE001 - report, never mask the run's own error
            print(f"bench: could not clean Redis queue {queue_name}: {exc}", file=sys.stderr)
        if not args.keep_db:
            try:
                drop_database(db_url)
            except Exception as exc:  # noqa: BLE001
                print(f"bench: could not drop the benchmark database: {exc}", file=sys.stderr)
    rows = build_rows(results)
    print_table(rows)
    check = results["enqueue_check"]
    print(
        f"\nenqueue check: {check['jobs']} jobs submitted (API, warm-ups included, and floor), {check['messages']} "
        f"coalesced dispatch requests in Redis (1 to one per job expected): {'OK' if check['ok'] else 'MISMATCH'}. "
        f"Cleanup: {cleanup}."
    )
    from ops.processes import web_processes

    report = {
        "benchmark": "api",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1),
        "machine": {"cores": os.cpu_count(), "platform": platform.platform(), "loadavg_end": _loadavg(), **versions},
        "settings": {
            "server": "uvicorn trainyard.asgi:application (ops.processes 'web', as make run)",
            "web_processes": web_processes(server_env),
            "server_log": "INFO, console format, to a file",
            "server_env_extra": server_extra,
            "rate_limits": BENCH_RATE + " for submit/read/write (raised for the benchmark)",
            "load_generator": (
                f"separate process, its own HTTP/1.1 keep-alive client on uvloop, at most {MAX_IN_FLIGHT} in flight"
            ),
            "database": urlparse(db_url).path.lstrip("/"),
            "celery_queue": queue_name,
            "celery_worker": False,
            "submit_body": SUBMIT_BODY,
            "idempotency_key": "a fresh one per request",
            "config": cfg.__dict__,
            "state_mix": dict(STATE_MIX),
            "page_size": PAGE_SIZE,
            "latency": "open loop: from when each request was due to the end of its response body",
        },
        "targets": {
            "submit_p99_ms": SUBMIT_TARGET_P99_MS,
            "submit_rate": SUBMIT_TARGET_RATE,
            "list_p99_ms": LIST_TARGET_P99_MS,
            "list_table_jobs": LIST_TABLE_JOBS,
        },
        "rows": rows,
        "cleanup": cleanup,
        "results": results,
    }
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = out_path.with_suffix(".json.tmp")
        from bench.allocator import provenance

        report["process_model"] = PROCESS_MODEL
        report["provenance"] = provenance()
        tmp_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
        os.replace(tmp_path, out_path)
        print(f"wrote {out_path.relative_to(REPO_ROOT) if out_path.is_relative_to(REPO_ROOT) else out_path}")
    return 0 if all(r.get("met", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
