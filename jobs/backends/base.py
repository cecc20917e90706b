"""The one interface every execution backend implements, and the plain data it takes and returns.

Backends never see model instances: the lifecycle engine builds an `AttemptDescription` from the job and
its placement, and reads back `Observation`s.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol

from kernel.sentences import stored


@dataclass(frozen=True)
class Device:
    gpu_uuid: str
    gpu_index: int
    node: str
    compute_milli: int
    memory_mib: int
    exclusive: bool


@dataclass(frozen=True)
class AttemptDescription:
    job_id: str
    attempt_id: int
    attempt_number: int
    name: str
    owner: str
    team: str
    namespace: str
    queue: str
    volcano_queue: str
    image: str
    command: list[str]
    args: list[str]
    env: dict[str, str]
    working_dir: str
    replicas: int
    gpu_count: int
    exclusive: bool
    cpu_milli: int
    memory_mib: int
    timeout_s: int
    priority: int
    min_driver_version: str
    tensorboard: bool
    tensorboard_logdir: str
    devices: list[Device] = field(default_factory=list)
    mounts: list[dict] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    gang: bool = False
    secondary_network: str = ""
    outbound_network: bool = False  # the queue lets the job open connections to other machines
    # GPU product label values (GPU Feature Discovery's `nvidia.com/gpu.product`) a job pinned to GPU models
    # may land on; empty when the job accepts any model.
    gpu_products: list[str] = field(default_factory=list)
    # Checkpoints (jobs/checkpoints.py): {"prefix": object key prefix, "restore": the checkpoint to start from}.
    checkpoint: dict = field(default_factory=dict)
    # A preemptible job's notice: seconds between SIGTERM and SIGKILL when it must yield (0: not preemptible).
    preempt_notice_s: int = 0
    # Admission class (docs/pools.md): inference, training or preemptible; Kubernetes gets its PriorityClass.
    priority_class: str = ""
    mig_profile: str = ""  # each card is a MIG instance of this profile (nvidia.com/mig-<profile> on Kubernetes)
    # Registered datasets (jobs/datasets.py), as resolved at submission: id, team, name, version, path, kind,
    # prefix (S3) or claim (PVC), size_bytes, file_count. Always mounted read-only.
    datasets: list[dict] = field(default_factory=list)
    code: dict = field(default_factory=dict)  # {"team", "digest"}: the code snapshot the work dir starts as
    runtime_class: str = ""  # the queue's Kubernetes RuntimeClass (a sandboxed runtime: kata, gvisor); "" = default
    # The dedicated pools (TRAINYARD_DEDICATED_POOLS) the queue is bound to: its pods tolerate their nodes' taint.
    dedicated_pools: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> AttemptDescription:
        data = dict(data)
        data["devices"] = [Device(**d) for d in data.get("devices", [])]
        return cls(**data)


# The backend could not read (or write) what it needs to tell an attempt's state, for this attempt alone: the
# lifecycle records it and, once it persists past TRAINYARD_OBSERVE_FAILING_S, fences and fails the attempt.
UNOBSERVABLE = "unobservable"
# The reason of a local attempt that failed or was stopped with its work or checkpoint filesystem full.
DISK_FULL = "DiskFull"


@dataclass(frozen=True)
class Observation:
    """What the backend sees of one attempt now."""

    phase: str  # pending | running | succeeded | failed | lost | unobservable (UNOBSERVABLE)
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    message: str = ""
    node: str = ""
    cancelled: bool = False
    started_at: float | None = None  # when the job's own process began (epoch seconds), where the backend knows it
    ended_at: float | None = None  # the process's own end time (epoch seconds), where the backend knows it
    log_lines_lost: int = 0  # lines the log store could not keep (unwritable or full)
    log_error: str = ""
    # The cards the device plugin really gave the attempt, by node (GPU UUIDs), where the backend can read them
    # back and they may differ from the placement; empty when unknown.
    assigned_gpus: dict[str, tuple[str, ...]] = field(default_factory=dict)
    checkpoints: dict | None = None  # the attempt's checkpoint upload manifest, where the backend syncs them
    # The job's work or checkpoint filesystem ran full ({"path", "free_bytes", "total_bytes", "since"}), when seen.
    disk_full: dict | None = None

    @property
    def finished(self) -> bool:
        return self.phase in {"succeeded", "failed", "lost"}


class Backend(Protocol):
    name: str

    def submit(self, desc: AttemptDescription) -> str:
        """Start the attempt; returns its backend reference. Submitting the same attempt twice is a no-op."""

    def observe(self, refs: list[str]) -> dict[str, Observation]:
        """Observe many attempts at once; a ref the backend does not know maps to phase `lost`. `lost` is only
        reported once every process of the attempt is known dead (fencing: a retry never overlaps it)."""

    def cancel(self, ref: str, *, grace_s: float, reason: str = "") -> None:
        """Ask the attempt to stop (SIGTERM, then SIGKILL after the grace period). `reason`, when given, is the
        reason its observation reports once it has stopped (the classifier's `reason_pattern` sees it)."""

    def cleanup(self, ref: str) -> None:
        """Remove what the backend keeps for a finished attempt (idempotent)."""

    def live_refs(self) -> set[str]:
        """Every attempt the backend runs now (for the pool's reconcile pass)."""

    def log_tail(self, ref: str, *, max_bytes: int = 65536) -> str:
        """The end of the attempt's log, for the failure classifier."""


def disk_full_message(seen: dict) -> str:
    """The job page's words for a full work or checkpoint filesystem, from what the supervisor saw."""
    mib = 1 << 20
    return stored(
        "its disk is full: %(free)s MiB free of %(total)s MiB on the filesystem of %(path)s",
        free=f"{int(seen.get('free_bytes') or 0) / mib:.1f}",
        total=f"{int(seen.get('total_bytes') or 0) / mib:.1f}",
        path=str(seen.get("path", "?")),
    )
