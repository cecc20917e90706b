# ruff: noqa: F811 - the real-cluster fixtures are imported from test_real_cluster and used as arguments
"""Job pod hardening on the real control plane of `make cluster`: every job pod asks for the runtime's default
AppArmor profile in the form the cluster's release takes, and a queue's runtime_class (a sandboxed runtime for
sensitive work) is checked against the cluster's RuntimeClasses in the admin console and lands on the job's pods."""

from __future__ import annotations

import pytest
from django.test import Client
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from quotas.tests.test_admin import change_url, form_data
from tests.k8s.test_real_cluster import _drive, _pods, _state, admin, platform  # noqa: F401
from tests.k8s.test_team_namespaces import rbac_of_this_checkout  # noqa: F401

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_queues_runtime_class_is_checked_against_the_cluster_and_reaches_the_pods(
    platform, admin, rbac_of_this_checkout, celery_worker_thread
):
    from jobs.tests.test_volcano_backend import submit
    from quotas.models import Queue

    nodes = k8s.NodeV1Api(admin["api"])
    nodes.create_runtime_class({"metadata": {"name": "kata-test"}, "handler": "kata"})
    try:
        queue = Queue.objects.get(name="train")
        # Seeded from the real inventory the queue's GPU memory is not a whole number of MiB-thousandths of a GiB,
        # which the console's GiB field cannot send back unchanged (noticed, not fixed here): round it first.
        Queue.objects.filter(pk=queue.pk).update(gpu_memory_mib=queue.gpu_memory_mib // 1024 * 1024)
        staff = Client()
        assert staff.login(username="admin", password="admin-pass-123")
        page = staff.get(change_url(queue))
        refused = staff.post(change_url(queue), {**form_data(page), "runtime_class": "gvisor"})
        assert refused.status_code == 200
        errors = refused.context["adminform"].form.errors["runtime_class"]
        assert "the cluster has no RuntimeClass 'gvisor'" in errors[0] and "kata-test" in errors[0], errors
        assert Queue.objects.get(pk=queue.pk).runtime_class == ""
        saved = staff.post(change_url(queue), {**form_data(page), "runtime_class": "kata-test"})
        assert saved.status_code == 302, saved.context["adminform"].form.errors if saved.status_code == 200 else ""
        assert Queue.objects.get(pk=queue.pk).runtime_class == "kata-test"
        job = submit(platform["user"])
        _drive(lambda: _state(job, "running"), timeout=120)
        (pod,) = _pods(admin, job)
        assert pod.spec.runtime_class_name == "kata-test"
        # In the form the cluster's releases take: the field from Kubernetes 1.30 under Volcano 1.12, else the
        # per-container annotation (what the API server of 1.29 keeps; the field it would drop).
        from jobs.backends import volcano_render as render

        version = k8s.VersionApi(admin["api"]).get_code()
        kubernetes = (int(version.major), int("".join(c for c in version.minor if c.isdigit())))
        volcano = tuple(platform["backend"].volcano_version())
        if kubernetes >= render.APPARMOR_FIELD_SINCE and volcano >= render.APPARMOR_FIELD_SINCE_VOLCANO:
            assert pod.spec.security_context.app_armor_profile.type == "RuntimeDefault"
        else:
            names = [c.name for c in [*(pod.spec.init_containers or []), *pod.spec.containers]]
            annotations = pod.metadata.annotations or {}
            assert all(annotations.get(render.APPARMOR_ANNOTATION + n) == "runtime/default" for n in names), annotations
    finally:
        try:
            nodes.delete_runtime_class("kata-test")
        except ApiException as exc:
            if exc.status != 404:
                raise


def test_a_dedicated_pools_tainted_node_runs_its_queues_jobs_and_no_other(platform, admin, settings,
                                                                          celery_worker_thread):  # fmt: skip
    """The operator taints a node of a dedicated pool (docs/pools.md); the platform places only the bound queue's
    jobs there, and their pods carry the toleration, so Volcano binds them to it; another queue's job goes
    elsewhere."""
    from cluster.inventory import POOL_LABEL
    from jobs.tests.test_volcano_backend import submit
    from quotas.models import Queue

    secure = "kwok-gpu-0"
    settings.TRAINYARD_DEDICATED_POOLS = ["secure"]
    staff = Client()
    assert staff.login(username="admin", password="admin-pass-123")
    moved = staff.post(f"/api/v1/nodes/{secure}/move/", {"pool": "secure"}, content_type="application/json")
    assert moved.status_code == 200, moved.content
    taint = {"key": POOL_LABEL, "value": "secure", "effect": "NoSchedule"}
    admin["core"].patch_node(secure, {"spec": {"taints": [taint]}})
    try:
        Queue.objects.filter(name="train").update(pools=["secure"])
        kept = submit(platform["user"])
        _drive(lambda: _state(kept, "running"), timeout=120)
        (pod,) = _pods(admin, kept)
        assert pod.spec.node_name == secure
        assert any((t.key, t.value, t.effect) == (POOL_LABEL, "secure", "NoSchedule") for t in pod.spec.tolerations)
        other = submit(platform["user"], queue="distributed")  # bound to every pool
        _drive(lambda: _state(other, "running"), timeout=120)
        (pod,) = _pods(admin, other)
        assert pod.spec.node_name != secure
        assert not any(t.key == POOL_LABEL for t in pod.spec.tolerations or [])
    finally:
        admin["core"].patch_node(secure, {"spec": {"taints": None}})
