"""The Volcano backend on a real control plane at the trace's scale, against a floor of the same pods without it.

What runs: a control plane of its own (`scripts/cluster/cluster.py` with ``TRAINYARD_CLUSTER_DIR=var/bench-k8s``:
etcd, kube-apiserver with its audit log, kube-controller-manager, kube-scheduler, Volcano's scheduler, controllers
and webhooks, kwok), no default nodes; the openb trace's GPU nodes as kwok nodes (their CPUs, memory, GPU count
and model as GPU Feature Discovery labels); a benchmark database (``<db>_bench_k8s``), migrated and seeded on the
Volcano backend with the platform's own service account; the real web server (uvicorn, as ``make run``), a real
Celery worker process (starts) and the dispatcher process (admission passes); the observe task's code
(``jobs.tasks.observe_pass``: never two at once, a rest after a long pass) every ``TRAINYARD_OBSERVE_EVERY_S`` (2 s)
in this process, as beat would send it. ``--cores split`` (the default) runs the control plane and kwok on half of the
cores and the platform (its processes, its embedded PostgreSQL and Redis, this process) on the other half, in both
phases: deployed, they run on machines of their own, and on shared cores kwok, standing in for every node's kubelet,
fell behind on its heartbeats and nodes went NotReady in the platform phase only. ``--cores shared`` runs
everything everywhere.

1. Platform: the trace's GPU pods (resampled to 105% of capacity and shuffled, seed 0, as bench-scheduler does),
   cut where the arrived GPU requests reach 100% of the cluster's cards, are POSTed to ``/api/v1/jobs/`` in
   arrival order (4 clients in flight). A fractional-GPU pod is submitted as one whole card: the nodes advertise
   whole cards (``nvidia.com/gpu``), and time-sliced shares need the device plugin's shared resource. A watch on
   the team namespace's pods records when each pod is created, bound (``spec.nodeName``) and Running (kwok's
   Stage). Jobs that do not fit wait in the platform's queue. The phase ends when no pod has become Running for
   20 s after the last submission.
2. Floor: the Volcano jobs the platform created are read back, every one is deleted, and the same objects
   (renamed) are created directly with the admin credentials, back to back in the same order (4 in flight): the
   same pods, the same pins to the same nodes, the same queue. Nothing of the platform runs. The phase ends when as
   many pods are Running as in the platform's phase and none has become Running for 20 s: a pause of Volcano's
   alone no longer ends it early (at ``8487949`` the floor stopped at 1,626 of 5,923 pods).
3. API requests: the audit log's entries of the platform's service account
   (``system:serviceaccount:trainyard:trainyard``) during the platform phase, per job submitted, by verb and
   resource. The jobs are still running at the end of the phase: requests of their end (deletes, the final log
   copy) are not in the figure.

Targets: the platform takes at most 20% longer than the floor from the first submission to the last pod bound;
at most 10 API requests per job.

Run: ``make bench-k8s`` (``--quick``: the first 64 trace nodes). Results: ``bench/results/k8s.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform as py_platform
import random
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "k8s.json"
CLUSTER_DIR = REPO / "var" / "bench-k8s"
CLUSTER = REPO / "scripts" / "cluster" / "cluster.py"
TEAM_NS = "trainyard-demo"
JOBS = ("batch.volcano.sh", "v1alpha1", "jobs")
PLATFORM_USER = "system:serviceaccount:trainyard:trainyard"
TARGETS = {"bind_overhead_pct": 20.0, "api_requests_per_job": 10.0}
# Between the phases: a pod deleted this long ago that no kubelet confirmed (kwok behind, its node NotReady) is
# force-deleted, as the pod garbage collector does for a node that is gone.
STUCK_DELETE_S = 120
CLIENTS = 4
QUIET_S = 20.0
GPU_MIB = 32 * 1024


def log(msg: str) -> None:
    print(f"bench k8s: {msg}", flush=True)


def percentile(values: list[float], pct: float) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    k = max(0, min(len(ordered) - 1, int(round(pct / 100 * len(ordered) + 0.5)) - 1))
    return round(ordered[k], 3)


def cluster(command: str, env: dict[str, str], cpus: set[int] | None = None) -> subprocess.CompletedProcess:
    """Run `cluster.py COMMAND`; with `cpus`, it and every component it starts run on those cores only."""
    return subprocess.run(
        [sys.executable, str(CLUSTER), command], cwd=REPO, env=env, capture_output=True, text=True, timeout=3600,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )  # fmt: skip


def core_split(mode: str) -> tuple[set[int], set[int]] | None:
    """(the control plane's cores, the platform's cores), or None to share them all.

    Deployed, the control plane (API server, etcd, controllers, Volcano) and the nodes' kubelets run on machines of
    their own and the platform on others; here they share one machine. "split" gives each side half of this
    process's cores in both phases (on 2 cores: one each), so neither phase's control plane competes with the
    platform for CPU, and the floor's control plane has exactly the cores the platform phase's had."""
    if mode == "shared":
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("bench k8s: --cores split needs at least 2 cores; use --cores shared")
    half = len(cores) // 2
    return set(cores[half:]), set(cores[:half])


def pin_platform_services(cpus: set[int]) -> list[str]:
    """Move the platform's own PostgreSQL and Redis (the embedded ones this checkout runs, with their children) onto
    the platform's cores. Services configured elsewhere are left alone. Returns what was moved."""
    import psutil

    moved = []
    here = str(REPO)  # the embedded servers' binaries are in the virtual environment, their data under var/
    for proc in psutil.process_iter(["name", "cmdline"]):
        name, cmd = proc.info["name"] or "", " ".join(proc.info["cmdline"] or [])
        if not (name.startswith("postgres") or name.startswith("redis")) or here not in cmd:
            continue
        try:
            for each in [proc, *proc.children(recursive=True)]:
                each.cpu_affinity(sorted(cpus))
            moved.append(name)
        except psutil.Error:
            pass
    return moved


