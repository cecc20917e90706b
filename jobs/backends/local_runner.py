"""The supervisor of one local attempt: `python -m jobs.backends.local_runner ATTEMPT_FOLDER`.

Started detached by the local backend, so it outlives a Celery worker that dies. It holds an exclusive lock
on `supervisor.lock` for its whole life (one supervisor per attempt, and the observer's proof that it lives),
is the subreaper of everything the command starts (a process that leaves its group or session still comes back
to it), copies the command's output into the log store, and writes `status.json` when the command ends.

- The main process exits: what it left behind is stopped (SIGTERM, SIGKILL shortly after) and the attempt
  ends with the main process's own status and end time, even if a leftover still held stdout.
- SIGTERM asks it to stop the job: SIGTERM to every process of the attempt, SIGKILL after the grace period;
  a second SIGTERM kills at once.
- The log store failing (unwritable folder, full disk) never stops the job: lines are counted as lost,
  `log_faults.json` says how many, and writing is tried again every few seconds.
- The job's own filesystems (work, checkpoints) running full never cost the record of how it ended: the state
  files live apart (TRAINYARD_STATE_ROOT), a reserve in the state folder is given up to write `status.json` should
  they share a filesystem, and `disk.json` tells the observer. A command still running on a full disk after the
  grace is stopped, and a command that fails (or is stopped) with its disk full ends `DiskFull`.
- The supervisor killed with SIGKILL takes its main process with it (parent-death signal); the backend's
  observer finds and kills the rest by their environment tag before the attempt may be retried.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from jobs.backends import sandbox
from jobs.backends.base import DISK_FULL
from jobs.backends.checkpoint_sync import RESTORE_EXIT_CODE, CheckpointSync, restore_failure
from jobs.backends.usage_sampler import UsageSampler
from jobs.logstore import RING_LINES, LogWriter
from kernel import proctree
from kernel.limits import AttemptLimits

MAX_PARTIAL = 16 * 1024  # a line without a newline is cut here: a flood without newlines stays bounded
LEFTOVER_GRACE_S = 1.0  # after the main process exits, how long its leftovers get between SIGTERM and SIGKILL
DRAIN_S = 0.5  # after the main process exits, how long output from leftovers is still read
LOG_RETRY_S = 5.0


DISK_CHECK_S = 1.0  # how often the job's filesystems are checked for free space


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(data))
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        # The state folder's filesystem is full too: give up its reserve (local.py) so this record is kept.
        (path.parent / "reserve").unlink(missing_ok=True)
        tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class _DiskWatch:
    """The job's own filesystems (work and checkpoint folders): full when less than `min_free_bytes` is left."""

    def __init__(self, folder: Path, conf: dict | None):
        conf = conf or {}
        self.folder = folder
        self.paths = [Path(p) for p in conf.get("paths") or []]
        self.min_free = int(conf.get("min_free_bytes") or 0)
        self.grace = float(conf.get("grace_s") or 0)
        self.full_since: float | None = None  # monotonic: since when it has been full without a break
        self.seen: dict | None = None  # the first time it was seen full (what disk.json says)
        self._next = 0.0

    def _full(self) -> dict | None:
        for path in self.paths:
            try:
                st = os.statvfs(path)
            except OSError:
                continue
            free = st.f_bavail * st.f_frsize
            if free < self.min_free:
                return {"path": str(path), "free_bytes": free, "total_bytes": st.f_blocks * st.f_frsize}
        return None

    def check(self) -> bool:
        """Look again (at most every DISK_CHECK_S); True once the disk has stayed full for the grace period."""
        now = time.monotonic()
        if not self.paths or now < self._next:
            return self.full_since is not None and now - self.full_since >= self.grace
        self._next = now + DISK_CHECK_S
        full = self._full()
        if full is None:
            self.full_since = None
            return False
        if self.full_since is None:
            self.full_since = now
        if self.seen is None:
            self.seen = {**full, "since": time.time()}
            try:
                _write_json(self.folder / "disk.json", self.seen)
            except OSError:
                pass  # only the observer's early warning; status.json says it again
        return now - self.full_since >= self.grace

    def message(self) -> str:
        seen = self.seen or {}
        return f"{seen.get('path', '?')}: {seen.get('free_bytes', 0)} of {seen.get('total_bytes', 0)} bytes free"


