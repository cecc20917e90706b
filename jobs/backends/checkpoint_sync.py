"""Checkpoint upload and restore for one attempt, run by the local supervisor (no Django in this process).

The attempt's checkpoint folder (`TRAINYARD_CHECKPOINT_DIR`) is scanned every `sync_s` seconds in a thread of
the supervisor, never in the job's own process, so the job's writes are never slowed or blocked. A file is
uploaded once it has kept the same size and modification time across a whole sync period; after the command
ends, everything left is uploaded (bounded by `final_wait_s`), whatever the outcome.

Every upload is verified: a single PUT carries `Content-MD5` (the store rejects other bytes); a large file is read
once, each part hashed as it is read and sent with its own `Content-MD5`, and the completed object's ETag must equal
the MD5 of the part MD5s; the file must have the same size and mtime after the upload as before. A file that
changed meanwhile is never recorded; it is tried again once it settles.

What was uploaded is written to `checkpoints.json` in the attempt folder; the platform's observer reads it and
records the checkpoints (jobs/checkpoints.py). The platform may write `checkpoint_hold` there (its team's storage
quota is full): uploads then wait, and the manifest says so. A store that fails is retried with a doubling
backoff (up to a minute); the job keeps running.

Where the store is: the spec's, until the platform writes `store.json` into the attempt folder (the object store
came back at another address, say after `make run` restarted its embedded SeaweedFS); each pass reads it again, and a
changed address makes new clients and ends the backoff, so the next pass uploads at once.

Restore: before the command starts, the files of the checkpoint to resume from are downloaded into the folder
(SHA-256 checked) and `TRAINYARD_RESUME_FROM` names it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import threading
import time
from concurrent.futures import CancelledError, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISREG

from kernel import objectstore

PART_BYTES = 8 * 1024 * 1024  # multipart threshold and part size: the ETag check recomputes with the same size
READ_BYTES = 1024 * 1024
MAX_BACKOFF_S = 60.0
UPLOAD_THREADS = 4  # files uploaded at once by one attempt's sync
PARTS_IN_FLIGHT = 4  # parts of one large file on the wire at once (each PART_BYTES in memory)
LARGE_AT_ONCE = 1  # multipart files uploaded at once: several at a time only overcommit the CPU and the store
HOLD_FILE = "checkpoint_hold"
STORE_FILE = "store.json"  # where the store is now, written by the platform's observer when it moved
MANIFEST = "checkpoints.json"
# A failed restore: the attempt ends before its command starts, with one of these reasons. The checkpoint itself is
# unusable (missing from the store, or its bytes do not match its checksum): restoring it again fails the same way.
RESTORE_FAILED = "CheckpointRestoreError"
# The store could not be used (unreachable, refusing requests) after the client's own retries: a platform outage.
RESTORE_STORE_DOWN = "CheckpointStoreUnavailable"
RESTORE_EXIT_CODE = 125  # what the sidecar exits with (and the local supervisor records) when the restore failed
TERMINATION_LOG = "/dev/termination-log"


@dataclass
class Digest:
    size: int
    md5: str
    sha256: str
    part_md5s: list[bytes] = field(default_factory=list)

    @property
    def etag(self) -> str:
        if self.size <= PART_BYTES:
            return self.part_md5s[0].hex() if self.part_md5s else self.md5
        return hashlib.md5(b"".join(self.part_md5s)).hexdigest() + f"-{len(self.part_md5s)}"  # noqa: S324


def open_beneath(root: Path, rel: str):
    """Open `root/rel` for reading without following a symlink anywhere below `root` (the job owns that tree and
    may swap a file or folder for a link at any moment; the supervisor reading it has more rights than the job)."""
    parts = [p for p in rel.split("/") if p]
    if not parts or any(p in {".", ".."} for p in parts):
        raise ChangedDuringUpload(f"{rel}: not a plain path")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        try:
            leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            raise ChangedDuringUpload(f"{rel}: {exc.strerror}") from None
    except NotADirectoryError:
        raise ChangedDuringUpload(f"{rel}: a folder on its path is not a folder any more") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ChangedDuringUpload(f"{rel}: a symlink on its path") from None
        raise
    finally:
        os.close(fd)
    if not S_ISREG(os.fstat(leaf).st_mode):
        os.close(leaf)
        raise ChangedDuringUpload(f"{rel}: not a regular file")
    os.set_blocking(leaf, True)
    return os.fdopen(leaf, "rb")


def digest(f) -> Digest:
    """Checksums of an open file, read from its start: SHA-256 and the MD5 of each part (the whole file's MD5
    is the single part's; a multipart ETag needs only the parts'), in one pass."""
    f.seek(0)
    sha, part, part_len, parts, size = hashlib.sha256(), hashlib.md5(), 0, [], 0  # noqa: S324
    while chunk := f.read(READ_BYTES):
        size += len(chunk)
        sha.update(chunk)
        while chunk:
            take = chunk[: PART_BYTES - part_len]
            part.update(take)
            part_len += len(take)
            chunk = chunk[len(take) :]
            if part_len == PART_BYTES:
                parts.append(part.digest())
                part, part_len = hashlib.md5(), 0  # noqa: S324
    if part_len or not parts:
        parts.append(part.digest())
    md5 = parts[0].hex() if len(parts) == 1 else ""
    return Digest(size=size, md5=md5, sha256=sha.hexdigest(), part_md5s=parts)


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    if not path.is_file() or path.is_symlink():
        return None  # a symlink the job planted would let it read the platform's files through the upload
    return st.st_size, st.st_mtime_ns


def _lowest_priority() -> None:
    """Make the calling thread the last to get a CPU (nice 19 applies per thread on Linux)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (OSError, AttributeError):
        pass


