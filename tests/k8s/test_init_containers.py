# ruff: noqa: F811 - the real-cluster fixtures are imported from test_real_cluster and used as arguments
"""An init container that fails, on the real control plane (`make cluster`, docs/cluster.md): a checkpoint restore
(the native sidecar, backed off by the kubelet while the pod waits), a dataset's waiter and a code fetch (plain init
containers: the pod fails). kwok's `init-fail` Stage reports the exit of the named init container with the
termination message the platform's own code wrote when it was run here as a process against the session's real
object store; the platform reads the reason from that message through the real API server and ends the attempt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from kubernetes.client.rest import ApiException

from jobs import logstore
from jobs.tests.test_volcano_backend import reload, submit
from kernel.paths import BASE_DIR
from tests.k8s.test_real_cluster import (  # noqa: F401 - fixtures
    CACHE_CLASS,
    JOBS,
    TEAM_NS,
    _attempt_pods,
    _drive,
    _outcome,
    _pods,
    _state,
    admin,
    cache_volume,
    imagenet_dataset,
    platform,
    trainers_held,
    uploaded_code,
)

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _init_fail(admin, job, container: str, exit_code: int, message: str) -> None:
    """The named init container of the attempt's pods exits (kwok's `init-fail` Stage) with that termination
    message, as the kubelet reports it."""
    annotations = {"kwok.trainyard.io/init-fail": container, "kwok.trainyard.io/exit-code": str(exit_code),
                   "kwok.trainyard.io/message": message}  # fmt: skip
    pods = _pods(admin, job)
    assert pods
    for pod in pods:
        assert container in [c.name for c in pod.spec.init_containers]
        admin["core"].patch_namespaced_pod(pod.metadata.name, TEAM_NS, {"metadata": {"annotations": annotations}})


def _stopped(admin, job) -> bool:
    """The attempt's Volcano job is gone or being deleted."""
    name = reload(job).attempts.order_by("-number").first().backend_ref.rsplit("/", 1)[-1]
    try:
        found = admin["custom"].get_namespaced_custom_object(*JOBS[:2], TEAM_NS, JOBS[2], name)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return bool(found["metadata"].get("deletionTimestamp"))


def _attempt_log(job, number: int = 1) -> str:
    return "\n".join(line.text for line in logstore.read_lines(logstore.attempt_dir(str(job.id), number))[0])


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}


def test_a_checkpoint_that_cannot_be_restored_fails_the_attempt_with_its_reason(
    platform, admin, checkpoint_store, celery_worker_thread, tmp_path
):
    """The checkpoint to resume from is recorded but gone from the store. The sidecar's own code, run here on the
    restore plan the platform gave the pod, exits 125 with `CheckpointRestoreError: …`; the kubelet backs the
    sidecar off (its exit is its last state, the pod stays Pending). The platform fails the attempt with that
    reason, does not retry it (the same checkpoint would fail the same way) and deletes the Volcano job."""
    from django.utils import timezone

    from jobs.backends import reset_backends
    from jobs.backends import volcano_render as render
    from jobs.models import Checkpoint, JobEvent
    from jobs.tests.test_k8s_storage import _sidecar_process

    reset_backends()  # the render options read the store settings the fixture set
    first = submit(platform["user"])
    _drive(lambda: _state(first, "running"))
    _outcome(admin, first, "succeed")
    first = _drive(lambda: _state(first, "succeeded", "failed"))
    assert first.state == "succeeded"
    key = f"demo/{first.id}/attempt-1/ckpt-100.pt"  # recorded, never in the store
    Checkpoint.objects.create(
        job=first, attempt=first.attempts.get(), name="ckpt-100.pt", step=100, size_bytes=3, sha256="a" * 64,
        bucket=checkpoint_store.bucket, key=key, saved_at=timezone.now(),
        files=[{"path": "ckpt-100.pt", "key": key, "sha256": "a" * 64, "size": 3}],
    )  # fmt: skip

    job = submit(platform["user"], resume_from=str(first.id), max_retries=2)
    job = _drive(lambda: _state(job, "running", "failed"))
    [pod] = _attempt_pods(admin, job)
    sidecar = next(c for c in pod["spec"]["initContainers"] if c["name"] == render.CHECKPOINT_SIDECAR)
    restore = json.loads(_env(sidecar)["TRAINYARD_CHECKPOINT_SPEC"])["restore"]
    assert restore["name"] == "ckpt-100.pt" and restore["job"] == str(first.id)
    done, said = _sidecar_process(checkpoint_store, tmp_path, restore)  # what that sidecar says in a real pod
    assert done.returncode == 125 and said.startswith("CheckpointRestoreError: "), (done.returncode, said)
    _init_fail(admin, job, render.CHECKPOINT_SIDECAR, done.returncode, said)

    job = _drive(lambda: _state(job, "failed"))
    assert job.failure_class == "platform"
    [attempt] = job.attempts.all()  # not retried
    assert (attempt.exit_code, attempt.reason, attempt.rule) == (125, "CheckpointRestoreError",
                                                                 "checkpoint-restore-failed")  # fmt: skip
    event = JobEvent.objects.get(job=job, kind="attempt_failed")
    assert "(CheckpointRestoreError): could not restore checkpoint ckpt-100.pt" in event.message, event.message
    assert f"job {first.id}, attempt 1" in event.message
    assert "resubmit without resuming" in job.suggestion
    assert _attempt_log(job).startswith("[trainyard] could not restore checkpoint ckpt-100.pt")
    _drive(lambda: _stopped(admin, job), timeout=30)  # the platform deleted the Volcano job


