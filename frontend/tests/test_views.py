"""Portal pages through Django's test client: each page for a member, isolation between teams, the submit
form's errors (the same message and code as the API), CSRF and membership on the job actions, paging."""

import html
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from frontend import wording
from frontend.tests.conftest import login, submit
from jobs import lifecycle, logstore, services, store
from jobs.backends import Observation
from jobs.models import Job
from jobs.states import JobState, PendingReason
from quotas.models import Queue

pytestmark = pytest.mark.django_db


def page_urls(job):
    return [
        "/jobs/",
        "/jobs/new/",
        f"/jobs/{job.id}/",
        f"/jobs/{job.id}/live/",
        "/queues/",
        "/queues/train/",
        "/teams/demo/",
        "/images/",
        "/gpus/",
    ]


def error_block(body: str, field: str) -> str:
    match = re.search(rf'<div class="field-error" id="err-{field}">(.*?)</div>', body, re.S)
    assert match, f"no error shown next to {field}"
    return html.unescape(match.group(1))


def test_anonymous_users_are_sent_to_the_login_page(portal):
    job = submit(portal.demo)
    for url in page_urls(job):
        response = Client().get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/?next="), url


def test_login_page_logs_in_and_lands_on_the_job_list(portal):
    client = Client()
    page = client.get("/login/")
    assert page.status_code == 200 and 'for="id_username"' in page.content.decode()
    response = client.post("/login/", {"username": "demo", "password": "demo-pass-123"}, follow=True)
    assert response.redirect_chain[-1][0] == "/jobs/"
    assert b"demo" in response.content
    wrong = Client().post("/login/", {"username": "demo", "password": "nope"})
    assert wrong.status_code == 200 and b'role="alert"' in wrong.content


def test_every_page_renders_for_a_member_with_the_nav_and_language_switch(portal):
    job = submit(portal.demo)
    client = login(portal.demo)
    for url in page_urls(job):
        response = client.get(url)
        assert response.status_code == 200, url
        body = response.content.decode()
        if not url.endswith("/live/"):
            assert 'href="/queues/"' in body and 'href="/teams/demo/"' in body, url
            assert 'value="zh-hans"' in body and '<main id="main"' in body, url


def test_another_teams_job_and_team_are_not_found(portal):
    theirs = submit(portal.outsider, team="vision")
    client = login(portal.demo)
    for url in [
        f"/jobs/{theirs.id}/",
        f"/jobs/{theirs.id}/live/",
        f"/jobs/{theirs.id}/logs/download/",
        "/teams/vision/",
    ]:
        assert client.get(url).status_code == 404, url
    assert "belongs to a team you are not in" in client.get(f"/jobs/{theirs.id}/").content.decode()
    for url in [f"/jobs/{theirs.id}/cancel/", f"/jobs/{theirs.id}/reproduce/"]:
        assert client.post(url).status_code == 404, url
    assert Job.objects.get(pk=theirs.pk).state == JobState.PENDING
    assert Job.objects.count() == 1


def test_job_list_shows_only_visible_jobs_and_filters_like_the_api(portal):
    mine = submit(portal.demo, name="mine-debug", queue="debug")
    submit(portal.demo, name="mine-train")
    submit(portal.outsider, team="vision", name="their-job")
    client = login(portal.demo)
    body = client.get("/jobs/").content.decode()
    assert "mine-debug" in body and "mine-train" in body and "their-job" not in body
    body = client.get("/jobs/?queue=debug").content.decode()
    assert "mine-debug" in body and "mine-train" not in body
    with_state = client.get("/jobs/?state=pending&mine=1").content.decode()
    assert "mine-debug" in with_state
    assert "mine-debug" not in client.get("/jobs/?state=running").content.decode()
    states = client.get(f"/jobs/states.json?id={mine.id}&id=not-a-uuid").json()["jobs"]
    assert states[str(mine.id)]["state"] == "pending" and states[str(mine.id)]["label"] == "pending"


