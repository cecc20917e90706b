"""Live scheduler benchmark: the dispatch path production runs, on the trace's whole GPU cluster.

What runs: a dedicated database (``<db>_bench_scheduler`` on the server of ``$DATABASE_URL``, dropped and created
afresh, migrated, seeded); the openb trace's 1,213 GPU nodes and 6,212 GPUs as Node/GPU rows (cluster nodes: host
CPU and memory reserved per job); jobs submitted through ``job_submit`` (full validation, Job and event rows), and
the real dispatcher (``jobs.store`` -> ``scheduler.dispatch.run_pass``) deciding and writing.

1. Replay: the trace's GPU pods (CPU-only pods are not jobs on this platform and are left out; the in-memory side
   leaves them out too) inflated by resampling to 105% of the GPU capacity and shuffled (seed 0), submitted in
   arrival order to one backfill queue, then dispatched until a pass admits nothing. Reported: admissions per
   second of dispatch time, and the unallocated GPU share when the arrived GPU requests reach 100% of capacity,
   next to the in-memory ``Allocator`` fed the same requests in the same order with the same workload.
2. Backlog passes: 1,000 / 5,000 / 20,000 waiting jobs that do not fit (trace shapes on the full cluster, copied
   from submitted jobs by bulk insert to keep the set-up short), a pass each: total time, the pool lock's hold
   time (the write), queries per pass. The first pass writes every reason and position; the second is steady.
3. Latency: 5,000 jobs waiting, the cluster emptied, 100 submissions/s for 20 s through ``job_submit`` in this
   processes of their own (two, two threads each, as web processes would) while a real Celery worker process runs
   the coalesced dispatch passes; submit-to-admitted p50/p99 from the rows' own timestamps, and each pass's
   timings from the worker's log.

Run: ``make bench-scheduler`` (``--quick`` for a smaller replay). Results: ``bench/results/scheduler.json``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform as py_platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.allocator import NODE_FILE, POD_FILE, arrivals, load_trace, trace_dir_from_env, write_json
from bench.api import bench_database_url, drop_database, recreate_database, setup_django

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "scheduler.json"
TARGETS = {"admissions_per_s": 1000.0, "pass_5000_ms": 250.0, "submit_p99_s": 1.0, "share_gap_pp": 0.1}
GPU_MIB = 32 * 1024


class QueryCounter:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, execute, sql, params, many, context):
        self.n += 1
        return execute(sql, params, many, context)


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    k = max(0, min(len(ordered) - 1, int(round(pct / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def trace_present(trace_dir: Path, benchmark: str) -> bool:
    """Whether the trace's node and pod files are there; says which are missing when not."""
    missing = [f for f in (NODE_FILE, POD_FILE) if not (trace_dir / f).is_file()]
    if missing:
        print(f"{benchmark} benchmark skipped: trace not found ({', '.join(missing)} missing in {trace_dir})")
    return not missing


def own_database(url_name: str, *, fresh: bool = True) -> str:
    """A database of the benchmark's own (``<db>_bench_<url_name>``, created afresh unless `fresh` is False) and
    Celery queues nobody else consumes (nothing starts the admitted attempts: the benchmark plays the backend, or
    none is needed). Returns the database URL, also set as DATABASE_URL."""
    configured = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/trainyard")
    url = bench_database_url(configured, f"{(configured.rsplit('/', 1)[-1] or 'trainyard')}_bench_{url_name}")
    if fresh:
        recreate_database(url)
    os.environ["DATABASE_URL"] = url
    os.environ["TRAINYARD_START_QUEUE"] = f"bench-{url_name}-starts"
    os.environ["TRAINYARD_CELERY_QUEUE"] = f"bench-{url_name}-{os.getpid()}"
    os.environ.setdefault("TRAINYARD_LOG_LEVEL", "WARNING")  # thousands of submission lines would hide the table
    return url


def seeded_cluster(url_name: str, trace_dir: Path, *, eight_gpu_nodes: int):
    """A fresh benchmark database (`own_database`), migrated and seeded, with the first `eight_gpu_nodes` of the
    trace's 8-GPU nodes as Node/GPU rows. Returns (database URL, the seeded demo user, capacity in GPUs, every node
    of the trace)."""
    url = own_database(url_name=url_name)
    setup_django()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from ops.seed import seed

    call_command("migrate", verbosity=0, interactive=False)
    seed(admin_password="bench-admin-pass", demo_password="bench-demo-pass")
    user = get_user_model().objects.get(username="demo")
    nodes, _ = load_trace(trace_dir)
    big = [n for n in nodes if n.num_gpus == 8][:eight_gpu_nodes]
    load_cluster(big)
    return url, user, sum(n.num_gpus for n in big), nodes


def load_cluster(nodes) -> None:
    from cluster.models import GPU, Node

    Node.objects.all().delete()
    rows = Node.objects.bulk_create(
        [
            Node(
                name=n.name,
                backend="volcano",
                driver_version="550.54.15",
                cuda_version="12.4",
                cpu_milli=n.cpu_milli,
                memory_mib=n.memory_mib or 0,
            )
            for n in nodes
        ]
    )
    GPU.objects.bulk_create(
        [
            GPU(node=row, uuid=f"GPU-{n.name}-{i}", index=i, model=n.gpu_model or "unknown", memory_mib=GPU_MIB)
            for n, row in zip(nodes, rows, strict=True)
            for i in range(n.num_gpus)
        ]
    )


