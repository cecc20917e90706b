"""The node-local cache of registered datasets: fetched once, verified, shared read-only by every job on the node.

No Django in this module: the local supervisor (and, on Kubernetes, the dataset init container in the platform's
image, `python -m jobs.backends.dataset_cache`) use it with a plain dict naming the dataset and the store.

Layout under the cache folder (`TRAINYARD_DATASET_CACHE_DIR`):

- `data/<entry>/…`: a complete copy, files 0444 and folders 0555, named `<team>.<name>.v<version>.<id>`;
- `data/<entry>.json`: its size, file count and when a job last used it (the LRU order);
- `locks/<entry>.use`: every job using the copy holds a shared lock on it for its whole life, so eviction
  (which needs the exclusive lock, without waiting) never removes a copy in use;
- `locks/<entry>.fetch`: held exclusively while the copy is fetched: concurrent fetches of the same dataset
  version wait on it and then find the copy complete (one download);
- `cache.lock`: held briefly while room is made, so two fetches never count the same free bytes.

A fetch lists the dataset's prefix, checks the listing against the size and file count recorded when it was
registered (a dataset changed in the store is refused, not silently mixed), downloads each object into a hidden
folder, checks its size and checksum (the SHA-256 the store keeps in `x-amz-meta-sha256`, else the MD5 in its
ETag, also for multipart ETags), and renames the folder into place only when every file passed. When the
dataset does not fit in `TRAINYARD_DATASET_CACHE_BYTES` even after evicting every copy no job uses, the fetch
raises `CacheFull` (the attempt fails with that reason; nothing else is touched).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kernel import objectstore

READ_BYTES = 1024 * 1024
MIB = 1024 * 1024
# Part sizes S3 clients commonly use; a multipart ETag is checked against the one that gives its part count.
COMMON_PART_MIB = (5, 8, 16, 32, 64, 100, 128, 256, 512)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


# The exit status of a `fill` that no retry of its Job can make succeed (the dataset in the store is no longer the
# version registered, or it does not fit in its volume): the fill Job's pod failure policy fails the Job on it at
# once, where a failure that may pass (a store that blinked) gets the Job's own retries.
FILL_CANNOT_SUCCEED_EXIT = 3


class DatasetError(RuntimeError):
    """The dataset could not be fetched (store down, changed, checksum mismatch); the message says which.
    `permanent`: fetching it again, now or in a minute, would fail the same way."""

    reason = "DatasetFetchError"
    permanent = False


class DatasetChanged(DatasetError):
    """The objects under the dataset's prefix are not the version that was registered (other files, other sizes,
    or none at all), or one of them cannot be a path in the copy. A retry would find the same files: the job fails
    with this reason and is not retried (classifier rule `dataset-changed`)."""

    reason = "DatasetChanged"
    permanent = True


class CacheFull(DatasetError):
    """The dataset does not fit in the cache, even after evicting every copy no job uses."""

    reason = "DatasetCacheFull"
    permanent = True


@dataclass
class Held:
    """A dataset copy a job uses: its path, and the shared lock that keeps it from eviction until `release()`."""

    path: Path
    fetched: bool
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def entry_name(spec: dict) -> str:
    raw = f"{spec['team']}.{spec['name']}.v{spec['version']}.{spec['id']}"
    return _UNSAFE.sub("_", raw)


def _lock(path: Path, mode: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, mode)
    return fd


def _try_lock(path: Path, mode: int) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        return None


def _read_meta(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_meta(path: Path, data: dict) -> None:
    # A name of its own per writer: several jobs note their use of the same copy at once.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _remove_tree(path: Path) -> None:
    if not path.exists():
        return
    for root, dirs, _files in os.walk(path):
        os.chmod(root, 0o700)  # copies are read-only: open them again to delete
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o700)
    shutil.rmtree(path, ignore_errors=True)


class DatasetCache:
    def __init__(self, root: Path, *, limit_bytes: int = 0):
        self.root = Path(root)
        self.limit = int(limit_bytes)  # 0: no limit
        self.data = self.root / "data"
        self.locks = self.root / "locks"
        for folder in (self.root, self.data, self.locks):
            folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data, 0o755)  # jobs read their copies through a bind mount, as their own uid

    # ------------------------------------------------------------------ queries

    def entries(self) -> list[dict]:
        """Every complete copy: name, size, files, last use, and whether a job holds it now."""
        found = []
        for meta_path in sorted(self.data.glob("*.json")):
            meta = _read_meta(meta_path)
            name = meta_path.name[: -len(".json")]
            if meta is None or not (self.data / name).is_dir():
                continue
            probe = _try_lock(self.locks / f"{name}.use", fcntl.LOCK_EX)
            if probe is not None:
                os.close(probe)
            found.append({**meta, "entry": name, "in_use": probe is None})
        return found

    def used_bytes(self) -> int:
        return sum(int(e.get("size", 0)) for e in self.entries())

    # ------------------------------------------------------------------ acquire

    def acquire(self, spec: dict, store: objectstore.S3Config, *, s3=None) -> Held:
        """The dataset's local copy, fetched first when missing; held (never evicted) until `release()`."""
        name = entry_name(spec)
        target = self.data / name
        use = _lock(self.locks / f"{name}.use", fcntl.LOCK_SH)
        try:
            fetched = False
            if not target.is_dir():
                fetch = _lock(self.locks / f"{name}.fetch", fcntl.LOCK_EX)
                try:
                    if not target.is_dir():  # a concurrent fetch of the same version may have finished meanwhile
                        self._fetch(spec, store, target, s3=s3)
                        fetched = True
                finally:
                    os.close(fetch)
            meta_path = self.data / f"{name}.json"
            meta = _read_meta(meta_path) or {}
            meta["last_used"] = time.time()
            _write_meta(meta_path, meta)
            return Held(path=target, fetched=fetched, fd=use)
        except BaseException:
            os.close(use)
            raise

    def _make_room(self, need: int, keep: str) -> None:
        """Evict least recently used copies no job holds until `need` more bytes fit; CacheFull when they can't."""
        if not self.limit:
            return
        if need > self.limit:
            raise CacheFull(
                f"dataset needs {need} bytes; the node's dataset cache holds at most {self.limit} "
                "(TRAINYARD_DATASET_CACHE_BYTES)"
            )
        entries = [e for e in self.entries() if e["entry"] != keep]
        used = sum(int(e.get("size", 0)) for e in entries) + self._reserved(keep)
        for entry in sorted(entries, key=lambda e: float(e.get("last_used", 0))):
            if used + need <= self.limit:
                return
            fd = _try_lock(self.locks / f"{entry['entry']}.use", fcntl.LOCK_EX)
            if fd is None:
                continue  # a running job uses it
            try:
                (self.data / f"{entry['entry']}.json").unlink(missing_ok=True)
                _remove_tree(self.data / entry["entry"])
            finally:
                os.close(fd)
            used -= int(entry.get("size", 0))
        if used + need > self.limit:
            raise CacheFull(
                f"dataset needs {need} bytes; the node's dataset cache has {max(0, self.limit - used)} of "
                f"{self.limit} free and every other copy is in use by a running job"
            )

    def _reserved(self, keep: str) -> int:
        """Bytes other fetches in progress have claimed (their `.reserve` files)."""
        total = 0
        for path in self.data.glob(".*.reserve"):
            if path.name != f".{keep}.reserve":
                try:
                    total += int(path.read_text() or 0)
                except (OSError, ValueError):
                    pass
        return total

    def _fetch(self, spec: dict, store: objectstore.S3Config, target: Path, *, s3=None) -> None:
        s3 = s3 or objectstore.client(store, timeout_s=60.0, attempts=3)
        objects = list_objects(s3, store.bucket, spec["prefix"])
        size = sum(o["size"] for o in objects)
        expected = (spec.get("size_bytes"), spec.get("file_count"))
        if expected[0] is not None and (size, len(objects)) != (int(expected[0]), int(expected[1])):
            raise DatasetChanged(
                f"dataset {spec['name']} v{spec['version']} changed in the store since it was registered: "
                f"{len(objects)} files, {size} bytes now; {expected[1]} files, {expected[0]} bytes registered"
            )
        name = target.name
        reserve = self.data / f".{name}.reserve"
        glock = _lock(self.root / "cache.lock", fcntl.LOCK_EX)
        try:
            self._make_room(size, name)
            reserve.write_text(str(size))
        finally:
            os.close(glock)
        partial = self.data / f".{name}.partial"
        try:
            _remove_tree(partial)
            partial.mkdir(mode=0o755)
            for obj in objects:
                rel = obj["key"][len(spec["prefix"]) :].lstrip("/")
                dest = partial / rel
                if not rel or not dest.resolve().is_relative_to(partial.resolve()):
                    raise DatasetChanged(f"object {obj['key']} is not a usable path in the dataset")
                download_verified(s3, store.bucket, obj, dest)
            for root, dirs, files in os.walk(partial):
                for f in files:
                    os.chmod(os.path.join(root, f), 0o444)
                for d in dirs:
                    os.chmod(os.path.join(root, d), 0o555)
            _write_meta(
                self.data / f"{name}.json",
                {"size": size, "file_count": len(objects), "fetched_at": time.time(), "last_used": time.time(),
                 "dataset": {k: spec.get(k) for k in ("id", "team", "name", "version", "prefix")}},
            )  # fmt: skip
            os.chmod(partial, 0o555)
            os.replace(partial, target)
        except BaseException:
            _remove_tree(partial)
            raise
        finally:
            reserve.unlink(missing_ok=True)


