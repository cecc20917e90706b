"""Storage benchmark: checkpoint upload, sync overhead, resume and the dataset cache, on a real S3 store.

Everything runs through the platform's own code (jobs/backends/checkpoint_sync.py, jobs/backends/dataset_cache.py,
the same the local supervisor and the Kubernetes sidecar run) against the store `TRAINYARD_S3_URL` names, else an
embedded SeaweedFS started here exactly as `make run` starts it (data in a temporary folder, removed after).

- **Upload throughput**: `--size-mib` (default 1024) of checkpoint files of 1 MiB and of 256 MiB, uploaded by the
  platform's sync (`CheckpointSync.sync_once`: checksums, Content-MD5 / multipart ETag check, size check) and by a
  bare boto3 `upload_file` of the same files to the same store, in the same run, alternating which goes first.
  Target: the platform at >= 80% of the bare client.
- **Sync overhead**: a job (a separate process) that computes and writes a checkpoint every few steps, timed
  from inside, with the uploader running beside it (as the supervisor runs it: another process's thread,
  every 0.5 s) and without; alternating runs, medians. Target: <= 5% slower.
- **Resume**: time to the first step of a job resuming from a `--size-mib` checkpoint (4 files of 256 MiB):
  restore (download, SHA-256 check) + the job's start + reading the checkpoint.
- **Dataset cache**: the time a job's dataset takes to be ready when it is not in the node's cache (fetch and
  verify) and when it is (a shared lock and a look-up).

Run with `make bench-storage`; writes bench/results/storage.json (a run with a smaller `--size-mib` writes
storage-partial.json and leaves storage.json alone).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

BASE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE))

from bench.allocator import write_json  # noqa: E402
from jobs.backends.checkpoint_sync import CheckpointSync  # noqa: E402
from jobs.backends.dataset_cache import DatasetCache  # noqa: E402
from kernel import objectstore  # noqa: E402
from ops import embedded  # noqa: E402

RESULTS = BASE / "bench" / "results"
PROCESS_MODEL = (
    "the platform's checkpoint sync and dataset cache code in the benchmark's process and in job processes it "
    "starts (a separate process per timed job, the uploader as a thread of another process, as the local "
    "supervisor runs it); the S3 store named by TRAINYARD_S3_URL, else an embedded SeaweedFS started as `make run` "
    "starts it, on the same machine; no web server, worker or database"
)
MIB = 1024 * 1024
UPLOAD_TARGET = 0.80
OVERHEAD_TARGET = 0.05

# The job of the overhead phase: CPU work per step (a stand-in for training), a checkpoint every `every` steps.
JOB = r"""
import hashlib, os, sys, time
steps, every, ckpt_mib, work = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
folder = os.environ["TRAINYARD_CHECKPOINT_DIR"]
block = os.urandom(1024 * 1024)
start = time.perf_counter()
h = hashlib.sha256()
for step in range(1, steps + 1):
    for _ in range(work):
        h.update(block)
    if step % every == 0:
        with open(os.path.join(folder, f"ckpt-{step}.pt"), "wb") as f:
            for _ in range(ckpt_mib):
                f.write(block)
print(time.perf_counter() - start)
"""

FIRST_STEP = r"""
import os, sys, time
total = 0
for root, _, files in os.walk(os.environ["TRAINYARD_RESUME_FROM"]):
    for name in files:
        with open(os.path.join(root, name), "rb") as f:
            while chunk := f.read(8 * 1024 * 1024):
                total += len(chunk)
