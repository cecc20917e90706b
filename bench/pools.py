"""Priority and preemption benchmark: what preemptible borrowing costs the jobs that hold quota, and what it gives.

What runs: a dedicated database (``<db>_bench_pools``, created afresh, migrated, seeded); a cluster of the openb
trace's 8-GPU nodes as Node/GPU rows; a window of the trace's GPU pods in arrival order, each submitted through
``job_submit`` with the pod's real run time, and the real dispatcher (``jobs.store``: the pass, then
``jobs.preemption``) after every arrival and every end. Time is simulated (as in ``bench/eta.py``): a month of
trace runs in minutes.

Each pod is given a class by a seeded draw made before anything runs (fixed shares, not tuned): ``INFERENCE``
to the ``serve`` queue (priority class inference, quota ``SERVE_SHARE`` of the cluster), ``PREEMPTIBLE`` to the
``train`` queue with ``preemptible: true`` (no quota held), the rest to ``train`` (quota ``TRAIN_SHARE``). The
same window runs twice: **without** its preemptible pods and **with** them. A preempted attempt is stopped at
once (the simulated backend yields instantly; a real one adds its notice, ``TRAINYARD_PREEMPT_GRACE_S``) and
resumes from its last checkpoint, one every ``CHECKPOINT_S`` of run time.

Reported per seed and overall:
- the wait (submission to first admission) of jobs that hold quota, mean and p90, with and without the
  preemptible load, and its growth (target: at most 5%);
- GPU allocation: the time-weighted share of the cluster's GPUs held while jobs arrive, with and without;
- work lost to preemption: GPU-hours run since the last checkpoint by preempted attempts;
- reclaim time: for each job that needed borrowed cards back, the dispatcher's own time (wall clock) from the
  start of the pass in which it waited to the end of the pass that admitted it; p50/p99. The notice period is not
  in it (the simulated backend yields at once).

The cluster size and load were chosen on seed 1 (so that quota-holding jobs wait at all); the results file
reports seeds 21-23, other windows of the trace.

Idle lending (``--scenario lending``, part of the default run): three 8-GPU nodes, two in a lending pool
(``whole-card``, its ``train`` queue) and one in a borrowing pool (``inference``, its ``serve`` queue, which takes
preemptible jobs); the pods are drawn into the lender's training jobs (a small share, so its use stays low), the
borrower's inference jobs and the borrower's preemptible jobs. The same window runs with the lending rule off and
on; on, the real rule (``jobs.lending.pools_lend``, default threshold and window) runs on simulated time at every
event and when a pool's below-threshold window ends. Reported: GPU allocation overall and per pool, loans, the
wait of quota-holding jobs, preemptions. Load and shares chosen on seed 1; reported on seeds 21-23.
Run: ``make bench-pools`` (``--seeds``, ``--pods``). Results: ``bench/results/pools.json``.
"""

from __future__ import annotations

import argparse
import os
import platform as py_platform
import random
import statistics
import time
from datetime import timedelta
from pathlib import Path

from bench.allocator import trace_dir_from_env, write_json
from bench.api import drop_database
from bench.eta import LOAD as ETA_LOAD
from bench.eta import trace_pods, window
from bench.scheduler import load_cluster, percentile, seeded_cluster, trace_present

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "pools.json"
TARGETS = {"wait_growth_max": 0.05}
REPORT_SEEDS = [21, 22, 23]
NODES = 1  # one 8-GPU node: contention comes early
LOAD = 3.0  # arrivals compressed so the offered GPU work is this many times the cluster (preemptible included)
INFERENCE, PREEMPTIBLE = 0.15, 0.35  # shares of the pods, drawn per pod
TRAIN_SHARE, SERVE_SHARE = 0.7, 0.3  # quotas, as shares of the cluster's GPUs
CHECKPOINT_S = 900
# Idle lending scenario: a lending pool of whole cards that its training queue uses little, a borrowing pool whose
# inference queue also takes preemptible work; the same window with the lending rule off and on.
LENDER, BORROWER = "whole-card", "inference"
LEND_NODES, BORROW_NODES = 2, 1  # 8-GPU nodes in each pool
LEND_LOAD = 3.0  # offered GPU work over the whole cluster's capacity
LEND_TRAINING = 0.2  # share of pods that are the lending pool's own training jobs (its use stays low)
LEND_INFERENCE = 0.15  # share of pods that are the borrowing pool's inference jobs; the rest are preemptible there
LIMIT_S = 7 * 24 * 3600


