"""The local backend: each attempt runs as a process group on this machine under a detached supervisor.

Placement is rendered as environment: `CUDA_VISIBLE_DEVICES` / `NVIDIA_VISIBLE_DEVICES` (the cards'
UUIDs), and the HAMi-core limits `CUDA_DEVICE_MEMORY_LIMIT` / `CUDA_DEVICE_SM_LIMIT` for shares.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from django.conf import settings

from jobs import logstore
from jobs.backends import sandbox
from jobs.backends.base import AttemptDescription, Observation
from trainyard.paths import BASE_DIR


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


def _runner_path() -> str:
    return os.pathsep.join(filter(None, [str(BASE_DIR), os.environ.get("PYTHONPATH")]))


class LocalBackend:
    name = "local"

    def __init__(self, root: Path | None = None):
        self.root = Path(root or settings.TRAINYARD_WORK_ROOT)

    # A ref is "local:<job_id>:<attempt_number>"; the folder holds spec, pids and status.
    def _folder(self, ref: str) -> Path:
        _, job_id, number = ref.split(":")
        return self.root / job_id / f"attempt-{number}"

    def submit(self, desc: AttemptDescription) -> str:
        ref = f"local:{desc.job_id}:{desc.attempt_number}"
        folder = self._folder(ref)
        if (folder / "runner.pid").exists():
            return ref  # already submitted: a repeated submit is a no-op
        if sandbox.enabled():
            _check_sandbox()
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)  # jobs' folders are nobody else's business (the sandbox hides them anyway)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        job_root = self.root / desc.job_id
        workdir = job_path(job_root, desc.working_dir, default="work")
        tb_dir = str(job_path(job_root, desc.tensorboard_logdir, default="tensorboard"))
        box = sandbox.plan(
            job_id=desc.job_id,
            workdir=workdir,
            job_dirs=[job_root / "work", job_root / "tensorboard"],
            devices=[d.__dict__ for d in desc.devices],
        )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(workdir),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "PYTHONUNBUFFERED": "1",
            **desc.env,
            **placement_env(desc),
            "TRAINYARD_JOB_ID": desc.job_id,
            "TRAINYARD_ATTEMPT": str(desc.attempt_number),
            "TRAINYARD_TENSORBOARD_LOGDIR": tb_dir,
        }
        spec = {
            "argv": [*desc.command, *desc.args],
            "env": env,
            "cwd": str(workdir),
            "log_dir": str(logstore.attempt_dir(desc.job_id, desc.attempt_number)),
            "budget_bytes": settings.TRAINYARD_LOG_DAILY_BYTES,
            "budget_lines": settings.TRAINYARD_LOG_DAILY_LINES,
            "grace_s": settings.TRAINYARD_CANCEL_GRACE_S,
            "sandbox": box,
        }
        # The spec holds the job's env (its secrets): readable by the platform's user alone.
        fd = os.open(folder / "spec.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(spec))
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
        (folder / "runner.pid").write_text(str(runner.pid))
        return ref

    def _runner_alive(self, folder: Path) -> bool:
        try:
            pid = int((folder / "runner.pid").read_text())
        except (OSError, ValueError):
            return False
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            return False
        # A live pid must still be our supervisor for this folder (pids get reused); a zombie counts as gone.
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    os.waitpid(pid, os.WNOHANG)
                    return False
        except (OSError, IndexError, ChildProcessError):
            pass
        return str(folder).encode() in cmdline

    def _sandboxed(self, folder: Path) -> bool:
        try:
            return bool(json.loads((folder / "spec.json").read_text()).get("sandbox"))
        except (OSError, ValueError):
            return False

    def observe(self, refs: list[str]) -> dict[str, Observation]:
        result = {}
        for ref in refs:
            folder = self._folder(ref)
            alive = self._runner_alive(folder)
            status_path = folder / "status.json"  # read after the liveness check: it may have just ended
            if status_path.exists():
                status = json.loads(status_path.read_text())
                code, sig = status.get("exit_code"), status.get("signal")
                if self._sandboxed(folder):
                    code, sig = sandbox.decode_exit(code, sig)
                phase = "succeeded" if code == 0 and not sig else "failed"
                reason = status.get("reason") or (
                    signal.Signals(sig).name if sig else ("Completed" if code == 0 else "Error")
                )
                result[ref] = Observation(
                    phase=phase, exit_code=code, signal=sig, reason=reason, cancelled=bool(status.get("cancelled"))
                )
            elif alive:
                result[ref] = Observation(phase="running")
            else:
                result[ref] = Observation(
                    phase="lost", reason="Lost", message="the local supervisor is gone and left no exit status"
                )
        return result

    def cancel(self, ref: str, *, grace_s: float, reason: str = "") -> None:
        folder = self._folder(ref)
        if (folder / "status.json").exists():
            return
        # Seen by a supervisor that starts after this signal; it reports the reason written here.
        (folder / "cancel").write_text(reason)
        try:
            pid = int((folder / "runner.pid").read_text())
        except (OSError, ValueError):
            return
        if self._runner_alive(folder):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def cleanup(self, ref: str) -> None:
        pass  # the working directory stays for the user; the log store keeps the logs

    def live_refs(self) -> set[str]:
        refs = set()
        if not self.root.exists():
            return refs
        for folder in self.root.glob("*/attempt-*"):
            if not (folder / "status.json").exists() and self._runner_alive(folder):
                refs.add(f"local:{folder.parent.name}:{folder.name.split('-', 1)[1]}")
        return refs

    def log_tail(self, ref: str, *, max_bytes: int = 65536) -> str:
        _, job_id, number = ref.split(":")
        return logstore.tail_text(logstore.attempt_dir(job_id, int(number)), max_bytes)
