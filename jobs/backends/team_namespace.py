"""Team namespaces kept by the platform on Kubernetes: what each team's namespace must hold, and the pass that makes
the cluster say so.

For every team the Volcano backend keeps, in the team's namespace (created when missing):

- the namespace's labels: the restricted Pod Security Standard (enforced, audited and warned), the team's slug;
- a ResourceQuota `trainyard-quota` derived from the team's quota: the GPU resources the sharing provider hands out
  (whole cards and time-sliced shares, or vGPU devices, memory and cores), CPU and memory requests (plus what the
  platform's own sidecars request), and a pod count;
- a LimitRange `trainyard-limits`: defaults for a container that names no CPU or memory (else the quota refuses
  it) and a per-container maximum of the team's whole quota;
- a RoleBinding `trainyard-team` of the ClusterRole `trainyard-team` to the platform's service account;
- NetworkPolicies: `trainyard-default-deny` (no ingress to any pod), `trainyard-job-peers` (the pods of the team's
  Volcano jobs reach each other on every port: a gang's master and workers, torch.distributed and NCCL) and
  `trainyard-tensorboard` (the TensorBoard port of a job's master pod, from any namespace: the ingress controller);
- with the registry's token service (TRAINYARD_REGISTRY_TOKEN_KEY), a Secret `trainyard-registry-pull`
  (kubernetes.io/dockerconfigjson): the team's own registry credential, the imagePullSecret of its job pods, which
  pulls the team's `trainyard/<team>/…` and the shared bases and nothing of another team's.

`sync` is level-triggered: it reads each object, creates what is missing, replaces what drifted (a deleted quota, a
changed limit, a removed label) and leaves alone what matches; it returns what it changed. Objects others add to
the namespace are never touched, and a team that is deleted keeps its namespace (its claims hold data).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import structlog
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from jobs.backends import volcano_render as render

log = structlog.get_logger(__name__)
JSON = dict[str, Any]

QUOTA_NAME = "trainyard-quota"
LIMITS_NAME = "trainyard-limits"
ROLE_BINDING_NAME = "trainyard-team"
TEAM_ROLE = "trainyard-team"  # the ClusterRole of k8s/rbac.yaml
POLICY_DENY = "trainyard-default-deny"
POLICY_PEERS = "trainyard-job-peers"
POLICY_TENSORBOARD = "trainyard-tensorboard"
PULL_SECRET = "trainyard-registry-pull"  # the team's credential at the platform's registry (an imagePullSecret)
JOB_NAME_LABEL = "volcano.sh/job-name"  # Volcano's label on every pod of a Volcano job
POD_SECURITY = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "audit", "warn")} | {
    "pod-security.kubernetes.io/enforce-version": "latest"
}
# The most the platform's own containers in one job pod request on top of the trainer: the TensorBoard and the
# checkpoint sidecars (100m and 256Mi each, volcano_render; 200m and 512Mi in a guaranteed job's pod, whose containers
# all have requests equal to limits); an init container runs before them, never beside.
SIDECAR_CPU_MILLI_PER_POD = 400
SIDECAR_MEMORY_MIB_PER_POD = 1024
# A container that names no CPU or memory (the quota would refuse it): the platform's sidecars' sizes.
DEFAULT_REQUEST = {"cpu": "100m", "memory": "256Mi"}
DEFAULT_LIMIT = {"cpu": "1", "memory": "1Gi"}
DEFAULT_LIMIT_CPU_MILLI, DEFAULT_LIMIT_MEMORY_MIB = 1000, 1024


@dataclass(frozen=True)
class TeamSpace:
    """What the namespace of one team is derived from (plain values: the backend never holds a model)."""

    slug: str
    namespace: str
    gpu_milli: int
    gpu_memory_mib: int
    cpu_milli: int
    memory_mib: int
    max_running_jobs: int

    @classmethod
    def of(cls, team: Any) -> TeamSpace:
        return cls(
            slug=team.slug,
            namespace=team.namespace,
            gpu_milli=int(team.gpu_milli),
            gpu_memory_mib=int(team.gpu_memory_mib),
            cpu_milli=int(team.cpu_milli),
            memory_mib=int(team.memory_mib),
            max_running_jobs=int(team.max_running_jobs),
        )

    @property
    def max_pods(self) -> int:
        """Every GPU pod holds at least the smallest share of the team's GPU quota; one more per running job for a
        dataset fill (or a job without GPUs)."""
        return self.gpu_milli // render.SMALLEST_SHARE_MILLI + self.max_running_jobs


def _labels(team: TeamSpace) -> dict[str, str]:
    return {render.MANAGED_BY: render.MANAGER, render.LABEL_TEAM: team.slug}


def _meta(name: str, team: TeamSpace) -> JSON:
    return {"name": name, "namespace": team.namespace, "labels": _labels(team)}


def render_quota(team: TeamSpace, *, sharing: str, shared_resource: str) -> JSON:
    gpu = render.queue_capability(asdict(team), sharing, shared_resource)
    hard = {f"requests.{name}": value for name, value in gpu.items() if name not in ("cpu", "memory")}
    pods = team.max_pods
    hard["requests.cpu"] = render._quantity_milli(team.cpu_milli + pods * SIDECAR_CPU_MILLI_PER_POD)
    hard["requests.memory"] = render._quantity_mib(team.memory_mib + pods * SIDECAR_MEMORY_MIB_PER_POD)
    hard["pods"] = str(pods)
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": _meta(QUOTA_NAME, team), "spec": {"hard": hard}}


def render_limit_range(team: TeamSpace) -> JSON:
    most = {
        "cpu": render._quantity_milli(max(team.cpu_milli, DEFAULT_LIMIT_CPU_MILLI)),
        "memory": render._quantity_mib(max(team.memory_mib, DEFAULT_LIMIT_MEMORY_MIB)),
    }
    limit = {"type": "Container", "default": DEFAULT_LIMIT, "defaultRequest": DEFAULT_REQUEST, "max": most}
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": _meta(LIMITS_NAME, team), "spec": {"limits": [limit]}}


def render_role_binding(team: TeamSpace, *, service_account: str, system_namespace: str) -> JSON:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(ROLE_BINDING_NAME, team),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": TEAM_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": system_namespace}],
    }


def render_network_policies(team: TeamSpace) -> list[JSON]:
    job_pods = {"matchExpressions": [{"key": JOB_NAME_LABEL, "operator": "Exists"}]}

    def policy(name: str, spec: JSON) -> JSON:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(name, team),
                "spec": {**spec, "policyTypes": ["Ingress"]}}  # fmt: skip

    return [
        policy(POLICY_DENY, {"podSelector": {}}),
        policy(POLICY_PEERS, {"podSelector": job_pods, "ingress": [{"from": [{"podSelector": job_pods}]}]}),
        policy(
            POLICY_TENSORBOARD,
            {
                "podSelector": {"matchLabels": {render.LABEL_TENSORBOARD: "true"}},
                "ingress": [
                    {
                        "from": [{"namespaceSelector": {}}],
                        "ports": [{"protocol": "TCP", "port": render.TENSORBOARD_PORT}],
                    }
                ],
            },
        ),
    ]


def render_pull_secret(team: TeamSpace, docker_config: str) -> JSON:
    """The team's imagePullSecret: the team's own registry credential (its images and the shared bases only)."""
    import base64

    return {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(PULL_SECRET, team),
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(docker_config.encode()).decode()}}  # fmt: skip


def render_namespace(team: TeamSpace) -> JSON:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": team.namespace,
            "labels": {**_labels(team), **POD_SECURITY}}}  # fmt: skip


def render_team_namespace(
    team: TeamSpace, *, sharing: str, shared_resource: str, service_account: str, system_namespace: str,
    pull_config: str = "",
) -> list[JSON]:  # fmt: skip
    """Every object the team's namespace must hold, the namespace first (the pull Secret when `pull_config`, a
    Docker config.json with the team's registry credential, is given)."""
    return [
        render_namespace(team),
        render_quota(team, sharing=sharing, shared_resource=shared_resource),
        render_limit_range(team),
        render_role_binding(team, service_account=service_account, system_namespace=system_namespace),
        *render_network_policies(team),
        *([render_pull_secret(team, pull_config)] if pull_config else []),
    ]