def classify(pods: list[dict], seed: int, capacity: int) -> list[dict]:
    """Each pod's class; a pod larger than its queue's quota is left out (the platform refuses it at submission)."""
    rng = random.Random(seed * 7919)
    out = []
    for p in pods:
        p = {**p, "arrival": p["arrival"] * ETA_LOAD / LOAD}
        draw = rng.random()
        kind = "inference" if draw < INFERENCE else "preemptible" if draw < INFERENCE + PREEMPTIBLE else "training"
        quota = (SERVE_SHARE if kind == "inference" else TRAIN_SHARE) * capacity
        if p["gpus"] * p["milli"] / 1000 <= quota:
            out.append({**p, "kind": kind})
    return out


def classify_lending(pods: list[dict], seed: int, lend_gpus: int, borrow_gpus: int) -> list[dict]:
    """Each pod's class for the lending scenario; a pod larger than its pool (or its queue's quota) is left out."""
    rng = random.Random(seed * 104729)
    out = []
    for p in pods:
        p = {**p, "arrival": p["arrival"] * ETA_LOAD / LEND_LOAD}
        draw = rng.random()
        if draw < LEND_TRAINING:
            kind, queue, room = "training", "train", lend_gpus
        elif draw < LEND_TRAINING + LEND_INFERENCE:
            kind, queue, room = "inference", "serve", borrow_gpus
        else:
            kind, queue, room = "preemptible", "serve", 8
        if p["gpus"] * p["milli"] / 1000 <= min(room, 8):
            out.append({**p, "kind": kind, "queue": queue})
    return out


def lending_scenario(user, pods: list[dict], nodes, seeds: list[int], size: int, base) -> dict:
    """Allocation with and without idle lending: the same windows, the lending rule off, then on."""
    from django.conf import settings

    from cluster.inventory import POOL_LABEL
    from cluster.models import Node
    from quotas.models import Queue

    big = [n for n in nodes if n.num_gpus == 8][: LEND_NODES + BORROW_NODES]
    load_cluster(big)
    for k, node in enumerate(Node.objects.order_by("name")):
        node.labels = {**node.labels, POOL_LABEL: LENDER if k < LEND_NODES else BORROWER}
        node.save(update_fields=["labels"])
    lend_gpus, borrow_gpus = 8 * LEND_NODES, 8 * BORROW_NODES
    capacity = lend_gpus + borrow_gpus
    Queue.objects.filter(name="train").update(pools=[LENDER], gpu_milli=lend_gpus * 1000, allow_preemptible=False)
    Queue.objects.filter(name="serve").update(pools=[BORROWER], gpu_milli=borrow_gpus * 1000, allow_preemptible=True)
    pool_gpus = {LENDER: lend_gpus, BORROWER: borrow_gpus}
    out: dict = {"seeds": {}}
    before = settings.TRAINYARD_POOL_LENDING
    try:
        for s in seeds:
            chosen = classify_lending(window(pods, s, size, capacity), s, lend_gpus, borrow_gpus)
            settings.TRAINYARD_POOL_LENDING = ""
            off = run(user, chosen, base, capacity, pool_gpus=pool_gpus)
            settings.TRAINYARD_POOL_LENDING = f"{LENDER}>{BORROWER}"
            on = run(user, chosen, base, capacity, lend=True, pool_gpus=pool_gpus)
            for r in (off, on):
                r["reclaims"] = len(r.pop("reclaim_s"))
            out["seeds"][str(s)] = {"without_lending": off, "with_lending": on}
            print(
                f"lending seed {s}: allocation {off['allocation']:.1%} -> {on['allocation']:.1%} "
                f"({LENDER} {off['allocation_by_pool'][LENDER]:.1%} -> {on['allocation_by_pool'][LENDER]:.1%}); "
                f"{on['loans']} loans; quota-holding wait {off['wait_mean_s']} s -> {on['wait_mean_s']} s; "
                f"{on['preemptions']} preemptions, {on['lost_gpu_hours']} GPU-h lost",
                flush=True,
            )
    finally:
        settings.TRAINYARD_POOL_LENDING = before
    out["setup"] = {
        "pools": {LENDER: lend_gpus, BORROWER: borrow_gpus},
        "load": LEND_LOAD,
        "pods_per_window": size,
        "shares": {"training (whole-card)": LEND_TRAINING, "inference": LEND_INFERENCE},
        "lend_below_percent": settings.TRAINYARD_LEND_BELOW_PERCENT,
        "lend_after_s": settings.TRAINYARD_LEND_AFTER_S,
        "seeds": seeds,
    }
    return out


