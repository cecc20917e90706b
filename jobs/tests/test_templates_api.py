"""Job templates over REST (list, create, edit, delete, submit) and jobs found by the 8-character id prefix."""

import pytest

from jobs.models import Job, JobTemplate, written_fields
from jobs.tests.test_api import body, client_for, world  # noqa: F401 - the seeded world fixture
from quotas.models import Membership
from quotas.tests.factories import MembershipFactory, UserFactory

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("world")]


def template_body(**overrides):
    data = body(**overrides)
    data.pop("team")
    return data


def create(client, name="baseline", team="demo", **job):
    return client.post(
        "/api/v1/templates/",
        {"team": team, "name": name, "description": "the baseline run", "job": template_body(**job)},
        format="json",
    )


def test_a_member_saves_lists_and_submits_a_template():
    demo = client_for("demo")
    response = create(demo)
    assert response.status_code == 201, response.json()
    saved = response.json()
    assert saved["team"] == "demo" and saved["name"] == "baseline" and saved["created_by"] == "demo"
    assert saved["job"]["queue"] == "train" and "team" not in saved["job"]
    assert [t["name"] for t in demo.get("/api/v1/templates/").json()] == ["baseline"]
    assert demo.get("/api/v1/templates/", {"name": "nope"}).json() == []

    submitted = demo.post(
        f"/api/v1/templates/{saved['id']}/submit/",
        {"env": {"LR": "0.1"}, "timeout_s": 1800},
        format="json",
        HTTP_IDEMPOTENCY_KEY="tmpl-1",
    )
    assert submitted.status_code == 201, submitted.json()
    job = Job.objects.get(pk=submitted.json()["id"])
    # env and labels merge with the template's, other fields replace; the label names the template
    assert job.env == {"EPOCHS": "3", "LR": "0.1"} and job.timeout_s == 1800
    assert job.labels == {"template": "baseline", "exp": "a"}
    assert job.events.filter(kind="submitted_from_template").exists()
    again = demo.post(
        f"/api/v1/templates/{saved['id']}/submit/",
        {"env": {"LR": "0.1"}, "timeout_s": 1800},
        format="json",
        HTTP_IDEMPOTENCY_KEY="tmpl-1",
    )
    assert again.status_code == 200 and again.json()["id"] == str(job.id)
    labelled = demo.get("/api/v1/jobs/", {"label": "template=baseline"}).json()["results"]
    assert [j["id"] for j in labelled] == [str(job.id)]


@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        ({"name": "Bad Name!"}, 400, "invalid_template_name"),
        ({"job": {"queue": "nope"}}, 400, "unknown_queue"),
        ({"job": {"spec": "guaranteed", "gpus": 8}}, 400, "request_exceeds_queue_capability"),
        ({"job": {"env": {"CUDA_VISIBLE_DEVICES": "0"}}}, 400, "reserved_env_name"),
        ({"job": {"colour": "red"}}, 400, "unknown_field"),
        ({"team": "other"}, 404, "unknown_team"),
    ],
)
def test_a_broken_template_is_refused_with_the_submission_codes(payload, status, code):
    data = {"team": "demo", "name": "baseline", "job": template_body()}
    for key, value in payload.items():
        data[key] = {**data[key], **value} if key == "job" else value
    response = client_for("demo").post("/api/v1/templates/", data, format="json")
    assert response.status_code == status, response.json()
    assert response.json()["code"] == code
    assert not JobTemplate.objects.exists()


def test_names_are_unique_per_team():
    demo = client_for("demo")
    assert create(demo).status_code == 201
    again = create(demo)
    assert again.status_code == 409 and again.json()["code"] == "template_exists"
    # another team may use the same name
    assert create(client_for("outsider"), team="other").status_code == 201


def test_other_teams_cannot_see_use_or_change_a_template():
    saved = create(client_for("demo")).json()
    outsider = client_for("outsider")
    assert outsider.get("/api/v1/templates/").json() == []
    assert outsider.get(f"/api/v1/templates/{saved['id']}/").status_code == 404
    assert outsider.post(f"/api/v1/templates/{saved['id']}/submit/", {}, format="json").status_code == 404
    assert outsider.patch(f"/api/v1/templates/{saved['id']}/", {"name": "x"}, format="json").status_code == 404
    assert outsider.delete(f"/api/v1/templates/{saved['id']}/").status_code == 404
    assert JobTemplate.objects.filter(name="baseline").exists()


def test_only_the_author_and_maintainers_edit_or_delete():
    saved = create(client_for("demo")).json()
    teammate = UserFactory(username="tess")
    MembershipFactory(team_id=JobTemplate.objects.get().team_id, user=teammate)
    tess = client_for("tess")
    # a teammate may use it...
    assert tess.post(f"/api/v1/templates/{saved['id']}/submit/", {}, format="json").status_code == 201
    # ...but not change it
    refused = tess.patch(f"/api/v1/templates/{saved['id']}/", {"description": "mine now"}, format="json")
    assert refused.status_code == 403 and refused.json()["code"] == "template_not_yours"
    Membership.objects.filter(user=teammate).update(role=Membership.Role.MAINTAINER)
    edited = tess.patch(
        f"/api/v1/templates/{saved['id']}/",
        {"name": "baseline-v2", "job": template_body(spec="performance")},
        format="json",
    )
    assert edited.status_code == 200, edited.json()
    assert edited.json()["name"] == "baseline-v2" and edited.json()["job"]["spec"] == "performance"
    assert edited.json()["updated_by"] == "tess"
    bad = tess.patch(f"/api/v1/templates/{saved['id']}/", {"job": template_body(queue="nope")}, format="json")
    assert bad.status_code == 400 and bad.json()["code"] == "unknown_queue"
    assert client_for("demo").delete(f"/api/v1/templates/{saved['id']}/").status_code == 204
    assert not JobTemplate.objects.exists()


