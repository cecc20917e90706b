"""The Volcano backend: attempts run as `batch.volcano.sh` Jobs on Kubernetes, through the official client.

- `submit` creates one Volcano Job per attempt under a deterministic name; a repeated submit (or a retry
  after a timeout whose create did go through) meets 409 AlreadyExists and is a no-op.
- `observe` reads, per namespace, every platform-managed Volcano Job and pod in one list each (plus the
  PodGroups and events only when something is pending), maps Volcano phases and pod exit codes/reasons to
  `Observation`s for the classifier, explains pending jobs, and copies new pod log lines into the log store.
- `cancel` deletes the job in the foreground: it disappears only after its pods are gone, and only then
  does the attempt end (and its GPUs go back to the pool).
- `queue_sync` keeps one cluster-scoped Volcano Queue per platform queue; `inventory` reads GPU nodes;
  `tensorboard_expose` / `tensorboard_remove` manage a Service and an Ingress per job.

Every API call is retried with exponential backoff and jitter on 429 (honouring Retry-After), 5xx, timeouts
and refused or dropped connections. Only reads, deletes and creates of deterministically named objects are
retried, so a retry can never leave a duplicate.

Connection (first match wins): `TRAINYARD_K8S_API_URL` (a plain URL such as `kubectl proxy`'s, or the
fake API server in tests), `TRAINYARD_K8S_KUBECONFIG`, the in-cluster service account, `~/.kube/config`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import structlog
import urllib3
from django.conf import settings
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from cluster.inventory import (
    MIG_PROFILE,
    POOL_LABEL,
    SHARING_LABEL,
    SHARING_TIME_SLICED,
    SHARING_WHOLE,
    GpuInfo,
    NodeInfo,
    mig_model,
    mig_profile,
)
from jobs import logstore
from jobs.backends import checkpoint_sync, pod_metrics, team_namespace
from jobs.backends import volcano_render as render
from jobs.backends.base import AttemptDescription, Observation
from kernel import kubeclient, objectstore

log = structlog.get_logger(__name__)
JSON = dict[str, Any]
T = TypeVar("T")

REF_PREFIX = "volcano:"
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
FINISHED_PHASES = frozenset({"Completed", "Failed", "Terminated", "Aborted"})
STOPPING_PHASES = frozenset({"Terminating", "Completing", "Aborting", "Restarting"})
# Container waiting reasons that will not clear up on their own.
STUCK_REASONS = frozenset(
    {
        "ImagePullBackOff",
        "ErrImagePull",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
SELECTOR = f"{render.MANAGED_BY}={render.MANAGER}"
LOG_LIMIT_BYTES = 8 * 1024 * 1024
STDERR_TAG = render.STDERR_TAG  # a trainer's stderr line in the merged pod log (jobs/backends/tyexec)
LOG_CLOCK_SLACK_S = 5  # the platform's and the nodes' clocks may disagree by this much (NTP keeps them closer)
QUEUE_CRD = "queues.scheduling.volcano.sh"
JOB_CRD = "jobs.batch.volcano.sh"
# Native sidecar containers (the checkpoint sync) are on by default from 1.29; `batch.kubernetes.io/job-name`
# (how an image build finds its pod) exists from 1.27.
MIN_KUBERNETES = (1, 29)
PREEMPTION_REASONS = frozenset({"Evict", "Preempted", "Preempting"})
PODS_REFUSED = "PodsRefused"
VGPU_ASSIGNED_ANNOTATION = "volcano.sh/vgpu-ids-new"  # written by Volcano's scheduler (deviceshare, vGPU)
EVENT_PAGE_SIZE = 200
EVENT_PAGES = 5  # Kubernetes folds repeats of an event into one with a count: one object rarely fills a page
SELECTED_EVENT_PAGE_SIZE = 500
SELECTED_EVENT_PAGES = 10  # one event per object and message (repeats are folded), kept an hour by the API server
# Where Volcano's scheduler says why a job waits (a queue's quota, an overused cluster): events on its PodGroup.
PODGROUP_WAITS = "involvedObject.kind=PodGroup,reason=Unschedulable"
# The warning Volcano's job controller records on the Volcano job when the API server refuses a pod it creates
# (ResourceQuota, PodSecurity, a missing service account, an invalid spec).
REFUSALS = (
    f"involvedObject.kind=Job,involvedObject.apiVersion={render.JOB_API[0]}/{render.JOB_API[1]},"
    "reason=FailedCreate,type=Warning"
)
NOTES_KEY = ".notes"  # in an attempt's log-copy state: the platform's own lines already written to its log
RESTORE_REASONS = frozenset({checkpoint_sync.RESTORE_FAILED, checkpoint_sync.RESTORE_STORE_DOWN})
# dataset_cache.DatasetError's reasons, and code_fetch's: an init container of the platform's that says why it failed
DATASET_REASONS = frozenset({"DatasetFetchError", "DatasetChanged", "DatasetCacheFull", "CodeFetchError"})
QUEUE_SCALE_MESSAGES = ("queue resource quota insufficient", "resource in cluster is overused")


class VolcanoError(RuntimeError):
    """The cluster refused a request in a way retrying cannot fix."""


class VolcanoUnavailable(urllib3.exceptions.HTTPError):
    """The API server did not answer within a call's budget (its retries included)."""


@dataclass(frozen=True)
class VolcanoConfig:
    render: render.RenderOptions
    request_timeout_s: float = 15.0
    retries: int = 5
    backoff_s: float = 0.2
    backoff_max_s: float = 10.0
    # One API call, its retries and waits included, never takes longer than this: a Celery task that makes a
    # few calls stays under its 60 s soft limit even while the API server hangs.
    call_budget_s: float = 20.0
    start_timeout_s: int = 600
    # A running pod's log is copied this often while nobody reads the job's log, every pass while someone
    # does (a log page or socket, the logs API) and for log_watch_s after; always in full when the job ends
    # or is cancelled. Each copy is one pods/log request per pod: reading every pass was most of the
    # platform's API-server traffic.
    log_every_s: float = 300.0
    log_watch_s: float = 60.0
    # A pod whose node is NotReady (or that stays Terminating) this long counts as lost with its node.
    node_lost_s: int = 300
    system_namespace: str = "trainyard"
    tb_base_domain: str = ""
    tb_ingress_class: str = ""
    tb_auth_url: str = ""
    tb_tls_secret: str = ""
    # The Volcano release whose Queue fields to render: "auto" reads the installed Queue CRD.
    volcano_version: str = "auto"
    # The platform's own service account (in system_namespace), bound in every team namespace it keeps.
    service_account: str = "trainyard"


class ClusterUnsupported(RuntimeError):
    """The cluster cannot run the platform's jobs as it is (too old, Volcano missing): no retry will help."""

    reason = "ClusterUnsupported"


def _leading_int(text: str) -> int:
    digits = ""
    for ch in str(text or ""):
        if not ch.isdigit():
            break
        digits += ch
    return int(digits or 0)


def parse_ref(ref: str) -> tuple[str, str]:
    """`volcano:<namespace>/<job name>` → (namespace, name)."""
    if not ref.startswith(REF_PREFIX) or "/" not in ref:
        raise ValueError(f"not a Volcano backend reference: {ref!r}")
    namespace, name = ref[len(REF_PREFIX) :].split("/", 1)
    return namespace, name


def _attempt_of(name: str) -> tuple[str, int]:
    """(job id, attempt number) from a `ty-<hex>-<n>` job name."""
    _, hex_id, number = name.split("-", 2)
    return str(uuid.UUID(hex=hex_id)), int(number)


def _team_pull_secrets() -> bool:
    """Job pods pull with their team's own Secret when the platform runs the registry's token service and keeps
    the team namespaces (where that Secret is)."""
    return bool(settings.TRAINYARD_REGISTRY_TOKEN_KEY and settings.TRAINYARD_REGISTRY_URL
                and settings.TRAINYARD_K8S_MANAGE_NAMESPACES)  # fmt: skip


def _team_pull_config(slug: str) -> str:
    """The Docker config.json of a team's pull Secret ("" when there is none to keep)."""
    if not _team_pull_secrets():
        return ""
    from images import registry

    credential = registry.team_credential(slug)
    return registry.docker_config(registry.platform_registry(), credential) if credential else ""


