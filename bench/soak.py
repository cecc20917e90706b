"""An hour of steady use through the processes `make run` starts: is the memory of each one flat?

What runs: the submission benchmark's database (``<db>_bench_submit``: 100,000 jobs, 5,000 waiting in ``train``;
``bench.submit.prepare``, reused when a ``make bench-submit ARGS=--keep-db`` left it), the real web server, the
prefork Celery worker, the solo-pool dispatcher and beat as ``make run`` starts them (``ops.processes``; beat's
schedule file in the run's temporary folder), on queues of the run's own. Nobody starts the admitted attempts.

Each window (``--window``, 60 s by default) is one plan for ``bench._load`` in a process of its own:
submissions at ``--rate`` per second (open loop, as ``bench.submit`` sends them) for most of the window, then reads
of what a user polls: the job pages (``GET /api/v1/jobs/{id}/`` with its estimate) of the window's submissions,
the queue with its estimates (``GET /api/v1/queues/train/``) and the job list. After the window every job it
submitted is cancelled through the API (``POST /api/v1/jobs/{id}/cancel/``, four clients at a time), so the line
stays at the database's 5,000 and the cards the dispatcher booked are given back, as a busy day's churn would.

After each window: the resident memory (RSS) of each process group (a server or worker with its children), the
window's latencies and the load average. Flat means: the last window's RSS within 10% (and 32 MiB) of the RSS
after the warm-up window (the first ``--warmup`` windows fill caches and import lazily; they are reported, not
judged). Results: ``bench/results/soak.json`` with the commit, the process model and the load average.

Run: ``make bench-soak`` (an hour; ``ARGS="--duration 600"`` for ten minutes).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.allocator import write_json
from bench.api import (
    WebServer,
    _children,
    _exit_on_signal,
    _loadavg,
    open_phase,
    run_load,
    setup_django,
    summarize_phase,
)
from bench.submit import BODY, clean_up, database_ready, group_rss_mib, prepare, run_environment, wait_for_workers

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_PATH = REPO_ROOT / "bench" / "results" / "soak.json"
FLAT_RATIO = 0.10
FLAT_SLACK_MIB = 32.0
PROCESS_MODEL = (
    "the web server (ops.processes 'web': uvicorn, one process per core), the prefork Celery worker, the solo-pool "
    "dispatcher and beat as `make run` starts them; load from bench._load in a process of its own, cancels from "
    "the benchmark's process over HTTP; PostgreSQL and Redis on the same machine"
)


def start_processes(env: dict[str, str], workdir: Path) -> dict[str, subprocess.Popen]:
    """The worker, the dispatcher and beat as `make run` starts them (ops.processes), each leading its group."""
    from ops import processes

    log = open(workdir / "processes.log", "ab")  # noqa: SIM115 - handed to the children
    started = {}
    for name in ("worker", "dispatcher", "beat"):
        argv = [sys.executable, "-m", *processes.command(name, environ=env)]
        if name == "beat":  # its schedule file beside the run's other files, not the developer's var/
            argv += ["--schedule", str(workdir / "celerybeat-schedule")]
        proc = subprocess.Popen(
            argv,
            env={**env, **processes.environment(name, env)},
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _children.append(proc)
        started[name] = proc
    return started


def rss_now(procs: dict[str, subprocess.Popen]) -> dict[str, float]:
    return {name: group_rss_mib(proc)["total_mib"] for name, proc in procs.items()}


def submitted_ids(name: str) -> list[str]:
    """The ids of the jobs a window made and nobody ended yet: the load generator keeps no answers, so they are
    read back by the window's job name."""
    from jobs.models import Job

    live = Job.objects.filter(name=name, state__in=("pending", "admitted"))
    return [str(job_id) for job_id in live.values_list("id", flat=True)]


def cancel_all(base_url: str, token: str, ids: list[str], *, clients: int = 4) -> dict[str, int]:
    """Cancel each job over the API, as users would (`clients` at a time); returns the answers by status."""
    from collections import Counter
    from concurrent.futures import ThreadPoolExecutor

    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=30) as client, ThreadPoolExecutor(clients) as pool:
        statuses = pool.map(lambda job_id: str(client.post(f"/api/v1/jobs/{job_id}/cancel/").status_code), ids)
        return dict(Counter(statuses))


def window_plan(name: str, *, rate: float, window_s: float, headers: dict, job_ids: list[str]) -> list[dict]:
    submit_s = window_s * 0.75
    body = {**BODY, "name": name}
    plan = [
        open_phase("submit", rate=rate, duration_s=submit_s, drain_s=5.0, method="POST", urls=["/api/v1/jobs/"],
                   body=body, headers=headers, idempotency_key=True),
    ]  # fmt: skip
    reads = ["/api/v1/queues/train/", "/api/v1/jobs/?state=pending"]
    reads += [f"/api/v1/jobs/{job_id}/" for job_id in job_ids[:50]]
    plan.append(
        open_phase("reads", rate=rate, duration_s=window_s - submit_s, drain_s=5.0, method="GET", urls=reads,
                   headers=headers)
    )  # fmt: skip
    return plan


