"""`make cluster-smoke`: the running `make cluster`, driven as the platform drives it.

With the platform's own kubeconfig (service account trainyard/trainyard, never cluster-admin) it creates a Volcano Job
with one task asking for one nvidia.com/gpu in the demo team's namespace, waits until Volcano has bound its pod to a
kwok GPU node and kwok reports it Running, then deletes the job and waits until the pod is gone. It also checks that
the identity really is the service account and that RBAC refuses what k8s/rbac.yaml does not grant.
Exit status 0 when all of that held.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.rest import ApiException

REPO = Path(__file__).resolve().parents[2]
VAR = Path(os.environ.get("TRAINYARD_CLUSTER_DIR") or REPO / "var" / "cluster")
NAMESPACE = "trainyard-demo"
QUEUE = "trainyard-debug"


def fail(msg: str) -> None:
    print(f"smoke: FAILED: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def wait(what: str, check, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.2)
    fail(f"timed out after {timeout:.0f}s waiting for {what}")


def vcjob(name: str) -> dict:
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/part-of": "trainyard-smoke"}},
        "spec": {
            "schedulerName": "volcano",
            "queue": QUEUE,
            "minAvailable": 1,
            "maxRetry": 0,
            "tasks": [
                {
                    "name": "main",
                    "replicas": 1,
                    "template": {
                        "metadata": {"labels": {"app.kubernetes.io/part-of": "trainyard-smoke"}},
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "main",
                                    "image": "registry.invalid/trainyard/smoke:1",
                                    "command": ["python", "train.py"],
                                    "resources": {
                                        "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                                        "limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                                    },
                                    "securityContext": restricted,
                                }
                            ],
                        },
                    },
                }
            ],
        },
    }


def main() -> int:
    state_file = VAR / "state.json"
    if not state_file.exists():
        fail("no cluster state (run `make cluster` first)")
    state = json.loads(state_file.read_text())
    if not state["versions"].get("volcano"):
        fail(
            "this cluster runs without Volcano (its binaries are missing; see docs/cluster.md): nothing can run a vcjob"
        )
    api_client = config.new_client_from_config(config_file=state["kubeconfig"])
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)

    review = client.AuthenticationV1Api(api_client).create_self_subject_review(
        client.V1SelfSubjectReview(api_version="authentication.k8s.io/v1", kind="SelfSubjectReview")
    )
    user = review.status.user_info
    print(f"smoke: identity {user.username} groups {user.groups}")
    if user.username != "system:serviceaccount:trainyard:trainyard" or "system:masters" in (user.groups or []):
        fail(f"the platform kubeconfig is not the trainyard service account: {user.username}")
    try:
        core.list_namespaced_secret("kube-system")
        fail("RBAC let the platform's service account list kube-system's secrets")
    except ApiException as err:
        if err.status != 403:
            raise
    print("smoke: RBAC refuses kube-system secrets (403), as it should")

    name = f"smoke-{uuid.uuid4().hex[:6]}"
    t0 = time.monotonic()
    custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NAMESPACE, "jobs", vcjob(name))
    stored = custom.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NAMESPACE, "jobs", name)
    spec = stored["spec"]
    print(
        f"smoke: created vcjob {NAMESPACE}/{name} (stored: maxRetry={spec.get('maxRetry')}, queue={spec.get('queue')})"
    )
    selector = f"volcano.sh/job-name={name}"

    def running_pod():
        pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
        for pod in pods:
            if pod.spec.node_name and pod.status.phase == "Running":
                return pod
        return None

    def bound_pod():
        pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
        return next((p for p in pods if p.spec.node_name), None)

    try:
        pod = wait("Volcano to bind the job's pod", bound_pod, 90)
        t_bound = time.monotonic() - t0
        pod = wait("kwok to report the pod Running", running_pod, 60)
        t_running = time.monotonic() - t0
        node = core.read_node(pod.spec.node_name)  # k8s/rbac.yaml grants nodes get and list
        if (node.metadata.annotations or {}).get("kwok.x-k8s.io/node") != "fake":
            fail(f"pod bound to {pod.spec.node_name}, which is not a kwok GPU node")
        print(
            f"smoke: pod {pod.metadata.name} bound to {pod.spec.node_name} "
            f"({node.metadata.labels.get('nvidia.com/gpu.product')}) by {pod.spec.scheduler_name} "
            f"after {t_bound:.1f}s, "
            f"Running after {t_running:.1f}s"
        )
    finally:
        try:
            custom.delete_namespaced_custom_object(
                "batch.volcano.sh", "v1alpha1", NAMESPACE, "jobs", name, propagation_policy="Background"
            )
        except ApiException as err:
            if err.status != 404:
                raise
    t_del = time.monotonic()
    wait("the job's pods to go", lambda: not core.list_namespaced_pod(NAMESPACE, label_selector=selector).items, 60)
    print(f"smoke: deleted; pods gone after {time.monotonic() - t_del:.1f}s")
    print("smoke: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