class ChangedDuringUpload(Exception):
    pass


class CheckpointUnusable(objectstore.StoreError):
    """The checkpoint's stored bytes cannot be restored as recorded (checksum or size mismatch, a bad path)."""


def restore_failure(plan: dict, exc: BaseException) -> tuple[str, str]:
    """The reason and the one-line message of a failed restore of `plan` (the local supervisor and the Kubernetes
    sidecar report it alike): CheckpointRestoreError when the checkpoint is missing or corrupt,
    CheckpointStoreUnavailable when the store could not be used."""
    from botocore.exceptions import ClientError

    missing = isinstance(exc, ClientError) and str(exc.response.get("Error", {}).get("Code", "")) in {
        "NoSuchKey",
        "404",
        "NotFound",
    }
    reason = RESTORE_FAILED if missing or isinstance(exc, CheckpointUnusable) else RESTORE_STORE_DOWN
    origin = ""
    if plan.get("job"):
        origin = f" (job {plan['job']}" + (f", attempt {plan['attempt']})" if plan.get("attempt") else ")")
    why = "missing in the object store: " if missing else ""
    return reason, f"could not restore checkpoint {plan['name']}{origin}: {why}{objectstore.describe_error(exc)}"


def _upload_parts(s3, *, bucket: str, key: str, f, expected: int) -> tuple[Digest, str]:
    """A multipart upload that reads the file once: each part is hashed (its MD5, and the whole file's SHA-256 in
    order) by this thread while earlier parts are on the wire, and sent with its Content-MD5 (the store rejects
    other bytes). Reads `expected` bytes at most (the size when the upload began: a file still growing would
    otherwise end a part early in the middle). Returns the file's digest and the ETag the store gave the completed
    object. At most PARTS_IN_FLIGHT parts are held in memory."""
    import base64
    from collections import deque

    upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    sha, md5s, etags, size = hashlib.sha256(), [], {}, 0
    try:
        with ThreadPoolExecutor(max_workers=PARTS_IN_FLIGHT, thread_name_prefix="checkpoint-part") as pool:
            inflight: deque = deque()
            number = 0
            while size < expected and (chunk := f.read(min(PART_BYTES, expected - size))):
                number += 1
                size += len(chunk)
                sha.update(chunk)
                md5 = hashlib.md5(chunk).digest()  # noqa: S324 - what S3 checks a part against
                md5s.append(md5)
                part = pool.submit(
                    s3.upload_part,
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=chunk,
                    ContentMD5=base64.b64encode(md5).decode(),
                )
                inflight.append((number, part))
                while len(inflight) >= PARTS_IN_FLIGHT:
                    n, done = inflight.popleft()
                    etags[n] = done.result()["ETag"]
            while inflight:
                n, done = inflight.popleft()
                etags[n] = done.result()["ETag"]
        completed = s3.complete_multipart_upload(
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": [{"ETag": etags[n], "PartNumber": n} for n in sorted(etags)]},
        )
    except BaseException:
        try:
            s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        except Exception:  # noqa: BLE001 - the store's own expiry of stale uploads covers a failed abort
            pass
        raise
    digest_ = Digest(size=size, md5="", sha256=sha.hexdigest(), part_md5s=md5s)
    return digest_, str(completed.get("ETag", "")).strip('"')