def job_body(req) -> dict:
    body = {
        "team": "demo",
        "queue": "train",
        "image": "python-3.11",
        "command": ["true"],
        "spec": None,
        "gpu_milli": req.gpu_milli,
        "gpu_memory_mib": 1,
        "cpu_milli": max(1, req.cpu_milli),
        "memory_mib": max(1, req.memory_mib),
    }
    if req.num_gpus > 1:
        body["gpus"] = req.num_gpus
    if req.gpu_model:
        body["gpu_models"] = sorted(req.gpu_model)
    return body


def open_queue() -> None:
    from quotas.models import Queue, Team

    big = {"gpu_milli": 2 * 10**9, "gpu_memory_mib": 10**12, "cpu_milli": 2 * 10**9, "memory_mib": 10**12}
    Team.objects.filter(slug="demo").update(**big, max_running_jobs=10**7, max_jobs_per_user=10**7)
    Queue.objects.filter(name="train").update(**big, ordering="backfill", allow_explicit_request=True)


def run_passes(*, max_passes: int = 50) -> list:
    from jobs.store import dispatch

    reports = []
    for _ in range(max_passes):
        report = dispatch()
        reports.append(report)
        if report.admitted == 0:
            break
    return reports


def replay(user, nodes, pods, seed: int, limit: int | None) -> dict:
    from django.db import connection

    from jobs.models import Job
    from jobs.services import job_submit
    from scheduler import dispatch as scheduler
    from scheduler import policy
    from scheduler.pool import current

    gpu_pods = [p for p in pods if p.num_gpus]
    capacity = policy.FULL_MILLI * sum(n.num_gpus for n in nodes)
    sequence = arrivals(gpu_pods, capacity, random.Random(seed))
    if limit:
        sequence = sequence[:limit]
    t0 = time.perf_counter()
    ids = []
    for req in sequence:
        job, _ = job_submit(user=user, data=job_body(req))
        ids.append(job.id)
    submit_s = time.perf_counter() - t0
    print(f"replay: submitted {len(ids)} jobs through job_submit in {submit_s:.1f} s", flush=True)

    counter = QueryCounter()
    scheduler.reset()
    with connection.execute_wrapper(counter):
        t1 = time.perf_counter()
        reports = run_passes()
        dispatch_s = time.perf_counter() - t1
    admitted = sum(r.admitted for r in reports)

    # The unallocated share at 100% arrived, live: from the admitted rows, in arrival order.
    state = dict(Job.objects.filter(id__in=ids).values_list("id", "state"))
    live_share = share_at_capacity(sequence, [state[i] == "admitted" for i in ids], capacity)

    # The in-memory allocator on the same requests, order and workload.
    pool = current()
    weights = dict(pool.workload.weights)
    cluster = [policy.Node.empty(n.name, n.num_gpus, n.cpu_milli, n.memory_mib, n.gpu_model, GPU_MIB) for n in nodes]
    cluster.sort(key=lambda n: n.name)
    alloc = policy.Allocator(cluster, "fgd", policy.Workload(weights))
    c0 = time.process_time()
    t2 = time.perf_counter()
    placed = []
    for req in sequence:
        request = policy.Request(
            req.num_gpus,
            req.gpu_milli,
            max(1, req.cpu_milli),
            max(1, req.memory_mib),
            1 if req.gpu_milli < 1000 else 0,
            req.gpu_model,
        )
        placed.append(alloc.place(request) is not None)
    mem_s, mem_cpu_s = time.perf_counter() - t2, time.process_time() - c0
    memory_share = share_at_capacity(sequence, placed, capacity)
    same = sum(1 for a, b in zip(placed, [state[i] == "admitted" for i in ids], strict=True) if a == b)
    return {
        "jobs_submitted": len(ids),
        "submit_s": round(submit_s, 1),
        "passes": len(reports),
        "admitted": admitted,
        "dispatch_s": round(dispatch_s, 3),
        "admissions_per_s": round(admitted / dispatch_s, 1) if dispatch_s else None,
        "first_pass": {
            "read_ms": round(reports[0].read_s * 1000, 1),
            "decide_ms": round(reports[0].decide_s * 1000, 1),
            "write_ms": round(reports[0].write_s * 1000, 1),
        },
        "queries": counter.n,
        "queries_per_pass": round(counter.n / len(reports), 1),
        "live_unallocated_pct_at_100": round(live_share, 3),
        "in_memory_unallocated_pct_at_100": round(memory_share, 3),
        "gap_pp": round(abs(live_share - memory_share), 3),
        "same_outcome_jobs": same,
        "in_memory_decisions_per_s": round(len(sequence) / mem_s, 1),
        "in_memory_decisions_per_cpu_s": round(len(sequence) / mem_cpu_s, 1) if mem_cpu_s else None,
    }


