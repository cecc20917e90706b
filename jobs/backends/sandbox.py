"""The sandbox a local attempt runs in (bubblewrap), so a job touches nothing but its own work.

The local backend asks `plan()` for a JSON-able description of one attempt's sandbox and stores it in the
attempt's spec; the supervisor (which has no Django settings) turns it into the command line with `wrap()`.
What the job gets:

- its own unprivileged uid: when the platform runs as root, a per-job uid from
  `TRAINYARD_SANDBOX_UID_BASE` (bubblewrap sets up the mounts, then `setpriv` drops to that uid with no
  capabilities); otherwise an unprivileged user namespace where the job is uid 65534;
- its own PID, IPC, UTS and network namespaces (no network at all: the platform's PostgreSQL, Redis and
  internal ports are unreachable), and it dies with its supervisor;
- a read-only view of the host's system folders (`/usr`, `/etc`, `/opt`, the interpreter the platform
  runs on, `TRAINYARD_SANDBOX_RO_PATHS`), never the platform's project tree, `var/`, work or log roots,
  the platform user's home, `/run` (sockets) or other jobs' folders (covered with empty tmpfs even if a
  read-only path would include them);
- its own work and TensorBoard folders read-write, its own `/tmp`, `/var/tmp` and `/dev/shm`, a minimal
  `/dev`, and the device nodes of the GPUs it was placed on (where NVIDIA devices exist).

The supervisor stops a job with SIGTERM to its process group, then SIGKILL: bubblewrap itself would die
on SIGTERM and take the job down at once, so it is started with SIGTERM ignored and the job's command is
started with every signal back at its default (`env --default-signal`). Bubblewrap reports a command
killed by signal N as exit code 128+N; `decode_exit()` turns that back into the signal.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

NOBODY = 65534
SYSTEM_RO_PATHS = ("/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")
PRIVATE_TMPFS = ("/tmp", "/var/tmp", "/run", "/dev/shm")
NVIDIA_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be made on this machine; the message says why and what to do."""


def _setting(name: str, default):
    from django.conf import settings

    return getattr(settings, name, default)


def enabled() -> bool:
    return str(_setting("TRAINYARD_SANDBOX", "on")).lower() not in {"off", "0", "false", "no"}


def job_uid(job_id: str) -> int:
    """The uid a job runs as when the platform is root: stable per job, from a range no real user has."""
    if os.geteuid() != 0:
        return NOBODY  # inside a user namespace that maps it to the platform's user (see the module docstring)
    base = int(_setting("TRAINYARD_SANDBOX_UID_BASE", 200000))
    count = int(_setting("TRAINYARD_SANDBOX_UID_COUNT", 65536))
    return base + int(hashlib.sha256(job_id.encode()).hexdigest(), 16) % count


def _gpu_minor_numbers() -> dict[str, int]:
    """GPU UUID -> the N of /dev/nvidiaN, from the driver's own table (NVML's index may differ)."""
    minors: dict[str, int] = {}
    for info in Path("/proc/driver/nvidia/gpus").glob("*/information"):
        uuid = minor = None
        try:
            for line in info.read_text().splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "GPU UUID":
                    uuid = value.strip()
                elif key.strip() == "Device Minor":
                    minor = int(value.strip())
        except (OSError, ValueError):
            continue
        if uuid and minor is not None:
            minors[uuid] = minor
    return minors


def gpu_device_nodes(devices: list[dict]) -> list[str]:
    """The /dev nodes the placed cards need: the cards themselves plus the driver's control nodes."""
    real = [d for d in devices if not str(d.get("gpu_uuid", "")).startswith("EMU-")]
    if not real or not Path("/dev/nvidiactl").exists():
        return []
    minors = _gpu_minor_numbers()
    nodes = [f"/dev/{name}" for name in NVIDIA_CONTROL_NODES if Path(f"/dev/{name}").exists()]
    for device in real:
        minor = minors.get(device["gpu_uuid"], device.get("gpu_index"))
        if minor is not None and Path(f"/dev/nvidia{minor}").exists():
            nodes.append(f"/dev/nvidia{minor}")
    return sorted(set(nodes))


def _platform_paths() -> list[str]:
    """Everything of the platform a job must never see, hidden even under a read-only path that holds it."""
    from trainyard.paths import BASE_DIR, VAR_DIR

    paths = [
        BASE_DIR,
        VAR_DIR,
        _setting("TRAINYARD_WORK_ROOT", VAR_DIR / "work"),
        _setting("TRAINYARD_LOG_ROOT", VAR_DIR / "logs"),
        Path.home(),
    ]
    return sorted({str(Path(p).resolve()) for p in paths if str(p) not in {"", "/"}})


def _interpreter_paths() -> list[str]:
    """The interpreter the platform runs on (a venv and the Python it points to), for `python` jobs."""
    paths = []
    for prefix in {sys.prefix, sys.base_prefix}:
        real = str(Path(prefix).resolve())
        if not real.startswith(("/usr/", "/opt/")) and real != "/usr":
            paths.append(real)
    return sorted(paths)


def plan(*, job_id: str, workdir: Path, job_dirs: list[Path], devices: list[dict]) -> dict | None:
    """The sandbox of one attempt, or None when the sandbox is turned off (TRAINYARD_SANDBOX=off).

    `job_dirs` are the job's own folders (bound read-write); `workdir` is where the command starts.
    The folders are made here, owned by the job's uid and closed to everyone else.
    """
    if not enabled():
        return None
    uid = job_uid(job_id)
    for folder in job_dirs:
        folder.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(folder, uid, uid)
        folder.chmod(0o700)
    workdir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0 and workdir not in job_dirs:
        os.chown(workdir, uid, uid)
    return {
        "bwrap": str(_setting("TRAINYARD_SANDBOX_BWRAP", "bwrap")),
        "uid": uid,
        "drop_root": os.geteuid() == 0,
        "ro_paths": [*SYSTEM_RO_PATHS, *map(str, _setting("TRAINYARD_SANDBOX_RO_PATHS", []))],
        "hidden": _platform_paths(),
        "interpreter": _interpreter_paths(),
        "rw_paths": [str(p) for p in job_dirs],
        "cwd": str(workdir),
        "devices": gpu_device_nodes(devices),
    }


