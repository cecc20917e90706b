"""Submission on a full database: ``POST /api/v1/jobs/`` next to a minimal authenticated DRF GET, in one run.

What runs: a database of its own (``<db>_bench_submit`` on the server of ``$DATABASE_URL``), migrated, seeded and
filled to 100,000 jobs (``bench.api.fill_jobs``: ten teams, a mix of states over 90 days) of which 5,000 wait in
the ``train`` queue and 6,900 running ones hold quota (``--holders``: about the trace's cluster full; 0 gives the
earlier runs' table, where none did); ``--keep-db`` leaves it in place and the next run reuses it (migrated again,
not refilled). Before the phases the database is vacuumed and a checkpoint taken: no work the set-up left runs
during them.
The real web server (``ops.processes`` "web", as ``make run`` starts it) on a loopback port, and the Celery worker
and the dispatcher as ``make run`` starts them (a prefork worker with ``TRAINYARD_WORKER_CONCURRENCY`` children,
one solo-pool dispatcher) on this run's own queues: the dispatcher admits what fits on the seeded inventory; nobody
starts the admitted attempts (their start queue has no consumer). The load comes from ``bench._load`` in a process
of its own, open loop (latency from when each request was due), with an API token of the demo user.

1. ``GET /api/v1/specs/shared/`` at 50/s (token auth, throttle, one row): the floor of an authenticated request.
2. ``POST /api/v1/jobs/`` at 50/s: validation, quota and image checks, the Job and event rows, the dispatch
   request after commit, and the right-sizing lookup of earlier runs (``monitoring.selectors.similar_runs``). The
   submitted command never ran in this history, but its labels did (the filled jobs carry the same ones): the
   lookup finds the team's ten newest runs by label, none with a usage profile, so no advice comes back.
3. The two again, in alternating windows (``--rounds`` pairs of ``--window`` s, a pause after each window): target
   submit p99 <= 2x the GET's p99, each pooled over its windows (``paired``). The ratio of phases 1 and 2 is kept
   as ``ratio_p99_sequential``: minutes apart, on a machine whose speed moves by half from one minute to the next,
   it compares two machines.
4. Submit steps (50, 100, 150, 200/s by default): the knee is the highest rate kept up with (95% achieved, no
   errors) with p99 within the same target, and within 100 ms (bench/api.py's submission target).
5. GET steps (100, 150, 200, 250/s by default), judged by the same limit: how far the floor itself holds on this
   machine (``get_knee_rps``), next to which the submission's knee can be read.

RSS of the web and worker processes (each process of its group, summed) is read before the first phase and after
the last. Results: ``bench/results/submit.json`` with the commit and the load average before and after each phase.

Run: ``make bench-submit`` (about 4 minutes the first time, 2 with ``--keep-db`` kept from an earlier run).
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bench._load import PhaseResult, summarize_phase
from bench.allocator import write_json
from bench.api import (
    SUBMIT_BODY,
    SUBMIT_TARGET_P99_MS,
    WebServer,
    _admin_conninfo,
    _children,
    _exit_on_signal,
    _loadavg,
    _terminate_children,
    bench_database_url,
    drop_database,
    measure_api,
    open_phase,
    recreate_database,
    redis_cleanup,
    run_load,
    setup_django,
)
from ops.processes import web_processes

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_PATH = REPO_ROOT / "bench" / "results" / "submit.json"
TABLE_JOBS = 100_000
WAITING = 5_000
BASE_RATE = 50.0
RATIO_TARGET = 2.0
KNEE_TARGET_RPS = 150.0
BENCH_RATE = "100000/s"  # no 429s: the throttle still runs on every request
# A command no job of the filled history ran: the right-sizing lookup has nothing to find.
BODY = {**SUBMIT_BODY, "name": "bench-submit", "command": ["python", "train.py", "--epochs", "5"]}
GET_URL = "/api/v1/specs/shared/"
PAIR_PAUSE_S = 0.5
HOLDERS = 6900  # about the jobs holding quota with the trace's cluster full (bench-scheduler's replay: 6,839)
PROCESS_MODEL = (
    "the web server (ops.processes 'web': uvicorn, one process per core), the prefork Celery worker and the "
    "solo-pool dispatcher as `make run` starts them; load from bench._load in a process of its own; PostgreSQL and "
    "Redis on the same machine"
)


def database_ready(url: str) -> bool:
    """Whether the benchmark database holds the filled table (a run with --keep-db left it); when it does not, it
    is made afresh."""
    import psycopg

    name = urlparse(url).path.lstrip("/")
    with psycopg.connect(_admin_conninfo(url), autocommit=True, connect_timeout=10) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None
    count = 0
    if exists:
        with psycopg.connect(url.replace("postgres://", "postgresql://", 1), connect_timeout=10) as conn:
            try:
                count = conn.execute("SELECT count(*) FROM jobs_job").fetchone()[0]
            except psycopg.errors.UndefinedTable:
                count = 0
    if count >= TABLE_JOBS:
        return True
    recreate_database(url)
    return False


def prepare(reuse: bool, holders: int = 0) -> dict[str, Any]:
    """Migrate; seed and fill unless reused; keep `WAITING` jobs waiting (the rest of the line cancelled, as if
    it had been cleared); `holders` of the running jobs holding quota (reserved), as on a full cluster, the rest
    not; one API token for the demo user."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.utils import timezone

    from bench.api import fill_jobs
    from jobs.models import Job
    from ops.seed import seed
    from quotas.tokens import token_create

    call_command("migrate", verbosity=0, interactive=False)
    table: dict[str, Any] = {"reused": reuse}
    if not reuse:
        seed(admin_password=secrets.token_urlsafe(16), demo_password=secrets.token_urlsafe(16))
        demo = get_user_model().objects.get(username="demo")
        table.update(fill_jobs(TABLE_JOBS, demo=demo))
    demo = get_user_model().objects.get(username="demo")
    extra = list(Job.objects.filter(state="pending").order_by("submitted_at").values_list("id", flat=True)[WAITING:])
    Job.objects.filter(id__in=extra).update(state="cancelled", reason="", finished_at=timezone.now())
    running = list(Job.objects.filter(state="running").order_by("id").values_list("id", flat=True))
    Job.objects.filter(id__in=running[:holders]).update(reserved=True)
    Job.objects.filter(id__in=running[holders:]).update(reserved=False)
    table["settled"] = settle_database()
    _, token = token_create(user=demo, name=f"bench-submit-{secrets.token_hex(3)}")
    table.update(
        jobs=Job.objects.count(),
        waiting=Job.objects.filter(state="pending").count(),
        holding=Job.objects.filter(reserved=True).count(),
    )
    return {"demo": demo, "token": token, "table": table}


