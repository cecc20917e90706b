"""Which CPUs a local attempt's processes are pinned to: those of its GPUs' NUMA node(s), as many as it asks for.

A process that feeds a GPU from the far socket pays for every copy over the socket link. For each card the attempt
holds, NVML names the CPUs close to it (`nvmlDeviceGetCpuAffinity`); where NVML cannot say, the card's PCI device
in sysfs names its NUMA node (`/sys/bus/pci/devices/<bus id>/numa_node`) and the node its CPUs
(`/sys/devices/system/node/node<N>/cpulist`). Of those CPUs (and only ones this process may use) the attempt gets
`ceil(cpu_milli / 1000)`, the least used by other live attempts first; if the near CPUs are too few it also gets the
least used others, and says so. The supervisor applies the set with `sched_setaffinity` before the command starts
(its children and the sandbox inherit it).

Where nothing is known the attempt is not pinned and `Pinning.why` says why (emulated cards, no NVML, a card NVML
no longer finds, a PCI device without a NUMA node).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kernel.sentences import stored

SYS = Path("/sys")


@dataclass(frozen=True)
class Pinning:
    cpus: tuple[int, ...] = ()  # empty: not pinned
    numa_nodes: tuple[int, ...] = ()
    source: str = ""  # nvml | sysfs | "" (not pinned)
    why: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cpus": list(self.cpus), "numa_nodes": list(self.numa_nodes)}


def parse_cpulist(text: str) -> set[int]:
    """`0-3,8,10-11` → {0, 1, 2, 3, 8, 10, 11} (the kernel's cpulist format)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def format_cpulist(cpus: Iterable[int]) -> str:
    """{0, 1, 2, 3, 8} → `0-3,8`."""
    ordered, ranges = sorted(set(cpus)), []
    for cpu in ordered:
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def _mask_cpus(words: Iterable[int]) -> set[int]:
    """NVML's CPU affinity: 64-bit words, bit i of word w is CPU 64 * w + i."""
    return {64 * w + bit for w, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1}


def _sysfs_bus_id(bus_id: Any) -> str:
    """NVML's `00000000:3B:00.0` → sysfs's `0000:3b:00.0`."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)
    domain, _, rest = text.strip().partition(":")
    return f"{int(domain, 16):04x}:{rest.lower()}"


def _node_cpus(node: int, sys_root: Path) -> set[int]:
    try:
        return parse_cpulist((sys_root / "devices" / "system" / "node" / f"node{node}" / "cpulist").read_text())
    except (OSError, ValueError):
        return set()


def _card(nvml: Any, uuid: str, sys_root: Path) -> tuple[set[int], int | None, str]:
    """(CPUs near the card, its NUMA node or None, source or the reason nothing is known)."""
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
    except Exception as exc:  # noqa: BLE001 - NVMLError or a lost card: the card cannot be asked
        return set(), None, stored("NVML does not find %(gpu)s (%(error)s)", gpu=uuid, error=exc)
    node = None
    try:
        bus = _sysfs_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId)
        value = int((sys_root / "bus" / "pci" / "devices" / bus / "numa_node").read_text().strip())
        node = value if value >= 0 else None
    except (Exception, OSError):  # noqa: BLE001 - no PCI info or no sysfs entry: the node stays unknown
        node = None
    try:
        words = nvml.nvmlDeviceGetCpuAffinity(handle, max(1, math.ceil((os.cpu_count() or 1) / 64)))
        near = _mask_cpus(words)
        if near:
            return near, node, "nvml"
    except Exception:  # noqa: BLE001, S110 - older drivers: fall back to sysfs
        pass
    if node is not None and (near := _node_cpus(node, sys_root)):
        return near, node, "sysfs"
    return set(), node, stored("neither NVML nor sysfs names the CPUs near %(gpu)s (no NUMA node)", gpu=uuid)


def plan(
    *,
    gpu_uuids: list[str],
    cpu_milli: int,
    nvml: Any = None,
    sys_root: Path = SYS,
    allowed: set[int] | None = None,
    in_use: Counter | None = None,
) -> Pinning:
    """The CPUs to pin an attempt to. `allowed`: the CPUs this process may use (its own affinity); `in_use`: how many
    live attempts are pinned to each CPU (the least used are given first)."""
    from cluster.nvml import load_nvml

    if not gpu_uuids:
        return Pinning(why=stored("not pinned: the attempt holds no GPU"))
    if any(u.startswith("EMU-") for u in gpu_uuids):
        return Pinning(why=stored("not pinned: emulated GPUs have no PCI device, so no NUMA node"))
    nvml = nvml or load_nvml()
    if nvml is None:
        return Pinning(
            why=stored("not pinned: NVML is not available on this machine, so the GPUs' NUMA node is unknown")
        )
    allowed = set(os.sched_getaffinity(0)) if allowed is None else set(allowed)
    near: set[int] = set()
    nodes, sources = set(), set()
    for uuid in gpu_uuids:
        cpus, node, source = _card(nvml, uuid, sys_root)
        if not cpus:
            return Pinning(why=stored("not pinned: %(why)s", why=source))
        near |= cpus
        sources.add(source)
        if node is not None:
            nodes.add(node)
    near &= allowed
    if not near:
        return Pinning(why=stored("not pinned: none of the CPUs near its GPUs is one the platform may use"))
    in_use = in_use or Counter()
    want = max(1, math.ceil(cpu_milli / 1000))

    def least_used(pool: set[int], n: int) -> list[int]:
        return sorted(pool, key=lambda cpu: (in_use[cpu], cpu))[:n]

    chosen = least_used(near, want)
    where = ",".join(map(str, sorted(nodes))) or "?"
    why = stored("%(n)s CPU(s) of NUMA node %(nodes)s, near its GPUs", n=len(chosen), nodes=where)
    if len(chosen) < want:
        extra = least_used(allowed - near, want - len(chosen))
        chosen += extra
        why = stored(
            "%(n)s CPU(s) of NUMA node %(nodes)s, near its GPUs, and %(extra)s farther: it asks for %(want)s",
            n=len(chosen) - len(extra), nodes=where, extra=len(extra), want=want,
        )  # fmt: skip
    source = "nvml" if "nvml" in sources else "sysfs"
    return Pinning(cpus=tuple(sorted(chosen)), numa_nodes=tuple(sorted(nodes)), source=source, why=why)


def pinned_elsewhere(root: Path, *, but: Path) -> Counter:
    """How many live local attempts (a folder with a pinning and no final status) are pinned to each CPU."""
    import json

    counts: Counter = Counter()
    for path in root.glob("*/attempt-*/pinning.json"):
        if path.parent == but or (path.parent / "status.json").exists():
            continue
        try:
            counts.update(json.loads(path.read_text()).get("cpus") or [])
        except (OSError, ValueError):
            continue
    return counts
