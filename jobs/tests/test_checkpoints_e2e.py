"""Checkpoints end to end: real local jobs (sandboxed subprocesses), a real worker, a real S3 store (SeaweedFS)."""

import json
import os
import signal

import pytest

from jobs import lifecycle, services
from jobs.models import Checkpoint, JobEvent
from jobs.states import JobState
from jobs.tests.conftest import wait_for
from jobs.tests.test_lifecycle_e2e import finished, log_text, reload, submit
from kernel import objectstore

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Attempt 1 saves step 100 and keeps training until it is killed; attempt 2 must find step 100 restored.
TRAIN = r"""
set -e
echo "dir=$TRAINYARD_CHECKPOINT_DIR resume=${TRAINYARD_RESUME_FROM:-none}"
if [ -n "$TRAINYARD_RESUME_FROM" ]; then echo "restored: $(cat "$TRAINYARD_RESUME_FROM")"; fi
if [ "$TRAINYARD_ATTEMPT" = "1" ]; then
  printf 'weights-at-step-100' > "$TRAINYARD_CHECKPOINT_DIR/ckpt-100.pt"
  sleep 120
fi
mkdir -p "$TRAINYARD_CHECKPOINT_DIR/step-200"
printf 'model-200' > "$TRAINYARD_CHECKPOINT_DIR/step-200/model.pt"
printf 'optim-200' > "$TRAINYARD_CHECKPOINT_DIR/step-200/optim.pt"
"""


def _object(store, key):
    s3 = objectstore.client(store)
    return s3.get_object(Bucket=store.bucket, Key=key)["Body"].read()


def _kill_attempt(job, number):
    from django.conf import settings

    child = settings.TRAINYARD_STATE_ROOT / str(job.id) / f"attempt-{number}" / "child.json"
    os.killpg(json.loads(child.read_text())["pid"], signal.SIGKILL)


def test_checkpoint_is_uploaded_while_running_and_restored_into_the_retry(
    platform, celery_worker_thread, checkpoint_store, settings
):
    job = submit(platform, spec="guaranteed", command=["sh", "-c", TRAIN], max_retries=2)
    # Uploaded while the job still runs: the file settled for a sync period, no need to wait for the end.
    saved = wait_for(
        lambda: (
            reload(job).state == JobState.RUNNING and Checkpoint.objects.filter(job=job, name="ckpt-100.pt").first()
        ),
        timeout=60,
    )
    assert saved.step == 100 and saved.size_bytes == len(b"weights-at-step-100")
    assert saved.attempt.number == 1
    assert saved.key == f"demo/{job.id}/attempt-1/ckpt-100.pt"
    assert _object(checkpoint_store, saved.key) == b"weights-at-step-100"

    _kill_attempt(job, 1)  # a platform failure (SIGKILL): retried, and the retry resumes
    job = wait_for(lambda: finished(job), timeout=90)
    assert job.state == JobState.SUCCEEDED, log_text(job, 2)
    second = log_text(job, attempt=2)
    # Restored into attempt 2's own folder before the command started, and named by TRAINYARD_RESUME_FROM.
    assert f"resume={settings.TRAINYARD_WORK_ROOT}/{job.id}/checkpoints/attempt-2/ckpt-100.pt" in second, second
    assert "restored: weights-at-step-100" in second
    assert "resume=none" in log_text(job, attempt=1)

    folder_ckpt = Checkpoint.objects.get(job=job, name="step-200")
    assert folder_ckpt.attempt.number == 2 and folder_ckpt.step == 200
    assert sorted(f["path"] for f in folder_ckpt.files) == ["step-200/model.pt", "step-200/optim.pt"]
    assert _object(checkpoint_store, f"demo/{job.id}/attempt-2/step-200/optim.pt") == b"optim-200"
    # The restored file is not uploaded again as attempt 2's.
    assert not Checkpoint.objects.filter(attempt__number=2, name="ckpt-100.pt").exists()
    assert job.events.filter(kind="checkpoint_saved").count() == 2


def test_store_down_never_blocks_the_job_and_the_page_says_what_was_not_saved(
    platform, celery_worker_thread, checkpoint_store, settings
):
    from ops.embedded import free_port

    settings.TRAINYARD_S3_URL = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    settings.TRAINYARD_CHECKPOINT_FINAL_WAIT_S = 3.0
    job = submit(platform, command=["sh", "-c", 'echo w > "$TRAINYARD_CHECKPOINT_DIR/last.pt"; echo done'])
    job = wait_for(lambda: finished(job), timeout=60)
    assert job.state == JobState.SUCCEEDED
    event = JobEvent.objects.get(job=job, kind="checkpoint_unsaved")
    assert event.level == "error" and "last.pt" in event.message
    assert "not saved to the object store" in log_text(job)
    assert not Checkpoint.objects.filter(job=job).exists()


def test_resume_from_another_job(platform, celery_worker_thread, checkpoint_store):
    first = submit(platform, command=["sh", "-c", 'printf one > "$TRAINYARD_CHECKPOINT_DIR/epoch-3.ckpt"'])
    first = wait_for(lambda: finished(first), timeout=60)
    assert first.state == JobState.SUCCEEDED
    assert Checkpoint.objects.get(job=first).step == 3
    second = submit(
        platform, command=["sh", "-c", 'echo "from=$TRAINYARD_RESUME_FROM"; cat "$TRAINYARD_RESUME_FROM"'],
        resume_from=str(first.id),
    )  # fmt: skip
    second = wait_for(lambda: finished(second), timeout=60)
    assert second.state == JobState.SUCCEEDED
    text = log_text(second)
    assert f"{second.id}/checkpoints/attempt-1/epoch-3.ckpt" in text and "one" in text

    retried = services.job_resubmit(job_id=first.id, user=platform, resume=True)
    assert retried.resume_from_id == first.id
    reproduced = services.job_reproduce(job_id=first.id, user=platform)
    assert reproduced.resume_from_id is None