def command_argv(spec: dict, *, seccomp_fd: int | None = None) -> list[str]:
    """The argv that runs the job: the command inside its sandbox (jobs/backends/sandbox.py) unless that is off."""
    return sandbox.wrap(spec.get("sandbox"), list(spec["argv"]), seccomp_fd=seccomp_fd)


def _child_setup(limits: AttemptLimits | None = None, cpus: tuple[int, ...] = ()) -> None:
    # The main process dies with its supervisor, so a supervisor killed with SIGKILL leaves no main process.
    proctree.die_with_parent(signal.SIGKILL)
    if cpus:  # its GPUs' NUMA node (jobs/backends/cpu_pinning.py); the sandbox and every child inherit it
        os.sched_setaffinity(0, cpus)
    if limits is not None:
        limits.join()  # before exec: every process of the job starts inside its limits (kernel/limits.py)


def _limits_verdict(outcome: dict, code: int) -> dict:
    """status.json's account of the limits; an out-of-memory kill that ended the job makes its reason OOMKilled."""
    verdict: dict = {"limits": outcome}
    if outcome.get("oom_kills") and code != 0:
        verdict["reason"] = "OOMKilled"
        verdict["memory_peak_bytes"] = outcome.get("memory_peak_bytes")
        verdict["memory_limit_bytes"] = outcome.get("memory_limit_bytes")
    return verdict


class _Log:
    """The log store as seen by the supervisor: a failure costs lines (counted), never the job."""

    def __init__(self, folder: Path, spec: dict):
        self.folder = folder
        self.spec = spec
        self.writer = None
        self.lines_lost = 0
        self.unflushed = 0  # lines handed to the writer since its last successful flush: lost with it if it fails
        self.error = ""
        self._retry_at = 0.0
        self._reported = (0, "")
        self._open()

    def _open(self) -> None:
        try:
            self.writer = LogWriter(
                Path(self.spec["log_dir"]),
                budget_bytes=self.spec["budget_bytes"],
                budget_lines=self.spec["budget_lines"],
            )
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        self.error = f"{type(exc).__name__}: {exc}"[:300]
        ring = self.writer is not None and self.writer.meta.ring
        # A ring holds at most RING_LINES lines; the rest were already counted as dropped by the budget.
        self.lines_lost += min(self.unflushed, RING_LINES) if ring else self.unflushed
        self.unflushed = 0
        if self.writer is not None:
            try:
                self.writer.abandon()
            except OSError:
                pass
        self.writer = None
        self._retry_at = time.monotonic() + LOG_RETRY_S

    def line(self, data: bytes | str, *, stream: str = "stdout") -> None:
        if self.writer is None and time.monotonic() >= self._retry_at:
            self._open()
        if self.writer is None:
            self.lines_lost += 1
            return
        try:
            self.writer.write_line(data, stream=stream)
            self.unflushed += 1
        except OSError as exc:
            self.lines_lost += 1
            self._failed(exc)

    def flush(self) -> None:
        if self.writer is not None:
            try:
                self.writer.flush(lazy=True)
                if not self.writer.meta.ring:
                    self.unflushed = 0  # a plain log's lazy flush always reaches the file (the ring keeps its own)
            except OSError as exc:
                self._failed(exc)
        self.report()

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
                self.unflushed = 0
            except OSError as exc:
                self._failed(exc)
        self.report()

    def report(self) -> None:
        """Tell the observer how many lines were lost (written beside status.json, not in the log folder)."""
        now = (self.lines_lost, self.error)
        if now != self._reported:
            self._reported = now
            try:
                _write_json(self.folder / "log_faults.json", {"lines_lost": self.lines_lost, "error": self.error})
            except OSError:
                pass


