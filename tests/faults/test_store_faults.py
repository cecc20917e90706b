"""The object store (a real embedded SeaweedFS of the test's own) moving or going away under running local jobs."""

from __future__ import annotations

import socket
import time

import pytest

from jobs.backends import reset_backends
from jobs.models import Checkpoint, Job
from ops import embedded
from tests.faults.conftest import assert_settled, drive_until, runs, settled, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.faults, pytest.mark.slow]


def _point_at(settings, urls: dict[str, str]) -> None:
    settings.TRAINYARD_S3_URL = urls["TRAINYARD_S3_URL"]
    settings.TRAINYARD_S3_ACCESS_KEY_ID = urls["TRAINYARD_S3_ACCESS_KEY_ID"]
    settings.TRAINYARD_S3_SECRET_ACCESS_KEY = urls["TRAINYARD_S3_SECRET_ACCESS_KEY"]


def _start_store(var, servers: list) -> dict[str, str]:
    """Start SeaweedFS on the ports var/ports.json keeps (fresh ones where taken). Tried up to three times: its
    own processes' outgoing connections can take a freshly picked port before it binds it (seen here)."""
    for tries_left in (2, 1, 0):
        servers.append(embedded.Embedded())
        try:
            return embedded.start_seaweedfs(var, servers[-1])
        except embedded.ServiceError:
            servers[-1].stop()
            if not tries_left:
                raise
    raise AssertionError("unreachable")


@pytest.fixture
def own_store(fast_lifecycle, tmp_path):
    """A SeaweedFS under the test's own var/ folder, which the test stops and starts again."""
    var = tmp_path / "store-var"
    servers: list = []
    urls = _start_store(var, servers)
    _point_at(fast_lifecycle, urls)
    fast_lifecycle.TRAINYARD_S3_BUCKET = "trainyard"
    fast_lifecycle.TRAINYARD_CHECKPOINT_SYNC_S = 0.5
    fast_lifecycle.TRAINYARD_CHECKPOINT_FINAL_WAIT_S = 20.0
    reset_backends()
    yield var, servers, urls
    for running in servers:
        running.stop()


def test_a_running_jobs_uploads_follow_the_store_to_its_new_port(platform, own_store, fast_lifecycle, tmp_path):
    """`make run` restarted, its old S3 port taken by something else: SeaweedFS comes back on another port. The job
    started before keeps saving its checkpoints (before: its supervisor kept the old URL and logged "1 checkpoint
    file(s) not saved")."""
    var, servers, urls = own_store
    go = tmp_path / "go"
    script = (
        'printf one > "$TRAINYARD_CHECKPOINT_DIR/ckpt-1.pt"; '
        f'while [ ! -e "{go}" ]; do sleep 0.2; done; '
        'printf two > "$TRAINYARD_CHECKPOINT_DIR/ckpt-2.pt"; sleep 2; echo done'
    )
    marks = tmp_path / "marks"
    job = submit(platform, script=script, marks=marks, max_retries=0)
    drive_until(lambda: Checkpoint.objects.filter(job=job, name="ckpt-1.pt").exists(), timeout=60)
    servers[-1].stop()
    old_port = int(urls["TRAINYARD_S3_URL"].rsplit(":", 1)[1])
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", old_port))  # someone else has the old port now: the store must move
    squatter.listen()
    try:
        moved = _start_store(var, servers)
        assert moved["TRAINYARD_S3_URL"] != urls["TRAINYARD_S3_URL"]
        _point_at(fast_lifecycle, moved)  # what the restarted platform's processes are configured with
        go.touch()
        drive_until(lambda: settled(job), timeout=90)
    finally:
        squatter.close()
    job = assert_settled(job, marks, state="succeeded")
    assert runs(marks) == ["1"]
    names = set(Checkpoint.objects.filter(job=job).values_list("name", flat=True))
    assert names == {"ckpt-1.pt", "ckpt-2.pt"}, names
    assert not job.events.filter(kind="checkpoint_unsaved").exists()
    assert Job.objects.get(pk=job.pk).state == "succeeded"


def test_a_resume_waits_out_a_store_outage_without_using_its_retries(platform, own_store, fast_lifecycle, tmp_path):
    """SeaweedFS stopped for about 20 s while a job that resumes from a checkpoint starts: each try's restore fails
    `CheckpointStoreUnavailable`; the job waits in the line with a doubling not-before, uses none of its retries,
    and says until when on its page and in the API; once the store is back it resumes and succeeds (before: every
    retry was burnt within seconds and the job ended `failed`)."""
    from django.test import Client
    from rest_framework.test import APIClient

    var, servers, _ = own_store
    fast_lifecycle.TRAINYARD_STORE_RETRY_MAX_S = 4.0
    fast_lifecycle.TRAINYARD_STORE_OUTAGE_WAIT_S = 300.0
    first = submit(platform, script='printf one > "$TRAINYARD_CHECKPOINT_DIR/epoch-3.ckpt"', marks=tmp_path / "m1")
    drive_until(lambda: settled(first), timeout=60)
    assert Checkpoint.objects.filter(job=first, name="epoch-3.ckpt").exists()
    servers[-1].stop()
    down_at = time.monotonic()
    marks = tmp_path / "m2"
    second = submit(
        platform, script='echo "restored: $(cat "$TRAINYARD_RESUME_FROM")"', marks=marks, resume_from=str(first.id),
        max_retries=1,
    )  # fmt: skip
    drive_until(lambda: Job.objects.get(pk=second.pk).store_wait_since is not None, timeout=60)
    api = APIClient()
    api.force_authenticate(platform)
    shown = api.get(f"/api/v1/jobs/{second.id}/").json()
    assert shown["store_wait"] is not None and shown["store_wait"]["total_wait_s"] == 300.0, shown
    assert shown["store_wait"]["gives_up_at"] > shown["store_wait"]["since"]
    page = Client()
    page.force_login(platform)
    assert 'data-role="store-wait"' in page.get(f"/jobs/{second.id}/").content.decode()
    drive_until(lambda: time.monotonic() - down_at > 20, timeout=60, every=0.5)
    waiting = Job.objects.get(pk=second.pk)
    tries = waiting.attempts.count()
    assert waiting.retries_used == 0 and waiting.state in {"pending", "admitted", "starting", "running"}
    assert 2 <= tries <= 12, f"{tries} tries in 20 s: the pauses do not back off"
    assert all(a.reason == "CheckpointStoreUnavailable" for a in waiting.attempts.filter(ended_at__isnull=False))
    _start_store(var, servers)  # back on the ports it kept
    drive_until(lambda: settled(second), timeout=120)
    job = assert_settled(second, marks, state="succeeded")
    assert job.retries_used == 0 and job.store_wait_since is None
    assert runs(marks) == [str(tries + 1)] or len(runs(marks)) == 1
    from jobs import logstore

    last = job.attempts.order_by("-number").first()
    lines, _ = logstore.read_lines(logstore.attempt_dir(str(job.id), last.number))
    assert any(line.text == "restored: one" for line in lines), [line.text for line in lines]