def test_a_cancelled_job_still_saves_its_checkpoints_at_the_end(
    platform, celery_worker_thread, checkpoint_store, settings
):
    settings.TRAINYARD_CHECKPOINT_SYNC_S = 120.0  # no periodic pass in this test: only the final sync can save it
    job = submit(platform, command=["sh", "-c", 'echo 1 > "$TRAINYARD_CHECKPOINT_DIR/ckpt-7.pt"; sleep 60'])
    wait_for(lambda: reload(job).state == JobState.RUNNING, timeout=60)
    import time

    time.sleep(1.0)  # the file is written
    lifecycle.job_cancel(job_id=job.id, actor="demo")
    job = wait_for(lambda: finished(job), timeout=60)
    assert job.state == JobState.CANCELLED
    saved = Checkpoint.objects.get(job=job)
    assert saved.name == "ckpt-7.pt" and saved.step == 7
    assert _object(checkpoint_store, saved.key) == b"1\n"


def test_checkpoints_api_is_scoped_to_the_team_and_teams_show_storage(platform, checkpoint_store):
    from django.test import Client
    from django.utils import timezone

    from jobs.models import Attempt
    from quotas.models import Team
    from quotas.tests.factories import MembershipFactory, TeamFactory, UserFactory

    job = submit(platform, command=["true"])
    attempt = Attempt.objects.create(job=job, number=1, backend="local", state="failed", ended_at=timezone.now())
    Checkpoint.objects.create(
        job=job, attempt=attempt, name="ckpt-3.pt", step=3, size_bytes=1234, sha256="a" * 64, bucket="b",
        key=f"demo/{job.id}/attempt-1/ckpt-3.pt", saved_at=timezone.now(),
        files=[{"path": "ckpt-3.pt", "key": "k", "size": 1234, "sha256": "a" * 64}],
    )  # fmt: skip
    mine = Client()
    mine.force_login(platform)
    rows = mine.get(f"/api/v1/jobs/{job.id}/checkpoints/").json()
    assert [(r["name"], r["step"], r["size_bytes"], r["attempt"]) for r in rows] == [("ckpt-3.pt", 3, 1234, 1)]
    assert rows[0]["download_url"] == f"/api/v1/jobs/{job.id}/checkpoints/{rows[0]['id']}/download/"
    outsider = UserFactory(username="olga")
    MembershipFactory(team=TeamFactory(slug="other"), user=outsider)
    theirs = Client()
    theirs.force_login(outsider)
    assert theirs.get(f"/api/v1/jobs/{job.id}/checkpoints/").status_code == 404
    assert theirs.get(f"/api/v1/jobs/{job.id}/checkpoints/{rows[0]['id']}/download/").status_code == 404

    team = mine.get("/api/v1/teams/demo/").json()
    assert team["storage"]["used_bytes"] == 1234 and team["storage"]["quota_bytes"] == 0
    staff = Client()
    staff.force_login(UserFactory(username="boss", is_staff=True))
    answer = staff.patch(
        "/api/v1/teams/demo/quota/", {"storage_quota_bytes": 5000, "checkpoint_keep_last": 3},
        content_type="application/json",
    )  # fmt: skip
    assert answer.status_code == 200, answer.content
    assert answer.json()["storage"] == {"used_bytes": 1234, "quota_bytes": 5000, "keep_last": 3, "retention_days": 30}
    assert Team.objects.get(slug="demo").checkpoint_keep_last == 3
    bad = staff.patch("/api/v1/teams/demo/quota/", {"checkpoint_keep_last": -1}, content_type="application/json")
    assert bad.status_code == 400
    page = mine.get("/teams/demo/").content.decode()
    assert "Checkpoint storage" in page and "1.2\xa0KB of 4.9\xa0KB used" in page


def test_a_checkpoint_gone_from_the_store_fails_the_resume_with_its_reason_and_is_not_retried(
    platform, celery_worker_thread, checkpoint_store
):
    first = submit(platform, command=["sh", "-c", 'printf one > "$TRAINYARD_CHECKPOINT_DIR/epoch-3.ckpt"'])
    first = wait_for(lambda: finished(first), timeout=60)
    saved = Checkpoint.objects.get(job=first)
    objectstore.client(checkpoint_store).delete_object(Bucket=checkpoint_store.bucket, Key=saved.key)
    second = submit(platform, command=["sh", "-c", "echo never"], resume_from=str(first.id), max_retries=2)
    second = wait_for(lambda: finished(second), timeout=60)
    assert second.state == JobState.FAILED
    [attempt] = second.attempts.all()  # the same missing checkpoint would fail the same way: not retried
    assert (attempt.exit_code, attempt.reason, attempt.rule) == (
        125,
        "CheckpointRestoreError",
        "checkpoint-restore-failed",
    )
    event = JobEvent.objects.get(job=second, kind="attempt_failed")
    assert f"(CheckpointRestoreError): could not restore checkpoint epoch-3.ckpt (job {first.id}, attempt 1)" in (
        event.message
    )
    assert "missing in the object store" in event.message
    text = log_text(second)
    assert "[trainyard] could not restore checkpoint epoch-3.ckpt" in text and "never" not in text