def settle_database() -> dict[str, Any]:
    """Leave no work from this set-up for the measured phases: every table vacuumed and analysed after the fill and
    the updates above (the fill writes events, attempts and succeeded runs besides jobs; else autovacuum works through
    them on the same two cores as the phases), and a checkpoint, so that writing out the fill's pages is not left to
    one during a phase. A role that may not checkpoint says so."""
    from django.db import DatabaseError, connection

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE)")
        try:
            cursor.execute("CHECKPOINT")
            checkpoint = True
        except DatabaseError as exc:
            checkpoint = f"not run: {exc}".strip()
    return {"vacuum_analyze": True, "checkpoint": checkpoint, "seconds": round(time.perf_counter() - started, 1)}


def group_rss_mib(leader: subprocess.Popen) -> dict[str, Any]:
    """RSS of every process in `leader`'s process group (the server and its workers, a worker and its children)."""
    sizes = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != leader.pid:
                continue
            status = (stat.parent / "status").read_text()
        except (OSError, ValueError):
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                sizes.append(int(line.split()[1]) / 1024)
    return {"processes": len(sizes), "total_mib": round(sum(sizes), 1), "each_mib": sorted(round(s) for s in sizes)}


def _proc_stats() -> list[tuple[int, str, int, float]]:
    """(pid, command name, process group, CPU seconds) of every process this machine shows; a process's seconds
    include those of its children that ended and were waited for (PostgreSQL's server processes, one per
    connection, are counted in the postmaster's once they end)."""
    tick = os.sysconf("SC_CLK_TCK")
    rows = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, tail = stat.read_text().rsplit(")", 1)
        except OSError:
            continue
        fields = tail.split()
        cpu = sum(int(f) for f in fields[11:15]) / tick  # utime, stime, cutime, cstime
        rows.append((int(stat.parent.name), head.split("(", 1)[1], int(fields[2]), cpu))
    return rows


