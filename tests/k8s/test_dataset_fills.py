# ruff: noqa: F811 - the real-cluster fixtures are imported from test_real_cluster and used as arguments
"""A dataset's shared cache on the real control plane (`make cluster`, docs/cluster.md): one claim and one fill Job
for every attempt that needs that dataset version, the trainers held by their waiters (kwok's dataset-wait Stage)
until the cache is filled; a fill Job that fails (its pods failed with kwok's `fail` and the fill process's own
message) failing the waiting attempts with its reason, removed, and made again by the retry. What the platform
created, and what the API server answered, is read from the API server's audit log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from jobs import lifecycle
from jobs.tests.test_volcano_backend import reload, submit
from kernel.paths import BASE_DIR
from tests.k8s.test_real_cluster import (  # noqa: F401 - fixtures
    CACHE_CLASS,
    TEAM_NS,
    _creates,
    _drive,
    _drive_plain,
    _outcome,
    _state,
    admin,
    cache_volume,
    imagenet_dataset,
    platform,
    release_dataset_waiters,
    trainers_held,
)

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _cached(settings, url: str) -> None:
    from jobs.backends import reset_backends

    settings.TRAINYARD_S3_URL = url
    settings.TRAINYARD_DATASET_CACHE_STORAGE_CLASS = CACHE_CLASS
    reset_backends()


def test_one_claim_and_one_fill_job_serve_two_attempts_and_the_trainers_wait_for_it(
    platform, admin, real_cluster, settings, celery_worker_thread
):
    """Two jobs need the same dataset version: one claim and one fill Job (the second submit's creates met 409
    and adopted them). The trainers stay held by their waiters while the fill runs and after it completed (the
    platform does not start them), a fill Job removed while they wait is made again by the next observation, and
    once the cache is filled both trainers run."""
    since = datetime.now(UTC).replace(microsecond=0)
    _cached(settings, "http://s3.storage.svc:8333")
    claim = f"ty-dataset-{imagenet_dataset().id}-v1"
    batch = k8s.BatchV1Api(admin["api"])
    with cache_volume(admin, claim):
        jobs = [submit(platform["user"], datasets=[{"name": "imagenet", "path": "/data"}]) for _ in range(2)]
        for job in jobs:
            _drive(lambda job=job: trainers_held(admin, job), timeout=120)
        claims = [c.metadata.name for c in admin["core"].list_namespaced_persistent_volume_claim(TEAM_NS).items]
        assert claims == [claim]
        assert [j.metadata.name for j in batch.list_namespaced_job(TEAM_NS).items] == [claim]
        assert sorted(_creates(real_cluster, "persistentvolumeclaims", TEAM_NS, claim, since)) == [201, 409]
        assert sorted(_creates(real_cluster, "jobs", TEAM_NS, claim, since)) == [201, 409]
        first = batch.read_namespaced_job(claim, TEAM_NS)
        _drive_plain(lambda: (batch.read_namespaced_job(claim, TEAM_NS).status.succeeded or 0) == 1, timeout=60)
        for _ in range(5):
            lifecycle.attempts_observe(backend_name="volcano")
            time.sleep(0.3)
        for job in jobs:
            assert reload(job).state not in ("running", "failed"), reload(job).state
            assert trainers_held(admin, job)  # the trainers wait for their waiters, the fill done or not

        batch.delete_namespaced_job(claim, TEAM_NS, propagation_policy="Background")  # its TTL passed, say

        def made_again():
            lifecycle.attempts_observe(backend_name="volcano")
            return [j for j in batch.list_namespaced_job(TEAM_NS).items if j.metadata.uid != first.metadata.uid]

        _drive_plain(made_again, timeout=30)  # level-triggered: made again while attempts wait for it
        assert _creates(real_cluster, "jobs", TEAM_NS, claim, since).count(201) == 2

        for job in jobs:
            release_dataset_waiters(admin, job)
        for job in jobs:
            _drive(lambda job=job: _state(job, "running"), timeout=60)
            _outcome(admin, job, "succeed")
        for job in jobs:
            assert _drive(lambda job=job: _state(job, "succeeded", "failed")).state == "succeeded"


class _FailFills(threading.Thread):
    """Fails every pod of the fill Job `claim` as it starts (kwok's `fail` outcome, patched on before kwok would
    complete it) with the fill process's own termination message."""

    def __init__(self, admin, claim: str, message: str, exit_code: int):
        super().__init__(daemon=True)
        self.admin, self.claim, self.message, self.exit_code = admin, claim, message, exit_code
        self.failed: set[str] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        annotations = {"kwok.trainyard.io/outcome": "fail", "kwok.trainyard.io/exit-code": str(self.exit_code),
                       "kwok.trainyard.io/outcome-after": "0s", "kwok.trainyard.io/message": self.message}  # fmt: skip
        while not self.stop.is_set():
            pods = self.admin["core"].list_namespaced_pod(TEAM_NS, label_selector=f"job-name={self.claim}").items
            for pod in pods:
                if pod.metadata.name in self.failed:
                    continue
                try:
                    body = {"metadata": {"annotations": annotations}}
                    self.admin["core"].patch_namespaced_pod(pod.metadata.name, TEAM_NS, body)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                self.failed.add(pod.metadata.name)
            time.sleep(0.03)