def node_object(spec, kwok_port: int) -> dict:
    name = spec.name.lower()
    model = spec.gpu_model or "unknown"
    labels = {
        "kubernetes.io/hostname": name, "kwok.x-k8s.io/node": "fake", "kubernetes.io/os": "linux", "type": "kwok",
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": model, "nvidia.com/gpu.memory": str(GPU_MIB),
        "nvidia.com/gpu.count": str(spec.num_gpus), "nvidia.com/cuda.driver-version.major": "550",
        "nvidia.com/cuda.driver-version.minor": "54", "nvidia.com/cuda.driver-version.revision": "15",
        "nvidia.com/cuda.driver-version.full": "550.54.15", "nvidia.com/cuda.runtime-version.full": "12.4",
    }  # fmt: skip
    resources = {
        "cpu": f"{spec.cpu_milli}m",
        "memory": f"{spec.memory_mib or 0}Mi",
        "pods": "110",
        "nvidia.com/gpu": str(spec.num_gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {},
        "status": {"capacity": resources, "allocatable": resources,
                   "daemonEndpoints": {"kubeletEndpoint": {"Port": kwok_port}}},
    }  # fmt: skip


class PodWatch:
    """When each pod of the team namespace was first seen, bound and Running (this machine's clock)."""

    def __init__(self, api_client) -> None:
        from kubernetes import client as k8s

        self.core = k8s.CoreV1Api(api_client)
        self.created: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.job_of: dict[str, str] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        from kubernetes import watch

        version = self.core.list_namespaced_pod(TEAM_NS, limit=1).metadata.resource_version
        while not self.stop.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(
                    self.core.list_namespaced_pod, TEAM_NS, resource_version=version, timeout_seconds=30
                ):
                    pod = event["object"]
                    version = pod.metadata.resource_version
                    name, now = pod.metadata.name, time.time()
                    if event["type"] == "DELETED":
                        continue
                    self.created.setdefault(name, now)
                    self.job_of.setdefault(name, (pod.metadata.labels or {}).get("trainyard.io/job-id", ""))
                    if pod.spec.node_name:
                        self.bound.setdefault(name, now)
                    if pod.status and pod.status.phase == "Running":
                        self.running.setdefault(name, now)
                    if self.stop.is_set():
                        break
            except Exception as exc:  # noqa: BLE001 - a watch that expired (410) starts again from a fresh list
                if "410" in str(exc):
                    version = self.core.list_namespaced_pod(TEAM_NS, limit=1).metadata.resource_version
                else:
                    time.sleep(0.5)

    def reset(self) -> None:
        self.created.clear()
        self.bound.clear()
        self.running.clear()
        self.job_of.clear()


def wait_quiet(watch: PodWatch, *, since: float, quiet_s: float, until: float, at_least: int = 0) -> bool:
    """Until at least `at_least` pods are Running and none has become Running for quiet_s (counted from `since` at
    the earliest): True; False when the phase's time (`until`) ran out first. A pause longer than quiet_s while
    Volcano is still making pods does not end a phase that has a count to reach (the floor's: the platform's)."""
    while time.time() < until:
        last = max([since, *watch.running.values()])
        if time.time() - last > quiet_s and len(watch.running) >= at_least:
            return True
        time.sleep(1.0)
    log("the phase's time ran out with pods still starting: cut off")
    return False


def audit_requests(audit_dir: Path, start: float, end: float) -> tuple[int, Counter]:
    total, by = 0, Counter()
    for path in sorted(audit_dir.glob("audit*.log")):
        with open(path, errors="replace") as fh:
            for line in fh:
                if PLATFORM_USER not in line:
                    continue
                entry = json.loads(line)
                if (entry.get("user") or {}).get("username") != PLATFORM_USER:
                    continue
                at = datetime.fromisoformat(entry["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
                if not start <= at <= end:
                    continue
                ref = entry.get("objectRef") or {}
                what = ref.get("resource", entry.get("requestURI", "?"))
                if ref.get("subresource"):
                    what += "/" + ref["subresource"]
                total += 1
                by[f"{entry['verb']} {what}"] += 1
    return total, by


def phase_summary(watch: PodWatch, starts: dict[str, float], t0: float) -> dict[str, Any]:
    """From the first submission: jobs bound and Running per second, and each job's submit->Running."""
    bound_t = sorted(watch.bound.values())
    running_t = sorted(watch.running.values())
    to_running = [watch.running[p] - starts[j] for p, j in watch.job_of.items() if p in watch.running and j in starts]
    to_bound = [watch.bound[p] - starts[j] for p, j in watch.job_of.items() if p in watch.bound and j in starts]
    bind_s = (bound_t[-1] - t0) if bound_t else None
    run_s = (running_t[-1] - t0) if running_t else None
    return {
        "pods_bound": len(bound_t),
        "pods_running": len(running_t),
        "first_to_last_bound_s": round(bind_s, 2) if bind_s else None,
        "first_to_last_running_s": round(run_s, 2) if run_s else None,
        "bound_per_s": round(len(bound_t) / bind_s, 1) if bind_s else None,
        "running_per_s": round(len(running_t) / run_s, 1) if run_s else None,
        "to_bound_p50_s": percentile(to_bound, 50),
        "to_bound_p99_s": percentile(to_bound, 99),
        "to_running_p50_s": percentile(to_running, 50),
        "to_running_p99_s": percentile(to_running, 99),
    }


def cpu_seconds(labelled: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) used so far by the benchmark's cluster (each component, by process name), its
    PostgreSQL backends and the platform's processes (`labelled`: a name for each parent pid, its children
    counted with it). A phase's figure is the difference of two of these."""
    import psutil

    used: Counter = Counter()

    def add(label: str, proc) -> None:
        try:
            times = proc.cpu_times()
            used[label] += times.user + times.system
        except psutil.Error:
            pass

    for proc in psutil.process_iter(["name", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if str(CLUSTER_DIR) in cmd and proc.pid != os.getpid():
            add(proc.info["name"] or "?", proc)
        elif (proc.info["name"] or "").startswith("postgres") and "_bench_k8s" in cmd:
            add("postgres", proc)
    for label, pid in labelled.items():
        try:
            parent = psutil.Process(pid)
        except psutil.Error:
            continue
        for proc in [parent, *parent.children(recursive=True)]:
            add(label, proc)
    return dict(used)


def cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before.get(k, 0.0), 1) for k in sorted(after, key=lambda k: -after[k])}


def stages(watch: PodWatch, starts: dict[str, float], marks: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Where each job's time to bound went, p50/p99 per step: the platform's own steps (`marks`: when the job was
    admitted, when its Volcano job was created), then Volcano's (its controller makes the pod, its scheduler
    binds it)."""
    first_pod: dict[str, float] = {}
    bound: dict[str, float] = {}
    for pod, job in watch.job_of.items():
        if pod in watch.created:
            first_pod[job] = min(first_pod.get(job, float("inf")), watch.created[pod])
        if pod in watch.bound:
            bound[job] = max(bound.get(job, 0.0), watch.bound[pod])
    points = {"submitted": starts, **marks, "pod_created": first_pod, "bound": bound}
    names = list(points)
    out: dict[str, Any] = {}
    for a, b in zip(names, names[1:], strict=False):
        gaps = [points[b][j] - points[a][j] for j in starts if j in points[a] and j in points[b]]
        out[f"{a}_to_{b}"] = {"p50_s": percentile(gaps, 50), "p99_s": percentile(gaps, 99), "n": len(gaps)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.k8s", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the first 64 trace nodes")
    parser.add_argument("--nodes", type=int, default=None, help="the first N trace nodes (default all)")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument(
        "--phase-limit-s",
        type=float,
        default=3600.0,
        help="each phase (platform, floor) is cut off after this long from its first submission",
    )
    parser.add_argument(
        "--delete-limit-s",
        type=float,
        default=2700.0,
        help="between the phases: how long the platform's Volcano jobs and pods may take to go (no floor when not)",
    )
    parser.add_argument("--keep-cluster", action="store_true", help="leave the benchmark's cluster running")
    parser.add_argument(
        "--profile-observe",
        type=Path,
        default=None,
        help="write a cProfile of the platform phase's observe passes to this file (pstats format)",
    )
    parser.add_argument(
        "--cores",
        choices=("split", "shared"),
        default="split",
        help="split (default): the control plane and kwok on half of the cores, the platform and this process on "
        "the other half, in both phases; shared: everything on every core",
    )
    args = parser.parse_args(argv)

    from bench.allocator import arrivals, load_trace, trace_dir_from_env
    from bench.scheduler import trace_present

    trace_dir = trace_dir_from_env()
    if not trace_present(trace_dir, "k8s"):
        return 1 if os.environ.get("CI") == "true" else 0
    nodes, pods = load_trace(trace_dir)
    limit = args.nodes or (64 if args.quick else None)
    nodes = [n for n in nodes if n.num_gpus][:limit] if limit else [n for n in nodes if n.num_gpus]
    capacity = sum(n.num_gpus for n in nodes)
    models = {n.gpu_model for n in nodes}
    gpu_pods = [p for p in pods if p.num_gpus and (not p.gpu_model or p.gpu_model & models)]
    sequence, arrived = [], 0
    for req in arrivals(gpu_pods, capacity * 1000, random.Random(0)):
        if arrived + req.num_gpus > capacity:
            break
        sequence.append(req)
        arrived += req.num_gpus
    log(f"{len(nodes)} nodes, {capacity} GPUs; {len(sequence)} jobs asking for {arrived} whole GPUs")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still stops its cluster and processes
    env = {**os.environ, "TRAINYARD_CLUSTER_DIR": str(CLUSTER_DIR), "TRAINYARD_CLUSTER_NODES": "0"}
    cluster("down", env)
    shutil.rmtree(CLUSTER_DIR / "etcd", ignore_errors=True)  # every run starts from an empty cluster
    for old in (CLUSTER_DIR / "audit").glob("audit*.log"):
        old.unlink()
    split = core_split(args.cores)
    t_up = time.monotonic()
    up = cluster("up", env, cpus=split[0] if split else None)
    if up.returncode != 0:
        print((up.stdout + up.stderr)[-3000:])
        return 1
    state = json.loads((CLUSTER_DIR / "state.json").read_text())
    log(f"cluster up in {time.monotonic() - t_up:.1f} s: Kubernetes {state['versions']['kubernetes']}, "
        f"Volcano {state['versions'].get('volcano')}")  # fmt: skip
    if split:
        # This process (the observe passes, the floor's creates) and what it starts (web, worker, dispatcher).
        os.sched_setaffinity(0, split[1])
        moved = pin_platform_services(split[1])
        log(f"cores: control plane and kwok on {sorted(split[0])}, the platform on {sorted(split[1])} "
            f"(with {', '.join(moved) or 'no embedded database'})")  # fmt: skip
    children: list[subprocess.Popen] = []
    try:
        return run(args, state, nodes, sequence, capacity, children)
    finally:
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
        if not args.keep_cluster:
            cluster("down", env)


def run(args, state: dict, nodes, sequence, capacity: int, children: list) -> int:
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    admin_client = k8s_config.new_client_from_config(config_file=state["admin_kubeconfig"])
    admin_client.configuration.connection_pool_maxsize = 16
    core, custom = k8s.CoreV1Api(admin_client), k8s.CustomObjectsApi(admin_client)
    t = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: core.create_node(node_object(n, state["ports"]["kwok"])), nodes))
    while True:
        ready = sum(
            1 for n in core.list_node().items if any(c.type == "Ready" and c.status == "True" for c in
                                                     n.status.conditions or [])
        )  # fmt: skip
        if ready >= len(nodes) or time.monotonic() - t > 300:
            break
        time.sleep(1)
    log(f"{ready} kwok nodes Ready in {time.monotonic() - t:.1f} s")

    from bench.api import WebServer, bench_database_url, recreate_database, setup_django

    configured = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/trainyard")
    db_url = bench_database_url(configured, f"{(configured.rsplit('/', 1)[-1] or 'trainyard')}_bench_k8s")
    recreate_database(db_url)
    run_id = secrets.token_hex(4)
    overrides = {
        "DATABASE_URL": db_url,
        "TRAINYARD_CELERY_QUEUE": f"bench-k8s-{run_id}",
        "TRAINYARD_START_QUEUE": "",  # starts on the same worker, as `make run`
        "TRAINYARD_CACHE_PREFIX": f"bench-k8s-{run_id}",
        "TRAINYARD_CHANNEL_PREFIX": f"bench-k8s-{run_id}",
        "TRAINYARD_RATE_SUBMIT": "100000/s",
        "TRAINYARD_RATE_READ": "100000/s",
        "TRAINYARD_RATE_WRITE": "100000/s",
        "TRAINYARD_BACKEND": "volcano",
        "TRAINYARD_K8S_KUBECONFIG": state["kubeconfig"],
        "TRAINYARD_K8S_NAMESPACE": "trainyard",
        "TRAINYARD_NVML_PROBE": "false",
        "TRAINYARD_SILENCED_CHECKS": "jobs.E002,jobs.E003",  # pods here never reach anything: nothing runs
        "TRAINYARD_S3_URL": "",
        "TRAINYARD_LOG_LEVEL": "WARNING",
    }
    os.environ.update(overrides)
    setup_django()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from bench.scheduler import job_body, open_queue
    from jobs.backends import get_backend
    from jobs.tasks import observe_pass, sync_inventory
    from ops import processes
    from ops.seed import seed
    from quotas.models import Queue
    from quotas.tokens import token_create

    call_command("migrate", verbosity=0, interactive=False)
    seed(admin_password=secrets.token_urlsafe(16), demo_password=secrets.token_urlsafe(16))
    open_queue()
    # What a registry lookup would have pinned the seeded bases to (a Kubernetes job names `repo@sha256:…`; no
    # registry is reachable from here and no image is ever pulled by kwok).
    from images.models import BaseImage

    BaseImage.objects.filter(digest="").update(digest="sha256:" + "4" * 64)
    Queue.objects.filter(name="train").update(ordering="fifo")
    backend = get_backend()
    for queue in Queue.objects.all():
        backend.queue_sync(queue)
    t = time.monotonic()
    sync_inventory()
    log(f"inventory synced in {time.monotonic() - t:.1f} s")
    demo = get_user_model().objects.get(username="demo")
    _, token = token_create(user=demo, name="bench-k8s")

    workdir = CLUSTER_DIR / "platform"
    workdir.mkdir(parents=True, exist_ok=True)
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRAINYARD_LOG_LEVEL": "INFO"}
    server = WebServer(child_env, workdir / "web.log")
    server.start()
    children.append(server.proc)
    worker_log = open(workdir / "worker.log", "ab")  # noqa: SIM115 - the worker's and dispatcher's whole life
    for name in ("worker", "dispatcher"):  # as `make run` starts them (ops.processes)
        children.append(
            subprocess.Popen(
                [sys.executable, "-m", *processes.command(name, environ=child_env)], cwd=REPO, stdout=worker_log,
                stderr=subprocess.STDOUT, env={**child_env, **processes.environment(name, child_env)},
                start_new_session=True,
            )
        )  # fmt: skip
    time.sleep(5)

    watch = PodWatch(admin_client)
    watch.start()
    stop_observing = threading.Event()
    passes: list[tuple[float, float]] = []  # each observe pass: wall seconds, this thread's CPU seconds

    def observer() -> None:
        from django.db import close_old_connections

        every = float(os.environ.get("TRAINYARD_OBSERVE_EVERY_S", "2.0"))
        profile = None
        if args.profile_observe:
            import cProfile

            profile = cProfile.Profile()
        while not stop_observing.is_set():
            began, cpu = time.monotonic(), time.thread_time()
            ran = True
            try:
                ran = (profile.runcall(observe_pass) if profile is not None else observe_pass()) is not None
            except Exception as exc:  # noqa: BLE001 - the next pass tries again, as beat's would
                log(f"observe pass failed: {exc}")
            close_old_connections()
            if ran:  # not skipped (jobs.tasks.observe_pass: resting after a long pass)
                passes.append((time.monotonic() - began, time.thread_time() - cpu))
            stop_observing.wait(max(0.0, every - (time.monotonic() - began)))
        if profile is not None:
            profile.dump_stats(str(args.profile_observe))

    observing = threading.Thread(target=observer, daemon=True)
    observing.start()

    # 1. The platform: REST submissions in arrival order.
    bodies = []
    for req in sequence:
        body = job_body(req)
        body["gpu_milli"] = 1000
        body.pop("spec")  # an explicit request (the queue allows it), not a named spec
        bodies.append(body)
    starts: dict[str, float] = {}
    errors: list[str] = []
    headers = {"Authorization": f"Bearer {token}"}
    platform_pids = dict(zip(("web", "worker", "dispatcher"), (c.pid for c in children), strict=True))
    cpu_before = cpu_seconds(platform_pids)
    t0 = time.time()
    with httpx.Client(base_url=server.base_url, headers=headers, timeout=60) as http:

        def post(body):
            sent = time.time()
            if sent > t0 + args.phase_limit_s:
                return
            answer = http.post("/api/v1/jobs/", json=body, headers={"Idempotency-Key": secrets.token_hex(8)})
            if answer.status_code != 201:
                errors.append(f"{answer.status_code} {answer.text[:200]}")
                return
            starts[answer.json()["id"]] = sent

        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(post, bodies))
    submitted_s = time.time() - t0
    log(f"{len(starts)} jobs submitted in {submitted_s:.1f} s ({len(errors)} refused)")
    quiet = wait_quiet(watch, since=time.time(), quiet_s=QUIET_S, until=t0 + args.phase_limit_s)
    t_end = time.time()
    cpu_after = cpu_seconds(platform_pids)
    stop_observing.set()
    observing.join(timeout=120)
    platform = phase_summary(watch, starts, t0)
    walls = [w for w, _ in passes]
    platform["cpu_s"] = {
        **cpu_used(cpu_before, cpu_after),
        "observe (this process)": round(sum(c for _, c in passes), 1),
    }
    platform["observe_passes"] = {
        "n": len(passes), "wall_p50_s": percentile(walls, 50), "wall_max_s": round(max(walls, default=0.0), 2),
        "cpu_p50_s": percentile([c for _, c in passes], 50),
    }  # fmt: skip
    platform.update(
        completed=quiet,
        jobs_submitted=len(starts),
        refused=len(errors),
        refusals=errors[:5],
        submit_s=round(submitted_s, 1),
    )
    from jobs.models import Job, JobEvent

    # When the platform itself saw each job running (its observe pass), not only when kwok said so.
    seen = dict(JobEvent.objects.filter(to_state="running").values_list("job_id", "at"))
    seen = {str(k): v for k, v in seen.items()}
    observed = [seen[j].timestamp() - starts[j] for j in starts if j in seen]
    platform.update(
        observed_running=len(observed),
        observed_running_p50_s=percentile(observed, 50),
        observed_running_p99_s=percentile(observed, 99),
    )
    platform["job_states"] = dict(Counter(Job.objects.values_list("state", flat=True)))
    # Jobs the platform did not admit (whole cards left on no single node, when the cluster is full), and why.
    platform["waiting_reasons"] = dict(Counter(Job.objects.filter(state="pending").values_list("reason", flat=True)))
    marks: dict[str, dict[str, float]] = {"admitted": {}, "vcjob_created": {}}
    # The job moves to starting once its Volcano job was created (the backend's submit returned).
    for job_id, to_state, at in JobEvent.objects.filter(to_state__in=("admitted", "starting")).values_list(
        "job_id", "to_state", "at"
    ):
        mark = marks["admitted" if to_state == "admitted" else "vcjob_created"]
        mark.setdefault(str(job_id), at.timestamp())
    platform["stages"] = stages(watch, starts, marks)
    log(f"platform: {platform}")
    workers = children[-2:]  # the worker and the dispatcher
    for process in workers:
        process.terminate()
    for process in workers:
        process.wait(timeout=30)
    audit_total, audit_by = audit_requests(CLUSTER_DIR / "audit", t0 - 1, t_end + 1)

    # 2. The floor: the same Volcano jobs, created directly.
    made = custom.list_namespaced_custom_object(*JOBS[:2], TEAM_NS, JOBS[2])["items"]
    order = {job_id: i for i, job_id in enumerate(sorted(starts, key=starts.get))}
    made.sort(key=lambda j: order.get((j["metadata"].get("labels") or {}).get("trainyard.io/job-id"), 10**9))
    copies = []
    for i, job in enumerate(made):
        meta = job["metadata"]
        copies.append({
            "apiVersion": job["apiVersion"], "kind": job["kind"],
            "metadata": {"name": f"floor-{i}", "labels": meta.get("labels") or {},
                         "annotations": meta.get("annotations") or {}},
            "spec": job["spec"],
        })  # fmt: skip

    result = result_of(args, state, nodes, capacity, starts, bodies, sequence, platform, None, audit_total, audit_by)
    out = args.output or RESULTS
    if args.output is None and result["quick"]:
        out = RESULTS.with_name("k8s-quick.json" if args.quick else f"k8s-{len(nodes)}-nodes.json")
    out.write_text(json.dumps(result, indent=2) + "\n")  # the platform's phase is kept if the floor's fails
    log(f"wrote the platform's phase to {out}")
    floor, floor_error, deleted_s, forced = None, None, None, 0
    try:
        deleted_s, forced = delete_platform_jobs(args, custom, core)
        # The floor's pods: those of the platform's Volcano jobs still there (a retried attempt's earlier pods are in
        # the platform's count, not in the copies), at most as many as were Running in the platform's phase.
        pods_in_copies = sum(int(t.get("replicas", 1)) for c in copies for t in c["spec"].get("tasks", []))
        floor = floor_phase(args, custom, watch, copies, min(platform["pods_running"], pods_in_copies))
    except SystemExit as exc:
        floor_error = str(exc)
        log(f"no floor: {floor_error}")
    watch.stop.set()
    result = result_of(args, state, nodes, capacity, starts, bodies, sequence, platform, floor, audit_total, audit_by)
    result.update(floor_error=floor_error, between_phases={"deleted_s": deleted_s, "pods_force_deleted": forced})
    print_table(result)
    out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {out}")
    return 0 if floor is not None else 1


def delete_platform_jobs(args, custom, core) -> tuple[float, int]:
    """The platform's Volcano jobs deleted and their pods gone, within --delete-limit-s (SystemExit when not)."""
    t = time.monotonic()

    def delete_left() -> None:
        """Every Volcano job still there, one by one (a collection delete of thousands outlasts the API server's
        60 s request timeout on this machine)."""
        left = custom.list_namespaced_custom_object(*JOBS[:2], TEAM_NS, JOBS[2])["items"]

        def delete(name: str) -> None:
            try:
                custom.delete_namespaced_custom_object(
                    *JOBS[:2], TEAM_NS, JOBS[2], name, propagation_policy="Background"
                )
            except Exception:  # noqa: BLE001 - gone already, or the next round deletes it
                pass

        with ThreadPoolExecutor(CLIENTS) as pool:
            list(pool.map(delete, [j["metadata"]["name"] for j in left if not j["metadata"].get("deletionTimestamp")]))

    def force_stuck(older_than_s: float) -> int:
        """Pods deleted longer ago than `older_than_s` that no kubelet confirmed (kwok behind on a NotReady node):
        removed at once, as a node's pod garbage collector would; counted in the result."""
        now, forced = datetime.now(UTC), 0
        for pod in core.list_namespaced_pod(TEAM_NS).items:
            since = pod.metadata.deletion_timestamp
            if since and (now - since).total_seconds() > older_than_s:
                try:
                    core.delete_namespaced_pod(pod.metadata.name, TEAM_NS, grace_period_seconds=0)
                    forced += 1
                except Exception:  # noqa: BLE001 - gone meanwhile
                    pass
        return forced

    delete_left()
    rounds = forced = 0
    while (
        core.list_namespaced_pod(TEAM_NS, limit=1).items
        or custom.list_namespaced_custom_object(*JOBS[:2], TEAM_NS, JOBS[2], limit=1)["items"]
    ):
        if time.monotonic() - t > args.delete_limit_s:
            raise SystemExit(f"the platform's pods were not gone after {args.delete_limit_s:.0f} s")
        rounds += 1
        if rounds % 30 == 0:
            delete_left()
            forced += force_stuck(STUCK_DELETE_S)
        time.sleep(1)
    deleted_s = round(time.monotonic() - t, 1)
    log(f"the platform's Volcano jobs deleted, pods gone in {deleted_s} s ({forced} pods force-deleted)")
    return deleted_s, forced


def floor_phase(args, custom, watch, copies: list[dict], expect_running: int) -> dict:
    """The same Volcano jobs created directly, 4 in flight, until as many pods are Running as in the platform's
    phase and none became Running for QUIET_S (or the phase's time runs out: then `completed` is false)."""
    watch.reset()
    floor_starts: dict[str, float] = {}
    cpu_before = cpu_seconds({})
    t1 = time.time()

    def create(obj):
        floor_starts[obj["metadata"]["labels"].get("trainyard.io/job-id", obj["metadata"]["name"])] = time.time()
        custom.create_namespaced_custom_object(*JOBS[:2], TEAM_NS, JOBS[2], obj)

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(create, copies))
    log(f"{len(copies)} Volcano jobs created directly in {time.time() - t1:.1f} s")
    quiet = wait_quiet(
        watch, since=time.time(), quiet_s=QUIET_S, until=t1 + args.phase_limit_s, at_least=expect_running
    )
    floor = phase_summary(watch, floor_starts, t1)
    floor["cpu_s"] = cpu_used(cpu_before, cpu_seconds({}))
    floor["stages"] = stages(watch, floor_starts, {})
    floor.update(completed=quiet, vcjobs_created=len(copies), pods_expected=expect_running)
    log(f"floor: {floor}")
    return floor


def overhead_of(platform: dict, floor: dict | None) -> tuple[float | None, str]:
    """How much longer the platform took to bind the same pods than the floor, and by which measure."""
    if floor is None:
        return None, "no floor: its phase did not run (floor_error)"
    expected = floor.get("pods_expected", platform["pods_bound"])
    if floor["pods_bound"] < expected and floor["completed"]:
        return None, f"not comparable: the floor's phase ended with {floor['pods_bound']} pods bound of {expected}"
    if platform["completed"] and floor["completed"]:
        # Both bound everything they could: how much longer the platform took to the last pod bound.
        method = "time from the first submission to the last pod bound, platform over floor"
        longer, shorter = platform["first_to_last_bound_s"], floor["first_to_last_bound_s"]
    else:
        # A phase was cut off (--phase-limit-s): its last pod bound is the cut, not the end, so the times to the
        # last pod say nothing. Compare the rates instead: how much longer the platform takes per pod bound.
        method = "pods bound per second until the last one bound (a phase was cut off), floor over platform"
        longer, shorter = floor["bound_per_s"], platform["bound_per_s"]
    return (round(100.0 * (longer / shorter - 1.0), 1) if longer and shorter else None), method


def result_of(args, state, nodes, capacity, starts, bodies, sequence, platform, floor, audit_total, audit_by) -> dict:
    per_job = round(audit_total / max(1, len(starts)), 2)
    overhead, method = overhead_of(platform, floor)
    return {
        "benchmark": "k8s",
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip(),
        "dirty": bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--", ".", ":!bench/results"], cwd=REPO, capture_output=True, text=True
            ).stdout.strip()
        ),  # fmt: skip
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "python": py_platform.python_version(),
        "quick": bool(args.quick or args.nodes),
        "versions": state["versions"],
        "process_model": "uvicorn web server, one Celery worker (prefork, TRAINYARD_WORKER_CONCURRENCY) and the "
        "dispatcher (one solo-pool process) as `make run` starts them; the observe task's code every "
        "TRAINYARD_OBSERVE_EVERY_S in the benchmark process; "
        "the control plane, kwok and PostgreSQL/Redis on the same machine; "
        + (
            "cores split: the control plane and kwok on half of them, the platform, its database and the benchmark "
            "process (the floor's creates) on the other half, in both phases"
            if args.cores == "split"
            else "cores shared by everything"
        ),
        "cores": args.cores,
        "cluster": {"nodes": len(nodes), "gpus": capacity},
        "jobs": {
            "submitted": len(starts),
            "gpus_asked": sum(b.get("gpus", 1) for b in bodies),
            "fractional_submitted_whole": sum(1 for r in sequence if r.gpu_milli < 1000),
        },  # fmt: skip
        "platform": platform,
        "floor": floor,
        "bind_overhead_pct": overhead,
        "bind_overhead_method": method,
        "api_requests": {"total": audit_total, "per_job": per_job, "by_verb_resource": dict(audit_by.most_common())},
        "targets": TARGETS,
        "met": {
            "bind_overhead_pct": overhead is not None and overhead <= TARGETS["bind_overhead_pct"],
            "api_requests_per_job": per_job <= TARGETS["api_requests_per_job"],
        },
    }


