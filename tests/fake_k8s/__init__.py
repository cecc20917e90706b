"""Test harness: a fake Kubernetes API server (real HTTP, Kubernetes semantics) with a simulated Volcano.

Start it, point the unpatched official client at it, script what the pods do, and advance time in ticks::

    from kubernetes import client
    from tests.fake_k8s import FakeKubernetes

    with FakeKubernetes() as kube, kube.api_client() as api:    # or Configuration(host=kube.url)
        kube.controller.script("train-", exit_code=137, reason="OOMKilled", logs="CUDA out of memory")
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "batch.volcano.sh", "v1alpha1", "default", "jobs", manifest)
        kube.controller.wait_for_job_phase("default", "train-1", "Failed")   # ticks until then

The cluster starts with namespaces default/kube-system/kube-public/kube-node-lease, one Ready node
`gpu-node-0` (8 `nvidia.com/gpu`, 96 CPU, 1Ti, GPU Feature Discovery labels; `nodes=` changes the count,
`kube.add_node()` adds more) and the Volcano queues `root` and `default`.

- `server.FakeKubernetes`: the API server; faults (`fail_next`, `throttle_next`, `hang_next`, `drop_next`),
  the request log (`requests`, `requests_matching`), an internal object API (`get`, `list`, `create`,
  `patch`, `mutate`, `delete`), a settable clock; no watches and no `follow=true` logs (the platform uses
  neither).
- `controller.VolcanoController` (`kube.controller`): `script()`, `tick()`, `run_until()`,
  `wait_for_job_phase()`, `fail_pod()`, `preempt_pod()`, `set_queue_state()`. Lost and deleted nodes, the
  batch/v1 Job controller and volume provisioning are not simulated: the real control plane of `make cluster`
  runs them (tests/k8s).
- the resource metrics API (`metrics.k8s.io/v1beta1` pods, as metrics-server serves them): `set_pod_metrics()`
  gives a pod's containers' CPU and memory (served while the pod is Running, with its labels, `timestamp` and
  `window`; lists take label selectors), `clear_pod_metrics()`, and `metrics_api` = `"absent"` (not installed:
  404) or `"unavailable"` (503); node metrics and field selectors are not emulated.
- `crds`: the real Volcano CRDs (`crds_available()`, `crd_schema()`, `validate()`; `require()` skips a test
  without them, or fails it under `CI=true`; `release_dirs()` names the release folders to test against).

Deliberately not emulated (a backend must not rely on them passing here or failing here): authentication and
RBAC; server-side apply; the exact `kubectl`-visible wording of most messages (reasons, codes and fields
match; texts are close paraphrases); consistent snapshots for paginated lists and list `resourceVersion`
semantics (lists are always the latest state); watch bookmarks; strategic merge patch beyond the common list
merge keys; CRD defaulting inside `anyOf`, CEL rules and formats; Volcano's `timeout` on policies, the
TaskFailed/Unknown/JobUpdated events, the decisions of preemption and reclaim (`preempt_pod()` plays their
outcome), hierarchical queues beyond "jobs only in leaf queues", exact `minResources` keys (plain resource
names here), per-pod queue share (`deserved`); and, on the kube side, eviction API, ResourceQuota/LimitRange
enforcement (the objects are stored and served), PVCs, DNS and networking. Unknown fields are pruned as a real
server does for the official client (`fieldValidation=Warn`, its default: the client never reads the warning) and
listed in `kube.pruned`; they are rejected only when a request asks for `fieldValidation=Strict` (or with
`FakeKubernetes(field_validation="Strict")`). `apiextensions.k8s.io/v1` CustomResourceDefinitions are served
read-only from the CRD folder in use (`crd_dir=` picks a release folder such as `v1.9.0`).
"""

from . import crds
from .controller import PodScript, ScriptRule, VolcanoController
from .crds import crds_available, crds_dir, unavailable_reason
from .server import ApiError, FakeKubernetes, Fault, RequestRecord

__all__ = [
    "ApiError",
    "FakeKubernetes",
    "Fault",
    "PodScript",
    "RequestRecord",
    "ScriptRule",
    "VolcanoController",
    "crds",
    "crds_available",
    "crds_dir",
    "unavailable_reason",
]