def test_a_fill_that_cannot_succeed_fails_the_waiting_attempts_with_its_reason_and_nothing_is_retried(
    platform, admin, real_cluster, settings, object_store, celery_worker_thread, tmp_path
):
    """The fill process, run here on the fill Job's dataset spec against the real store (where that dataset's files
    are not), fails with `DatasetChanged: …` and exit status 3 (no retry can mend it); the fill pod fails so and
    the Job's pod failure policy fails the Job at once, without its own retries. Both waiting attempts fail with
    that reason and the fill's message under the rule `dataset-changed`; the fill Job is removed, and the job with a
    retry left is not retried, so no second fill Job is made for a copy that cannot succeed."""
    from jobs.models import JobEvent

    since = datetime.now(UTC).replace(microsecond=0)
    _cached(settings, object_store.url)
    dataset = imagenet_dataset()
    claim = f"ty-dataset-{dataset.id}-v1"
    spec = {"id": dataset.id, "team": "demo", "name": "imagenet", "version": 1, "prefix": dataset.s3_prefix,
            "size_bytes": dataset.size_bytes, "file_count": dataset.file_count}  # fmt: skip
    volume, termination = tmp_path / "claim", tmp_path / "termination-log"
    volume.mkdir()
    run_env = {**os.environ, "PYTHONPATH": str(BASE_DIR), "TRAINYARD_DATASET": json.dumps(spec, sort_keys=True),
               "TRAINYARD_S3_URL": object_store.url, "TRAINYARD_S3_BUCKET": object_store.bucket,
               "TRAINYARD_S3_ACCESS_KEY_ID": object_store.access_key_id,
               "TRAINYARD_S3_SECRET_ACCESS_KEY": object_store.secret_access_key}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "jobs.backends.dataset_cache", "fill", "--cache", str(volume),
         "--termination-log", str(termination)],
        env=run_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    said = termination.read_text() if termination.exists() else ""
    assert done.returncode == 3 and said.startswith("DatasetChanged: "), (done.returncode, said, done.stderr)
    reason, _, message = said.strip().partition(": ")
    batch = k8s.BatchV1Api(admin["api"])
    with cache_volume(admin, claim):
        failing = _FailFills(admin, claim, said, done.returncode)
        failing.start()  # before the fill Job exists: each of its pods fails before kwok would complete it
        try:
            may_retry = submit(platform["user"], datasets=[{"name": "imagenet", "path": "/data"}], max_retries=1)
            once = submit(platform["user"], datasets=[{"name": "imagenet", "path": "/data"}], max_retries=0)
            _drive_plain(lambda: batch.list_namespaced_job(TEAM_NS).items, timeout=60)
            [fill] = batch.list_namespaced_job(TEAM_NS).items
            env = {e.name: e.value for e in fill.spec.template.spec.containers[0].env or [] if e.value is not None}
            assert json.loads(env["TRAINYARD_DATASET"]) == spec  # what the process above was given
            once = _drive(lambda: _state(once, "failed"), timeout=180)
            may_retry = _drive(lambda: _state(may_retry, "failed"), timeout=240)
        finally:
            failing.stop.set()
            failing.join(10)
        said_by_fill = f"{reason} — dataset imagenet v1 could not be filled into its shared cache volume (Job {claim})"
        for job in (once, may_retry):  # one attempt each: the job with a retry left is not retried
            attempts = list(job.attempts.order_by("number"))
            assert [(a.reason, a.rule) for a in attempts] == [(reason, "dataset-changed")]
            [event] = JobEvent.objects.filter(job=job, kind="attempt_failed")
            assert f"{said_by_fill}: {message}" in event.message, event.message  # the fill pod's own words
        assert _creates(real_cluster, "persistentvolumeclaims", TEAM_NS, claim, since).count(201) == 1  # one claim
        assert _creates(real_cluster, "jobs", TEAM_NS, claim, since).count(201) == 1  # no retry made it again
        # One pod: the pod failure policy failed the Job on its first pod's exit status, where the Job's own
        # retries (backoffLimit 2) made three pods and waited out 30 s of back-off.
        assert len(failing.failed) == 1, failing.failed
        _drive_plain(lambda: not batch.list_namespaced_job(TEAM_NS).items, timeout=30)  # the failed one removed