def config_from_settings() -> VolcanoConfig:
    """The backend's configuration; raises `render.ManifestError` with the setting named when it cannot work
    (the `jobs` system check reports the same at startup)."""
    version = str(settings.TRAINYARD_VOLCANO_VERSION or "auto").strip().lower()
    options = render.RenderOptions(
        sharing=settings.TRAINYARD_K8S_SHARING,
        ttl_s=settings.TRAINYARD_K8S_TTL_S,
        priority_class=settings.TRAINYARD_K8S_PRIORITY_CLASS,
        grace_s=math.ceil(settings.TRAINYARD_CANCEL_GRACE_S),
        run_as_uid=settings.TRAINYARD_K8S_RUN_AS_UID,
        service_account=settings.TRAINYARD_K8S_JOB_SERVICE_ACCOUNT,
        image_pull_secrets=tuple(settings.TRAINYARD_K8S_IMAGE_PULL_SECRETS)
        + ((team_namespace.PULL_SECRET,) if _team_pull_secrets() else ()),
        shared_resource=settings.TRAINYARD_K8S_SHARED_RESOURCE,
        tensorboard_image=settings.TRAINYARD_TB_IMAGE,
        rack_labels=tuple(settings.TRAINYARD_K8S_RACK_LABELS),
        platform_image=settings.TRAINYARD_K8S_PLATFORM_IMAGE,
        s3_url=(settings.TRAINYARD_S3_URL or "").rstrip("/"),
        s3_bucket=settings.TRAINYARD_S3_BUCKET,
        s3_region=settings.TRAINYARD_S3_REGION,
        s3_secret=settings.TRAINYARD_K8S_S3_SECRET,
        checkpoint_sync_s=settings.TRAINYARD_CHECKPOINT_SYNC_S,
        checkpoint_final_wait_s=settings.TRAINYARD_CHECKPOINT_FINAL_WAIT_S,
        dataset_cache_storage_class=settings.TRAINYARD_DATASET_CACHE_STORAGE_CLASS,
        dataset_fill_timeout_s=settings.TRAINYARD_DATASET_FILL_TIMEOUT_S,
        apparmor=settings.TRAINYARD_K8S_APPARMOR,
        stderr_wrapper=settings.TRAINYARD_K8S_STDERR_WRAPPER,
        volcano_version=render.MIN_VOLCANO_VERSION if version == "auto" else render.parse_version(version),
    )
    config = VolcanoConfig(
        render=options,
        request_timeout_s=settings.TRAINYARD_K8S_REQUEST_TIMEOUT_S,
        retries=settings.TRAINYARD_K8S_RETRIES,
        call_budget_s=settings.TRAINYARD_K8S_CALL_BUDGET_S,
        start_timeout_s=settings.TRAINYARD_K8S_START_TIMEOUT_S,
        log_every_s=settings.TRAINYARD_K8S_LOG_EVERY_S,
        log_watch_s=settings.TRAINYARD_K8S_LOG_WATCH_S,
        node_lost_s=settings.TRAINYARD_K8S_NODE_LOST_S,
        system_namespace=settings.TRAINYARD_K8S_NAMESPACE,
        tb_base_domain=settings.TRAINYARD_TB_BASE_DOMAIN,
        tb_ingress_class=settings.TRAINYARD_TB_INGRESS_CLASS,
        tb_auth_url=settings.TRAINYARD_TB_AUTH_URL,
        tb_tls_secret=settings.TRAINYARD_TB_TLS_SECRET,
        volcano_version=version,
        service_account=settings.TRAINYARD_K8S_SERVICE_ACCOUNT,
    )
    return config


# The Kubernetes client's API classes a backend instance builds; the client imports each on first use.
API_CLASSES = ("CustomObjectsApi", "CoreV1Api", "NetworkingV1Api", "ApiextensionsV1Api", "BatchV1Api", "VersionApi")


def preload() -> None:
    """Import the client's API classes (about half a second of CPU, CoreV1Api most of it; seconds on a busy
    machine), so that a worker's parent pays it once before forking its pool instead of every child at the first
    start it is given, when a burst of admissions arrives."""
    for name in API_CLASSES:
        getattr(k8s, name)


