"""The statements every request runs are prepared on the server once per connection (kernel.prepared): checked in
PostgreSQL's own list of the connection's prepared statements, with the answers they give, their errors, and the
switch that turns them off."""

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from rest_framework.test import APIClient

from jobs import services
from jobs.models import Job
from ops.seed import seed
from quotas.tokens import token_create

pytestmark = pytest.mark.django_db

BODY = {"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": ["python", "train.py"]}


@pytest.fixture
def demo(settings):
    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_LOCAL_GPUS = "4x24GiB"
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    return get_user_model().objects.get(username="demo")


def prepared() -> list[str]:
    """The text of each statement this connection has prepared."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def bearer(user, name):
    _, raw = token_create(user=user, name=name)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_a_submission_prepares_its_statements_and_each_answers_for_its_own_values(demo):
    first = bearer(demo, "first").post("/api/v1/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert first.status_code == 201, first.content
    made = prepared()  # on this connection, by this test or an earlier one
    for marker in (
        'FROM "quotas_apitoken"',
        "trainyard_reference_version",
        "trainyard_quota_use",
        "jsonb_populate_record",
        "jobs_succeededrun",
    ):
        assert any(marker in s for s in made), (marker, made)
    # The same statements again, with other values: another user's token, another key, the repeated key.
    outsider = get_user_model().objects.create_user(username="outsider", password="outsider-pass-123")
    assert bearer(outsider, "theirs").get("/api/v1/jobs/").status_code == 200
    again = bearer(demo, "second").post("/api/v1/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    other = bearer(demo, "third").post("/api/v1/jobs/", BODY, format="json", HTTP_IDEMPOTENCY_KEY="k2")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    assert Job.objects.filter(owner__username="demo").count() == 2
    assert len(prepared()) == len(made)  # run again, not prepared again


def test_an_error_in_a_prepared_statement_is_djangos_and_the_statement_still_runs_after_it(demo):
    earlier, _ = services.job_submit(user=demo, data=BODY, idempotency_key="a")
    with pytest.raises(IntegrityError), transaction.atomic():
        services.job_submit(user=demo, data=BODY, idempotency_key="b", job_id=earlier.id)  # the id is taken
    job, created = services.job_submit(user=demo, data=BODY, idempotency_key="c")
    assert created and Job.objects.filter(pk=job.pk).exists()


def plan_mode() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_a_connection_plans_its_prepared_statements_once_and_none_where_the_setting_says_so(demo, settings):
    connection.close()  # a fresh connection: nothing prepared on it yet
    with transaction.atomic():  # the first use inside a transaction leaves the session's mode alone ...
        services.job_submit(user=demo, data=BODY, idempotency_key="in-a-transaction")
        assert plan_mode() == "auto"
    services.job_submit(user=demo, data=BODY, idempotency_key="outside")  # ... the first use outside sets it
    assert plan_mode() == "force_generic_plan" and prepared()
    settings.TRAINYARD_DB_PREPARE = False
    connection.close()
    services.job_submit(user=demo, data=BODY, idempotency_key="plain")
    assert prepared() == [] and plan_mode() == "auto"


def test_captured_queries_show_a_prepared_statement_with_its_values(demo):
    from django.test.utils import CaptureQueriesContext

    services.job_submit(user=demo, data=BODY, idempotency_key="seen")
    with CaptureQueriesContext(connection) as captured:
        services.job_submit(user=demo, data=BODY, idempotency_key="logged")
    inserts = [q["sql"] for q in captured if "jsonb_populate_record" in (q["sql"] or "")]
    assert len(inserts) == 1 and '"logged"' in inserts[0] and "$1" not in inserts[0]
