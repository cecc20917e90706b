"""Submissions when the database or the broker goes away half-way: a 503 only when nothing was created, or one whose
body names the job; never an answer that invites a duplicate. The faults are real: PostgreSQL ends the request's
own backend (pg_terminate_backend) right after the commit, or during the commit (a deferred trigger), and the
broker the dispatch wake-up is sent to is a Redis that has stopped.
"""

from __future__ import annotations

from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from jobs.models import Job
from quotas.tokens import token_create
from tests.faults.conftest import drive_until, settled
from tests.faults.harness import PrivateRedis
from trainyard.tests.test_cli import cli  # noqa: F401 - the CLI against a live server, as its own tests run it

pytestmark = [pytest.mark.faults]

BODY = {"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": ["true"]}


@pytest.fixture
def api(platform):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_create(user=platform, name='outage')[1]}")
    return client


def _dsn() -> str:
    s = connection.settings_dict
    return f"host={s['HOST']} port={s['PORT']} dbname={s['NAME']} user={s['USER']} password={s['PASSWORD']}"


def _end_backend_after_commit():
    """Once the request's job row is written, end its database session the moment the transaction commits."""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid

    def end() -> None:
        with psycopg.connect(_dsn(), autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))

    def wrapper(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if 'INSERT INTO "jobs_job" ' in sql:  # the job's row (with its events in the same statement)
            transaction.on_commit(end)  # runs first: before the dispatch wake-up and the answer's reads
        return result

    return connection.execute_wrapper(wrapper)


@pytest.mark.parametrize("path", ["/api/v1/jobs/", "/api/v1/jobs/batch/", "template"])
def test_database_gone_after_the_commit_names_the_created_job(api, platform, path):
    """The answer is the created job(s): a 201 where the answer needs no more reads (a batch), else a 503 that
    names them; either way a client that sends it again with its key gets the same job(s), never a second."""
    body = {"jobs": [BODY, BODY]} if path.endswith("batch/") else BODY
    if path == "template":
        from jobs.services import template_create

        template = template_create(user=platform, team_slug="demo", name="outage", body=BODY)
        path, body = f"/api/v1/templates/{template.pk}/submit/", {}
    with _end_backend_after_commit():
        response = api.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY="after-commit")
    connection.close()  # what the end of a request does to a broken connection (the test client does not)
    made = sorted(str(pk) for pk in Job.objects.values_list("id", flat=True))
    assert len(made) == (2 if path.endswith("batch/") else 1)
    answer = response.json()
    if response.status_code == 201:
        assert path.endswith("batch/") and sorted(j["id"] for j in answer) == made
    else:
        assert response.status_code == 503, response.content
        assert response["Retry-After"] == "5"
        assert answer["code"] == "database_unavailable" and answer["job_exists"] is True
        assert [answer["job_id"]] == made
        assert made[0] in answer["detail"] and "do not submit again" in answer["detail"]
    again = api.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY="after-commit")
    assert again.status_code == 200, again.content
    shown = [j["id"] for j in again.json()] if path.endswith("batch/") else [again.json()["id"]]
    assert sorted(shown) == made and Job.objects.count() == len(made)