class VolcanoBackend:
    name = "volcano"
    # Starts of one batch run this many at once (jobs.start_attempts): each is a few API round trips.
    concurrent_submits = 4

    def __init__(self, api_client: k8s.ApiClient, config: VolcanoConfig):
        self.api_client = api_client
        self.config = config
        pool = getattr(getattr(api_client, "rest_client", None), "pool_manager", None)
        if pool is not None:
            # `_call` retries, within its budget; urllib3's own three retries per request would multiply it.
            pool.connection_pool_kw["retries"] = 0
        self.custom = k8s.CustomObjectsApi(api_client)
        self.core = k8s.CoreV1Api(api_client)
        self.networking = k8s.NetworkingV1Api(api_client)
        self.extensions = k8s.ApiextensionsV1Api(api_client)
        self.batch = k8s.BatchV1Api(api_client)
        self._volcano_version: tuple[int, int] | None = None
        self._cluster_checked = False
        self._cluster_check_lock = threading.Lock()  # a start batch's threads check once, not once each
        self._s3 = None  # the object store client that reads checkpoint sidecars' manifests, made on first use
        # Per Volcano job name: (its started pods as last seen, when the next log copy is due), for the jobs whose
        # logs need nothing before then (_collect_logs).
        self._logs_quiet: dict[str, tuple[tuple, float]] = {}

    @classmethod
    def from_settings(cls, api_client: k8s.ApiClient | None = None) -> VolcanoBackend:
        return cls(api_client or kubeclient.api_client(), config_from_settings())

    # ------------------------------------------------------------------------------------------- API calls

    def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One API call, retried on throttling, server errors, timeouts and connection failures, for at most
        `call_budget_s` in all (the last error is raised once the next try would not fit)."""
        delay = self.config.backoff_s
        deadline = time.monotonic() + self.config.call_budget_s
        for attempt in range(self.config.retries + 1):
            left = deadline - time.monotonic()
            timeout = max(0.1, min(self.config.request_timeout_s, left))
            try:
                return fn(*args, _request_timeout=timeout, **kwargs)
            except ApiException as exc:
                if exc.status not in RETRYABLE_STATUS or attempt == self.config.retries:
                    raise
                wait = _retry_after(exc) or delay
                problem = f"HTTP {exc.status}"
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if attempt == self.config.retries:
                    raise
                wait, problem = delay, type(exc).__name__
            wait = min(wait, self.config.backoff_max_s) * random.uniform(0.8, 1.2)
            if time.monotonic() + wait + 0.1 > deadline:
                log.warning("k8s_call_gave_up", call=what, attempts=attempt + 1, problem=problem)
                raise VolcanoUnavailable(
                    f"the Kubernetes API did not answer {what} within {self.config.call_budget_s:g} s ({problem})"
                )
            log.warning("k8s_call_retry", call=what, attempt=attempt + 1, problem=problem, wait_s=round(wait, 2))
            time.sleep(wait)
            delay = min(delay * 2, self.config.backoff_max_s)
        raise AssertionError("unreachable")

    def _raw(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON:
        """A core API read as plain JSON (camelCase, like the manifests), not the client's models."""
        response = self._call(what, fn, *args, _preload_content=False, **kwargs)
        try:
            return json.loads(response.data)
        finally:
            response.release_conn()

    # ------------------------------------------------------------------------------------------- submit

    def cluster_check(self) -> str:
        """Refuse a cluster the platform cannot drive (ClusterUnsupported, saying what is missing): Kubernetes
        older than MIN_KUBERNETES, or no Volcano Job CRD. Checked once per process; returns what was found."""
        info = self._raw("server_version", k8s.VersionApi(self.api_client).get_code)
        found = (_leading_int(info.get("major")), _leading_int(info.get("minor")))
        git_version = info.get("gitVersion") or ".".join(map(str, found))
        if found < MIN_KUBERNETES:
            raise ClusterUnsupported(
                f"the cluster runs Kubernetes {git_version}; Trainyard needs "
                f"{'.'.join(map(str, MIN_KUBERNETES))} or newer (its checkpoint sync is a native sidecar container, "
                "and image builds find their pod by the batch.kubernetes.io/job-name label)"
            )
        try:
            self._raw("read_job_crd", self.extensions.read_custom_resource_definition, JOB_CRD)
        except ApiException as exc:
            if exc.status == 404:
                raise ClusterUnsupported(
                    f"Volcano is not installed on the cluster (no {JOB_CRD} CRD): install Volcano "
                    f"{render.format_version(render.MIN_VOLCANO_VERSION)} or newer"
                ) from None
            if exc.status not in (401, 403):
                raise
        self._cluster_checked = True
        # Fields that differ between releases (AppArmor's) are rendered for the ones found.
        volcano = self.volcano_version()
        render_options = dataclasses.replace(self.config.render, kubernetes_version=found, volcano_version=volcano)
        self.config = dataclasses.replace(self.config, render=render_options)
        return f"Kubernetes {git_version}, Volcano {render.format_version(volcano)}"

    def submit(self, desc: AttemptDescription) -> str:
        if not self._cluster_checked:
            with self._cluster_check_lock:
                if not self._cluster_checked:
                    self.cluster_check()
        nodes = sorted({d.node for d in desc.devices if d.node})
        node_labels = self._node_labels(nodes) if desc.replicas > 1 else {}
        manifest = render.render_job(desc, self.config.render, node_labels=node_labels)
        name, namespace = manifest["metadata"]["name"], desc.namespace
        ref = f"{REF_PREFIX}{namespace}/{name}"
        for spec in render.shared_datasets(desc, self.config.render):
            self._ensure_dataset_cache(spec, namespace)
        group, version, plural = render.JOB_API
        try:
            self._call(
                "create_job", self.custom.create_namespaced_custom_object, group, version, namespace, plural, manifest
            )
        except ApiException as exc:
            if exc.status == 409:
                existing = self._call(
                    "get_job", self.custom.get_namespaced_custom_object, group, version, namespace, plural, name
                )
                owner = (existing.get("metadata", {}).get("labels") or {}).get(render.LABEL_ATTEMPT_ID)
                if owner != str(desc.attempt_id):
                    raise VolcanoError(
                        f"Volcano job {namespace}/{name} already exists for another attempt ({owner})"
                    ) from None
                log.info("volcano_job_exists", job_id=desc.job_id, attempt=desc.attempt_number, ref=ref)
                return ref
            raise VolcanoError(f"Kubernetes refused the Volcano job {namespace}/{name}: {_message(exc)}") from None
        log.info(
            "volcano_job_created", job_id=desc.job_id, attempt=desc.attempt_number, ref=ref, queue=desc.volcano_queue
        )
        return ref

    # ------------------------------------------------------------------------------------------- dataset caches

    def _ensure_dataset_cache(self, spec: JSON, namespace: str) -> None:
        """The shared cache volume of a dataset version and the Job that fills it, each made once (409: already
        there). A fill Job that failed is replaced: the new attempt that asks for it tries the fetch again."""
        options = self.config.render
        name = render.dataset_cache_name(spec)
        try:
            self._call(
                "create_dataset_claim",
                self.core.create_namespaced_persistent_volume_claim,
                namespace,
                render.render_dataset_claim(spec, namespace, options),
                _preload_content=False,
            )
            log.info("dataset_cache_claim_created", claim=name, namespace=namespace)
        except ApiException as exc:
            if exc.status != 409:
                raise VolcanoError(
                    f"Kubernetes refused the cache volume {namespace}/{name} of dataset {spec['name']} "
                    f"v{spec['version']}: {_message(exc)}"
                ) from None
        fill = render.render_dataset_fill(spec, namespace, options)
        for _ in range(2):
            try:
                self._call(
                    "create_dataset_fill", self.batch.create_namespaced_job, namespace, fill, _preload_content=False
                )
                log.info("dataset_fill_created", job=name, namespace=namespace)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise VolcanoError(
                        f"Kubernetes refused the fill Job {namespace}/{name} of dataset {spec['name']} "
                        f"v{spec['version']}: {_message(exc)}"
                    ) from None
            existing = self._raw("read_dataset_fill", self.batch.read_namespaced_job, name, namespace)
            if not _batch_failed(existing) or existing["metadata"].get("deletionTimestamp"):
                return  # running or done (or on its way out: the observer makes it again once it is gone)
            self._delete_fill(namespace, name)

    def _delete_fill(self, namespace: str, name: str) -> None:
        try:
            self._call(
                "delete_dataset_fill",
                self.batch.delete_namespaced_job,
                name,
                namespace,
                propagation_policy="Background",
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _dataset_fill_failure(self, job: JSON, pods: list[JSON], context: _NamespaceContext) -> Observation | None:
        """While the trainers wait for their shared dataset caches: a fill Job that failed fails the attempt with
        its reason (and is removed, so that a retry fills again); a fill Job that is gone is made again."""
        raw = (job["metadata"].get("annotations") or {}).get(render.ANNOTATION_DATASET_FILLS)
        if not raw or any(_main_state(p) and "waiting" not in _main_state(p) for p in pods):
            return None
        try:
            specs = json.loads(raw)
        except ValueError:
            return None
        namespace = job["metadata"]["namespace"]
        fills = context.dataset_fills()
        for spec in specs:
            name = render.dataset_cache_name(spec)
            fill = fills.get(name)
            if fill is None:
                log.warning("dataset_fill_missing", job=name, namespace=namespace)
                self._ensure_dataset_cache(spec, namespace)
                continue
            if not _batch_failed(fill):
                continue
            reason, detail = context.fill_failure(fill)
            condition = next(
                (c for c in (fill.get("status") or {}).get("conditions") or [] if c.get("type") == "Failed"), {}
            )
            why = detail or condition.get("message") or condition.get("reason") or "its fill Job failed"
            message = (
                f"dataset {spec['name']} v{spec['version']} could not be filled into its shared cache volume "
                f"(Job {name}): {why}"
            )
            if not fill["metadata"].get("deletionTimestamp"):
                self._delete_fill(namespace, name)
            return Observation(phase="failed", reason=reason, message=message[:1000], node=_main_node(pods))
        return None

    def _node_labels(self, nodes: list[str]) -> dict[str, dict[str, str]]:
        labels: dict[str, dict[str, str]] = {}
        for node in nodes:
            try:
                body = self._raw("read_node", self.core.read_node, node)
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            labels[node] = dict((body.get("metadata") or {}).get("labels") or {})
        return labels

    # ------------------------------------------------------------------------------------------- observe

    def observe(self, refs: list[str]) -> dict[str, Observation]:
        by_namespace: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for ref in refs:
            namespace, name = parse_ref(ref)
            by_namespace[namespace].append((ref, name))
        result: dict[str, Observation] = {}
        nodes = _NodeView(self)  # read at most once per pass, and only when a job has pods on nodes
        for namespace, wanted in sorted(by_namespace.items()):
            try:
                result.update(self._observe_namespace(namespace, wanted, nodes))
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
                # Never report "lost" on a failed read: these attempts are simply not observed this round.
                log.warning("volcano_observe_failed", namespace=namespace, error=str(exc)[:300])
                if isinstance(exc, VolcanoUnavailable):
                    break  # the API server is down: the other namespaces would only spend the task's time
        names = {name for wanted in by_namespace.values() for _, name in wanted}
        for name in [n for n in self._logs_quiet if n not in names]:
            del self._logs_quiet[name]  # no longer live: nothing of it will be read again
        return result

    def _observe_namespace(
        self, namespace: str, wanted: list[tuple[str, str]], nodes: _NodeView | None = None
    ) -> dict[str, Observation]:
        group, version, plural = render.JOB_API
        jobs = {
            j["metadata"]["name"]: j
            for j in self._call(
                "list_jobs",
                self.custom.list_namespaced_custom_object,
                group,
                version,
                namespace,
                plural,
                label_selector=SELECTOR,
            )["items"]
        }
        pods_by_job: dict[str, list[JSON]] = defaultdict(list)
        for pod in self._raw("list_pods", self.core.list_namespaced_pod, namespace, label_selector=SELECTOR)["items"]:
            pods_by_job[(pod["metadata"].get("labels") or {}).get("volcano.sh/job-name", "")].append(pod)
        context = _NamespaceContext(self, namespace, nodes or _NodeView(self))
        result: dict[str, Observation] = {}
        for ref, name in wanted:
            job = jobs.get(name)
            if job is None:
                self._collect_logs(name, [], final=True)
                result[ref] = Observation(
                    phase="lost", reason="Lost", message=f"the Volcano job {namespace}/{name} no longer exists"
                )
                continue
            pods = [p for p in pods_by_job.get(name, []) if _owned_by(p, job)]
            obs = _with_pod_times(self._observation(job, pods, context), pods)
            manifest = self._checkpoint_manifest(job)
            if manifest is not None:
                obs = dataclasses.replace(obs, checkpoints=manifest)
            # The trainer never ran: the attempt's log says why, as the local supervisor's does.
            note = ""
            if obs.finished and obs.reason in RESTORE_REASONS:
                note = f"[trainyard] {obs.message}"
            elif obs.finished and obs.reason in DATASET_REASONS:
                note = f"[trainyard] {obs.reason}: {obs.message}"
            stopping = bool(job["metadata"].get("deletionTimestamp"))  # cancelled: read what is left while it can
            self._collect_logs(name, pods, final=obs.finished, note=note, now=stopping)
            if obs.finished and _phase(job) not in FINISHED_PHASES and not job["metadata"].get("deletionTimestamp"):
                # The platform gave up on it (stuck pulling an image, unschedulable): stop what is left.
                self._delete_job(namespace, name, propagation="Background")
            result[ref] = obs
        return result

    def _checkpoint_manifest(self, job: JSON) -> dict | None:
        """What the attempt's checkpoint sidecar last published in the object store (None: none, or unreadable)."""
        options = self.config.render
        labels = job["metadata"].get("labels") or {}
        if not options.s3_url or not labels.get(render.LABEL_JOB):
            return None
        from jobs.backends.checkpoint_sync import manifest_key
        from jobs.checkpoints import attempt_prefix, store_config

        store = store_config()
        if store is None:
            return None
        prefix = attempt_prefix(
            team_slug=labels.get(render.LABEL_TEAM, ""),
            job_id=labels[render.LABEL_JOB],
            number=int(labels.get(render.LABEL_ATTEMPT, "0") or 0),
        )
        try:
            if self._s3 is None:
                self._s3 = objectstore.client(store, timeout_s=5.0, attempts=1)
            body = self._s3.get_object(Bucket=store.bucket, Key=manifest_key(prefix))["Body"].read()
            return json.loads(body)
        except Exception:  # noqa: BLE001 - not published yet, or the store is down: read again next pass
            return None

    def _observation(self, job: JSON, pods: list[JSON], context: _NamespaceContext) -> Observation:
        meta = job["metadata"]
        phase = _phase(job)
        node = _main_node(pods)
        if meta.get("deletionTimestamp"):
            # Being stopped: it ends when it is gone, or when what is left of it sits on a lost node.
            lost = self._lost(pods, context)
            if lost is not None and all(self._on_lost_node(p, context) for p in _live(pods)):
                return lost
            return Observation(phase="pending", node=node)
        if phase == "Completed":
            return Observation(phase="succeeded", exit_code=0, reason="Completed", node=node)
        if phase in FINISHED_PHASES:
            return self._failure(job, pods, context)
        restore_failed = _restore_failure(pods)
        if restore_failed is not None:
            return restore_failed
        fill_failed = self._dataset_fill_failure(job, pods, context)
        if fill_failed is not None:
            return fill_failed
        lost = self._lost(pods, context)
        if lost is not None:
            return lost
        if phase == "Running" or phase in STOPPING_PHASES:
            return Observation(phase="running", node=node, assigned_gpus=self._assigned_gpus(pods))
        return self._pending(job, pods, context)

    def _failure(self, job: JSON, pods: list[JSON], context: _NamespaceContext) -> Observation:
        failed = sorted((p for p in pods if (p.get("status") or {}).get("phase") == "Failed"), key=_finished_at)
        multi = len(pods) > 1 or _replicas(job) > 1
        if failed:
            pod = failed[0]
            status = pod.get("status") or {}
            terminated = _main_state(pod).get("terminated") or {}
            reason = status.get("reason") or terminated.get("reason") or "Error"
            message = status.get("message") or terminated.get("message") or ""
            init = _failed_init(pod) if not terminated and not status.get("reason") else None
            if init is not None:  # the trainer never ran: an init container (a dataset's) failed first
                terminated, reason, message = init
            if multi:
                message = f"{_short_pod_name(pod)}: {message or reason}"
            return Observation(
                phase="failed",
                exit_code=terminated.get("exitCode"),
                reason=reason,
                message=message[:1000],
                node=(pod.get("spec") or {}).get("nodeName", ""),
            )
        refused = context.refusal(job)
        if refused:
            return Observation(phase="failed", reason=PODS_REFUSED, message=refused[:1000], node=_main_node(pods))
        state = (job.get("status") or {}).get("state") or {}
        reason = "Preempted" if context.pods_preempted(job) else "Evicted"
        message = state.get("message") or (
            f"the Volcano job became {_phase(job)} after one of its pods was removed ({reason.lower()})"
        )
        return Observation(phase="failed", reason=reason, message=message, node=_main_node(pods))

    def _assigned_gpus(self, pods: list[JSON]) -> dict[str, tuple[str, ...]]:
        """The cards Volcano's vGPU scheduler gave the pods (its `volcano.sh/vgpu-ids-new` annotation), by node:
        released Volcano versions ignore the pin to the placed cards, so the ledger follows what was chosen."""
        if self.config.render.sharing != "volcano-vgpu":
            return {}
        assigned: dict[str, list[str]] = defaultdict(list)
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            raw = (pod["metadata"].get("annotations") or {}).get(VGPU_ASSIGNED_ANNOTATION)
            if node and raw:
                assigned[node] += [u for u in _device_uuids(raw) if u not in assigned[node]]
        return {node: tuple(uuids) for node, uuids in assigned.items()}

    def _on_lost_node(self, pod: JSON, context: _NamespaceContext) -> bool:
        return _lost_detail(pod, context.nodes, self.config.node_lost_s, datetime.now(UTC)) is not None

    def _lost(self, pods: list[JSON], context: _NamespaceContext) -> Observation | None:
        """NodeLost when a live pod's node is gone, or NotReady (or the pod stuck Terminating) past the deadline.
        Pods of a node that no longer exists are force-deleted: nothing will ever confirm their end, and their
        job's foreground delete would wait for them forever."""
        now = datetime.now(UTC)
        found: list[tuple[JSON, str, bool]] = []
        for pod in _live(pods):
            lost = _lost_detail(pod, context.nodes, self.config.node_lost_s, now)
            if lost is not None:
                found.append((pod, *lost))
        for pod, _, gone in found:
            if gone:
                self._force_delete_pod(pod)
        if not found:
            return None
        pod, detail, _ = sorted(found, key=lambda item: _task_order(item[0]))[0]
        return Observation(
            phase="failed",
            reason="NodeLost",
            message=f"{_short_pod_name(pod)}: {detail}"[:1000],
            node=(pod.get("spec") or {}).get("nodeName", ""),
        )

    def _force_delete_pod(self, pod: JSON) -> None:
        meta = pod["metadata"]
        try:
            self._call(
                "force_delete_pod",
                self.core.delete_namespaced_pod,
                meta["name"],
                meta["namespace"],
                grace_period_seconds=0,
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
        log.warning("volcano_pod_force_deleted", pod=meta["name"], namespace=meta["namespace"])

    def _pending(self, job: JSON, pods: list[JSON], context: _NamespaceContext) -> Observation:
        now = datetime.now(UTC)
        for pod in pods:
            # Every container counts, the TensorBoard sidecar's image pull as much as the trainer's.
            name, waiting = next(
                ((n, w) for n, w in _waiting_states(pod) if w.get("reason") in STUCK_REASONS), ("", {})
            )
            if waiting:
                where = _short_pod_name(pod) + ("" if name == render.MAIN_CONTAINER else f" ({name})")
                detail = f"{where}: {waiting['reason']}: {waiting.get('message', '')}".strip(": ")
                if _age_s(pod, now) >= self.config.start_timeout_s:
                    return Observation(
                        phase="failed",
                        reason=waiting["reason"],
                        message=detail[:1000],
                        node=(pod.get("spec") or {}).get("nodeName", ""),
                    )
                return Observation(phase="pending", message=detail[:1000])
        for pod in pods:
            unschedulable = _condition(pod, "PodScheduled")
            if unschedulable and unschedulable.get("status") == "False":
                detail = f"{_short_pod_name(pod)} cannot be scheduled: {unschedulable.get('message', '')}"
                if _age_s(pod, now) >= self.config.start_timeout_s:
                    return Observation(phase="failed", reason="Unschedulable", message=detail[:1000])
                return Observation(phase="pending", message=detail[:1000])
        if len(pods) < _replicas(job) and (context.enqueued(job) or context.podgroup(job) is None):
            # Volcano creates the pods (once enqueued); a pod the API server refused shows only as an event on the
            # Volcano job.
            refused = context.refusal(job)
            if refused:
                return Observation(phase="failed", reason=PODS_REFUSED, message=refused[:1000])
        if any((p.get("status") or {}).get("phase") == "Running" for p in pods) or (
            pods and all((p.get("spec") or {}).get("nodeName") for p in pods)
        ):
            return Observation(phase="pending", message="")  # scheduled: containers are starting
        return Observation(phase="pending", message=context.explain_pending(job))

    # ------------------------------------------------------------------------------------------- logs

    def _collect_logs(self, name: str, pods: list[JSON], *, final: bool, note: str = "", now: bool = False) -> None:
        """Copy new lines of the pods' trainers into the log store; `note`, a line of the platform's own, is added
        once. A running pod is read only when its copy is due (`log_every_s`, or every pass while the job's log
        is watched, or while the last read left lines behind); `final` and `now` read every started pod."""
        started = [p for p in pods if _main_state(p) and "waiting" not in _main_state(p)]
        if not started and not final:
            return
        job_id, number = _attempt_of(name)
        hurry = final or now or logstore.watched_within(job_id, self.config.log_watch_s)
        # What this process last found: the same pods, none ended, none behind, and no copy due before `quiet`. Then
        # nothing is read or written (a pass over thousands of running jobs rewrote each one's state file).
        seen = tuple(sorted((p["metadata"].get("uid") or "", "terminated" in _main_state(p)) for p in started))
        memo = self._logs_quiet.get(name)
        if not (hurry or note) and memo is not None and memo[0] == seen and time.time() < memo[1]:
            return
        self._logs_quiet.pop(name, None)
        folder = logstore.attempt_dir(job_id, number)
        folder.mkdir(parents=True, exist_ok=True)
        with _locked(folder / ".k8s-logs.lock"):
            state_path = folder / "k8s-logs.json"
            try:
                state = json.loads(state_path.read_text())
            except (OSError, ValueError):
                state = {}
            writer: _CollectorWriter | None = None
            changed = False  # the state file is written only when something in it changed
            if note and note not in state.get(NOTES_KEY, []):
                writer = _CollectorWriter(folder)
                writer.write_line(note)
                state.setdefault(NOTES_KEY, []).append(note)
                changed = True
            prefix_needed = len(pods) > 1
            quiet_until = float("inf")  # when the next copy of a pod seen here falls due
            for pod in sorted(started, key=_task_order):
                meta = pod["metadata"]
                main = _main_state(pod)
                entry = state.get(meta["name"])
                if entry is None or entry.get("uid") != meta.get("uid"):
                    entry = state[meta["name"]] = {"uid": meta.get("uid"), "last": None, "at_last": 0, "done": False}
                    entry["read_at"] = time.time()  # first seen started: its first copy is due log_every_s on
                    changed = True
                if entry["done"]:
                    continue
                due = time.time() - float(entry.get("read_at") or 0) >= self.config.log_every_s
                if not (hurry or due or entry.get("behind") or "terminated" in main):
                    quiet_until = min(quiet_until, float(entry.get("read_at") or 0) + self.config.log_every_s)
                    continue
                quiet_until = 0.0
                lines, complete = self._read_pod_log(pod, entry)
                entry["read_at"] = time.time()
                changed = True
                if lines is None:
                    continue
                entry["behind"] = not complete
                if lines:
                    writer = writer or _CollectorWriter(folder)
                    prefix = f"[{_short_pod_name(pod)}] " if prefix_needed else ""
                    for text in lines:
                        stream = "stdout"
                        if text.startswith(STDERR_TAG):  # a stderr line, through the trainer's ty-exec
                            text, stream = text[len(STDERR_TAG) :], "stderr"
                        writer.write_line(prefix + text, stream=stream)
                if complete and "terminated" in main:
                    entry["done"] = True
            if final:
                (writer or _CollectorWriter(folder)).close()
            elif writer is not None:
                writer.release()
            if changed:
                tmp = state_path.with_name(state_path.name + ".tmp")
                tmp.write_text(json.dumps(state))
                os.replace(tmp, state_path)
        if not final and quiet_until > time.time():
            self._logs_quiet[name] = (seen, quiet_until)

    def _read_pod_log(self, pod: JSON, entry: JSON) -> tuple[list[str] | None, bool]:
        """New lines of the pod's main container since the last copy, and whether the read was complete."""
        meta = pod["metadata"]
        last = _stamp(entry["last"]) if entry.get("last") else None
        kwargs: dict[str, Any] = {
            "container": render.MAIN_CONTAINER,
            "timestamps": True,
            "limit_bytes": LOG_LIMIT_BYTES,
        }
        if last is not None:
            age = (datetime.now(UTC) - last[2]).total_seconds()
            kwargs["since_seconds"] = max(1, math.ceil(age) + LOG_CLOCK_SLACK_S)
        try:
            response = self._call(
                "read_pod_log",
                self.core.read_namespaced_pod_log,
                meta["name"],
                meta["namespace"],
                _preload_content=False,
                **kwargs,
            )
        except ApiException as exc:
            if exc.status in (400, 404):  # not started yet, or already gone
                return None, False
            raise
        data: bytes = response.data
        response.release_conn()
        complete = len(data) < LOG_LIMIT_BYTES
        if not data.endswith(b"\n"):
            data = data[: data.rfind(b"\n") + 1]  # keep a partial last line for the next read
            complete = False
        fresh: list[str] = []
        seen_at_last = 0
        at_last = int(entry.get("at_last") or 0)
        for raw in data.splitlines():
            stamp_text, _, text = raw.decode("utf-8", "replace").partition(" ")
            stamp = _stamp(stamp_text)
            if stamp is None:
                text, stamp = raw.decode("utf-8", "replace"), last
            key = stamp[:2] if stamp else None
            last_key = last[:2] if last else None
            if last_key is not None and key is not None and key < last_key:
                continue
            if last_key is not None and key == last_key:
                seen_at_last += 1
                if seen_at_last <= at_last:
                    continue
                at_last += 1
            else:
                last, at_last, seen_at_last = stamp, 1, 1
                entry["last"] = stamp_text
            fresh.append(text)
        entry["at_last"] = at_last
        return fresh, complete

    def log_tail(self, ref: str, *, max_bytes: int = 65536) -> str:
        _, name = parse_ref(ref)
        job_id, number = _attempt_of(name)
        return logstore.tail_text(logstore.attempt_dir(job_id, number), max_bytes)

    # ------------------------------------------------------------------------------------------- usage

    def usage_sample(self, refs: list[str]) -> pod_metrics.UsageSampling:
        """CPU and memory of these attempts' pods now, from the resource metrics API (metrics-server): one list
        per namespace, whatever the number of attempts. Each attempt with metrics gets one sample
        (jobs/backends/pod_metrics.py says what is counted). No retries: a missed sample costs one telemetry
        pass. When the API is not installed (404), not serving (503) or not granted (403), the pass stops with
        `unavailable` set and no numbers."""
        by_namespace: dict[str, dict[str, str]] = defaultdict(dict)
        for ref in refs:
            namespace, name = parse_ref(ref)
            by_namespace[namespace][name] = ref
        result = pod_metrics.UsageSampling()
        group, version, plural = pod_metrics.METRICS_API
        for namespace, wanted in sorted(by_namespace.items()):
            result.namespaces += 1
            try:
                items = self.custom.list_namespaced_custom_object(
                    group,
                    version,
                    namespace,
                    plural,
                    label_selector=SELECTOR,
                    _request_timeout=self.config.request_timeout_s,
                )["items"]
            except ApiException as exc:
                # metrics-server lists from its pod cache (a missing namespace lists empty), so a 404 means no API
                if exc.status in (403, 404, 503):
                    result.unavailable = _metrics_unavailable(exc)
                    break
                log.warning("pod_metrics_read_failed", namespace=namespace, error=_message(exc))
                continue
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                result.unavailable = f"the resource metrics API did not answer ({type(exc).__name__})"
                break
            pods: dict[str, list[pod_metrics.PodUsage]] = defaultdict(list)
            for item in items:
                job_name = _metrics_job_name(item, wanted)
                if job_name is None:
                    continue
                try:
                    usage = pod_metrics.pod_usage(item, container=render.MAIN_CONTAINER)
                except ValueError as exc:
                    result.skipped_pods.append(f"{namespace}/{item.get('metadata', {}).get('name')}: {exc}")
                    continue
                if usage is not None:
                    pods[job_name].append(usage)
            for name, usages in pods.items():
                result.samples[wanted[name]] = pod_metrics.attempt_sample(usages)
        return result

    # ------------------------------------------------------------------------------------------- stop

    def cancel(self, ref: str, *, grace_s: float, reason: str = "") -> None:
        # `reason` is not carried: on Kubernetes the device plugin enforces shares, and a deleted job is lost.
        namespace, name = parse_ref(ref)
        self._copy_logs_before_stop(namespace, name)
        # Foreground: the Volcano job stays (being deleted) until its pods are gone, so the attempt ends and
        # frees its GPUs only once nothing of it runs any more.
        self._delete_job(namespace, name, propagation="Foreground")
        log.info("volcano_job_cancelled", ref=ref)

    def _copy_logs_before_stop(self, namespace: str, name: str) -> None:
        """A cancelled job's pods may be gone before the next observe pass: copy their logs up to now first."""
        try:
            pods = self._raw(
                "list_pods",
                self.core.list_namespaced_pod,
                namespace,
                label_selector=f"{SELECTOR},volcano.sh/job-name={name}",
            )["items"]
            self._collect_logs(name, pods, final=False, now=True)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("volcano_logs_before_stop_failed", job=name, error=str(exc)[:300])

    def cleanup(self, ref: str) -> None:
        namespace, name = parse_ref(ref)
        self._delete_job(namespace, name, propagation="Background")

    def _delete_job(self, namespace: str, name: str, *, propagation: str) -> None:
        group, version, plural = render.JOB_API
        try:
            self._call(
                "delete_job",
                self.custom.delete_namespaced_custom_object,
                group,
                version,
                namespace,
                plural,
                name,
                propagation_policy=propagation,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def live_refs(self) -> set[str]:
        group, version, plural = render.JOB_API
        items = self._call(
            "list_all_jobs", self.custom.list_cluster_custom_object, group, version, plural, label_selector=SELECTOR
        )["items"]
        return {
            f"{REF_PREFIX}{j['metadata']['namespace']}/{j['metadata']['name']}"
            for j in items
            if _phase(j) not in FINISHED_PHASES or j["metadata"].get("deletionTimestamp")
        }

    # ------------------------------------------------------------------------------------------- queues

    def volcano_version(self) -> tuple[int, int]:
        """The Volcano release queues are rendered for: TRAINYARD_VOLCANO_VERSION, or (`auto`) the newest release
        whose Queue fields the installed Queue CRD has; the minimum when the CRD cannot be read."""
        if self._volcano_version is not None:
            return self._volcano_version
        if self.config.volcano_version != "auto":
            self._volcano_version = render.parse_version(self.config.volcano_version)
            return self._volcano_version
        try:
            crd = self._raw("read_queue_crd", self.extensions.read_custom_resource_definition, QUEUE_CRD)
        except ApiException as exc:
            if exc.status not in (401, 403, 404):
                raise
            # Not allowed to read CRDs, or no Queue CRD yet: render what every supported release accepts.
            log.warning(
                "volcano_version_unknown", status=exc.status, assumed=render.format_version(render.MIN_VOLCANO_VERSION)
            )
            return render.MIN_VOLCANO_VERSION
        properties: JSON = {}
        for version in (crd.get("spec") or {}).get("versions") or []:
            if version.get("name") == render.QUEUE_API[1]:
                schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
                properties = ((schema.get("properties") or {}).get("spec") or {}).get("properties") or {}
        self._volcano_version = render.queue_version_from_schema(properties)
        log.info("volcano_version_detected", version=render.format_version(self._volcano_version))
        return self._volcano_version

    def queue_sync(self, queue: Any) -> JSON:
        """Create or update the Volcano Queue of a platform queue, and open or close it to match; and make sure
        the queue that borrowed (preemptible) work rides in is there (render.BORROWED_QUEUE)."""
        wanted = render.render_queue(
            name=queue.volcano_name,
            vector=queue.vector(),
            weight=queue.weight,
            priority=queue.priority,
            fifo=queue.ordering == "fifo",
            sharing=self.config.render.sharing,
            platform_queue=queue.name,
            volcano_version=self.volcano_version(),
            shared_resource=self.config.render.shared_resource,
        )
        current = self._queue_apply(wanted, want_open=queue.state == "open")
        log.info(
            "volcano_queue_synced", queue=queue.volcano_name, capability=wanted["spec"]["capability"], state=queue.state
        )
        self._queue_apply(render.render_borrowed_queue(), want_open=True)
        return current

    def _queue_apply(self, wanted: JSON, *, want_open: bool) -> JSON:
        """Create the Volcano Queue, or bring its spec and labels to `wanted`; then open or close it."""
        name = wanted["metadata"]["name"]
        group, version, plural = render.QUEUE_API
        current: JSON | None = None
        for _ in range(5):
            try:
                current = self._call("get_queue", self.custom.get_cluster_custom_object, group, version, plural, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
                try:
                    current = self._call(
                        "create_queue", self.custom.create_cluster_custom_object, group, version, plural, wanted
                    )
                    break
                except ApiException as exc2:
                    if exc2.status == 409:
                        continue
                    raise VolcanoError(f"Kubernetes refused queue {name}: {_message(exc2)}") from None
            spec = dict(current.get("spec") or {})
            desired = {**spec, **wanted["spec"]}
            labels = {**(current["metadata"].get("labels") or {}), **wanted["metadata"]["labels"]}
            if desired == spec and labels == current["metadata"].get("labels"):
                break
            current["spec"], current["metadata"]["labels"] = desired, labels
            try:
                current = self._call(
                    "replace_queue", self.custom.replace_cluster_custom_object, group, version, plural, name, current
                )
                break
            except ApiException as exc:
                if exc.status != 409:  # 409 here is a stale resourceVersion: read again and retry
                    raise VolcanoError(f"Kubernetes refused queue {name}: {_message(exc)}") from None
        else:
            raise VolcanoError(f"queue {name} kept changing under us")
        assert current is not None
        volcano_state = (current.get("status") or {}).get("state") or "Open"
        uid = current["metadata"]["uid"]
        if want_open and volcano_state != "Open":
            self._queue_command(name, uid, "OpenQueue")
        elif not want_open and volcano_state not in ("Closed", "Closing"):
            self._queue_command(name, uid, "CloseQueue")
        return current

    def _queue_command(self, queue: str, uid: str, action: str) -> None:
        group, version, plural = render.COMMAND_API
        namespace = self.config.system_namespace
        body = render.render_queue_command(queue=queue, uid=uid, action=action, namespace=namespace)
        # A generated name: a retry after a lost answer may leave two commands, and opening or closing twice
        # is harmless.
        self._call(
            "create_queue_command", self.custom.create_namespaced_custom_object, group, version, namespace, plural, body
        )

    # ------------------------------------------------------------------------------------------- team namespaces

    def team_namespace_sync(self, team: Any) -> list[str]:
        """Create or repair the team's namespace and what it must hold (jobs/backends/team_namespace.py): its Pod
        Security labels, ResourceQuota and LimitRange from the team's quota, the platform's RoleBinding and the
        NetworkPolicies. Returns what it changed (empty when nothing had drifted)."""
        options = self.config.render
        objects = team_namespace.render_team_namespace(
            team_namespace.TeamSpace.of(team),
            sharing=options.sharing,
            shared_resource=options.shared_resource,
            service_account=self.config.service_account,
            system_namespace=self.config.system_namespace,
            pull_config=_team_pull_config(team.slug),
        )
        try:
            changes = team_namespace.NamespaceSync(self.api_client, self._call).sync(objects)
        except ApiException as exc:
            raise VolcanoError(f"Kubernetes refused team namespace {team.namespace}: {_message(exc)}") from None
        if changes:
            log.info("team_namespace_synced", team=team.slug, namespace=team.namespace, changes=changes)
        return changes

    # ------------------------------------------------------------------------------------------- inventory

    def runtime_classes(self) -> set[str]:
        """The names of the cluster's RuntimeClasses (node.k8s.io), which a queue's runtime_class must be one of."""
        found = self._raw("list_runtime_classes", k8s.NodeV1Api(self.api_client).list_runtime_class)
        return {item["metadata"]["name"] for item in found.get("items", [])}

    def nodes_ready(self) -> dict[str, bool]:
        """Whether each node of the cluster is Ready, by name (one list of the nodes)."""
        return {n["metadata"]["name"]: node_ready(n) for n in self._raw("list_nodes", self.core.list_node)["items"]}

    def inventory(self) -> list[NodeInfo]:
        nodes = self._raw("list_nodes", self.core.list_node)["items"]
        options = self.config.render
        shared = options.shared_resource if options.sharing == "whole" else None
        infos = (node_info(n, options.rack_labels, shared_resource=shared) for n in nodes)
        return [info for info in infos if info is not None]

    # ------------------------------------------------------------------------------------------- tensorboard

    def tensorboard_expose(self, *, job_id: str, namespace: str) -> str:
        host = render.tensorboard_host(job_id, self.config.tb_base_domain)
        service = render.render_tensorboard_service(job_id=job_id, namespace=namespace)
        ingress = render.render_tensorboard_ingress(
            job_id=job_id,
            namespace=namespace,
            host=host,
            ingress_class=self.config.tb_ingress_class,
            auth_url=self.config.tb_auth_url,
            tls_secret=self.config.tb_tls_secret,
        )
        for what, fn, body in (
            ("create_tb_service", self.core.create_namespaced_service, service),
            ("create_tb_ingress", self.networking.create_namespaced_ingress, ingress),
        ):
            try:
                self._call(what, fn, namespace, body, _preload_content=False)
            except ApiException as exc:
                if exc.status != 409:
                    raise VolcanoError(
                        f"Kubernetes refused the TensorBoard route of job {job_id}: {_message(exc)}"
                    ) from None
        log.info("tensorboard_exposed", job_id=job_id, host=host)
        return host

    def tensorboard_remove(self, *, job_id: str, namespace: str) -> None:
        name = render.tensorboard_name(job_id)
        for what, fn in (
            ("delete_tb_ingress", self.networking.delete_namespaced_ingress),
            ("delete_tb_service", self.core.delete_namespaced_service),
        ):
            try:
                self._call(what, fn, name, namespace, _preload_content=False)
            except ApiException as exc:
                if exc.status != 404:
                    raise


# ----------------------------------------------------------------------------------------------- helpers


class _NodeView:
    """The cluster's nodes by name, listed at most once per observe pass and only when asked."""

    def __init__(self, backend: VolcanoBackend):
        self.backend = backend
        self._nodes: dict[str, JSON] | None = None

    def get(self, name: str) -> JSON | None:
        if self._nodes is None:
            items = self.backend._raw("list_nodes", self.backend.core.list_node)["items"]
            self._nodes = {n["metadata"]["name"]: n for n in items}
        return self._nodes.get(name)


class _NamespaceContext:
    """PodGroups and events of one namespace, read at most once per observe pass and only when needed."""

    def __init__(self, backend: VolcanoBackend, namespace: str, nodes: _NodeView):
        self.backend = backend
        self.namespace = namespace
        self.nodes = nodes
        self._podgroups: dict[str, JSON] | None = None
        self._events: dict[str, list[JSON]] = {}
        self._selected: dict[str, dict[str, list[JSON]]] = {}
        self._fills: dict[str, JSON] | None = None
        self._fill_failures: dict[str, tuple[str, str]] = {}

    def dataset_fills(self) -> dict[str, JSON]:
        """The namespace's dataset fill Jobs by name (read once per pass, only when a job waits for one)."""
        if self._fills is None:
            selector = f"{SELECTOR},{render.LABEL_COMPONENT}={render.DATASET_FILL_COMPONENT}"
            body = self.backend._raw(
                "list_dataset_fills", self.backend.batch.list_namespaced_job, self.namespace, label_selector=selector
            )
            self._fills = {j["metadata"]["name"]: j for j in body.get("items") or []}
        return self._fills

    def fill_failure(self, fill: JSON) -> tuple[str, str]:
        """Why a fill Job failed, from its last pod's termination message: (reason, message). Read once per pass:
        every attempt waiting on it gets the same answer, though the first one's report removes the Job."""
        name = fill["metadata"]["name"]
        if name not in self._fill_failures:
            self._fill_failures[name] = self._read_fill_failure(name)
        return self._fill_failures[name]

    def _read_fill_failure(self, name: str) -> tuple[str, str]:
        pods = self.backend._raw(
            "list_fill_pods", self.backend.core.list_namespaced_pod, self.namespace, label_selector=f"job-name={name}"
        )["items"]
        for pod in sorted(pods, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""), reverse=True):
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                terminated = (status.get("state") or {}).get("terminated") or {}
                if terminated.get("exitCode"):
                    reason, message = _said(str(terminated.get("message") or ""), DATASET_REASONS)
                    return reason or "DatasetFetchError", message
        return "DatasetFetchError", ""

    def podgroups(self) -> dict[str, JSON]:
        if self._podgroups is None:
            group, version, plural = render.PODGROUP_API
            items = self.backend._call(
                "list_podgroups",
                self.backend.custom.list_namespaced_custom_object,
                group,
                version,
                self.namespace,
                plural,
            )["items"]
            self._podgroups = {pg["metadata"]["name"]: pg for pg in items}
        return self._podgroups

    def events(self, *names: str) -> list[JSON]:
        """The events about the named objects, oldest first: one filtered list per object (never the whole
        namespace's events), read in pages, each object at most once per pass."""
        found: list[JSON] = []
        for name in names:
            if name not in self._events:
                items: list[JSON] = []
                token = None
                for _ in range(EVENT_PAGES):
                    page = self.backend._raw(
                        "list_events",
                        self.backend.core.list_namespaced_event,
                        self.namespace,
                        field_selector=f"involvedObject.name={name}",
                        limit=EVENT_PAGE_SIZE,
                        **({"_continue": token} if token else {}),
                    )
                    items += page.get("items") or []
                    token = (page.get("metadata") or {}).get("continue")
                    if not token:
                        break
                self._events[name] = items
            found += self._events[name]
        return sorted(found, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    def podgroup(self, job: JSON) -> JSON | None:
        """The job's PodGroup (Volcano names it `<job>-<uid>`), None before its controller made it."""
        meta = job["metadata"]
        return self.podgroups().get(f"{meta['name']}-{meta.get('uid', '')}")

    def enqueued(self, job: JSON) -> bool:
        """Whether Volcano's scheduler let the job into its queue (PodGroup past Pending). Its controller creates
        the pods only then, so before it no pod can have been refused, and a queue's quota holds it no longer."""
        phase = ((self.podgroup(job) or {}).get("status") or {}).get("phase") or ""
        return phase not in ("", "Pending")

    def selected_events(self, selector: str) -> dict[str, list[JSON]]:
        """The namespace's events that `selector` (a field selector) picks, by the name of the object they are
        about, oldest first: one list per selector per pass, read in pages, instead of one list per job (each of
        which the API server answers by filtering all of the namespace's events)."""
        if selector not in self._selected:
            found: dict[str, list[JSON]] = defaultdict(list)
            token = None
            for _ in range(SELECTED_EVENT_PAGES):
                page = self.backend._raw(
                    "list_events",
                    self.backend.core.list_namespaced_event,
                    self.namespace,
                    field_selector=selector,
                    limit=SELECTED_EVENT_PAGE_SIZE,
                    **({"_continue": token} if token else {}),
                )
                for event in page.get("items") or []:
                    found[(event.get("involvedObject") or {}).get("name", "")].append(event)
                token = (page.get("metadata") or {}).get("continue")
                if not token:
                    break
            for items in found.values():
                items.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
            self._selected[selector] = dict(found)
        return self._selected[selector]

    def explain_pending(self, job: JSON) -> str:
        """Why Volcano has not started the job: its PodGroup's Unschedulable condition; while it waits to be
        enqueued, the scheduler's events on the PodGroup too (read only then: an enqueued job's older quota events
        no longer hold it, and a pass would otherwise list events for every job being bound)."""
        meta = job["metadata"]
        queue = (job.get("spec") or {}).get("queue", "")
        pg_name = f"{meta['name']}-{meta.get('uid', '')}"
        podgroup = self.podgroup(job) or {}
        # The job controller's own PodGroupPending warnings on the job repeat the PodGroup's conditions.
        mine = [] if self.enqueued(job) else self.selected_events(PODGROUP_WAITS).get(pg_name, [])
        messages = [str(e.get("message") or "") for e in mine]
        for wanted in QUEUE_SCALE_MESSAGES:
            if any(wanted in m for m in messages):
                return f"waiting in Volcano queue {queue}: {wanted}"
        for condition in (podgroup.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Unschedulable" and condition.get("status") == "True":
                return f"waiting in Volcano queue {queue}: {condition.get('message') or condition.get('reason')}"
        pending = [
            m for e, m in zip(mine, messages, strict=True) if e.get("reason") in ("PodGroupPending", "Unschedulable")
        ]
        if pending:
            return f"waiting in Volcano queue {queue}: {pending[-1]}"
        return ""

    def refusal(self, job: JSON) -> str:
        """Why the API server refused a pod Volcano tried to create for the job ('' when it refused none): the
        job controller records each refusal as a warning event on the Volcano job."""
        said = [str(e.get("message") or "") for e in self.selected_events(REFUSALS).get(job["metadata"]["name"], [])]
        return f"the cluster refused to create the job's pods: {said[-1]}" if said else ""

    def pods_preempted(self, job: JSON) -> bool:
        """Whether Volcano's scheduler took a pod of the job away (it records that as an `Evict` event, for
        preemption and for reclaim alike). The pods may be gone; their names follow from the job's tasks."""
        name = job["metadata"]["name"]
        pods = [
            f"{name}-{task.get('name', '')}-{index}"
            for task in (job.get("spec") or {}).get("tasks") or []
            for index in range(int(task.get("replicas") or 0))
        ]
        return any(
            str(e.get("reason", "")) in PREEMPTION_REASONS or "preempt" in str(e.get("reason", "")).lower()
            for e in self.events(*pods)
        )


class _CollectorWriter(logstore.LogWriter):
    def release(self) -> None:
        """Flush and let go of the file without marking the log complete: the collector comes back."""
        self.flush()
        self._file.close()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Observe passes may overlap in several worker processes; one copies an attempt's logs at a time.
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _retry_after(exc: ApiException) -> float | None:
    try:
        value = (exc.headers or {}).get("Retry-After")
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return f"HTTP {exc.status} {exc.reason}"


def _metrics_unavailable(exc: ApiException) -> str:
    if exc.status == 403:
        return (
            "the resource metrics API refused the platform's service account (HTTP 403): "
            "it needs list on pods.metrics.k8s.io in the team namespaces (k8s/rbac.yaml)"
        )
    if exc.status == 404:
        return "the resource metrics API (metrics.k8s.io/v1beta1) is not installed (HTTP 404): install metrics-server"
    return f"the resource metrics API is not serving (HTTP {exc.status}): is metrics-server running? {_message(exc)}"


def _metrics_job_name(item: JSON, wanted: Mapping[str, str]) -> str | None:
    """Which of the wanted Volcano jobs a PodMetrics item belongs to: by the pod's `volcano.sh/job-name` label
    (metrics-server copies pod labels), else by the pod's name (`<job>-<task>-<index>`), for releases that do not."""
    meta = item.get("metadata") or {}
    name = (meta.get("labels") or {}).get("volcano.sh/job-name")
    if name:
        return name if name in wanted else None
    pod = str(meta.get("name") or "")
    return next((job for job in wanted if pod.startswith(f"{job}-")), None)


def _phase(job: JSON) -> str:
    return str(((job.get("status") or {}).get("state") or {}).get("phase") or "Pending")


def _replicas(job: JSON) -> int:
    return sum(int(t.get("replicas") or 0) for t in (job.get("spec") or {}).get("tasks") or [])


def _owned_by(pod: JSON, job: JSON) -> bool:
    uid = job["metadata"].get("uid")
    refs = pod["metadata"].get("ownerReferences") or []
    return not uid or not refs or any(r.get("uid") == uid for r in refs)


def _main_state(pod: JSON) -> JSON:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == render.MAIN_CONTAINER:
            return status.get("state") or {}
    return {}


def _batch_failed(job: JSON) -> bool:
    return any(
        c.get("type") == "Failed" and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def _said(text: str, reasons: frozenset[str]) -> tuple[str, str]:
    """`<reason>: <message>` from a container's termination message (the platform's own code writes it so; the
    end of a log, the fallback, may carry it on its last line after `[trainyard] `): ("", text) otherwise."""
    lines = [line.removeprefix("[trainyard] ").strip() for line in (text or "").splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    reason, _, message = last.partition(": ")
    if reason in reasons and message:
        return reason, message
    return "", last


def _failed_init(pod: JSON) -> tuple[JSON, str, str] | None:
    """The first init container that ended with an error: its terminated state, reason and message."""
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") or {}
        if terminated and terminated.get("exitCode"):
            reason, message = _said(str(terminated.get("message") or ""), DATASET_REASONS)
            if not reason:
                reason = terminated.get("reason") or "Error"
                message = f"init container {status.get('name')} exited with code {terminated['exitCode']}" + (
                    f": {message}" if message else ""
                )
            return terminated, reason, message
    return None


def _restore_failure(pods: list[JSON]) -> Observation | None:
    """The attempt's end when a pod's checkpoint sidecar failed to restore the checkpoint to resume from.

    The sidecar is a native sidecar (restartPolicy Always): the kubelet starts it again after it exits, and keeps
    the trainer waiting, so the pod never ends by itself. The exit shows as the sidecar's terminated state (now,
    or as its last state while it waits to be started again); its termination message is `<reason>: <message>`
    (`checkpoint_sync.main`), or the end of its log when it could not write one."""
    for pod in sorted(pods, key=_task_order):
        for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
            if status.get("name") != render.CHECKPOINT_SIDECAR:
                continue
            for state in (status.get("state") or {}, status.get("lastState") or {}):
                terminated = state.get("terminated") or {}
                if terminated.get("exitCode") != checkpoint_sync.RESTORE_EXIT_CODE:
                    continue
                reason, message = _said(str(terminated.get("message") or ""), RESTORE_REASONS)
                if not reason:
                    # No reason of its own (a log tail, or nothing): the store is the likelier cause, and a retry
                    # is bounded by the job's retry limit.
                    reason = checkpoint_sync.RESTORE_STORE_DOWN
                if not message:
                    message = (
                        f"the checkpoint sidecar of {_short_pod_name(pod)} could not restore the checkpoint to resume "
                        f"from (exit code {checkpoint_sync.RESTORE_EXIT_CODE}) and left no message"
                    )
                return Observation(
                    phase="failed",
                    exit_code=checkpoint_sync.RESTORE_EXIT_CODE,
                    reason=reason,
                    message=message[:1000],
                    node=(pod.get("spec") or {}).get("nodeName", ""),
                )
    return None


def _device_uuids(raw: str) -> list[str]:
    """GPU UUIDs of a vGPU device annotation: `<uuid>,<type>,<memory>,<cores>:` per device, `;` per container."""
    return [
        entry.split(",", 1)[0].strip()
        for container in raw.split(";")
        for entry in container.split(":")
        if entry.strip().startswith("GPU-")
    ]


def _waiting_states(pod: JSON) -> Iterator[tuple[str, JSON]]:
    """(container name, waiting state) of every container that waits, init containers (sidecars) first."""
    status = pod.get("status") or {}
    for item in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (item.get("state") or {}).get("waiting")
        if waiting:
            yield str(item.get("name") or ""), waiting


def _live(pods: list[JSON]) -> list[JSON]:
    """Pods that hold (or may still hold) their node: bound, and not finished unless still being deleted."""
    return [
        p
        for p in pods
        if (p.get("spec") or {}).get("nodeName")
        and (
            p["metadata"].get("deletionTimestamp")
            or (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        )
    ]


def _lost_detail(pod: JSON, nodes: _NodeView, deadline_s: int, now: datetime) -> tuple[str, bool] | None:
    """Why a bound pod counts as lost with its node, and whether the node is gone; None while it does not."""
    node_name = str((pod.get("spec") or {}).get("nodeName") or "")
    node = nodes.get(node_name)
    if node is None:
        return f"node {node_name} no longer exists", True
    ready = _condition(node, "Ready")
    if ready is not None and ready.get("status") != "True":
        since = _parse_time(str(ready.get("lastTransitionTime") or ""))
        if since is None or (now - since).total_seconds() >= deadline_s:
            why = ready.get("message") or ready.get("reason") or "not ready"
            return f"node {node_name} is not ready ({why}) since {ready.get('lastTransitionTime') or 'unknown'}", False
    deleting = _parse_time(str(pod["metadata"].get("deletionTimestamp") or ""))
    if deleting is not None and (now - deleting).total_seconds() >= deadline_s:
        return f"stuck Terminating on node {node_name} since {pod['metadata']['deletionTimestamp']}", False
    return None


def _condition(obj: JSON, kind: str) -> JSON | None:
    """The status condition of that type of a pod or a node, or None."""
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def _task_order(pod: JSON) -> tuple[int, int]:
    labels = pod["metadata"].get("labels") or {}
    return (
        0 if labels.get("volcano.sh/task-spec") in ("master", "main") else 1,
        int(labels.get(render.LABEL_RANK) or labels.get("volcano.sh/task-index") or 0),
    )


def _main_node(pods: list[JSON]) -> str:
    for pod in sorted(pods, key=_task_order):
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            return str(node)
    return ""


def _short_pod_name(pod: JSON) -> str:
    """`master-0`, `worker-<rank>` (one task per worker replica), `main-0`."""
    labels = pod["metadata"].get("labels") or {}
    task, index = labels.get("volcano.sh/task-spec"), labels.get("volcano.sh/task-index")
    if task and task.startswith("worker-") and labels.get(render.LABEL_RANK):
        return task
    if task and index is not None:
        return f"{task}-{index}"
    return str(pod["metadata"]["name"])


def _with_pod_times(obs: Observation, pods: list[JSON]) -> Observation:
    """The trainers' own times: started when the first main container began, ended (once finished) when the last one
    did, as the kubelet reports them; the observer's clock only where the pods say nothing."""
    began, ended = [], []
    for pod in pods:
        state = _main_state(pod)
        for key in ("running", "terminated"):
            stamp = _parse_time(str((state.get(key) or {}).get("startedAt") or ""))
            if stamp is not None:
                began.append(stamp.timestamp())
        stamp = _parse_time(str((state.get("terminated") or {}).get("finishedAt") or ""))
        if stamp is not None:
            ended.append(stamp.timestamp())
    times: dict[str, float] = {}
    if began and obs.started_at is None:
        times["started_at"] = min(began)
    if ended and obs.finished and obs.ended_at is None:
        times["ended_at"] = max(ended)
    return dataclasses.replace(obs, **times) if times else obs


def _finished_at(pod: JSON) -> str:
    return str((_main_state(pod).get("terminated") or {}).get("finishedAt") or "~")


def _age_s(pod: JSON, now: datetime) -> float:
    created = _parse_time(pod["metadata"].get("creationTimestamp") or "")
    return (now - created).total_seconds() if created else 0.0


def _parse_time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _stamp(text: str) -> tuple[str, int, datetime] | None:
    """An RFC 3339 (nano) timestamp as (whole seconds, nanoseconds, datetime), comparable on its first two."""
    if not text or "T" not in text:
        return None
    body, zone = text, "+00:00"
    if body.endswith("Z"):
        body = body[:-1]
    elif len(body) > 6 and body[-6] in "+-" and body[-3] == ":":
        body, zone = body[:-6], body[-6:]
    seconds, _, fraction = body.partition(".")
    if not fraction.isdigit() and fraction:
        return None
    moment = _parse_time(seconds + zone)
    if moment is None:
        return None
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S"), int((fraction or "0").ljust(9, "0")[:9]), moment


def _quantity_int(value: Any, scale: int = 1) -> int:
    try:
        return int(parse_quantity(str(value)) * scale)
    except (ValueError, TypeError):
        return 0


MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def node_ready(node: JSON) -> bool:
    ready = _condition(node, "Ready")
    return ready is not None and ready.get("status") == "True"


def node_info(
    node: JSON, rack_labels: tuple[str, ...] | list[str], *, shared_resource: str | None = None
) -> NodeInfo | None:
    """A GPU node as the pool sees it, from its allocatable resources and GPU Feature Discovery labels.

    `shared_resource` (the `whole` provider's time-sliced resource): the node's sharing mode is recorded in the
    `trainyard.io/gpu-sharing` label, `time-sliced` when the node advertises that resource and no whole cards
    (the NVIDIA device plugin with `renameByDefault`), `whole` when it advertises only `nvidia.com/gpu`, so
    that placement sends shares and whole cards only where the device plugin can serve them."""
    meta, status = node.get("metadata") or {}, node.get("status") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    allocatable = status.get("allocatable") or {}
    whole = _quantity_int(allocatable.get("nvidia.com/gpu", 0))
    shares = _quantity_int(allocatable.get(shared_resource, 0)) if shared_resource else 0
    count = whole or shares
    # The device plugin's mixed MIG strategy advertises each profile as `nvidia.com/mig-<profile>`: the cards in
    # MIG mode are not in `nvidia.com/gpu` (nor to be counted from GFD's card count), their instances are devices.
    mig = {
        key.removeprefix(MIG_RESOURCE_PREFIX): _quantity_int(value)
        for key, value in allocatable.items()
        if key.startswith(MIG_RESOURCE_PREFIX) and MIG_PROFILE.match(key.removeprefix(MIG_RESOURCE_PREFIX))
    }
    replicas = max(1, _quantity_int(labels.get("nvidia.com/gpu.replicas", 1)))
    if labels.get("nvidia.com/gpu.count") and not mig:
        count = _quantity_int(labels["nvidia.com/gpu.count"])
    elif replicas > 1:
        count //= replicas  # time-slicing advertises each card `replicas` times
    if count <= 0 and not any(mig.values()) and labels.get("nvidia.com/gpu.present") != "true":
        return None
    name = str(meta.get("name"))
    ready = node_ready(node)
    model = labels.get("nvidia.com/gpu.product", "NVIDIA GPU").replace("-", " ")
    memory = _quantity_int(labels.get("nvidia.com/gpu.memory", 0))
    uuids = _published_uuids(meta.get("annotations") or {})
    # A node that is not Ready (its kubelet stopped reporting) still has its cards: it is taken out of placement
    # by its `trainyard.io/k8s-ready` label (cluster.services.nodes_reachability_apply), the cards stay in service.
    gpus = tuple(
        GpuInfo(
            uuid=uuids[i] if i < len(uuids) else f"{render.SYNTHETIC_UUID_PREFIX}{name}-{i}",
            index=i,
            model=model,
            memory_mib=memory,
        )
        for i in range(count)
    )
    if mig:
        gpus += tuple(
            GpuInfo(
                uuid=f"{render.SYNTHETIC_UUID_PREFIX}MIG-{name}-{profile}-{k}",
                index=count + i,
                model=mig_model(model, profile),
                memory_mib=mig_profile(profile)[1],
                mig_profile=profile,
            )
            for i, (profile, k) in enumerate((p, k) for p in sorted(mig) for k in range(mig[p]))
        )
    driver = (
        labels.get("nvidia.com/cuda.driver-version.full")
        or ".".join(labels[k] for k in render.DRIVER_LABELS if labels.get(k))
        # GPU Feature Discovery before 0.15 writes only these.
        or ".".join(labels[k] for k in render.LEGACY_DRIVER_LABELS if labels.get(k))
    )
    cuda = labels.get("nvidia.com/cuda.runtime-version.full") or ".".join(
        labels[k]
        for k in ("nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime-version.minor")
        if labels.get(k)
    )
    pool_labels = {k: v for k, v in labels.items() if k.startswith(("nvidia.com/", "topology.kubernetes.io/"))}
    if labels.get(POOL_LABEL):
        pool_labels[POOL_LABEL] = labels[POOL_LABEL]  # the node pool it joins when it first appears
    for key in rack_labels:
        if labels.get(key):
            pool_labels["trainyard.io/rack"] = labels[key]
            break
    pool_labels["trainyard.io/k8s-ready"] = "true" if ready else "false"
    if shared_resource:
        if shares and not whole:
            pool_labels[SHARING_LABEL] = SHARING_TIME_SLICED
        elif whole and not shares:
            pool_labels[SHARING_LABEL] = SHARING_WHOLE
    if (node.get("spec") or {}).get("unschedulable"):
        pool_labels["trainyard.io/k8s-cordoned"] = "true"
    return NodeInfo(
        name=name,
        emulated=False,
        driver_version=driver,
        cuda_version=cuda,
        cpu_milli=_quantity_int(allocatable.get("cpu", 0), 1000),
        memory_mib=_quantity_int(allocatable.get("memory", 0)) // (1024 * 1024),
        gpus=gpus,
        labels=pool_labels,
    )


def _published_uuids(annotations: Mapping[str, str]) -> list[str]:
    """GPU UUIDs that HAMi or the Volcano vGPU device plugin register on the node, in device order."""
    for key in ("hami.io/node-nvidia-register", "volcano.sh/node-vgpu-register"):
        raw = annotations.get(key)
        if not raw:
            continue
        try:
            devices = json.loads(raw)
            return [str(d.get("id") or d.get("ID") or d.get("uuid")) for d in devices if isinstance(d, dict)]
        except ValueError:
            return [part.split(",", 1)[0] for part in raw.split(":") if part.startswith("GPU-")]
    return []