def upload_file(
    s3, *, bucket: str, key: str, path: Path, root: Path | None = None, large_gate: threading.Semaphore | None = None
) -> dict:
    """Upload one file and verify what the store holds; ChangedDuringUpload when the file moved under us.
    `root`: the folder the job owns; no symlink below it is followed. A file of one part is hashed, then sent
    with its Content-MD5 and its SHA-256 as metadata; a larger one is hashed while its parts are sent
    (`_upload_parts`; its SHA-256 is known only at the end, so it lives in the platform's records alone), one such
    file at a time per `large_gate` (its parts already keep the wire busy)."""
    import base64

    root, rel = (path.parent, path.name) if root is None else (root, str(path.relative_to(root)))
    with open_beneath(root, rel) as f:
        st = os.fstat(f.fileno())
        before = (st.st_size, st.st_mtime_ns)
        if before[0] <= PART_BYTES:
            d = digest(f)
            st = os.fstat(f.fileno())
            if d.size != before[0] or (st.st_size, st.st_mtime_ns) != before:
                raise ChangedDuringUpload(f"{rel} changed while it was read")
            f.seek(0)
            # The store checks the bytes against Content-MD5 and answers with their ETag: no second request.
            put = s3.put_object(
                Bucket=bucket,
                Key=key,
                Body=f,
                ContentLength=d.size,
                ContentMD5=base64.b64encode(bytes.fromhex(d.md5)).decode(),
                Metadata={"sha256": d.sha256},
            )
            stored_etag = str(put.get("ETag", "")).strip('"')
        else:
            with large_gate or contextlib.nullcontext():
                d, stored_etag = _upload_parts(s3, bucket=bucket, key=key, f=f, expected=before[0])
        st = os.fstat(f.fileno())
    if (st.st_size, st.st_mtime_ns) != before or d.size != before[0] or stored_etag != d.etag:
        raise ChangedDuringUpload(f"{rel} changed during the upload (the stored copy does not match)")
    return {"key": key, "size": d.size, "sha256": d.sha256, "etag": stored_etag, "mtime_ns": before[1]}


