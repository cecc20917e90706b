"""The checkpoint uploader against a real S3 store (settling, verification, changes during upload), team retention
and the storage quota (uploads wait, then go on)."""

import subprocess
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import checkpoints
from jobs.backends.checkpoint_sync import ChangedDuringUpload, CheckpointSync, upload_file
from jobs.models import Attempt, Checkpoint, JobEvent
from jobs.states import JobState
from jobs.tests.conftest import wait_for
from jobs.tests.test_lifecycle_e2e import finished, reload, submit
from kernel import objectstore


def _sync(tmp_path, store, prefix="t/"):
    folder = tmp_path / "attempt"
    folder.mkdir(exist_ok=True)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(exist_ok=True)
    conf = {"dir": str(ckpt), "store": store.to_dict(), "prefix": prefix, "sync_s": 0.2, "final_wait_s": 3}
    return CheckpointSync(folder, conf), ckpt


def test_a_file_is_uploaded_only_once_it_stops_changing(object_store, tmp_path):
    sync, ckpt = _sync(tmp_path, object_store, prefix=f"settle-{time.time_ns()}/")
    (ckpt / "ckpt-1.pt").write_bytes(b"a" * 100)
    assert sync.sync_once(final=False) is False  # seen for the first time: not settled yet
    assert sync.uploaded == {}
    assert sync.sync_once(final=False) is True
    first = sync.uploaded["ckpt-1.pt"]
    (ckpt / "ckpt-1.pt").write_bytes(b"b" * 120)  # rewritten: uploaded again once settled, with the new checksum
    assert sync.sync_once(final=False) is False
    assert sync.sync_once(final=False) is True
    second = sync.uploaded["ckpt-1.pt"]
    assert second["size"] == 120 and second["sha256"] != first["sha256"]
    s3 = objectstore.client(object_store)
    assert s3.get_object(Bucket=object_store.bucket, Key=second["key"])["Body"].read() == b"b" * 120
    manifest = (sync.folder / "checkpoints.json").read_text()
    assert second["sha256"] in manifest


def test_a_file_that_changes_during_the_upload_is_never_recorded(object_store, tmp_path):
    path = tmp_path / "growing.bin"
    path.write_bytes(b"x" * (4 * 1024 * 1024))
    writer = subprocess.Popen(["sh", "-c", f"while :; do echo more >> {path}; done"])
    try:
        time.sleep(0.1)
        s3 = objectstore.client(object_store)
        with pytest.raises(ChangedDuringUpload):
            upload_file(s3, bucket=object_store.bucket, key=f"changing-{time.time_ns()}", path=path)
    finally:
        writer.kill()
        writer.wait()


def test_a_large_file_is_read_once_sent_in_checked_parts_and_restored_byte_for_byte(object_store, tmp_path):
    import hashlib
    import os

    from jobs.backends.checkpoint_sync import PART_BYTES, download_file

    data = os.urandom(2 * PART_BYTES + 12345)
    path = tmp_path / "model.pt"
    path.write_bytes(data)
    s3 = objectstore.client(object_store)
    record = upload_file(s3, bucket=object_store.bucket, key=f"large-{time.time_ns()}", path=path)
    assert record["size"] == len(data) and record["sha256"] == hashlib.sha256(data).hexdigest()
    assert record["etag"].endswith("-3")  # three parts, the store's ETag matched the one computed while reading
    assert not s3.list_multipart_uploads(Bucket=object_store.bucket).get("Uploads")  # nothing left half done
    back = tmp_path / "restored.pt"
    download_file(s3, bucket=object_store.bucket, key=record["key"], path=back, sha256=record["sha256"], size=len(data))
    assert back.read_bytes() == data


def test_a_large_file_that_grows_during_its_multipart_upload_is_never_recorded(object_store, tmp_path):
    path = tmp_path / "growing-large.bin"
    path.write_bytes(b"x" * (20 * 1024 * 1024))
    writer = subprocess.Popen(["sh", "-c", f"while :; do echo more >> {path}; done"])
    try:
        time.sleep(0.1)
        s3 = objectstore.client(object_store)
        with pytest.raises(ChangedDuringUpload):
            upload_file(s3, bucket=object_store.bucket, key=f"changing-large-{time.time_ns()}", path=path)
    finally:
        writer.kill()
        writer.wait()


