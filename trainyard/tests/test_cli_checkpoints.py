"""`trainyard checkpoints` and `trainyard submit --resume-from` against a live server, real local jobs and a real
S3 store (the session's SeaweedFS), plus the REST listing and download they use."""

import pytest

from jobs.models import Checkpoint, Job
from jobs.tests.conftest import platform  # noqa: F401 - fixture
from trainyard.tests.test_cli import beat, cli, job_yaml, write  # noqa: F401 - fixtures and helpers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SAVE = 'printf "%s" "$PAYLOAD" > "$TRAINYARD_CHECKPOINT_DIR/ckpt-42.bin"; mkdir "$TRAINYARD_CHECKPOINT_DIR/s-7"; ' \
       'echo a > "$TRAINYARD_CHECKPOINT_DIR/s-7/a"; echo b > "$TRAINYARD_CHECKPOINT_DIR/s-7/b"'  # fmt: skip


def test_checkpoints_are_listed_downloaded_and_resumed_from(
    cli,  # noqa: F811
    beat,  # noqa: F811
    celery_worker_thread,
    checkpoint_store,
    tmp_path,
    client,
):
    payload = "x" * 3000
    first = cli("submit", write(tmp_path, job_yaml(SAVE, env={"PAYLOAD": payload})), "--wait", "--interval", "0.2")
    assert first.code == 0, first.err
    job_id = first.out.strip()

    listing = cli("checkpoints", job_id)
    assert listing.code == 0, listing.err
    header, *rows = listing.out.splitlines()
    assert header.split()[:4] == ["ID", "NAME", "STEP", "SIZE"]
    assert [r.split()[1:3] for r in rows] == [["ckpt-42.bin", "42"], ["s-7", "7"]]  # highest step first

    as_json = cli("checkpoints", job_id, "--json")
    import json

    data = json.loads(as_json.out)
    single = next(c for c in data if c["name"] == "ckpt-42.bin")
    assert single["size_bytes"] == 3000 and single["attempt"] == 1 and len(single["sha256"]) == 64

    target = tmp_path / "got.bin"
    got = cli("checkpoints", job_id, "--download", str(single["id"]), "-o", str(target))
    assert got.code == 0, got.err
    assert target.read_text() == payload  # the bytes came back from the object store, through the API
    folder = next(c for c in data if c["name"] == "s-7")
    got = cli("checkpoints", job_id, "--download", str(folder["id"]), "--dir", str(tmp_path / "all"))
    assert got.code == 0 and (tmp_path / "all" / "s-7" / "b").read_text() == "b\n"
    missing = cli("checkpoints", job_id, "--download", "999999")
    assert missing.code == 4 and "no checkpoint 999999" in missing.err

    # The API itself: a folder checkpoint needs ?path=, an unknown one is a 404.
    client.force_login(Job.objects.get(pk=job_id).owner)
    response = client.get(f"/api/v1/jobs/{job_id}/checkpoints/{folder['id']}/download/")
    assert response.status_code == 400 and response.json()["code"] == "invalid_checkpoint_path"
    assert client.get(f"/api/v1/jobs/{job_id}/checkpoints/999999/download/").status_code == 404
    page = client.get(f"/jobs/{job_id}/")
    assert b"ckpt-42.bin" in page.content and b"s-7/a" in page.content

    resumed = cli(
        "submit",
        write(tmp_path, job_yaml('echo "from $TRAINYARD_RESUME_FROM"; wc -c < "$TRAINYARD_RESUME_FROM"'), "r.yaml"),
        "--resume-from",
        job_id,
        "--wait",
        "--interval",
        "0.2",
    )
    assert resumed.code == 0, resumed.err
    new_id = resumed.out.strip()
    assert Job.objects.get(pk=new_id).resume_from_id is not None
    logs = cli("logs", new_id)
    assert "/checkpoints/attempt-1/ckpt-42.bin" in logs.out and "3000" in logs.out, logs.out
    assert Checkpoint.objects.filter(job_id=new_id).count() == 0  # restored files are not saved again


def test_resume_from_is_checked(cli, tmp_path):  # noqa: F811
    bad = cli("submit", write(tmp_path, job_yaml("true")), "--resume-from", "not-a-job")
    assert bad.code == 4 and "is not a job id" in bad.err
    unknown = cli("submit", write(tmp_path, job_yaml("true")), "--resume-from", "3f2c6e1a-0b7d-4c52-9a51-1d0e5b7c9f20")
    assert unknown.code == 4 and "unknown_resume_from" in unknown.err
    none = cli("checkpoints", "3f2c6e1a-0b7d-4c52-9a51-1d0e5b7c9f20")
    assert none.code == 4 and "not found" in none.err