# ------------------------------------------------------------------------------------------------ comparing


def _normal(value: Any) -> Any:
    """A value as the API server stores it, for comparing: quantities by amount ("4000m" is "4"), empty strings
    and nulls left out (the server omits them)."""
    if isinstance(value, Mapping):
        return {k: _normal(v) for k, v in value.items() if v not in ("", None)}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    if isinstance(value, str):
        try:
            return ("quantity", parse_quantity(value))
        except ValueError:
            return value
    return value


BODY_FIELDS = {"ResourceQuota": ("spec",), "LimitRange": ("spec",), "NetworkPolicy": ("spec",),
               "RoleBinding": ("roleRef", "subjects"), "Secret": ("type", "data")}  # fmt: skip


def drifted(want: JSON, have: JSON) -> list[str]:
    """The managed parts of an object that differ from what it should be (labels: only the platform's own)."""
    fields = []
    labels = have.get("metadata", {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in want["metadata"].get("labels", {}).items()):
        fields.append("labels")
    for name in BODY_FIELDS.get(want["kind"], ()):
        mine = want.get(name)
        theirs = have.get(name)
        if name == "spec" and isinstance(theirs, Mapping):
            theirs = {k: theirs[k] for k in mine if k in theirs}  # server defaults beside ours are not drift
        if _normal(mine) != _normal(theirs):
            fields.append(name)
    return fields


# ------------------------------------------------------------------------------------------------ the pass


class NamespaceSync:
    """Creates or repairs one team's namespace objects through the backend's retried API calls."""

    def __init__(self, api_client: k8s.ApiClient, call: Callable[..., Any]):
        self.core = k8s.CoreV1Api(api_client)
        self.rbac = k8s.RbacAuthorizationV1Api(api_client)
        self.networking = k8s.NetworkingV1Api(api_client)
        self._call = call

    def _ops(self, kind: str) -> tuple[Callable, Callable, Callable, Callable]:
        """(read, create, replace, delete) of a namespaced kind."""
        api, noun = {
            "ResourceQuota": (self.core, "resource_quota"),
            "LimitRange": (self.core, "limit_range"),
            "RoleBinding": (self.rbac, "role_binding"),
            "NetworkPolicy": (self.networking, "network_policy"),
            "Secret": (self.core, "secret"),
        }[kind]
        return tuple(getattr(api, f"{verb}_namespaced_{noun}") for verb in ("read", "create", "replace", "delete"))

    def _raw(self, what: str, fn: Callable, *args: Any, **kwargs: Any) -> JSON:
        response = self._call(what, fn, *args, _preload_content=False, **kwargs)
        try:
            return json.loads(response.data)
        finally:
            response.release_conn()

    def sync(self, objects: list[JSON]) -> list[str]:
        """Make the cluster hold `objects` (render_team_namespace's list); returns what was created or repaired,
        e.g. `created ResourceQuota trainyard-quota`, `repaired NetworkPolicy trainyard-default-deny (spec)`."""
        namespace, *rest = objects
        changes = self._namespace(namespace)
        for want in rest:
            changes += self._object(want)
        return changes

    def _namespace(self, want: JSON) -> list[str]:
        name = want["metadata"]["name"]
        try:
            have = self._raw("read_namespace", self.core.read_namespace, name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            try:
                self._call("create_namespace", self.core.create_namespace, want)
                return [f"created Namespace {name}"]
            except ApiException as exc2:
                if exc2.status != 409:  # created meanwhile: compare on the next pass
                    raise
                return []
        if (have.get("status") or {}).get("phase") == "Terminating":
            raise NamespaceTerminating(f"namespace {name} is being deleted; its team's jobs cannot run there")
        if drifted(want, have):
            self._call("patch_namespace", self.core.patch_namespace, name, {"metadata": {"labels": want["metadata"]
                       ["labels"]}})  # fmt: skip
            return [f"repaired Namespace {name} (labels)"]
        return []

    def _object(self, want: JSON) -> list[str]:
        kind, name, namespace = want["kind"], want["metadata"]["name"], want["metadata"]["namespace"]
        read, create, replace, delete = self._ops(kind)
        try:
            have = self._raw(f"read_{kind}", read, name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            try:
                self._call(f"create_{kind}", create, namespace, want)
            except ApiException as exc2:
                if exc2.status != 409:
                    raise
                return []
            return [f"created {kind} {name}"]
        fields = drifted(want, have)
        if not fields:
            return []
        if "roleRef" in fields or "type" in fields:  # immutable: the object is made again
            self._call(f"delete_{kind}", delete, name, namespace)
            self._call(f"create_{kind}", create, namespace, want)
        else:
            body = {**want, "metadata": {**want["metadata"], "labels": {**(have["metadata"].get("labels") or {}),
                    **want["metadata"]["labels"]}, "resourceVersion": have["metadata"]["resourceVersion"]}}  # fmt: skip
            self._call(f"replace_{kind}", replace, name, namespace, body)
        return [f"repaired {kind} {name} ({', '.join(fields)})"]


class NamespaceTerminating(RuntimeError):
    """The team's namespace is being deleted: nothing can be created in it until it is gone."""