def cpu_by_group(leaders: dict[str, subprocess.Popen]) -> dict[str, float]:
    """CPU seconds used so far by each named process group, and by every PostgreSQL and Redis process of the machine
    (the embedded servers: their processes' own names)."""
    totals = dict.fromkeys([*leaders, "postgres", "redis"], 0.0)
    groups = {proc.pid: name for name, proc in leaders.items()}
    for _pid, comm, pgrp, cpu in _proc_stats():
        if pgrp in groups:
            totals[groups[pgrp]] += cpu
        elif comm == "postgres":
            totals["postgres"] += cpu
        elif comm.startswith("redis-server"):
            totals["redis"] += cpu
    return totals


def measured(leaders: dict[str, subprocess.Popen], fn, *args, **kwargs) -> dict[str, Any]:
    """`fn`'s phase summary with the CPU milliseconds per answered request of each process group beside the web
    server's (`cpu_ms_per_request`): where a submission's cost lands (the dispatcher's passes, PostgreSQL)."""
    before = cpu_by_group(leaders)
    row = fn(*args, **kwargs)
    after = cpu_by_group(leaders)
    answered = sum(n for code, n in row.get("statuses", {}).items() if str(code) != "0")
    answered += row.get("warmup_ok", 0)
    row["cpu_ms_per_request"] = {
        name: round((after[name] - before[name]) / answered * 1000, 2) if answered else None for name in after
    }
    return row


def start_workers(env: dict[str, str], log_path: Path) -> list[subprocess.Popen]:
    """The worker and the dispatcher as `make run` starts them (ops.processes), each leading its process group."""
    from ops import processes

    log = open(log_path, "ab")  # noqa: SIM115 - handed to the children
    procs = []
    for name in ("worker", "dispatcher"):
        proc = subprocess.Popen(
            [sys.executable, "-m", *processes.command(name, environ=env)],
            env={**env, **processes.environment(name, env)},
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=processes.lower_priority(name, env),
        )
        _children.append(proc)
        procs.append(proc)
    return procs


