"""Memory, process and CPU limits for one local attempt: what it asked for, no more (no Django here).

The supervisor of an attempt puts the job's whole process tree into a control group of its own before the
command starts, with the job's memory (`memory_mib`) as a hard limit (swap included), a process limit and its
CPU (`cpu_milli`) as a quota per period. Which mechanism holds depends on what the machine lets the platform do:

- `cgroup2`: the unified hierarchy with the memory, pids and cpu controllers available. Attempts get leaves under
  one parent (TRAINYARD_CGROUP_PARENT, or `trainyard-jobs` beside the platform's own cgroup, since a cgroup v2
  node that holds processes cannot hand controllers down): memory.max, memory.swap.max 0, pids.max, cpu.max;
  memory.peak and memory.events' oom_kill tell what happened.
- `cgroup1`: the legacy per-controller hierarchies (memory, pids, cpu) writable by the platform: a child of the
  platform's own cgroup in each (memory.limit_in_bytes and memsw, pids.max, cpu.cfs_quota_us);
  memory.max_usage_in_bytes is the peak and memory.oom_control's oom_kill the kills.
- `rlimit`: no control group can be made here. Each process of the job gets RLIMIT_DATA (its private writable
  memory, so a big allocation fails with ENOMEM instead of an out-of-memory kill) and, when the platform is root
  (each job its own uid), RLIMIT_NPROC for the job's uid. CPU is not limited in this mode.

Where a control group cannot be made at the start of an attempt (the folder is gone, a write refused), the
attempt falls back to `rlimit` and says so in its log.
"""

from __future__ import annotations

import errno
import os
import resource
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "cpu")
V2_CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
MODES = ("cgroup2", "cgroup1", "rlimit")


def _own_cgroups() -> dict[str, str]:
    """controller (or "" for the unified hierarchy) -> this process's cgroup path in it."""
    own: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return own
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    return own


def _mounts() -> dict[str, Path]:
    """controller (or "" for cgroup2) -> where its hierarchy is mounted (the first mount of each)."""
    found: dict[str, Path] = {}
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, extra = left.split(), right.split()
        if len(fields) < 5 or len(extra) < 3:
            continue
        root, point, fstype = fields[3], Path(fields[4]), extra[0]
        if root != "/":
            continue  # a bind of a sub-tree: paths in /proc/self/cgroup would not match it
        if fstype == "cgroup2":
            found.setdefault("", point)
        elif fstype == "cgroup":
            for option in extra[2].split(","):
                if option in V1_CONTROLLERS:
                    found.setdefault(option, point)
    return found


def v2_parent(setting: str = "") -> Path | None:
    """The folder attempts' cgroup v2 leaves go under, or None when there is no cgroup2 hierarchy."""
    if setting:
        return Path(setting)
    mount = _mounts().get("")
    own = _own_cgroups().get("")
    if mount is None or own is None or own == "/":
        return None  # the platform sits at the top of what it can see: there is no sibling to make
    relative = own.strip("/")
    return mount / (relative.rsplit("/", 1)[0] if "/" in relative else "") / "trainyard-jobs"


def _v2_usable(parent: Path) -> bool:
    """The parent has (or, once made, will have) the controllers to hand down, and we may write there."""
    offered_by = parent / "cgroup.controllers" if parent.exists() else parent.parent / "cgroup.subtree_control"
    try:
        offered = set(offered_by.read_text().split())
    except OSError:
        return False
    return set(V2_CONTROLLERS) <= offered and os.access(offered_by.parent, os.W_OK)


def _v1_folders(name: str) -> dict[str, Path] | None:
    """controller -> this attempt's cgroup v1 folder, or None when a controller's hierarchy is missing."""
    mounts, own = _mounts(), _own_cgroups()
    folders = {}
    for controller in V1_CONTROLLERS:
        if controller not in mounts or controller not in own:
            return None
        folders[controller] = mounts[controller] / own[controller].strip("/") / "trainyard" / name
    return folders