def share_at_capacity(sequence, placed: list[bool], capacity: int) -> float:
    arrived = allocated = 0
    for req, ok in zip(sequence, placed, strict=True):
        demand = req.gpu_demand_milli
        if arrived + demand >= capacity:
            got = allocated + ((capacity - arrived) if ok else 0)
            return 100.0 * (capacity - got) / capacity
        arrived += demand
        if ok:
            allocated += demand
    return 100.0 * (capacity - allocated) / capacity


def backlog(user, pods, sizes: list[int]) -> list[dict]:
    """Waiting jobs that do not fit, copied (bulk insert) from jobs submitted through job_submit."""
    from django.db import connection

    from jobs.models import Job
    from jobs.services import job_submit
    from jobs.store import dispatch
    from scheduler import dispatch as scheduler

    rng = random.Random(1)
    templates = []
    for req in rng.sample([p for p in pods if p.num_gpus], 200):
        job, _ = job_submit(user=user, data=job_body(req))
        templates.append(job)
    run_passes()  # whatever of them fits is admitted; the rest wait
    big = [p for p in pods if p.num_gpus >= 4] or [p for p in pods if p.num_gpus]
    submitted = len(templates)
    while Job.objects.filter(state="pending").count() < 50 and submitted < 6000:
        # A cluster with room left (a short replay) takes every sample: fill it with multi-card jobs first.
        for req in rng.choices(big, k=100):
            job_submit(user=user, data=job_body(req))
        submitted += 100
        run_passes()
    waiting = list(Job.objects.filter(state="pending"))
    if not waiting:
        raise SystemExit("bench: the cluster took every template job; nothing to build a backlog from")
    rows = []
    out = []
    have = Job.objects.filter(state="pending").count()
    for size in sizes:
        need = size - have
        fields = [f.name for f in Job._meta.concrete_fields if f.name not in {"id", "submitted_at"}]
        while need > 0:
            batch = []
            for _ in range(min(need, 2000)):
                src = rng.choice(waiting)
                clone = Job(**{f: getattr(src, f) for f in fields})
                clone.pk = None
                clone.idempotency_key = None
                clone.queue_position = None
                clone.reason = "queued"
                batch.append(clone)
            for clone in batch:
                import uuid

                clone.id = uuid.uuid4()
            Job.objects.bulk_create(batch)
            need -= len(batch)
        have = Job.objects.filter(state="pending").count()
        # The backlog is old work: its submission times move an hour back (order kept), as a real backlog's are.
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE jobs_job SET submitted_at = submitted_at - interval '1 hour' "
                "WHERE state = 'pending' AND submitted_at > now() - interval '30 minutes'"
            )
        scheduler.reset()
        row = {"waiting": have}
        for label, full in (("first", True), ("steady", True), ("steady_again", True), ("nothing_new", False)):
            counter = QueryCounter()
            with connection.execute_wrapper(counter):
                report = dispatch(full=full)
            row[label] = {
                "pass_ms": round(report.total_s * 1000, 1),
                "lock_hold_ms": round(report.write_s * 1000, 1),
                "read_ms": round(report.read_s * 1000, 1),
                "decide_ms": round(report.decide_s * 1000, 1),
                "admitted": report.admitted,
                "placement_calls": report.placement_calls,
                "shape_cache_hits": report.shape_hits,
                "queries": counter.n,
                "fast": report.fast,
            }
        print(
            f"backlog {have:>6}: first pass {row['first']['pass_ms']:8.1f} ms "
            f"(lock {row['first']['lock_hold_ms']:.1f} ms), steady {row['steady']['pass_ms']:7.1f} ms "
            f"({row['steady']['queries']} queries)",
            flush=True,
        )
        rows.append(row)
        out = rows
    del rows
    return out


def _submitter(user_id, request, start: float, rate: float, ks: range, results) -> None:
    """One submitting process (forked): submits jobs number `ks` each at `start + k / rate` (wall clock), in two
    threads, and sends back (job ids, how late each submission started)."""
    from concurrent.futures import ThreadPoolExecutor

    from django.contrib.auth import get_user_model
    from django.db import connection

    from jobs.services import job_submit

    user = get_user_model().objects.get(pk=user_id)
    lag: list[float] = []

    def submit_one(k: int):
        due = start + k / rate
        now = time.time()
        if due > now:
            time.sleep(due - now)
        lag.append(max(0.0, time.time() - due))
        try:
            return str(job_submit(user=user, data=job_body(request))[0].id)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as pool:
        ids = list(pool.map(submit_one, ks))
    results.put((ids, lag))


def _passes_logged(path: Path) -> dict:
    """The worker's dispatch passes during the latency phase, from its log lines."""
    import ast
    import json

    rows = []
    for line in path.read_text(errors="replace").splitlines():
        if "dispatch_pass" not in line or "{" not in line:
            continue
        body = line[line.index("{") : line.rindex("}") + 1]
        try:  # a JSON line, or the event dict as Celery's own log format prints it
            rows.append(json.loads(body) if '"event"' in body else ast.literal_eval(body))
        except (ValueError, SyntaxError):
            continue
    path.unlink(missing_ok=True)
    totals = [r.get("total_ms", 0.0) for r in rows]
    return {
        "logged": len(rows),
        "fast": sum(1 for r in rows if r.get("fast")),
        "admitted": sum(r.get("admitted", 0) for r in rows),
        "total_ms_p50": round(percentile(totals, 50), 1),
        "total_ms_p99": round(percentile(totals, 99), 1),
        "total_ms_max": round(max(totals), 1) if totals else None,
        **{
            f"{phase}_ms_p50": round(percentile([r.get(f"{phase}_ms", 0.0) for r in rows], 50), 1)
            for phase in ("read", "decide", "write", "waits")
        },
        "note": "passes that admitted something or took over 1 s (the worker logs those)",
    }