def test_a_checkpoint_sidecar_that_exits_for_another_reason_is_started_again_and_the_attempt_goes_on(
    platform, admin, checkpoint_store, celery_worker_thread
):
    """Only the restore's own exit code (125) is a failed restore: a sidecar that exits otherwise is backed off and
    started again by the kubelet, and the attempt is not ended for it."""
    from jobs import lifecycle
    from jobs.backends import reset_backends
    from jobs.backends import volcano_render as render

    reset_backends()  # the render options read the store settings the fixture set
    job = submit(platform["user"])
    job = _drive(lambda: _state(job, "running"))
    _init_fail(admin, job, render.CHECKPOINT_SIDECAR, 2, "Traceback (most recent call last): …")
    _drive(lambda: _sidecar_backed_off(admin, job), timeout=30)
    for _ in range(10):
        lifecycle.attempts_observe(backend_name="volcano")
        time.sleep(0.3)
    assert reload(job).state == "running"
    assert lifecycle.job_cancel(job_id=job.id, actor="demo").state == "cancelling"
    assert _drive(lambda: _state(job, "cancelled", "failed")).state == "cancelled"


def _sidecar_backed_off(admin, job) -> bool:
    from jobs.backends import volcano_render as render

    for pod in _attempt_pods(admin, job):
        for status in pod["status"].get("initContainerStatuses") or []:
            if status["name"] == render.CHECKPOINT_SIDECAR and "waiting" in status["state"]:
                return status["lastState"]["terminated"]["exitCode"] == 2
    return False