def list_objects(s3, bucket: str, prefix: str) -> list[dict]:
    """Every object under `prefix`: key, size, ETag (folder markers left out)."""
    from botocore.exceptions import BotoCoreError, ClientError

    found = []
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                if item["Key"].endswith("/"):
                    continue
                found.append({"key": item["Key"], "size": int(item["Size"]), "etag": str(item["ETag"]).strip('"')})
    except (BotoCoreError, ClientError) as exc:
        raise DatasetError(f"cannot list the dataset in the store: {objectstore.describe_error(exc)}") from None
    return found


def _part_sizes(size: int, parts: int) -> list[int]:
    candidates = [mib * MIB for mib in COMMON_PART_MIB]
    candidates.append(-(-size // parts + MIB - 1) // MIB * MIB)  # the even split, rounded up to a MiB
    return sorted({p for p in candidates if p > 0 and -(-size // p) == parts})


def download_verified(s3, bucket: str, obj: dict, dest: Path) -> None:
    """Download one object and check its size and checksum before keeping it."""
    from botocore.exceptions import BotoCoreError, ClientError

    dest.parent.mkdir(parents=True, exist_ok=True)
    etag = obj["etag"]
    parts = int(etag.split("-", 1)[1]) if "-" in etag else 0
    part_sizes = _part_sizes(obj["size"], parts) if parts else []
    md5, sha = hashlib.md5(), hashlib.sha256()  # noqa: S324 - the store's own checksum
    part_state = {p: [hashlib.md5(), 0, []] for p in part_sizes}  # noqa: S324
    written = 0
    try:
        response = s3.get_object(Bucket=bucket, Key=obj["key"])
        stored_sha = (response.get("Metadata") or {}).get("sha256", "")
        body = response["Body"]
        with open(dest, "wb") as f:
            for chunk in iter(lambda: body.read(READ_BYTES), b""):
                written += len(chunk)
                md5.update(chunk)
                sha.update(chunk)
                for part_size, state in part_state.items():
                    rest = chunk
                    while rest:
                        take = rest[: part_size - state[1]]
                        state[0].update(take)
                        state[1] += len(take)
                        rest = rest[len(take) :]
                        if state[1] == part_size:
                            state[2].append(state[0].digest())
                            state[0], state[1] = hashlib.md5(), 0  # noqa: S324
                f.write(chunk)
    except (BotoCoreError, ClientError) as exc:
        raise DatasetError(f"cannot download {obj['key']}: {objectstore.describe_error(exc)}") from None
    ok = written == obj["size"]
    if ok and stored_sha:
        ok = sha.hexdigest() == stored_sha
    elif ok and not parts:
        ok = md5.hexdigest() == etag
    elif ok:
        ok = False
        for state in part_state.values():
            digests = state[2] + ([state[0].digest()] if state[1] else [])
            if hashlib.md5(b"".join(digests)).hexdigest() + f"-{len(digests)}" == etag:  # noqa: S324
                ok = True
    if not ok:
        dest.unlink(missing_ok=True)
        raise DatasetError(f"{obj['key']}: the downloaded copy does not match its size or checksum")


FILLED_MARKER = "filled.json"  # in a shared cache volume: written last, once the copy is complete and verified


def filled(cache: Path, spec: dict) -> dict | None:
    """The completion marker of a shared cache volume, when it is there and names this dataset version's copy."""
    marker = _read_meta(Path(cache) / FILLED_MARKER)
    if marker is None or marker.get("entry") != entry_name(spec):
        return None
    return marker if (Path(cache) / "data" / marker["entry"]).is_dir() else None


def fill(cache: Path, spec: dict, store: objectstore.S3Config) -> tuple[dict, bool]:
    """Fill a shared cache volume (one per dataset version, on Kubernetes) with the dataset: the same fetch and
    checks as the node cache's, then the completion marker, written last (after an fsync) so that a reader never
    sees it before every file is in place. Returns the marker and whether this call fetched the copy."""
    done = filled(cache, spec)
    if done is not None:
        return done, False
    held = DatasetCache(Path(cache)).acquire(spec, store)
    held.release()
    meta = _read_meta(Path(cache) / "data" / f"{held.path.name}.json") or {}
    marker = {
        "entry": held.path.name,
        "size": meta.get("size"),
        "file_count": meta.get("file_count"),
        "filled_at": time.time(),
        "dataset": {k: spec.get(k) for k in ("id", "team", "name", "version")},
    }
    tmp = Path(cache) / f".{FILLED_MARKER}.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(marker))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, Path(cache) / FILLED_MARKER)
    return marker, True


def wait_filled(cache: Path, spec: dict, *, timeout_s: float, poll_s: float = 2.0) -> dict | None:
    """Wait for a shared cache volume's completion marker (None: not there within `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        done = filled(cache, spec)
        if done is not None or time.monotonic() >= deadline:
            return done
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def _report(termination_log: str, reason: str, message: str) -> None:
    """Say why on stderr and, for the kubelet (which copies it into the container's terminated state, where the
    platform's observer reads it), in the termination log."""
    print(f"[trainyard] {reason}: {message}", file=sys.stderr, flush=True)
    if termination_log:
        try:
            Path(termination_log).write_text(f"{reason}: {message}"[:4000])
        except OSError as err:
            print(f"[trainyard] cannot write {termination_log}: {err}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m jobs.backends.dataset_cache fetch|fill|wait`: the dataset's Kubernetes containers.

    The dataset is named by `TRAINYARD_DATASET` (JSON), the store by the `TRAINYARD_S3_*` environment.
    `fetch`: the init container that copies it into `--cache`, the pod's own dataset volume (an emptyDir).
    `fill`: the one Job that copies it into its shared cache volume (`fill`), the marker written last.
    `wait`: the init container of a pod reading a shared cache volume (mounted read-only): it ends once the
    marker is there, or fails after `--timeout-s` with a DatasetFetchError. A failure exits 1 with
    `<reason>: <message>` in `--termination-log`; a `fill` that no retry can make succeed exits
    FILL_CANNOT_SUCCEED_EXIT (3)."""
    parser = argparse.ArgumentParser(prog="dataset_cache")
    parser.add_argument("action", choices=["fetch", "fill", "wait"])
    parser.add_argument("--cache", required=True)
    parser.add_argument("--limit-bytes", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="wait: how long the fill may take")
    parser.add_argument("--poll-s", type=float, default=2.0)
    parser.add_argument("--termination-log", default="", help="where a failure's reason is written")
    args = parser.parse_args(argv)
    spec = json.loads(os.environ["TRAINYARD_DATASET"])
    what = f"dataset {spec['name']} v{spec['version']}"
    if args.action == "wait":
        done = wait_filled(Path(args.cache), spec, timeout_s=args.timeout_s, poll_s=args.poll_s)
        if done is None:
            _report(args.termination_log, DatasetError.reason,
                    f"{what} was not in its shared cache volume after {args.timeout_s:g} s: its fill Job did not "
                    "complete (TRAINYARD_DATASET_FILL_TIMEOUT_S)")  # fmt: skip
            return 1
        print(f"[trainyard] {what} ready in its shared cache volume ({done.get('file_count')} files)", flush=True)
        return 0
    store = objectstore.S3Config.from_env()
    if store is None:
        _report(
            args.termination_log, DatasetError.reason, "TRAINYARD_S3_URL is not set: the dataset's store is unknown"
        )
        return 2
    if args.action == "fill":
        try:
            marker, fetched = fill(Path(args.cache), spec, store)
        except DatasetError as exc:
            _report(args.termination_log, exc.reason, str(exc))  # the observer says which dataset, and where
            return FILL_CANNOT_SUCCEED_EXIT if exc.permanent else 1
        print(f"[trainyard] {what} {'filled into' if fetched else 'already in'} its shared cache volume "
              f"({marker.get('file_count')} files, {marker.get('size')} bytes)", flush=True)  # fmt: skip
        return 0
    cache = DatasetCache(Path(args.cache), limit_bytes=args.limit_bytes)
    try:
        held = cache.acquire(spec, store)
    except DatasetError as exc:
        _report(args.termination_log, exc.reason, str(exc))
        return 1
    print(f"[trainyard] dataset {spec['name']} v{spec['version']} ready at {held.path} "
          f"({'fetched' if held.fetched else 'cached'})")  # fmt: skip
    held.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