def latency(user, *, rate: float, seconds: float, waiting: int, model: str = "T4", processes: int = 2) -> dict:
    """`rate` submissions/s for `seconds` while `waiting` jobs wait. The full cluster is split by GPU model, as
    teams often are: the waiting jobs (the trace shapes that no longer fit) are pinned to the other models, the
    `model` cards are emptied (their jobs cancelled, releasing them) and the new jobs, small shares, are pinned to
    them. Submitter processes pace the arrivals; a real Celery worker process runs the coalesced passes."""

    from django.conf import settings
    from django.db import connection

    from cluster.models import GPU
    from jobs.lifecycle import job_cancel
    from jobs.models import Attempt, Job
    from scheduler import policy

    others = sorted(set(GPU.objects.exclude(model=model).values_list("model", flat=True)))
    Job.objects.filter(state="pending").update(gpu_models=others)
    on_model = set(
        Attempt.objects.filter(
            job__state="admitted", slices__gpu__model=model, slices__released_at__isnull=True
        ).values_list("job_id", flat=True)
    )
    for job_id in on_model:
        job_cancel(job_id=job_id, actor="bench")
    pending = Job.objects.filter(state="pending").count()
    env = {
        **os.environ,
        "TRAINYARD_CELERY_QUEUE": settings.CELERY_TASK_DEFAULT_QUEUE,
        "TRAINYARD_LOG_LEVEL": "INFO",  # its dispatch_pass lines give each pass's timings
        "TRAINYARD_LOG_FORMAT": "json",
    }
    worker_log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - open for the worker's whole life, closed below
        prefix="bench-scheduler-worker-", suffix=".log", delete=False
    )
    # The worker and the dispatcher exactly as `make run` starts them (ops.processes: a prefork worker with
    # TRAINYARD_WORKER_CONCURRENCY children, default 4, and one solo-pool dispatcher consuming the dispatch queue),
    # on this run's queues; both log into one file.
    worker = subprocess.Popen(
        [sys.executable, "-m", *worker_command(env), "-Q", settings.CELERY_TASK_DEFAULT_QUEUE],
        cwd=REPO,
        env=env,
        stdout=worker_log,
        stderr=subprocess.STDOUT,
    )
    dispatcher = subprocess.Popen(
        [sys.executable, "-m", *dispatcher_command(env)],
        cwd=REPO,
        env=env,
        stdout=worker_log,
        stderr=subprocess.STDOUT,
    )
    small = policy.Request.fraction(100, cpu_milli=1000, memory_mib=1024, gpu_model=model)
    n = int(rate * seconds)
    warm_s = warm_up(dispatcher)
    start = time.time() + 2
    # Submitters in processes of their own, as web processes are: one Python process could not offer 100/s
    # while sharing its interpreter lock four ways (the earlier threads-only run fell 61 s behind).
    connection.close()
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    children = [
        context.Process(target=_submitter, args=(user.pk, small, start, rate, range(k, n, processes), results))
        for k in range(processes)
    ]
    for child in children:
        child.start()
    ids: list = []
    lag: list[float] = []
    try:
        for _ in children:
            got_ids, got_lag = results.get(timeout=seconds * 20 + 120)
            ids += got_ids
            lag += got_lag
        for child in children:
            child.join(timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not Job.objects.filter(id__in=ids, state="pending").exists():
                break
            time.sleep(0.2)
        rows = list(Job.objects.filter(id__in=ids).values_list("submitted_at", "admitted_at", "state"))
    finally:
        for process in (dispatcher, worker):
            process.terminate()
        for process in (dispatcher, worker):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        worker_log.close()
    passes = _passes_logged(Path(worker_log.name))
    waits = [(a - s).total_seconds() for s, a, _state in rows if a is not None]
    return {
        "rate_per_s": rate,
        "seconds": seconds,
        "waiting_before": pending,
        "submitted": len(ids),
        "admitted": len(waits),
        "still_pending": sum(1 for *_x, state in rows if state == "pending"),
        "p50_s": round(percentile(waits, 50), 3),
        "p99_s": round(percentile(waits, 99), 3),
        "max_s": round(max(waits), 3) if waits else None,
        "submitter_lag_p99_s": round(percentile(lag, 99), 3),
        "submitter_processes": processes,
        "passes": passes,
        "worker_first_pass_s": warm_s,
        "note": "submit-to-admitted from the Job rows' submitted_at and admitted_at; new jobs are 1/10-card "
        f"shares pinned to the emptied {model} cards, the waiting ones to the other models; the dispatch passes "
        "run in the dispatcher process of `make run` (a solo-pool Celery worker on the dispatch queue) woken by the "
        "coalesced requests, beside the 4-child prefork worker; the dispatcher's first pass (loading the pool, "
        "reading every line: worker_first_pass_s) runs before the arrivals start",
        "emptied_jobs": len(on_model),
        "waiting": waiting,
    }


ESTIMATE_TARGET_P99_MS = 300.0


def _clone_jobs(template, n: int, rng: random.Random, **fields) -> int:
    """`n` copies of `template` (bulk insert, 2,000 a statement) with `fields` set on each; callables in
    `fields` are called per copy. Returns how many were written."""
    import uuid

    from jobs.models import Job

    names = [f.name for f in Job._meta.concrete_fields if f.name not in {"id", "submitted_at"}]
    written = 0
    while written < n:
        batch = []
        for _ in range(min(n - written, 2000)):
            clone = Job(**{f: getattr(template, f) for f in names})
            clone.id = uuid.uuid4()
            clone.idempotency_key = None
            clone.queue_position = None
            for key, value in fields.items():
                setattr(clone, key, value(rng) if callable(value) else value)
            batch.append(clone)
        Job.objects.bulk_create(batch)
        written += len(batch)
    return written


# What runs the estimates phase: the pages' and APIs' own views, middleware and templates, in the benchmark's process.
ESTIMATES_PROCESS_MODEL = (
    "the pages and APIs through Django's test client in the benchmark's process (the views, middleware, templates and "
    "Redis cache a web process uses; no HTTP server); PostgreSQL and Redis on the same machine"
)


def estimates(user, *, total_jobs: int, holders: int, requests: int, profile: bool = False) -> dict:
    """Every page and API that shows an estimated start, on the fleet as the other phases left it, topped up to
    `total_jobs` jobs (the rest finished work of the last 30 days, in a handful of commands so the history has
    hits) and `holders` jobs holding capacity; each read `requests` times through Django's test client (the
    whole middleware, view and template stack in this process, no network), logged in as the waiting jobs'
    owner. p50/p99/max per page."""
    from datetime import timedelta

    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment
    from django.utils import timezone

    from jobs.models import Job

    setup_test_environment()  # the test client's host name is allowed; nothing else of it is used

    rng = random.Random(3)
    now = timezone.now()
    waiting = list(Job.objects.filter(state="pending").order_by("-priority", "submitted_at", "id"))
    if not waiting:
        raise SystemExit("bench: nothing waits; the estimates phase needs a line")
    template = waiting[0]
    held = Job.objects.filter(reserved=True).count()
    commands = [["python", "train.py", f"--config=c{k}.yaml"] for k in range(8)]
    added_holders = history = 0
    if held < holders:
        # Jobs that hold capacity without slices: the estimate reads reserved jobs, not the ledger (a short
        # replay leaves fewer than a full cluster holds). Said in the result.
        added_holders = _clone_jobs(
            template,
            holders - held,
            rng,
            state="running",
            reserved=True,
            reason="",
            command=lambda r: r.choice(commands),
            admitted_at=lambda r: now - timedelta(seconds=r.uniform(60, 6 * 3600)),
            started_at=lambda r: now - timedelta(seconds=r.uniform(30, 6 * 3600)),
        )
    present = Job.objects.count()
    if present < total_jobs:
        history = _clone_jobs(
            template,
            total_jobs - present,
            rng,
            state="succeeded",
            reserved=False,
            reason="",
            command=lambda r: r.choice(commands),
            finished_at=lambda r: now - timedelta(seconds=r.uniform(60, 29 * 86400)),
        )
        with connection.cursor() as cursor:  # each ran 5 minutes to 8 hours
            cursor.execute(
                "UPDATE jobs_job SET started_at = finished_at - (interval '1 second' * (300 + random() * 28500)), "
                "admitted_at = finished_at - interval '9 hours' WHERE state = 'succeeded' AND started_at IS NULL"
            )
            cursor.execute("ANALYZE jobs_job")
    waiting_job = waiting[len(waiting) // 2]
    queue = waiting_job.queue.name
    client = Client()
    client.force_login(user)
    pages = {
        "queue page": f"/queues/{queue}/",
        "queue list": "/queues/",
        "submit form": "/jobs/new/",
        "GET /api/v1/queues/{name}/": f"/api/v1/queues/{queue}/",
        "waiting job page": f"/jobs/{waiting_job.id}/",
        "GET /api/v1/jobs/{id}/": f"/api/v1/jobs/{waiting_job.id}/",
    }
    rows = {}
    if profile:  # where one request of each page spends its time (--profile-estimates), before the timed reads
        import cProfile
        import pstats

        for label, url in pages.items():
            profiler = cProfile.Profile()
            profiler.runcall(client.get, url)
            print(f"--- {label}")
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    # As the web process does (kernel/gctune.py): once its pages have been built, what is alive is frozen, so full
    # collections do not walk it. This process also holds the replay's trace; unfrozen, collections of it paused
    # a read now and then for up to 200 ms of CPU.
    import gc

    from jobs import selectors as job_selectors

    for url in pages.values():
        client.get(url)
    gc.collect()
    gc.freeze()
    for label, url in pages.items():
        # The worker's refresh (jobs.refresh_estimates) keeps a fleet's estimates fresh; none runs here, so the
        # benchmark refreshes them before each page, off the timed reads, lest they expire midway.
        job_selectors.estimates_compute(waiting_job.queue)
        times, cpu = [], []
        for k in range(requests + 2):
            t0, c0 = time.perf_counter(), time.process_time()
            response = client.get(url, HTTP_ACCEPT="application/json" if "/api/" in url else "text/html")
            elapsed = (time.perf_counter() - t0) * 1000
            if response.status_code != 200:
                raise SystemExit(f"bench: {url} answered {response.status_code}")
            if k >= 2:  # the first two warm the process's caches, as a serving process's are
                times.append(elapsed)
                cpu.append((time.process_time() - c0) * 1000)
        rows[label] = {
            "url": url.replace(str(waiting_job.id), "{id}"),
            "p50_ms": round(percentile(times, 50), 1),
            "p99_ms": round(percentile(times, 99), 1),
            "max_ms": round(max(times), 1),
            # This process's CPU per request (Python: views, templates, serialisers; not PostgreSQL's or Redis's):
            # what a loaded machine does not inflate the way it inflates the wall clock.
            "cpu_p50_ms": round(percentile(cpu, 50), 1),
            "cpu_p99_ms": round(percentile(cpu, 99), 1),
            "bytes": len(response.content),
        }
        print(
            f"estimates: {label:28} p50 {rows[label]['p50_ms']:8.1f} ms  p99 {rows[label]['p99_ms']:8.1f} ms  "
            f"(CPU p50 {rows[label]['cpu_p50_ms']:.1f} ms)",
            flush=True,
        )
    # A read that finds no kept answer (nobody read the queue for ESTIMATE_KEEP_S, or Redis lost it) computes the
    # estimates itself, as the first read after a quiet spell does: three such reads of each page.
    from django.core.cache import cache

    for label, url in pages.items():
        times = []
        for _ in range(3):
            cache.delete(job_selectors._estimates_key(waiting_job.queue_id))
            t0 = time.perf_counter()
            response = client.get(url, HTTP_ACCEPT="application/json" if "/api/" in url else "text/html")
            times.append((time.perf_counter() - t0) * 1000)
            if response.status_code != 200:
                raise SystemExit(f"bench: {url} answered {response.status_code}")
        rows[label]["no_kept_answer_ms"] = {"p50": round(percentile(times, 50), 1), "max": round(max(times), 1)}
        print(f"estimates: {label:28} without a kept answer: p50 {rows[label]['no_kept_answer_ms']['p50']:8.1f} ms")
    # What the kept answer costs to compute (the worker's refresh, jobs.refresh_estimates), per queue with a line.
    from jobs import selectors
    from quotas.models import Queue

    compute_ms = {}
    for q in Queue.objects.all():
        if Job.objects.filter(queue=q, state="pending").exists():
            t0 = time.perf_counter()
            selectors.estimates_compute(q)
            compute_ms[q.name] = round((time.perf_counter() - t0) * 1000, 1)
    print(f"estimates: computing a queue's estimates (the worker's refresh): {compute_ms} ms", flush=True)
    return {
        "refresh_compute_ms": compute_ms,
        "jobs": Job.objects.count(),
        "waiting": Job.objects.filter(state="pending").count(),
        "holding": Job.objects.filter(reserved=True).count(),
        "holders_inserted_without_slices": added_holders,
        "finished_history_inserted": history,
        "requests_per_page": requests,
        "waiting_job_position": len(waiting) // 2 + 1,
        "pages": rows,
        "target_p99_ms": ESTIMATE_TARGET_P99_MS,
        "met": all(r["p99_ms"] <= ESTIMATE_TARGET_P99_MS for r in rows.values()),
        "note": "Django's test client in the benchmark's process (middleware, views, templates; no network, no "
        "uvicorn), its objects frozen after a first read of every page as the web process freezes its own "
        "(kernel/gctune.py), the queue's estimates refreshed before each page as the worker refreshes them; a line "
        "this long costs more than jobs.selectors.ESTIMATE_SLOW_S to estimate, so after the first "
        "request the pages read the kept estimates while a worker recomputes them (refresh_compute_ms: what that "
        "costs, off the request path); the waiting job is the middle of the line; holders_inserted_without_slices "
        "are reserved rows added when the replay left fewer holders than a full cluster has (the estimate reads "
        "reserved jobs); no_kept_answer_ms: three reads of each page right after the kept answer was deleted, so the "
        "read computes the estimates itself (the first read after ESTIMATE_KEEP_S without one); not part of p50/p99",
    }


def estimates_only(args) -> int:
    """The estimates phase again on the fleet an earlier run kept (`--keep-database`): the fixture costs minutes to
    build, a page's profile seconds. The database is migrated first, so new indexes are measured too."""
    import psycopg

    from bench.api import _admin_conninfo

    url = own_database(url_name="scheduler", fresh=False)
    name = url.rsplit("/", 1)[-1]
    with psycopg.connect(_admin_conninfo(url), autocommit=True, connect_timeout=10) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            raise SystemExit(f"bench: no database {name}; run once with --keep-database first")
    setup_django()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    user = get_user_model().objects.get(username="demo")
    results = {
        "benchmark": "scheduler (live path), the estimates phase only, on the database a run kept",
        "process_model": ESTIMATES_PROCESS_MODEL,
        "estimates": estimates(
            user, total_jobs=100_000, holders=6900, requests=10 if args.quick else 30, profile=args.profile_estimates
        ),
    }
    results["environment"] = _environment(args)
    write_json(args.output, results)
    print(f"wrote {args.output}")
    return 0


def worker_command(environ=os.environ) -> list[str]:
    from ops import processes

    return processes.command("worker", environ=environ)


def dispatcher_command(environ=os.environ) -> list[str]:
    from ops import processes

    return processes.command("dispatcher", environ=environ)


def ledger_overbooked() -> list[str]:
    """Cards and nodes the committed ledger books past what they hold (scheduler.pool.overbooked): must be []."""
    from cluster.models import Node
    from scheduler.pool import overbooked

    nodes = list(Node.objects.values_list("id", flat=True))
    return overbooked(node_ids=nodes, host_node_ids=nodes)


PROCESS_MODEL = {
    "replay": "dispatch passes in the benchmark's own process (one pool in memory), called back to back",
    "backlog": "dispatch passes in the benchmark's own process",
    "latency": "the worker and the dispatcher started as `make run` starts them (a prefork worker with "
    "TRAINYARD_WORKER_CONCURRENCY children, default 4, and one solo-pool dispatcher process that runs every pass), "
    "woken by the coalesced dispatch requests of 2 submitting processes; no beat, so no periodic reconcile during "
    "the run",
    "estimates": "pages and API reads through Django's test client in the benchmark's own process",
}


def warm_up(worker: subprocess.Popen, timeout: float = 300.0) -> float:
    """Wait until the new worker has run its first pass (the pool loaded into its memory, every line read), as a
    worker that has been up for a while has: arrivals then measure the steady path, not a process start.
    Returns how long that first pass took, start-up included."""
    from django.core.cache import cache
    from django.db import connection

    from kernel import wake
    from scheduler.dispatch import PASS_LOCK_KEY

    t0 = time.monotonic()
    wake.dispatch_soon()
    deadline = t0 + timeout
    while cache.get(wake.wake_key()) is not None:  # the worker has taken the request when the mark goes
        if time.monotonic() > deadline or worker.poll() is not None:
            raise RuntimeError("the benchmark's Celery worker never ran a pass")
        time.sleep(0.05)
    time.sleep(0.5)  # it takes the pass lock just after clearing the mark
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [PASS_LOCK_KEY])
            if cursor.fetchone()[0]:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [PASS_LOCK_KEY])
                return round(time.monotonic() - t0, 3)
        time.sleep(0.05)
    raise RuntimeError("the benchmark worker's first pass did not end")