def test_a_dataset_waiter_that_gave_up_ends_the_attempt_with_its_reason(
    platform, admin, settings, object_store, celery_worker_thread, tmp_path
):
    """A dataset on the shared cache claim (bound to a volume made here): the trainer's `dataset-0` init container
    waits for the fill (kwok's dataset-wait Stage holds the pod initializing). Its own code, run here with the pod's
    dataset spec on an empty cache for half a second, gives up with `DatasetFetchError: …`; the pod fails with that
    exit and the attempt ends with that reason."""
    from jobs.backends import reset_backends
    from jobs.models import JobEvent

    settings.TRAINYARD_S3_URL = object_store.url
    settings.TRAINYARD_DATASET_CACHE_STORAGE_CLASS = CACHE_CLASS
    reset_backends()
    dataset = imagenet_dataset()
    claim = f"ty-dataset-{dataset.id}-v1"
    with cache_volume(admin, claim):
        job = submit(platform["user"], datasets=[{"name": "imagenet", "path": "/data"}], max_retries=0)
        [pod] = _drive(lambda: trainers_held(admin, job), timeout=120)  # waiting for the fill
        waiter = next(c for c in pod["spec"]["initContainers"] if c["name"] == "dataset-0")
        assert waiter["command"][:4] == ["python", "-m", "jobs.backends.dataset_cache", "wait"]
        cache = tmp_path / "claim"
        cache.mkdir()
        termination = tmp_path / "termination-log"
        env = {**os.environ, **_env(waiter), "PYTHONPATH": str(BASE_DIR)}
        done = subprocess.run(
            [sys.executable, "-m", "jobs.backends.dataset_cache", "wait", "--cache", str(cache),
             "--termination-log", str(termination), "--timeout-s", "0.5", "--poll-s", "0.1"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        said = termination.read_text()
        assert done.returncode == 1 and said.startswith("DatasetFetchError: dataset imagenet v1 was not in its"), said
        _init_fail(admin, job, "dataset-0", done.returncode, said)

        job = _drive(lambda: _state(job, "failed"))
        [attempt] = job.attempts.all()
        reason, _, message = said.partition(": ")
        assert (attempt.exit_code, attempt.reason) == (1, reason)
        assert attempt.rule == "dataset-fetch-failed"
        event = JobEvent.objects.get(job=job, kind="attempt_failed")
        assert message.strip() in event.message, event.message
        assert _attempt_log(job) == f"[trainyard] {said.strip()}"  # as the local supervisor writes it


def test_a_failed_code_fetch_ends_the_attempt_with_its_reason_and_is_retried(
    platform, admin, checkpoint_store, celery_worker_thread, tmp_path
):
    """The job's code snapshot is gone from the store when its pod starts. The `code` init container's own code,
    run here on the pod's spec against the real store, exits 1 with `CodeFetchError: …`; the pod fails and the
    attempt ends with that reason; the default rules retry it (a platform failure), and the retry runs."""

    from jobs import code
    from jobs.backends import reset_backends
    from jobs.models import JobEvent
    from jobs.tests.test_k8s_code import _fetch_process
    from kernel import objectstore

    reset_backends()  # the render options read the store settings the fixture set
    digest, _ = uploaded_code(platform["user"], tmp_path)
    job = submit(platform["user"], code=digest, max_retries=1)
    job = _drive(lambda: _state(job, "running", "failed"))
    [pod] = _attempt_pods(admin, job)
    fetch = next(c for c in pod["spec"]["initContainers"] if c["name"] == "code")
    spec = json.loads(_env(fetch)["TRAINYARD_CODE"])
    s3 = objectstore.client(checkpoint_store)
    s3.delete_object(Bucket=checkpoint_store.bucket, Key=code.store_key("demo", digest))  # gone from the store
    done, _into, said = _fetch_process(checkpoint_store, tmp_path, spec)
    assert done.returncode == 1 and said.startswith("CodeFetchError: "), (done.returncode, said, done.stderr)
    _init_fail(admin, job, "code", done.returncode, said)

    job = _drive(lambda: reload(job) if reload(job).attempts.count() == 2 else None)
    first = job.attempts.get(number=1)
    reason, _, message = said.partition(": ")
    assert (first.exit_code, first.reason, first.rule) == (1, reason, "code-fetch-failed")
    event = JobEvent.objects.get(job=job, kind="attempt_failed")
    assert f"exited with code 1 ({reason})" in event.message and "; retry" in event.message, event.message
    assert _attempt_log(job) == f"[trainyard] {reason}: {message.strip()}"  # its message, in its own log
    job = _drive(lambda: _state(job, "running", "failed"))
    assert job.state == "running"  # the retry was placed and runs
    _outcome(admin, job, "succeed")
    assert _drive(lambda: _state(job, "succeeded", "failed")).state == "succeeded"
