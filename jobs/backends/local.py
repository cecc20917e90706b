"""The local backend: each attempt runs on this machine under a detached supervisor (`local_runner`).

An attempt's state files (spec, `supervisor.lock`, `status.json`, usage, markers) live in its state folder under
TRAINYARD_STATE_ROOT, never in the job's work or checkpoint folders under TRAINYARD_WORK_ROOT: a job that fills its
own disk cannot take the record of how it ended with it, and each state folder keeps a small preallocated reserve
the supervisor gives up to write its last status should the two ever share a full filesystem.

A supervisor holds `supervisor.lock` while it lives; the observer tests that lock, so a reused pid can never pass
for a live supervisor. A supervisor that is gone without `status.json` is fenced before it is reported lost:
every process carrying the attempt's tag is killed, and only when none is left may the attempt be retried.

Placement is rendered as environment: `CUDA_VISIBLE_DEVICES` / `NVIDIA_VISIBLE_DEVICES` (the cards'
UUIDs), and the HAMi-core limits `CUDA_DEVICE_MEMORY_LIMIT` / `CUDA_DEVICE_SM_LIMIT` for shares.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import structlog
from django.conf import settings

from jobs import logstore
from jobs.backends import cpu_pinning, sandbox
from jobs.backends.base import DISK_FULL, UNOBSERVABLE, AttemptDescription, Observation, disk_full_message
from kernel import limits, proctree
from kernel.host import platform_scope
from kernel.paths import BASE_DIR
from kernel.sentences import stored

log = structlog.get_logger(__name__)
SUPERVISOR_START_S = 20.0  # how long submit waits for a new supervisor to take its lock
STATE_RESERVE_BYTES = 1 << 20  # preallocated in each state folder, freed by the supervisor to write status.json


def placement_env(desc: AttemptDescription) -> dict[str, str]:
    env: dict[str, str] = {}
    uuids = ",".join(d.gpu_uuid for d in desc.devices)
    emulated = any(d.gpu_uuid.startswith("EMU-") for d in desc.devices)
    # On real cards the UUIDs select the devices; emulated cards have no driver-visible id, use the indexes.
    visible = ",".join(str(d.gpu_index) for d in desc.devices) if emulated else uuids
    env["CUDA_VISIBLE_DEVICES"] = visible
    env["NVIDIA_VISIBLE_DEVICES"] = visible
    env["TRAINYARD_GPU_UUIDS"] = uuids
    if desc.devices and not desc.exclusive:
        device = desc.devices[0]
        env["CUDA_DEVICE_MEMORY_LIMIT"] = f"{device.memory_mib}m"
        env["CUDA_DEVICE_SM_LIMIT"] = str(max(1, device.compute_milli // 10))
    return env


def job_path(job_root: Path, relative: str, *, default: str) -> Path:
    """A path the job named (working dir, TensorBoard log dir), kept inside its own folder.

    The API refuses anything else (jobs/validation.py); this is the backend's own guard for older rows.
    """
    work = job_root / "work"
    if not relative:
        return job_root / default
    path = Path(os.path.normpath(work / relative))
    if os.path.isabs(relative) or not path.is_relative_to(work):
        raise ValueError(f"'{relative}' is outside the job's folder")
    return path


_sandbox_checked = False


def _check_sandbox() -> None:
    """Make one empty sandbox per process before the first job, so a missing sandbox is a clear platform error."""
    global _sandbox_checked
    if not _sandbox_checked:
        sandbox.preflight(settings.TRAINYARD_SANDBOX_BWRAP)
        _sandbox_checked = True


def command_path() -> str:
    """The PATH a local job's command is resolved on: the platform's own interpreter first (so `python` is the
    Python the platform runs on, with its installed packages), then the worker's PATH."""
    first = str(Path(sys.executable).parent)
    rest = [p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p and p != first]
    return os.pathsep.join([first, *rest])


def runtime() -> dict:
    """What really runs a local job's command, for the submit form, the job page and the reproduce record."""
    return {
        "kind": "host",
        "image_used": False,
        "python": sys.executable,
        "python_version": ".".join(map(str, sys.version_info[:3])),
        "path": command_path(),
        "sandbox": sandbox.enabled(),
        # What holds a job to its memory, processes and CPU (kernel/limits.py): cgroup2, cgroup1, rlimit or off.
        "limits": limits_mode(),
        "seccomp": sandbox.enabled() and os.geteuid() == 0 and sandbox.seccomp_supported(),
    }