def body(pod: dict) -> dict:
    data = {
        "team": "demo",
        "queue": "serve" if pod["kind"] == "inference" else "train",
        "image": "python-3.11",
        "command": ["python", "run.py", "--shape", pod["shape"]],
        "gpu_milli": pod["milli"],
        "gpu_memory_mib": 1,
        "cpu_milli": 1,
        "memory_mib": 1,
        "timeout_s": LIMIT_S,
        "max_retries": 0,
    }
    if pod["gpus"] > 1:
        data["gpus"] = pod["gpus"]
    if pod["kind"] == "preemptible":
        data["preemptible"] = True
    if pod.get("queue"):
        data["queue"] = pod["queue"]
    return data


def run(user, pods: list[dict], base, capacity: int, *, lend: bool = False, pool_gpus: dict | None = None) -> dict:
    """One replay. `lend`: the lending rule (jobs.lending.pools_lend) runs on simulated time at every event and at
    the moment a pool's below-threshold window ends; `pool_gpus`: report the allocation of each pool as well."""
    import heapq

    from django.conf import settings

    from cluster.inventory import node_pool
    from cluster.models import LogicalDevice, PoolRepair, PoolState
    from jobs.lending import pools_lend
    from jobs.models import Job, JobEvent
    from jobs.services import job_submit, job_transition
    from jobs.states import JobState
    from jobs.store import dispatch
    from scheduler import dispatch as scheduler

    Job.objects.all().delete()
    PoolState.objects.all().delete()
    from cluster.inventory import LENT_LABEL
    from cluster.models import Node
    from cluster.services import node_lend

    for node in Node.objects.all():  # every run starts with nothing lent (a run with lending leaves loans behind)
        if node.labels.get(LENT_LABEL):
            node_lend(node_id=node.id, to=None, why="bench reset")
    PoolRepair.objects.filter(kind__in=["node_lent", "node_reclaimed"]).delete()  # this run's loans only
    scheduler.reset()
    pool_held: dict[str, float] = {p: 0.0 for p in pool_gpus or {}}
    pool_area: dict[str, float] = {p: 0.0 for p in pool_gpus or {}}
    where: dict = {}  # job id -> pool its running attempt is in
    ticks: set[float] = set()
    events: list[tuple[float, int, str, object]] = []
    for k, pod in enumerate(pods):
        heapq.heappush(events, (pod["arrival"], k, "arrive", pod))
    info: dict = {}  # job id -> {pod, submitted, first_start, done (run seconds kept), started (this attempt)}
    running: dict = {}  # job id -> (attempt start time, sequence number of its end event)
    n = len(pods)
    lost_gpu_s = 0.0
    held = 0.0  # GPUs held now, and their integral over time until the last arrival
    area, last_t = 0.0, 0.0
    last_arrival = max(p["arrival"] for p in pods)
    reclaims: list[float] = []
    seen_preemptions = 0
    while events:
        t = events[0][0]
        area += held * (min(t, last_arrival) - min(last_t, last_arrival))
        for p in pool_area:
            pool_area[p] += pool_held[p] * (min(t, last_arrival) - min(last_t, last_arrival))
        last_t = t
        at = base + timedelta(seconds=t)
        if lend:
            pools_lend(now=at)  # on the state the last pass left, before this moment's arrivals and ends
            for below in PoolState.objects.filter(below_since__isnull=False).values_list("below_since", flat=True):
                due = (below - base).total_seconds() + settings.TRAINYARD_LEND_AFTER_S + 1
                if due > t and due not in ticks:  # the rule runs every minute: the window's end is a moment it acts
                    ticks.add(due)
                    heapq.heappush(events, (due, -1, "tick", None))
        while events and events[0][0] <= t:
            _, k, kind, what = heapq.heappop(events)
            if kind == "tick":
                continue
            if kind == "end":
                job_id, seq = what
                if running.get(job_id, (None, None))[1] != seq:
                    continue  # preempted meanwhile: this end never comes
                running.pop(job_id)
                job_transition(job_id=job_id, to=JobState.SUCCEEDED, actor="bench", message="exit code 0")
                Job.objects.filter(pk=job_id).update(finished_at=at)
                pod = info[job_id]["pod"]
                held -= pod["gpus"] * pod["milli"] / 1000
                if job_id in where:
                    pool_held[where.pop(job_id)] -= pod["gpus"] * pod["milli"] / 1000
            else:
                job, _ = job_submit(user=user, data=body(what))
                Job.objects.filter(pk=job.pk).update(submitted_at=at)
                info[job.id] = {"pod": what, "submitted": t, "first_start": None, "done": 0.0}
        waiting_owner = None
        for _round in range(3):  # a pass, and the passes its preemptions wake (the released cards)
            t0 = time.perf_counter()
            dispatch(full=True)
            preempted = JobEvent.objects.filter(kind="preemption").count()
            if preempted > seen_preemptions:
                seen_preemptions = preempted
                waiting_owner = waiting_owner or t0
                back = Job.objects.filter(pk__in=list(running), state=JobState.PENDING).values_list("id", flat=True)
                for job_id in list(back):
                    start, _seq = running.pop(job_id)
                    pod, record = info[job_id]["pod"], info[job_id]
                    ran = t - start
                    kept = (ran // CHECKPOINT_S) * CHECKPOINT_S  # resumes from its last checkpoint
                    record["done"] += kept
                    lost_gpu_s += (ran - kept) * pod["gpus"] * pod["milli"] / 1000
                    held -= pod["gpus"] * pod["milli"] / 1000
                    if job_id in where:
                        pool_held[where.pop(job_id)] -= pod["gpus"] * pod["milli"] / 1000
                continue
            if waiting_owner is not None:
                reclaims.append(time.perf_counter() - waiting_owner)
            break
        for job_id in Job.objects.filter(state=JobState.ADMITTED).values_list("id", flat=True):
            job_transition(job_id=job_id, to=JobState.STARTING, actor="bench")
            job_transition(job_id=job_id, to=JobState.RUNNING, actor="bench")
            Job.objects.filter(pk=job_id).update(
                admitted_at=at, started_at=at, deadline=at + timedelta(seconds=LIMIT_S)
            )
            record = info[job_id]
            pod = record["pod"]
            if record["first_start"] is None:
                record["first_start"] = t
            held += pod["gpus"] * pod["milli"] / 1000
            if pool_gpus:
                labels = (
                    LogicalDevice.objects.filter(attempt__job_id=job_id, released_at__isnull=True)
                    .values_list("gpu__node__labels", flat=True)
                    .first()
                )
                where[job_id] = node_pool(labels or {})
                pool_held[where[job_id]] += pod["gpus"] * pod["milli"] / 1000
            running[job_id] = (t, n)
            heapq.heappush(events, (t + max(1.0, pod["run"] - record["done"]), n, "end", (job_id, n)))
            n += 1
    owners = [r for r in info.values() if r["pod"]["kind"] != "preemptible" and r["first_start"] is not None]
    waits = sorted(r["first_start"] - r["submitted"] for r in owners)
    span = max(last_arrival, 1.0)
    extra: dict = {}
    if pool_gpus:
        extra["allocation_by_pool"] = {p: round(pool_area[p] / (g * span), 4) for p, g in pool_gpus.items()}
        extra["loans"] = PoolRepair.objects.filter(kind="node_lent").count()
        extra["loans_reclaimed"] = PoolRepair.objects.filter(kind="node_reclaimed").count()
        borrowers = [r for r in info.values() if r["pod"]["kind"] == "preemptible"]
        extra["preemptible_jobs_started"] = sum(1 for r in borrowers if r["first_start"] is not None)
    return {
        **extra,
        "jobs": len(info),
        "quota_holding_jobs": len(owners),
        "wait_mean_s": round(statistics.fmean(waits), 1) if waits else 0.0,
        "wait_p90_s": round(percentile(waits, 90), 1) if waits else 0.0,
        "allocation": round(area / (capacity * span), 4),
        "preemptions": seen_preemptions,
        "lost_gpu_hours": round(lost_gpu_s / 3600, 2),
        "reclaim_s": [round(x, 4) for x in reclaims],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pools", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default=",".join(map(str, REPORT_SEEDS)))
    parser.add_argument("--pods", type=int, default=150, help="pods per window")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--scenario", choices=["all", "preemption", "lending"], default="all",
        help="one part only; the other's results already in --output are kept",
    )  # fmt: skip
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]

    trace_dir = trace_dir_from_env()
    if not trace_present(trace_dir, "pools"):
        return 1 if os.environ.get("CI") == "true" else 0
    url, user, capacity, nodes = seeded_cluster("pools", trace_dir, eight_gpu_nodes=NODES)
    from django.utils import timezone

    from quotas.models import Queue, Team

    plenty = {"cpu_milli": 10**9, "memory_mib": 10**12, "gpu_memory_mib": 10**12}
    common = dict(**plenty, ordering="backfill", allow_explicit_request=True, max_timeout_s=LIMIT_S)
    Queue.objects.filter(name="train").update(
        **common, gpu_milli=int(TRAIN_SHARE * capacity * 1000), allow_preemptible=True
    )
    serve = Queue.objects.create(
        name="serve", priority_class=Queue.PriorityClass.INFERENCE, gpu_milli=int(SERVE_SHARE * capacity * 1000),
        **common,
    )  # fmt: skip
    team = Team.objects.get(slug="demo")
    serve.teams.add(team)
    Team.objects.filter(pk=team.pk).update(
        **plenty, gpu_milli=capacity * 1000, max_running_jobs=10**6, max_jobs_per_user=10**6
    )
    pods = trace_pods(trace_dir)
    base = timezone.now() - timedelta(days=60)
    results: dict = {
        "benchmark": "preemptible borrowing through the real dispatcher (jobs.preemption)",
        "process_model": "one process: job_submit and the dispatcher's pass and preemption (jobs.store, "
        "jobs.preemption) called in the benchmark's process on a database of its own (PostgreSQL on the same "
        "machine), on simulated time; no web server, worker or beat",
        "seeds": {},
    }
    t0 = time.perf_counter()
    growths, reclaims, lost = [], [], 0.0
    try:
        if args.scenario in ("all", "preemption"):
            for s in seeds:
                chosen = classify(window(pods, s, args.pods, capacity), s, capacity)
                without = run(user, [p for p in chosen if p["kind"] != "preemptible"], base, capacity)
                with_load = run(user, chosen, base, capacity)
                without.pop("reclaim_s")
                reclaims += with_load["reclaim_s"]
                with_load["reclaims"] = len(with_load.pop("reclaim_s"))
                growth = (
                    (with_load["wait_mean_s"] - without["wait_mean_s"]) / without["wait_mean_s"]
                    if without["wait_mean_s"]
                    else 0.0
                )
                growths.append(growth)
                lost += with_load["lost_gpu_hours"]
                results["seeds"][str(s)] = {"without_preemptible": without, "with_preemptible": with_load,
                                            "wait_growth": round(growth, 4)}  # fmt: skip
                print(
                    f"seed {s}: quota-holding wait {without['wait_mean_s']} s without, {with_load['wait_mean_s']} s "
                    f"with preemptible load ({growth:+.1%}); allocation {without['allocation']:.1%} -> "
                    f"{with_load['allocation']:.1%}; {with_load['preemptions']} preemptions, "
                    f"{with_load['lost_gpu_hours']} GPU-h lost",
                    flush=True,
                )
        if args.scenario in ("all", "lending"):
            lending = lending_scenario(user, pods, nodes, seeds, args.pods, base)
    finally:
        drop_database(url)
    if args.scenario == "lending":
        import json

        results = json.loads(args.output.read_text()) if args.output.exists() else {"seeds": {}}
        results["lending"] = lending
        results.setdefault("environment", {})["lending_seconds"] = round(time.perf_counter() - t0, 1)
        write_json(args.output, results)
        print(f"wrote {args.output} (lending part)")
        return 0
    ordered = sorted(reclaims)
    overall = {
        "wait_growth_max": round(max(growths), 4) if growths else None,
        "wait_growth_mean": round(statistics.fmean(growths), 4) if growths else None,
        "lost_gpu_hours": round(lost, 2),
        "reclaims": len(ordered),
        "reclaim_p50_s": round(percentile(ordered, 50), 4) if ordered else None,
        "reclaim_p99_s": round(percentile(ordered, 99), 4) if ordered else None,
    }
    results["overall"] = overall
    results["targets"] = {
        **TARGETS,
        "wait_growth_met": overall["wait_growth_max"] is not None
        and overall["wait_growth_max"] <= TARGETS["wait_growth_max"],
    }
    results["setup"] = {
        "gpus": capacity,
        "load": LOAD,
        "pods_per_window": args.pods,
        "shares": {"inference": INFERENCE, "preemptible": PREEMPTIBLE},
        "quotas": {"train": TRAIN_SHARE, "serve": SERVE_SHARE},
        "checkpoint_s": CHECKPOINT_S,
        "seeds": seeds,
        "notice": "not simulated: a preempted attempt yields at once; a real backend adds TRAINYARD_PREEMPT_GRACE_S",
    }
    if args.scenario == "all":
        results["lending"] = lending
    elif args.output.exists():  # the preemption part only: the lending part already there is kept
        import json

        kept = json.loads(args.output.read_text()).get("lending")
        if kept:
            results["lending"] = kept
    results["environment"] = {"python": py_platform.python_version(), "seconds": round(time.perf_counter() - t0, 1)}
    write_json(args.output, results)
    print(
        f"overall: wait growth max {overall['wait_growth_max']} (target <= 0.05); lost {overall['lost_gpu_hours']} "
        f"GPU-h; reclaim p99 {overall['reclaim_p99_s']} s over {overall['reclaims']}"
    )
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
