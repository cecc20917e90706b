# ruff: noqa: F811 - the real-cluster fixtures are imported from test_real_cluster and used as arguments
"""Team namespaces kept by the platform, on the real control plane of `make cluster` (kube-apiserver with RBAC,
PodSecurity and ResourceQuota admission, the quota controller): a team made in the admin console gets its namespace,
quota, limits, RoleBinding and NetworkPolicies, made by the platform's own service account as bound by
k8s/rbac.yaml; a deleted quota comes back at the next beat pass; a pod over the quota is refused by the API server
and the job says so. The admin kubeconfig only sets the scene and inspects.
"""

from __future__ import annotations

import base64
import json
import time
import uuid

import pytest
import yaml
from django.conf import settings
from django.test import Client
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from kubernetes.dynamic import DynamicClient

from kernel.paths import BASE_DIR
from tests.k8s.test_real_cluster import TEAM_NS, _drive, _state, admin, platform  # noqa: F401

PULL = "trainyard-registry-pull"  # the team's registry pull Secret

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def rbac_of_this_checkout(admin):
    """k8s/rbac.yaml as this checkout has it (a cluster started from an older one may hold older rules)."""
    dynamic = DynamicClient(admin["api"])
    for doc in yaml.safe_load_all((BASE_DIR / "k8s" / "rbac.yaml").read_text()):
        if doc:
            resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            resource.server_side_apply(body=doc, field_manager="trainyard-tests", force_conflicts=True)


