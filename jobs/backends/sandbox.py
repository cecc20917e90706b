"""The sandbox a local attempt runs in (bubblewrap), so a job touches nothing but its own work.

The local backend asks `plan()` for a JSON-able description of one attempt's sandbox and stores it in the
attempt's spec; the supervisor (which has no Django settings) turns it into the command line with `wrap()`.
What the job gets:

- its own unprivileged uid: when the platform runs as root, a per-job uid from
  `TRAINYARD_SANDBOX_UID_BASE` (bubblewrap sets up the mounts, then `setpriv` drops to that uid with no
  capabilities); otherwise an unprivileged user namespace where the job is uid 65534;
- its own PID, IPC, UTS and network namespaces, and it dies with its supervisor. By default no network at
  all: the platform's PostgreSQL, Redis and internal ports are unreachable. A queue that allows outbound
  network (`Queue.outbound_network`) gets a user-mode network stack (slirp4netns) attached to the job's own
  namespace: connections out to other machines work, the host's loopback (where the platform's services
  listen) stays unreachable, and nothing can connect in;
- a read-only view of the host's system folders (`/usr`, `/etc`, `/opt`, the interpreter the platform
  runs on, `TRAINYARD_SANDBOX_RO_PATHS`), never the platform's project tree, `var/`, work or log roots,
  the platform user's home, `/run` (sockets) or other jobs' folders (covered with empty tmpfs even if a
  read-only path would include them);
- its own work and TensorBoard folders read-write, its own `/tmp`, `/var/tmp` and `/dev/shm`, a minimal
  `/dev`, and the device nodes of the GPUs it was placed on (where NVIDIA devices exist).

- in root mode, a seccomp filter (kernel/seccomp.py, loaded by bubblewrap's `--seccomp`): no user namespaces,
  no kernel keyring, bpf, io_uring, perf or mounting; unprivileged, bubblewrap's `--disable-userns` instead;
- its memory, processes and CPU held to what it asked for by the supervisor (kernel/limits.py: a cgroup where
  the platform may make one, rlimits otherwise).

The supervisor stops a job with SIGTERM to its process group, then SIGKILL: bubblewrap itself would die
on SIGTERM and take the job down at once, so it is started with SIGTERM ignored and the job's command is
started with every signal back at its default (`env --default-signal`). Bubblewrap reports a command
killed by signal N as exit code 128+N; `decode_exit()` turns that back into the signal.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from kernel import seccomp
from kernel.netns import slirp_resolv_conf

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
    from kernel.paths import BASE_DIR, VAR_DIR

    paths = [
        BASE_DIR,
        VAR_DIR,
        _setting("TRAINYARD_WORK_ROOT", VAR_DIR / "work"),
        _setting("TRAINYARD_STATE_ROOT", VAR_DIR / "attempts"),
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


def network_tool() -> str:
    """The slirp4netns a queue with outbound network needs; SandboxUnavailable, saying what to do, without it."""
    name = str(_setting("TRAINYARD_SANDBOX_SLIRP4NETNS", "slirp4netns"))
    path = shutil.which(name)
    if not path:
        raise SandboxUnavailable(
            "this queue allows outbound network, which needs slirp4netns: run 'apt-get install slirp4netns' "
            "(or turn the queue's outbound network off)"
        )
    return path


def plan(
    *, job_id: str, workdir: Path, job_dirs: list[Path], devices: list[dict], outbound: bool = False, folder=None
) -> dict | None:
    """The sandbox of one attempt, or None when the sandbox is turned off (TRAINYARD_SANDBOX=off).

    `job_dirs` are the job's own folders (bound read-write); `workdir` is where the command starts.
    The folders are made here, owned by the job's uid and closed to everyone else. `outbound`: the queue lets
    the job open connections to other machines (`folder` is the attempt's, for a resolv.conf if one is needed).
    """
    if not enabled():
        return None
    network = None
    if outbound:
        network = {"slirp4netns": network_tool(), "resolv_conf": slirp_resolv_conf(Path(folder or workdir))}
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
        "network": network,
        # Root mode: the job is a plain uid of the host's user namespace, so the filter is what keeps it from
        # making one of its own (unprivileged, bubblewrap's --disable-userns does).
        "seccomp": os.geteuid() == 0 and seccomp_supported(),
    }


def seccomp_supported() -> bool:
    """Whether kernel/seccomp.py has a filter for this machine (root-mode sandboxes get it)."""
    try:
        seccomp.program()
    except seccomp.SeccompUnsupported:
        return False
    return True


def seccomp_fd(sandbox: dict | None) -> int | None:
    """A pipe holding the job's seccomp filter, for `wrap(..., seccomp_fd=)` and the child's pass_fds (bubblewrap
    reads it to the end); None when the sandbox has no filter. The caller closes it once the child has started."""
    if not sandbox or not sandbox.get("seccomp"):
        return None
    data = seccomp.program()
    read_end, write_end = os.pipe()
    os.write(write_end, data)  # a few hundred bytes: far below a pipe's buffer
    os.close(write_end)
    return read_end


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


def wrap(
    sandbox: dict | None,
    argv: list[str],
    *,
    info_fd: int | None = None,
    block_fd: int | None = None,
    seccomp_fd: int | None = None,
) -> list[str]:
    """The command line that runs `argv` inside the sandbox (`argv` itself when there is none). With outbound
    network, bubblewrap reports the job's pid on `info_fd` and waits on `block_fd` until `attach_network` has
    given the namespace its interface. A sandbox with a seccomp filter needs `seccomp_fd` (see `seccomp_fd()`)."""
    if not sandbox:
        return list(argv)
    if sandbox.get("seccomp") and seccomp_fd is None:
        raise ValueError("a sandbox with a seccomp filter needs seccomp_fd (see seccomp_fd())")
    bwrap = shutil.which(sandbox["bwrap"]) or sandbox["bwrap"]
    cmd = ["/bin/sh", "-c", 'trap "" TERM; exec "$@"', "trainyard-sandbox", bwrap]
    cmd += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "trainyard-job"]
    if not sandbox.get("share_net"):
        cmd += ["--unshare-net"]
    if sandbox.get("die_with_parent", True):
        cmd += ["--die-with-parent"]
    if sandbox.get("network"):
        if info_fd is None or block_fd is None:
            raise ValueError("a sandbox with outbound network needs info_fd and block_fd (see attach_network)")
        cmd += ["--info-fd", str(info_fd), "--block-fd", str(block_fd)]
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
    # Registered datasets: the node's cached copy, read-only at the path the job asked for.
    datasets = [(src, dest) for src, dest in sandbox.get("datasets", [])]
    for src, dest in datasets:
        cmd += ["--ro-bind", src, dest]
    resolv = (sandbox.get("network") or {}).get("resolv_conf")
    if resolv:
        cmd += ["--ro-bind", resolv, "/etc/resolv.conf"]
    cmd += _open_parents([*binds, *sandbox["rw_paths"], *(dest for _, dest in datasets)], sandbox)
    if sandbox.get("seccomp"):
        cmd += ["--seccomp", str(seccomp_fd)]
    cmd += ["--chdir", sandbox["cwd"], "--"]
    if sandbox["drop_root"]:
        uid = str(sandbox["uid"])
        cmd += ["setpriv", "--reuid", uid, "--regid", uid, "--clear-groups", "--inh-caps=-all"]
        cmd += ["--bounding-set=-all", "--no-new-privs", "--"]
    return [*cmd, "env", "--default-signal", *argv]


def _read_info(fd: int, timeout: float) -> dict:
    """Bubblewrap's JSON about the sandbox it made (the job's pid among it), from its info fd."""
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 4096)
        data += chunk
        try:
            return json.loads(data)
        except ValueError:
            if not chunk:
                break
    raise SandboxUnavailable(f"bubblewrap did not report the sandbox it made ({data[:200]!r})")


def attach_network(sandbox: dict, info_r: int, block_w: int, *, log: Path, timeout: float = 10.0) -> subprocess.Popen:
    """Give a sandbox made with `wrap(..., info_fd, block_fd)` its outbound network, then let the job start.

    slirp4netns joins the job's network namespace (and user namespace, when the platform is not root), makes a
    tap device with the address 10.0.2.100 and a default route through a user-mode stack, and never lets
    the job reach the host's loopback. It lives until the returned process is stopped or the supervisor's end of
    its exit pipe closes; what it says goes to `log`. Raises SandboxUnavailable (the job is not started) when
    any step fails."""
    info = _read_info(info_r, timeout)
    pid = int(info["child-pid"])
    # Bubblewrap brings the namespace's loopback up after it reports; configuring alongside it races.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if "127.0.0.1" in Path(f"/proc/{pid}/net/fib_trie").read_text():
                break
        except OSError:
            pass
        time.sleep(0.005)
    ready_r, ready_w = os.pipe()
    exit_r, exit_w = os.pipe()
    cmd = [sandbox["network"]["slirp4netns"], "--configure", "--mtu=65520", "--disable-host-loopback"]
    if not sandbox["drop_root"]:
        cmd.append(f"--userns-path=/proc/{pid}/ns/user")
    cmd += ["--ready-fd", str(ready_w), "--exit-fd", str(exit_r), str(pid), "tap0"]
    try:
        with open(log, "ab") as out:
            slirp = subprocess.Popen(
                cmd,
                pass_fds=(ready_w, exit_r),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    finally:
        os.close(ready_w)
        os.close(exit_r)
    slirp.exit_w = exit_w  # closing it stops slirp4netns
    ready, _, _ = select.select([ready_r], [], [], timeout)
    ok = bool(ready) and os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    if not ok:
        detach_network(slirp)
        said = (log.read_text(errors="replace").strip().splitlines() or ["no message"])[-1]
        raise SandboxUnavailable(f"the job's network could not be made (slirp4netns said: {said})")
    os.write(block_w, b"1")
    return slirp


def detach_network(slirp: subprocess.Popen | None) -> None:
    """Stop a job's network stack (after the job has ended)."""
    if slirp is None:
        return
    try:
        os.close(slirp.exit_w)
    except OSError:
        pass
    try:
        slirp.wait(timeout=5)
    except subprocess.TimeoutExpired:
        slirp.kill()
        slirp.wait()


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
        "seccomp": os.geteuid() == 0 and seccomp_supported(),
    }
    fd = seccomp_fd(probe)
    try:
        result = subprocess.run(
            wrap(probe, ["true"], seccomp_fd=fd),
            capture_output=True,
            text=True,
            timeout=30,
            pass_fds=(fd,) if fd is not None else (),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"the job sandbox could not be made: {exc}") from None
    finally:
        if fd is not None:
            os.close(fd)
    if result.returncode != 0:
        said = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise SandboxUnavailable(f"the job sandbox could not be made here (bubblewrap said: {said})")
