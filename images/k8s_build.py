"""A build as Kubernetes objects, for clusters where builds run as Jobs with a rootless builder (BuildKit in its
rootless image, no privileged container): a ConfigMap holding the Containerfile and context files, and a
batch/v1 Job running `buildctl-daemonless.sh` that builds and pushes to the platform registry.

Rendered from the same inputs as the local podman build (`services.render_build`): FROM pinned to the base's digest.
The Job only builds and pushes; the platform then reads the image back from the registry (SBOM, scan) as it does
for a local build.

The build pod's network is TRAINYARD_BUILD_NETWORK's, held by the NetworkPolicies of k8s/build-network.yaml, which
pick the pod by its label `trainyard.io/build-network`: every build pod reaches the cluster's DNS and the platform
registry (BuildKit pulls the base and pushes); `allowlist` adds the platform's build proxy (k8s/build-proxy.yaml),
which the Job hands to the RUN steps as the predefined proxy build args and to BuildKit for its own pulls;
`outbound` adds the public internet.

`manage.py image_build_manifest BUILD_ID` prints the objects for `kubectl apply -f -`.

`BuildJobs` creates, reads and deletes those objects through the official client when the platform builds on the
cluster (TRAINYARD_IMAGE_BUILDER=kubernetes): a create that meets 409 AlreadyExists adopts the object of the same
build (a retried task, or a restart after the create went through), and a 404 on delete is done already.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import urllib3
from django.conf import settings
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kernel import kubeclient

BUILDKIT_IMAGE = "moby/buildkit:v0.16.0-rootless"
BUILDKIT_UID = 1000  # the rootless image's user
JSON = dict[str, Any]
BUILD_LABEL = "trainyard.io/image-build"
NETWORK_LABEL = "trainyard.io/build-network"  # none | allowlist | outbound: what k8s/build-network.yaml lets it reach
PROXY_ARGS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")  # the Dockerfile frontend's predefined ARGs
LOG_LIMIT_BYTES = 1_000_000


def build_name(build_id: int) -> str:
    return f"trainyard-image-build-{build_id}"


def render_build_job(
    *,
    build_id: int,
    containerfile: str,
    files: dict[str, str],
    destination: str,
    namespace: str,
    insecure_registry: bool,
    timeout_s: int,
    builder_image: str = BUILDKIT_IMAGE,
    push_auth: str = "",
    network: str = "none",
    proxy_url: str = "",
) -> list[JSON]:
    """[ConfigMap, (Secret,) Job] building `containerfile` (with `files` beside it) and pushing it to `destination`
    (`host/repo:tag`). `push_auth` (a Docker config.json holding the build's own credential, which may push to that
    repository alone) becomes a Secret of the build's name, mounted where BuildKit looks for it. `network` (none,
    allowlist, outbound) labels the pod for the NetworkPolicies; with `allowlist` the RUN steps and BuildKit's own
    pulls go through `proxy_url` (the platform's build proxy), all but BuildKit's push to the platform registry."""
    if network not in ("none", "allowlist", "outbound"):
        raise ValueError(f"the build network must be 'none', 'allowlist' or 'outbound', not {network!r}")
    if network == "allowlist" and not proxy_url:
        raise ValueError("a build with network 'allowlist' needs the build proxy's URL")
    name = build_name(build_id)
    labels = {"app.kubernetes.io/managed-by": "trainyard", BUILD_LABEL: str(build_id)}
    output = f"type=image,name={destination},push=true" + (",registry.insecure=true" if insecure_registry else "")
    proxied = network == "allowlist"
    # The RUN steps' proxy: predefined ARGs, so no Containerfile declares them and they stay out of the image's
    # history; no_proxy empty, so even a cluster-internal name goes to the proxy, which refuses what is not listed.
    proxy_opts = [f"build-arg:{arg}={proxy_url}" for arg in PROXY_ARGS] + ["build-arg:no_proxy=", "build-arg:NO_PROXY="]
    # BuildKit's own pulls (a base's FROM on another registry) through the proxy too; its push to the platform
    # registry goes straight there (the proxy refuses platform services, the registry policy lets it through).
    registry_host = (urlsplit(f"//{destination.split('/', 1)[0]}").hostname or "") if proxied else ""
    proxy_env = [{"name": n, "value": proxy_url} for n in ("HTTP_PROXY", "HTTPS_PROXY")] + [
        {"name": "NO_PROXY", "value": registry_host}
    ]
    configmap: JSON = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": {"Containerfile": containerfile, **files},
    }
    container: JSON = {
        "name": "buildkit",
        "image": builder_image,
        "command": ["buildctl-daemonless.sh"],
        "args": [
            "build",
            "--frontend",
            "dockerfile.v0",
            "--local",
            "context=/workspace",
            "--local",
            "dockerfile=/workspace",
            "--opt",
            "filename=Containerfile",
            *(word for opt in (proxy_opts if proxied else []) for word in ("--opt", opt)),
            "--output",
            output,
        ],  # fmt: skip
        # Rootless BuildKit without a privileged container: no process sandbox of its own, no seccomp filter
        # (it makes user namespaces), and it keeps its state in an emptyDir.
        "env": [
            {"name": "BUILDKITD_FLAGS", "value": "--oci-worker-no-process-sandbox"},
            *(proxy_env if proxied else []),
        ],
        "securityContext": {
            "runAsUser": BUILDKIT_UID,
            "runAsGroup": BUILDKIT_UID,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "Unconfined"},
        },
        "volumeMounts": [
            {"name": "workspace", "mountPath": "/workspace", "readOnly": True},
            {"name": "buildkitd", "mountPath": "/home/user/.local/share/buildkit"},
            *([{"name": "push-auth", "mountPath": "/home/user/.docker", "readOnly": True}] if push_auth else []),
        ],
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "8Gi"}},
    }
    # Readable by BuildKit's user (the pod holds nothing else); it may push to this build's repository alone.
    push_volume = [{"name": "push-auth", "secret": {"secretName": name, "defaultMode": 0o444}}] if push_auth else []
    job: JSON = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "backoffLimit": 0,  # a failed build is reported, not retried blindly
            "activeDeadlineSeconds": timeout_s,
            "ttlSecondsAfterFinished": 24 * 3600,
            "template": {
                "metadata": {
                    "labels": {**labels, NETWORK_LABEL: network},
                    "annotations": {"container.apparmor.security.beta.kubernetes.io/buildkit": "unconfined"},
                },
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "containers": [container],
                    "volumes": [
                        {"name": "workspace", "configMap": {"name": name}},
                        {"name": "buildkitd", "emptyDir": {}},
                        *push_volume,
                    ],
                },
            },
        },
    }
    if not push_auth:
        return [configmap, job]
    secret: JSON = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "type": "Opaque",
        "stringData": {"config.json": push_auth},
    }
    return [configmap, secret, job]


class ClusterUnavailable(Exception):
    """The Kubernetes API did not answer (or answered 5xx/429): the build is looked at again later."""


class BuildJobConflict(Exception):
    """An object of the build's name exists but belongs to another build: refuse rather than adopt it."""


@dataclass(frozen=True)
class Observed:
    state: str  # missing | pending | running | succeeded | failed
    detail: str = ""  # why it is pending, or how it failed
    log: str = ""  # the builder pod's log, read once the Job has finished


class BuildJobs:
    """A build's ConfigMap and Job in the platform's namespace."""

    def __init__(self, api: k8s.ApiClient, namespace: str, timeout_s: float = 15.0):
        self.api, self.namespace, self.timeout_s = api, namespace, timeout_s
        self.core = k8s.CoreV1Api(api)
        self.batch = k8s.BatchV1Api(api)

    @classmethod
    def from_settings(cls) -> BuildJobs:
        return cls(
            kubeclient.api_client(), settings.TRAINYARD_K8S_BUILD_NAMESPACE, settings.TRAINYARD_K8S_REQUEST_TIMEOUT_S
        )

    def close(self) -> None:
        self.api.close()

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, _request_timeout=self.timeout_s, **kwargs)
        except ApiException as exc:
            if exc.status == 429 or exc.status >= 500:
                raise ClusterUnavailable(f"the Kubernetes API answered {exc.status} ({exc.reason})") from None
            raise
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterUnavailable(f"the Kubernetes API did not answer ({type(exc).__name__})") from None

    def create(self, build_id: int, objects: list[JSON]) -> bool:
        """Create the ConfigMap (and push Secret) and the Job; False when the Job already existed for this build
        (adopted)."""
        *before, job = objects
        for body in before:
            create, read = {
                "ConfigMap": (self.core.create_namespaced_config_map, self.core.read_namespaced_config_map),
                "Secret": (self.core.create_namespaced_secret, self.core.read_namespaced_secret),
            }[body["kind"]]
            try:
                self._call(create, self.namespace, body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                existing = self._call(read, body["metadata"]["name"], self.namespace)
                self._check_owner(build_id, existing.metadata)
        try:
            self._call(self.batch.create_namespaced_job, self.namespace, job)
        except ApiException as exc:
            if exc.status != 409:
                raise
            existing = self._call(self.batch.read_namespaced_job, job["metadata"]["name"], self.namespace)
            self._check_owner(build_id, existing.metadata)
            return False
        return True

    def _check_owner(self, build_id: int, metadata: Any) -> None:
        owner = (metadata.labels or {}).get(BUILD_LABEL)
        if owner != str(build_id):
            raise BuildJobConflict(
                f"{self.namespace}/{metadata.name} exists but belongs to image build {owner or 'none'}, not {build_id}"
            )

    def observe(self, build_id: int) -> Observed:
        name = build_name(build_id)
        try:
            job = self._call(self.batch.read_namespaced_job, name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return Observed("missing")
            raise
        self._check_owner(build_id, job.metadata)
        status = job.status
        conditions = {c.type: c for c in status.conditions or [] if c.status == "True"}
        pods = self._call(
            self.core.list_namespaced_pod, self.namespace, label_selector=f"batch.kubernetes.io/job-name={name}"
        ).items
        pods.sort(key=lambda p: p.metadata.creation_timestamp or 0)
        pod = pods[-1] if pods else None
        if "Complete" in conditions or "Failed" in conditions:
            failed = conditions.get("Failed")
            detail = f"{failed.reason}: {failed.message}" if failed is not None else ""
            return Observed("failed" if failed is not None else "succeeded", detail, self._log(pod))
        if pod is None or (pod.status and pod.status.phase == "Pending"):
            return Observed("pending", _waiting_reason(pod))
        return Observed("running")

    def _log(self, pod: Any) -> str:
        if pod is None:
            return ""
        try:
            return self._call(
                self.core.read_namespaced_pod_log,
                pod.metadata.name,
                self.namespace,
                container="buildkit",
                limit_bytes=LOG_LIMIT_BYTES,
            )
        except ApiException as exc:
            if exc.status in (400, 404):  # never started, or already gone
                return ""
            raise

    def delete(self, build_id: int) -> None:
        """Delete the Job (its pods with it), the ConfigMap and the push Secret; already gone is fine."""
        name = build_name(build_id)
        for fn, kwargs in (
            (self.batch.delete_namespaced_job, {"propagation_policy": "Background"}),
            (self.core.delete_namespaced_config_map, {}),
            (self.core.delete_namespaced_secret, {}),
        ):
            try:
                self._call(fn, name, self.namespace, **kwargs)
            except ApiException as exc:
                if exc.status != 404:
                    raise


def _waiting_reason(pod: Any) -> str:
    if pod is None:
        return "no pod yet"
    for container in (pod.status.container_statuses if pod.status else None) or []:
        waiting = container.state.waiting if container.state else None
        if waiting is not None and waiting.reason:
            return waiting.reason + (f": {waiting.message}" if waiting.message else "")
    for condition in (pod.status.conditions if pod.status else None) or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return f"{condition.reason}: {condition.message}"
    return "pod pending"