def wait_for_workers(worker: subprocess.Popen, children: int, limit_s: float = 120.0) -> float:
    """Wait until the prefork worker has its children (it is consuming), then a few seconds for its start-up
    work (the reconcile); returns how long that took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s and worker.poll() is None:
        if group_rss_mib(worker)["processes"] >= children + 1:
            break
        time.sleep(0.5)
    time.sleep(3)
    return round(time.monotonic() - t0, 1)


def paired(server: WebServer, workdir: Path, get: dict, post: dict, *, rounds: int, window_s: float) -> dict:
    """The GET and the submission at 50/s in alternating windows of `window_s` (GET first in even rounds, the
    submission first in odd ones), `PAIR_PAUSE_S` of quiet after each so that what one window set going (a dispatch
    pass) is over before the next begins; each kind's samples pooled over its windows.

    Two phases run one after the other compare two machines when the machine's speed moves from minute to minute
    (this machine's `python_loop_ms` went 41 -> 71 -> 44 in three readings 5 s apart): windows a few seconds apart
    see the same one. The per-round ratios show how much one window pair can say on its own."""
    phases = [
        open_phase("warm-get", rate=BASE_RATE, duration_s=1.0, drain_s=2.0, **get),
        open_phase("warm-submit", rate=BASE_RATE, duration_s=1.0, drain_s=2.0, **post),
    ]
    for i in range(rounds):
        pair = [("get", get), ("submit", post)]
        for kind, request in pair if i % 2 == 0 else pair[::-1]:
            phase = open_phase(f"{kind}-{i}", rate=BASE_RATE, duration_s=window_s, drain_s=2.0, **request)
            phases.append({**phase, "pause_after_s": PAIR_PAUSE_S})
    results, info = run_load(server, phases, workdir)
    measured_windows = results[2:]
    out: dict[str, Any] = {"rounds": rounds, "window_s": window_s, "pause_s": PAIR_PAUSE_S}
    load = {"loadavg_before": info["loadavg_before"], "loadavg_after": info["loadavg_after"]}  # of all the windows
    for kind, status in (("get", 200), ("submit", 201)):
        windows = [r for r in measured_windows if r.name.startswith(f"{kind}-")]
        pooled = PhaseResult(
            name=kind,
            mode="open",
            samples=[sample for r in windows for sample in r.samples],
            wall_s=sum(r.wall_s for r in windows),
        )
        out[kind] = {**summarize_phase(pooled, expect_status=status), **load}
        out[f"{kind}_p99_by_round"] = [summarize_phase(r, expect_status=status)["p99_ms"] for r in windows]
    get_p99 = out["get"]["p99_ms"]
    out["ratio_p99"] = round(out["submit"]["p99_ms"] / get_p99, 2) if get_p99 else None
    out["ratio_p99_by_round"] = [
        round(sub / g, 2) if g else None
        for g, sub in zip(out["get_p99_by_round"], out["submit_p99_by_round"], strict=True)
    ]
    return out


def knee(steps: list[dict[str, Any]], p99_ms: float) -> float | None:
    """The highest offered rate kept up with (95% achieved, no errors) with p99 within `p99_ms`."""
    kept = [
        s["offered_rps"]
        for s in steps
        if s["rps"] >= 0.95 * s["offered_rps"] and not s["errors"] and s["p99_ms"] <= p99_ms
    ]
    return max(kept) if kept else None


def lookup_cost(ctx: dict[str, Any]) -> dict[str, Any]:
    """The right-sizing lookup for one submission of the benchmark's body, timed in this process (median of 20)."""
    from jobs.models import Job
    from monitoring.selectors import recommendation_for

    job = Job.objects.filter(name=BODY["name"]).order_by("-submitted_at").first()
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        recommendation_for(job)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {"median_ms": round(times[len(times) // 2], 2), "max_ms": round(times[-1], 2)}


def run_environment(prefix: str) -> tuple[str, str, dict[str, str]]:
    """The benchmark database's URL (``<db>_bench_submit`` on the server of ``$DATABASE_URL``), a queue name of this
    run's own and the environment its processes get (also applied to this process): the run's own Celery, cache
    and channel prefixes, a start queue nobody consumes, rate limits that never answer 429."""
    configured = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/trainyard")
    base = urlparse(configured).path.lstrip("/") or "trainyard"
    db_url = bench_database_url(configured, f"{base}_bench_submit")
    queue = f"{prefix}-{secrets.token_hex(4)}"
    overrides = {
        "DATABASE_URL": db_url,
        "TRAINYARD_CELERY_QUEUE": queue,
        "TRAINYARD_START_QUEUE": f"{queue}-starts",  # nobody consumes it: admitted attempts are not started
        "TRAINYARD_START_OVERDUE_S": str(10**8),  # nor re-driven by the reconciler
        "TRAINYARD_CACHE_PREFIX": queue,
        "TRAINYARD_CHANNEL_PREFIX": queue,
        "TRAINYARD_RATE_SUBMIT": BENCH_RATE,
        "TRAINYARD_RATE_READ": BENCH_RATE,
        "TRAINYARD_RATE_WRITE": BENCH_RATE,
        "TRAINYARD_LOG_LEVEL": "WARNING",
    }
    os.environ.update(overrides)
    return db_url, queue, {**os.environ, "PYTHONUNBUFFERED": "1"}


def clean_up(env: dict[str, str], queue: str, db_url: str, *, keep_db: bool) -> dict:
    """After a run: its processes stopped, its Redis queue emptied (what was removed; a failure is said, never
    masking the run's own error) and, unless kept, its database dropped."""
    _terminate_children()
    removed: dict = {}
    try:
        removed = redis_cleanup(env["REDIS_URL"], queue) if "REDIS_URL" in env else {}
    except Exception as exc:  # noqa: BLE001 - report, never mask the run's own error
        print(f"bench: could not clean Redis queue {queue}: {exc}", file=sys.stderr)
    if not keep_db:
        drop_database(db_url)
    return removed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.submit", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=RESULTS_PATH)
    p.add_argument("--duration", type=float, default=10.0, help="seconds of the GET and the submit phase at 50/s")
    p.add_argument("--steps", default="50,100,150,200", help="submit step rates, comma-separated")
    p.add_argument(
        "--get-steps", default="100,150,200,250", help="GET step rates after the submit steps (the floor's own knee)"
    )
    p.add_argument("--step-duration", type=float, default=6.0)
    p.add_argument("--rounds", type=int, default=5, help="window pairs of the paired GET/submission measurement")
    p.add_argument("--window", type=float, default=2.0, help="seconds of each window of the paired measurement")
    p.add_argument("--keep-db", action="store_true", help="leave the database for the next run to reuse")
    p.add_argument(
        "--holders",
        type=int,
        default=HOLDERS,
        help=f"running jobs holding quota, as on a full cluster (default {HOLDERS}, about the trace's; 0: none)",
    )
    args = p.parse_args(argv)
    steps = [float(r) for r in args.steps.split(",") if r.strip()]
    get_steps = [float(r) for r in args.get_steps.split(",") if r.strip()]
    signal.signal(signal.SIGTERM, _exit_on_signal)
    db_url, queue, env = run_environment("bench-submit")
    reuse = database_ready(db_url)
    setup_django()
    started = time.time()
    results: dict[str, Any] = {
        "benchmark": "submit (a 100,000-job database, the real web server and workers)",
        "process_model": PROCESS_MODEL,
    }
    try:
        with tempfile.TemporaryDirectory(prefix="bench-submit-") as tmp:
            workdir = Path(tmp)
            t0 = time.perf_counter()
            ctx = prepare(reuse, args.holders)
            results["table"] = {**ctx["table"], "prepare_s": round(time.perf_counter() - t0, 1)}
            print(f"bench submit: {ctx['table']} in {results['table']['prepare_s']} s, load {_loadavg()}", flush=True)
            server = WebServer(env, workdir / "web.log")
            server.start()
            workers = start_workers(env, workdir / "worker.log")
            ready_s = wait_for_workers(workers[0], int(env.get("TRAINYARD_WORKER_CONCURRENCY", "4")))
            results["worker_ready_s"] = ready_s
            rss = {"start": {"web": group_rss_mib(server.proc), "worker": group_rss_mib(workers[0])}}
            rss["start"]["dispatcher"] = group_rss_mib(workers[1])
            headers = {"Authorization": f"Bearer {ctx['token']}"}
            get = {"method": "GET", "urls": [GET_URL], "headers": headers}
            post = {"method": "POST", "urls": ["/api/v1/jobs/"], "body": BODY, "headers": headers}
            post["idempotency_key"] = True
            drain = max(2.0, args.duration / 2)
            print(f"GET {GET_URL} at {BASE_RATE:g}/s for {args.duration:g} s ...", flush=True)
            leaders = {"worker": workers[0], "dispatcher": workers[1]}
            results["get"] = measured(
                leaders,
                measure_api,
                server,
                workdir,
                open_phase("get", rate=BASE_RATE, duration_s=args.duration, drain_s=drain, **get),
                warmup_s=1.0,
                expect_status=200,
            )
            print(f"POST /api/v1/jobs/ at {BASE_RATE:g}/s for {args.duration:g} s ...", flush=True)
            results["submit"] = measured(
                leaders,
                measure_api,
                server,
                workdir,
                open_phase("submit", rate=BASE_RATE, duration_s=args.duration, drain_s=drain, **post),
                warmup_s=1.0,
                expect_status=201,
            )
            print(f"GET and POST in {args.rounds} alternating pairs of {args.window:g} s windows ...", flush=True)
            results["paired"] = paired(server, workdir, get, post, rounds=args.rounds, window_s=args.window)
            for key, kind, rates, request, status in (
                ("steps", "submit", steps, post, 201),
                ("get_steps", "GET", get_steps, get, 200),
            ):
                results[key] = []
                for rate in rates:
                    print(f"{kind} step {rate:g}/s for {args.step_duration:g} s ...", flush=True)
                    row = measured(
                        leaders,
                        measure_api,
                        server,
                        workdir,
                        open_phase(
                            f"{key}-{rate:g}",
                            rate=rate,
                            duration_s=args.step_duration,
                            drain_s=max(2.0, args.step_duration / 2),
                            **request,
                        ),
                        warmup_s=0.5,
                        expect_status=status,
                    )
                    row["offered_rps"] = rate
                    results[key].append(row)
            rss["end"] = {
                "web": group_rss_mib(server.proc),
                "worker": group_rss_mib(workers[0]),
                "dispatcher": group_rss_mib(workers[1]),
            }
            results["rss"] = rss
            results["lookup"] = lookup_cost(ctx)
            crashed = [p.args[2] for p in workers if p.poll() is not None]
            results["workers_exited"] = crashed
    finally:
        results["redis_cleanup"] = clean_up(env, queue, db_url, keep_db=args.keep_db)
    get_p99, sub_p99 = results["get"]["p99_ms"], results["submit"]["p99_ms"]
    limit = RATIO_TARGET * get_p99
    results["ratio_p99_sequential"] = round(sub_p99 / get_p99, 2) if get_p99 else None
    results["ratio_p99"] = results["paired"]["ratio_p99"]
    results["knee_rps"] = knee(results["steps"], limit)
    results["knee_rps_100ms"] = knee(results["steps"], SUBMIT_TARGET_P99_MS)
    results["get_knee_rps"] = knee(results["get_steps"], limit)
    results["targets"] = {
        "ratio_p99": RATIO_TARGET,
        "ratio_p99_met": results["ratio_p99"] is not None and results["ratio_p99"] <= RATIO_TARGET,
        "knee_rps": KNEE_TARGET_RPS,
        "knee_rps_met": (results["knee_rps"] or 0) >= KNEE_TARGET_RPS,
    }
    results["environment"] = {
        "cpu_count": os.cpu_count(),
        "loadavg_end": _loadavg(),
        "duration_s": round(time.time() - started, 1),
        "web_processes": web_processes(env),
        "worker_concurrency": int(env.get("TRAINYARD_WORKER_CONCURRENCY", "4")),
    }
    write_json(args.out, results)
    print_table(results)
    print(f"wrote {args.out}")
    return 0


def print_table(r: dict[str, Any]) -> None:
    def line(name: str, row: dict[str, Any]) -> str:
        load = row.get("loadavg_before", [None])[0]
        return (
            f"{name:<28} {row['rps']:>7.1f}/s  p50 {row['p50_ms']:>8.1f} ms  p99 {row['p99_ms']:>8.1f} ms  "
            f"errors {row['errors']:>3}  load {load}"
        )

    print()
    print(line(f"GET {GET_URL} @{BASE_RATE:g}/s", r["get"]))
    print(line(f"POST /api/v1/jobs/ @{BASE_RATE:g}/s", r["submit"]))
    for s in r["steps"]:
        print(line(f"  submit step {s['offered_rps']:g}/s", s))
    for s in r.get("get_steps", []):
        print(line(f"  GET step {s['offered_rps']:g}/s", s))
    print("CPU ms per request (web server; worker, dispatcher, PostgreSQL, Redis: every process of each):")
    rows = [("GET", r["get"]), ("POST", r["submit"])] + [(f"step {s['offered_rps']:g}/s", s) for s in r["steps"]]
    rows += [(f"GET step {s['offered_rps']:g}/s", s) for s in r.get("get_steps", [])]
    for name, row in rows:
        groups = "  ".join(f"{k} {v}" for k, v in row.get("cpu_ms_per_request", {}).items())
        print(f"  {name:<14} web {row['server_cpu_ms_per_request']}  {groups}")
    pair = r["paired"]
    print(f"paired, {pair['rounds']} rounds of {pair['window_s']:g} s windows each way, pooled:")
    print(line(f"  GET @{BASE_RATE:g}/s", pair["get"]))
    print(line(f"  POST @{BASE_RATE:g}/s", pair["submit"]))
    print(f"  p99 ratio by round: {pair['ratio_p99_by_round']}")
    verdict = "met" if r["targets"]["ratio_p99_met"] else "NOT met"
    print(f"submit p99 / GET p99, paired: {r['ratio_p99']} (target <= {RATIO_TARGET:g}: {verdict}); ", end="")
    print(f"the two phases above, one after the other: {r['ratio_p99_sequential']}")
    verdict = "met" if r["targets"]["knee_rps_met"] else "NOT met"
    print(f"knee (p99 <= 2x GET p99): {r['knee_rps']}/s (target >= {KNEE_TARGET_RPS:g}/s: {verdict}); ", end="")
    print(f"within {SUBMIT_TARGET_P99_MS:g} ms: {r['knee_rps_100ms']}/s")
    if r.get("get_steps"):
        print(f"the GET's own knee by the same limit (2x its p99 at {BASE_RATE:g}/s): {r['get_knee_rps']}/s")
    for when in ("start", "end"):
        parts = ", ".join(f"{k} {v['total_mib']} MiB ({v['processes']} processes)" for k, v in r["rss"][when].items())
        print(f"RSS at {when}: {parts}")
    print(f"right-sizing lookup for one submission: {r['lookup']}")


if __name__ == "__main__":
    raise SystemExit(main())