def download_file(s3, *, bucket: str, key: str, path: Path, sha256: str, size: int | None = None) -> None:
    """Fetch one object into `path`, checking its SHA-256 (and size) before it takes its final name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.restoring")
    sha = hashlib.sha256()
    written = 0
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    with open(tmp, "wb") as f:
        for chunk in iter(lambda: body.read(READ_BYTES), b""):
            sha.update(chunk)
            written += len(chunk)
            f.write(chunk)
    if sha.hexdigest() != sha256 or (size is not None and written != size):
        tmp.unlink(missing_ok=True)
        raise CheckpointUnusable(f"{key}: the downloaded copy does not match its checksum")
    os.replace(tmp, path)


class CheckpointSync:
    """The uploader of one attempt's checkpoint folder (see the module docstring)."""

    def __init__(self, folder: Path, conf: dict, *, chown: int | None = None):
        self.folder = folder
        self.dir = Path(conf["dir"])
        self.store = objectstore.S3Config(**conf["store"])
        self.prefix = conf["prefix"]
        self.sync_s = float(conf.get("sync_s", 30.0))
        self.final_wait_s = float(conf.get("final_wait_s", 300.0))
        self.chown = chown
        self.seen: dict[str, tuple[int, int]] = {}
        self.uploaded: dict[str, dict] = {}
        self.skip: dict[str, tuple[int, int]] = {}  # restored files, as they were restored: not uploaded again
        self.error = ""
        self.failures = 0
        self.retry_at = 0.0
        self.final = False
        self.unsaved: list[str] = []
        self.restored: dict = {}
        self._s3 = None
        self._bulk = None  # the client of the uploads themselves (their bodies are checked by MD5, not signed)
        self._store_seen: tuple[int, int] | None = None  # store.json's (mtime, size) when last read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def follow_store(self) -> bool:
        """Take the store's address from store.json when the platform rewrote it; True when it changed."""
        try:
            st = (self.folder / STORE_FILE).stat()
        except OSError:
            return False
        if (st.st_mtime_ns, st.st_size) == self._store_seen:
            return False
        self._store_seen = (st.st_mtime_ns, st.st_size)
        try:
            store = objectstore.S3Config(**json.loads((self.folder / STORE_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return False  # half written or garbled: the spec's (or last) address stays until it is whole
        if store == self.store:
            return False
        self.store, self._s3, self._bulk = store, None, None
        self.retry_at = 0.0  # the old address's failures say nothing about the new one
        return True

    def s3(self):
        self.follow_store()
        if self._s3 is None:
            s3 = objectstore.client(self.store, timeout_s=60.0, attempts=2)
            objectstore.ensure_bucket(self.store, s3)  # a store down raises here: retried with backoff
            self._s3 = s3
        return self._s3

    def bulk(self):
        """The client the uploads go through: every body carries a Content-MD5 the store checks and every result
        is compared with the store's ETag, so the body is not hashed a third time for the signature."""
        self.s3()  # the bucket check
        if self._bulk is None:
            self._bulk = objectstore.client(self.store, timeout_s=60.0, attempts=2, sign_payload=False)
        return self._bulk

    # ------------------------------------------------------------------ restore

    def restore(self, plan: dict) -> Path:
        """Download the checkpoint named in `plan` into the folder; returns its path in the folder."""
        for item in plan["files"]:
            target = self.dir / item["path"]
            if not target.resolve().is_relative_to(self.dir.resolve()):
                raise CheckpointUnusable(f"refusing to restore outside the checkpoint folder: {item['path']}")
            download_file(
                self.s3(), bucket=self.store.bucket, key=item["key"], path=target, sha256=item["sha256"],
                size=item.get("size"),
            )  # fmt: skip
            if self.chown is not None:
                for p in [target, *target.parents]:
                    if p == self.dir or not p.is_relative_to(self.dir):
                        break
                    os.chown(p, self.chown, self.chown)
            stat = _stat(target)
            if stat is not None:
                self.skip[item["path"]] = stat
        self.restored = {"name": plan["name"], "job": plan.get("job", ""), "attempt": plan.get("attempt")}
        self.write_manifest()
        return self.dir / plan["name"]

    # ------------------------------------------------------------------ sync

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="checkpoint-sync", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        _lowest_priority()
        while not self._stop.wait(self.sync_s):
            self.sync_once(final=False)

    def held(self) -> bool:
        return (self.folder / HOLD_FILE).exists()

    def _files(self) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        if not self.dir.is_dir():
            return found
        for root, dirs, files in os.walk(self.dir):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
            for name in files:
                if name.endswith(".restoring"):
                    continue
                path = Path(root) / name
                stat = _stat(path)
                if stat is not None:
                    found[str(path.relative_to(self.dir))] = stat
        return found

    def pending(self, files: dict[str, tuple[int, int]]) -> list[str]:
        """Files present whose current content is neither uploaded nor restored."""
        waiting = []
        for rel, stat in files.items():
            done = self.uploaded.get(rel)
            if self.skip.get(rel) == stat or (done and (done["size"], done["mtime_ns"]) == stat):
                continue
            waiting.append(rel)
        return sorted(waiting)

    def sync_once(self, *, final: bool) -> bool:
        """One pass: upload what has settled (everything, when final). True when nothing is left to upload."""
        with self._lock:
            self.follow_store()
            files = self._files()
            waiting = self.pending(files)
            if self.held() or (not final and time.monotonic() < self.retry_at):
                self.seen = files
                self.write_manifest(files)
                return not waiting
            ready = [rel for rel in waiting if final or self.seen.get(rel) == files[rel]]
            failed: BaseException | None = None
            s3 = None
            if ready:
                try:
                    s3 = self.bulk()
                except Exception as exc:  # noqa: BLE001 - a store that is down: retried with backoff
                    failed, ready = exc, []
            # Several files at once: hashing (which releases the GIL) and the network overlap. While the job runs,
            # the upload threads yield the CPU to it (lowest priority); the final sync, after it, goes at full speed.
            large_gate = threading.BoundedSemaphore(LARGE_AT_ONCE)
            with ThreadPoolExecutor(
                max_workers=UPLOAD_THREADS,
                thread_name_prefix="checkpoint-upload",
                initializer=None if final else _lowest_priority,
            ) as pool:
                futures = {
                    pool.submit(
                        upload_file,
                        s3,
                        bucket=self.store.bucket,
                        key=self.prefix + rel,
                        path=self.dir / rel,
                        large_gate=large_gate,
                    ): rel
                    for rel in ready
                }
                for future in as_completed(futures):
                    try:
                        record = future.result()
                    except ChangedDuringUpload:
                        continue  # still being written: the next pass sees it settle
                    except CancelledError:
                        continue
                    except Exception as exc:  # noqa: BLE001 - a store failure never stops the job
                        if failed is None:
                            failed = exc
                            for other in futures:
                                other.cancel()
                        continue
                    record["uploaded_at"] = time.time()
                    self.uploaded[futures[future]] = record
            if failed is not None:
                self.failures += 1
                self.error = objectstore.describe_error(failed)
                self.retry_at = time.monotonic() + min(MAX_BACKOFF_S, self.sync_s * 2 ** min(self.failures, 8))
            elif ready:
                self.failures, self.error = 0, ""
            self.seen = self._files()
            left = self.pending(self.seen)
            self.write_manifest(self.seen)
            return not left

    def finish(self) -> None:
        """The last sync after the command ended: retry with backoff until all is saved or the wait is over."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.final_wait_s)
        deadline = time.monotonic() + self.final_wait_s
        delay = 1.0
        while True:
            if not self.held() and self.sync_once(final=True):
                break
            if time.monotonic() + delay > deadline:
                break
            time.sleep(delay)
            delay = min(delay * 2, 15.0)
        self.final = True
        files = self._files()
        self.unsaved = self.pending(files)
        self.write_manifest(files)

    def write_manifest(self, files: dict[str, tuple[int, int]] | None = None) -> None:
        files = self._files() if files is None else files
        data = {
            "prefix": self.prefix,
            "bucket": self.store.bucket,
            "files": self.uploaded,
            "pending": self.pending(files),
            "error": self.error,
            "failures": self.failures,
            "held": self.held(),
            "final": self.final,
            "unsaved": self.unsaved,
            "restored": self.restored,
        }
        tmp = self.folder / (MANIFEST + ".tmp")
        try:
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.folder / MANIFEST)
        except OSError:
            pass


def manifest_key(prefix: str) -> str:
    """Where a sidecar publishes its attempt's manifest in the store (beside, not inside, the attempt's keys)."""
    return prefix.rstrip("/") + ".manifest.json"


class SidecarSync(CheckpointSync):
    """The uploader as a Kubernetes native sidecar: besides the local manifest, the manifest is written to the
    store (`manifest_key`) after each pass, where the platform's observer reads it."""

    def write_manifest(self, files: dict[str, tuple[int, int]] | None = None) -> None:
        super().write_manifest(files)
        try:
            body = (self.folder / MANIFEST).read_bytes()
            if body != getattr(self, "_published", None):
                self.s3().put_object(Bucket=self.store.bucket, Key=manifest_key(self.prefix), Body=body)
                self._published = body
        except Exception:  # noqa: BLE001, S110 - the next pass publishes it again; uploads never stop for it
            pass


def main(argv: list[str] | None = None) -> int:
    """`python -m jobs.backends.checkpoint_sync --state DIR`: the checkpoint sidecar of a Kubernetes pod.

    `TRAINYARD_CHECKPOINT_SPEC` (JSON: dir, prefix, restore, sync_s, final_wait_s) says what to sync, the
    `TRAINYARD_S3_*` environment where. It restores first, then writes `DIR/ready`, syncs until SIGTERM (the pod
    ends once the trainer has), and makes the final sync. A failed restore exits RESTORE_EXIT_CODE with
    `<reason>: <message>` (see `restore_failure`) in `--termination-log`, where the kubelet reads it into the
    container's terminated state: the platform's observer fails the attempt with it (the kubelet would otherwise
    start the sidecar again and again, and the trainer, which waits for the sidecar to report started, never)."""
    import argparse
    import signal
    import sys

    parser = argparse.ArgumentParser(prog="checkpoint_sync")
    parser.add_argument("--state", required=True, help="a folder of the sidecar's own (manifest, ready marker)")
    parser.add_argument("--termination-log", default="", help="where a failed restore's reason is written")
    args = parser.parse_args(argv)
    state = Path(args.state)
    state.mkdir(parents=True, exist_ok=True)
    store = objectstore.S3Config.from_env()
    if store is None:
        print("[trainyard] TRAINYARD_S3_URL is not set: checkpoints cannot be synced", file=sys.stderr)
        return 2
    conf = {**json.loads(os.environ["TRAINYARD_CHECKPOINT_SPEC"]), "store": store.to_dict()}
    Path(conf["dir"]).mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    sync = SidecarSync(state, conf)
    plan = conf.get("restore")
    if plan and not (state / "ready").exists():
        try:
            where = sync.restore(plan)
            print(f"[trainyard] restored checkpoint {plan['name']} into {where}", flush=True)
        except Exception as exc:  # noqa: BLE001 - the trainer never starts without the checkpoint it resumes
            reason, message = restore_failure(plan, exc)
            print(f"[trainyard] {message}", file=sys.stderr, flush=True)
            if args.termination_log:
                try:
                    Path(args.termination_log).write_text(f"{reason}: {message}"[:4000])
                except OSError as err:
                    print(f"[trainyard] cannot write {args.termination_log}: {err}", file=sys.stderr, flush=True)
            return RESTORE_EXIT_CODE
    (state / "ready").touch()
    sync.start()
    stop.wait()
    sync.finish()
    if sync.unsaved:
        print(f"[trainyard] {len(sync.unsaved)} checkpoint file(s) not saved to the object store"
              + (f": {sync.error}" if sync.error else ""), file=sys.stderr, flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