class _Supervisor:
    def __init__(self, folder: Path, spec: dict):
        self.folder = folder
        self.spec = spec
        self.grace = float(spec.get("grace_s", 10))
        self.tag = (str(spec["env"].get("TRAINYARD_JOB_ID", "")), int(spec["env"].get("TRAINYARD_ATTEMPT", "0") or 0))
        self.scope = str(spec["env"].get("TRAINYARD_PLATFORM_SCOPE", ""))
        self.stop_signals = 0  # set by the signal handler: a plain int, no lock (a handler must never block)
        self.stop_started: float | None = None
        self.main_pid = 0
        self.main_status: int | None = None
        self.main_ended_at: float | None = None
        self.disk_stop = False  # the supervisor's own stop: the job kept running on a full disk

    def on_term(self, _signum, _frame) -> None:
        self.stop_signals += 1

    def processes(self) -> set[int]:
        found = proctree.descendants(os.getpid())
        if self.tag[0]:
            found |= proctree.tagged(*self.tag, self.scope)
        return found

    def _reaped(self, pid: int, status: int) -> None:
        if pid == self.main_pid and self.main_status is None:
            self.main_status = status
            self.main_ended_at = time.time()

    def reap(self) -> None:
        for pid, status in proctree.reap_children():
            self._reaped(pid, status)

    def enforce_stop(self) -> None:
        """Carry out a requested stop: SIGTERM everything once, SIGKILL after the grace (or a second SIGTERM)."""
        if not self.stop_signals and not self.disk_stop:
            return
        now = time.monotonic()
        if self.stop_started is None:
            self.stop_started = now
            proctree.signal_all(self.processes(), signal.SIGTERM)
        elif self.stop_signals > 1 or now - self.stop_started >= self.grace:
            proctree.signal_all(self.processes(), signal.SIGKILL)

    def stop_leftovers(self) -> None:
        left = self.processes()
        if left:
            proctree.signal_all(left, signal.SIGTERM)
            deadline = time.monotonic() + min(self.grace, LEFTOVER_GRACE_S)
            while time.monotonic() < deadline and self.processes():
                time.sleep(0.05)
                self.reap()
        proctree.kill_until_gone(self.processes, on_reap=self._reaped)
        self.reap()


