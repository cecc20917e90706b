"""A job's code snapshot on the real control plane (`make cluster`): the submission publishes it to a real object
store (SeaweedFS), and the real kube-apiserver (PodSecurity restricted), Volcano's webhooks and controllers accept
the job whose pods start with the code init container and mount /workspace. kwok's nodes run no containers, so
the fetch itself is not executed here (jobs/tests/test_k8s_code.py runs that code as a real process). Without an
object store a job with code is refused at submission."""

from __future__ import annotations

import pytest

from jobs import code
from jobs.tests.test_volcano_backend import submit
from kernel import objectstore
from tests.k8s.test_real_cluster import (  # noqa: F401 - fixtures
    _drive,
    _outcome,
    _pods,
    _state,
    admin,
    platform,
    uploaded_code,
)

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_job_with_code_gets_the_init_container_on_the_real_cluster(
    platform,  # noqa: F811
    admin,  # noqa: F811
    checkpoint_store,
    celery_worker_thread,
    tmp_path,
):
    from jobs.backends import reset_backends

    reset_backends()  # the render options read the store settings the fixture set
    digest, data = uploaded_code(platform["user"], tmp_path)
    job = submit(platform["user"], code=digest)
    stored = (
        objectstore.client(checkpoint_store)
        .get_object(Bucket=checkpoint_store.bucket, Key=code.store_key("demo", digest))["Body"]
        .read()
    )
    assert stored == data
    job = _drive(lambda: _state(job, "running", "failed"))
    assert job.state == "running", (job.state, job.reason, job.message)
    pods = _pods(admin, job)
    assert pods
    for pod in pods:
        first = pod.spec.init_containers[0]
        assert first.name == "code" and first.command[:3] == ["python", "-m", "jobs.backends.code_fetch"]
        trainer = pod.spec.containers[0]
        assert trainer.working_dir == "/workspace"
        assert any(m.name == "code" and m.mount_path == "/workspace" for m in trainer.volume_mounts)
    _outcome(admin, job, "succeed")
    job = _drive(lambda: _state(job, "succeeded", "failed"))
    assert job.state == "succeeded"


def test_without_an_object_store_a_kubernetes_job_with_code_is_refused(platform, settings, tmp_path):  # noqa: F811
    """The pods could not fetch the code: the submission is refused with a code that names the missing setting,
    and nothing reaches the cluster."""
    from rest_framework.test import APIClient

    from jobs.models import Job

    settings.TRAINYARD_S3_URL = ""
    digest, _ = uploaded_code(platform["user"], tmp_path)
    api = APIClient()
    api.force_authenticate(platform["user"])
    body = {"team": "demo", "queue": "train", "spec": "guaranteed", "image": "pytorch-2.5-cuda12.4",
            "command": ["python", "train.py"], "code": digest}  # fmt: skip
    r = api.post("/api/v1/jobs/", body, format="json")
    assert r.status_code == 400 and r.json()["code"] == "code_not_supported", r.content
    assert "TRAINYARD_S3_URL" in r.json()["detail"]
    assert not Job.objects.exists()