def format_table(results: dict) -> str:
    """The run's figures with their targets; the in-memory allocator's beside the live ones."""
    r, t, lat = results["replay"], results["targets"], results["latency"]
    rows = [
        ("admissions/s over the replay (live)", f"{r['admissions_per_s']:,.0f}", ">= 1,000", t["admissions_per_s_met"]),
        ("  in-memory allocator, same inputs", f"{r['in_memory_decisions_per_s']:,.0f} decisions/s", "", None),
    ]
    for b in results["backlog"]:
        rows.append(
            (
                f"pass over {b['waiting']:,} waiting (steady; first)",
                f"{b['steady']['pass_ms']:.0f} ms; {b['first']['pass_ms']:.0f} ms "
                f"(lock {b['first']['lock_hold_ms']:.0f} ms), {b['steady']['queries']} queries",
                "<= 250 ms at 5,000" if b["waiting"] == 5000 else "",
                t["pass_5000_met"] if b["waiting"] == 5000 else None,
            )
        )
    rows += [
        (
            f"submit-to-admitted at {lat['rate_per_s']:.0f}/s, {lat['waiting_before']:,} waiting",
            f"p50 {lat['p50_s']:.2f} s, p99 {lat['p99_s']:.2f} s",
            "p99 <= 1 s",
            t["submit_p99_met"],
        ),
        (
            "unallocated GPU share at 100% arrived (live)",
            f"{r['live_unallocated_pct_at_100']:.2f}%",
            "within 0.1 pp of in-memory",
            t["share_gap_met"],
        ),
        ("  in-memory allocator, same inputs", f"{r['in_memory_unallocated_pct_at_100']:.2f}%", "", None),
        ("queries per replay pass", f"{r['queries_per_pass']}", "", None),
        (
            "cards/nodes over-booked in the ledger",
            f"{len(results.get('ledger_overbooked', [])) + len(r.get('ledger_overbooked', []))}",
            "0",
            t.get("ledger_overbooked_met"),
        ),
    ]
    est = results.get("estimates")
    if est:
        for label, page in est["pages"].items():
            rows.append(
                (
                    f"{label} ({est['jobs']:,} jobs, {est['waiting']:,} waiting)",
                    f"p50 {page['p50_ms']:.0f} ms, p99 {page['p99_ms']:.0f} ms",
                    f"p99 <= {est['target_p99_ms']:.0f} ms",
                    page["p99_ms"] <= est["target_p99_ms"],
                )
            )
    width = max(len(a) for a, *_ in rows)
    out = []
    for name, value, target, met in rows:
        verdict = "" if met is None else ("met" if met else "NOT met")
        out.append(f"{name:<{width}}  {value:<42} {target:<28} {verdict}")
    return "\n".join(out)


