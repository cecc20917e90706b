"""Where the GPU inventory comes from: NVML on a machine with NVIDIA GPUs, else a configured emulation.

`TRAINYARD_LOCAL_GPUS` describes the emulated inventory: `4x24GiB`, `2x80GiB:A100`, or a comma list of
such groups. A group of cards in MIG mode lists each card's instances:
`1x80GiB:A100[mig=3g.40gb+2g.20gb+1g.10gb]`; then the card itself is no device, each instance is one
(docs/pools.md). The emulated inventory is labelled as such everywhere it is shown; nothing is invented about
it beyond what the setting says. The platform never changes a card's MIG mode: it reads what is there.
"""

import re
import socket
from dataclasses import dataclass, field

from django.conf import settings

from cluster.topology import nvlink_labels

_SPEC = re.compile(
    r"^\s*(\d+)\s*x\s*(\d+)\s*(GiB|MiB|G|M)?\s*(?::\s*([\w .-]+?))?\s*(?:\[\s*mig\s*=\s*([\w.+ ]+)\])?\s*$", re.I
)
# A MIG profile: compute slices (of 7) and memory, as NVIDIA names them (`1g.10gb`, `3g.40gb`, `7g.80gb`).
MIG_PROFILE = re.compile(r"^([1-7])g\.(\d+)gb\Z")
MIG_SLICES = 7


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
# An idle node of a lending pool lent to a borrowing pool: preemptible jobs placed in that pool may use it.
LENT_LABEL = "trainyard.io/lent-to"


def node_pool(labels: dict) -> str:
    return str((labels or {}).get(POOL_LABEL) or DEFAULT_POOL)


@dataclass(frozen=True)
class GpuInfo:
    uuid: str
    index: int
    model: str
    memory_mib: int
    mig_profile: str = ""  # a MIG instance: its profile; the card it is carved from is `mig_parent`
    mig_parent: str = ""


def mig_profile(text: str) -> tuple[int, int]:
    """(compute slices of 7, memory MiB) of a MIG profile name; InventoryError for anything else."""
    m = MIG_PROFILE.match(text.strip().lower())
    if not m:
        raise InventoryError(f"'{text}' is not a MIG profile (expected e.g. 1g.10gb or 3g.40gb)")
    return int(m[1]), int(m[2]) * 1024


def mig_model(model: str, profile: str) -> str:
    """The model an instance is shown and matched as: the card's model and the profile."""
    return f"{model} MIG {profile}"


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


def parse_emulated(text: str) -> list[tuple[int, int, str, tuple[str, ...]]]:
    """Groups of (cards, memory MiB per card, model, MIG profiles each card is split into: empty = no MIG)."""
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
        profiles: tuple[str, ...] = ()
        if m[5]:
            profiles = tuple(p.strip().lower() for p in m[5].split("+") if p.strip())
            try:
                sizes = [mig_profile(p) for p in profiles]
            except InventoryError as exc:
                raise InventoryError(f"TRAINYARD_LOCAL_GPUS: {exc}") from None
            if not profiles or sum(g for g, _ in sizes) > MIG_SLICES or sum(m for _, m in sizes) > mib:
                raise InventoryError(
                    f"TRAINYARD_LOCAL_GPUS: '{part.strip()}': the MIG instances need more than one card has "
                    f"({MIG_SLICES} compute slices, {mib // 1024} GiB)"
                )
        groups.append((count, mib, model.strip(), profiles))
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
        whole = []  # (device index, handle) of the cards not in MIG mode, for their NVLink domains
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            instances = _mig_instances(pynvml, handle, first_index=len(gpus))
            if instances is not None:
                gpus.extend(instances)  # a card in MIG mode: its instances are the devices
                continue
            whole.append((len(gpus), handle))
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                GpuInfo(
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    index=len(gpus),
                    model=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_mib=int(mem.total // (1024 * 1024)),
                )
            )
        nvlink = nvlink_labels(pynvml, whole)
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
        labels={POOL_LABEL: settings.TRAINYARD_LOCAL_POOL, **nvlink},
    )


def _mig_instances(pynvml, handle, *, first_index: int) -> list[GpuInfo] | None:
    """The MIG instances of a card whose MIG mode is on (as the admin left it: never changed here), or None."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except Exception:  # noqa: BLE001 - a card or driver without MIG support
        return None
    if current != getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return None
    parent = _text(pynvml.nvmlDeviceGetUUID(handle))
    model = _text(pynvml.nvmlDeviceGetName(handle))
    out: list[GpuInfo] = []
    for k in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, k)
        except Exception:  # noqa: BLE001 - an empty slot
            continue
        name = _text(pynvml.nvmlDeviceGetName(mig))  # e.g. "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
        profile = name.rsplit(" ", 1)[-1].lower()
        if not MIG_PROFILE.match(profile):
            continue  # a profile with media extensions (+me) or a name this driver spells otherwise
        out.append(
            GpuInfo(
                uuid=_text(pynvml.nvmlDeviceGetUUID(mig)),
                index=first_index + len(out),
                model=mig_model(model, profile),
                memory_mib=int(pynvml.nvmlDeviceGetMemoryInfo(mig).total // (1024 * 1024)),
                mig_profile=profile,
                mig_parent=parent,
            )
        )
    return out


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def emulated_node(spec: str | None = None) -> NodeInfo:
    spec = spec if spec is not None else settings.TRAINYARD_LOCAL_GPUS
    name = f"{socket.gethostname()}-emulated"
    gpus: list[GpuInfo] = []
    card = 0
    for count, mib, model, profiles in parse_emulated(spec):
        for _ in range(count):
            parent = f"EMU-{name}-{card}"
            card += 1
            if not profiles:
                gpus.append(GpuInfo(uuid=parent, index=len(gpus), model=model, memory_mib=mib))
            for k, profile in enumerate(profiles):
                gpus.append(
                    GpuInfo(
                        uuid=f"EMU-MIG-{name}-{card - 1}-{k}",
                        index=len(gpus),
                        model=mig_model(model, profile),
                        memory_mib=mig_profile(profile)[1],
                        mig_profile=profile,
                        mig_parent=parent,
                    )
                )
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