def _lock(folder: Path):
    """The supervisor's lock, or None when another supervisor of this attempt holds it."""
    fd = os.open(folder / "supervisor.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    for _ in range(50):  # an observer holds it for an instant when it checks liveness
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            time.sleep(0.1)
    os.close(fd)
    return None


def _datasets(spec: dict, box: dict | None, logs: _Log, folder: Path) -> list | None:
    """Bring the job's datasets into the node's cache (fetched once, shared) and bind them read-only into the
    sandbox at the paths the job asked for. Returns the held copies (kept from eviction while this supervisor
    lives), or None when one could not be had: the attempt then ends with the reason, before the command starts."""
    conf = spec.get("datasets") or {}
    items = conf.get("items") or []
    if not items:
        return []
    from jobs.backends.dataset_cache import DatasetCache, DatasetError
    from kernel import objectstore

    held = []
    try:
        if not conf.get("store"):
            raise DatasetError("no object store is configured (TRAINYARD_S3_URL): datasets cannot be fetched")
        store = objectstore.S3Config(**conf["store"])
        cache = DatasetCache(Path(conf["cache_dir"]), limit_bytes=int(conf.get("limit_bytes") or 0))
        for item in items:
            started = time.monotonic()
            copy = cache.acquire(item, store)
            held.append(copy)
            how = "fetched into" if copy.fetched else "found in"
            logs.line(f"[trainyard] dataset {item['name']} v{item['version']} {how} the node's cache "
                      f"in {time.monotonic() - started:.2f} s, read-only at {item['path']}")  # fmt: skip
            env_name = "TRAINYARD_DATASET_" + "".join(c if c.isalnum() else "_" for c in item["name"].upper())
            if box:
                box.setdefault("datasets", []).append([str(copy.path), item["path"]])
                spec["env"][env_name] = item["path"]
            else:  # no sandbox to bind into: the job reads the cached copy where it is
                spec["env"][env_name] = str(copy.path)
    except Exception as exc:  # noqa: BLE001 - the command never starts without its data
        reason = getattr(exc, "reason", "DatasetFetchError")
        logs.line(f"[trainyard] {reason}: {exc}")
        logs.close()
        for copy in held:
            copy.release()
        _write_json(
            folder / "status.json",
            {"exit_code": 125, "signal": None, "cancelled": False, "reason": reason, "message": str(exc)[:1000],
             "ended_at": time.time()},
        )  # fmt: skip
        return None
    return held


def main(folder: Path) -> int:
    lock = _lock(folder)
    if lock is None or (folder / "status.json").exists():
        return 0  # another supervisor runs this attempt, or it already ended: never run a command twice
    (folder / "runner.pid").write_text(str(os.getpid()))
    spec = json.loads((folder / "spec.json").read_text())
    proctree.become_subreaper()
    sup = _Supervisor(folder, spec)
    # Installed before the command starts: a stop that arrives early must still stop the job, not the supervisor.
    signal.signal(signal.SIGTERM, sup.on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if (folder / "cancel").exists():
        sup.stop_signals = 1  # cancelled before this supervisor could take signals
    logs = _Log(folder, spec)
    cwd = Path(spec["cwd"])
    box = spec.get("sandbox")
    net = None
    fds: list[int] = []
    ckpt = None
    if spec.get("checkpoint"):
        sbox = box or {}
        ckpt = CheckpointSync(folder, spec["checkpoint"], chown=sbox.get("uid") if sbox.get("drop_root") else None)
        plan = spec["checkpoint"].get("restore")
        if plan:
            try:
                spec["env"]["TRAINYARD_RESUME_FROM"] = str(ckpt.restore(plan))
                logs.line(f"[trainyard] restored checkpoint {plan['name']} (job {plan.get('job')}, attempt "
                          f"{plan.get('attempt')}) into {spec['env']['TRAINYARD_RESUME_FROM']}")  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - the command never starts without the checkpoint it resumes
                reason, message = restore_failure(plan, exc)
                logs.line(f"[trainyard] {message}")
                logs.close()
                _write_json(
                    folder / "status.json",
                    {
                        "exit_code": RESTORE_EXIT_CODE,
                        "signal": None,
                        "cancelled": False,
                        "reason": reason,
                        "message": message,
                        "ended_at": time.time(),
                    },
                )
                return 0
        ckpt.start()
    held = _datasets(spec, box, logs, folder)
    if held is None:
        if ckpt is not None:
            ckpt.finish()
        return 0
    limits = None
    if spec.get("limits"):
        limits = AttemptLimits(spec["limits"], name=f"{sup.tag[0] or folder.parent.name}-{sup.tag[1]}")
        limits.apply()
        _write_json(
            folder / "limits.json",
            {"held": limits.describe(), "mode": limits.mode, "folders": [str(f) for f in limits.folders]},
        )
        if limits.fallback:  # the user's log says so only when the attempt got less than the platform's usual
            logs.line(f"[trainyard] {limits.describe()}")
    sec_fd = None
    try:
        cwd.mkdir(parents=True, exist_ok=True)
        sec_fd = sandbox.seccomp_fd(box)
        if box and box.get("network"):
            # The job's outbound network: bubblewrap waits until slirp4netns has given its namespace an interface.
            info_r, info_w = os.pipe()
            block_r, block_w = os.pipe()
            fds = [info_r, info_w, block_r, block_w]
            argv = sandbox.wrap(box, list(spec["argv"]), info_fd=info_w, block_fd=block_r, seccomp_fd=sec_fd)
        else:
            argv = command_argv(spec, seccomp_fd=sec_fd)
        child = subprocess.Popen(
            argv,
            cwd=cwd,
            env=spec["env"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=functools.partial(_child_setup, limits, tuple(spec.get("cpus") or ())),
            pass_fds=((info_w, block_r) if fds else ()) + ((sec_fd,) if sec_fd is not None else ()),
        )
        if fds:
            os.close(info_w)
            os.close(block_r)
            try:
                net = sandbox.attach_network(box, info_r, block_w, log=folder / "network.log")
            except sandbox.SandboxUnavailable:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                raise
    except (OSError, subprocess.SubprocessError, sandbox.SandboxUnavailable) as exc:
        logs.line(f"[trainyard] could not start the command: {exc}")
        logs.close()
        if limits is not None:
            limits.remove()
        _write_json(
            folder / "status.json",
            {"exit_code": 127, "signal": None, "cancelled": False, "reason": "StartError", "ended_at": time.time()},
        )
        return 0
    finally:
        for fd_ in ((fds[0], fds[3]) if fds else ()) + ((sec_fd,) if sec_fd is not None else ()):
            try:
                os.close(fd_)
            except OSError:
                pass
    sup.main_pid = child.pid
    usage_spec = spec.get("usage") or {}
    sampler = UsageSampler(
        folder / "usage.jsonl",
        interval_s=float(usage_spec.get("interval_s", 5.0)),
        emulated_gpu=bool(usage_spec.get("emulated_gpu")),
    )
    _write_json(folder / "child.json", {"pid": child.pid, "pgid": child.pid, "started_at": time.time()})
    assert child.stdout is not None and child.stderr is not None
    # One pipe per stream: the merged log keeps the order they are read in, stderr is also kept apart.
    pipes: dict[int, tuple[str, Any]] = {p.fileno(): (name, p) for name, p in (("stdout", child.stdout),
                                                                           ("stderr", child.stderr))}  # fmt: skip
    partial: dict[int, bytes] = dict.fromkeys(pipes, b"")
    for fd_ in pipes:
        os.set_blocking(fd_, False)

    def emit(stream: str, line: bytes) -> None:
        logs.line(line, stream=stream)
        sampler.line(line)

    def pump(timeout: float) -> None:
        """Read what the pipes hold within `timeout`; close each at EOF."""
        if not pipes:
            time.sleep(timeout)
            return
        ready, _, _ = select.select(list(pipes), [], [], timeout)
        for fd_ in ready:
            stream, pipe = pipes[fd_]
            try:
                chunk = os.read(fd_, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                pipe.close()
                del pipes[fd_]
                if partial[fd_]:
                    emit(stream, partial[fd_])
                partial[fd_] = b""
                continue
            lines = (partial[fd_] + chunk).split(b"\n")
            partial[fd_] = lines.pop()
            for line in lines:
                emit(stream, line)
            while len(partial[fd_]) > MAX_PARTIAL:
                emit(stream, partial[fd_][:MAX_PARTIAL] + " …[line cut]".encode())
                partial[fd_] = partial[fd_][MAX_PARTIAL:]
        logs.flush()

    disk = _DiskWatch(folder, spec.get("disk"))
    while sup.main_status is None:
        if not sup.disk_stop and disk.check():
            sup.disk_stop = True
            logs.line(f"[trainyard] the job's disk is full ({disk.message()}); stopping the job")
        sup.enforce_stop()
        pump(0.2)
        sup.reap()
        if sampler.due():  # descendants only: the subreaper keeps every process of the job below it
            sampler.sample(proctree.descendants(os.getpid()))
    # The main process has ended: read what is still in flight, then stop whatever it left behind.
    deadline = time.monotonic() + DRAIN_S
    while pipes and time.monotonic() < deadline:
        pump(0.05)
    sup.stop_leftovers()
    deadline = time.monotonic() + DRAIN_S
    while pipes and time.monotonic() < deadline:
        pump(0.05)
    for fd_, (stream, pipe) in list(pipes.items()):
        pipe.close()
        if partial[fd_]:
            logs.line(partial[fd_], stream=stream)
    child.returncode = os.waitstatus_to_exitcode(sup.main_status)  # reaped here, not by Popen
    verdict: dict = {}
    if limits is not None:
        verdict = _limits_verdict(limits.outcome(), child.returncode)
        limits.remove()  # every process of the attempt is gone by now (stop_leftovers)
        if verdict.get("reason"):
            peak = verdict.get("memory_peak_bytes")
            logs.line(f"[trainyard] out of memory: the job was killed at its limit of "
                      f"{(verdict['memory_limit_bytes'] or 0) >> 20} MiB (peak "
                      f"{'unknown' if peak is None else f'{peak >> 20} MiB'})")  # fmt: skip
    sandbox.detach_network(net)
    if ckpt is not None:
        ckpt.finish()  # whatever the outcome; bounded by the final wait
        if ckpt.unsaved:
            logs.line(f"[trainyard] {len(ckpt.unsaved)} checkpoint file(s) not saved to the object store"
                      + (f": {ckpt.error}" if ckpt.error else ""))  # fmt: skip
    logs.close()
    code = child.returncode
    reason = message = ""
    if sup.stop_signals:
        try:  # the platform may say why it stopped the command (e.g. GpuShareExceeded)
            reason = (folder / "cancel").read_text().strip()[:100]
        except OSError:
            pass
    elif sup.disk_stop or code != 0:
        if disk.seen is None:
            disk._next = 0.0  # look once more: the command may have failed the moment its disk filled
            disk.check()
        if disk.seen is not None and not verdict.get("reason"):  # stopped on a full disk, or failed with it full
            reason, message = DISK_FULL, disk.message()
    if not reason and verdict.get("reason"):
        reason = verdict["reason"]
    _write_json(
        folder / "status.json",
        {
            **verdict,
            "exit_code": code if code >= 0 else None,
            "signal": -code if code < 0 else None,
            "cancelled": bool(sup.stop_signals),
            "reason": reason,
            "message": message,
            "ended_at": sup.main_ended_at,
            "log_lines_lost": logs.lines_lost,
            "log_error": logs.error,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