def limits_mode() -> str:
    setting = str(settings.TRAINYARD_JOB_LIMITS)
    if setting == "off":
        return "off"
    return limits.detect(setting, v2_parent_setting=settings.TRAINYARD_CGROUP_PARENT)


def limits_plan(desc: AttemptDescription, box: dict | None) -> dict | None:
    """The attempt's memory, process and CPU limits, as it asked for them (memory_mib, cpu_milli)."""
    return limits.plan(
        memory_mib=desc.memory_mib,
        cpu_milli=desc.cpu_milli,
        pids_max=settings.TRAINYARD_JOB_PIDS_MAX,
        setting=str(settings.TRAINYARD_JOB_LIMITS),
        v2_parent_setting=settings.TRAINYARD_CGROUP_PARENT,
        own_uid=bool(box and box.get("drop_root")),  # root mode: the job's uid is its own, RLIMIT_NPROC counts it
        scope=platform_scope(),
    )


def _runner_path() -> str:
    return os.pathsep.join(filter(None, [str(BASE_DIR), os.environ.get("PYTHONPATH")]))


class LocalBackend:
    name = "local"

    def __init__(self, root: Path | None = None, state_root: Path | None = None):
        self.root = Path(root or settings.TRAINYARD_WORK_ROOT)  # the jobs' own folders: work, checkpoints
        self.state_root = Path(state_root or settings.TRAINYARD_STATE_ROOT)  # the supervisors' state folders
        self._spawned: list[subprocess.Popen] = []
        self._told_store: dict[str, dict] = {}  # the store address each live supervisor was last given

    # A ref is "local:<job_id>:<attempt_number>"; the folder holds spec, pids and status.
    def _folder(self, ref: str) -> Path:
        _, job_id, number = ref.split(":")
        folder = self.state_root / job_id / f"attempt-{number}"
        if not folder.exists():
            # An attempt started before state folders moved out of the work root is still followed where it is.
            legacy = self.root / job_id / f"attempt-{number}"
            if (legacy / "spec.json").exists():
                return legacy
        return folder

    def cpu_pinning(self, ref: str) -> dict | None:
        """The CPUs the attempt's processes were pinned to, and why (None before its submit wrote it)."""
        try:
            return json.loads((self._folder(ref) / "pinning.json").read_text())
        except (OSError, ValueError):
            return None

    def submit(self, desc: AttemptDescription) -> str:
        ref = f"local:{desc.job_id}:{desc.attempt_number}"
        folder = self._folder(ref)
        if (folder / "runner.pid").exists():
            return ref  # already submitted: a repeated submit is a no-op
        if sandbox.enabled():
            _check_sandbox()
        for top in (self.root, self.state_root):
            top.mkdir(parents=True, exist_ok=True)
            top.chmod(0o700)  # jobs' folders are nobody else's business (the sandbox hides them anyway)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Two starts of one attempt can get here at once: the reconciler starts again an attempt claimed more than
        # TRAINYARD_START_OVERDUE_S ago and not handed over, while the first start may still be at work (a loaded
        # machine, a big code snapshot). One at a time: the second waits for the first, then finds its supervisor.
        # Both used to write the same spec file (the second's rename failed, the attempt was retried while the
        # first one's command ran) and could unpack the job's code again under the command already running. A
        # start that dies lets go of the lock with its process.
        held = os.open(folder / "submit.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(held, fcntl.LOCK_EX)
            if (folder / "runner.pid").exists():
                return ref  # submitted by the start that held the lock
            return self._submit_held(desc, ref, folder)
        finally:
            os.close(held)

    def _submit_held(self, desc: AttemptDescription, ref: str, folder: Path) -> str:
        """Prepare the attempt's folders and spec and start its supervisor; the caller holds the submit lock."""
        _reserve(folder / "reserve")
        job_root = self.root / desc.job_id
        workdir = job_path(job_root, desc.working_dir, default="work")
        tb_dir = str(job_path(job_root, desc.tensorboard_logdir, default="tensorboard"))
        ckpt_dir = job_root / "checkpoints" / f"attempt-{desc.attempt_number}"
        ckpt_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if desc.code:
            from jobs.code import unpack

            # The job's copy of its code, the job's own to change (the sandbox's uid when the platform is root).
            owner = sandbox.job_uid(desc.job_id) if sandbox.enabled() and os.geteuid() == 0 else None
            unpack(team_slug=desc.code["team"], digest=desc.code["digest"], into=workdir, owner=owner)
        box = sandbox.plan(
            job_id=desc.job_id,
            workdir=workdir,
            job_dirs=[job_root / "work", job_root / "tensorboard", ckpt_dir],
            devices=[d.__dict__ for d in desc.devices],
            outbound=desc.outbound_network,
            folder=folder,
        )
        env = {
            "PATH": command_path(),
            "HOME": str(workdir),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "PYTHONUNBUFFERED": "1",
            **desc.env,
            **placement_env(desc),
            "TRAINYARD_JOB_ID": desc.job_id,
            "TRAINYARD_ATTEMPT": str(desc.attempt_number),
            "TRAINYARD_PLATFORM_SCOPE": platform_scope(),  # the tag's third part: whose job 1, attempt 1 this is
            "TRAINYARD_TENSORBOARD_LOGDIR": tb_dir,
            "TRAINYARD_CHECKPOINT_DIR": str(ckpt_dir),
        }
        if desc.preempt_notice_s:
            env["TRAINYARD_PREEMPT_NOTICE"] = str(desc.preempt_notice_s)
        spec = {
            "argv": [*desc.command, *desc.args],
            "env": env,
            "cwd": str(workdir),
            "log_dir": str(logstore.attempt_dir(desc.job_id, desc.attempt_number)),
            "budget_bytes": settings.TRAINYARD_LOG_DAILY_BYTES,
            "budget_lines": settings.TRAINYARD_LOG_DAILY_LINES,
            # A preemptible job's stop gives it its notice to save a checkpoint; any other stop, the cancel grace.
            "grace_s": desc.preempt_notice_s or settings.TRAINYARD_CANCEL_GRACE_S,
            "sandbox": box,
            "checkpoint": self._checkpoint_spec(desc, ckpt_dir),
            "usage": {
                "interval_s": settings.TRAINYARD_USAGE_INTERVAL_S,
                # Only emulated cards accept the job's own statement of GPU use (jobs/backends/usage_sampler.py).
                "emulated_gpu": bool(desc.devices) and all(d.gpu_uuid.startswith("EMU-") for d in desc.devices),
            },
            "datasets": self._datasets_spec(desc),
            "disk": self._disk_spec([job_root / "work", ckpt_dir]),
            "limits": limits_plan(desc, box),
        }
        # Its processes on the CPUs of its GPUs' NUMA node(s), as many as it asks for (jobs/backends/cpu_pinning.py).
        if settings.TRAINYARD_LOCAL_CPU_PINNING:
            pinning = cpu_pinning.plan(
                gpu_uuids=[d.gpu_uuid for d in desc.devices],
                cpu_milli=desc.cpu_milli,
                in_use=cpu_pinning.pinned_elsewhere(self.root, but=folder),
            )
        else:
            pinning = cpu_pinning.Pinning(why=stored("not pinned: CPU pinning is off (TRAINYARD_LOCAL_CPU_PINNING)"))
        (folder / "pinning.json").write_text(json.dumps(pinning.as_dict()))
        spec["cpus"] = list(pinning.cpus)
        # The spec holds the job's env (its secrets): readable by the platform's user alone, written whole.
        tmp = folder / "spec.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(spec))
        os.replace(tmp, folder / "spec.json")
        runner = subprocess.Popen(
            [sys.executable, "-m", "jobs.backends.local_runner", str(folder)],
            cwd=BASE_DIR,
            stdin=subprocess.DEVNULL,
            stdout=open(folder / "runner.out", "ab"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # The platform first, then whatever path this process was given (an install outside site-packages).
            env={**os.environ, "PYTHONPATH": _runner_path()},
        )
        self._spawned.append(runner)
        # The supervisor writes runner.pid once it holds the lock: from then on the observer can judge it.
        deadline = time.monotonic() + SUPERVISOR_START_S
        while not (folder / "runner.pid").exists():
            if runner.poll() is not None and not (folder / "runner.pid").exists():
                raise RuntimeError(f"the local supervisor exited with status {runner.returncode} before starting")
            if time.monotonic() > deadline:
                runner.kill()
                raise RuntimeError(f"the local supervisor did not start within {SUPERVISOR_START_S:g} s")
            time.sleep(0.02)
        return ref

    @staticmethod
    def _disk_spec(paths: list[Path]) -> dict:
        """What the supervisor watches: the job's own folders, whose filesystems the job may fill."""
        return {
            "paths": [str(p) for p in paths],
            "min_free_bytes": int(settings.TRAINYARD_DISK_FULL_FREE_BYTES),
            "grace_s": float(settings.TRAINYARD_DISK_FULL_GRACE_S),
        }

    @staticmethod
    def _checkpoint_spec(desc: AttemptDescription, ckpt_dir: Path) -> dict | None:
        """What the supervisor needs to sync the checkpoint folder (None: no object store, they stay local)."""
        from jobs.checkpoints import store_config

        store = store_config()
        if store is None or not desc.checkpoint:
            return None
        return {
            "dir": str(ckpt_dir),
            "store": store.to_dict(),
            "prefix": desc.checkpoint["prefix"],
            "restore": desc.checkpoint.get("restore"),
            "sync_s": settings.TRAINYARD_CHECKPOINT_SYNC_S,
            "final_wait_s": settings.TRAINYARD_CHECKPOINT_FINAL_WAIT_S,
        }

    @staticmethod
    def _datasets_spec(desc: AttemptDescription) -> dict | None:
        """What the supervisor needs to bring the job's datasets into the node's cache and bind them read-only."""
        if not desc.datasets:
            return None
        from jobs.checkpoints import store_config

        store = store_config()
        return {
            "cache_dir": str(settings.TRAINYARD_DATASET_CACHE_DIR),
            "limit_bytes": int(settings.TRAINYARD_DATASET_CACHE_BYTES),
            "store": store.to_dict() if store is not None else None,
            "items": [d for d in desc.datasets if d.get("kind") == "s3"],
        }

    def _runner_alive(self, folder: Path) -> bool:
        """A supervisor holds the folder's lock for as long as it lives."""
        self._reap_own_children()
        try:
            fd = os.open(folder / "supervisor.lock", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops a lock taken here
        return False

    def _reap_own_children(self) -> None:
        # A supervisor started by this process is its child until it exits: collect it, or it stays a zombie.
        self._spawned = [runner for runner in self._spawned if runner.poll() is None]

    def fence(self, ref: str) -> set[int]:
        """Kill every process of an attempt whose supervisor is gone; returns the pids still alive (none: fenced)."""
        _, job_id, number = ref.split(":")
        scope = platform_scope()
        return proctree.kill_until_gone(lambda: proctree.tagged(job_id, int(number), scope), timeout=10.0)

    def _sandboxed(self, folder: Path) -> bool:
        try:
            return bool(json.loads((folder / "spec.json").read_text()).get("sandbox"))
        except (OSError, ValueError):
            return False

    def observe(self, refs: list[str]) -> dict[str, Observation]:
        result = {}
        self._told_store = {ref: self._told_store[ref] for ref in refs if ref in self._told_store}  # live ones only
        for ref in refs:
            # One attempt whose folder cannot be read or written (an immutable folder, a full disk) is reported
            # as such and never stops the others from being observed.
            try:
                result[ref] = self._observe_one(ref)
            except (OSError, ValueError) as exc:
                log.warning("local_attempt_unobservable", ref=ref, error=str(exc)[:200])
                result[ref] = Observation(
                    phase=UNOBSERVABLE,
                    message=stored("its state files cannot be read or written: %(error)s", error=str(exc)[:300]),
                )
        return result

    def _observe_one(self, ref: str) -> Observation:
        folder = self._folder(ref)
        alive = self._runner_alive(folder)
        status_path = folder / "status.json"  # read after the liveness check: it may have just ended
        faults = self._log_faults(folder)
        manifest = self._checkpoints(folder)
        began = self._child_started_at(folder)
        if status_path.exists():
            status = json.loads(status_path.read_text())
            code, sig = status.get("exit_code"), status.get("signal")
            if self._sandboxed(folder):
                code, sig = sandbox.decode_exit(code, sig)
            phase = "succeeded" if code == 0 and not sig else "failed"
            reason = status.get("reason") or (
                signal.Signals(sig).name if sig else ("Completed" if code == 0 else "Error")
            )
            message = str(status.get("message") or "")
            disk_full = self._disk_full(folder)
            if reason == DISK_FULL and disk_full:
                message = disk_full_message(disk_full)
            elif reason == "OOMKilled":
                peak, limit = status.get("memory_peak_bytes"), status.get("memory_limit_bytes") or 0
                message = stored(
                    "out of memory: killed at its memory limit of %(limit)s MiB, peak %(peak)s MiB",
                    limit=limit >> 20,
                    peak="?" if peak is None else peak >> 20,
                )
            return Observation(
                phase=phase,
                exit_code=code,
                signal=sig,
                reason=reason,
                message=message,
                cancelled=bool(status.get("cancelled")),
                started_at=began,
                ended_at=status.get("ended_at"),
                log_lines_lost=int(status.get("log_lines_lost") or faults.get("lines_lost") or 0),
                log_error=status.get("log_error") or faults.get("error") or "",
                checkpoints=manifest,
                disk_full=disk_full,
            )
        elif alive:
            self._tell_store(ref, folder)
            return Observation(
                phase="running",
                started_at=began,
                log_lines_lost=int(faults.get("lines_lost") or 0),
                log_error=faults.get("error", ""),
                checkpoints=manifest,
                disk_full=self._disk_full(folder),
            )
        else:
            left = self.fence(ref)
            if left:
                # Never reported lost while any of its processes lives: a retry would run beside them.
                log.warning("local_attempt_fencing", ref=ref, alive=sorted(left)[:20])
                return Observation(
                    phase="running",
                    message=stored("supervisor gone; %(n)s processes could not be killed yet", n=len(left)),
                )
            else:
                limits.remove_folders(self._limit_folders(folder))  # the dead supervisor could not
                try:
                    (folder / "fenced").write_text(str(time.time()))
                except OSError as exc:  # only a note for later readers: every process is already gone
                    log.warning("local_fenced_marker_unwritten", ref=ref, error=str(exc)[:200])
                return Observation(
                    phase="lost",
                    reason="Lost",
                    message=stored(
                        "the local supervisor died without an exit status; every process of the attempt was killed"
                    ),
                    started_at=began,
                    ended_at=time.time(),
                    log_lines_lost=int(faults.get("lines_lost") or 0),
                    log_error=faults.get("error", ""),
                    checkpoints=manifest,
                )

    @staticmethod
    def _child_started_at(folder: Path) -> float | None:
        """When the supervisor started the job's command (child.json), None before it has."""
        try:
            value = json.loads((folder / "child.json").read_text()).get("started_at")
        except (OSError, ValueError, AttributeError):
            return None
        return float(value) if isinstance(value, (int, float)) else None

    def _tell_store(self, ref: str, folder: Path) -> None:
        """A running supervisor uploads to the store it was given at start; when the platform's store is now
        elsewhere (make run restarted its embedded SeaweedFS on other ports), write the new address to store.json,
        which the supervisor reads on its next pass (checkpoint_sync.py)."""
        from jobs.backends.checkpoint_sync import STORE_FILE
        from jobs.checkpoints import store_config

        store = store_config()
        if store is None:
            return
        current = store.to_dict()
        if self._told_store.get(ref) == current:
            return
        try:
            try:
                known = json.loads((folder / STORE_FILE).read_text())
            except FileNotFoundError:
                known = (json.loads((folder / "spec.json").read_text()).get("checkpoint") or {}).get("store")
            if known is not None and known != current:
                tmp = folder / (STORE_FILE + ".tmp")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the store's secret
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps(current))
                os.replace(tmp, folder / STORE_FILE)
                log.info("local_attempt_store_moved", ref=ref, url=current["url"])
        except (OSError, ValueError) as exc:  # told again on the next pass
            log.warning("local_attempt_store_untold", ref=ref, error=str(exc)[:200])
            return
        self._told_store[ref] = current

    @staticmethod
    def _disk_full(folder: Path) -> dict | None:
        """What the supervisor saw of a full work or checkpoint filesystem (disk.json), if it ever saw one."""
        try:
            return json.loads((folder / "disk.json").read_text()) or None
        except (OSError, ValueError):
            return None

    @staticmethod
    def _limit_folders(folder: Path) -> list[str]:
        try:
            return list(json.loads((folder / "limits.json").read_text()).get("folders") or [])
        except (OSError, ValueError):
            return []

    @staticmethod
    def _checkpoints(folder: Path) -> dict | None:
        try:
            return json.loads((folder / "checkpoints.json").read_text())
        except (OSError, ValueError):
            return None

    def hold_checkpoints(self, ref: str, held: bool) -> None:
        """Make the attempt's checkpoint uploads wait (the team's storage quota is full), or let them go on."""
        hold = self._folder(ref) / "checkpoint_hold"
        try:
            if held:
                hold.write_text("storage quota full")
            else:
                hold.unlink(missing_ok=True)
        except OSError:
            pass  # the attempt's folder is gone: nothing to hold

    @staticmethod
    def _log_faults(folder: Path) -> dict:
        try:
            return json.loads((folder / "log_faults.json").read_text())
        except (OSError, ValueError):
            return {}

    def cancel(self, ref: str, *, grace_s: float, reason: str = "") -> None:
        folder = self._folder(ref)
        if (folder / "status.json").exists():
            return
        # Seen by a supervisor that starts after this signal; it reports the reason written here.
        try:
            (folder / "cancel").write_text(reason)
        except OSError as exc:  # the signal below still stops a running supervisor
            log.warning("local_cancel_marker_unwritten", ref=ref, error=str(exc)[:200])
        try:
            pid = int((folder / "runner.pid").read_text())
        except (OSError, ValueError):
            return
        # A second cancel (the reconciler's, past the grace period) makes the supervisor kill at once.
        if self._runner_alive(folder):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            except PermissionError:  # not a supervisor of ours (they run as this user): the pid was reused
                log.warning("local_cancel_pid_not_ours", ref=ref, pid=pid)

    def read_usage(self, ref: str, offset: int, *, limit_bytes: int = 4 << 20) -> tuple[list[dict], int, bool]:
        """Usage samples the supervisor appended since byte `offset`: (samples, next offset, attempt ended)."""
        folder = self._folder(ref)
        ended = (folder / "status.json").exists() or (folder / "fenced").exists()
        try:
            with open(folder / "usage.jsonl", "rb") as f:
                f.seek(offset)
                chunk = f.read(limit_bytes)
        except OSError:
            return [], offset, ended
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written is read next time
        samples = []
        for line in complete.splitlines():
            try:
                samples.append(json.loads(line))
            except ValueError:
                continue
        more = len(chunk) == limit_bytes
        return samples, offset + len(complete), ended and not more

    def cleanup(self, ref: str) -> None:
        pass  # the working directory stays for the user; the log store keeps the logs

    def live_refs(self) -> set[str]:
        refs = set()
        folders = [*self.state_root.glob("*/attempt-*"), *self.root.glob("*/attempt-*")]  # the latter: legacy
        for folder in folders:
            # A supervisor that died is still counted until its processes are fenced: its slices stay held till then.
            if not (folder / "status.json").exists() and not (folder / "fenced").exists():
                refs.add(f"local:{folder.parent.name}:{folder.name.split('-', 1)[1]}")
        return refs

    def log_tail(self, ref: str, *, max_bytes: int = 65536) -> str:
        _, job_id, number = ref.split(":")
        return logstore.tail_text(logstore.attempt_dir(job_id, int(number)), max_bytes)


def _reserve(path: Path) -> None:
    """Preallocate the state folder's reserve (a filesystem without fallocate gets none: a note in the log)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    try:
        os.posix_fallocate(fd, 0, STATE_RESERVE_BYTES)
    except OSError as exc:
        log.warning("local_state_reserve_unavailable", path=str(path), error=str(exc)[:200])
    finally:
        os.close(fd)