def print_table(r: dict) -> None:
    p, f = r["platform"], r["floor"] or defaultdict(lambda: "-")
    rows = [
        ("pods bound", p["pods_bound"], f["pods_bound"]),
        ("pods Running", p["pods_running"], f["pods_running"]),
        ("first submit -> last bound (s)", p["first_to_last_bound_s"], f["first_to_last_bound_s"]),
        ("first submit -> last Running (s)", p["first_to_last_running_s"], f["first_to_last_running_s"]),
        ("bound per s", p["bound_per_s"], f["bound_per_s"]),
        ("Running per s", p["running_per_s"], f["running_per_s"]),
        ("submit -> Running p50 (s)", p["to_running_p50_s"], f["to_running_p50_s"]),
        ("submit -> Running p99 (s)", p["to_running_p99_s"], f["to_running_p99_s"]),
        ("submit -> running, as the platform saw it, p50 (s)", p.get("observed_running_p50_s"), "-"),
        ("submit -> running, as the platform saw it, p99 (s)", p.get("observed_running_p99_s"), "-"),
    ]
    print(f"\n{r['cluster']['nodes']} nodes, {r['cluster']['gpus']} GPUs, {r['jobs']['submitted']} jobs; "
          f"Kubernetes {r['versions']['kubernetes']}, Volcano {r['versions'].get('volcano')}")  # fmt: skip
    print(f"{'':52} {'platform':>10} {'floor':>10}")
    for label, a, b in rows:
        print(f"{label:52} {a!s:>10} {b!s:>10}")
    print(f"bind overhead {r['bind_overhead_pct']}% (target <= {TARGETS['bind_overhead_pct']}%): "
          f"{'met' if r['met']['bind_overhead_pct'] else 'NOT met'}; by {r['bind_overhead_method']}")  # fmt: skip
    print(f"API requests per job {r['api_requests']['per_job']} (target <= {TARGETS['api_requests_per_job']}): "
          f"{'met' if r['met']['api_requests_per_job'] else 'NOT met'}")  # fmt: skip
    if r.get("floor_error"):
        print(f"no floor: {r['floor_error']}")
    for phase in ("platform", "floor") if r["floor"] else ("platform",):
        print(f"{phase} CPU seconds: " + ", ".join(f"{k} {v}" for k, v in r[phase].get("cpu_s", {}).items()))
        steps = ", ".join(f"{k} {v['p50_s']}/{v['p99_s']}" for k, v in r[phase].get("stages", {}).items())
        print(f"{phase} steps p50/p99 (s): {steps}")
    print(f"load average {r['load_average']}, commit {r['commit'][:10]}\n")


if __name__ == "__main__":
    sys.exit(main())