def test_a_symlink_in_the_checkpoint_folder_is_not_followed(object_store, tmp_path):
    sync, ckpt = _sync(tmp_path, object_store, prefix=f"link-{time.time_ns()}/")
    secret = tmp_path / "secret"
    secret.write_text("platform secret")
    (ckpt / "leak.pt").symlink_to(secret)
    sync.finish()
    assert sync.uploaded == {} and sync.unsaved == []


def test_a_folder_swapped_for_a_symlink_is_not_followed_by_the_upload(object_store, tmp_path):
    """The job may replace a folder with a link between the scan and the upload: the read never leaves its tree."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("platform secret")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "sub").symlink_to(outside)
    s3 = objectstore.client(object_store)
    with pytest.raises(ChangedDuringUpload, match="symlink|not a folder"):
        upload_file(s3, bucket=object_store.bucket, key="never", path=ckpt / "sub" / "secret", root=ckpt)
    (ckpt / "direct").symlink_to(outside / "secret")
    with pytest.raises(ChangedDuringUpload):
        upload_file(s3, bucket=object_store.bucket, key="never", path=ckpt / "direct", root=ckpt)


# ------------------------------------------------------------------------------------------- retention and quota


def _saved(job, attempt, name, *, store, age_days=0, body=b"w"):
    key = f"{job.team.slug}/{job.id}/attempt-{attempt.number}/{name}"
    objectstore.client(store).put_object(Bucket=store.bucket, Key=key, Body=body)
    return Checkpoint.objects.create(
        job=job, attempt=attempt, name=name, step=checkpoints.step_of(name), size_bytes=len(body), sha256="0" * 64,
        bucket=store.bucket, key=key, files=[{"path": name, "key": key, "size": len(body), "sha256": "0" * 64}],
        saved_at=timezone.now() - timedelta(days=age_days),
    )  # fmt: skip


def _succeeded_under_retention(user, *, keep_last: int):
    """The demo team keeping `keep_last` checkpoints per job for 7 days, and one succeeded job with its attempt."""
    from jobs.models import Job
    from quotas.models import Team

    Team.objects.filter(slug="demo").update(checkpoint_keep_last=keep_last, checkpoint_retention_days=7)
    job = submit(user, command=["true"])
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED, finished_at=timezone.now())
    attempt = Attempt.objects.create(job=job, number=1, backend="local", state="succeeded", ended_at=timezone.now())
    return job, attempt


def _exists(store, key) -> bool:
    try:
        objectstore.client(store).head_object(Bucket=store.bucket, Key=key)
        return True
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.django_db(transaction=True)
def test_retention_keeps_the_last_n_drops_the_old_and_never_the_last_of_a_job_that_may_resume(
    platform, checkpoint_store
):
    done, attempt = _succeeded_under_retention(platform, keep_last=2)
    kept = [_saved(done, attempt, f"ckpt-{n}.pt", store=checkpoint_store) for n in (30, 20)]
    dropped = _saved(done, attempt, "ckpt-10.pt", store=checkpoint_store)
    running = submit(platform, command=["true"])  # not finished: it may still retry and resume
    live = Attempt.objects.create(job=running, number=1, backend="local", state="failed", ended_at=timezone.now())
    old_last = _saved(running, live, "ckpt-5.pt", store=checkpoint_store, age_days=30)
    old_other = _saved(running, live, "ckpt-4.pt", store=checkpoint_store, age_days=30)

    report = checkpoints.checkpoints_prune()
    assert report["deleted"] == 2 and report["failed"] == 0
    for c in kept + [old_last]:
        c.refresh_from_db()
        assert c.deleted_at is None and _exists(checkpoint_store, c.key)
    for c in [dropped, old_other]:
        c.refresh_from_db()
        assert c.deleted_at is not None and not _exists(checkpoint_store, c.key)
    assert JobEvent.objects.filter(kind="checkpoint_deleted").count() == 2
    assert checkpoints.latest(running.id) == old_last


@pytest.mark.django_db(transaction=True)
def test_retention_keeps_what_an_unfinished_job_resumes_from_in_the_same_statements_for_any_number_of_jobs(
    platform, checkpoint_store
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs.models import Job

    source, attempt = _succeeded_under_retention(platform, keep_last=1)
    best = _saved(source, attempt, "ckpt-20.pt", store=checkpoint_store, age_days=30)  # highest step, though older
    newer = _saved(source, attempt, "ckpt-10.pt", store=checkpoint_store, age_days=20)
    follower = submit(platform, command=["true"])
    Job.objects.filter(pk=follower.pk).update(resume_from=source)  # waiting: it will start from `source`

    def prune_counting(unfinished: int) -> int:
        for _ in range(unfinished):
            job = submit(platform, command=["true"])
            a = Attempt.objects.create(job=job, number=1, backend="local", state="failed", ended_at=timezone.now())
            _saved(job, a, "ckpt-1.pt", store=checkpoint_store, age_days=30)  # each the latest of a job that may retry
        with CaptureQueriesContext(connection) as queries:
            checkpoints.checkpoints_prune()
        return len(queries.captured_queries)

    few = prune_counting(1)
    best.refresh_from_db()
    newer.refresh_from_db()
    assert best.deleted_at is None and _exists(checkpoint_store, best.key)  # what the follower resumes from
    assert newer.deleted_at is not None  # past retention and not the one a resume takes
    many = prune_counting(6)
    assert many == few - 2  # nothing doomed the second time: no store call, no update, no event; no query per job
    assert Checkpoint.objects.filter(deleted_at__isnull=True, name="ckpt-1.pt").count() == 7


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_over_the_storage_quota_uploads_wait_with_an_event_and_resume_when_there_is_room(
    platform, celery_worker_thread, checkpoint_store
):
    from quotas.models import Team

    team = Team.objects.get(slug="demo")
    earlier = submit(platform, command=["true"])
    attempt = Attempt.objects.create(job=earlier, number=1, backend="local", state="failed", ended_at=timezone.now())
    _saved(earlier, attempt, "ckpt-1.pt", store=checkpoint_store, body=b"z" * 100)
    Team.objects.filter(pk=team.pk).update(storage_quota_bytes=100)  # already full
    job = submit(platform, command=["sh", "-c", 'echo w > "$TRAINYARD_CHECKPOINT_DIR/ckpt-9.pt"; sleep 30'])
    event = wait_for(lambda: JobEvent.objects.filter(job=job, kind="checkpoint_upload_waiting").first(), timeout=60)
    assert "storage quota is full" in event.message and "ckpt-9.pt" in str(event.data)
    assert not Checkpoint.objects.filter(job=job).exists()
    Team.objects.filter(pk=team.pk).update(storage_quota_bytes=10_000)
    wait_for(lambda: Checkpoint.objects.filter(job=job, name="ckpt-9.pt").exists(), timeout=60)
    from jobs import lifecycle

    lifecycle.job_cancel(job_id=job.id, actor="test")
    assert wait_for(lambda: finished(job), timeout=60).state == JobState.CANCELLED
    assert reload(job).checkpoints.count() == 1


def test_large_files_go_one_at_a_time_unsigned_and_each_is_verified(object_store, tmp_path, monkeypatch):
    """Several multipart files in one pass are sent one after the other (their parts already fill the wire; two at a
    time overcommit a small machine), through the client that does not hash bodies into the signature: each part
    carries a Content-MD5 the store checks, and the stored copy still matches byte for byte."""
    import threading

    from jobs.backends import checkpoint_sync

    sync, ckpt = _sync(tmp_path, object_store, prefix=f"large-{time.time_ns()}/")
    sizes = {f"big-{i}.bin": checkpoint_sync.PART_BYTES + 1000 * (i + 1) for i in range(3)}
    for name, size in sizes.items():
        (ckpt / name).write_bytes(bytes([len(name) + size % 251]) * size)
    (ckpt / "small.json").write_text("{}")
    active, most, lock = [0], [0], threading.Lock()
    real = checkpoint_sync._upload_parts

    def counted(*args, **kwargs):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            time.sleep(0.2)  # long enough for a second large file to start if nothing held it back
            return real(*args, **kwargs)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(checkpoint_sync, "_upload_parts", counted)
    content_hashes = []
    sync.bulk().meta.events.register(
        "before-send.s3.UploadPart", lambda request, **_: content_hashes.append(request.headers["X-Amz-Content-SHA256"])
    )
    assert sync.sync_once(final=True) is True
    assert most[0] == 1
    assert set(sync.uploaded) == {*sizes, "small.json"}
    assert content_hashes and {h.decode() if isinstance(h, bytes) else h for h in content_hashes} == {
        "UNSIGNED-PAYLOAD"
    }
    s3 = objectstore.client(object_store)
    for name, size in sizes.items():
        body = s3.get_object(Bucket=object_store.bucket, Key=sync.uploaded[name]["key"])["Body"].read()
        assert body == (ckpt / name).read_bytes() and len(body) == size