def _wait(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError("condition not met in time")


def _read(fn, *args):
    try:
        return fn(*args)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _drop_namespace(admin, name):
    try:
        admin["core"].delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _managed_objects_removed(admin, namespace):
    """The shared demo namespace as the other real-cluster tests expect it: no quota, no limits of ours."""
    core, net = admin["core"], k8s.NetworkingV1Api(admin["api"])
    for quota in core.list_namespaced_resource_quota(namespace).items:
        core.delete_namespaced_resource_quota(quota.metadata.name, namespace)
    for limits in core.list_namespaced_limit_range(namespace).items:
        core.delete_namespaced_limit_range(limits.metadata.name, namespace)
    for policy in net.list_namespaced_network_policy(namespace).items:
        net.delete_namespaced_network_policy(policy.metadata.name, namespace)


def test_a_team_made_in_the_admin_console_gets_its_namespace(
    platform,
    admin,
    rbac_of_this_checkout,
    celery_worker_thread,
):
    from quotas.models import Team

    namespace = f"trainyard-vision-{uuid.uuid4().hex[:6]}"
    staff = Client()
    assert staff.login(username="admin", password="admin-pass-123")
    page = staff.get("/admin/quotas/team/add/")
    form = {
        "name": "Vision", "slug": "vision", "namespace": namespace, "gpu_milli": "2", "gpu_memory_mib": "160",
        "cpu_milli": "16", "memory_mib": "128", "max_running_jobs": "3", "max_jobs_per_user": "2",
        "storage_quota_bytes": "0", "checkpoint_keep_last": "5", "checkpoint_retention_days": "30",
        "code_quota_bytes": str(2 << 30), "code_retention_days": "30",
    }  # fmt: skip
    for inline in page.context["inline_admin_formsets"]:
        management = inline.formset.management_form
        for name in management.fields:
            form[f"{inline.formset.prefix}-{name}"] = management[name].value()
    response = staff.post("/admin/quotas/team/add/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Team.objects.filter(namespace=namespace).exists()
    core, rbac = admin["core"], k8s.RbacAuthorizationV1Api(admin["api"])
    net = k8s.NetworkingV1Api(admin["api"])
    try:
        quota = _wait(lambda: _read(core.read_namespaced_resource_quota, "trainyard-quota", namespace), timeout=60)
        labels = core.read_namespace(namespace).metadata.labels
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
        assert labels["trainyard.io/team"] == "vision" and labels["app.kubernetes.io/managed-by"] == "trainyard"
        hard = quota.spec.hard
        # 2 cards: 2 whole, or 8 time-sliced shares; pods = 8 shares + 3 jobs; CPU and memory plus the sidecars'.
        assert (hard["requests.nvidia.com/gpu"], hard["requests.nvidia.com/gpu.shared"], hard["pods"]) == (
            "2", "8", "11",
        )  # fmt: skip
        assert hard["requests.cpu"] == "20400m" and hard["requests.memory"] == "139Gi"  # 131072Mi + 11 x 1Gi
        limits = _wait(lambda: _read(core.read_namespaced_limit_range, "trainyard-limits", namespace))
        assert limits.spec.limits[0].max == {"cpu": "16", "memory": "128Gi"}
        binding = rbac.read_namespaced_role_binding("trainyard-team", namespace)
        assert binding.role_ref.name == "trainyard-team"
        assert [(s.kind, s.namespace, s.name) for s in binding.subjects] == [("ServiceAccount", "trainyard",
                                                                             "trainyard")]  # fmt: skip
        policies = {p.metadata.name for p in net.list_namespaced_network_policy(namespace).items}
        assert policies == {"trainyard-default-deny", "trainyard-job-peers", "trainyard-tensorboard"}
        # The platform's own account may now run jobs there (the RoleBinding it made itself).
        review = k8s.AuthorizationV1Api(platform["backend"].api_client).create_self_subject_access_review(
            {"spec": {"resourceAttributes": {"verb": "create", "group": "batch.volcano.sh", "resource": "jobs",
                                             "namespace": namespace}}}
        )  # fmt: skip
        assert review.status.allowed is True
        # A quota change in the API is pushed too.
        staff.logout()
        from django.contrib.auth import get_user_model
        from rest_framework.test import APIClient

        api = APIClient()
        api.force_authenticate(get_user_model().objects.get(username="admin"))
        assert api.patch("/api/v1/teams/vision/quota/", {"gpu_milli": 4000}, format="json").status_code == 200
        _wait(lambda: core.read_namespaced_resource_quota("trainyard-quota", namespace).spec.hard[
            "requests.nvidia.com/gpu"] == "4", timeout=60)  # fmt: skip
    finally:
        _drop_namespace(admin, namespace)


def test_drift_is_repaired_by_the_beat_pass(platform, admin, rbac_of_this_checkout):
    from jobs.tasks import sync_team_namespaces
    from quotas.models import Team

    namespace = f"trainyard-drift-{uuid.uuid4().hex[:6]}"
    Team.objects.create(name="Drift", slug="drift", namespace=namespace, gpu_milli=1000, cpu_milli=4000,
                        memory_mib=8192, gpu_memory_mib=81559)  # fmt: skip
    core = admin["core"]
    try:
        made = sync_team_namespaces()
        assert "created ResourceQuota trainyard-quota" in made[namespace]
        assert namespace not in sync_team_namespaces()  # nothing drifted: nothing written
        core.delete_namespaced_resource_quota("trainyard-quota", namespace)
        core.patch_namespaced_limit_range("trainyard-limits", namespace, {"spec": {"limits": [
            {"type": "Container", "max": {"cpu": "500"}}]}})  # fmt: skip
        core.patch_namespace(namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}})
        repaired = sync_team_namespaces()[namespace]
        assert sorted(repaired) == [
            "created ResourceQuota trainyard-quota",
            "repaired LimitRange trainyard-limits (spec)",
            f"repaired Namespace {namespace} (labels)",
        ]
        assert core.read_namespaced_resource_quota("trainyard-quota", namespace).spec.hard["requests.nvidia.com/gpu"]
        assert core.read_namespace(namespace).metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"
        assert core.read_namespaced_limit_range("trainyard-limits", namespace).spec.limits[0].max["cpu"] == "4"
        # A NetworkPolicy that lets every pod talk and a RoleBinding for another subject are replaced (update);
        # a RoleBinding to another role is made again (its roleRef cannot change: delete and create).
        networking, rbac = k8s.NetworkingV1Api(admin["api"]), k8s.RbacAuthorizationV1Api(admin["api"])
        policy = networking.read_namespaced_network_policy("trainyard-default-deny", namespace)
        policy.spec.pod_selector = k8s.V1LabelSelector(match_labels={"only": "these"})
        networking.replace_namespaced_network_policy("trainyard-default-deny", namespace, policy)
        binding = rbac.read_namespaced_role_binding("trainyard-team", namespace)
        subjects = binding.subjects
        binding.subjects = [k8s.RbacV1Subject(kind="ServiceAccount", name="default", namespace=namespace)]
        rbac.replace_namespaced_role_binding("trainyard-team", namespace, binding)
        assert sorted(sync_team_namespaces()[namespace]) == [
            "repaired NetworkPolicy trainyard-default-deny (spec)",
            "repaired RoleBinding trainyard-team (subjects)",
        ]
        policy = networking.read_namespaced_network_policy("trainyard-default-deny", namespace)
        assert not policy.spec.pod_selector.match_labels
        assert rbac.read_namespaced_role_binding("trainyard-team", namespace).subjects == subjects
        binding = rbac.read_namespaced_role_binding("trainyard-team", namespace)
        rbac.delete_namespaced_role_binding("trainyard-team", namespace)
        binding.metadata = k8s.V1ObjectMeta(name="trainyard-team", labels=binding.metadata.labels)
        binding.role_ref = k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="view")
        rbac.create_namespaced_role_binding(namespace, binding)
        assert sync_team_namespaces()[namespace] == ["repaired RoleBinding trainyard-team (roleRef)"]
        assert rbac.read_namespaced_role_binding("trainyard-team", namespace).role_ref.name == "trainyard-team"
        # The team's registry pull credential (with the platform's token service): its own, made again when lost,
        # its data put back when changed (update), made again when its type changed (immutable).
        assert settings.TRAINYARD_REGISTRY_TOKEN_KEY and settings.TRAINYARD_REGISTRY_URL
        secret = core.read_namespaced_secret(PULL, namespace)
        assert secret.type == "kubernetes.io/dockerconfigjson"
        auths = json.loads(base64.b64decode(secret.data[".dockerconfigjson"]))["auths"]
        assert [a["username"] for a in auths.values()] == ["team.drift"]
        core.delete_namespaced_secret(PULL, namespace)
        assert sync_team_namespaces()[namespace] == ["created Secret trainyard-registry-pull"]
        good = core.read_namespaced_secret(PULL, namespace).data
        core.patch_namespaced_secret(PULL, namespace, {"data": {".dockerconfigjson": "e30="}})
        assert sync_team_namespaces()[namespace] == ["repaired Secret trainyard-registry-pull (data)"]
        secret = core.read_namespaced_secret(PULL, namespace)
        assert json.loads(base64.b64decode(secret.data[".dockerconfigjson"]))["auths"].keys() == auths.keys()
        labels = secret.metadata.labels
        core.delete_namespaced_secret(PULL, namespace)
        opaque = k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=PULL, labels=labels), type="Opaque", data=good)
        core.create_namespaced_secret(namespace, opaque)
        assert sync_team_namespaces()[namespace] == ["repaired Secret trainyard-registry-pull (type)"]
        assert core.read_namespaced_secret(PULL, namespace).type == "kubernetes.io/dockerconfigjson"
    finally:
        _drop_namespace(admin, namespace)
        _managed_objects_removed(admin, TEAM_NS)  # the pass kept the demo team's namespace too


