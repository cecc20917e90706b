"""Who listens on a loopback port: the proof a proxy needs before it forwards to a process it started (no Django).

A port number alone proves nothing: once the process the platform started there dies, any local user may bind
the same port and be served under the platform's origin. `held_by_tree()` answers whether every socket that
listens on the port is held open by the process tree the platform started (its root pid, started at a known
time, so a reused pid does not pass either). It reads the kernel's own tables: /proc/net/tcp{,6} give the
listening sockets' inodes, /proc/<pid>/fd of the tree's processes the sockets they hold.
"""

from __future__ import annotations

import os
from pathlib import Path

from kernel.proctree import descendants

TCP_LISTEN = "0A"
# Local addresses (as /proc/net/tcp{,6} print them) whose listener takes a connection to 127.0.0.1: loopback,
# the IPv4 wildcard, the IPv6 wildcard (dual stack) and IPv4-mapped loopback.
TAKES_LOOPBACK = {"0100007F", "00000000", "0" * 32, "0000000000000000FFFF00000100007F"}


def listening_inodes(port: int) -> set[int]:
    """Inodes of every TCP socket in this network namespace that would take a connection to 127.0.0.1:`port`."""
    found: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != TCP_LISTEN:
                continue
            address, _, hex_port = fields[1].rpartition(":")
            if int(hex_port, 16) == port and address.upper() in TAKES_LOOPBACK:
                found.add(int(fields[9]))
    return found


def _socket_inodes(pid: int) -> set[int]:
    held: set[int] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return held
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            held.add(int(target[8:-1]))
    return held


def start_time(pid: int) -> float | None:
    """When a process started (epoch seconds), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        ticks = int(data[data.rfind(b")") + 2 :].split()[19])
        boot = next(
            float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def held_by_tree(port: int, root: int, *, started_after: float | None = None, slack_s: float = 60.0) -> bool:
    """True when something listens on `port` and every listening socket there is held by `root` or a descendant of
    it; with `started_after` (epoch seconds), `root` must also have started within `slack_s` of it (a pid reused
    by another process later fails)."""
    listening = listening_inodes(port)
    if not listening or not root:
        return False
    if started_after is not None:
        began = start_time(root)
        if began is None or not (started_after - 2.0 <= began <= started_after + slack_s):
            return False
    held: set[int] = set()
    for pid in {root, *descendants(root)}:
        held |= _socket_inodes(pid)
    return listening <= held