def _environment(args) -> dict:
    return {
        "python": py_platform.python_version(),
        "cpu_count": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "quick": args.quick,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 2,000-job replay and smaller backlogs")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--keep-database", action="store_true")
    parser.add_argument("--profile-estimates", action="store_true", help="print a profile of each estimate page")
    parser.add_argument(
        "--estimates-only",
        action="store_true",
        help="only the estimates phase, on the database an earlier run left with --keep-database (migrated first)",
    )
    args = parser.parse_args(argv)
    if args.estimates_only:
        return estimates_only(args)

    trace_dir = trace_dir_from_env()
    if not trace_present(trace_dir, "scheduler"):
        return 1 if os.environ.get("CI") == "true" else 0
    url = own_database(url_name="scheduler")
    # The deployed refresh settings (TRAINYARD_WORKLOAD_REFRESH_S as configured, default 300 s): a benchmark that
    # needs a longer cache to pass measures something else.
    # Nobody starts the admitted attempts here (there is no backend): the latency phase's worker must not spend
    # its first minutes "restarting" thousands of them (the reconciler runs on every worker start).
    os.environ["TRAINYARD_START_OVERDUE_S"] = str(10**8)
    setup_django()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from ops.seed import seed

    call_command("migrate", verbosity=0, interactive=False)
    seed(admin_password="bench-admin-pass", demo_password="bench-demo-pass")
    user = get_user_model().objects.get(username="demo")
    nodes, pods = load_trace(trace_dir)
    load_cluster(nodes)
    open_queue()
    print(f"cluster: {len(nodes)} nodes, {sum(n.num_gpus for n in nodes)} GPUs as rows", flush=True)
    results: dict = {"benchmark": "scheduler (live path)"}
    try:
        results["replay"] = replay(user, nodes, pods, 0, 2000 if args.quick else None)
        r = results["replay"]
        r["ledger_overbooked"] = ledger_overbooked()
        print(
            f"replay: {r['admitted']} admitted in {r['dispatch_s']} s of dispatch = {r['admissions_per_s']}/s; "
            f"unallocated at 100%: live {r['live_unallocated_pct_at_100']}% vs in-memory "
            f"{r['in_memory_unallocated_pct_at_100']}% (gap {r['gap_pp']} pp); {r['queries_per_pass']} queries/pass",
            flush=True,
        )
        sizes = [1000, 5000] if args.quick else [1000, 5000, 20000]
        results["backlog"] = backlog(user, pods, sizes)
        # Latency with 5,000 waiting: trim the backlog to 5,000 first.
        from jobs.models import Job

        extra = list(Job.objects.filter(state="pending").values_list("id", flat=True)[5000:])
        for start in range(0, len(extra), 5000):
            Job.objects.filter(id__in=extra[start : start + 5000]).delete()
        results["latency"] = latency(user, rate=100.0, seconds=10.0 if args.quick else 20.0, waiting=5000)
        results["ledger_overbooked"] = ledger_overbooked()
        lat = results["latency"]
        results["estimates"] = estimates(
            user, total_jobs=100_000, holders=6900, requests=10 if args.quick else 30, profile=args.profile_estimates
        )
        print(f"latency at 100/s with {lat['waiting_before']} waiting: p50 {lat['p50_s']} s, p99 {lat['p99_s']} s")
    finally:
        if not args.keep_database:
            drop_database(url)
    pass5000 = next((b for b in results.get("backlog", []) if b["waiting"] >= 5000), None)
    results["targets"] = {
        **TARGETS,
        "admissions_per_s_met": (results["replay"]["admissions_per_s"] or 0) >= TARGETS["admissions_per_s"],
        "pass_5000_met": pass5000 is not None and pass5000["steady"]["pass_ms"] <= TARGETS["pass_5000_ms"],
        "submit_p99_met": results["latency"]["p99_s"] <= TARGETS["submit_p99_s"],
        "share_gap_met": results["replay"]["gap_pp"] <= TARGETS["share_gap_pp"],
        "estimate_p99_ms": ESTIMATE_TARGET_P99_MS,
        "estimate_p99_met": results["estimates"]["met"],
    }
    results["process_model"] = {
        **PROCESS_MODEL,
        "worker_concurrency": int(os.environ.get("TRAINYARD_WORKER_CONCURRENCY", "4")),
        "workload_refresh_s": float(os.environ.get("TRAINYARD_WORKLOAD_REFRESH_S", "300")),
    }
    results["targets"]["ledger_overbooked_met"] = not results["ledger_overbooked"] and not r.get("ledger_overbooked")
    results["environment"] = _environment(args)
    write_json(args.output, results)
    print(format_table(results))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
