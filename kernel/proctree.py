"""Finding and killing every process of one local attempt, wherever it went (no Django here).

A job's processes are found two ways: as descendants of its supervisor (which is their subreaper, so a
process that calls `setsid()` or double-forks is still re-parented to it), and by the attempt's tag in their
environment (`TRAINYARD_JOB_ID` + `TRAINYARD_ATTEMPT`), which survives the supervisor's own death.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_libc = ctypes.CDLL(None, use_errno=True)


def prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def become_subreaper() -> None:
    """Orphaned descendants are re-parented to this process instead of init."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """For a preexec_fn: the kernel sends `sig` to this process when its parent dies."""
    prctl(PR_SET_PDEATHSIG, int(sig))


def _stat(pid: int) -> tuple[int, str] | None:
    """(ppid, state) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    return int(fields[1]), fields[0].decode()


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def descendants(root: int) -> set[int]:
    """Every live (non-zombie) process below `root`."""
    children: dict[int, list[int]] = {}
    for pid in _pids():
        st = _stat(pid)
        if st is not None and st[1] != "Z":
            children.setdefault(st[0], []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


SCOPE_VARIABLE = b"TRAINYARD_PLATFORM_SCOPE="


def tagged(job_id: str, attempt: int, scope: str = "") -> set[int]:
    """Every live process whose environment carries this attempt's tag. With `scope` (kernel.host.platform_scope),
    a process tagged with another platform's scope is not this attempt's, though its job and attempt numbers are;
    one with no scope at all (started before scopes were tagged) still is."""
    marks = (f"TRAINYARD_JOB_ID={job_id}\0".encode(), f"TRAINYARD_ATTEMPT={attempt}\0".encode())
    own_scope = b"\0" + SCOPE_VARIABLE + scope.encode() + b"\0"
    me = os.getpid()
    found = set()
    for pid in _pids():
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = b"\0" + f.read()
        except OSError:
            continue
        if all(b"\0" + mark in environ for mark in marks) and (
            not scope or own_scope in environ or b"\0" + SCOPE_VARIABLE not in environ
        ):
            st = _stat(pid)
            if st is not None and st[1] != "Z":
                found.add(pid)
    return found


def signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap_children() -> list[tuple[int, int]]:
    """Collect every exited child of this process without blocking: [(pid, wait status)]."""
    reaped = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, status))


def kill_until_gone(find, *, timeout: float = 30.0, on_reap=None) -> set[int]:
    """SIGKILL whatever `find()` returns until it returns nothing (or `timeout`); returns what is left.

    Repeated because a process may fork between the scan and the signal; a killed process cannot fork again.
    """
    deadline = time.monotonic() + timeout
    while True:
        left = find()
        if not left or time.monotonic() >= deadline:
            return left
        signal_all(left, signal.SIGKILL)
        time.sleep(0.02)
        for pid, status in reap_children():
            if on_reap is not None:
                on_reap(pid, status)