def detect(setting: str = "auto", *, v2_parent_setting: str = "") -> str:
    """The mode limits take on this machine: `setting` when it names one, else the best the machine allows."""
    if setting in MODES:
        return setting
    if os.geteuid() == 0 or os.access(CGROUP_ROOT, os.W_OK):
        parent = v2_parent(v2_parent_setting)
        if parent is not None and _v2_usable(parent):
            return "cgroup2"
        folders = _v1_folders("probe")
        if folders and all(os.access(f.parent.parent, os.W_OK) for f in folders.values()):
            return "cgroup1"
    return "rlimit"


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_keyed(path: Path) -> dict[str, int]:
    try:
        pairs = [line.split() for line in path.read_text().splitlines()]
    except OSError:
        return {}
    return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].lstrip("-").isdigit()}


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class AttemptLimits:
    """One attempt's limits: `apply()` before the command starts, `join()` in the command's child before exec,
    `outcome()` after it ends, `remove()` once every process of it is gone."""

    def __init__(self, plan: dict, *, name: str):
        self.plan = plan
        # The platform's scope first: another platform on this host has an attempt or a build of the same number.
        self.name = f"{plan['scope']}-{name}" if plan.get("scope") else name
        self.mode = plan.get("mode", "rlimit")
        self.memory = int(plan.get("memory_bytes") or 0)
        self.pids = int(plan.get("pids_max") or 0)
        self.cpu_milli = int(plan.get("cpu_milli") or 0)
        self.folders: list[Path] = []  # the cgroup folders the job joins (one for v2, one per controller for v1)
        self.v1: dict[str, Path] = {}
        self.fallback = ""  # why a control group could not be made (then rlimit)

    # ------------------------------------------------------------------ set up
    def apply(self) -> None:
        try:
            if self.mode == "cgroup2":
                self._apply_v2()
            elif self.mode == "cgroup1":
                self._apply_v1()
        except OSError as exc:
            self.fallback = f"{self.mode} could not be made ({type(exc).__name__}: {exc})"[:300]
            self.remove()
            self.mode = "rlimit"

    def _apply_v2(self) -> None:
        parent = v2_parent(self.plan.get("v2_parent", ""))
        if parent is None:
            raise OSError("no cgroup2 hierarchy with a parent to make")
        parent.mkdir(exist_ok=True)
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
        missing = [c for c in V2_CONTROLLERS if c not in enabled]
        if missing:
            _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
        leaf = parent / self.name
        self._fresh(leaf)
        self.folders = [leaf]
        if self.memory:
            _write(leaf / "memory.max", str(self.memory))
            if (leaf / "memory.swap.max").exists():
                _write(leaf / "memory.swap.max", "0")
            _write(leaf / "memory.oom.group", "1")  # one kill takes the whole job: no half-dead process tree
        if self.pids:
            _write(leaf / "pids.max", str(self.pids))
        if self.cpu_milli:
            _write(leaf / "cpu.max", f"{self._quota_us()} {CPU_PERIOD_US}")

    def _apply_v1(self) -> None:
        folders = _v1_folders(self.name)
        if folders is None:
            raise OSError("a cgroup v1 hierarchy (memory, pids or cpu) is not mounted")
        for folder in folders.values():
            self._fresh(folder)
            self.folders.append(folder)
        self.v1 = folders
        memory, pids, cpu = folders["memory"], folders["pids"], folders["cpu"]
        if self.memory:
            _write(memory / "memory.limit_in_bytes", str(self.memory))
            if (memory / "memory.memsw.limit_in_bytes").exists():  # swap counted too (the limit must come first)
                _write(memory / "memory.memsw.limit_in_bytes", str(self.memory))
        if self.pids:
            _write(pids / "pids.max", str(self.pids))
        if self.cpu_milli:
            _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(self._quota_us()))

    def _quota_us(self) -> int:
        return max(1000, self.cpu_milli * CPU_PERIOD_US // 1000)

    @staticmethod
    def _fresh(folder: Path) -> None:
        """A leftover of an earlier supervisor of this attempt (killed before it could remove it) is reused empty."""
        for _ in range(3):  # another attempt's supervisor may remove the shared parent folder in between
            folder.parent.mkdir(parents=True, exist_ok=True)
            try:
                folder.mkdir()
                return
            except FileNotFoundError:
                continue
            except FileExistsError:
                break
        else:
            raise OSError(f"{folder.parent} kept disappearing")
        if (folder / "cgroup.procs").read_text().strip():
            raise OSError(f"{folder} still holds processes of an earlier supervisor")

    def join(self) -> None:
        """In the command's child, before exec (a preexec_fn): every process it starts inherits what is set here."""
        for folder in self.folders:
            _write(folder / "cgroup.procs", "0")
        if self.mode == "rlimit":
            if self.memory:
                resource.setrlimit(resource.RLIMIT_DATA, (self.memory, self.memory))
            if self.pids and self.plan.get("own_uid"):
                resource.setrlimit(resource.RLIMIT_NPROC, (self.pids, self.pids))

    # ------------------------------------------------------------------ read back
    def describe(self) -> str:
        """One line: what holds the attempt and how."""
        parts = []
        if self.memory:
            parts.append(f"memory {self.memory >> 20} MiB")
        if self.pids and (self.mode != "rlimit" or self.plan.get("own_uid")):
            parts.append(f"{self.pids} processes")
        if self.cpu_milli and self.mode != "rlimit":
            parts.append(f"CPU {self.cpu_milli / 1000:g}")
        held = ", ".join(parts) or "none"
        if self.mode == "rlimit":
            unheld = "CPU not limited" + ("" if self.plan.get("own_uid") else ", nor processes")
            held += f" per process (rlimit; {unheld})"
        else:
            held += f" ({self.mode})"
        return f"limits: {held}" + (f"; {self.fallback}" if self.fallback else "")

    def outcome(self) -> dict:
        """What the limits saw: the mode, peak memory (bytes, where known), out-of-memory kills, refused forks."""
        result: dict = {"mode": self.mode, "memory_limit_bytes": self.memory or None, "pids_max": self.pids or None,
                        "cpu_milli": self.cpu_milli or None, "memory_peak_bytes": None, "oom_kills": 0,
                        "forks_refused": 0}  # fmt: skip
        if self.fallback:
            result["fallback"] = self.fallback
        if self.mode == "cgroup2" and self.folders:
            leaf = self.folders[0]
            result["memory_peak_bytes"] = _read_int(leaf / "memory.peak")
            result["oom_kills"] = _read_keyed(leaf / "memory.events").get("oom_kill", 0)
            result["forks_refused"] = _read_keyed(leaf / "pids.events").get("max", 0)
        elif self.mode == "cgroup1" and self.v1:
            memory, pids = self.v1["memory"], self.v1["pids"]
            result["memory_peak_bytes"] = _read_int(memory / "memory.max_usage_in_bytes")
            result["oom_kills"] = _read_keyed(memory / "memory.oom_control").get("oom_kill", 0)
            result["forks_refused"] = _read_keyed(pids / "pids.events").get("max", 0)
        return result

    # ------------------------------------------------------------------ tear down
    def kill_all(self, timeout: float = 10.0) -> int:
        """SIGKILL every process in the group (cgroup.kill on v2; on v1 what cgroup.procs lists, again until it is
        empty, since a fork may slip in between a read and the kills). How many were signalled."""
        import signal

        if not self.folders:
            return 0
        folder = self.folders[0]
        if self.mode == "cgroup2" and (folder / "cgroup.kill").exists():
            count = len((folder / "cgroup.procs").read_text().split())
            _write(folder / "cgroup.kill", "1")
            return count
        killed = 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
            except OSError:
                return killed
            if not pids:
                return killed
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except (ProcessLookupError, PermissionError):  # gone, or (EPERM) not ours to signal: tried again
                    pass
            time.sleep(0.05)
        return killed

    def remove(self, timeout: float = 5.0) -> None:
        """Remove the attempt's cgroups (after its processes are gone; a v2 leaf still populated is killed first)."""
        deadline = time.monotonic() + timeout
        for folder in self.folders:
            if self.mode == "cgroup2" and (folder / "cgroup.kill").exists():
                try:
                    if _read_keyed(folder / "cgroup.events").get("populated"):
                        _write(folder / "cgroup.kill", "1")
                except OSError:
                    pass
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break  # left for the next supervisor of this attempt (it reuses an empty one)
                    time.sleep(0.05)
            if self.mode == "cgroup1":
                try:
                    folder.parent.rmdir()  # the shared `trainyard` folder, once no attempt uses it
                except OSError:
                    pass
        self.folders = []
        self.v1 = {}


RMDIR_TRIES, RMDIR_PAUSE_S = 30, 0.1


def remove_folders(folders: list[str]) -> None:
    """Remove an attempt's cgroup folders its supervisor left (it was killed); only paths under the cgroup mounts,
    and only empty ones (rmdir refuses a cgroup that still holds processes)."""
    for text in folders:
        path = Path(text)
        if not path.is_relative_to(CGROUP_ROOT) or ".." in path.parts:
            continue
        # A process killed a moment ago still counts in its cgroup until the kernel has finished its exit: on a busy
        # machine that is tens of milliseconds, and nobody would try again once the attempt is reported lost.
        for _ in range(RMDIR_TRIES):
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    break
                time.sleep(RMDIR_PAUSE_S)
        try:
            if path.parent.name == "trainyard":
                path.parent.rmdir()  # cgroup v1's shared folder, once no attempt uses it
        except OSError:
            pass


def plan(*, memory_mib: int, cpu_milli: int, pids_max: int, setting: str = "auto", v2_parent_setting: str = "",
         own_uid: bool = False, scope: str = "") -> dict | None:  # fmt: skip
    """The limits of one attempt, JSON-able for the supervisor; None when limits are turned off. `scope`
    (kernel.host.platform_scope) goes in front of the control group's name."""
    if setting == "off":
        return None
    return {
        "mode": detect(setting, v2_parent_setting=v2_parent_setting),
        "memory_bytes": int(memory_mib) << 20 if memory_mib else 0,
        "cpu_milli": int(cpu_milli or 0),
        "pids_max": int(pids_max or 0),
        "v2_parent": v2_parent_setting,
        "own_uid": own_uid,
        "scope": scope,
    }
