"""Code snapshots' storage: a per-team quota (a clear 400 at upload, before the body is kept) and retention (an
hourly, level-triggered prune that removes snapshots no live job uses once their last use is older than the team's
window, and never one a live job or a job inside the window names)."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient
from trainyard_cli.code import pack

from jobs import code, services
from jobs.models import CodeSnapshot, Job
from jobs.states import JobState
from jobs.tasks import prune_code_snapshots
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from quotas.models import Team

pytestmark = pytest.mark.django_db(transaction=True)


def _folder(root, text: str, size: int = 0):
    root.mkdir(parents=True)
    (root / "train.py").write_text(text)
    if size:
        (root / "weights.bin").write_bytes(os.urandom(size))  # random: gzip cannot shrink it
    return root


def _put(api, folder):
    data, digest, _ = pack(folder)
    return api.put(f"/api/v1/code/{digest}/?team=demo", data=data, content_type="application/gzip"), digest, data


def _api(user):
    api = APIClient()
    api.force_authenticate(user)
    return api


def test_an_upload_past_the_teams_code_quota_is_a_400_that_keeps_nothing(platform, tmp_path):  # noqa: F811
    Team.objects.filter(slug="demo").update(code_quota_bytes=300 * 1024)
    api = _api(platform)
    first, digest1, data1 = _put(api, _folder(tmp_path / "a", "print(1)\n", size=200 * 1024))
    assert first.status_code == 201, first.content
    second, digest2, _ = _put(api, _folder(tmp_path / "b", "print(2)\n", size=200 * 1024))
    assert second.status_code == 400, second.content
    body = second.json()
    assert body["code"] == "code_quota_exceeded", body
    assert "team demo's code snapshots use 200 KiB of its 300 KiB" in body["detail"], body["detail"]
    assert "30 days after its last use" in body["detail"]
    assert list(CodeSnapshot.objects.values_list("digest", flat=True)) == [digest1]
    assert not code.snapshot_path("demo", digest2).exists()
    assert not list((tmp_path / "code" / "demo").glob(".upload-*"))
    # The same bytes again are not counted twice; a raised quota lets the second one in.
    assert _put(api, tmp_path / "a")[0].status_code in (200, 201)
    Team.objects.filter(slug="demo").update(code_quota_bytes=0)
    assert _put(api, tmp_path / "b")[0].status_code == 201


def _job(user, digest, state=None, finished_days_ago=None, submitted_days_ago=0):
    job = services.job_submit(
        user=user,
        data={
            "team": "demo",
            "queue": "debug",
            "spec": "shared",
            "image": "python-3.11",
            "command": ["python", "train.py"],
            "code": digest,
        },
    )[0]
    now = timezone.now()
    fields = {"submitted_at": now - timedelta(days=submitted_days_ago)}
    if state is not None:
        fields.update(state=state, finished_at=now - timedelta(days=finished_days_ago or 0))
    Job.objects.filter(pk=job.pk).update(**fields)
    return job


def test_retention_removes_only_snapshots_no_live_or_recent_job_uses(platform, tmp_path):  # noqa: F811
    api = _api(platform)
    digests = {}
    for name in ("old_unused", "old_live", "recent_finished", "old_finished", "fresh_unused"):
        response, digest, _ = _put(api, _folder(tmp_path / name, f"print({name!r})\n"))
        assert response.status_code == 201
        digests[name] = digest
    long_ago = timezone.now() - timedelta(days=45)
    CodeSnapshot.objects.exclude(digest=digests["fresh_unused"]).update(created_at=long_ago)
    _job(platform, digests["old_live"], submitted_days_ago=40)  # still pending: live
    _job(platform, digests["recent_finished"], JobState.SUCCEEDED, finished_days_ago=3, submitted_days_ago=40)
    _job(platform, digests["old_finished"], JobState.FAILED, finished_days_ago=35, submitted_days_ago=40)
    orphan = tmp_path / "code" / "demo" / ".upload-interrupted"
    orphan.write_bytes(b"half")
    os.utime(orphan, (time.time() - 2 * 86400,) * 2)

    report = prune_code_snapshots()  # the beat's task, as the worker runs it
    assert report == {"removed": 2, "bytes": report["bytes"], "kept_live": 1, "orphans": 1,
                      "store_orphans": report["store_orphans"]}, report  # fmt: skip
    left = set(CodeSnapshot.objects.values_list("digest", flat=True))
    assert left == {digests["old_live"], digests["recent_finished"], digests["fresh_unused"]}
    for name, digest in digests.items():
        assert code.snapshot_path("demo", digest).exists() == (digest in left), name
    assert not orphan.exists()
    # Level-triggered: the next pass finds nothing more to do.
    assert prune_code_snapshots()["removed"] == 0
    # A job naming a removed snapshot is refused with the code that says how to bring it back.
    r = api.post(
        "/api/v1/jobs/",
        {"team": "demo", "queue": "debug", "spec": "shared", "image": "python-3.11", "command": "python train.py",
         "code": digests["old_finished"]},
        format="json",
    )  # fmt: skip
    assert r.status_code == 400 and r.json()["code"] == "unknown_code", r.content
    # Uploading the same folder again restores it under the same digest.
    assert _put(api, tmp_path / "old_finished")[1] == digests["old_finished"]


def test_a_team_with_retention_off_keeps_everything(platform, tmp_path):  # noqa: F811
    Team.objects.filter(slug="demo").update(code_retention_days=0)
    response, digest, _ = _put(_api(platform), _folder(tmp_path / "a", "print(1)\n"))
    assert response.status_code == 201
    CodeSnapshot.objects.update(created_at=timezone.now() - timedelta(days=3650))
    assert prune_code_snapshots()["removed"] == 0 and CodeSnapshot.objects.filter(digest=digest).exists()


def _in_store(config, team: str, digest: str) -> bool:
    from kernel import objectstore

    try:
        objectstore.client(config).head_object(Bucket=config.bucket, Key=code.store_key(team, digest))
        return True
    except Exception:  # noqa: BLE001
        return False


def test_two_web_replicas_over_one_store_each_serve_what_the_other_took(platform, checkpoint_store, tmp_path, settings):  # noqa: F811
    """Two replicas of the web, each with its own TRAINYARD_CODE_ROOT (an emptyDir), over one real object store:
    an upload to one is in the store at once, and the other answers GET, takes a submission naming it and gives
    a job its files (filling its cache from the store, the digest checked)."""
    api = _api(platform)
    replica_a, replica_b = tmp_path / "replica-a", tmp_path / "replica-b"
    settings.TRAINYARD_CODE_ROOT = replica_a
    folder = _folder(tmp_path / "project", "print('from replica a')\n")
    response, digest, data = _put(api, folder)
    assert response.status_code == 201, response.content
    assert _in_store(checkpoint_store, "demo", digest)  # in the store at upload time, not at submission

    settings.TRAINYARD_CODE_ROOT = replica_b
    assert api.get(f"/api/v1/code/{digest}/?team=demo").status_code == 200
    assert _put(api, folder)[0].status_code == 200  # the other replica knows it has it: not taken twice
    job = _job(platform, digest)
    assert job.code_digest == digest
    into = tmp_path / "job-work"
    code.unpack(team_slug="demo", digest=digest, into=into)
    assert (into / "train.py").read_text() == "print('from replica a')\n"
    assert code.snapshot_path("demo", digest).read_bytes() == data  # replica b's cache, filled on the miss

    # On Kubernetes the submission finds the store's copy (nothing to publish from this replica's disk).
    settings.TRAINYARD_BACKEND = "volcano"
    assert code.resolve(digest, team=Team.objects.get(slug="demo"), backend="volcano") == digest
    # There, a replica keeps no copy of an upload once the store has it (its cache volume holds uploads in flight).
    pods_only, pods_digest, _ = _put(api, _folder(tmp_path / "pods", "print('pods')\n"))
    assert pods_only.status_code == 201 and _in_store(checkpoint_store, "demo", pods_digest)
    assert not code.snapshot_path("demo", pods_digest).exists()
    CodeSnapshot.objects.filter(digest=pods_digest).delete()
    settings.TRAINYARD_BACKEND = "local"

    # The quota counts the snapshot once, whichever replica took it; retention removes the store's copy too.
    Team.objects.filter(slug="demo").update(code_quota_bytes=len(data) + 100)
    other = _put(api, _folder(tmp_path / "other", "print('x' * 1000)\n", size=4096))[0]
    assert other.status_code == 400 and other.json()["code"] == "code_quota_exceeded"
    CodeSnapshot.objects.update(created_at=timezone.now() - timedelta(days=45))
    Job.objects.filter(pk=job.pk).update(
        state=JobState.SUCCEEDED,
        submitted_at=timezone.now() - timedelta(days=40),
        finished_at=timezone.now() - timedelta(days=40),
    )
    assert prune_code_snapshots()["removed"] == 1
    assert not _in_store(checkpoint_store, "demo", digest)
    # A cached copy on a replica alone no longer counts: GET says unknown, so the CLI uploads it again.
    code.snapshot_path("demo", digest).parent.mkdir(parents=True, exist_ok=True)
    code.snapshot_path("demo", digest).write_bytes(data)
    assert api.get(f"/api/v1/code/{digest}/?team=demo").status_code == 404


def test_a_store_copy_no_snapshot_names_is_removed_after_a_day(platform, checkpoint_store, tmp_path):  # noqa: F811
    from kernel import objectstore

    api = _api(platform)
    kept_response, kept, _ = _put(api, _folder(tmp_path / "kept", "print(1)\n"))
    assert kept_response.status_code == 201
    stray = "sha256:" + "e" * 64  # an upload whose row was never written
    objectstore.client(checkpoint_store).put_object(
        Bucket=checkpoint_store.bucket, Key=code.store_key("demo", stray), Body=b"half"
    )
    assert code._prune_store(timezone.now()) == 0  # not a day old yet
    assert code._prune_store(timezone.now() + timedelta(days=2)) >= 1
    assert not _in_store(checkpoint_store, "demo", stray) and _in_store(checkpoint_store, "demo", kept)