def test_submit_overrides_are_checked():
    saved = create(client_for("demo")).json()
    demo = client_for("demo")
    wrong_team = demo.post(f"/api/v1/templates/{saved['id']}/submit/", {"team": "other"}, format="json")
    assert wrong_team.status_code == 400 and wrong_team.json()["code"] == "template_team_mismatch"
    unknown = demo.post(f"/api/v1/templates/{saved['id']}/submit/", {"colour": "red"}, format="json")
    assert unknown.status_code == 400 and unknown.json()["code"] == "unknown_field"
    too_long = demo.post(f"/api/v1/templates/{saved['id']}/submit/", {"timeout_s": 10**8}, format="json")
    assert too_long.status_code == 400 and too_long.json()["code"] == "timeout_exceeds_queue_maximum"
    assert not Job.objects.exists()


def test_a_read_token_cannot_write_templates():
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    from quotas.tokens import token_create

    _, raw = token_create(user=get_user_model().objects.get(username="demo"), name="ci", scopes=["read"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/v1/templates/").status_code == 200
    refused = create(client)
    assert refused.status_code == 403 and refused.json()["code"] == "token_scope"


def test_jobs_are_found_by_the_short_id_the_portal_shows():
    demo = client_for("demo")
    job = demo.post("/api/v1/jobs/", body(), format="json").json()
    found = demo.get("/api/v1/jobs/", {"id_prefix": job["id"][:8]}).json()["results"]
    assert [j["id"] for j in found] == [job["id"]]
    assert demo.get("/api/v1/jobs/", {"id_prefix": job["id"][:8].upper()}).json()["results"][0]["id"] == job["id"]
    # another team's job is not found by its prefix
    assert client_for("outsider").get("/api/v1/jobs/", {"id_prefix": job["id"][:8]}).json()["results"] == []
    short = demo.get("/api/v1/jobs/", {"id_prefix": "abc"})
    assert short.status_code == 400 and short.json()["code"] == "invalid_id_prefix"


def test_the_short_id_search_reads_the_primary_key_index_on_a_long_table():
    """20,000 jobs: a prefix is a range of the primary key, answered by its index (the rows visited are the rows
    found), and it finds exactly the visible jobs whose id starts so."""
    import json
    import random

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    demo = client_for("demo")
    first = Job.objects.get(pk=demo.post("/api/v1/jobs/", body(), format="json").json()["id"])
    # 20,000 copies of it under random ids, made in the database: one statement, where building them as objects
    # for bulk_create took most of a minute.
    quote = connection.ops.quote_name
    columns = ", ".join(
        quote(f.column) for f in written_fields(Job) if f.name not in {"id", "submitted_at", "idempotency_key"}
    )
    rng = random.Random(4)
    with connection.cursor() as cursor:
        cursor.execute("SELECT setseed(%s)", [rng.random()])
        cursor.execute(
            f"INSERT INTO jobs_job (id, submitted_at, idempotency_key, {columns}) "
            f"SELECT md5(random()::text || n::text)::uuid, now(), NULL, {columns} "
            "FROM jobs_job, generate_series(1, 20000) AS n WHERE id = %s",
            [first.pk],
        )
        cursor.execute("ANALYZE jobs_job")
    ids = [str(j) for j in Job.objects.values_list("id", flat=True)]
    for probe in rng.sample(ids, 20):
        for length in (8, 13, 36):
            prefix = probe[:length]
            with CaptureQueriesContext(connection) as captured:
                found = demo.get("/api/v1/jobs/", {"id_prefix": prefix, "page_size": 50}).json()["results"]
            assert sorted(j["id"] for j in found) == sorted(i for i in ids if i.startswith(prefix))
    [listing] = [q["sql"] for q in captured if 'FROM "jobs_job"' in q["sql"] and '"jobs_job"."id" >=' in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + listing)
        raw = cursor.fetchone()[0]
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]

    def nodes(node):
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    scans = [n for n in nodes(plan) if n.get("Relation Name") == "jobs_job"]
    assert [n["Index Name"] for n in scans] == ["jobs_job_pkey"], json.dumps(plan)
    assert scans[0]["Actual Rows"] + scans[0].get("Rows Removed by Filter", 0) <= 2


def test_odd_ids_and_bodies_are_4xx_not_errors():
    demo = client_for("demo")
    assert demo.get("/api/v1/templates/99999999999999/").status_code == 404
    saved = create(demo).json()
    bad = demo.post(f"/api/v1/templates/{saved['id']}/submit/", [1, 2], format="json")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid"