print(total)
"""


def _write_files(folder: Path, total_mib: int, file_mib: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    block = os.urandom(MIB)
    paths = []
    for i in range(max(1, total_mib // file_mib)):
        path = folder / f"part-{i:05d}.bin"
        with open(path, "wb") as f:
            for j in range(file_mib):
                f.write(block[:8] + i.to_bytes(4, "big") + j.to_bytes(4, "big") + block[16:])
        paths.append(path)
    return paths


def _platform_upload(store, folder: Path, prefix: str) -> tuple[float, CheckpointSync]:
    state = folder.parent / f"state-{uuid.uuid4().hex[:6]}"
    state.mkdir()
    sync = CheckpointSync(state, {"dir": str(folder), "store": store.to_dict(), "prefix": prefix, "sync_s": 3600})
    sync.s3()  # the client and bucket check, as a running supervisor already has them
    started = time.perf_counter()
    done = sync.sync_once(final=True)
    elapsed = time.perf_counter() - started
    if not done or sync.error:
        raise RuntimeError(f"platform upload incomplete: {sync.error}")
    return elapsed, sync


def _bare_upload(store, paths: list[Path], prefix: str) -> float:
    s3 = objectstore.client(store, timeout_s=120.0)
    s3.head_bucket(Bucket=store.bucket)
    started = time.perf_counter()
    for path in paths:
        s3.upload_file(str(path), store.bucket, prefix + path.name)
    return time.perf_counter() - started


def _delete_prefix(store, prefix: str) -> None:
    s3 = objectstore.client(store)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=store.bucket, Prefix=prefix):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            s3.delete_objects(Bucket=store.bucket, Delete={"Objects": keys})


def upload_phase(store, work: Path, total_mib: int, reps: int) -> tuple[dict, dict]:
    results = {}
    keep = None
    for file_mib in (1, 256):
        folder = work / f"upload-{file_mib}m"
        paths = _write_files(folder, total_mib, min(file_mib, total_mib))
        size = sum(p.stat().st_size for p in paths)
        runs: dict[str, list[float]] = {"platform": [], "bare_boto3": []}
        for rep in range(reps):
            order = ("platform", "bare_boto3") if rep % 2 == 0 else ("bare_boto3", "platform")
            for who in order:
                prefix = f"bench-storage/{uuid.uuid4().hex}/"
                if who == "platform":
                    elapsed, sync = _platform_upload(store, folder, prefix)
                else:
                    elapsed = _bare_upload(store, paths, prefix)
                runs[who].append(size / elapsed / MIB)
                if who == "platform" and file_mib == 256:
                    if keep is not None:  # the last one is kept: the resume phase restores it
                        _delete_prefix(store, keep[0])
                    keep = (prefix, sync)
                else:
                    _delete_prefix(store, prefix)
        plat, bare = statistics.median(runs["platform"]), statistics.median(runs["bare_boto3"])
        results[f"{file_mib}MiB_files"] = {
            "files": len(paths),
            "bytes": size,
            "platform_mib_s": round(plat, 1),
            "bare_boto3_mib_s": round(bare, 1),
            "ratio": round(plat / bare, 3),
            "target_ratio": UPLOAD_TARGET,
            "met": plat / bare >= UPLOAD_TARGET,
            "runs_mib_s": {k: [round(v, 1) for v in vs] for k, vs in runs.items()},
        }
        if file_mib == 1:
            shutil.rmtree(folder)
    return results, {"prefix": keep[0], "uploaded": keep[1].uploaded, "folder": work / "upload-256m"}


def overhead_phase(store, work: Path, reps: int, steps: int, every: int, ckpt_mib: int, work_mib: int) -> dict:
    times: dict[str, list[float]] = {"sync_off": [], "sync_on": []}
    # ABBA order: a machine that speeds up or slows down during the phase weighs on both modes alike.
    modes = [("sync_off", "sync_on", "sync_on", "sync_off")[i % 4] for i in range(reps * 2)]
    for rep, mode in enumerate(modes):
        folder = work / f"job-{rep}"
        folder.mkdir()
        sync = None
        if mode == "sync_on":
            state = work / f"job-{rep}-state"
            state.mkdir()
            prefix = f"bench-storage/{uuid.uuid4().hex}/"
            sync = CheckpointSync(state, {"dir": str(folder), "store": store.to_dict(), "prefix": prefix,
                                          "sync_s": 0.5, "final_wait_s": 60})  # fmt: skip
            sync.s3()
            sync.start()
        out = subprocess.run(
            [sys.executable, "-c", JOB, str(steps), str(every), str(ckpt_mib), str(work_mib)],
            env={**os.environ, "TRAINYARD_CHECKPOINT_DIR": str(folder)},
            capture_output=True,
            text=True,
            check=True,
        )
        times[mode].append(float(out.stdout.strip()))
        if sync is not None:
            sync.finish()
            if sync.unsaved:
                raise RuntimeError(f"sync left files unsaved: {sync.unsaved}")
            _delete_prefix(store, prefix)
        shutil.rmtree(folder)
    off, on = statistics.median(times["sync_off"]), statistics.median(times["sync_on"])
    return {
        "job": {
            "steps": steps,
            "checkpoint_every": every,
            "checkpoint_mib": ckpt_mib,
            "work_mib_hashed_per_step": work_mib,
        },
        "sync_s": 0.5,
        "median_s": {"sync_off": round(off, 3), "sync_on": round(on, 3)},
        "slowdown": round(on / off - 1, 4),
        "target_slowdown": OVERHEAD_TARGET,
        "met": on / off - 1 <= OVERHEAD_TARGET,
        "runs_s": {k: [round(v, 3) for v in vs] for k, vs in times.items()},
    }


def resume_phase(store, work: Path, kept: dict, reps: int) -> dict:
    files = [{"path": f"step-1/{rel}", "key": rec["key"], "sha256": rec["sha256"], "size": rec["size"]}
             for rel, rec in sorted(kept["uploaded"].items())]  # fmt: skip
    size = sum(f["size"] for f in files)
    plan = {"name": "step-1", "files": files}
    runs = []
    for rep in range(reps):
        folder, state = work / f"resume-{rep}", work / f"resume-{rep}-state"
        folder.mkdir()
        state.mkdir()
        sync = CheckpointSync(state, {"dir": str(folder), "store": store.to_dict(), "prefix": "unused/"})
        sync.s3()
        started = time.perf_counter()
        where = sync.restore(plan)
        restored = time.perf_counter()
        env = {**os.environ, "TRAINYARD_RESUME_FROM": str(where)}
        out = subprocess.run([sys.executable, "-c", FIRST_STEP], env=env, capture_output=True, text=True, check=True)
        first_step = time.perf_counter()
        assert int(out.stdout) == size
        runs.append({"restore_s": restored - started, "to_first_step_s": first_step - started})
        shutil.rmtree(folder)
    return {
        "checkpoint_bytes": size,
        "files": len(files),
        "restore_s": round(statistics.median(r["restore_s"] for r in runs), 2),
        "to_first_step_s": round(statistics.median(r["to_first_step_s"] for r in runs), 2),
        "restore_mib_s": round(size / MIB / statistics.median(r["restore_s"] for r in runs), 1),
        "runs": [{k: round(v, 2) for k, v in r.items()} for r in runs],
    }


def dataset_phase(store, work: Path, dataset_mib: int, reps: int) -> dict:
    folder = work / "dataset-src"
    paths = _write_files(folder, dataset_mib, 4)
    prefix = f"bench-storage/{uuid.uuid4().hex}/dataset/"
    _bare_upload(store, paths, prefix)
    size = sum(p.stat().st_size for p in paths)
    shutil.rmtree(folder)
    misses, hits = [], []
    for rep in range(reps):
        cache = DatasetCache(work / f"cache-{rep}", limit_bytes=4 * size)
        spec = {"id": rep, "team": "bench", "name": "ds", "version": 1, "prefix": prefix, "size_bytes": size,
                "file_count": len(paths)}  # fmt: skip
        started = time.perf_counter()
        held = cache.acquire(spec, store)
        misses.append(time.perf_counter() - started)
        assert held.fetched
        held.release()
        for _ in range(5):
            started = time.perf_counter()
            again = cache.acquire(spec, store)
            hits.append(time.perf_counter() - started)
            assert not again.fetched
            again.release()
        shutil.rmtree(work / f"cache-{rep}", ignore_errors=True)
    _delete_prefix(store, prefix)
    return {
        "dataset_bytes": size,
        "files": len(paths),
        "miss_s": round(statistics.median(misses), 3),
        "hit_ms": round(statistics.median(hits) * 1000, 2),
        "miss_runs_s": [round(v, 3) for v in misses],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024, help="checkpoint size for upload and resume")
    parser.add_argument("--reps", type=int, default=2, help="repetitions of each upload and resume")
    parser.add_argument("--overhead-reps", type=int, default=3, help="job runs with sync on (and as many off)")
    parser.add_argument("--dataset-mib", type=int, default=256)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--checkpoint-mib", type=int, default=64)
    parser.add_argument("--work-mib", type=int, default=64, help="MiB hashed per step (the job's compute)")
    args = parser.parse_args()

    load_start = [round(x, 2) for x in os.getloadavg()]
    running = embedded.Embedded()
    work = Path(tempfile.mkdtemp(prefix="trainyard-bench-storage-"))
    try:
        store = objectstore.S3Config.from_env()
        where = "TRAINYARD_S3_URL"
        if store is None:
            store = objectstore.S3Config.from_env(embedded.start_seaweedfs(work / "var", running))
            where = "embedded SeaweedFS (one node, data on the local disk)"
        objectstore.ensure_bucket(store)
        print(f"store: {where} at {store.url}", flush=True)
        t0 = time.perf_counter()
        upload, kept = upload_phase(store, work, args.size_mib, args.reps)
        print("upload:", json.dumps(upload, indent=1), flush=True)
        resume = resume_phase(store, work, kept, args.reps)
        print("resume:", json.dumps(resume), flush=True)
        _delete_prefix(store, kept["prefix"])
        shutil.rmtree(kept["folder"], ignore_errors=True)
        overhead = overhead_phase(store, work, args.overhead_reps, args.steps, args.checkpoint_every,
                                  args.checkpoint_mib, args.work_mib)  # fmt: skip
        print("overhead:", json.dumps(overhead), flush=True)
        dataset = dataset_phase(store, work, args.dataset_mib, args.reps)
        print("dataset:", json.dumps(dataset), flush=True)
        report = {
            "benchmark": "storage",
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "loadavg_start": load_start,
                "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            },
            "store": where,
            "size_mib": args.size_mib,
            "checkpoint_upload": upload,
            "resume": resume,
            "sync_overhead": overhead,
            "dataset_cache": dataset,
            "wall_s": round(time.perf_counter() - t0, 1),
        }
    finally:
        running.stop()
        shutil.rmtree(work, ignore_errors=True)
    out = RESULTS / ("storage.json" if args.size_mib == 1024 else "storage-partial.json")
    write_json(out, {"process_model": PROCESS_MODEL, **report})  # stamped with the commit and the load average
    print(f"wrote {out.relative_to(BASE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
