"""Compare runs: jobs picked by id (or the portal's 8-character ids) or by label, their TRAINYARD_METRIC series,
parameters with the differences marked, and final metrics; over REST and in the portal."""

import re

import pytest
from rest_framework.test import APIClient

from frontend.tests.conftest import login, submit
from jobs.models import Attempt
from monitoring import services as monitoring

pytestmark = pytest.mark.django_db


@pytest.fixture
def runs(portal):
    a = submit(portal.demo, name="lr-0.1", env={"EPOCHS": "3", "LR": "0.1"}, labels={"sweep": "lr"})
    b = submit(portal.demo, name="lr-0.3", env={"EPOCHS": "3", "LR": "0.3"}, labels={"sweep": "lr"})
    c = submit(portal.demo, name="other", labels={"sweep": "bs"})
    for job in (a, b):  # a job reports while one of its attempts runs
        Attempt.objects.create(job=job, number=1, backend="local", state="running")
    monitoring.business_metrics_report(job=a, data=[{"step": s, "loss": 1 / s, "acc": s / 10} for s in (1, 2, 3)])
    monitoring.business_metrics_report(job=b, data=[{"step": s, "loss": 2 / s} for s in (1, 2, 3, 4)])
    return a, b, c


def api(user):
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_api_compares_series_parameters_and_final_values(portal, runs):
    a, b, c = runs
    response = api(portal.demo).get("/api/v1/monitoring/compare/", {"job": [str(a.id), str(b.id)[:8]]})
    assert response.status_code == 200, response.json()
    data = response.json()
    assert [j["id"] for j in data["jobs"]] == [str(a.id), str(b.id)]
    assert data["x_axis"] == "step"
    assert data["series"]["loss"][str(a.id)] == [[1.0, 1.0], [2.0, 0.5], [3.0, 1 / 3]]
    assert len(data["series"]["loss"][str(b.id)]) == 4 and str(b.id) not in data["series"]["acc"]
    assert data["jobs"][0]["final_metrics"] == {"loss": 1 / 3, "acc": 0.3}
    assert data["jobs"][1]["final_metrics"] == {"loss": 0.5}
    assert data["different_parameters"] == ["env.LR"]
    assert data["jobs"][1]["parameters"]["env.LR"] == "0.3"


def test_api_compares_every_job_with_a_label(portal, runs):
    a, b, c = runs
    data = api(portal.demo).get("/api/v1/monitoring/compare/", {"label": "sweep=lr"}).json()
    assert [j["name"] for j in data["jobs"]] == ["lr-0.1", "lr-0.3"]


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({}, "no_jobs"),
        ({"job": "zz"}, "invalid_job_id"),
        ({"job": "00000000"}, "unknown_job"),
        ({"label": "sweep"}, "invalid_label_filter"),
    ],
)
def test_api_bad_choices_are_400s_with_a_code(portal, runs, params, code):
    response = api(portal.demo).get("/api/v1/monitoring/compare/", params)
    assert response.status_code == 400 and response.json()["code"] == code


def test_api_never_compares_another_teams_jobs(portal, runs):
    a, b, c = runs
    outsider = api(portal.outsider)
    assert outsider.get("/api/v1/monitoring/compare/", {"job": str(a.id)}).json()["code"] == "unknown_job"
    assert outsider.get("/api/v1/monitoring/compare/", {"label": "sweep=lr"}).json()["code"] == "no_jobs"


def test_api_refuses_more_than_twenty_jobs(portal):
    ids = [str(submit(portal.demo, labels={"big": "1"}).id) for _ in range(21)]
    response = api(portal.demo).get("/api/v1/monitoring/compare/", {"job": ids})
    assert response.status_code == 400 and response.json()["code"] == "too_many_jobs"


def test_portal_page_draws_one_line_per_job_and_marks_differences(portal, runs):
    a, b, c = runs
    client = login(portal.demo)
    listing = client.get("/jobs/").content.decode()
    # One checkbox per job serves both buttons: "Compare selected" sends the ticked jobs here by GET.
    assert 'id="compare-selected" formmethod="get" formaction="/jobs/compare/"' in listing
    assert f'name="job" value="{a.id}"' in listing
    page = client.get(f"/jobs/compare/?job={a.id}&job={b.id}")
    body = page.content.decode()
    assert page.status_code == 200
    loss_chart = re.search(r"<figcaption>loss</figcaption>(.*?)</figure>", body, re.S).group(1)
    assert loss_chart.count("<polyline") == 2 and f"{str(a.id)[:8]} lr-0.1" in loss_chart
    # parameters: the differing row is marked, the equal one is not
    lr_row = re.search(r'<tr data-param="env.LR" class="differs">(.*?)</tr>', body, re.S).group(1)
    assert "<mark><code>0.3</code></mark>" in lr_row and "<mark><code>0.1</code></mark>" not in lr_row
    assert '<tr data-param="env.EPOCHS">' in body
    # final metrics: sortable, with the last values and an empty cell where a job never reported
    final = re.search(r'<table class="data sortable" id="final-metrics">(.*?)</table>', body, re.S).group(1)
    assert 'data-metric="acc"' in final and 'data-metric="loss"' in final
    row_b = re.search(rf'<tr data-job="{b.id}">(.*?)</tr>', final, re.S).group(1)
    assert 'data-value="0.5"' in row_b and 'data-value=""' in row_b
    only = client.get(f"/jobs/compare/?job={a.id}&job={b.id}&diff=1").content.decode()
    assert 'data-param="env.LR"' in only and 'data-param="env.EPOCHS"' not in only