@contextmanager
def _end_session_during_commit(times: int = 1):
    """A deferred trigger on the job row ends its own session while COMMIT runs, the first `times` commits (a
    sequence counts them: it is not rolled back with the transaction). Any connection: the live server's too."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE SEQUENCE faults_commits")
        cursor.execute(
            "CREATE FUNCTION faults_end_self() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF nextval('faults_commits') <= {int(times)} THEN "
            "PERFORM pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(5); END IF; RETURN NULL; END $$"
        )
        cursor.execute(
            "CREATE CONSTRAINT TRIGGER faults_end_at_commit AFTER INSERT ON jobs_job "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION faults_end_self()"
        )
    try:
        yield
    finally:
        connection.close()
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER faults_end_at_commit ON jobs_job")
            cursor.execute("DROP FUNCTION faults_end_self()")
            cursor.execute("DROP SEQUENCE faults_commits")


def test_database_gone_during_the_commit_names_the_job_it_may_have_made(api, platform):
    """The session ends while COMMIT runs: the client cannot know whether the row was kept, so the answer names
    the job's id and says so; a GET tells (404 here), and the same key never makes two."""
    with _end_session_during_commit():
        response = api.post("/api/v1/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="during-commit")
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "5"
    answer = response.json()
    assert answer["code"] == "database_unavailable" and answer["job_exists"] is None
    assert answer["job_id"] in answer["detail"]
    assert api.get(f"/api/v1/jobs/{answer['job_id']}/").status_code == 404  # this commit did not go through
    assert not Job.objects.exists()
    again = api.post("/api/v1/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="during-commit")
    assert again.status_code == 201, again.content
    assert api.post("/api/v1/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="during-commit").status_code == 200
    assert Job.objects.count() == 1


def test_cli_submit_sends_again_with_its_own_key_and_makes_one_job(cli, tmp_path):  # noqa: F811
    """`trainyard submit` without --idempotency-key: its first send dies in the commit (503), it sends again with
    the key it made, and exactly one job exists; the user sees one submission."""
    (tmp_path / "job.yaml").write_text("team: demo\nqueue: train\nspec: shared\nimage: python-3.11\ncommand: 'true'\n")
    with _end_session_during_commit():
        result = cli("submit", str(tmp_path / "job.yaml"))
    assert result.code == 0, result.err
    assert "sending it again with the same Idempotency-Key" in result.err
    job = Job.objects.get()
    assert result.out.strip() == str(job.id) and f"submitted job {job.id}" in result.err
    assert job.idempotency_key.startswith("cli-")


def test_cli_submit_that_cannot_get_through_names_the_job_and_the_key(cli, tmp_path, monkeypatch):  # noqa: F811
    from trainyard_cli.main import commands

    monkeypatch.setattr(commands, "SUBMIT_RETRIES", 1)
    (tmp_path / "job.yaml").write_text("team: demo\nqueue: train\nspec: shared\nimage: python-3.11\ncommand: 'true'\n")
    with _end_session_during_commit(times=2):
        result = cli("submit", str(tmp_path / "job.yaml"), "--idempotency-key", "ci-run-7")
    assert result.code == 6, result.err
    assert "it is not known whether job" in result.err and "--idempotency-key ci-run-7" in result.err
    assert not Job.objects.exists()
    assert cli("submit", str(tmp_path / "job.yaml"), "--idempotency-key", "ci-run-7").code == 0
    assert Job.objects.count() == 1


def test_cli_run_sends_again_with_its_own_key_and_makes_one_job(cli, tmp_path, monkeypatch):  # noqa: F811
    """`trainyard run` (pack the folder, submit, follow) resends as `submit` does: one job, the user's command once."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    with _end_session_during_commit():
        result = cli("run", "--team", "demo", "--queue", "train", "--spec", "shared", "--detach", "--", "true")
    assert result.code == 0, result.err
    assert "sending it again with the same Idempotency-Key" in result.err
    job = Job.objects.get()
    assert result.out.strip() == str(job.id) and job.idempotency_key.startswith("cli-")
    assert job.code_digest.startswith("sha256:")


def _portal_form(key):
    """The demo user's browser session and a submit form carrying its idempotency key."""
    from django.test import Client

    client = Client()
    assert client.login(username="demo", password="demo-pass-123")
    form = {
        "team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": "true",
        "max_retries": "0", "idempotency_key": key,
    }  # fmt: skip
    return client, form


def test_portal_form_names_the_job_it_may_have_made_when_the_database_goes_during_the_commit(platform):
    """The page cannot know whether the row was kept: it names the job and says so; the same form sent again
    makes the job once (here the first commit did not go through)."""
    client, form = _portal_form("form-during-commit")
    with _end_session_during_commit():
        response = client.post("/jobs/new/", form)
    connection.close()
    assert response.status_code == 503, response.content[:2000]
    assert response["Retry-After"] == "5"
    page = response.content.decode()
    assert "not known whether it was kept" in page and "never makes a second job" in page
    assert not Job.objects.exists()
    again = client.post("/jobs/new/", form)
    assert again.status_code == 302, again.content[:2000]
    job = Job.objects.get()
    assert again["Location"].endswith(f"/jobs/{job.id}/")
    assert client.post("/jobs/new/", form).status_code == 302 and Job.objects.count() == 1


def test_portal_form_names_the_job_when_the_database_goes_after_the_commit(platform):
    client, form = _portal_form("form-after-commit")
    with _end_backend_after_commit():
        response = client.post("/jobs/new/", form)
    connection.close()
    assert response.status_code == 503, response.content[:2000]
    assert response["Retry-After"] == "5"
    job = Job.objects.get()
    page = response.content.decode()
    assert str(job.id) in page and f"/jobs/{job.id}/" in page and "Do not submit it again" in page
    again = client.post("/jobs/new/", form)  # the browser sends the same form again
    assert again.status_code == 302 and again["Location"].endswith(f"/jobs/{job.id}/")
    assert Job.objects.count() == 1


def test_broker_gone_after_the_commit_is_a_201_and_the_beat_pass_admits_the_job(api, tmp_path, fast_lifecycle, caplog):
    """The dispatch wake-up cannot be sent (its broker stopped): the job exists, so the answer is 201; the
    dispatcher's beat pass finds it without any message."""
    from trainyard.celery import app

    dead = PrivateRedis(tmp_path / "redis")  # never started: nothing listens on its port
    saved = app.conf.broker_url
    app.conf.broker_url = dead.url
    app.pool.force_close_all()
    app._pool = None
    app.amqp._producer_pool = None
    try:
        response = api.post("/api/v1/jobs/", BODY, format="json")
    finally:
        app.conf.broker_url = saved
        app.pool.force_close_all()
        app._pool = None
        app.amqp._producer_pool = None
    assert response.status_code == 201, response.content
    assert any("dispatch_request_unsent" in record.getMessage() for record in caplog.records)
    job = Job.objects.get(pk=response.json()["id"])
    assert settled(drive_until(lambda: settled(job), timeout=60)).state == "succeeded"
