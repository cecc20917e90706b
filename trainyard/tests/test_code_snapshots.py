"""Bring your own code: a folder with a script, a local module and a config runs as a job in one command, through
the real CLI, API, local backend and sandbox; and every bad upload or reference is a 400 that names its problem."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import tarfile

import pytest
from rest_framework.test import APIClient
from trainyard_cli.code import files_of, pack

from jobs.models import CodeSnapshot, Job
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from trainyard.tests.test_cli import beat, cli  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db(transaction=True)


def project(root):
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text(
        "def describe(cfg):\n    return f\"lr={cfg['lr']} layers={cfg['layers']}\"\n"
    )
    (root / "config.json").write_text('{"lr": 0.01, "layers": 4}')
    (root / "train.py").write_text(
        "import json, os\nfrom pkg.model import describe\n"
        "cfg = json.load(open('config.json'))\nprint('trained', describe(cfg), 'in', os.getcwd())\n"
        "open('out.txt', 'w').write('written by the job')\n"
    )
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"x" * 1000)
    (root / ".trainyardignore").write_text("# data stays home\ndata/\n")
    return root


def test_a_folder_with_a_module_and_config_runs_in_one_command(cli, beat, celery_worker_thread, tmp_path, monkeypatch):  # noqa: E501, F811
    folder = project(tmp_path / "my-experiment")
    monkeypatch.chdir(folder)
    result = cli("run", "--team", "demo", "--queue", "train", "--", "python3", "train.py")
    assert result.code == 0, result.err
    assert "uploaded code sha256:" in result.err
    assert "trained lr=0.01 layers=4" in result.out + result.err
    job = Job.objects.get()
    assert job.state == "succeeded" and job.code_digest.startswith("sha256:")
    assert job.reproduce["code_digest"] == job.code_digest
    snapshot = CodeSnapshot.objects.get()
    assert snapshot.file_count == 5  # data/ was left out by .trainyardignore
    # The same files again: the snapshot is not sent twice, and the job's copy was its own to write.
    again = cli("run", "--team", "demo", "--queue", "train", "--detach", "--", "python3", "train.py")
    assert again.code == 0 and "already on the server" in again.err
    assert CodeSnapshot.objects.count() == 1 and (folder / "out.txt").exists() is False


def test_a_git_work_tree_sends_what_git_keeps(tmp_path):
    folder = project(tmp_path / "repo")
    (folder / ".gitignore").write_text("*.log\n")
    (folder / "run.log").write_text("noise")
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    names = files_of(folder)
    assert "run.log" not in names and "train.py" in names and "pkg/model.py" in names
    assert not any(n.startswith("data/") for n in names)
    # Reproducible: the same files give the same bytes and digest.
    assert pack(folder)[1] == pack(folder)[1]


def _archive(members) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for info, body in members:
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    return buffer.getvalue()


def _put(client, data: bytes, digest: str | None = None, team: str = "demo"):
    digest = digest or "sha256:" + hashlib.sha256(data).hexdigest()
    return client.put(f"/api/v1/code/{digest}/?team={team}", data=data, content_type="application/gzip")


def test_uploads_and_references_that_cannot_work_are_400s_that_say_why(platform, settings):  # noqa: F811
    client = APIClient()
    client.force_login(platform)
    good = _archive([(tarfile.TarInfo("a.py"), b"")])
    assert _put(client, good, digest="sha256:" + "0" * 64).json()["code"] == "code_digest_mismatch"
    link = tarfile.TarInfo("escape")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    assert _put(client, _archive([(link, None)])).json()["code"] == "invalid_code_archive"
    assert _put(client, _archive([(tarfile.TarInfo("../up.py"), b"")])).json()["code"] == "invalid_code_archive"
    assert _put(client, b"not a tar").json()["code"] == "invalid_code_archive"
    settings.TRAINYARD_CODE_MAX_BYTES = 10
    assert _put(client, good).json()["code"] == "code_too_large"
    settings.TRAINYARD_CODE_MAX_BYTES = 2**20
    assert _put(client, good, team="not-my-team").status_code == 404
    created = _put(client, good)
    assert created.status_code == 201 and created.json()["file_count"] == 1
    assert _put(client, good).status_code == 200  # idempotent
    body = {"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": ["true"]}
    for code, value in (("invalid_code", "main"), ("unknown_code", "sha256:" + "1" * 64)):
        answer = client.post("/api/v1/jobs/", {**body, "code": value}, format="json")
        assert answer.status_code == 400 and answer.json()["code"] == code, answer.json()
    settings.TRAINYARD_BACKEND = "volcano"
    settings.TRAINYARD_S3_URL = ""  # on Kubernetes the pods reach code through the object store: none here
    from jobs.tests.conftest import pin_catalog

    pin_catalog()
    answer = client.post("/api/v1/jobs/", {**body, "code": created.json()["digest"]}, format="json")
    assert answer.status_code == 400 and answer.json()["code"] == "code_not_supported"
    assert os.listdir(settings.TRAINYARD_CODE_ROOT / "demo") == [
        created.json()["digest"].removeprefix("sha256:") + ".tar.gz"
    ]


def test_a_script_the_sandbox_hides_fails_saying_so_and_how_to_bring_it(platform, celery_worker_thread, tmp_path):  # noqa: F811
    from jobs.tests.conftest import wait_for
    from jobs.tests.test_lifecycle_e2e import finished, submit

    script = tmp_path / "outside" / "train.py"
    script.parent.mkdir()
    script.write_text("print('never seen')\n")
    job = submit(platform, command=["python3", str(script)], max_retries=0)
    job = wait_for(lambda: finished(job), timeout=60)
    assert job.state == "failed" and job.failure_class == "user"
    assert f"{script} is on this machine but hidden by the job's sandbox" in job.suggestion
    assert "trainyard run" in job.message
