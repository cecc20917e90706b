"""Pure rendering of the Kubernetes objects the Volcano backend writes: no API calls, no Django.

One attempt becomes one `batch.volcano.sh/v1alpha1` Job with a deterministic name (`ty-<job id>-<attempt>`),
so that submitting the same attempt twice can only ever create one object. A platform queue becomes one
cluster-scoped `scheduling.volcano.sh/v1beta1` Queue whose capability is the platform's hard quota. A job
with TensorBoard on gets a Service and an Ingress (one host per job under a base domain).

GPU requests are rendered by sharing provider:

- `whole`: the NVIDIA device plugin; whole cards as `nvidia.com/gpu`, a share of a card as one unit of the
  time-sliced resource (`nvidia.com/gpu.shared` by default, the plugin's `renameByDefault` name);
- `volcano-vgpu`: `volcano.sh/vgpu-number`, `volcano.sh/vgpu-memory` (MiB), `volcano.sh/vgpu-cores` (%);
- `hami` is refused (`RenderOptions` raises, and the `jobs` system check reports it at startup): HAMi's own
  scheduler path cannot run inside a Volcano Job. HAMi's webhook skips pods that name another scheduler,
  Volcano's scheduler does not know `nvidia.com/gpumem`/`gpucores`, and Volcano's enqueue gate counts them as
  cluster resources no node advertises, so the job never leaves Pending. Under Volcano, HAMi's documented
  path is the volcano-vgpu device plugin (HAMi-core), which `volcano-vgpu` renders.

Queues are rendered for the Volcano release the cluster runs (`volcano_version`): `spec.priority` exists from
1.10, `spec.dequeueStrategy` from 1.14; older releases get neither (a real API server would drop them).

The platform decides placement and retries; Volcano only gang-schedules: pods are pinned to the placed
nodes, never restart in place, and the Volcano job never retries on its own.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.utils import parse_quantity

from cluster.inventory import POOL_LABEL
from jobs.backends.base import AttemptDescription, Device
from jobs.backends.dataset_cache import FILL_CANNOT_SUCCEED_EXIT

JSON = dict[str, Any]

JOB_API = ("batch.volcano.sh", "v1alpha1", "jobs")
QUEUE_API = ("scheduling.volcano.sh", "v1beta1", "queues")
PODGROUP_API = ("scheduling.volcano.sh", "v1beta1", "podgroups")
COMMAND_API = ("bus.volcano.sh", "v1alpha1", "commands")

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "trainyard"
LABEL_JOB = "trainyard.io/job-id"
LABEL_ATTEMPT = "trainyard.io/attempt"
LABEL_ATTEMPT_ID = "trainyard.io/attempt-id"
LABEL_TEAM = "trainyard.io/team"
LABEL_QUEUE = "trainyard.io/queue"
LABEL_TENSORBOARD = "trainyard.io/tensorboard"
LABEL_RANK = "trainyard.io/rank"
ANNOTATION_NAME = "trainyard.io/job-name"
ANNOTATION_OWNER = "trainyard.io/owner"
ANNOTATION_USER_LABELS = "trainyard.io/labels"
ANNOTATION_IMAGE_PINNED = "trainyard.io/image-pinned"
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
VGPU_PIN_ANNOTATION = "volcano.sh/vgpu-use-gpuuuid"

# GPU Feature Discovery labels of the node's driver version.
DRIVER_LABELS = (
    "nvidia.com/cuda.driver-version.major",
    "nvidia.com/cuda.driver-version.minor",
    "nvidia.com/cuda.driver-version.revision",
)

# Older GPU Feature Discovery releases (before 0.15) label the driver as `nvidia.com/cuda.driver.*`.
LEGACY_DRIVER_LABELS = (
    "nvidia.com/cuda.driver.major",
    "nvidia.com/cuda.driver.minor",
    "nvidia.com/cuda.driver.rev",
)

SHARING_PROVIDERS = ("whole", "volcano-vgpu")
VOLCANO_SCHEDULER = "volcano"
HAMI_REFUSED = (
    "TRAINYARD_K8S_SHARING=hami cannot work with the Volcano backend: HAMi's webhook skips pods that Volcano "
    "schedules, Volcano's scheduler does not know nvidia.com/gpumem or nvidia.com/gpucores, and Volcano's enqueue "
    "counts them as resources no node advertises, so jobs would never start. HAMi's documented way to share cards "
    "under Volcano is the volcano-vgpu device plugin: set TRAINYARD_K8S_SHARING=volcano-vgpu"
)
# The oldest Volcano release the platform supports, and the first release whose Queue CRD has each optional
# spec field the platform sets.
MIN_VOLCANO_VERSION = (1, 9)
QUEUE_FIELD_SINCE = {"priority": (1, 10), "dequeueStrategy": (1, 14)}
# Volcano deletes a finished job this long after it ends at the soonest: the platform must still see the job
# finished (and copy its last logs) before it is gone, or a success would read as a lost job.
MIN_TTL_S = 300
MAIN_CONTAINER = "trainer"
TENSORBOARD_PORT = 6006
PYTORCH_PORT = 23456
SCRATCH_DIR = "/tmp"
DEFAULT_TB_DIR = "/trainyard/tensorboard"
CHECKPOINT_DIR = "/trainyard/checkpoints"
SYNC_STATE_DIR = "/trainyard/sync"
DATASET_CACHE_DIR = "/trainyard/datasets"
SHARED_DATASET_DIR = "/trainyard/dataset-cache"  # where a pod's dataset waiter sees each shared cache volume
LABEL_COMPONENT = "app.kubernetes.io/component"
DATASET_FILL_COMPONENT = "dataset-fill"
LABEL_DATASET = "trainyard.io/dataset-id"
# On a Volcano job: the S3 datasets (JSON) whose shared cache volumes its pods wait for (the observer checks
# their fill Jobs, and starts a fill Job again should it be gone).
ANNOTATION_DATASET_FILLS = "trainyard.io/dataset-fills"
DATASET_FILL_BACKOFF = 2  # a fill Job's own retries (a store that blinked); then it has failed
DATASET_FILL_TTL_S = 24 * 3600  # a finished fill Job is removed after this; a later job's submit makes it again
CHECKPOINT_SIDECAR = "checkpoint-sync"
CODE_FETCHER = "code"  # the init container that lays the code snapshot out (jobs/backends/code_fetch.py)
CODE_DIR = "/workspace"  # the trainer's working directory when the job brings code
TERMINATION_LOG = "/dev/termination-log"
# The trainer runs under ty-exec (jobs/backends/tyexec): an init container of the platform's image copies it into
# an emptyDir, and each line the command writes to stderr reaches the pod log behind STDERR_TAG, which the log
# collector strips and files as stderr (the pod log the kubelet serves merges the two streams).
TY_EXEC = "ty-exec"
TY_EXEC_RESOURCES = {"cpu": "100m", "memory": "64Mi"}  # one copy of a 2 MiB file
TY_EXEC_DIR = "/.trainyard-exec"
STDERR_TAG = "\x1f\x02"
# Cards the inventory had to name itself (the node publishes no UUIDs) cannot be pinned by UUID.
SYNTHETIC_UUID_PREFIX = "K8S-"


# The PriorityClass of each admission class (k8s/priority-classes.yaml): the platform admits in this order and
# preempts borrowers itself; the classes keep the same order on the cluster (and a borrower never preempts).
PRIORITY_CLASS_NAMES = {
    "inference": "trainyard-inference",
    "training": "trainyard-training",
    "preemptible": "trainyard-preemptible",
}


class ManifestError(ValueError):
    """The attempt cannot be expressed as a Kubernetes object (a bad mount, an unknown provider)."""


@dataclass(frozen=True)
class RenderOptions:
    """Cluster-wide choices that shape every manifest (from settings; see `VolcanoBackend.from_settings`)."""

    sharing: str = "whole"
    ttl_s: int = 3600
    priority_class: str = ""
    grace_s: int = 30
    run_as_uid: int = 1000
    service_account: str = ""
    image_pull_secrets: tuple[str, ...] = ()
    shared_resource: str = "nvidia.com/gpu.shared"
    tensorboard_image: str = "docker.io/tensorflow/tensorflow:2.16.1"
    rack_labels: tuple[str, ...] = ("trainyard.io/rack", "topology.kubernetes.io/rack")
    deadline_slack_s: int = 600
    gpu_toleration: bool = True
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    volcano_version: tuple[int, int] = MIN_VOLCANO_VERSION
    # The platform's own image: it runs the checkpoint sidecar and the dataset fetchers (the same code as the
    # local supervisor's). The object store they reach: its URL, bucket and region here, the keys from a Secret
    # in the team's namespace (`s3_secret`, keys TRAINYARD_S3_ACCESS_KEY_ID / TRAINYARD_S3_SECRET_ACCESS_KEY).
    # No `s3_url`: no sidecar, checkpoints stay in the pod; S3 datasets are refused.
    platform_image: str = "trainyard:0.1.0"
    s3_url: str = ""
    s3_bucket: str = "trainyard"
    s3_region: str = "us-east-1"
    s3_secret: str = "trainyard-s3"
    checkpoint_sync_s: float = 30.0
    checkpoint_final_wait_s: float = 300.0
    # A storage class offering ReadWriteMany: each S3 dataset version is fetched once, by one Job, into a claim of
    # its own that every job pod mounts read-only (see `render_dataset_claim`). Empty: each pod fetches its own.
    dataset_cache_storage_class: str = ""
    dataset_fill_timeout_s: int = 6 * 3600
    # The container runtime's default AppArmor profile on every pod (TRAINYARD_K8S_APPARMOR): the pod's
    # `securityContext.appArmorProfile` from Kubernetes 1.30, the per-container annotation before.
    apparmor: bool = True
    kubernetes_version: tuple[int, int] = (1, 29)
    # The trainer's command under ty-exec, so that its stderr is kept apart (TRAINYARD_K8S_STDERR_WRAPPER; off for
    # clusters that admit no extra init container or exec from an emptyDir: the pod log is then all stdout).
    stderr_wrapper: bool = True

    def __post_init__(self) -> None:
        if self.sharing == "hami":
            raise ManifestError(HAMI_REFUSED)
        if self.sharing not in SHARING_PROVIDERS:
            raise ManifestError(
                f"unknown GPU sharing provider '{self.sharing}' (TRAINYARD_K8S_SHARING must be one of "
                f"{', '.join(SHARING_PROVIDERS)})"
            )
        if int(self.ttl_s) < MIN_TTL_S:
            raise ManifestError(
                f"TRAINYARD_K8S_TTL_S={self.ttl_s} is too short: Volcano would delete a finished job before the "
                f"platform reads its outcome (at least {MIN_TTL_S} s)"
            )
        if self.dataset_cache_storage_class and not _CLAIM_NAME.match(self.dataset_cache_storage_class):
            raise ManifestError(
                f"TRAINYARD_DATASET_CACHE_STORAGE_CLASS='{self.dataset_cache_storage_class}' is not a storage "
                "class name"
            )
        if int(self.dataset_fill_timeout_s) < 60:
            raise ManifestError(
                f"TRAINYARD_DATASET_FILL_TIMEOUT_S={self.dataset_fill_timeout_s} is too short (at least 60 s)"
            )
        if tuple(self.volcano_version) < MIN_VOLCANO_VERSION:
            raise ManifestError(
                f"Volcano {format_version(self.volcano_version)} is not supported "
                f"(TRAINYARD_VOLCANO_VERSION must be {format_version(MIN_VOLCANO_VERSION)} or newer)"
            )


def parse_version(text: str) -> tuple[int, int]:
    """`1.9`, `v1.12.0`, `1.14.0-rc.1` → (major, minor); ManifestError for anything else."""
    match = re.match(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$", (text or "").strip())
    if not match:
        raise ManifestError(f"'{text}' is not a Volcano version (TRAINYARD_VOLCANO_VERSION wants e.g. 1.9 or 1.14.0)")
    return int(match[1]), int(match[2])


def format_version(version: Sequence[int]) -> str:
    return ".".join(str(v) for v in version)


# ------------------------------------------------------------------------------------------------ names


def job_name(job_id: str, attempt_number: int) -> str:
    """`ty-<job uuid hex>-<attempt>`: a DNS-1035 label, short enough for `<name>-worker-<index>` pod names."""
    return f"ty-{job_id.replace('-', '').lower()}-{attempt_number}"


def tensorboard_name(job_id: str) -> str:
    return f"tb-{job_id.replace('-', '').lower()}"


def tensorboard_host(job_id: str, base_domain: str) -> str:
    if not base_domain:
        raise ManifestError("TRAINYARD_TB_BASE_DOMAIN is not set: TensorBoard needs a domain for its hosts")
    return f"{tensorboard_name(job_id)}.{base_domain.strip('.').lower()}"


def _quantity_mib(mib: int) -> str:
    return f"{int(mib)}Mi"


def _quantity_milli(milli: int) -> str:
    return f"{int(milli)}m"


# ------------------------------------------------------------------------------------------------ job


def render_job(
    desc: AttemptDescription, options: RenderOptions, *, node_labels: Mapping[str, Mapping[str, str]] | None = None
) -> JSON:
    """The Volcano Job of one attempt. `node_labels` (node name → labels) lets multi-node jobs stay in a rack."""
    name = job_name(desc.job_id, desc.attempt_number)
    distributed = desc.replicas > 1
    labels = _labels(desc, options)
    annotations = {
        ANNOTATION_NAME: desc.name,
        ANNOTATION_OWNER: desc.owner,
        ANNOTATION_IMAGE_PINNED: "true" if "@sha256:" in desc.image else "false",
    }
    if desc.labels:
        annotations[ANNOTATION_USER_LABELS] = json.dumps(desc.labels, sort_keys=True)
    volumes, mounts = _volumes(desc)
    if distributed:
        # One task per replica, each pinned to the node (and cards) the platform placed that replica on: one
        # `worker` task of N-1 replicas would share one template, and Volcano could stack several workers on
        # one of the placed nodes. Volcano's pytorch plugin knows a single worker task, so the ranks and the
        # rendezvous are set here (the svc plugin still gives each pod its DNS name).
        groups = _devices_by_replica(desc)
        master_addr = f"{name}-master-0.{name}"
        tasks = [
            _task(
                "master" if rank == 0 else f"worker-{rank}",
                1,
                desc,
                options,
                labels,
                annotations,
                groups[rank : rank + 1],
                volumes,
                mounts,
                node_labels,
                tensorboard=desc.tensorboard and rank == 0,
                policies=[{"event": "TaskCompleted", "action": "CompleteJob"}] if rank == 0 else None,
                rank=rank,
                master_addr=master_addr,
            )
            for rank in range(desc.replicas)
        ]
        plugins = {
            "env": [],
            # The svc plugin's NetworkPolicy admits only the job's own pods: it would shut out the ingress
            # controller in front of TensorBoard (and the platform's probes). Team namespaces carry their own.
            "svc": ["--disable-network-policy"],
        }
    else:
        tasks = [
            _task(
                "main",
                1,
                desc,
                options,
                labels,
                annotations,
                _devices_by_replica(desc),
                volumes,
                mounts,
                node_labels,
                tensorboard=desc.tensorboard,
            )
        ]
        plugins = {}
    spec: JSON = {
        "schedulerName": VOLCANO_SCHEDULER,
        # Borrowed work rides in the queue without a capability: its platform queue's capability is the quota it
        # runs beyond.
        "queue": BORROWED_QUEUE if desc.priority_class == "preemptible" else desc.volcano_queue,
        "minAvailable": desc.replicas,
        # Volcano's admission webhook rewrites a maxRetry of 0 to 3 (0 reads as "unset"). It only bounds Restart*
        # actions, which no policy here names: whatever maxRetry ends up as, Volcano never restarts the job.
        "maxRetry": 0,
        "ttlSecondsAfterFinished": int(options.ttl_s),
        # A pod that fails or is evicted ends the Volcano job: retrying is the platform's decision, and
        # a gang with a dead member would otherwise run on (or be refilled by the controller).
        "policies": [
            {"event": "PodFailed", "action": "TerminateJob"},
            {"event": "PodEvicted", "action": "TerminateJob"},
        ],
        "tasks": tasks,
    }
    for task in tasks:
        if desc.exclusive:
            _guaranteed_qos(task["template"]["spec"])
        _apparmor(task["template"], options)
        if desc.runtime_class:
            task["template"]["spec"]["runtimeClassName"] = desc.runtime_class
    if plugins:
        spec["plugins"] = plugins
    priority_class = PRIORITY_CLASS_NAMES.get(desc.priority_class) or options.priority_class
    if priority_class:
        spec["priorityClassName"] = priority_class
    job_annotations = dict(annotations)
    fills = shared_datasets(desc, options)
    if fills:
        job_annotations[ANNOTATION_DATASET_FILLS] = json.dumps(fills, sort_keys=True)
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": desc.namespace, "labels": labels, "annotations": job_annotations},
        "spec": spec,
    }


def _labels(desc: AttemptDescription, options: RenderOptions) -> dict[str, str]:
    return {
        **{k: v for k, v in options.extra_labels.items()},
        MANAGED_BY: MANAGER,
        LABEL_JOB: desc.job_id,
        LABEL_ATTEMPT: str(desc.attempt_number),
        LABEL_ATTEMPT_ID: str(desc.attempt_id),
        LABEL_TEAM: desc.team,
        LABEL_QUEUE: desc.queue,
    }


def _devices_by_replica(desc: AttemptDescription) -> list[list[Device]]:
    """The placed devices split per replica, in replica order (the pool places them that way)."""
    per = desc.gpu_count if desc.exclusive else 1
    devices = list(desc.devices)
    if not devices:
        return [[] for _ in range(desc.replicas)]
    return [devices[i * per : (i + 1) * per] for i in range(desc.replicas)]


def _task(
    task_name: str,
    replicas: int,
    desc: AttemptDescription,
    options: RenderOptions,
    labels: dict[str, str],
    annotations: dict[str, str],
    device_groups: Sequence[list[Device]],
    volumes: list[JSON],
    mounts: list[JSON],
    node_labels: Mapping[str, Mapping[str, str]] | None,
    *,
    tensorboard: bool,
    policies: list[JSON] | None = None,
    rank: int | None = None,
    master_addr: str = "",
) -> JSON:
    devices = [d for group in device_groups for d in group]
    pod_labels = dict(labels)
    if tensorboard:
        pod_labels[LABEL_TENSORBOARD] = "true"
    if rank is not None:
        pod_labels[LABEL_RANK] = str(rank)
    pod_annotations = dict(annotations)
    if desc.secondary_network:
        pod_annotations[NETWORKS_ANNOTATION] = desc.secondary_network
    pinned = [d.gpu_uuid for d in devices if not d.gpu_uuid.startswith(SYNTHETIC_UUID_PREFIX)]
    if pinned and options.sharing == "volcano-vgpu":
        pod_annotations[VGPU_PIN_ANNOTATION] = ",".join(sorted(set(pinned)))
    pod_volumes = list(volumes)
    container_mounts = list(mounts)
    init_containers: list[JSON] = []
    tb_dir = desc.tensorboard_logdir or DEFAULT_TB_DIR
    if not tb_dir.startswith("/"):  # relative to the job's folder, like working_dir
        tb_dir = posixpath.join("/workspace", tb_dir)
    if desc.tensorboard and not any(_under(tb_dir, m["mountPath"]) for m in mounts):
        pod_volumes.append({"name": "tensorboard", "emptyDir": {}})
        container_mounts.append({"name": "tensorboard", "mountPath": tb_dir})
    if tensorboard:
        init_containers.append(_tensorboard_sidecar(tb_dir, options, container_mounts))
    env_extra: dict[str, str] = {}
    if desc.checkpoint.get("prefix") and options.s3_url:
        # The checkpoint folder, shared with a native sidecar that uploads it (and restores into it first).
        pod_volumes += [{"name": "checkpoints", "emptyDir": {}}, {"name": "checkpoint-sync", "emptyDir": {}}]
        container_mounts.append({"name": "checkpoints", "mountPath": CHECKPOINT_DIR})
        init_containers.append(_checkpoint_sidecar(desc, options))
        env_extra["TRAINYARD_CHECKPOINT_DIR"] = CHECKPOINT_DIR
        restore = desc.checkpoint.get("restore")
        if restore:
            env_extra["TRAINYARD_RESUME_FROM"] = posixpath.join(CHECKPOINT_DIR, restore["name"])
    fetchers, dataset_mounts = _datasets(desc, options, pod_volumes)
    init_containers += fetchers
    container_mounts += dataset_mounts
    if desc.code:
        # Before every other container: the trainer's working directory starts as a copy of the snapshot.
        init_containers.insert(0, _code_fetcher(desc, options, pod_volumes, container_mounts))
    command = list(desc.command)
    if options.stderr_wrapper and command:  # no command: the image's entrypoint, which the pod cannot name
        init_containers.append(_ty_exec_installer(options, pod_volumes, container_mounts))
        command = [posixpath.join(TY_EXEC_DIR, TY_EXEC), "--", *command]
    container: JSON = {
        "name": MAIN_CONTAINER,
        "image": desc.image,
        "imagePullPolicy": "IfNotPresent" if "@sha256:" in desc.image else "Always",
        "command": command,
        "env": _env(desc, devices, tb_dir, rank=rank, master_addr=master_addr, extra=env_extra),
        "resources": _resources(desc, devices, options),
        # Writable: images write to their own paths (caches, /workspace); the sidecar below is read-only.
        "securityContext": _container_security(read_only_root=False),
        "volumeMounts": container_mounts,
    }
    if rank is not None:
        container["ports"] = [{"name": "rendezvous", "containerPort": PYTORCH_PORT, "protocol": "TCP"}]
    if desc.args:
        container["args"] = list(desc.args)
    if desc.working_dir:
        container["workingDir"] = (
            desc.working_dir if desc.working_dir.startswith("/") else posixpath.join("/workspace", desc.working_dir)
        )
    elif desc.code:
        container["workingDir"] = CODE_DIR
    spec: JSON = {
        "restartPolicy": "Never",
        "schedulerName": VOLCANO_SCHEDULER,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        # A preemptible job's notice is its grace: the time it has to save a checkpoint once told to yield.
        "terminationGracePeriodSeconds": max(1, int(desc.preempt_notice_s or options.grace_s)),
        # A backstop should the platform be unreachable when the job's wall-clock limit passes.
        "activeDeadlineSeconds": int(desc.timeout_s) + int(options.deadline_slack_s),
        "securityContext": _pod_security(options),
        "containers": [container],
        "volumes": pod_volumes,
    }
    if init_containers:
        spec["initContainers"] = init_containers
    if options.service_account:
        spec["serviceAccountName"] = options.service_account
    if options.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in options.image_pull_secrets]
    tolerations: list[JSON] = []
    if options.gpu_toleration:
        tolerations.append({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    for name in desc.dedicated_pools:  # the taint that keeps every other queue's pods off a dedicated pool's nodes
        tolerations.append({"key": POOL_LABEL, "operator": "Equal", "value": name, "effect": "NoSchedule"})
    if tolerations:
        spec["tolerations"] = tolerations
    affinity = _node_affinity(desc, devices, node_labels, options)
    if affinity:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": affinity}}
    task: JSON = {
        "name": task_name,
        "replicas": replicas,
        "minAvailable": replicas,
        "maxRetry": 0,
        "template": {"metadata": {"labels": pod_labels, "annotations": pod_annotations}, "spec": spec},
    }
    if policies:
        task["policies"] = policies
    return task


def _under(path: str, mount_path: str) -> bool:
    path, mount_path = posixpath.normpath(path), posixpath.normpath(mount_path)
    return path == mount_path or path.startswith(mount_path.rstrip("/") + "/")


def _env(
    desc: AttemptDescription,
    devices: list[Device],
    tb_dir: str,
    *,
    rank: int | None = None,
    master_addr: str = "",
    extra: Mapping[str, str] | None = None,
) -> list[JSON]:
    env = {
        "HOME": SCRATCH_DIR,
        **desc.env,
        "PYTHONUNBUFFERED": "1",
        "TRAINYARD_JOB_ID": desc.job_id,
        "TRAINYARD_ATTEMPT": str(desc.attempt_number),
        "TRAINYARD_REPLICAS": str(desc.replicas),
        "TRAINYARD_TENSORBOARD_LOGDIR": tb_dir,
        **(extra or {}),
    }
    if desc.preempt_notice_s:
        env["TRAINYARD_PREEMPT_NOTICE"] = str(desc.preempt_notice_s)
    if rank is not None:  # torch.distributed's env:// rendezvous, as Volcano's pytorch plugin would set it
        env.update(
            MASTER_ADDR=master_addr, MASTER_PORT=str(PYTORCH_PORT), WORLD_SIZE=str(desc.replicas), RANK=str(rank)
        )
    if devices:
        env["TRAINYARD_GPU_UUIDS"] = ",".join(d.gpu_uuid for d in devices)
    if devices and not desc.exclusive:
        # The HAMi-core convention, as the local backend sets it; enforced where HAMi-core is in the image.
        env["CUDA_DEVICE_MEMORY_LIMIT"] = f"{devices[0].memory_mib}m"
        env["CUDA_DEVICE_SM_LIMIT"] = str(max(1, devices[0].compute_milli // 10))
    return [{"name": k, "value": v} for k, v in env.items()]


def _gpu_resources(desc: AttemptDescription, devices: list[Device], options: RenderOptions) -> dict[str, str]:
    if desc.gpu_count < 1:
        return {}
    if desc.mig_profile:
        # The device plugin's mixed strategy advertises each MIG profile as a resource of its own.
        return {f"nvidia.com/mig-{desc.mig_profile}": str(desc.gpu_count)}
    if desc.exclusive:
        count = desc.gpu_count
        if options.sharing == "whole":
            return {"nvidia.com/gpu": str(count)}
        memory = max((d.memory_mib for d in devices), default=0)
        resources = {"volcano.sh/vgpu-number": str(count), "volcano.sh/vgpu-cores": "100"}
        if memory:
            resources["volcano.sh/vgpu-memory"] = str(memory)
        return resources
    if not devices:
        raise ManifestError("a share of a GPU needs its placed slice (compute and memory) to be rendered")
    share = devices[0]
    cores = str(max(1, min(100, share.compute_milli // 10)))
    if options.sharing == "whole":
        return {options.shared_resource: "1"}
    return {
        "volcano.sh/vgpu-number": "1",
        "volcano.sh/vgpu-memory": str(share.memory_mib),
        "volcano.sh/vgpu-cores": cores,
    }


def _resources(desc: AttemptDescription, devices: list[Device], options: RenderOptions) -> JSON:
    # Per replica: requests equal limits (Guaranteed QoS: the last to be evicted under node pressure).
    amounts = {
        "cpu": _quantity_milli(desc.cpu_milli),
        "memory": _quantity_mib(desc.memory_mib),
        **_gpu_resources(desc, devices[: max(desc.gpu_count, 1)], options),
    }
    return {"requests": dict(amounts), "limits": dict(amounts)}


# A guaranteed job's pods are of the Guaranteed QoS class, and its trainer asks for whole cores: the kubelet's static
# CPU manager then gives it cores of its own, and the single-numa-node topology manager puts them on its GPUs' NUMA
# node (docs/kubernetes.md). Every container of such a pod (init containers too) has requests equal to limits; the
# platform's own ones this much each.
GUARANTEED_HELPER = {"cpu": "200m", "memory": "512Mi"}


def _guaranteed_qos(pod: JSON) -> None:
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        if container["name"] == MAIN_CONTAINER:
            cores = -(-int(parse_quantity(container["resources"]["requests"]["cpu"]) * 1000) // 1000)
            for side in ("requests", "limits"):
                container["resources"][side]["cpu"] = _quantity_milli(cores * 1000)
        else:
            container["resources"] = {"requests": dict(GUARANTEED_HELPER), "limits": dict(GUARANTEED_HELPER)}


APPARMOR_FIELD_SINCE = (1, 30)
# Volcano's Job CRD embeds a pod template schema of the Kubernetes it was built with: 1.9's has no appArmorProfile,
# so the API server would drop the field from a Volcano job (1.12's has it).
APPARMOR_FIELD_SINCE_VOLCANO = (1, 12)
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def _apparmor(template: JSON, options: RenderOptions, *, volcano: bool = True) -> None:
    """The runtime's default AppArmor profile for every container of a pod template, as the cluster's releases
    spell it (a field from Kubernetes 1.30 under Volcano 1.12, where the annotation is deprecated; the annotation
    before). `volcano`: whether the template sits in a Volcano job (else a batch Job's, which only Kubernetes reads)."""
    if not options.apparmor:
        return
    spec = template["spec"]
    field_kept = not volcano or tuple(options.volcano_version) >= APPARMOR_FIELD_SINCE_VOLCANO
    if tuple(options.kubernetes_version) >= APPARMOR_FIELD_SINCE and field_kept:
        spec["securityContext"]["appArmorProfile"] = {"type": "RuntimeDefault"}
        return
    annotations = template.setdefault("metadata", {}).setdefault("annotations", {})
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        annotations[APPARMOR_ANNOTATION + container["name"]] = "runtime/default"


def _pod_security(options: RenderOptions) -> JSON:
    """Every pod the platform makes runs as its unprivileged user under the runtime's seccomp profile (the
    restricted Pod Security Standard of the team namespaces)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": options.run_as_uid,
        "runAsGroup": options.run_as_uid,
        "fsGroup": options.run_as_uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security(*, read_only_root: bool) -> JSON:
    return {
        "runAsNonRoot": True,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": bool(read_only_root),
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _tensorboard_sidecar(tb_dir: str, options: RenderOptions, mounts: list[JSON]) -> JSON:
    # A native sidecar (init container that keeps running): it ends with the trainer, never holds the pod open.
    return {
        "name": "tensorboard",
        "image": options.tensorboard_image,
        "restartPolicy": "Always",
        "command": ["tensorboard", "--logdir", tb_dir, "--host", "0.0.0.0", "--port", str(TENSORBOARD_PORT)],
        "ports": [{"name": "tensorboard", "containerPort": TENSORBOARD_PORT, "protocol": "TCP"}],
        "env": [{"name": "HOME", "value": SCRATCH_DIR}],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "securityContext": _container_security(read_only_root=True),
        "volumeMounts": [{**m, "readOnly": True} if m["mountPath"] != SCRATCH_DIR else m for m in mounts],
    }


def _store_env(options: RenderOptions) -> list[JSON]:
    """Where the platform's code in the pod finds the object store; the keys come from the team's Secret."""
    env: list[JSON] = [
        {"name": "TRAINYARD_S3_URL", "value": options.s3_url},
        {"name": "TRAINYARD_S3_BUCKET", "value": options.s3_bucket},
        {"name": "TRAINYARD_S3_REGION", "value": options.s3_region},
        {"name": "HOME", "value": SCRATCH_DIR},
    ]
    for key in ("TRAINYARD_S3_ACCESS_KEY_ID", "TRAINYARD_S3_SECRET_ACCESS_KEY"):
        env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": options.s3_secret, "key": key}}})
    return env


def _platform_container(
    name: str, options: RenderOptions, command: list[str], env: list[JSON], *, store: bool = True
) -> JSON:
    """A container of the platform's own code; `store`: it reaches the object store (and gets the keys)."""
    return {
        "name": name,
        "image": options.platform_image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": [*env, *(_store_env(options) if store else [{"name": "HOME", "value": SCRATCH_DIR}])],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "securityContext": _container_security(read_only_root=True),
        # A failure says why here (`<reason>: <message>`), where the platform's observer reads it; should the
        # file be empty, the end of the container's log stands in.
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def _code_fetcher(desc: AttemptDescription, options: RenderOptions, volumes: list[JSON], mounts: list[JSON]) -> JSON:
    """The job's code snapshot (jobs/code.py), fetched from the object store by an init container of the platform's
    own code (`python -m jobs.backends.code_fetch`: digest checked, unpacked with tarfile's data filter) into an
    emptyDir that the trainer mounts, writable, as /workspace, its working directory."""
    if not options.s3_url:
        raise ManifestError("the job's code snapshot is in the object store, and TRAINYARD_S3_URL is not set")
    if any(_under(m["mountPath"], CODE_DIR) or _under(CODE_DIR, m["mountPath"]) for m in mounts):
        raise ManifestError(f"a mount at or around {CODE_DIR} would hide the job's code")
    volumes.append({"name": "code", "emptyDir": {}})
    mounts.append({"name": "code", "mountPath": CODE_DIR})
    spec = {"key": desc.code["key"], "digest": desc.code["digest"]}
    fetcher = _platform_container(
        CODE_FETCHER,
        options,
        ["python", "-m", "jobs.backends.code_fetch", "--into", CODE_DIR, "--termination-log", TERMINATION_LOG],
        [{"name": "TRAINYARD_CODE", "value": json.dumps(spec, sort_keys=True)}],
    )
    fetcher["volumeMounts"] = [{"name": "code", "mountPath": CODE_DIR}, {"name": "scratch", "mountPath": SCRATCH_DIR}]
    return fetcher


def _ty_exec_installer(options: RenderOptions, volumes: list[JSON], mounts: list[JSON]) -> JSON:
    """An init container of the platform's image that copies ty-exec (a static binary) into an emptyDir the trainer
    mounts read-only; the trainer's command then starts with it."""
    if any(_under(m["mountPath"], TY_EXEC_DIR) or _under(TY_EXEC_DIR, m["mountPath"]) for m in mounts):
        raise ManifestError(f"a mount at or around {TY_EXEC_DIR} would hide the platform's stderr wrapper")
    volumes.append({"name": TY_EXEC, "emptyDir": {"sizeLimit": "64Mi"}})
    mounts.append({"name": TY_EXEC, "mountPath": TY_EXEC_DIR, "readOnly": True})
    installer = _platform_container(TY_EXEC, options, [TY_EXEC, "--copy-to", TY_EXEC_DIR], [], store=False)
    installer["volumeMounts"] = [{"name": TY_EXEC, "mountPath": TY_EXEC_DIR}]
    # Requests equal to limits: in every pod, it must not move the pod out of the Guaranteed QoS class its trainer
    # asks for (a pod is Guaranteed only while each of its containers, init containers too, is).
    installer["resources"] = {"requests": dict(TY_EXEC_RESOURCES), "limits": dict(TY_EXEC_RESOURCES)}
    return installer


def _checkpoint_sidecar(desc: AttemptDescription, options: RenderOptions) -> JSON:
    """The checkpoint uploader as a native sidecar (an init container that keeps running): the local supervisor's
    own code (`python -m jobs.backends.checkpoint_sync`). It restores the checkpoint to resume from before it
    reports started (so before the trainer starts), uploads while the job runs, and makes the final sync when
    the pod ends (SIGTERM), within the pod's grace period."""
    final_wait = max(1.0, min(float(options.checkpoint_final_wait_s), float(options.grace_s) - 5.0))
    conf = {
        "dir": CHECKPOINT_DIR,
        "prefix": desc.checkpoint["prefix"],
        "restore": desc.checkpoint.get("restore"),
        "sync_s": float(options.checkpoint_sync_s),
        "final_wait_s": final_wait,
    }
    container = _platform_container(
        CHECKPOINT_SIDECAR,
        options,
        ["python", "-m", "jobs.backends.checkpoint_sync", "--state", SYNC_STATE_DIR,
         "--termination-log", TERMINATION_LOG],
        [{"name": "TRAINYARD_CHECKPOINT_SPEC", "value": json.dumps(conf, sort_keys=True)}],
    )  # fmt: skip
    container["restartPolicy"] = "Always"  # a failed restore says why in its termination message
    container["volumeMounts"] = [
        {"name": "checkpoints", "mountPath": CHECKPOINT_DIR},
        {"name": "checkpoint-sync", "mountPath": SYNC_STATE_DIR},
        {"name": "scratch", "mountPath": SCRATCH_DIR},
    ]
    # Started (and the trainer let go) only once the restore is done.
    container["startupProbe"] = {
        "exec": {"command": ["test", "-e", posixpath.join(SYNC_STATE_DIR, "ready")]},
        "periodSeconds": 1,
        "failureThreshold": 3600,
    }
    return container


def _datasets(desc: AttemptDescription, options: RenderOptions, volumes: list[JSON]) -> tuple[list[JSON], list[JSON]]:
    """Registered datasets, read-only: a claim as a read-only volume; an S3 dataset fetched (checksums checked)
    by an init container in the platform's image into the pod's dataset volume (an emptyDir: a hostPath cache
    shared by the node's pods is refused by the restricted pod security standard), mounted read-only.

    With a storage class for dataset caches, an S3 dataset is instead read from its shared cache volume (one claim
    per dataset version, filled once by its own Job: `render_dataset_claim`, `render_dataset_fill`), mounted
    read-only; a small init container holds the trainer back until the fill's completion marker is there."""
    from jobs.backends.dataset_cache import entry_name

    fetchers: list[JSON] = []
    mounts: list[JSON] = []
    for index, item in enumerate(desc.datasets):
        path = posixpath.normpath(str(item["path"]))
        if item.get("kind") == "pvc":
            name = f"dataset-{index}"
            volumes.append({"name": name, "persistentVolumeClaim": {"claimName": item["claim"], "readOnly": True}})
            mounts.append({"name": name, "mountPath": path, "readOnly": True})
            continue
        if not options.s3_url:
            raise ManifestError(
                f"dataset {item['name']} is in the object store, and TRAINYARD_S3_URL is not set: it cannot be fetched"
            )
        spec = _dataset_spec(item)
        if options.dataset_cache_storage_class:
            name, seen_at = f"dataset-{index}", posixpath.join(SHARED_DATASET_DIR, str(index))
            claim = {"claimName": dataset_cache_name(spec), "readOnly": True}
            volumes.append({"name": name, "persistentVolumeClaim": claim})
            waiter = _platform_container(
                name,
                options,
                ["python", "-m", "jobs.backends.dataset_cache", "wait", "--cache", seen_at,
                 "--timeout-s", str(int(options.dataset_fill_timeout_s)), "--termination-log", TERMINATION_LOG],
                [{"name": "TRAINYARD_DATASET", "value": json.dumps(spec, sort_keys=True)}],
                store=False,
            )  # fmt: skip
            waiter["resources"] = {
                "requests": {"cpu": "10m", "memory": "64Mi"},
                "limits": {"cpu": "200m", "memory": "256Mi"},
            }
            waiter["volumeMounts"] = [
                {"name": name, "mountPath": seen_at, "readOnly": True},
                {"name": "scratch", "mountPath": SCRATCH_DIR},
            ]
            fetchers.append(waiter)
            mounts.append({"name": name, "mountPath": path, "subPath": f"data/{entry_name(spec)}", "readOnly": True})
            continue
        if not any(v["name"] == "datasets" for v in volumes):
            volumes.append({"name": "datasets", "emptyDir": {}})
        fetcher = _platform_container(
            f"dataset-{index}",
            options,
            ["python", "-m", "jobs.backends.dataset_cache", "fetch", "--cache", DATASET_CACHE_DIR,
             "--termination-log", TERMINATION_LOG],
            [{"name": "TRAINYARD_DATASET", "value": json.dumps(spec, sort_keys=True)}],
        )  # fmt: skip
        fetcher["volumeMounts"] = [
            {"name": "datasets", "mountPath": DATASET_CACHE_DIR},
            {"name": "scratch", "mountPath": SCRATCH_DIR},
        ]
        fetchers.append(fetcher)
        mounts.append({"name": "datasets", "mountPath": path, "subPath": f"data/{entry_name(spec)}", "readOnly": True})
    return fetchers, mounts


DATASET_SPEC_KEYS = ("id", "team", "name", "version", "prefix", "size_bytes", "file_count")


def _dataset_spec(item: Mapping[str, Any]) -> JSON:
    return {k: item.get(k) for k in DATASET_SPEC_KEYS}


def shared_datasets(desc: AttemptDescription, options: RenderOptions) -> list[JSON]:
    """The attempt's S3 datasets read from shared cache volumes (none without a storage class for them)."""
    if not options.dataset_cache_storage_class or not options.s3_url:
        return []
    return [_dataset_spec(item) for item in desc.datasets if item.get("kind") != "pvc"]


def dataset_cache_name(spec: Mapping[str, Any]) -> str:
    """The shared cache volume's claim, and its fill Job: one per dataset version (ids are the platform's own)."""
    return f"ty-dataset-{int(spec['id'])}-v{int(spec['version'])}"


def dataset_claim_size(size_bytes: int | None) -> str:
    """The claim's size: the dataset's recorded size, a tenth more and 256 MiB (the cache's bookkeeping, a file
    system's own overhead), at least 1 GiB, in whole MiB."""
    mib = 1024 * 1024
    need = int(size_bytes or 0) * 11 // 10 + 256 * mib
    return _quantity_mib(max(1024, -(-need // mib)))


def _dataset_labels(spec: Mapping[str, Any], options: RenderOptions) -> dict[str, str]:
    return {
        **{k: v for k, v in options.extra_labels.items()},
        MANAGED_BY: MANAGER,
        LABEL_COMPONENT: DATASET_FILL_COMPONENT,
        LABEL_TEAM: str(spec["team"]),
        LABEL_DATASET: str(spec["id"]),
    }


def render_dataset_claim(spec: Mapping[str, Any], namespace: str, options: RenderOptions) -> JSON:
    """The shared cache volume of one dataset version: ReadWriteMany (its fill Job writes it once; job pods on any
    node read it, mounted read-only) in the operator's storage class."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": dataset_cache_name(spec),
            "namespace": namespace,
            "labels": _dataset_labels(spec, options),
            "annotations": {ANNOTATION_NAME: f"{spec['name']} v{spec['version']}"},
        },
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": options.dataset_cache_storage_class,
            "resources": {"requests": {"storage": dataset_claim_size(spec.get("size_bytes"))}},
        },
    }


def render_dataset_fill(spec: Mapping[str, Any], namespace: str, options: RenderOptions) -> JSON:
    """The one Job that fetches a dataset version into its shared cache volume: the same fetch as every other
    (listing checked against the registration, each file's checksum checked), its completion marker written last.
    Restricted pod security: non-root, no privilege escalation, no capabilities, RuntimeDefault seccomp."""
    name = dataset_cache_name(spec)
    labels = _dataset_labels(spec, options)
    container = _platform_container(
        "fill",
        options,
        ["python", "-m", "jobs.backends.dataset_cache", "fill", "--cache", DATASET_CACHE_DIR,
         "--termination-log", TERMINATION_LOG],
        [{"name": "TRAINYARD_DATASET", "value": json.dumps(dict(spec), sort_keys=True)}],
    )  # fmt: skip
    container["volumeMounts"] = [
        {"name": "cache", "mountPath": DATASET_CACHE_DIR},
        {"name": "scratch", "mountPath": SCRATCH_DIR},
    ]
    pod: JSON = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": _pod_security(options),
        "containers": [container],
        "volumes": [
            {"name": "cache", "persistentVolumeClaim": {"claimName": name}},
            {"name": "scratch", "emptyDir": {}},
        ],
    }
    if options.service_account:
        pod["serviceAccountName"] = options.service_account
    if options.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in options.image_pull_secrets]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": {ANNOTATION_NAME: f"{spec['name']} v{spec['version']}"},
        },
        "spec": {
            "backoffLimit": DATASET_FILL_BACKOFF,
            # A fill that cannot succeed (the store's copy is not the registered version) fails the Job at once:
            # its own retries waited out the pod back-off (10 s, then 20 s) before the waiting attempts heard why.
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": "fill",
                            "operator": "In",
                            "values": [FILL_CANNOT_SUCCEED_EXIT],
                        },
                    }
                ]
            },
            "activeDeadlineSeconds": int(options.dataset_fill_timeout_s),
            "ttlSecondsAfterFinished": DATASET_FILL_TTL_S,
            "template": _with_apparmor({"metadata": {"labels": labels}, "spec": pod}, options),
        },
    }


def _with_apparmor(template: JSON, options: RenderOptions) -> JSON:
    _apparmor(template, options, volcano=False)
    return template


# ------------------------------------------------------------------------------------------------ volumes


def _volumes(desc: AttemptDescription) -> tuple[list[JSON], list[JSON]]:
    """Scratch space, shared memory and the job's data/checkpoint claims (PersistentVolumeClaims only)."""
    volumes: list[JSON] = [
        {"name": "scratch", "emptyDir": {}},
        # PyTorch data loaders pass batches through /dev/shm; the runtime default of 64 MiB is far too small.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _quantity_mib(max(64, desc.memory_mib // 2))}},
    ]
    mounts: list[JSON] = [
        {"name": "scratch", "mountPath": SCRATCH_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    seen_paths = {SCRATCH_DIR, "/dev/shm"}
    for index, mount in enumerate(desc.mounts):
        volume, volume_mount = _claim_mount(mount, index)
        if volume_mount["mountPath"] in seen_paths:
            raise ManifestError(f"mount {index}: path {volume_mount['mountPath']} is mounted twice")
        seen_paths.add(volume_mount["mountPath"])
        volumes.append(volume)
        mounts.append(volume_mount)
    return volumes, mounts


_MOUNT_KEYS = {"name", "kind", "claim", "path", "read_only", "sub_path"}
_CLAIM_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")


def _claim_mount(mount: Mapping[str, Any], index: int) -> tuple[JSON, JSON]:
    """`{"claim": "<pvc>", "path": "/data", "read_only": true, "sub_path": "...", "kind": "data|checkpoint"}`."""
    if not isinstance(mount, Mapping):
        raise ManifestError(f"mount {index}: expected a mapping with 'claim' and 'path'")
    unknown = set(mount) - _MOUNT_KEYS
    if unknown:
        # hostPath and every other volume source are refused: a job only reaches storage through a claim.
        raise ManifestError(
            f"mount {index}: unsupported key(s) {', '.join(sorted(unknown))}; "
            "only PersistentVolumeClaims can be mounted (claim, path, read_only, sub_path)"
        )
    claim, path = str(mount.get("claim") or ""), str(mount.get("path") or "")
    if not _CLAIM_NAME.match(claim):
        raise ManifestError(f"mount {index}: '{claim}' is not a PersistentVolumeClaim name")
    if not path.startswith("/") or ":" in path or posixpath.normpath(path) in {"/", SCRATCH_DIR, "/dev/shm"}:
        raise ManifestError(f"mount {index}: '{path}' is not a usable absolute mount path")
    kind = str(mount.get("kind") or "data")
    name = f"{'ckpt' if kind == 'checkpoint' else 'data'}-{index}"
    volume = {"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": bool(mount.get("read_only"))}}
    volume_mount: JSON = {"name": name, "mountPath": posixpath.normpath(path), "readOnly": bool(mount.get("read_only"))}
    sub_path = str(mount.get("sub_path") or "")
    if sub_path:
        if sub_path.startswith("/") or ".." in sub_path.split("/"):
            raise ManifestError(f"mount {index}: sub_path must be relative and stay inside the claim")
        volume_mount["subPath"] = sub_path
    return volume, volume_mount


# ------------------------------------------------------------------------------------------------ affinity


GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


def driver_alternatives(minimum: str) -> list[list[JSON]]:
    """Node-selector expressions (ORed lists) for "driver >= minimum" on GFD's numeric version labels, in the
    names GFD 0.15+ writes and, for older GFD releases, the names they wrote."""
    parts = [int(p) for p in re.findall(r"\d+", minimum or "")][: len(DRIVER_LABELS)]
    alternatives: list[list[JSON]] = []
    for keys in (DRIVER_LABELS, LEGACY_DRIVER_LABELS):
        for k, value in enumerate(parts):
            equal = [{"key": keys[j], "operator": "In", "values": _number_spellings(parts[j])} for j in range(k)]
            bound = value if k < len(parts) - 1 else value - 1  # strictly above, except ">=" on the last part
            alternatives.append([*equal, {"key": keys[k], "operator": "Gt", "values": [str(bound)]}])
    return alternatives


def _number_spellings(value: int) -> list[str]:
    return sorted({str(value), f"{value:02d}"})


def shared_rack(
    nodes: Sequence[str], node_labels: Mapping[str, Mapping[str, str]] | None, rack_labels: Sequence[str]
) -> tuple[str, str] | None:
    """The first rack label that every node carries with one common value, as (key, value)."""
    if not nodes or not node_labels:
        return None
    for key in rack_labels:
        values = {(node_labels.get(n) or {}).get(key) for n in nodes}
        if len(values) == 1 and None not in values and "" not in values:
            return key, values.pop() or ""
    return None


def _node_affinity(
    desc: AttemptDescription,
    devices: list[Device],
    node_labels: Mapping[str, Mapping[str, str]] | None,
    options: RenderOptions,
) -> JSON | None:
    base: list[JSON] = []
    fields: list[JSON] = []
    nodes = sorted({d.node for d in devices if d.node})
    if nodes:
        fields.append({"key": "metadata.name", "operator": "In", "values": nodes})
    if desc.replicas > 1:
        all_nodes = sorted({d.node for d in desc.devices if d.node})
        rack = shared_rack(all_nodes, node_labels, options.rack_labels)
        if rack is not None:
            base.append({"key": rack[0], "operator": "In", "values": [rack[1]]})
    if desc.gpu_products:
        base.append({"key": GPU_PRODUCT_LABEL, "operator": "In", "values": list(desc.gpu_products)})
    alternatives = driver_alternatives(desc.min_driver_version) or [[]]
    terms = []
    for alternative in alternatives:
        term: JSON = {}
        expressions = base + alternative
        if expressions:
            term["matchExpressions"] = expressions
        if fields:
            term["matchFields"] = fields
        if term:
            terms.append(term)
    return {"nodeSelectorTerms": terms} if terms else None


# ------------------------------------------------------------------------------------------------ queues


# The smallest share of a card a spec hands out (Shared: 1/4 compute): a quota of N milli holds at most N // 250 shares.
SMALLEST_SHARE_MILLI = 250


def queue_capability(
    vector: Mapping[str, int], sharing: str, shared_resource: str = "nvidia.com/gpu.shared"
) -> dict[str, str]:
    """The platform quota vector as the resources Volcano can cap for this provider. Every GPU resource a pod of
    the platform may ask for is capped: since Volcano 1.9 a resource a queue's capability leaves out is unlimited,
    so an uncapped share resource would let the queue run any number of shares."""
    milli = int(vector.get("gpu_milli", 0))
    capability = {
        "cpu": _quantity_milli(vector.get("cpu_milli", 0)),
        "memory": _quantity_mib(vector.get("memory_mib", 0)),
    }
    if sharing == "whole":
        capability["nvidia.com/gpu"] = str(milli // 1000)
        capability[shared_resource] = str(milli // SMALLEST_SHARE_MILLI)  # a time-sliced share is one unit
    elif sharing == "volcano-vgpu":
        capability["volcano.sh/vgpu-memory"] = str(int(vector.get("gpu_memory_mib", 0)))
        capability["volcano.sh/vgpu-number"] = str(milli // SMALLEST_SHARE_MILLI)  # a device per share or card
        capability["volcano.sh/vgpu-cores"] = str(milli // 10)  # percent of a card: 1000 milli is 100
    return capability


# Preemptible (borrowed) work holds no quota: the platform admits it onto idle cards beyond its queue's hard quota.
# In its platform queue's Volcano Queue, whose capability is that quota, Volcano would keep it pending; it rides in
# this queue instead, with no capability (nothing the platform lends is capped here: the platform's own admission
# is the bound) and the lowest weight. A dot keeps the name apart from every `trainyard-<queue>`.
BORROWED_QUEUE = "trainyard.borrowed"


def render_borrowed_queue() -> JSON:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": BORROWED_QUEUE, "labels": {MANAGED_BY: MANAGER}},
        "spec": {"weight": 1, "reclaimable": True, "capability": {}},
    }


def render_queue(
    *,
    name: str,
    vector: Mapping[str, int],
    weight: int,
    priority: int,
    fifo: bool,
    sharing: str,
    platform_queue: str = "",
    volcano_version: Sequence[int] = MIN_VOLCANO_VERSION,
    shared_resource: str = "nvidia.com/gpu.shared",
) -> JSON:
    """A cluster-scoped Volcano Queue whose capability is the platform queue's hard quota, with only the fields
    the given Volcano release knows (older releases have no queue priority and no FIFO dequeue)."""
    labels = {MANAGED_BY: MANAGER}
    if platform_queue:
        labels[LABEL_QUEUE] = platform_queue
    spec: JSON = {
        "weight": max(1, min(65535, int(weight))),
        # Quotas are hard: a queue never lends its share, and never takes another's.
        "reclaimable": False,
        "capability": queue_capability(vector, sharing, shared_resource),
    }
    version = tuple(volcano_version)
    if version >= QUEUE_FIELD_SINCE["priority"]:
        spec["priority"] = max(0, int(priority))
    if version >= QUEUE_FIELD_SINCE["dequeueStrategy"]:
        spec["dequeueStrategy"] = "fifo" if fifo else "traverse"
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }


def queue_version_from_schema(spec_properties: Mapping[str, Any]) -> tuple[int, int]:
    """The newest Volcano release whose Queue fields the installed CRD's `spec` schema has (as far as the
    platform cares): the properties of `spec` in the `queues.scheduling.volcano.sh` CRD."""
    version = MIN_VOLCANO_VERSION
    for name, since in sorted(QUEUE_FIELD_SINCE.items(), key=lambda item: item[1]):
        if name in spec_properties:
            version = max(version, since)
    return version


def render_queue_command(*, queue: str, uid: str, action: str, namespace: str) -> JSON:
    """A bus Command that opens or closes a queue (what `vcctl queue operate` creates)."""
    if action not in ("OpenQueue", "CloseQueue"):
        raise ManifestError(f"unknown queue action {action}")
    target = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "name": queue,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return {
        "apiVersion": "bus.volcano.sh/v1alpha1",
        "kind": "Command",
        "metadata": {
            "generateName": f"{queue}-{action.lower()}-",
            "namespace": namespace,
            "labels": {MANAGED_BY: MANAGER},
            "ownerReferences": [target],
        },
        "target": target,
        "action": action,
        "reason": "TrainyardQueueSync",
        "message": f"the platform queue behind {queue} was {'opened' if action == 'OpenQueue' else 'closed'}",
    }


# ------------------------------------------------------------------------------------------------ tensorboard


def render_tensorboard_service(*, job_id: str, namespace: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": tensorboard_name(job_id),
            "namespace": namespace,
            "labels": {MANAGED_BY: MANAGER, LABEL_JOB: job_id},
        },
        "spec": {
            "selector": {LABEL_JOB: job_id, LABEL_TENSORBOARD: "true"},
            "ports": [{"name": "http", "port": 80, "targetPort": TENSORBOARD_PORT, "protocol": "TCP"}],
        },
    }


def render_tensorboard_ingress(
    *, job_id: str, namespace: str, host: str, ingress_class: str = "", auth_url: str = "", tls_secret: str = ""
) -> JSON:
    annotations: dict[str, str] = {}
    if auth_url:
        # ingress-nginx asks the platform whether the browser may see this job's TensorBoard.
        annotations["nginx.ingress.kubernetes.io/auth-url"] = auth_url.replace("{job_id}", job_id)
    spec: JSON = {
        "rules": [
            {
                "host": host,
                "http": {
                    "paths": [
                        {
                            "path": "/",
                            "pathType": "Prefix",
                            "backend": {"service": {"name": tensorboard_name(job_id), "port": {"number": 80}}},
                        }
                    ]
                },
            }
        ],
    }
    if ingress_class:
        spec["ingressClassName"] = ingress_class
    if tls_secret:
        spec["tls"] = [{"hosts": [host], "secretName": tls_secret}]
    metadata: JSON = {
        "name": tensorboard_name(job_id),
        "namespace": namespace,
        "labels": {MANAGED_BY: MANAGER, LABEL_JOB: job_id},
    }
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": metadata, "spec": spec}
