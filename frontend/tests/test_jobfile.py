"""A job as a file: the job page's job.yaml (its reproduce request) is read by the CLI's own job-file reader and
accepted by the API; the submit page imports a job.yaml into its form; bad files are clear 400s that keep the page."""

from __future__ import annotations

import io

import pytest
import yaml
from trainyard_cli.code import pack
from trainyard_cli.jobfile import load_jobfile

from jobs import services
from jobs.models import Job
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture

pytestmark = pytest.mark.django_db(transaction=True)


def _code(client, tmp_path, team="demo") -> str:
    """A real code snapshot, packed and uploaded as `trainyard run` does it."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text("print('hi')\n")
    data, digest, _count = pack(folder)
    r = client.put(f"/api/v1/code/{digest}/?team={team}", data=data, content_type="application/gzip")
    assert r.status_code in (200, 201), r.content
    return digest


def _job(user, **extra) -> Job:
    data = {
        "name": "lr sweep 3",
        "team": "demo",
        "queue": "debug",
        "spec": "shared",
        "image": "python-3.11",
        "command": ["python", "train.py", "--lr", "0.1"],
        "env": {"EPOCHS": "3"},
        "labels": {"exp": "sweep"},
        "timeout_s": 600,
        **extra,
    }
    return services.job_submit(user=user, data=data)[0]


def test_the_exported_job_yaml_is_what_trainyard_submit_sends(platform, client, tmp_path):  # noqa: F811
    client.force_login(platform)
    digest = _code(client, tmp_path)
    job = _job(platform, code=digest, ci={"git_commit": "0123abc"})
    r = client.get(f"/jobs/{job.id}/job.yaml")
    assert r.status_code == 200 and r["Content-Type"].startswith("application/yaml")
    assert r["Content-Disposition"] == 'attachment; filename="lr-sweep-3.job.yaml"'
    text = r.content.decode()
    assert text.startswith(f"# Reproduces job {job.id} (lr sweep 3)")
    path = tmp_path / "job.yaml"
    path.write_text(text)
    parsed = load_jobfile(str(path))  # the CLI's own reader, with its duplicate-key and shape checks
    assert parsed.data == yaml.safe_load(text)
    assert parsed.data["code"] == digest and parsed.data["command"] == ["python", "train.py", "--lr", "0.1"]
    assert parsed.data["env"] == {"EPOCHS": "3"} and parsed.data["ci"] == {"git_commit": "0123abc"}
    assert "args" not in parsed.data and "mounts" not in parsed.data  # empty fields are left out
    r = client.post("/api/v1/jobs/", data=parsed.data, content_type="application/json")
    assert r.status_code == 201, r.content
    again = Job.objects.get(pk=r.json()["id"])
    for field in ("code_digest", "command", "env", "labels", "timeout_s", "image_reference", "image_digest", "ci"):
        assert getattr(again, field) == getattr(job, field), field
    assert again.spec_id == job.spec_id and again.queue_id == job.queue_id


def test_another_teams_job_yaml_is_not_found(platform, client):  # noqa: F811
    from quotas.tests.factories import UserFactory

    job = _job(platform)
    client.force_login(UserFactory())
    assert client.get(f"/jobs/{job.id}/job.yaml").status_code == 404


def test_the_submit_page_imports_a_job_yaml_and_submits_it(platform, client, tmp_path):  # noqa: F811
    client.force_login(platform)
    digest = _code(client, tmp_path)
    job = _job(platform, code=digest)
    text = client.get(f"/jobs/{job.id}/job.yaml").content
    upload = io.BytesIO(text)
    upload.name = "sweep.job.yaml"
    r = client.post("/jobs/new/import/", {"jobfile": upload})
    assert r.status_code == 200, r.content.decode()[-2000:]
    page = r.content.decode()
    assert "Filled in from the job file sweep.job.yaml." in page
    form = r.context["form"]
    assert form.initial["command"] == "python train.py --lr 0.1"
    assert form.initial["env"] == "EPOCHS=3" and form.initial["labels"] == "exp=sweep"
    assert digest in form.initial["carried"]  # the code snapshot travels with the form
    body = {k: v for k, v in form.initial.items() if v not in (None, False)}
    body["gpu_models"] = []
    r = client.post("/jobs/new/", body)
    assert r.status_code == 302, r.content.decode()[-3000:]
    new = Job.objects.exclude(pk=job.pk).get()
    assert new.code_digest == digest and new.command == job.command and new.env == job.env


@pytest.mark.parametrize(
    ("content", "code"),
    [
        (b"team: demo\ncommand: [python\n", "jobfile_invalid_yaml"),
        (b"- team: demo\n", "jobfile_not_mapping"),
        (b"team: demo\nteam: other\n", "jobfile_duplicate_field"),
        (b"team: demo\ngpu: 1\ncomand: train.py\n", "jobfile_unknown_field"),
        (b"team: demo\ncode: .\n", "jobfile_code_folder"),
        (b"\xff\xfe", "jobfile_not_text"),
        (b"", "jobfile_not_mapping"),
    ],
)
def test_a_bad_job_file_is_a_clear_400_and_keeps_the_page(platform, client, content, code):  # noqa: F811
    client.force_login(platform)
    upload = io.BytesIO(content)
    upload.name = "job.yaml"
    r = client.post("/jobs/new/import/", {"jobfile": upload})
    assert r.status_code == 400
    page = r.content.decode()
    assert f'<code class="error-code">{code}</code>' in page, page[page.find("jobfile-errors") - 200 :][:800]
    assert 'id="field-command"' in page  # the submit form is still there
    assert not Job.objects.exists()


def test_import_without_a_file_says_so(platform, client):  # noqa: F811
    client.force_login(platform)
    r = client.post("/jobs/new/import/", {})
    assert r.status_code == 400 and b"jobfile_missing" in r.content