def test_job_list_pages_by_keys_never_by_offset(portal):
    for i in range(60):
        submit(portal.demo, name=f"job-{i:02d}")
    client = login(portal.demo)
    with CaptureQueriesContext(connection) as queries:
        first = client.get("/jobs/")
    assert len(queries) <= 15
    assert not any("OFFSET" in q["sql"].upper() for q in queries.captured_queries)
    names_first = re.findall(r">(job-\d\d)</a>", first.content.decode())
    assert names_first[:2] == ["job-59", "job-58"] and len(names_first) == 50
    older = re.search(r'href="(\?before=[^"]+)" rel="next"', first.content.decode()).group(1)
    second = client.get("/jobs/" + html.unescape(older)).content.decode()
    names_second = re.findall(r">(job-\d\d)</a>", second)
    assert names_second == [f"job-{i:02d}" for i in range(9, -1, -1)]
    assert 'rel="next"' not in second
    newer = re.search(r'href="(\?after=[^"]+)" rel="prev"', second).group(1)
    back = client.get("/jobs/" + html.unescape(newer)).content.decode()
    assert re.findall(r">(job-\d\d)</a>", back) == names_first


def test_submit_form_creates_the_job_and_redirects_to_its_page(portal):
    client = login(portal.demo)
    form = client.get("/jobs/new/").content.decode()
    key = re.search(r'name="idempotency_key" value="([0-9a-f]+)"', form).group(1)
    data = {
        "idempotency_key": key,
        "team": "demo",
        "queue": "debug",
        "spec": "shared",
        "image": "python-3.11",
        "command": "python train.py --lr 0.1",
        "env": "EPOCHS=3\n# a comment\n\nSEED = 7",
        "labels": "experiment=lr-sweep",
        "tensorboard": "on",
        "max_retries": "1",
    }
    response = client.post("/jobs/new/", data)
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.id}/"
    assert job.command == ["python", "train.py", "--lr", "0.1"] and job.env == {"EPOCHS": "3", "SEED": "7"}
    assert job.labels == {"experiment": "lr-sweep"} and job.tensorboard and job.max_retries == 1
    assert job.queue.name == "debug" and job.spec.name == "shared" and job.owner == portal.demo
    again = client.post("/jobs/new/", data)  # a double click: the same job, not a second one
    assert again["Location"] == f"/jobs/{job.id}/" and Job.objects.count() == 1
    changed = client.post("/jobs/new/", {**data, "command": "python eval.py"})  # back button, edited
    assert Job.objects.count() == 2 and changed["Location"] != f"/jobs/{job.id}/"
    assert client.post("/jobs/new/", {**data, "command": "python eval.py"})["Location"] == changed["Location"]
    assert Job.objects.count() == 2


def test_submit_form_shows_the_spec_guarantees_queue_waits_and_image_compatibility(portal):
    from images.models import BaseImage

    BaseImage.objects.create(name="future-cuda", reference="nvcr.io/nvidia/future:99", min_driver_version="999.1")
    body = login(portal.demo).get("/jobs/new/").content.decode()
    assert "whole GPUs, exclusive" in body and "25% of its compute and 2/8 of its memory" in body
    assert "about 4x vs a whole card" in body and "250 GPU-milli" in body
    assert "0 jobs waiting" in body
    future = re.search(r'<input type="radio" id="image-\d+" name="image" value="future-cuda"[^>]*>', body).group(0)
    assert "disabled" in future and "no node's driver is new enough" in body