def judge(series: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Per process group: the RSS after the warm-up, at the end and its peak, and whether it stayed flat."""
    if len(series) <= warmup:
        return {}
    base, last = series[warmup - 1 if warmup else 0]["rss_mib"], series[-1]["rss_mib"]
    out = {}
    for name in base:
        peak = max(row["rss_mib"][name] for row in series[warmup:])
        limit = base[name] * (1 + FLAT_RATIO) + FLAT_SLACK_MIB
        out[name] = {
            "after_warmup_mib": base[name],
            "end_mib": last[name],
            "peak_mib": peak,
            "growth_mib": round(last[name] - base[name], 1),
            "flat": last[name] <= limit,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=RESULTS_PATH)
    p.add_argument("--duration", type=float, default=3600.0, help="seconds of windows (the last one may run over)")
    p.add_argument("--window", type=float, default=60.0, help="seconds per window")
    p.add_argument("--rate", type=float, default=10.0, help="submissions (and reads) per second")
    p.add_argument("--warmup", type=int, default=2, help="windows reported but not judged")
    p.add_argument("--keep-db", action="store_true", help="leave the database for the next run to reuse")
    args = p.parse_args(argv)
    if args.window < 10:
        p.error("--window must be at least 10 s")
    signal.signal(signal.SIGTERM, _exit_on_signal)
    db_url, queue, env = run_environment("bench-soak")
    reuse = database_ready(db_url)
    setup_django()
    started = time.time()
    results: dict[str, Any] = {
        "benchmark": "soak (an hour of submissions, reads and cancels through the processes `make run` starts)",
        "process_model": PROCESS_MODEL,
        "settings": {"rate": args.rate, "window_s": args.window, "duration_s": args.duration, "warmup": args.warmup},
        "windows": [],
    }
    try:
        with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
            workdir = Path(tmp)
            ctx = prepare(reuse)
            results["table"] = ctx["table"]
            print(f"bench soak: {ctx['table']}, load {_loadavg()}", flush=True)
            server = WebServer(env, workdir / "web.log")
            server.start()
            procs = {"web": server.proc, **start_processes(env, workdir)}
            results["worker_ready_s"] = wait_for_workers(
                procs["worker"], int(env.get("TRAINYARD_WORKER_CONCURRENCY", "4"))
            )
            results["rss_at_start_mib"] = rss_now(procs)
            headers = {"Authorization": f"Bearer {ctx['token']}"}
            recent: list[str] = []
            i, first = -1, time.time()
            while time.time() - first < args.duration or i + 1 <= args.warmup:
                i += 1
                name = f"{queue}-w{i}"
                phases = window_plan(name, rate=args.rate, window_s=args.window, headers=headers, job_ids=recent)
                load0 = _loadavg()
                loaded, _ = run_load(server, phases, workdir)
                submit = summarize_phase(loaded[0], expect_status=201)
                reads = summarize_phase(loaded[1], expect_status=200)
                recent = submitted_ids(name)
                cancels = cancel_all(server.base_url, ctx["token"], recent)
                exited = [n for n, proc in procs.items() if proc.poll() is not None]
                row = {
                    "window": i,
                    "at_s": round(time.time() - started, 1),
                    "rss_mib": rss_now(procs),
                    "submit": {k: submit[k] for k in ("requests", "ok", "errors", "rps", "p50_ms", "p99_ms")},
                    "reads": {k: reads[k] for k in ("requests", "ok", "errors", "rps", "p50_ms", "p99_ms")},
                    "cancels": cancels,
                    "loadavg_before": load0,
                    "loadavg_after": _loadavg(),
                }
                results["windows"].append(row)
                rss = "  ".join(f"{k} {v:.0f}" for k, v in row["rss_mib"].items())
                print(
                    f"window {i:>3} t={row['at_s']:>7.0f}s  RSS MiB: {rss}  submit p99 {submit['p99_ms']:.0f} ms "
                    f"({submit['errors']} errors)  reads p99 {reads['p99_ms']:.0f} ms  load {row['loadavg_after'][0]}",
                    flush=True,
                )
                if exited:
                    results["exited"] = exited
                    print(f"bench soak: {', '.join(exited)} exited; stopping", file=sys.stderr)
                    break
                # What a stopped run leaves is marked as such; the last write is the whole run.
                write_json(args.out, {**results, "partial": True, "verdict": judge(results["windows"], args.warmup)})
    finally:
        results["redis_cleanup"] = clean_up(env, queue, db_url, keep_db=args.keep_db)
    results["verdict"] = judge(results["windows"], args.warmup)
    results["flat"] = bool(results["verdict"]) and all(v["flat"] for v in results["verdict"].values())
    results["environment"] = {"cpu_count": os.cpu_count(), "loadavg_end": _loadavg(),
                              "duration_s": round(time.time() - started, 1)}  # fmt: skip
    write_json(args.out, results)
    print()
    for name, v in results["verdict"].items():
        print(f"{name:<11} after warm-up {v['after_warmup_mib']:>7.1f} MiB  end {v['end_mib']:>7.1f} MiB  "
              f"peak {v['peak_mib']:>7.1f} MiB  {'flat' if v['flat'] else 'GREW'}")  # fmt: skip
    print(f"wrote {args.out}")
    return 0 if results["flat"] and not results.get("exited") else 1


if __name__ == "__main__":
    raise SystemExit(main())