def test_a_pod_over_the_team_namespace_quota_is_refused_and_the_job_says_so(
    platform,
    admin,
    rbac_of_this_checkout,
    celery_worker_thread,
):
    """Something outside the platform holds the team's cards in its namespace (a pod made by hand): the quota the
    platform wrote refuses the job's pod, and the job ends saying so, not retried, no card blamed."""
    from cluster.models import GPU
    from jobs.team_namespaces import team_namespaces_sync
    from jobs.tests.test_volcano_backend import submit
    from quotas.models import Team

    team = Team.objects.get(slug="demo")
    core = admin["core"]
    try:
        assert team_namespaces_sync(team_ids=[team.id])[TEAM_NS]
        cards = core.read_namespaced_resource_quota("trainyard-quota", TEAM_NS).spec.hard["requests.nvidia.com/gpu"]
        restricted = {
            "runAsNonRoot": True, "runAsUser": 1000, "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
        }  # fmt: skip
        foreign = {"metadata": {"name": "by-hand"}, "spec": {"nodeName": "nowhere", "containers": [{
            "name": "main", "image": "busybox:1", "securityContext": restricted,
            "resources": {"limits": {"nvidia.com/gpu": cards}, "requests": {"nvidia.com/gpu": cards}},
        }]}}  # fmt: skip
        _wait(lambda: core.read_namespaced_resource_quota("trainyard-quota", TEAM_NS).status.used is not None)
        core.create_namespaced_pod(TEAM_NS, foreign)
        job = submit(platform["user"])
        job = _drive(lambda: _state(job, "failed", "succeeded", "running"), timeout=120)
        attempt = job.attempts.get()
        assert (job.state, attempt.reason, attempt.reaction) == ("failed", "PodsRefused", "no_retry")
        assert "exceeded quota: trainyard-quota" in job.message, job.message
        assert not GPU.objects.filter(quarantined=True).exists()
    finally:
        try:
            core.delete_namespaced_pod("by-hand", TEAM_NS, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise
        _managed_objects_removed(admin, TEAM_NS)
