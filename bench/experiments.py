"""Experiments benchmark: GPU-hours to reach the best metric with the adaptive searcher (ASHA) against random
search with the same budget, and the platform's overhead per trial (submit -> running) against a plain job's.

Everything runs through the product, in the deployed shape: a fresh database, the seeded platform on the local
backend with the emulated inventory (4 x 24 GiB cards), a real Celery worker, the dispatcher and a real beat
started as `make run` starts them (`ops.processes`), sandboxed trial processes. The periods of the loops are
shortened (below, `LOOP_ENV`), as they would be for short trials; they are recorded with the results. The
training script is `experiments/examples/train.py`: real minibatch SGD in plain Python that reports its validation
loss through the platform's metric path (TRAINYARD_METRIC lines read from the job's log); each step also sleeps
`--step-seconds`, which stands for an accelerator's step time (the arithmetic itself takes microseconds here).

Same budget: both searches get the same max_trials, the same seed and so the same configurations (the adaptive
searcher samples exactly as random does); what differs is that ASHA stops trials early. GPU-hours are card-hours
held by trials (run time x the spec's share of a card x cards). "To reach the best" is the GPU-hours a search
had consumed, all its trials counted, at the moment one of them first reported a loss within 1% (and 5%) of the
best either search found (the metric rows' own timestamps); none when it never got there.

Plain jobs: the same script with fixed parameters submitted one at a time on the idle platform, before the
sweeps (one more first, not counted, warms the worker's processes up). Overhead per trial: each trial job's
submit -> running (both as the job's own timestamps; `running` is when an observe pass saw it run, so the
observe period is inside both figures), split into submit -> admitted (the dispatcher) and admitted -> running
(the start task, the sandbox, the process); the refill gap: how long a freed slot waited for the experiment's pass
to submit the next trial; and how many trials ran at once (their run time over the search's wall time, and the
peak).

Run: `make bench-experiments` (64 trials per search), or `--quick` (16 trials) for CI-length runs.
Results: `bench/results/experiments.json` (`experiments-quick.json` for --quick).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
TRAIN = REPO / "experiments" / "examples" / "train.py"
LOOP_ENV = {
    "TRAINYARD_EXPERIMENT_ADVANCE_S": "1",
    "TRAINYARD_METRIC_SCAN_INTERVAL_S": "1",
    "TRAINYARD_OBSERVE_EVERY_S": "1",
    "TRAINYARD_TELEMETRY_INTERVAL_S": "5",
    "TRAINYARD_USAGE_INTERVAL_S": "0.5",
}
SPACE = {
    "lr": {"type": "log_uniform", "min": 0.001, "max": 0.5},
    "batch": [4, 8, 16, 32],
    "momentum": {"type": "float", "min": 0.0, "max": 0.95},
}
STEPS = 54
STEP_S = 0.2
PROCESS_MODEL = (
    "the benchmark process creates experiments (experiments.services) and submits plain jobs (jobs.services) on a "
    "fresh database; as `make run` starts them, a Celery worker (ops.processes 'worker', "
    "TRAINYARD_WORKER_CONCURRENCY children: the periodic passes and the attempt starts), the dispatcher "
    "(ops.processes 'dispatcher': one solo-pool process consuming the dispatch queue) and beat (ops.processes "
    "'beat') run as separate processes; trials run as sandboxed local processes on the emulated inventory"
)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _round(value, digits=3):
    return None if value is None else round(value, digits)


def start_processes(env: dict[str, str], logdir: Path) -> list[subprocess.Popen]:
    from ops import processes

    out = []
    for name in ("worker", "dispatcher", "beat"):  # as `make run` starts them
        argv = [sys.executable, "-m", *processes.command(name, environ=env)]
        if name == "beat":
            argv += ["-s", str(logdir / "celerybeat-schedule")]
        log = open(logdir / f"{name}.log", "w")  # noqa: SIM115 - open for the process's life
        out.append(subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
    return out


def stop_processes(children: list[subprocess.Popen]) -> None:
    for child in children:
        child.terminate()
    for child in children:
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()


def upload_code(user) -> str:
    import hashlib
    import io
    import tarfile

    from jobs import code
    from quotas.models import Team

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(TRAIN, arcname="train.py")
    body = buffer.getvalue()
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    code.snapshot_store(team=Team.objects.get(slug="demo"), digest=digest, body=io.BytesIO(body), user=user)
    return digest


def template(digest: str) -> dict:
    return {
        "queue": "train",
        "spec": "shared",
        "image": "python-3.11",
        "code": digest,
        "command": "python train.py --lr {{lr}} --batch {{batch}} --momentum {{momentum}} --steps {{max_steps}} "
        f"--step-seconds {STEP_S} --checkpoint-every 1000",
        "max_retries": 0,
    }


def wait_until(predicate, *, timeout: float, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise RuntimeError("timed out waiting for the platform")


def plain_jobs(user, digest: str, n: int) -> dict:
    """Submit the same script with fixed parameters, one job at a time on the idle platform; submit -> running."""
    from django.db import transaction

    from jobs import services
    from jobs.models import Job

    overheads = []
    for k in range(n + 1):  # the first one warms the worker's processes up and is not counted
        data = {**template(digest), "team": "demo", "name": "plain",
                "command": f"python train.py --lr 0.05 --batch 16 --steps {STEPS} --step-seconds {STEP_S}"}  # fmt: skip
        with transaction.atomic(durable=True):
            job, _ = services.job_submit(user=user, data=data)
        job = wait_until(lambda pk=job.pk: (j := Job.objects.get(pk=pk)).started_at and j, timeout=120)
        if k:
            overheads.append((job.started_at - job.submitted_at).total_seconds())
        wait_until(lambda pk=job.pk: Job.objects.get(pk=pk).finished_at, timeout=300)
    return {
        "jobs": n,
        "submit_to_running_mean_s": _round(statistics.fmean(overheads)),
        "submit_to_running_p50_s": _round(percentile(overheads, 50)),
        "submit_to_running_p95_s": _round(percentile(overheads, 95)),
    }


def sweep(user, digest: str, *, searcher: str, trials: int, concurrent: int, seed: int) -> str:
    from django.db import transaction

    from experiments import services

    spec = {"name": searcher, "max_steps": STEPS, "seed": seed}
    if searcher == "adaptive":
        spec.update(min_steps=2, reduction=3)  # rungs at 2, 6, 18 of 54 steps
    data = {"name": f"bench-{searcher}", "team": "demo", "template": template(digest), "space": SPACE,
            "searcher": spec, "metric": "loss", "direction": "minimize", "max_trials": trials,
            "max_concurrent": concurrent}  # fmt: skip
    with transaction.atomic(durable=True):
        experiment = services.experiment_create(user=user, data=data)
    return str(experiment.id)


def _card_seconds_until(jobs, until: datetime | None) -> float:
    total = 0.0
    for job in jobs:
        if job.started_at is None:
            continue
        end = job.finished_at or until
        if until is not None and end is not None:
            end = min(end, until)
        if end is None or end <= job.started_at:
            continue
        total += (end - job.started_at).total_seconds() * job.gpu_count * job.replicas * job.gpu_milli / 1000
    return total


def measure(experiment_id: str, *, target: float | None, target_5: float | None = None) -> dict:
    from experiments.models import Experiment
    from monitoring.models import BusinessMetric

    experiment = Experiment.objects.get(pk=experiment_id)
    trials = list(experiment.trials.select_related("job").order_by("number"))
    jobs = [t.job for t in trials]
    best = min((t.best_value for t in trials if t.best_value is not None), default=None)
    reached_at = None
    if target is not None:
        first = (
            BusinessMetric.objects.filter(job__in=jobs, values__loss__lte=target)
            .order_by("at")
            .values_list("at", flat=True)
        ).first()
        reached_at = first
    reached_5 = None
    if target_5 is not None:
        reached_5 = (
            BusinessMetric.objects.filter(job__in=jobs, values__loss__lte=target_5)
            .order_by("at")
            .values_list("at", flat=True)
        ).first()
    submit_to_running = [(j.started_at - j.submitted_at).total_seconds() for j in jobs if j.started_at]
    # Where the wait is: for a slot (submit -> admitted: the dispatcher) or for a start (admitted -> running: the
    # start task, the sandbox, the process).
    to_admitted = [(j.admitted_at - j.submitted_at).total_seconds() for j in jobs if j.admitted_at]
    to_started = [(j.started_at - j.admitted_at).total_seconds() for j in jobs if j.started_at and j.admitted_at]
    ran = [(j.started_at, j.finished_at) for j in jobs if j.started_at and j.finished_at]
    edges = sorted([(a, 1) for a, _ in ran] + [(b, -1) for _, b in ran])
    running = peak = 0
    for _, delta in edges:
        running += delta
        peak = max(peak, running)
    ends = sorted(j.finished_at for j in jobs if j.finished_at)
    refill = []
    for k, job in enumerate(jobs):
        if k >= experiment.max_concurrent and k - experiment.max_concurrent < len(ends):
            freed = ends[k - experiment.max_concurrent]
            refill.append(max(0.0, (job.submitted_at - freed).total_seconds()))
    states: dict[str, int] = {}
    for t in trials:
        states[t.state] = states.get(t.state, 0) + 1
    wall = (experiment.finished_at - experiment.created_at).total_seconds() if experiment.finished_at else None
    return {
        "state": experiment.state,
        "trials": len(trials),
        "by_state": states,
        "best_loss": _round(best, 6),
        "best_trial_params": next((t.params for t in trials if t.best_value == best), None),
        "gpu_hours_total": _round(_card_seconds_until(jobs, None) / 3600, 5),
        "gpu_hours_to_reach_best": None
        if reached_at is None
        else _round(_card_seconds_until(jobs, reached_at) / 3600, 5),
        "reached_best": reached_at is not None,
        "gpu_hours_to_within_5pct": None
        if reached_5 is None
        else _round(_card_seconds_until(jobs, reached_5) / 3600, 5),
        "wall_s": _round(wall, 1),
        "trial_submit_to_running_mean_s": _round(statistics.fmean(submit_to_running)) if submit_to_running else None,
        "trial_submit_to_running_p50_s": _round(percentile(submit_to_running, 50)),
        "trial_submit_to_running_p95_s": _round(percentile(submit_to_running, 95)),
        "trial_submit_to_admitted_mean_s": _round(statistics.fmean(to_admitted)) if to_admitted else None,
        "trial_submit_to_admitted_p95_s": _round(percentile(to_admitted, 95)),
        "trial_admitted_to_running_mean_s": _round(statistics.fmean(to_started)) if to_started else None,
        "trial_admitted_to_running_p95_s": _round(percentile(to_started, 95)),
        "trials_running_mean": _round(sum((b - a).total_seconds() for a, b in ran) / wall) if wall else None,
        "trials_running_peak": peak,
        "refill_gap_mean_s": _round(statistics.fmean(refill)) if refill else None,
        "refill_gap_p95_s": _round(percentile(refill, 95)),
        "steps_run": sum((t.last_step or 0) for t in trials),
        "recommendation": (experiment.recommendation or {}).get("evidence"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 trials per search, 4 plain jobs (else 64 and 8)")
    parser.add_argument("--trials", type=int, help="trials per search (default 64; --quick 16)")
    parser.add_argument("--concurrent", type=int, default=8, help="trials running at once (default 8)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    trials = args.trials or (16 if args.quick else 64)
    plain_n = 4 if args.quick else 8
    output = args.output or RESULTS / ("experiments-quick.json" if args.quick else "experiments.json")
    load_before = os.getloadavg()[0]

    from bench.scheduler import own_database

    url = own_database(url_name="experiments")
    root = Path(tempfile.mkdtemp(prefix="bench-experiments-"))
    os.environ.update(
        {
            "TRAINYARD_BACKEND": "local",
            "TRAINYARD_LOCAL_GPUS": "4x24GiB",
            "TRAINYARD_START_QUEUE": "",  # the worker below takes the starts too
            "TRAINYARD_WORK_ROOT": str(root / "work"),
            "TRAINYARD_STATE_ROOT": str(root / "state"),
            "TRAINYARD_LOG_ROOT": str(root / "logs"),
            "TRAINYARD_CODE_ROOT": str(root / "code"),
            "TRAINYARD_WORKER_CONCURRENCY": os.environ.get("TRAINYARD_WORKER_CONCURRENCY", "2"),
            **LOOP_ENV,
        }
    )
    from bench.api import drop_database, setup_django

    setup_django()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from ops.seed import seed
    from quotas.models import Queue, ResourceSpec, Team

    call_command("migrate", verbosity=0, interactive=False)
    seed(admin_password="bench-admin-pass", demo_password="bench-demo-pass")
    plenty = {"cpu_milli": 10**6, "memory_mib": 10**8}
    Team.objects.filter(slug="demo").update(**plenty, max_running_jobs=10**4, max_jobs_per_user=10**4)
    Queue.objects.filter(name="train").update(**plenty)
    # The trials use a few MiB and a fraction of a core: the shared spec as an admin would size it for them, so
    # host CPU and memory (2 cores here) do not cap the sweep below max_concurrent.
    ResourceSpec.objects.filter(name="shared").update(cpu_milli_per_gpu=100, memory_mib_per_gpu=512)
    user = get_user_model().objects.get(username="demo")
    digest = upload_code(user)
    children = start_processes(dict(os.environ), root)
    results: dict = {"benchmark": "experiments: ASHA vs random search, and the overhead per trial"}
    t0 = time.perf_counter()
    try:
        plain = plain_jobs(user, digest, plain_n)
        print(f"plain jobs: submit -> running mean {plain['submit_to_running_mean_s']} s "
              f"(p95 {plain['submit_to_running_p95_s']} s) over {plain_n} jobs", flush=True)  # fmt: skip
        ids = {}
        from experiments.models import Experiment

        for searcher in ("random", "adaptive"):
            ids[searcher] = sweep(user, digest, searcher=searcher, trials=trials, concurrent=args.concurrent,
                                  seed=args.seed)  # fmt: skip
            wait_until(lambda s=searcher: not Experiment.objects.get(pk=ids[s]).is_live, timeout=3600, every=1.0)
            print(f"{searcher}: done", flush=True)
        bests = [measure(i, target=None)["best_loss"] for i in ids.values()]
        overall = min(b for b in bests if b is not None)
        target = overall * 1.01
        searches = {name: measure(i, target=target, target_5=overall * 1.05) for name, i in ids.items()}
    finally:
        stop_processes(children)
        drop_database(url)
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    random_, adaptive = searches["random"], searches["adaptive"]

    def ratio(a, b):
        return _round(a / b, 3) if a and b else None

    results.update(
        plain_jobs=plain,
        searches=searches,
        best_loss_overall=_round(overall, 6),
        target_loss=_round(target, 6),
        adaptive_vs_random={
            "gpu_hours_total_ratio": ratio(adaptive["gpu_hours_total"], random_["gpu_hours_total"]),
            "gpu_hours_to_reach_best_ratio": ratio(
                adaptive["gpu_hours_to_reach_best"], random_["gpu_hours_to_reach_best"]
            ),  # fmt: skip
        },
        trial_overhead_vs_plain_s={
            "mean": _round((random_["trial_submit_to_running_mean_s"] or 0) - (plain["submit_to_running_mean_s"] or 0)),
            "p50": _round((random_["trial_submit_to_running_p50_s"] or 0) - (plain["submit_to_running_p50_s"] or 0)),
        },
        setup={
            "trials_per_search": trials,
            "max_concurrent": args.concurrent,
            "seed": args.seed,
            "space": SPACE,
            "steps": STEPS,
            "step_seconds": STEP_S,
            "adaptive": {"min_steps": 2, "reduction": 3},
            "inventory": "4x24GiB emulated, spec shared (250 milli a trial; 100 CPU milli, 512 MiB host memory)",
            "loop_periods": LOOP_ENV,
            "worker_concurrency": os.environ["TRAINYARD_WORKER_CONCURRENCY"],
            "quick": args.quick,
        },
        load={"loadavg_1m_before": round(load_before, 2), "loadavg_1m_after": round(os.getloadavg()[0], 2)},
        duration_s=round(time.perf_counter() - t0, 1),
    )
    import json

    from bench.allocator import provenance

    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({**results, "process_model": PROCESS_MODEL, "provenance": provenance()}, indent=2)
                      + "\n")  # fmt: skip
    rows = [("", "random", "adaptive")]
    for key in ("trials", "best_loss", "gpu_hours_total", "gpu_hours_to_reach_best", "gpu_hours_to_within_5pct",
                "steps_run", "wall_s",
                "trial_submit_to_running_mean_s", "trial_submit_to_admitted_mean_s",
                "trial_admitted_to_running_mean_s", "trials_running_mean", "trials_running_peak",
                "refill_gap_mean_s"):  # fmt: skip
        rows.append((key, str(random_[key]), str(adaptive[key])))
    rows.append(("stopped_early", str(random_["by_state"].get("stopped_early", 0)),
                 str(adaptive["by_state"].get("stopped_early", 0))))  # fmt: skip
    width = max(len(r[0]) for r in rows)
    for r in rows:
        print(f"{r[0]:<{width}}  {r[1]:>12}  {r[2]:>12}")
    print(f"plain job submit -> running mean {plain['submit_to_running_mean_s']} s, p50 "
          f"{plain['submit_to_running_p50_s']} s; a trial's over it (random search): "
          f"{results['trial_overhead_vs_plain_s']}; commit {provenance()['git_commit']}")  # fmt: skip
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
