"""The object store (a real embedded SeaweedFS of the test's own) moving or going away under running local jobs."""

from __future__ import annotations

import socket

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
