"""A build as Kubernetes objects, for clusters where builds run as Jobs with a rootless builder (BuildKit in its
rootless image, no privileged container): a ConfigMap holding the Containerfile and context files, and a
batch/v1 Job running `buildctl-daemonless.sh` that builds and pushes to the platform registry.

Rendered from the same inputs as the local podman build (`services.render_build`): FROM pinned to the base's digest.
The Job only builds and pushes; the platform then reads the image back from the registry (SBOM, scan) as it does
for a local build. `manage.py image_build_manifest BUILD_ID` prints the objects for `kubectl apply -f -`.
"""

from __future__ import annotations

from typing import Any

BUILDKIT_IMAGE = "moby/buildkit:v0.16.0-rootless"
BUILDKIT_UID = 1000  # the rootless image's user
JSON = dict[str, Any]


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
) -> list[JSON]:
    """[ConfigMap, Job] building `containerfile` (with `files` beside it) and pushing it to `destination`
    (`host/repo:tag`)."""
    name = build_name(build_id)
    labels = {"app.kubernetes.io/managed-by": "trainyard", "trainyard.io/image-build": str(build_id)}
    output = f"type=image,name={destination},push=true" + (",registry.insecure=true" if insecure_registry else "")
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
            "--output",
            output,
        ],  # fmt: skip
        # Rootless BuildKit without a privileged container: no process sandbox of its own, no seccomp filter
        # (it makes user namespaces), and it keeps its state in an emptyDir.
        "env": [{"name": "BUILDKITD_FLAGS", "value": "--oci-worker-no-process-sandbox"}],
        "securityContext": {
            "runAsUser": BUILDKIT_UID,
            "runAsGroup": BUILDKIT_UID,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "Unconfined"},
        },
        "volumeMounts": [
            {"name": "workspace", "mountPath": "/workspace", "readOnly": True},
            {"name": "buildkitd", "mountPath": "/home/user/.local/share/buildkit"},
        ],
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "8Gi"}},
    }
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
                    "labels": labels,
                    "annotations": {"container.apparmor.security.beta.kubernetes.io/buildkit": "unconfined"},
                },
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "containers": [container],
                    "volumes": [
                        {"name": "workspace", "configMap": {"name": name}},
                        {"name": "buildkitd", "emptyDir": {}},
                    ],
                },
            },
        },
    }
    return [configmap, job]
