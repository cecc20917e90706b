"""Where the GPU inventory comes from: NVML on a machine with NVIDIA GPUs, else a configured emulation.

`TRAINYARD_LOCAL_GPUS` describes the emulated inventory: `4x24GiB`, `2x80GiB:A100`, or a comma list of
such groups. The emulated inventory is labelled as such everywhere it is shown; nothing is invented about
it beyond what the setting says.
"""

import re
import socket
from dataclasses import dataclass, field

from django.conf import settings

_SPEC = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*(GiB|MiB|G|M)?\s*(?::\s*([\w .-]+))?\s*$", re.I)


# How a node's cards may be handed out, where its device plugin decides that (Kubernetes, `whole` sharing): a plain
# NVIDIA device plugin advertises whole cards only, a time-sliced one only the shared resource. Nodes without the
# label take both.
SHARING_LABEL = "trainyard.io/gpu-sharing"
SHARING_WHOLE = "whole"
SHARING_TIME_SLICED = "time-sliced"

# A node's pool (docs/pools.md): a node label. The inventory names it when a node first appears (the Kubernetes
# node's own label, or TRAINYARD_LOCAL_POOL); afterwards an admin's move (cluster.services.node_move) decides.
POOL_LABEL = "trainyard.io/pool"
DEFAULT_POOL = "default"


def node_pool(labels: dict) -> str:
    return str((labels or {}).get(POOL_LABEL) or DEFAULT_POOL)


@dataclass(frozen=True)
class GpuInfo:
    uuid: str
    index: int
    model: str
    memory_mib: int


@dataclass(frozen=True)
class NodeInfo:
    name: str
    emulated: bool
    driver_version: str
    cuda_version: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuInfo, ...]
    labels: dict = field(default_factory=dict)


class InventoryError(ValueError):
    pass


def parse_emulated(text: str) -> list[tuple[int, int, str]]:
    groups = []
    for part in text.split(","):
        if not part.strip():
            continue
        m = _SPEC.match(part)
        if not m:
            raise InventoryError(f"TRAINYARD_LOCAL_GPUS: cannot read '{part.strip()}' (expected e.g. 4x24GiB)")
        count, size, unit, model = int(m[1]), int(m[2]), (m[3] or "GiB").lower(), m[4] or "Emulated GPU"
        mib = size * 1024 if unit in {"gib", "g"} else size
        if count < 0 or mib <= 0:
            raise InventoryError(f"TRAINYARD_LOCAL_GPUS: '{part.strip()}' has no memory")
        groups.append((count, mib, model.strip()))
    return groups


def _host_resources() -> tuple[int, int]:
    import os

    cpus = os.cpu_count() or 1
    try:
        with open("/proc/meminfo") as f:
            total_kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    except (OSError, StopIteration, ValueError):
        total_kib = 8 * 1024 * 1024
    return cpus * 1000, total_kib // 1024


def read_nvml() -> NodeInfo | None:
    """The local node from NVML, or None when there is no NVIDIA driver here."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no library, no device: all mean "no NVML here"
        return None
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                GpuInfo(
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    index=i,
                    model=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_mib=int(mem.total // (1024 * 1024)),
                )
            )
    finally:
        pynvml.nvmlShutdown()
    cpu, memory = _host_resources()
    return NodeInfo(
        name=socket.gethostname(),
        emulated=False,
        driver_version=_text(driver),
        cuda_version=f"{cuda // 1000}.{(cuda % 1000) // 10}",
        cpu_milli=cpu,
        memory_mib=memory,
        gpus=tuple(gpus),
        labels={POOL_LABEL: settings.TRAINYARD_LOCAL_POOL},
    )


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def emulated_node(spec: str | None = None) -> NodeInfo:
    spec = spec if spec is not None else settings.TRAINYARD_LOCAL_GPUS
    name = f"{socket.gethostname()}-emulated"
    gpus = []
    for count, mib, model in parse_emulated(spec):
        for _ in range(count):
            i = len(gpus)
            gpus.append(GpuInfo(uuid=f"EMU-{name}-{i}", index=i, model=model, memory_mib=mib))
    cpu, memory = _host_resources()
    return NodeInfo(
        name=name,
        emulated=True,
        driver_version=settings.TRAINYARD_EMULATED_DRIVER,
        cuda_version=settings.TRAINYARD_EMULATED_CUDA,
        cpu_milli=cpu,
        memory_mib=memory,
        gpus=tuple(gpus),
        labels={"trainyard.io/emulated": "true", POOL_LABEL: settings.TRAINYARD_LOCAL_POOL},
    )


def local_inventory() -> NodeInfo:
    return read_nvml() or emulated_node()