def test_portal_page_by_label_and_its_errors(portal, runs):
    client = login(portal.demo)
    by_label = client.get("/jobs/compare/?label=sweep%3Dbs").content.decode()
    assert "None of these jobs has reported a metric yet" in by_label and "other" in by_label
    missing = client.get("/jobs/compare/?label=sweep%3Dnone").content.decode()
    assert 'id="compare-error"' in missing and "sweep=none" in missing
    outsider = login(portal.outsider).get(f"/jobs/compare/?job={runs[0].id}").content.decode()
    assert 'id="compare-error"' in outsider and "lr-0.1" not in outsider


def test_the_id_box_takes_several_short_ids(portal, runs):
    a, b, c = runs
    body = login(portal.demo).get("/jobs/compare/", {"job": f"{str(a.id)[:8]} {str(c.id)[:8]},"}).content.decode()
    assert 'id="compare-error"' not in body and "lr-0.1" in body and "other" in body


def test_compare_selected_never_keeps_the_csrf_token_in_the_address(portal, runs):
    a, b, _ = runs
    client = login(portal.demo)
    answer = client.get("/jobs/compare/", {"csrfmiddlewaretoken": "secret-token", "job": [str(a.id), str(b.id)]})
    assert answer.status_code == 302
    assert "csrfmiddlewaretoken" not in answer["Location"] and str(a.id) in answer["Location"]
    assert client.get(answer["Location"]).status_code == 200


def test_a_failed_job_has_a_retry_button_that_submits_a_new_job(portal):
    from django.utils import timezone

    from jobs.models import Job

    job = submit(portal.demo, name="flaky")
    Job.objects.filter(pk=job.pk).update(state="failed", finished_at=timezone.now())
    client = login(portal.demo)
    page = client.get(f"/jobs/{job.id}/").content.decode()
    assert 'id="retry"' in page
    answer = client.post(f"/jobs/{job.id}/retry/")
    assert answer.status_code == 302
    new = Job.objects.exclude(pk=job.pk).get()
    assert answer["Location"].endswith(f"/jobs/{new.id}/") and new.name == "flaky"


def test_the_code_snapshot_is_a_parameter_and_a_reproduce_row_short_with_the_whole_digest_on_hover(portal):
    from jobs.models import CodeSnapshot, Job
    from quotas.models import Team

    digests = ["sha256:" + c * 64 for c in "ab"]
    for digest in digests:
        CodeSnapshot.objects.create(team=Team.objects.get(slug="demo"), digest=digest, size_bytes=10)
    a, b = (submit(portal.demo, name=f"code-{i}", code=d) for i, d in enumerate(digests))
    plain = submit(portal.demo, name="no-code")
    assert (
        api(portal.demo)
        .get("/api/v1/monitoring/compare/", {"job": [str(a.id), str(plain.id)]})
        .json()["jobs"][0]["parameters"]["code"]
        == digests[0]
    )
    body = login(portal.demo).get(f"/jobs/compare/?job={a.id}&job={b.id}&job={plain.id}").content.decode()
    row = re.search(r'<tr data-param="code" class="differs">(.*?)</tr>', body, re.S).group(1)
    assert f'<code title="{digests[0]}">sha256:aaaaaaaaaaaa</code>' in row
    assert f'<mark><code title="{digests[1]}">sha256:bbbbbbbbbbbb</code></mark>' in row
    assert "<mark><code>none</code></mark>" in row
    # The job page's reproduce record names the snapshot the attempt ran in.
    Job.objects.filter(pk=a.pk).update(reproduce={"code_digest": digests[0], "backend": "local"})
    page = login(portal.demo).get(f"/jobs/{a.id}/").content.decode()
    cell = re.search(r"<th scope=\"row\">Code snapshot</th><td>(.*?)</td>", page, re.S).group(1)
    assert cell == f'<code title="{digests[0]}" data-digest="{digests[0]}">sha256:aaaaaaaaaaaa</code>'
    Job.objects.filter(pk=plain.pk).update(reproduce={"code_digest": None, "backend": "local"})
    page = login(portal.demo).get(f"/jobs/{plain.id}/").content.decode()
    assert re.search(r"<th scope=\"row\">Code snapshot</th><td><code>none</code></td>", page)