def service_plan(*, job_id: str, readable: list[Path]) -> dict | None:
    """A sandbox for a platform helper that reads a job's files (TensorBoard): the job's uid, only `readable`
    bound (read-only), so a symlink the job planted there leads nowhere. It shares the host's network, since it
    must listen on the platform's loopback, and outlives the worker that started it."""
    if not enabled():
        return None
    return {
        "bwrap": str(_setting("TRAINYARD_SANDBOX_BWRAP", "bwrap")),
        "uid": job_uid(job_id),
        "drop_root": os.geteuid() == 0,
        "ro_paths": [*SYSTEM_RO_PATHS, *map(str, _setting("TRAINYARD_SANDBOX_RO_PATHS", []))],
        "hidden": _platform_paths(),
        "interpreter": _interpreter_paths(),
        "readable": [str(p) for p in readable],
        "rw_paths": [],
        "cwd": "/tmp",
        "devices": [],
        "share_net": True,
        "die_with_parent": False,
    }


def _bind_system_path(path: str) -> list[str]:
    if os.path.islink(path):  # merged /usr: /bin -> usr/bin
        return ["--symlink", os.readlink(path), path]
    if os.path.exists(path):
        return ["--ro-bind", path, path]
    return []


def _open_parents(binds: list[str], sandbox: dict) -> list[str]:
    """Bubblewrap makes the folders leading to a bind mount 0700; the job's uid must be able to pass them."""
    mounts = {*sandbox["ro_paths"], *PRIVATE_TMPFS, *sandbox["hidden"], *binds}
    read_only = [p.rstrip("/") + "/" for p in sandbox["ro_paths"]]
    parents: set[str] = set()
    for path in binds:
        for parent in Path(path).parents:
            text = str(parent)
            if text != "/" and text not in mounts and not (text + "/").startswith(tuple(read_only)):
                parents.add(text)
    return [arg for parent in sorted(parents) for arg in ("--chmod", "0755", parent)]


def wrap(sandbox: dict | None, argv: list[str]) -> list[str]:
    """The command line that runs `argv` inside the sandbox (`argv` itself when there is none)."""
    if not sandbox:
        return list(argv)
    bwrap = shutil.which(sandbox["bwrap"]) or sandbox["bwrap"]
    cmd = ["/bin/sh", "-c", 'trap "" TERM; exec "$@"', "trainyard-sandbox", bwrap]
    cmd += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "trainyard-job"]
    if not sandbox.get("share_net"):
        cmd += ["--unshare-net"]
    if sandbox.get("die_with_parent", True):
        cmd += ["--die-with-parent"]
    if not sandbox["drop_root"]:
        cmd += ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY), "--disable-userns"]
    for path in sandbox["ro_paths"]:
        cmd += _bind_system_path(path)
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    for path in [*PRIVATE_TMPFS, *sandbox["hidden"]]:
        cmd += ["--perms", "1777" if path in PRIVATE_TMPFS else "0755", "--tmpfs", path]
    binds = [p for p in [*sandbox["interpreter"], *sandbox.get("readable", [])] if os.path.exists(p)]
    for path in binds:
        cmd += ["--ro-bind", path, path]
    for node in sandbox["devices"]:
        cmd += ["--dev-bind", node, node]
    for path in sandbox["rw_paths"]:
        cmd += ["--bind", path, path]
    cmd += _open_parents([*binds, *sandbox["rw_paths"]], sandbox)
    cmd += ["--chdir", sandbox["cwd"], "--"]
    if sandbox["drop_root"]:
        uid = str(sandbox["uid"])
        cmd += ["setpriv", "--reuid", uid, "--regid", uid, "--clear-groups", "--inh-caps=-all"]
        cmd += ["--bounding-set=-all", "--no-new-privs", "--"]
    return [*cmd, "env", "--default-signal", *argv]


def decode_exit(exit_code: int | None, sig: int | None) -> tuple[int | None, int | None]:
    """Bubblewrap's 128+N for a command killed by signal N, back to (no exit code, signal N)."""
    if exit_code is not None and sig is None and 128 < exit_code < 128 + signal.NSIG:
        return None, exit_code - 128
    return exit_code, sig


def preflight(bwrap: str = "bwrap") -> None:
    """Make one empty sandbox; raise SandboxUnavailable with bubblewrap's own words when that fails."""
    path = shutil.which(bwrap)
    if not path:
        raise SandboxUnavailable(
            "the job sandbox needs bubblewrap ('bwrap'), which is not installed: run "
            "'apt-get install bubblewrap' (or set TRAINYARD_SANDBOX=off on a single-user machine)"
        )
    probe = {
        "bwrap": path,
        "uid": NOBODY,
        "drop_root": os.geteuid() == 0,
        "ro_paths": list(SYSTEM_RO_PATHS),
        "hidden": [],
        "interpreter": [],
        "rw_paths": [],
        "cwd": "/",
        "devices": [],
    }
    try:
        result = subprocess.run(wrap(probe, ["true"]), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"the job sandbox could not be made: {exc}") from None
    if result.returncode != 0:
        said = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise SandboxUnavailable(f"the job sandbox could not be made here (bubblewrap said: {said})")
