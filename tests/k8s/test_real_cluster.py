"""The Volcano backend on a real control plane (`make cluster`, docs/cluster.md): a real kube-apiserver with RBAC,
PodSecurity and ResourceQuota, real Volcano scheduler, controllers and admission webhooks, kwok nodes. The
platform drives it through its own services, with Celery, as its own service account (never cluster-admin);
the admin kubeconfig only sets the scene (a quota, a node that blinks, a pod's outcome) and inspects.

Run by `make test` (marker `k8s`, in the step that runs alone) and `make test-k8s`. Under CI=true a cluster that
cannot be built or started fails the run; elsewhere the tests are skipped saying why.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

from images.tests.conftest import images_env, upstream  # noqa: F401 - fixtures of the image-build test
from jobs import lifecycle
from jobs.tests.test_volcano_backend import reload, submit  # the same submission as the fake cluster's tests
from kernel.paths import BASE_DIR
from tests.k8s.conftest import CLUSTER_DIR

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TEAM_NS = "trainyard-demo"
JOBS = ("batch.volcano.sh", "v1alpha1", "jobs")


@pytest.fixture(scope="session")
def admin(real_cluster):
    api = k8s_config.new_client_from_config(config_file=real_cluster["admin_kubeconfig"])
    return {"core": k8s.CoreV1Api(api), "custom": k8s.CustomObjectsApi(api), "api": api}


def _gpu_nodes(admin) -> list[str]:
    return sorted(
        n.metadata.name
        for n in admin["core"].list_node().items
        if (n.metadata.labels or {}).get("nvidia.com/gpu.present") == "true"
    )


def _clean(admin) -> None:
    """Nothing of an earlier test left: no Volcano job or pod in the team namespace, no quota, every node Ready."""
    custom, core = admin["custom"], admin["core"]
    for job in custom.list_namespaced_custom_object(*JOBS[:2], TEAM_NS, JOBS[2])["items"]:
        try:
            custom.delete_namespaced_custom_object(*JOBS[:2], TEAM_NS, JOBS[2], job["metadata"]["name"])
        except ApiException as exc:
            if exc.status != 404:
                raise
    for quota in core.list_namespaced_resource_quota(TEAM_NS).items:
        core.delete_namespaced_resource_quota(quota.metadata.name, TEAM_NS)
    for name in _gpu_nodes(admin):
        core.patch_node(name, {"metadata": {"annotations": {"kwok.trainyard.io/ready": None}}})
    deadline = time.monotonic() + 60
    while core.list_namespaced_pod(TEAM_NS).items and time.monotonic() < deadline:
        for pod in core.list_namespaced_pod(TEAM_NS).items:
            if pod.metadata.deletion_timestamp:
                try:
                    core.delete_namespaced_pod(pod.metadata.name, TEAM_NS, grace_period_seconds=0)
                except ApiException as exc:
                    if exc.status != 404:  # gone between the list and the delete (CI's oldest pair met it)
                        raise
        time.sleep(0.5)


@pytest.fixture
def platform(real_cluster, admin, settings, tmp_path):
    """The seeded platform on the Volcano backend of the real cluster, as its own service account."""
    from cluster.services import inventory_sync
    from jobs.backends import get_backend, reset_backends
    from jobs.tests.conftest import pin_catalog
    from ops.seed import seed
    from quotas.models import Queue

    _clean(admin)
    settings.TRAINYARD_BACKEND = "volcano"
    settings.TRAINYARD_K8S_KUBECONFIG = real_cluster["kubeconfig"]
    settings.TRAINYARD_K8S_API_URL = ""
    settings.TRAINYARD_K8S_NAMESPACE = "trainyard"
    settings.TRAINYARD_NVML_PROBE = False
    settings.TRAINYARD_CANCEL_GRACE_S = 1.0
    settings.TRAINYARD_LOG_ROOT = tmp_path / "logs"
    settings.TRAINYARD_WORK_ROOT = tmp_path / "work"
    settings.TRAINYARD_K8S_NODE_CHECK_S = 0.01
    reset_backends()
    report = seed(admin_password="admin-pass-123", demo_password="demo-pass-123", demo_team_share=0.5)
    pin_catalog()
    backend = get_backend()
    for queue in Queue.objects.all():
        backend.queue_sync(queue)
    for info in backend.inventory():
        inventory_sync(info=info, backend="volcano")
    from django.contrib.auth import get_user_model

    yield {"user": get_user_model().objects.get(username="demo"), "seed": report, "backend": backend}
    _clean(admin)
    reset_backends()


def _drive(predicate, *, timeout=90.0):
    """Let the platform observe the cluster (the observe loop's work) until predicate() holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lifecycle.attempts_observe(backend_name="volcano")
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    from jobs.models import Job

    said = [(str(j.id)[:8], j.state, j.message) for j in Job.objects.all()]
    raise AssertionError(f"condition not met in time; the platform's jobs: {said}")


def _pods(admin, job) -> list:
    name = reload(job).attempts.order_by("-number").first().backend_ref.rsplit("/", 1)[-1]
    return [p for p in admin["core"].list_namespaced_pod(TEAM_NS).items if p.metadata.name.startswith(name)]


def _outcome(admin, job, outcome: str, **extra: str) -> None:
    """End the job's pods the way a test asks (kwok Stages read these annotations, docs/cluster.md). A pod that
    Volcano replaced between the list and the patch (a gang's pods are re-made while it forms) is looked up again."""
    from kubernetes.client.exceptions import ApiException

    annotations = {"kwok.trainyard.io/outcome": outcome, "kwok.trainyard.io/outcome-after": "0s", **extra}
    for attempt in range(5):
        try:
            for pod in _pods(admin, job):
                body = {"metadata": {"annotations": annotations}}
                admin["core"].patch_namespaced_pod(pod.metadata.name, TEAM_NS, body)
            return
        except ApiException as exc:
            if exc.status != 404 or attempt == 4:
                raise
            time.sleep(1)


def _state(job, *states):
    fresh = reload(job)
    return fresh if fresh.state in states else None


def test_the_cluster_is_the_real_thing_and_the_platform_is_not_its_admin(platform, real_cluster):
    backend = platform["backend"]
    found = backend.cluster_check()
    assert found.startswith(f"Kubernetes {real_cluster['versions']['kubernetes']}"), found
    auth = k8s.AuthorizationV1Api(backend.api_client)
    review = auth.create_self_subject_access_review(
        {"spec": {"resourceAttributes": {"verb": "delete", "resource": "nodes"}}}
    )
    assert review.status.allowed is False  # the platform's own service account, held to k8s/rbac.yaml


def test_a_job_runs_on_the_node_the_platform_chose_and_succeeds(platform, admin, celery_worker_thread):
    job = submit(platform["user"])
    job = _drive(lambda: _state(job, "running"))
    attempt = job.attempts.get()
    pods = _pods(admin, job)
    assert [p.spec.node_name for p in pods] == [attempt.node.name]
    # Volcano's webhook rewrote maxRetry 0 to 3; the policies still end the job on a failed or evicted pod.
    stored = admin["custom"].get_namespaced_custom_object(*JOBS[:2], TEAM_NS, JOBS[2], pods[0].metadata.labels[
        "volcano.sh/job-name"])  # fmt: skip
    assert stored["spec"]["maxRetry"] == 3
    assert {(p["event"], p["action"]) for p in stored["spec"]["policies"]} == {
        ("PodFailed", "TerminateJob"),
        ("PodEvicted", "TerminateJob"),
    }
    _outcome(admin, job, "succeed")
    job = _drive(lambda: _state(job, "succeeded", "failed"))
    assert job.state == "succeeded"


def test_a_failed_pod_is_the_users_failure_and_volcano_does_not_restart_it(platform, admin, celery_worker_thread):
    job = submit(platform["user"])
    _drive(lambda: _state(job, "running"))
    name = _pods(admin, job)[0].metadata.labels["volcano.sh/job-name"]
    _outcome(admin, job, "fail", **{"kwok.trainyard.io/exit-code": "2"})
    job = _drive(lambda: _state(job, "failed", "succeeded", "pending"))
    assert job.state == "failed" and job.attempts.count() == 1
    assert job.attempts.get().failure_class == "user"
    stored = admin["custom"].get_namespaced_custom_object(*JOBS[:2], TEAM_NS, JOBS[2], name)
    assert (stored.get("status") or {}).get("retryCount", 0) == 0  # Volcano never restarted it


def test_an_oom_kill_is_named_and_not_retried(platform, admin, celery_worker_thread):
    job = submit(platform["user"])
    _drive(lambda: _state(job, "running"))
    _outcome(admin, job, "oom")
    job = _drive(lambda: _state(job, "failed", "succeeded", "pending"))
    attempt = job.attempts.get()
    assert (job.state, attempt.reason, attempt.reaction) == ("failed", "OOMKilled", "no_retry")


def test_a_resource_quota_refusal_is_the_reason_and_no_card_is_blamed(platform, admin, celery_worker_thread):
    """The namespace's ResourceQuota refuses the pods Volcano creates: the job ends with the API server's own
    words as its reason, once, with no retry and no card excluded or quarantined."""
    from cluster.models import GPU

    admin["core"].create_namespaced_resource_quota(
        TEAM_NS, {"metadata": {"name": "no-gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "0"}}}
    )
    time.sleep(1.5)  # the quota controller fills in the quota's usage before the API server enforces it
    job = submit(platform["user"])
    job = _drive(lambda: _state(job, "failed", "succeeded", "running"), timeout=120)
    attempt = job.attempts.get()
    assert (job.state, attempt.reason, attempt.reaction) == ("failed", "PodsRefused", "no_retry")
    assert "exceeded quota: no-gpus" in job.message, job.message
    assert not GPU.objects.filter(quarantined=True).exists()
    assert job.attempts.count() == 1


def test_a_pod_security_refusal_is_the_reason(platform, admin, settings, celery_worker_thread):
    """The team namespace enforces the restricted Pod Security Standard: pods that would run as root are refused
    by the API server, and that is what the job says."""
    from jobs.backends import reset_backends

    settings.TRAINYARD_K8S_RUN_AS_UID = 0
    reset_backends()
    job = submit(platform["user"])
    job = _drive(lambda: _state(job, "failed", "succeeded", "running"), timeout=120)
    attempt = job.attempts.get()
    assert (job.state, attempt.reason) == ("failed", "PodsRefused")
    assert "violates PodSecurity" in job.message, job.message


def test_a_node_that_blinks_leaves_placement_and_returns_with_its_cards(platform, admin):
    from django.core.cache import cache

    from cluster.models import GPU, Node
    from jobs.tasks import sync_inventory
    from monitoring.models import Alert

    def check():
        cache.delete("trainyard:node-check")
        return lifecycle.nodes_reachability_check()

    name = _gpu_nodes(admin)[-1]
    admin["core"].patch_node(name, {"metadata": {"annotations": {"kwok.trainyard.io/ready": "false"}}})
    _drive(lambda: check() or Node.objects.get(name=name).state == Node.State.UNHEALTHY, timeout=30)
    sync_inventory()
    cards = GPU.objects.filter(node__name=name)
    assert cards.count() == 8 and not cards.filter(quarantined=True).exists()
    assert not cards.exclude(health=GPU.Health.HEALTHY).exists() and not Alert.objects.exists()
    admin["core"].patch_node(name, {"metadata": {"annotations": {"kwok.trainyard.io/ready": None}}})
    _drive(lambda: check() or Node.objects.get(name=name).state == Node.State.READY, timeout=30)


def test_a_node_lost_past_the_deadline_ends_the_attempt_as_node_lost_and_the_retry_runs_on_another_node(
    platform, admin, settings, celery_worker_thread
):
    """The node of a running job goes NotReady and stays so past TRAINYARD_K8S_NODE_LOST_S: the attempt ends
    NodeLost (the platform's failure, a retry used), the node leaves placement, the retry is bound elsewhere by
    Volcano, and no card is quarantined or alerted on (an unreachable node is not a broken GPU)."""
    from django.core.cache import cache

    from cluster.models import GPU
    from jobs.backends import reset_backends
    from monitoring.models import Alert

    settings.TRAINYARD_K8S_NODE_LOST_S = 3
    reset_backends()
    job = submit(platform["user"], max_retries=1)
    job = _drive(lambda: _state(job, "running"))
    lost = job.attempts.get().node.name
    admin["core"].patch_node(lost, {"metadata": {"annotations": {"kwok.trainyard.io/ready": "false"}}})
    try:

        def retried():
            cache.delete("trainyard:node-check")
            lifecycle.nodes_reachability_check()
            fresh = reload(job)
            second = fresh.attempts.filter(number=2).first()
            return fresh if fresh.state == "running" and second is not None else None

        job = _drive(retried, timeout=150)
        first, second = job.attempts.order_by("number")
        assert (first.state, first.reason, first.failure_class) == ("failed", "NodeLost", "platform")
        assert any(f"node {lost} is not ready" in e.message for e in job.events.filter(attempt=first))
        assert second.node.name != lost
        assert [p.spec.node_name for p in _pods(admin, job)] == [second.node.name]
        assert job.retries_used == 1
        assert not GPU.objects.filter(quarantined=True).exists() and not Alert.objects.exists()
    finally:
        admin["core"].patch_node(lost, {"metadata": {"annotations": {"kwok.trainyard.io/ready": None}}})
    lifecycle.job_cancel(job_id=job.id, actor="demo")


def test_queue_sync_is_accepted_by_volcanos_own_validation_with_every_gpu_resource_capped(platform, admin):
    from quotas.models import Queue

    queue = Queue.objects.get(name="train")
    stored = admin["custom"].get_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues", queue.volcano_name)
    capability = stored["spec"]["capability"]
    assert capability["nvidia.com/gpu"] == str(queue.gpu_milli // 1000)
    assert capability["nvidia.com/gpu.shared"] == str(queue.gpu_milli // 250)
    # A queue new to the cluster (an admin added it): created by the platform's service account, capped the same.
    queue.pk, queue.name = None, f"fresh-{uuid.uuid4().hex[:6]}"
    queue.save()
    try:
        platform["backend"].queue_sync(queue)
        stored = admin["custom"].get_cluster_custom_object(*QUEUES, queue.volcano_name)
        assert stored["spec"]["capability"] == capability
    finally:
        # Volcano's webhook deletes only a closed queue: the platform closes it (a bus Command its queue controller
        # carries out), then the admin deletes it, so no queue of this test shares the cluster with the next.
        queue.state = "closed"
        platform["backend"].queue_sync(queue)
        custom = admin["custom"]
        _drive_plain(lambda: custom.get_cluster_custom_object(*QUEUES, queue.volcano_name).get("status", {})
                     .get("state") == "Closed", timeout=60)  # fmt: skip
        custom.delete_cluster_custom_object(*QUEUES, queue.volcano_name)


QUEUES = ("scheduling.volcano.sh", "v1beta1", "queues")


def test_seeded_quotas_are_sized_from_the_real_inventory(platform):
    from cluster.models import GPU
    from quotas.models import Queue, ResourceSpec, Team

    largest = max(GPU.objects.values_list("memory_mib", flat=True))
    assert "kwok-gpu" in platform["seed"].inventory
    assert Team.objects.get(slug="demo").gpu_memory_mib >= largest  # a guaranteed job fits on one whole card
    # Host CPU and memory follow the GPU capability: jobs of the queue's most demanding spec can fill its cards
    # (the 256 GiB default refused a two-replica gang of four whole cards, 64 GiB each, on these 8-card nodes).
    for holder in [*Queue.objects.prefetch_related("specs"), Team.objects.get(slug="demo")]:
        specs = holder.specs.all() if isinstance(holder, Queue) else ResourceSpec.objects.all()
        for spec in specs:
            need_cpu = holder.gpu_milli * spec.cpu_milli_per_gpu // spec.gpu_milli
            need_memory = holder.gpu_milli * spec.memory_mib_per_gpu // spec.gpu_milli
            assert holder.cpu_milli >= need_cpu and holder.memory_mib >= need_memory, (holder, spec.name)
    assert Queue.objects.get(name="distributed").gpu_milli >= 8000  # the 8-card node's cards, whole


def _creates(real_cluster, resource: str, namespace: str, name: str, since: datetime) -> list[int]:
    """The answers (status codes) to the platform's creates of `resource` named `name` in `namespace` since
    `since`, from the API server's audit log."""
    codes = []
    path = Path(real_cluster["dir"]) / "audit" / "audit.log"
    for event in (json.loads(line) for line in path.read_text().splitlines() if line.strip()):
        ref = event.get("objectRef") or {}
        if (
            event.get("stage") == "ResponseComplete"
            and event.get("verb") == "create"
            and (ref.get("resource"), ref.get("namespace"), ref.get("name")) == (resource, namespace, name)
            and event["user"]["username"].startswith("system:serviceaccount:trainyard:")
            and datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")) >= since
        ):
            codes.append(event["responseStatus"]["code"])
    return codes


def _vcjobs(admin) -> list[dict]:
    return admin["custom"].list_namespaced_custom_object(*JOBS[:2], TEAM_NS, JOBS[2])["items"]


def test_a_cancel_stops_the_pods_and_frees_the_cards(platform, admin, celery_worker_thread):
    from cluster.models import LogicalDevice

    job = submit(platform["user"])
    _drive(lambda: _state(job, "running"))
    assert lifecycle.job_cancel(job_id=job.id, actor="demo").state == "cancelling"
    job = _drive(lambda: _state(job, "cancelled"))
    assert not LogicalDevice.objects.filter(released_at__isnull=True).exists()
    _drive(lambda: not [j for j in _vcjobs(admin) if not j["metadata"].get("deletionTimestamp")])


def test_a_timeout_deletes_the_volcano_job_and_times_out(platform, admin, celery_worker_thread):
    job = submit(platform["user"], timeout_s=1)
    _drive(lambda: _state(job, "running"))
    time.sleep(1.1)
    assert lifecycle.timeouts_enforce() == 1
    job = _drive(lambda: _state(job, "timed_out"))
    assert job.attempts.get().state == "timed_out"
    _drive(lambda: not [j for j in _vcjobs(admin) if not j["metadata"].get("deletionTimestamp")])
    _drive_plain(lambda: not admin["core"].list_namespaced_pod(TEAM_NS).items, timeout=60)


def test_a_distributed_job_is_one_gang_bound_where_the_platform_placed_each_replica(
    platform, admin, celery_worker_thread
):
    job = submit(platform["user"], queue="distributed", replicas=2, gpus=1)
    job = _drive(lambda: _state(job, "running"), timeout=120)
    pods = _pods(admin, job)
    placed = {s.gpu.node.name for s in job.attempts.get().slices.select_related("gpu__node")}
    assert len(pods) == 2 and {p.spec.node_name for p in pods} == placed
    stored = admin["custom"].get_namespaced_custom_object(
        *JOBS[:2], TEAM_NS, JOBS[2], pods[0].metadata.labels["volcano.sh/job-name"]
    )
    assert stored["spec"]["minAvailable"] == 2 and stored["spec"]["queue"] == "trainyard-distributed"
    _outcome(admin, job, "succeed")
    assert _drive(lambda: _state(job, "succeeded", "failed")).state == "succeeded"


def test_preemptible_jobs_borrow_beyond_the_quota_and_volcano_binds_them(
    platform, admin, settings, celery_worker_thread
):
    """Borrowers beyond the queue's hard quota are bound by Volcano on idle cards: they ride in the queue without a
    capability (render.BORROWED_QUEUE), since their platform queue's capability is the quota they run beyond.
    (Filling every card, 8 borrowers, left the 8th refused by Volcano's enqueue check; preemption is tested on one
    node below.)"""
    from jobs.backends import volcano_render as render
    from quotas.models import Queue

    Queue.objects.filter(name="train").update(gpu_milli=4000, gpu_memory_mib=4 * 81559, allow_preemptible=True)
    platform["backend"].queue_sync(Queue.objects.get(name="train"))
    borrowers = [submit(platform["user"], gpus=4, preemptible=True, name=f"borrow{i}") for i in range(4)]
    for job in borrowers:
        _drive(lambda job=job: _state(job, "running"), timeout=150)
        assert _vcjob_of(admin, job)["spec"]["queue"] == render.BORROWED_QUEUE
    assert all(_pods(admin, job)[0].spec.node_name for job in borrowers)  # 16 cards bound, 4 times the quota
    for job in borrowers:
        lifecycle.job_cancel(job_id=job.id, actor="demo")


def test_the_owner_takes_its_cards_back_from_a_borrower_on_the_real_cluster(
    platform, admin, settings, celery_worker_thread
):
    """Preemption end to end on Volcano: two borrowers beyond the train queue's quota fill the one node left in
    placement (the others cordoned by an admin); the queue's own job, within its quota, has the youngest borrower
    told to yield: its Volcano job is deleted, it waits again without using a retry, and the owner's job is bound by
    Volcano on the cards it freed."""
    from cluster.models import Node
    from cluster.services import node_cordon, node_uncordon
    from jobs.models import JobEvent
    from quotas.models import Queue

    settings.TRAINYARD_PREEMPT_GRACE_S = 1.0
    names = _gpu_nodes(admin)
    keep, others = names[0], list(Node.objects.filter(name__in=names[1:]))
    for node in others:
        node_cordon(node_id=node.id, actor="test")
    try:
        Queue.objects.filter(name="train").update(gpu_milli=4000, gpu_memory_mib=4 * 81559, allow_preemptible=True)
        platform["backend"].queue_sync(Queue.objects.get(name="train"))
        borrowers = []
        for i in range(2):  # one after the other: the younger is the one to yield
            borrowers.append(submit(platform["user"], gpus=4, preemptible=True, name=f"lend{i}"))
            _drive(lambda job=borrowers[-1]: _state(job, "running"), timeout=150)
        assert {_pods(admin, job)[0].spec.node_name for job in borrowers} == {keep}  # the node is full

        owner = submit(platform["user"], gpus=4, name="owner")
        owner = _drive(lambda: _state(owner, "running"), timeout=240)
        assert [p.spec.node_name for p in _pods(admin, owner)] == [keep]
        older, younger = (reload(job) for job in borrowers)
        assert older.state == "running"
        assert younger.state == "pending" and younger.retries_used == 0, (younger.state, younger.message)
        first = younger.attempts.order_by("number").first()
        assert first.state == "preempted" and first.preempt_requested_at is not None
        event = JobEvent.objects.get(job=younger, kind="preemption")
        assert event.data["for_job"] == str(owner.id) and event.data["for_queue"] == "train"
        gone = first.backend_ref.rsplit("/", 1)[-1]
        _drive_plain(lambda: not [j for j in _vcjobs(admin) if j["metadata"]["name"] == gone], timeout=60)
        for job in [*borrowers, owner]:
            lifecycle.job_cancel(job_id=job.id, actor="demo")
    finally:
        for node in others:
            node_uncordon(node_id=node.id, actor="test")


def test_a_full_volcano_queue_keeps_the_job_waiting_with_volcanos_reason(platform, admin, celery_worker_thread):
    """Something outside the platform fills the Volcano queue: the platform's job waits, saying so."""
    from quotas.models import Queue

    queue = Queue.objects.get(name="train")
    cards = str(queue.gpu_milli // 1000)
    restricted = {
        "runAsNonRoot": True, "runAsUser": 1000, "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    container = {
        "name": "main", "image": "busybox:1", "command": ["sleep", "infinity"], "securityContext": restricted,
        "resources": {"limits": {"nvidia.com/gpu": cards}, "requests": {"nvidia.com/gpu": cards, "cpu": "1"}},
    }  # fmt: skip
    foreign = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "someone-elses-job"},
        "spec": {
            "schedulerName": "volcano", "queue": queue.volcano_name, "minAvailable": 1,
            "tasks": [{"name": "main", "replicas": 1,
                       "template": {"spec": {"containers": [container], "restartPolicy": "Never"}}}],
        },
    }  # fmt: skip
    admin["custom"].create_namespaced_custom_object(*JOBS[:2], TEAM_NS, JOBS[2], foreign)
    _drive(lambda: any(p.status.phase == "Running" for p in admin["core"].list_namespaced_pod(TEAM_NS).items))
    job = submit(platform["user"])
    job = _drive(lambda: (j := reload(job)).message.startswith("waiting in Volcano queue") and j, timeout=60)
    assert job.state == "starting", job.message
    admin["custom"].delete_namespaced_custom_object(*JOBS[:2], TEAM_NS, JOBS[2], "someone-elses-job")
    assert _drive(lambda: _state(job, "running"), timeout=120)


def test_a_deleted_node_leaves_placement_within_one_node_check(platform, admin):
    from django.core.cache import cache

    from cluster.models import Node

    name = _gpu_nodes(admin)[0]
    body = admin["api"].sanitize_for_serialization(admin["core"].read_node(name))
    admin["core"].delete_node(name)
    try:
        cache.delete("trainyard:node-check")
        assert lifecycle.nodes_reachability_check() == 1
        assert Node.objects.get(name=name).state == Node.State.UNHEALTHY
    finally:
        _recreate_node(admin, body)


# ------------------------------------------------------------------------------------------ item 2's remainders


def _attempt_pods(admin, job) -> list[dict]:
    return [admin["api"].sanitize_for_serialization(p) for p in _pods(admin, job)]


def _vcjob_of(admin, job) -> dict:
    name = reload(job).attempts.order_by("-number").first().backend_ref.rsplit("/", 1)[-1]
    return admin["custom"].get_namespaced_custom_object(*JOBS[:2], TEAM_NS, JOBS[2], name)


TIME_SLICED_NODE = "kwok-ts-0"


@pytest.fixture
def time_sliced_node(admin):
    """A kwok node whose device plugin time-slices its 8 cards 4 ways (`nvidia.com/gpu.shared`, no whole cards),
    as the NVIDIA device plugin with `renameByDefault` advertises them."""
    labels = {
        "kubernetes.io/hostname": TIME_SLICED_NODE, "kwok.x-k8s.io/node": "fake", "kubernetes.io/os": "linux",
        "type": "kwok", "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.replicas": "4",
        "nvidia.com/cuda.driver-version.major": "550", "nvidia.com/cuda.driver-version.minor": "54",
        "nvidia.com/cuda.driver-version.revision": "15", "nvidia.com/cuda.driver-version.full": "550.54.15",
        "nvidia.com/cuda.runtime-version.full": "12.4",
    }  # fmt: skip
    resources = {"cpu": "94", "memory": "1500Gi", "pods": "110", "nvidia.com/gpu.shared": "32"}
    body = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": TIME_SLICED_NODE, "labels": labels,
                     "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {}, "status": {"capacity": resources, "allocatable": resources},
    }  # fmt: skip
    try:
        admin["core"].create_node(body)
    except ApiException as exc:
        if exc.status != 409:
            raise
    _drive_plain(lambda: any(
        c.type == "Ready" and c.status == "True"
        for c in admin["core"].read_node(TIME_SLICED_NODE).status.conditions or []
    ), timeout=30)  # fmt: skip
    yield TIME_SLICED_NODE
    admin["core"].delete_node(TIME_SLICED_NODE)


def _drive_plain(predicate, *, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def test_a_shared_job_takes_one_time_sliced_share_on_the_node_the_platform_chose(
    time_sliced_node, platform, admin, celery_worker_thread
):
    """A quarter-card job: placed on the time-sliced node (the only one serving shares), its pod asks for one
    `nvidia.com/gpu.shared`, Volcano's queue capability and the node's allocatable account for it, and the
    node's other 31 shares stay free."""
    from cluster.models import GPU, Node
    from cluster.services import inventory_sync

    for info in platform["backend"].inventory():
        inventory_sync(info=info, backend="volcano")
    node = Node.objects.get(name=time_sliced_node)
    assert node.labels.get("trainyard.io/gpu-sharing") == "time-sliced"
    assert GPU.objects.filter(node=node).count() == 8
    job = submit(platform["user"], spec="shared")
    job = _drive(lambda: _state(job, "running"))
    attempt = job.attempts.get()
    assert attempt.node.name == time_sliced_node
    [pod] = _attempt_pods(admin, job)
    assert pod["spec"]["nodeName"] == time_sliced_node
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits.get("nvidia.com/gpu.shared") == "1" and "nvidia.com/gpu" not in limits
    _outcome(admin, job, "succeed")
    assert _drive(lambda: _state(job, "succeeded", "failed")).state == "succeeded"


def test_tensorboard_gets_a_service_and_an_ingress_while_the_job_lives(platform, admin, settings, celery_worker_thread):
    """The route's Service and Ingress are accepted by the real API server (the platform's RBAC), the Service
    selects the job's pod, the TensorBoard native sidecar runs beside the trainer; the route goes when the job
    ends."""
    from jobs import tensorboard
    from jobs.backends import get_backend, reset_backends
    from jobs.backends import volcano_render as render
    from jobs.models import TensorBoardRoute

    settings.TRAINYARD_TB_BASE_DOMAIN = "tb.example.org"
    settings.TRAINYARD_TB_GRACE_S = 0
    reset_backends()
    job = submit(platform["user"], tensorboard=True)
    route = _drive(lambda: TensorBoardRoute.objects.filter(job=job, state="active").first())
    _drive(lambda: _state(job, "running"))
    name = render.tensorboard_name(str(job.id))
    net = k8s.NetworkingV1Api(admin["api"])
    assert route.host == f"{name}.tb.example.org"
    backend = get_backend()  # with the domain set above
    assert backend.tensorboard_expose(job_id=str(job.id), namespace=TEAM_NS) == route.host  # 409: kept
    assert net.read_namespaced_ingress(name, TEAM_NS).spec.rules[0].host == route.host
    service = admin["core"].read_namespaced_service(name, TEAM_NS)
    [pod] = _attempt_pods(admin, job)
    assert all(pod["metadata"]["labels"].get(k) == v for k, v in service.spec.selector.items())
    [sidecar] = [c for c in pod["spec"].get("initContainers", []) if c["command"][0] == "tensorboard"]
    assert sidecar["restartPolicy"] == "Always"
    statuses = {s["name"]: s for s in pod["status"].get("initContainerStatuses", [])}
    assert "running" in statuses[sidecar["name"]]["state"]  # a native sidecar, running next to the trainer

    lifecycle.job_cancel(job_id=job.id, actor="demo")
    _drive(lambda: _state(job, "cancelled"))
    assert tensorboard.routes_reap() == 1  # grace period 0: revoked at once
    with pytest.raises(ApiException) as gone:
        net.read_namespaced_ingress(name, TEAM_NS)
    assert gone.value.status == 404
    with pytest.raises(ApiException) as gone:
        admin["core"].read_namespaced_service(name, TEAM_NS)
    assert gone.value.status == 404
    backend.tensorboard_remove(job_id=str(job.id), namespace=TEAM_NS)  # 404: already gone


def test_the_checkpoint_sidecar_runs_natively_and_what_it_publishes_is_recorded(
    platform, admin, checkpoint_store, settings, tmp_path, celery_worker_thread
):
    """With an object store the pod gets the checkpoint uploader as a native sidecar (an init container with
    restartPolicy Always, which Kubernetes 1.29+ accepts and runs beside the trainer); the sidecar's own code,
    publishing to the real store for that attempt, is what the platform's observer records."""
    from jobs.backends import checkpoint_sync, reset_backends
    from jobs.backends import volcano_render as render
    from jobs.models import Checkpoint

    reset_backends()  # the render options read the store settings the fixture set
    job = submit(platform["user"])
    _drive(lambda: _state(job, "running"))
    [pod] = _attempt_pods(admin, job)
    sidecar = next(c for c in pod["spec"]["initContainers"] if c["name"] == render.CHECKPOINT_SIDECAR)
    assert sidecar["restartPolicy"] == "Always"
    statuses = {s["name"]: s for s in pod["status"]["initContainerStatuses"]}
    assert "running" in statuses[render.CHECKPOINT_SIDECAR]["state"]
    assert "running" in pod["status"]["containerStatuses"][0]["state"]
    conf = json.loads(next(e["value"] for e in sidecar["env"] if e["name"] == "TRAINYARD_CHECKPOINT_SPEC"))
    assert conf["prefix"] == f"demo/{job.id}/attempt-1/"
    folder, state = tmp_path / "pod-checkpoints", tmp_path / "pod-state"
    folder.mkdir()
    state.mkdir()
    (folder / "step-300.pt").write_bytes(b"from-the-pod")
    sync = checkpoint_sync.SidecarSync(state, {**conf, "dir": str(folder), "store": checkpoint_store.to_dict()})
    assert sync.sync_once(final=True)
    saved = _drive(lambda: Checkpoint.objects.filter(job=job, name="step-300.pt").first())
    assert saved.step == 300 and saved.size_bytes == len(b"from-the-pod") and saved.attempt.number == 1
    _outcome(admin, job, "succeed")
    assert _drive(lambda: _state(job, "succeeded", "failed")).state == "succeeded"


CACHE_CLASS = "trainyard-kwok-cache"


@contextlib.contextmanager
def cache_volume(admin, claim: str):
    """A volume for the dataset cache claim `claim` (no provisioner runs here); the claim, its fill Job and the
    volume removed after."""
    volume = f"{claim}-{int(time.time())}"
    admin["core"].create_persistent_volume({
        "metadata": {"name": volume},
        "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": CACHE_CLASS,
                 "persistentVolumeReclaimPolicy": "Delete", "hostPath": {"path": f"/tmp/{volume}"},
                 "claimRef": {"namespace": TEAM_NS, "name": claim}},
    })  # fmt: skip
    try:
        yield volume
    finally:
        try:
            k8s.BatchV1Api(admin["api"]).delete_namespaced_job(claim, TEAM_NS, propagation_policy="Background")
        except ApiException:
            pass
        try:
            admin["core"].delete_namespaced_persistent_volume_claim(claim, TEAM_NS)
        except ApiException as exc:
            if exc.status != 404:
                raise
        try:
            admin["core"].delete_persistent_volume(volume)
        except ApiException as exc:
            # Its reclaim policy is Delete: the controller manager may have removed it once the claim went (seen
            # with Kubernetes v1.29's).
            if exc.status != 404:
                raise


def held_by_dataset_waiter(pod: dict) -> bool:
    """The trainer's dataset waiter runs (kwok's dataset-wait Stage) and the trainer has not started."""
    inits = {s["name"]: s for s in (pod.get("status") or {}).get("initContainerStatuses") or []}
    main = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return "running" in (inits.get("dataset-0") or {}).get("state", {}) and "waiting" in main[0].get("state", {})


def trainers_held(admin, job) -> list[dict]:
    """The attempt's pods once there are some and every one is held by its dataset waiter (else [])."""
    attempt = reload(job).attempts.order_by("-number").first()
    if attempt is None or not attempt.backend_ref:
        return []
    pods = _attempt_pods(admin, job)
    return pods if pods and all(held_by_dataset_waiter(p) for p in pods) else []


def release_dataset_waiters(admin, job) -> None:
    """The cache is filled: the waiters end and the trainers start (kwok's `filled` annotation)."""
    for pod in _pods(admin, job):
        body = {"metadata": {"annotations": {"kwok.trainyard.io/filled": "true"}}}
        admin["core"].patch_namespaced_pod(pod.metadata.name, TEAM_NS, body)


def imagenet_dataset():
    """The registered dataset the dataset tests submit with (its shared cache claim is `ty-dataset-<id>-v1`)."""
    from jobs.models import Dataset
    from quotas.models import Team

    return Dataset.objects.create(
        team=Team.objects.get(slug="demo"), name="imagenet", version=1, size_bytes=5 * 1024**3, file_count=10,
        s3_prefix="datasets/imagenet/1/",
    )  # fmt: skip


def uploaded_code(user, tmp_path) -> tuple[str, bytes]:
    """A one-file project packed as `trainyard submit --code` packs it and uploaded through the REST API for the
    demo team; returns its digest and the archive's bytes."""
    from rest_framework.test import APIClient
    from trainyard_cli.code import pack

    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text("print('hi')\n")
    data, digest, _ = pack(folder)
    api = APIClient()
    api.force_authenticate(user)
    assert api.put(f"/api/v1/code/{digest}/?team=demo", data=data, content_type="application/gzip").status_code == 201
    return digest, data


def test_a_dataset_gets_its_shared_claim_and_a_fill_job_that_runs_before_the_trainer(
    platform, admin, settings, celery_worker_thread
):
    """The dataset's cache claim binds (to a volume made here: no provisioner runs), kube-scheduler places the
    fill Job's pod (restricted PodSecurity accepts it), the Job completes while the trainer's waiter holds it;
    once the cache is filled the trainer starts with the claim mounted."""
    from jobs.backends import reset_backends
    from jobs.backends import volcano_render as render

    settings.TRAINYARD_S3_URL = "http://s3.storage.svc:8333"
    settings.TRAINYARD_DATASET_CACHE_STORAGE_CLASS = CACHE_CLASS
    reset_backends()
    dataset = imagenet_dataset()
    claim = f"ty-dataset-{dataset.id}-v1"
    batch = k8s.BatchV1Api(admin["api"])
    with cache_volume(admin, claim):
        job = submit(platform["user"], datasets=[{"name": "imagenet", "path": "/data"}])
        _drive(lambda: trainers_held(admin, job), timeout=120)
        pvc = admin["core"].read_namespaced_persistent_volume_claim(claim, TEAM_NS)
        assert pvc.status.phase == "Bound" and pvc.spec.storage_class_name == CACHE_CLASS
        fill = batch.read_namespaced_job(claim, TEAM_NS)
        _drive_plain(lambda: (batch.read_namespaced_job(claim, TEAM_NS).status.succeeded or 0) == 1, timeout=60)
        assert fill.spec.template.spec.volumes[0].persistent_volume_claim.claim_name == claim
        assert reload(job).state != "running"  # the trainer waits for its waiter
        release_dataset_waiters(admin, job)
        job = _drive(lambda: _state(job, "running"), timeout=60)
        [pod] = _attempt_pods(admin, job)
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["dataset-0"]["persistentVolumeClaim"] == {"claimName": claim, "readOnly": True}
        waiter = next(c for c in pod["spec"]["initContainers"] if c["name"] == "dataset-0")
        assert waiter["command"][:4] == ["python", "-m", "jobs.backends.dataset_cache", "wait"]
        assert render.ANNOTATION_DATASET_FILLS in _vcjob_of(admin, job)["metadata"]["annotations"]
        _outcome(admin, job, "succeed")
        assert _drive(lambda: _state(job, "succeeded", "failed")).state == "succeeded"


def test_a_jobs_log_is_read_from_the_pods_through_the_api_server(platform, admin, celery_worker_thread):
    """The trainer's log comes from `pods/log` (the platform's RBAC, the API server proxying to the node's
    kubelet endpoint; kwok answers with its stand-in line) into the log store."""
    from jobs import logstore

    job = submit(platform["user"])
    _drive(lambda: _state(job, "running"))
    _outcome(admin, job, "succeed")
    job = _drive(lambda: _state(job, "succeeded", "failed"))
    assert job.state == "succeeded"
    lines = [line.text for line in logstore.read_lines(logstore.attempt_dir(str(job.id), 1))[0]]
    assert any("kwok: no container runs on this fake node" in text for text in lines), lines


def test_stderr_tagged_by_the_wrapper_is_kept_apart_and_pushed_when_the_job_fails(
    platform, admin, celery_worker_thread
):
    """The trainer runs under ty-exec (jobs/backends/tyexec), which writes each stderr line behind a tag into the
    pod's one merged log. kwok runs no container: its stand-in log (the CRI file kwok serves for every container)
    gets the lines ty-exec would write, stderr tagged. Read through the API server, the tagged lines alone are the
    attempt's stderr (`?stream=stderr`), and the failure push quotes them."""
    from datetime import UTC, datetime

    from django.test import Client
    from rest_framework.test import APIClient

    from jobs.backends import volcano_render as render
    from monitoring import services
    from monitoring.models import Notification
    from monitoring.services import push

    stand_in = CLUSTER_DIR / "kwok-container.log"
    kept = stand_in.read_bytes()
    stdout = ["epoch 1 step 1", "epoch 1 step 2"]
    stderr = ["Traceback (most recent call last):", "ValueError: learning rate must be positive"]
    lines = [("stdout", stdout[0]), ("stderr", stderr[0]), ("stdout", stdout[1]), ("stderr", stderr[1])]
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    tagged = "".join(
        f"{stamp} {stream} F {render.STDERR_TAG if stream == 'stderr' else ''}{text}\n" for stream, text in lines
    )
    try:
        stand_in.write_bytes(kept + tagged.encode())
        job = submit(platform["user"])
        _drive(lambda: _state(job, "running"))
        [pod] = _attempt_pods(admin, job)
        [trainer] = pod["spec"]["containers"]
        assert trainer["command"][:2] == ["/.trainyard-exec/ty-exec", "--"]  # as the API server stored the pod
        assert "ty-exec" in [c["name"] for c in pod["spec"]["initContainers"]]
        _outcome(admin, job, "fail", **{"kwok.trainyard.io/exit-code": "1"})
        job = _drive(lambda: _state(job, "failed", "succeeded", "pending"))
    finally:
        stand_in.write_bytes(kept)
    attempt = job.attempts.get()
    assert job.state == "failed" and attempt.failure_class == "user"

    owner = APIClient()
    owner.force_authenticate(platform["user"])
    merged = [x["text"] for x in owner.get(f"/api/v1/jobs/{job.id}/logs/").json()["lines"]]
    assert [t for t in merged if t in stdout + stderr] == [text for _, text in lines]  # in order, tags stripped
    assert not any(render.STDERR_TAG in t for t in merged)
    alone = owner.get(f"/api/v1/jobs/{job.id}/logs/", {"stream": "stderr"}).json()
    assert [x["text"] for x in alone["lines"]] == stderr and alone["stderr_lines"] == 2

    portal = Client()
    portal.force_login(platform["user"])
    shown = portal.get(f"/jobs/{job.id}/logs/download/", {"attempt": 1, "stream": "stderr"}).content.decode()
    assert all(text in shown for text in stderr) and not any(text in shown for text in stdout)

    assert push.last_stderr(attempt) == ("stderr", stderr)
    assert services.failures_push() == 1
    note = Notification.objects.get(user=platform["user"])
    assert "ValueError: learning rate must be positive" in note.message and "epoch 1 step" not in note.message


def test_a_guaranteed_jobs_pods_are_of_the_guaranteed_qos_class_as_the_api_server_computes_it(
    platform, admin, celery_worker_thread
):
    """The API server, not the renderer, decides a pod's QoS class (`status.qosClass`, set when the pod is created):
    a guaranteed job's pods, init containers and all (the stderr wrapper's installer too), are Guaranteed, with whole
    cores on the trainer, what the kubelet's static CPU manager pins. (kwok's nodes offer no GPU shares: a shared
    job cannot be placed here.)"""
    from kubernetes.utils import parse_quantity

    job = submit(platform["user"], spec="guaranteed")
    _drive(lambda: _state(job, "running"))
    pods = _pods(admin, job)
    assert pods and [p.status.qos_class for p in pods] == ["Guaranteed"] * len(pods)
    for pod in pods:
        assert "ty-exec" in [c.name for c in pod.spec.init_containers]
        [trainer] = pod.spec.containers
        cpu = parse_quantity(trainer.resources.requests["cpu"])
        assert cpu == int(cpu) and trainer.resources.limits["cpu"] == trainer.resources.requests["cpu"]
    _outcome(admin, job, "succeed")
    assert _drive(lambda: _state(job, "succeeded", "failed")).state == "succeeded"


KWOK_NODE_LABEL = "kwok.x-k8s.io/node"


def _recreate_node(admin, body: dict) -> None:
    """Put a deleted kwok node back as `make cluster` made it (managed by kwok again), and wait until it is Ready."""
    meta = body["metadata"]
    body["metadata"] = {k: meta[k] for k in ("name", "labels", "annotations") if k in meta}
    body["metadata"]["labels"][KWOK_NODE_LABEL] = "fake"
    # What a kubelet registers with (and `make cluster` creates): without it the node would have no allocatable.
    body["status"] = {k: body["status"][k] for k in ("capacity", "allocatable")}
    body["spec"] = {k: v for k, v in (body.get("spec") or {}).items() if k not in ("taints", "unschedulable")}
    admin["core"].create_node(body)
    name = meta["name"]
    _drive_plain(lambda: any(
        c.type == "Ready" and c.status == "True" for c in admin["core"].read_node(name).status.conditions or []
    ), timeout=60)  # fmt: skip


def _delete_build_objects(admin, name: str) -> None:
    """What a build test may leave in `trainyard-builds`: its Job (and so its pod), its ConfigMap and push Secret."""
    batch = k8s.BatchV1Api(admin["api"])
    for fn in (batch.delete_namespaced_job, admin["core"].delete_namespaced_config_map,
               admin["core"].delete_namespaced_secret):  # fmt: skip
        try:
            fn(name, "trainyard-builds", propagation_policy="Background")
        except ApiException:
            pass


def _selector(selector: dict) -> str:
    """A LabelSelector as a label-selector query, so that the API server says which pods it picks."""
    words = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], ",".join(expr.get("values") or [])
        words.append({"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": key,
                      "DoesNotExist": f"!{key}"}[op])  # fmt: skip
    return ",".join(words)


def _apply_as_admin(api, path) -> list[dict]:
    """Create the objects of a k8s/ file as the admin would (`kubectl apply`); one already there is kept."""
    import yaml
    from kubernetes import utils

    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        try:
            utils.create_from_dict(api, doc)
        except utils.FailToCreateError as exc:
            if any(e.status != 409 for e in exc.api_exceptions):
                raise
    return docs


def test_an_image_build_runs_as_a_kubernetes_job_whose_pod_is_found_by_its_job_name_label(
    real_cluster,
    admin,
    settings,
    images_env,  # noqa: F811
    build_root,
    transactional_db,
):
    """The build's ConfigMap and Job are accepted in the builds namespace (the platform's Role there),
    kube-scheduler places the pod, the platform finds it by `batch.kubernetes.io/job-name` (1.27+), reads its log
    through the API server, and records the digest the build pushed. With TRAINYARD_BUILD_NETWORK=allowlist: the
    API server holds the builds' NetworkPolicies (`make cluster` applies k8s/build-network.yaml) and the build proxy
    of k8s/build-proxy.yaml (its pods admitted under the platform namespace's "restricted" Pod Security), and its
    own label queries say which of them pick the build pod. No CNI runs here: what is checked is what the policies
    select, not that a packet is dropped."""
    from images import k8s_build, registry, services
    from images.tests.test_builds import define_base
    from images.tests.test_k8s_build import push_as_buildkit

    settings.TRAINYARD_IMAGE_BUILDER = "kubernetes"
    settings.TRAINYARD_K8S_KUBECONFIG = real_cluster["kubeconfig"]
    settings.TRAINYARD_K8S_API_URL = ""
    settings.TRAINYARD_K8S_BUILD_NAMESPACE = "trainyard-builds"
    settings.TRAINYARD_BUILD_NETWORK = "allowlist"
    networking, apps = k8s.NetworkingV1Api(admin["api"]), k8s.AppsV1Api(admin["api"])
    proxy_docs = _apply_as_admin(admin["api"], BASE_DIR / "k8s" / "build-proxy.yaml")
    base = define_base(images_env)
    build = services.build_request(image=base)
    digest = push_as_buildkit(build_root, build)  # what BuildKit would push (no container runs on kwok)
    name = k8s_build.build_name(build.pk)
    batch = k8s.BatchV1Api(admin["api"])
    try:
        build = services.build_run(build_id=build.pk)
        assert build.status == "running" and f"created build Job trainyard-builds/{name}" in build.log
        _drive_plain(lambda: (batch.read_namespaced_job(name, "trainyard-builds").status.succeeded or 0) == 1,
                     timeout=60)  # fmt: skip
        (pod,) = (
            admin["core"]
            .list_namespaced_pod("trainyard-builds", label_selector=f"batch.kubernetes.io/job-name={name}")
            .items
        )
        assert pod.metadata.labels[k8s_build.NETWORK_LABEL] == "allowlist"
        args = pod.spec.containers[0].args
        assert f"build-arg:https_proxy={settings.TRAINYARD_K8S_BUILD_PROXY_URL}" in args
        picking = set()
        for policy in networking.list_namespaced_network_policy("trainyard-builds").items:
            query = _selector(admin["api"].sanitize_for_serialization(policy.spec.pod_selector))
            picked = admin["core"].list_namespaced_pod("trainyard-builds", label_selector=query).items
            if pod.metadata.name in {p.metadata.name for p in picked}:
                picking.add(policy.metadata.name)
        assert picking == {"trainyard-builds-default-deny", "trainyard-builds-dns", "trainyard-builds-registry",
                           "trainyard-builds-proxy"}, picking  # fmt: skip
        # The proxy's own policy lets this pod in; its Deployment's pods pass "restricted" Pod Security.
        proxy_policy = networking.read_namespaced_network_policy("trainyard-build-proxy", "trainyard")
        peer = admin["api"].sanitize_for_serialization(proxy_policy.spec.ingress[0]._from[0])
        query = _selector(peer["podSelector"])
        assert pod.metadata.name in {
            p.metadata.name for p in admin["core"].list_namespaced_pod("trainyard-builds", label_selector=query).items
        }
        assert admin["core"].read_namespaced_service("trainyard-build-proxy", "trainyard").spec.ports[0].port == 3128
        component = "app.kubernetes.io/component=build-proxy"
        _drive_plain(lambda: len(admin["core"].list_namespaced_pod("trainyard", label_selector=component).items) == 2,
                     timeout=60)  # fmt: skip
        refused = [
            c.message for rs in apps.list_namespaced_replica_set("trainyard", label_selector=component).items
            for c in rs.status.conditions or [] if c.type == "ReplicaFailure"
        ]  # fmt: skip
        assert refused == []
        deadline = time.monotonic() + 60
        while build.status == "running" and time.monotonic() < deadline:
            time.sleep(0.5)
            build = services.build_run(build_id=build.pk)
        assert build.status == "succeeded", build.log
        assert build.digest == digest and registry.resolve(build.reference) == digest
        assert {"type": "deb", "name": "libssl3", "version": "3.0.11-1~deb12u1"} in build.sbom  # read back
        # The pod's log, read through the API server from the pod the label found.
        assert "kwok: no container runs on this fake node" in build.log
        # The finished build's Job, ConfigMap and push Secret are deleted by the platform.
        for read in (batch.read_namespaced_job, admin["core"].read_namespaced_config_map,
                     admin["core"].read_namespaced_secret):  # fmt: skip
            with pytest.raises(ApiException) as gone:
                read(name, "trainyard-builds")
            assert gone.value.status == 404, read
    finally:
        _delete_build_objects(admin, name)
        for doc in proxy_docs:
            fn = {"Deployment": apps.delete_namespaced_deployment, "Service": admin["core"].delete_namespaced_service,
                  "NetworkPolicy": networking.delete_namespaced_network_policy}[doc["kind"]]  # fmt: skip
            try:
                fn(doc["metadata"]["name"], "trainyard", propagation_policy="Background")
            except ApiException:
                pass