API_EQUIVALENT = [
    # (form fields, API body fields, the field that shows the error, code)
    (
        {"queue": "debug", "spec": "guaranteed"},
        {"queue": "debug", "spec": "guaranteed"},
        "spec",
        "spec_not_allowed_in_queue",
    ),
    ({"timeout_s": "100000000"}, {"timeout_s": 100000000}, "timeout_s", "timeout_exceeds_queue_maximum"),
    ({"timeout_s": "soon"}, {"timeout_s": "soon"}, "timeout_s", "invalid"),
    ({"env": "CUDA_VISIBLE_DEVICES=0"}, {"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env", "reserved_env_name"),
    ({"env": "1BAD=x"}, {"env": {"1BAD": "x"}}, "env", "invalid_env_name"),
    ({"command": "  "}, {"command": "  "}, "command", "empty_command"),
    ({"command": "python 'unclosed"}, {"command": "python 'unclosed"}, "command", "invalid_command"),
    (
        {"image": "__reference__", "image_reference": "evil.example.com/x:1"},
        {"image": "evil.example.com/x:1"},
        "image",
        "image_registry_not_allowed",
    ),
    ({"queue": "nope"}, {"queue": "nope"}, "queue", "unknown_queue"),
    (
        {"spec": "guaranteed", "gpus": "8"},
        {"spec": "guaranteed", "gpus": 8},
        "spec",
        "request_exceeds_queue_capability",
    ),
    ({"max_retries": "11"}, {"max_retries": 11}, "max_retries", "invalid_max_retries"),
]


@pytest.mark.parametrize(("form_fields", "api_fields", "field", "code"), API_EQUIVALENT)
def test_form_errors_are_the_apis_next_to_the_field(portal, form_fields, api_fields, field, code):
    base_form = {
        "team": "demo",
        "queue": "train",
        "spec": "shared",
        "image": "python-3.11",
        "command": "python train.py",
    }
    base_api = {
        "team": "demo",
        "queue": "train",
        "spec": "shared",
        "image": "python-3.11",
        "command": "python train.py",
    }
    api = APIClient()
    api.force_authenticate(portal.demo)
    api_response = api.post("/api/v1/jobs/", {**base_api, **api_fields}, format="json")
    assert api_response.status_code == 400
    api_error = api_response.json()["fields"][field][0]
    assert api_error["code"] == code

    response = login(portal.demo).post("/jobs/new/", {**base_form, **form_fields})
    assert response.status_code == 400
    shown = error_block(response.content.decode(), field)
    assert api_error["message"] in shown and f'<code class="error-code">{code}</code>' in shown
    assert 'role="alert"' in response.content.decode()
    assert Job.objects.count() == 0


def test_form_line_errors_name_the_line(portal):
    response = login(portal.demo).post(
        "/jobs/new/",
        {
            "team": "demo",
            "queue": "train",
            "spec": "shared",
            "image": "python-3.11",
            "command": "x",
            "env": "GOOD=1\nno equals sign here",
            "labels": "=nokey",
        },
    )
    assert response.status_code == 400
    body = response.content.decode()
    assert "line 2: expected KEY=value" in error_block(body, "env") and "invalid_env" in error_block(body, "env")
    assert "invalid_labels" in error_block(body, "labels")
    assert 'aria-describedby="hint-env err-env" aria-invalid="true"' in body  # the hint and the error, read out


def test_cancel_and_reproduce_need_csrf_and_membership(portal):
    job = submit(portal.demo, name="to-cancel")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(portal.demo)
    assert strict.post(f"/jobs/{job.id}/cancel/").status_code == 403
    assert strict.post(f"/jobs/{job.id}/reproduce/").status_code == 403
    asks = strict.get(f"/jobs/{job.id}/cancel/")  # without JavaScript the confirmation is a page of its own
    assert asks.status_code == 200 and 'name="confirmed" value="1"' in asks.content.decode()
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING and Job.objects.count() == 1

    page = strict.get(f"/jobs/{job.id}/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    outsider = Client(enforce_csrf_checks=True)
    outsider.force_login(portal.outsider)
    outsider_page = outsider.get("/jobs/").content.decode()
    outsider_token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', outsider_page).group(1)
    assert (
        outsider.post(f"/jobs/{job.id}/cancel/", {"csrfmiddlewaretoken": outsider_token, "confirmed": "1"}).status_code
        == 404
    )
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING

    reproduced = strict.post(f"/jobs/{job.id}/reproduce/", {"csrfmiddlewaretoken": token})
    copy = Job.objects.exclude(pk=job.pk).get()
    assert reproduced.status_code == 302 and reproduced["Location"] == f"/jobs/{copy.id}/"
    assert copy.reproduced_from_id == job.id and copy.image_digest == job.image_digest
    assert copy.events.filter(kind="reproduced").exists()

    unconfirmed = strict.post(f"/jobs/{job.id}/cancel/", {"csrfmiddlewaretoken": token})
    assert unconfirmed.status_code == 200 and Job.objects.get(pk=job.pk).state == JobState.PENDING
    assert "Cancel job to-cancel?" in unconfirmed.content.decode()
    cancelled = strict.post(f"/jobs/{job.id}/cancel/", {"csrfmiddlewaretoken": token, "confirmed": "1"}, follow=True)
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
    assert b"Cancelled." in cancelled.content
    again = strict.post(f"/jobs/{copy.id}/cancel/", {"csrfmiddlewaretoken": token, "confirmed": "1"}, follow=True)
    assert again.status_code == 200 and Job.objects.get(pk=copy.pk).state == JobState.CANCELLED


def test_cancelling_a_finished_job_says_why(portal):
    job = submit(portal.demo)
    lifecycle.job_cancel(job_id=job.id, actor="demo")
    response = login(portal.demo).post(f"/jobs/{job.id}/cancel/", {"confirmed": "1"}, follow=True)
    assert response.status_code == 200 and b"Cancelled." in response.content
    done = submit(portal.demo)
    store.dispatch(queue_ids=[done.queue_id])
    attempt = done.attempts.get()
    services.job_transition(job_id=done.id, to=JobState.STARTING, actor="test")
    lifecycle.attempt_finish(attempt_id=attempt.id, obs=Observation(phase="succeeded", exit_code=0))
    response = login(portal.demo).post(f"/jobs/{done.id}/cancel/", {"confirmed": "1"}, follow=True)
    assert "Cannot cancel: the job already succeeded" in response.content.decode()
    asked = login(portal.demo).get(f"/jobs/{done.id}/cancel/", follow=True)  # nothing to ask about
    assert "Cannot cancel: the job is already succeeded." in asked.content.decode()


def test_job_page_shows_attempts_with_failure_class_rule_and_suggestion(portal):
    job = submit(portal.demo, name="oom-job")
    store.dispatch(queue_ids=[job.queue_id])
    gpus = login(portal.demo).get("/gpus/").content.decode()
    assert "oom-job" in gpus and "Emulated GPUs." in gpus
    assert "oom-job" not in login(portal.outsider).get("/gpus/").content.decode()
    assert "another team's job" in login(portal.outsider).get("/gpus/").content.decode()

    attempt = job.attempts.get()
    lifecycle.attempt_finish(attempt_id=attempt.id, obs=Observation(phase="failed", exit_code=137, reason="OOMKilled"))
    body = html.unescape(login(portal.demo).get(f"/jobs/{job.id}/").content.decode())
    assert "<code>oom-killed</code>" in body and "user: the job's code, input or request" in body
    assert "choose a spec with more memory per GPU" in body and "no retry" in body
    timeline = body[body.index('<ol class="events"') :]
    assert timeline.index("pending → admitted") < timeline.index("admitted → failed")
    assert "exited with code 137 (OOMKilled)" in timeline


def test_queue_page_explains_the_line_and_hides_other_teams_jobs(portal):
    Queue.objects.filter(name="train").update(state="closed")
    theirs = submit(portal.outsider, team="vision", name="their-secret-job")
    mine = submit(portal.demo, name="my-waiting-job")
    store.dispatch(queue_ids=[mine.queue_id])
    assert Job.objects.get(pk=mine.pk).queue_position == 2 and Job.objects.get(pk=theirs.pk).queue_position == 1
    body = login(portal.demo).get("/queues/train/").content.decode()
    assert "their-secret-job" not in body and "olga" not in body and "another team's job" in body
    assert "my-waiting-job" in body and "position 2, behind 1 job" in body
    assert html.escape(str(wording.PENDING_REASONS[PendingReason.QUEUE_CLOSED])) in body
    page = login(portal.demo).get(f"/jobs/{mine.id}/").content.decode()
    assert "position 2 in queue train" in page


def test_a_long_line_lists_its_head_and_your_own_jobs_wherever_they_wait(
    portal, monkeypatch, django_assert_max_num_queries
):
    """A queue page reads the whole line for its estimates but lists only its first jobs (and the reader's own,
    further back), so a line of thousands does not make a page of thousands."""
    from frontend.views import queues as views

    monkeypatch.setattr(views, "LINE_SHOWN", 3)
    monkeypatch.setattr(views, "MINE_SHOWN", 2)
    Queue.objects.filter(name="train").update(state="closed")
    for i in range(5):
        submit(portal.outsider, team="vision", name=f"theirs-{i}")
    mine = [submit(portal.demo, name=f"mine-{i}") for i in range(3)]
    store.dispatch(queue_ids=[mine[0].queue_id])
    client = login(portal.demo)
    with django_assert_max_num_queries(40):
        body = client.get("/queues/train/").content.decode()
    assert body.count("another team's job") == 3  # the first three places
    assert "5 more jobs wait behind these" in body
    # The reader's first two jobs (places 6 and 7) are listed above the line, and the third is counted.
    assert "mine-0" in body and "position 6, behind 5 jobs" in body and "mine-1" in body and "mine-2" not in body
    assert "…and 1 more of yours further back." in body


def test_every_pending_reason_has_a_plain_sentence():
    assert set(PendingReason.values) <= set(wording.PENDING_REASONS)
    assert set(JobState.values) <= set(wording.STATE_LABELS)


def test_team_page_shows_quota_usage_by_spec_and_members(portal):
    job = submit(portal.demo, spec="performance")
    store.dispatch(queue_ids=[job.queue_id])
    body = login(portal.demo).get("/teams/demo/").content.decode()
    assert "0.75 of 4 used (19%)" in body  # GPU: one performance slice of a 4-GPU quota
    assert "performance" in body and "demo" in body and "maintainer" in body


def test_image_catalog_has_the_compatibility_matrix(portal):
    from images.models import BaseImage

    BaseImage.objects.create(name="future-cuda", reference="nvcr.io/nvidia/future:99", min_driver_version="999.1")
    body = login(portal.demo).get("/images/").content.decode()
    assert "Compatibility matrix" in body and "driver too old" in body and "no node can run it" in body
    assert body.count("✓ runs") >= 4


def test_log_download_streams_every_kept_line(portal):
    job = submit(portal.demo, name='my "quoted" run')
    store.dispatch(queue_ids=[job.queue_id])
    writer = logstore.LogWriter(logstore.attempt_dir(str(job.id), 1))
    for i in range(1, 12346):
        writer.write_line(f"step {i}")
    writer.close()
    response = login(portal.demo).get(f"/jobs/{job.id}/logs/download/?attempt=1")
    assert response.status_code == 200 and response.streaming
    assert response["Content-Disposition"] == f'attachment; filename="my_quoted_run-{job.id}-attempt-1.log"'
    lines = b"".join(response.streaming_content).decode().splitlines()
    assert lines == [f"step {i}" for i in range(1, 12346)]


def test_language_switch_to_chinese(portal):
    client = login(portal.demo)
    response = client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/jobs/"})
    assert response.status_code == 302
    body = client.get("/jobs/").content.decode()
    assert 'lang="zh-Hans"' in body and "作业" in body and "提交" in body
    body = client.get("/queues/train/").content.decode()
    assert "队列" in body


def test_durations_and_sizes_read_naturally():
    from django.utils import translation

    from frontend.templatetags.portal import duration, gpus, mib

    with translation.override("en"):
        assert [duration(45), duration(600), duration(3700), duration(7200), duration(7 * 86400 + 3600)] == [
            "45 s",
            "10 min",
            "1 h 1 min",
            "2 h",
            "7 d 1 h",
        ]
        assert duration(7 * 86400) == "7 d" and duration(None) == "—"
        assert [mib(6144), mib(1536), mib(512)] == ["6 GiB", "1.5 GiB", "512 MiB"]
    with translation.override("zh-hans"):
        assert duration(3700) == "1 小时 1 分钟"
    assert [gpus(1000), gpus(250), gpus(750), gpus(4000)] == ["1", "0.25", "0.75", "4"]


def test_submit_form_lists_the_pools_gpu_models_and_pins_the_chosen_ones(portal):
    from cluster.models import GPU

    model = GPU.objects.values_list("model", flat=True).first()
    client = login(portal.demo)
    form = client.get("/jobs/new/").content.decode()
    assert f'name="gpu_models" value="{model}"' in form
    key = re.search(r'name="idempotency_key" value="([0-9a-f]+)"', form).group(1)
    data = {
        "idempotency_key": key,
        "team": "demo",
        "queue": "debug",
        "spec": "shared",
        "image": "python-3.11",
        "command": "python train.py",
        "gpu_models": [model],
    }
    response = client.post("/jobs/new/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Job.objects.get().gpu_models == [model]
    refused = client.post("/jobs/new/", {**data, "gpu_models": ["No Such GPU"]})
    assert refused.status_code == 400 and Job.objects.count() == 1


def test_every_job_page_says_when_the_sandbox_is_off(portal, settings):
    job = submit(portal.demo)
    client = login(portal.demo)
    assert 'id="sandbox-off"' not in client.get(f"/jobs/{job.id}/").content.decode()
    settings.TRAINYARD_SANDBOX = "off"
    body = client.get(f"/jobs/{job.id}/").content.decode()
    assert 'id="sandbox-off"' in body and "Jobs run unsandboxed." in body


def test_submit_form_and_job_page_say_what_the_local_backend_really_runs(portal):
    import sys

    from jobs.backends.local import command_path

    form = html.unescape(login(portal.demo).get("/jobs/new/").content.decode())
    assert "What runs: the host, not the image." in form
    assert f"Python {'.'.join(map(str, sys.version_info[:3]))} <code>{sys.executable}</code>" in form
    assert f'<code class="wrap">{command_path()}</code>' in form
    job = submit(portal.demo)
    page = html.unescape(login(portal.demo).get(f"/jobs/{job.id}/").content.decode())
    assert "not used: runs on the host's Python" in page and "What runs: the host, not the image." in page

    # Once started, the page shows the reproduce record's own words: what ran.
    store.dispatch(queue_ids=[job.queue_id])
    Job.objects.filter(pk=job.pk).update(
        reproduce={
            "image_used": False,
            "image_reference": None,
            "image_digest": None,
            "image_requested": {"reference": job.image_reference, "digest": job.image_digest},
            "runtime": {
                "kind": "host",
                "image_used": False,
                "python": "/opt/py/bin/python",
                "python_version": "3.11.9",
                "path": "/opt/py/bin:/usr/bin",
                "sandbox": True,
                "limits": "cgroup1",
                "seccomp": True,
            },
        }
    )
    page = html.unescape(login(portal.demo).get(f"/jobs/{job.id}/").content.decode())
    assert "not used: the local backend ran the command on the host" in page
    assert "Resource limits" in page and "cgroup1 + seccomp" in page
    assert "3.11.9 /opt/py/bin/python" in page and "/opt/py/bin:/usr/bin" in page
    assert f"{job.image_reference} (digest unresolved)" in page  # what was asked for, labelled as such
    assert "not used: runs on the host's Python 3.11.9" in page


def test_a_cluster_backend_runs_the_image_and_the_form_says_nothing_about_the_host(portal, settings):
    settings.TRAINYARD_BACKEND = "volcano"
    form = login(portal.demo).get("/jobs/new/").content.decode()
    assert "What runs: the host" not in form and 'data-role="runtime"' not in form


def test_the_form_lists_every_problem_at_once_in_its_own_order(portal):
    response = login(portal.demo).post(
        "/jobs/new/",
        {
            "team": "demo",
            "queue": "debug",
            "spec": "guaranteed",
            "image": "__reference__",
            "image_reference": "evil.example.com/x:1",
            "command": "",
            "env": "CUDA_VISIBLE_DEVICES=0\n1BAD=x",
            "timeout_s": "soon",
            "max_retries": "99",
            "labels": "no equals sign here",
        },
    )
    assert response.status_code == 400
    body = html.unescape(response.content.decode())
    summary = body[body.index('id="error-summary"') : body.index("</ul>", body.index('id="error-summary"'))]
    codes = re.findall(r'<code class="error-code">([^<]+)</code>', summary)
    assert codes == [
        "spec_not_allowed_in_queue",
        "image_registry_not_allowed",
        "empty_command",
        "reserved_env_name",
        "invalid_env_name",
        "invalid",
        "invalid_max_retries",
        "invalid_labels",
    ]
    assert not Job.objects.exists()


def test_job_list_shows_gpus_duration_owner_and_cancels_several_at_once(portal):
    waiting = [submit(portal.demo, name=f"sweep-{i}", spec="guaranteed") for i in range(2)]
    theirs = submit(portal.outsider, team="vision", name="their-job")
    client = login(portal.demo)
    page = html.unescape(client.get("/jobs/").content.decode())
    assert "GPUs" in page and "Duration" in page and "Owner" in page
    assert "1 GPU" in page and "waiting 0 s" in page
    assert 'data-confirm="Cancel the %(count)s selected jobs?' in page
    picked = {"job": [str(j.id) for j in waiting] + [str(theirs.id), "not-a-uuid"]}
    asks = html.unescape(client.post("/jobs/cancel/", picked).content.decode())  # no JavaScript: a page asks
    assert "Cancel 2 jobs?" in asks and "sweep-0" in asks and "their-job" not in asks
    assert asks.count('type="hidden" name="job"') == 2 and 'name="confirmed" value="1"' in asks
    assert [Job.objects.get(pk=j.pk).state for j in waiting] == [JobState.PENDING] * 2
    response = client.post("/jobs/cancel/", {**picked, "confirmed": "1"}, follow=True)
    body = html.unescape(response.content.decode())
    assert "Cancel requested for 2 jobs: sweep-0, sweep-1" in body
    assert [Job.objects.get(pk=j.pk).state for j in waiting] == [JobState.CANCELLED] * 2
    assert Job.objects.get(pk=theirs.pk).state == JobState.PENDING  # not the demo user's to see, let alone cancel
    again = client.post("/jobs/cancel/", {"job": [str(waiting[0].id)], "confirmed": "1"}, follow=True)
    again = html.unescape(again.content.decode())
    assert "Not cancelled: sweep-0: already cancelled" in again
    assert "Select the jobs to cancel first." in client.post("/jobs/cancel/", {}, follow=True).content.decode()
    assert client.get("/jobs/cancel/").status_code == 405


def test_cancel_asks_first_and_the_job_page_says_each_fact_once(portal):
    job = submit(portal.demo, name="once")
    page = html.unescape(login(portal.demo).get(f"/jobs/{job.id}/").content.decode())
    assert 'data-confirm="Cancel job once? Its processes are stopped' in page
    store.dispatch(queue_ids=[job.queue_id])
    attempt = job.attempts.get()
    services.job_transition(job_id=job.id, to=JobState.STARTING, actor="test")
    lifecycle.attempt_finish(attempt_id=attempt.id, obs=Observation(phase="failed", exit_code=3, reason="Error"))
    page = html.unescape(login(portal.demo).get(f"/jobs/{job.id}/").content.decode())
    header = page[: page.index('id="logs-title"')]
    suggestion = Job.objects.get(pk=job.pk).suggestion
    assert header.count(suggestion) == 1
    record = page[page.index('id="repro-title"') :]
    assert record.count("python train.py") == 1  # the command once, under its own heading


def test_stored_sentences_and_seeded_descriptions_read_in_chinese(portal):
    job = submit(portal.demo, name="zh-job")
    store.dispatch(queue_ids=[job.queue_id])
    services.job_transition(job_id=job.id, to=JobState.STARTING, actor="test")
    attempt = job.attempts.get()
    lifecycle.attempt_finish(attempt_id=attempt.id, obs=Observation(phase="failed", exit_code=3, reason="Error"))
    client = login(portal.demo)
    client.cookies["django_language"] = "zh-hans"
    page = html.unescape(client.get(f"/jobs/{job.id}/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode())
    assert "命令自行以非零退出码退出" in page
    assert "已提交到队列 train" in page  # the timeline's own sentences too
    form = html.unescape(client.get("/jobs/new/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode())
    assert "任意档位的单节点训练。" in form and "一块卡 1/4 的算力和 2/8 的显存" in form
    cluster = html.unescape(client.get("/monitoring/cluster/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode())
    assert "集群监控" in cluster and "资源池与队列" in cluster


def test_no_page_or_list_a_member_reaches_names_another_teams_slug(portal):
    """A member sees their own teams only: another team using the same queues (here `vision`, on every queue, with a
    job waiting in one) is never named on the pickers, the queue pages or the API's lists."""
    Queue.objects.filter(name="train").update(state="closed")
    submit(portal.outsider, team="vision", name="their-job")
    submit(portal.demo, name="my-job")
    store.dispatch(queue_ids=[Queue.objects.get(name="train").id])
    client = login(portal.demo)
    submit_page = client.get("/jobs/new/").content.decode()
    assert re.search(r'data-teams="[^"]*\bdemo\b', submit_page)  # the user's own team is still offered
    pages = ["/jobs/new/", "/jobs/", "/queues/", "/queues/train/", "/gpus/", "/datasets/", "/teams/", "/images/"]
    api = [
        "queues/",
        "queues/train/",
        "teams/",
        "jobs/",
        "gpus/",
        "nodes/",
        "datasets/",
        "project-images/",
        "monitoring/usage/",
    ]
    for url in pages + [f"/api/v1/{path}" for path in api]:
        response = client.get(url, follow=True)
        assert response.status_code == 200, url
        body = response.content.decode()
        assert not re.search(r"\bvision\b|Vision team|olga", body), (url, re.findall(r".{60}\bvision\b.{20}", body))


def _copies(job, n: int) -> None:
    import uuid

    rows = []
    for _ in range(n):
        copy = Job.objects.get(pk=job.pk)
        copy.pk, copy.idempotency_key = uuid.uuid4(), None
        rows.append(copy)
    Job.objects.bulk_create(rows)


def test_the_queue_page_lists_the_head_of_the_holders_and_counts_the_rest(portal, monkeypatch):
    """On a full fleet a queue holds thousands of jobs: its page lists the longest-running few, like the head of
    its line, and counts the rest."""
    from datetime import timedelta

    from django.utils import timezone

    from frontend.views import queues as views

    monkeypatch.setattr(views, "HOLDING_SHOWN", 2)
    held = [submit(portal.demo, name=f"holder-{i}") for i in range(4)]
    store.dispatch(queue_ids=[held[0].queue_id])
    now = timezone.now()
    for i, job in enumerate(held):  # holder-3 started first, holder-0 last
        Job.objects.filter(pk=job.pk).update(started_at=now - timedelta(minutes=10 * i))
    assert Job.objects.filter(reserved=True).count() == 4
    body = login(portal.demo).get("/queues/train/").content.decode()
    assert "holder-3" in body and "holder-2" in body and "holder-1" not in body and "holder-0" not in body
    assert "2 more jobs hold capacity (the longest-running are listed)." in body


def test_pages_that_show_estimates_read_as_many_queries_for_a_long_line_as_for_a_short_one(portal, monkeypatch):
    """The queue page, the queue list, the submit form, the queue API, a waiting job's page and its API: the
    same number of queries with 40 more jobs waiting and 40 more holding, whether the estimates are computed
    for the request or read from the kept answer (a query per row would cost seconds on a fleet)."""
    from jobs import selectors

    Queue.objects.filter(name="train").update(gpu_milli=500)  # two shared slices: the rest wait for the quota
    jobs = [submit(portal.demo, name=f"job-{i}") for i in range(4)]
    store.dispatch(queue_ids=[jobs[0].queue_id])
    holder = Job.objects.filter(reserved=True).first()
    waiting = Job.objects.filter(state=JobState.PENDING).order_by("submitted_at").first()
    assert holder is not None and waiting is not None
    client = login(portal.demo)
    api = APIClient()
    api.force_authenticate(portal.demo)
    pages = {
        "queue page": (client, "/queues/train/"),
        "queue list": (client, "/queues/"),
        "submit form": (client, "/jobs/new/"),
        "queue API": (api, "/api/v1/queues/train/"),
        "waiting job page": (client, f"/jobs/{waiting.id}/"),
        "job API": (api, f"/api/v1/jobs/{waiting.id}/"),
    }

    def counts() -> dict[str, int]:
        out = {}
        for label, (who, url) in pages.items():
            selectors.estimates_compute(waiting.queue)  # a kept answer as fresh as the worker keeps it
            who.get(url)  # first reads warm what a serving process has warm
            with CaptureQueriesContext(connection) as seen:
                assert who.get(url).status_code == 200, url
            out[label] = len(seen)
        return out

    for slow in (False, True):  # computed for each request (a short line), then read from the kept answer
        if slow:
            monkeypatch.setattr(selectors, "ESTIMATE_SLOW_S", 0.0)
        short = counts()
        _copies(holder, 40)
        _copies(waiting, 40)
        assert counts() == short, slow
