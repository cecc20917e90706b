"""The jobs REST API: submission and its error codes, idempotency, isolation, tokens, rate limits, lists."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from jobs.models import Job
from ops.seed import seed
from quotas.models import Queue
from quotas.tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(settings):
    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_LOCAL_GPUS = "4x24GiB"
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    other = TeamFactory(slug="other", name="Other team")
    for queue in Queue.objects.all():
        queue.teams.add(other)
    outsider = UserFactory(username="outsider")
    MembershipFactory(team=other, user=outsider)
    return {"other": other, "outsider": outsider}


def client_for(username):
    from django.contrib.auth import get_user_model

    client = APIClient()
    client.force_authenticate(get_user_model().objects.get(username=username))
    return client


def body(**overrides):
    data = {
        "team": "demo",
        "queue": "train",
        "spec": "shared",
        "image": "python-3.11",
        "command": ["python", "train.py"],
        "env": {"EPOCHS": "3"},
        "labels": {"exp": "a"},
    }
    data.update(overrides)
    return data


def test_submit_returns_the_job_and_pins_the_digest(world):
    from images.models import BaseImage

    # The seeded external base has no digest (nobody pulled it; the local backend runs on the host): unresolved.
    response = client_for("demo").post("/api/v1/jobs/", body(), format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["image_digest"] == ""
    # A catalog image with a digest is pinned to it.
    BaseImage.objects.filter(name="python-3.11").update(digest="sha256:" + "4" * 64)
    response = client_for("demo").post("/api/v1/jobs/", body(), format="json")
    assert response.status_code == 201, response.json()
    job = response.json()
    assert job["state"] == "pending" and job["spec"] == "shared" and job["gpu_milli"] == 250
    assert job["image_digest"] == "sha256:" + "4" * 64
    assert Job.objects.get(pk=job["id"]).events.filter(kind="submitted").exists()


def test_a_bare_name_outside_the_catalog_is_a_400_listing_the_catalog(world):
    response = client_for("demo").post("/api/v1/jobs/", body(image="pytorch-9.9"), format="json")
    assert response.status_code == 400, response.json()
    answer = response.json()
    assert answer["code"] == "unknown_image"
    assert "pytorch-9.9" in answer["detail"] and "python-3.11" in answer["detail"]
    assert "docker.io/library/pytorch-9.9" in answer["detail"]


def test_an_unknown_catalog_name_is_reported_with_every_other_error_of_the_submission(world):
    bad = body(image="pytorch-9.9", env={"1BAD": "x"}, command=[], timeout_s="soon", max_retries=99, spec="nope")
    response = client_for("demo").post("/api/v1/jobs/", bad, format="json")
    assert response.status_code == 400, response.json()
    answer = response.json()
    codes = {field: [e["code"] for e in errors] for field, errors in answer["fields"].items()}
    assert codes == {
        "spec": ["unknown_spec"],
        "timeout_s": ["invalid"],
        "image": ["unknown_image"],
        "env": ["invalid_env_name"],
        "command": ["empty_command"],
        "max_retries": ["invalid_max_retries"],
    }, answer
    assert "python-3.11" in answer["fields"]["image"][0]["message"]
    assert not Job.objects.exists()


def test_the_seeded_catalog_claims_no_digest_and_no_scan(world):
    from images.models import BaseImage

    for image in BaseImage.objects.all():
        assert image.digest == "" and image.scan_status == "unscanned", image.name


@pytest.mark.parametrize(
    ("overrides", "status", "code", "field"),
    [
        ({"queue": "nope"}, 400, "unknown_queue", "queue"),
        ({"spec": "nope"}, 400, "unknown_spec", "spec"),
        ({"queue": "debug", "spec": "guaranteed"}, 400, "spec_not_allowed_in_queue", "spec"),
        ({"spec": "guaranteed", "gpus": 8}, 400, "request_exceeds_queue_capability", "spec"),
        ({"timeout_s": 10**8}, 400, "timeout_exceeds_queue_maximum", "timeout_s"),
        ({"image": "evil.example.com/x/y:1"}, 400, "image_registry_not_allowed", "image"),
        ({"env": {"1BAD": "x"}}, 400, "invalid_env_name", "env"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, 400, "reserved_env_name", "env"),
        ({"command": []}, 400, "empty_command", "command"),
        ({"command": "  "}, 400, "empty_command", "command"),
        ({"gpu_milli": 300}, 400, "spec_and_explicit_request", "spec"),
        ({"replicas": 2}, 400, "replicas_need_gang_queue", "replicas"),
        ({"surprise": 1}, 400, "unknown_field", "surprise"),
        ({"team": "other"}, 404, "unknown_team", None),
    ],
)
def test_submit_errors_have_stable_codes(world, overrides, status, code, field):
    response = client_for("demo").post("/api/v1/jobs/", body(**overrides), format="json")
    assert response.status_code == status, response.json()
    data = response.json()
    assert data["code"] == code
    if field:
        assert field in data["fields"]
    assert not Job.objects.exists()


def test_one_submissions_errors_never_reach_the_next(world):
    """The input check's serializer is made once per thread and reused: each submission is judged on its own."""
    demo = client_for("demo")
    bad = demo.post("/api/v1/jobs/", body(replicas=0, labels="x"), format="json").json()
    assert set(bad["fields"]) == {"replicas", "labels"}, bad
    assert demo.post("/api/v1/jobs/", body(name="first"), format="json").status_code == 201
    other = demo.post("/api/v1/jobs/", body(name="x" * 121), format="json").json()
    assert set(other["fields"]) == {"name"}, other
    good = demo.post("/api/v1/jobs/", body(name="second", priority=3), format="json")
    assert good.status_code == 201 and good.json()["name"] == "second" and good.json()["priority"] == 3
    assert sorted(Job.objects.values_list("name", flat=True)) == ["first", "second"]


def test_a_submission_writes_each_column_as_the_orm_would(world):
    """The job and its first events go in as one statement of JSON documents: every column read back equals what
    the job object held (strings, numbers, JSON of each shape, arrays, times, foreign keys), and the events are the
    ORM's rows too."""
    from django.contrib.auth import get_user_model

    from jobs.models import JobEvent, written_fields
    from jobs.services import job_submit

    data = body(
        name="every-type",
        command="python train.py --lr 0.1",
        args=["--seed", "7"],
        env={"EPOCHS": "3", "NOTE": 'quotes " and \\ and é'},
        labels={"exp": "a", "nested": "x"},
        priority=7,
        timeout_s=3600,
        ci={"commit": "abc", "depth": {"n": [1, 2.5, None, True]}},
        tensorboard=True,
    )
    user = get_user_model().objects.get(username="demo")
    job, created = job_submit(user=user, data=data, idempotency_key="key-1")
    stored = Job.objects.get(pk=job.pk)
    for f in written_fields(Job):
        assert getattr(stored, f.attname) == getattr(job, f.attname), f.name
    assert stored.joined_xid is not None  # the database's own default still fills it
    events = list(JobEvent.objects.filter(job=job).order_by("id").values("kind", "to_state", "actor", "data", "level"))
    assert events[0] == {
        "kind": "submitted",
        "to_state": "pending",
        "actor": "demo",
        "data": {"idempotency_key": "key-1"},
        "level": "info",
    }
    again, created_again = job_submit(user=user, data=data, idempotency_key="key-1")
    assert created and not created_again and again.pk == job.pk  # the unique key still finds the first


def test_request_over_the_team_quota_is_rejected(world):
    from quotas.models import Team

    Team.objects.filter(slug="demo").update(gpu_milli=500)
    response = client_for("demo").post("/api/v1/jobs/", body(spec="performance"), format="json")
    assert response.status_code == 400 and response.json()["code"] == "request_exceeds_team_quota"


def test_image_needing_a_newer_driver_than_every_node_is_rejected(world):
    from images.models import BaseImage

    BaseImage.objects.create(
        name="future",
        reference="nvcr.io/nvidia/pytorch:99.01-py3",
        digest="sha256:" + "9" * 64,
        cuda_version="14.0",
        min_driver_version="999.1",
    )
    response = client_for("demo").post("/api/v1/jobs/", body(image="future"), format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "image_incompatible_with_all_nodes"


def test_idempotency_key(world):
    client = client_for("demo")
    first = client.post("/api/v1/jobs/", body(), format="json", HTTP_IDEMPOTENCY_KEY="ci-123")
    again = client.post("/api/v1/jobs/", body(), format="json", HTTP_IDEMPOTENCY_KEY="ci-123")
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    different = client.post("/api/v1/jobs/", body(command=["other"]), format="json", HTTP_IDEMPOTENCY_KEY="ci-123")
    assert different.status_code == 409 and different.json()["code"] == "idempotency_key_reused"
    assert Job.objects.count() == 1


def test_an_insert_that_fails_without_a_key_is_an_error_not_an_earlier_job(world):
    """Only a key finds an earlier job: an insert refused for another reason (here, an id already taken) raises
    instead of answering with some job of the team that has no key."""
    from django.contrib.auth import get_user_model
    from django.db import IntegrityError

    from jobs import services

    demo = get_user_model().objects.get(username="demo")
    earlier, created = services.job_submit(user=demo, data=body())
    assert created
    with pytest.raises(IntegrityError):
        services.job_submit(user=demo, data=body(command=["other"]), job_id=earlier.id)


def test_a_key_taken_with_an_id_already_used_is_still_an_error(world):
    """The insert finds a repeated key by the team's unique key only: another unique violation with a key raises."""
    from django.contrib.auth import get_user_model
    from django.db import IntegrityError

    from jobs import services

    demo = get_user_model().objects.get(username="demo")
    earlier, _ = services.job_submit(user=demo, data=body(), idempotency_key="first")
    # The same key in another team is that team's own.
    MembershipFactory(team=world["other"], user=demo)
    theirs, created = services.job_submit(user=demo, data=body(team="other"), idempotency_key="first")
    assert created and theirs.id != earlier.id
    with pytest.raises(IntegrityError):
        services.job_submit(user=demo, data=body(), idempotency_key="second", job_id=earlier.id)


@pytest.mark.django_db(transaction=True)
def test_two_submissions_with_one_key_at_once_make_one_job(world):
    """A second request with the key while the first is still uncommitted waits for it, then answers its job."""
    import threading
    import time

    from django.contrib.auth import get_user_model
    from django.db import connections, transaction

    from jobs import services

    demo = get_user_model().objects.get(username="demo")
    inserted, release, results = threading.Event(), threading.Event(), {}

    def first():
        try:
            with transaction.atomic():
                results["first"] = services.job_submit(user=demo, data=body(), idempotency_key="at-once")
                inserted.set()
                release.wait(30)
        finally:
            connections.close_all()

    def second():
        try:
            results["second"] = services.job_submit(user=demo, data=body(), idempotency_key="at-once")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=first)]
    threads[0].start()
    assert inserted.wait(30)
    threads.append(threading.Thread(target=second))
    threads[1].start()
    deadline, waiting = time.monotonic() + 30, 0
    with connection.cursor() as cursor:  # the second insert waits on the first's uncommitted key
        while not waiting and time.monotonic() < deadline:
            time.sleep(0.02)
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            waiting = cursor.fetchone()[0]
    assert waiting and "second" not in results
    release.set()
    for thread in threads:
        thread.join(30)
    (job, created), (again, created_again) = results["first"], results["second"]
    assert created and not created_again and again.id == job.id
    assert Job.objects.filter(idempotency_key="at-once").count() == 1


def test_isolation_between_teams(world):
    mine = client_for("demo").post("/api/v1/jobs/", body(), format="json").json()
    theirs = client_for("outsider").post("/api/v1/jobs/", body(team="other"), format="json").json()
    demo, outsider, admin = client_for("demo"), client_for("outsider"), client_for("admin")
    assert [j["id"] for j in demo.get("/api/v1/jobs/").json()["results"]] == [mine["id"]]
    assert demo.get(f"/api/v1/jobs/{theirs['id']}/").status_code == 404
    assert demo.post(f"/api/v1/jobs/{theirs['id']}/cancel/").status_code == 404
    assert outsider.get(f"/api/v1/jobs/{mine['id']}/events/").status_code == 404
    assert len(admin.get("/api/v1/jobs/").json()["results"]) == 2
    assert [t["slug"] for t in demo.get("/api/v1/teams/").json()] == ["demo"]
    assert demo.get("/api/v1/teams/other/").status_code == 404
    anonymous = APIClient()
    assert anonymous.get("/api/v1/jobs/").status_code in (401, 403)


def test_only_staff_change_quotas_and_maintainers_manage_members(world):
    demo = client_for("demo")  # a maintainer of demo, not staff
    assert demo.patch("/api/v1/teams/demo/quota/", {"gpu_milli": 9000}, format="json").status_code == 403
    admin = client_for("admin")
    response = admin.patch("/api/v1/teams/demo/quota/", {"gpu_milli": 9000}, format="json")
    assert response.status_code == 200 and response.json()["quota"]["gpu_milli"] == 9000
    from quotas.models import QuotaChange

    change = QuotaChange.objects.get()
    assert (change.actor.username, change.field, change.old_value, change.new_value) == (
        "admin",
        "gpu_milli",
        "4000",
        "9000",
    )
    assert demo.post("/api/v1/teams/demo/members/", {"username": "outsider"}, format="json").status_code == 201
    outsider = client_for("outsider")
    assert outsider.post("/api/v1/teams/demo/members/", {"username": "admin"}, format="json").status_code == 403
    assert demo.delete("/api/v1/teams/demo/members/outsider/").status_code == 204


def test_tokens_are_shown_once_stored_hashed_and_revocable(world):
    demo = client_for("demo")
    created = demo.post("/api/v1/tokens/", {"name": "ci", "expires_in_days": 30}, format="json").json()
    raw = created["token"]
    from quotas.models import ApiToken

    stored = ApiToken.objects.get()
    assert raw not in (stored.digest, stored.prefix) and len(stored.digest) == 64
    assert "token" not in demo.get("/api/v1/tokens/").json()[0]
    ci = APIClient()
    ci.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert ci.get("/api/v1/jobs/").status_code == 200
    assert ci.post("/api/v1/jobs/", body(), format="json").status_code == 201
    assert demo.delete(f"/api/v1/tokens/{stored.id}/").status_code == 204
    revoked = ci.get("/api/v1/jobs/")
    assert revoked.status_code == 401 and revoked.json()["code"] == "authentication_failed"
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Bearer ty_nope_nope")
    assert bad.get("/api/v1/jobs/").status_code == 401


def test_rate_limit_answers_429_with_retry_after(world, settings):
    import uuid

    # A fresh key prefix instead of flushing Redis: other users of the same Redis keep their data.
    settings.CACHES = {"default": {**settings.CACHES["default"], "KEY_PREFIX": f"test-{uuid.uuid4().hex}"}}
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"submit": "3/min", "read": "100/min", "write": "100/min"},
    }
    from rest_framework.settings import api_settings
    from rest_framework.throttling import SimpleRateThrottle

    api_settings.reload()
    original_rates = SimpleRateThrottle.THROTTLE_RATES
    SimpleRateThrottle.THROTTLE_RATES = api_settings.DEFAULT_THROTTLE_RATES
    try:
        demo = client_for("demo")
        codes = [demo.post("/api/v1/jobs/", body(), format="json").status_code for _ in range(4)]
        assert codes == [201, 201, 201, 429]
        limited = demo.post("/api/v1/jobs/", body(), format="json")
        assert int(limited["Retry-After"]) > 0 and limited.json()["code"] == "throttled"
        # One wait, said once: the header clients obey and the body agree.
        assert limited.json()["retry_after"] == int(limited["Retry-After"]) <= 60
        assert Job.objects.count() == 3
    finally:
        # The class attribute outlives the settings fixture: later tests must get the real rates back.
        SimpleRateThrottle.THROTTLE_RATES = original_rates
        api_settings.reload()


def test_batch_submit_is_all_or_nothing(world):
    demo = client_for("demo")
    bad = demo.post("/api/v1/jobs/batch/", {"jobs": [body(), body(queue="nope")]}, format="json")
    assert bad.status_code == 400 and bad.json()["code"] == "unknown_queue" and "1" in bad.json()["jobs"]
    assert not Job.objects.exists()
    ok = demo.post("/api/v1/jobs/batch/", {"jobs": [body(name=f"j{i}") for i in range(200)]}, format="json")
    assert ok.status_code == 201 and len(ok.json()) == 200


def test_batch_honours_the_idempotency_key(world):
    demo = client_for("demo")
    jobs = {"jobs": [body(name="a"), body(name="b", queue="debug")]}
    first = demo.post("/api/v1/jobs/batch/", jobs, format="json", HTTP_IDEMPOTENCY_KEY="ci-7-batch")
    assert first.status_code == 201, first.json()
    again = demo.post("/api/v1/jobs/batch/", jobs, format="json", HTTP_IDEMPOTENCY_KEY="ci-7-batch")
    assert again.status_code == 200, again.json()
    assert [j["id"] for j in again.json()] == [j["id"] for j in first.json()]
    assert [j["name"] for j in again.json()] == ["a", "b"]
    assert Job.objects.count() == 2
    # The same key with another body: the single submission's conflict, naming the batch's jobs; nothing created.
    changed = {"jobs": [body(name="a"), body(name="c")]}
    different = demo.post("/api/v1/jobs/batch/", changed, format="json", HTTP_IDEMPOTENCY_KEY="ci-7-batch")
    assert different.status_code == 409 and different.json()["code"] == "idempotency_key_reused"
    assert different.json()["job_ids"] == [j["id"] for j in first.json()]
    assert Job.objects.count() == 2
    # Without a key a batch is new each time; a key is its sender's own; an overlong key is refused.
    assert demo.post("/api/v1/jobs/batch/", jobs, format="json").status_code == 201
    admin = client_for("admin")
    assert admin.post("/api/v1/jobs/batch/", jobs, format="json", HTTP_IDEMPOTENCY_KEY="ci-7-batch").status_code == 201
    long_key = demo.post("/api/v1/jobs/batch/", jobs, format="json", HTTP_IDEMPOTENCY_KEY="k" * 201)
    assert long_key.status_code == 400 and long_key.json()["code"] == "invalid_idempotency_key"
    assert Job.objects.count() == 6


def test_a_retried_keyed_batch_that_failed_validation_creates_its_jobs_once_fixed(world):
    demo = client_for("demo")
    bad = {"jobs": [body(name="a"), body(name="b", queue="nope")]}
    refused = demo.post("/api/v1/jobs/batch/", bad, format="json", HTTP_IDEMPOTENCY_KEY="ci-8")
    assert refused.status_code == 400 and not Job.objects.exists()
    fixed = {"jobs": [body(name="a"), body(name="b")]}
    assert demo.post("/api/v1/jobs/batch/", fixed, format="json", HTTP_IDEMPOTENCY_KEY="ci-8").status_code == 201
    assert demo.post("/api/v1/jobs/batch/", fixed, format="json", HTTP_IDEMPOTENCY_KEY="ci-8").status_code == 200
    assert Job.objects.count() == 2


def test_batch_reports_an_unknown_team_per_item_without_a_hint(world):
    demo = client_for("demo")
    items = [body(), body(team="other"), body(), body(team="no-such-team")]
    response = demo.post("/api/v1/jobs/batch/", {"jobs": items}, format="json")
    assert response.status_code == 400, response.json()
    data = response.json()
    assert data["code"] == "unknown_team" and set(data["jobs"]) == {"1", "3"}
    # A team that exists but is not the user's reads exactly like one that does not exist.
    assert (
        data["jobs"]["1"]
        == data["jobs"]["3"]
        == {"team": [{"message": "team not found (or you are not a member)", "code": "unknown_team"}]}
    )
    assert not Job.objects.exists()
    # Next to other items' problems, each under its index.
    mixed = demo.post("/api/v1/jobs/batch/", {"jobs": [body(queue="nope"), body(team="other")]}, format="json")
    assert mixed.status_code == 400 and mixed.json()["code"] == "unknown_queue"
    assert mixed.json()["jobs"]["1"]["team"][0]["code"] == "unknown_team"


@pytest.mark.parametrize(
    "cursor",
    [
        "not-base64!",  # not base64 at all
        "/w==",  # base64, but not of text
        "cD0yMDI1LTAyLTMwKzAwJTNBMDA=",  # a forged position the database refuses (2025-02-30)
        "bz0tNQ==",  # o=-5
    ],
)
def test_a_bad_cursor_is_a_400_invalid_parameter(world, cursor):
    response = client_for("demo").get("/api/v1/jobs/", {"cursor": cursor})
    assert response.status_code == 400, response.json()
    data = response.json()
    assert data["code"] == "invalid_parameter" and data["fields"]["cursor"][0]["code"] == "invalid_parameter"
    assert "cursor" in data["detail"]


def test_quota_changes_refuse_unknown_keys(world):
    from quotas.models import Team

    admin = client_for("admin")
    typo = admin.patch("/api/v1/teams/demo/quota/", {"gpu_mili": 1}, format="json")
    assert typo.status_code == 400 and typo.json()["code"] == "unknown_field"
    assert typo.json()["fields"] == {"gpu_mili": [{"message": "unknown field", "code": "unknown_field"}]}
    # Every problem at once, and nothing changed, not even the valid key next to the typo.
    both = admin.patch("/api/v1/teams/demo/quota/", {"cpu_milli": -1, "gpu_milli": 1, "colour": "red"}, format="json")
    assert both.status_code == 400 and set(both.json()["fields"]) == {"cpu_milli", "colour"}
    assert both.json()["fields"]["colour"][0]["code"] == "unknown_field"
    assert Team.objects.get(slug="demo").gpu_milli == 4000


def test_every_write_body_refuses_keys_it_does_not_take(world):
    """A typo in any write body is a 400 naming the key, never a silent no-op: a batch, a template, a token, a
    membership change, a reproduce with resume."""
    demo, admin = client_for("demo"), client_for("admin")
    cases = [
        (demo, "/api/v1/jobs/batch/", {"jobs": [body(name="a")], "job": [body(name="b")]}, "job"),
        (demo, "/api/v1/templates/", {"team": "demo", "name": "t1", "job": body(), "descripton": "x"}, "descripton"),
        (demo, "/api/v1/tokens/", {"name": "ci", "scopes": ["read"], "expires_in_day": 3}, "expires_in_day"),
        (admin, "/api/v1/teams/demo/members/", {"username": "demo", "rol": "maintainer"}, "rol"),
    ]
    for client, path, payload, key in cases:
        answer = client.post(path, payload, format="json")
        assert answer.status_code == 400, (path, answer.status_code, answer.content)
        assert answer.json()["fields"][key][0]["code"] == "unknown_field", (path, answer.json())
    assert Job.objects.count() == 0


def test_list_filters_cursor_pagination_and_bounded_queries(world):
    demo = client_for("demo")
    demo.post(
        "/api/v1/jobs/batch/",
        {"jobs": [body(name=f"j{i}", labels={"exp": str(i % 2)}) for i in range(60)]},
        format="json",
    )
    with CaptureQueriesContext(connection) as queries:
        page = demo.get("/api/v1/jobs/?page_size=25")
    assert page.status_code == 200 and len(page.json()["results"]) == 25
    assert len(queries) <= 6
    names = [j["name"] for j in page.json()["results"]]
    assert names[0] == "j59"  # newest first
    second = demo.get(page.json()["next"])
    assert second.json()["results"][0]["name"] == "j34"
    assert len(demo.get("/api/v1/jobs/?label=exp=1&page_size=100").json()["results"]) == 30
    assert demo.get("/api/v1/jobs/?state=running").json()["results"] == []
    assert demo.get("/api/v1/jobs/?label=broken").status_code == 400


def test_queue_detail_shows_order_positions_and_waits(world):
    demo = client_for("demo")
    Queue.objects.filter(name="debug").update(state="closed")
    for i in range(3):
        demo.post("/api/v1/jobs/", body(queue="debug", name=f"w{i}"), format="json")
    queue = demo.get("/api/v1/queues/debug/").json()
    assert [j["name"] for j in queue["jobs"]] == ["w0", "w1", "w2"]
    assert [j["position"] for j in queue["jobs"]] == [1, 2, 3]
    assert all("estimated_wait_s" in j for j in queue["jobs"])
    assert queue["jobs_total"] == 3
    # A long line comes in part: the first `limit` jobs, with the whole line's count and estimates.
    head = demo.get("/api/v1/queues/debug/?limit=2").json()
    assert [j["name"] for j in head["jobs"]] == ["w0", "w1"] and head["jobs_total"] == 3
    assert head["jobs"][1]["estimated_start"] == queue["jobs"][1]["estimated_start"]
    # A waiting job says so itself (what `trainyard status` shows, wherever the job waits in a long line).
    shown = demo.get(f"/api/v1/jobs/{queue['jobs'][2]['id']}/").json()
    assert shown["estimated_start"] == queue["jobs"][2]["estimated_start"] and "estimated_start" in shown
    for bad in ("0", "x", "10001"):
        answer = demo.get(f"/api/v1/queues/debug/?limit={bad}")
        assert answer.status_code == 400 and answer.json()["code"] == "invalid_parameter", bad
    # Someone of another team sees the same places in the line, anonymous: no name, owner or team.
    theirs = client_for("outsider").get("/api/v1/queues/debug/").json()["jobs"]
    assert [j["position"] for j in theirs] == [1, 2, 3] and all(j["team"] is None and "name" not in j for j in theirs)
    assert [j["estimated_start"] for j in theirs] == [j["estimated_start"] for j in queue["jobs"]]
    listing = demo.get("/api/v1/queues/").json()
    assert {q["name"] for q in listing} == {"debug", "train", "distributed"}


def test_team_usage_specs_images_nodes(world):
    demo = client_for("demo")
    team = demo.get("/api/v1/teams/demo/").json()
    assert team["quota"]["gpu_milli"] == 4000 and team["usage"]["gpu_milli"] == 0
    assert {m["username"] for m in team["members"]} == {"demo"}
    specs = {s["name"]: s for s in demo.get("/api/v1/specs/").json()}
    assert specs["shared"]["gpu_memory_eighths"] == 2 and specs["guaranteed"]["exclusive"]
    images = {i["name"]: i for i in demo.get("/api/v1/images/").json()}
    assert images["pytorch-2.5-cuda12.4"]["compatible_nodes"]
    gpus = demo.get("/api/v1/gpus/").json()
    assert len(gpus) == 4 and all(g["emulated"] for g in gpus)


def test_schema_is_valid_without_warnings():
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", "/dev/null")


def test_fast_job_output_matches_drfs_field_by_field_output(world):
    """JobSerializer builds rows from a per-class plan; it must render exactly what DRF's generic path renders."""
    from datetime import timedelta

    from django.utils import timezone
    from rest_framework import serializers
    from rest_framework.renderers import JSONRenderer

    from jobs.api import JobDetailSerializer, JobSerializer, JobSubmittedSerializer
    from jobs.states import JobState

    client = client_for("demo")
    first = client.post("/api/v1/jobs/", body(), format="json").json()
    Queue.objects.filter(name="debug").update(allow_explicit_request=True)
    explicit_body = body(
        queue="debug",
        gpu_milli=300,
        gpu_memory_mib=4096,
        image="docker.io/library/python:3.11@sha256:" + "5" * 64,
        ci={"commit": "abc"},
    )
    del explicit_body["spec"]
    explicit = client.post("/api/v1/jobs/", explicit_body, format="json")
    now = timezone.now()
    Job.objects.filter(pk=first["id"]).update(
        state=JobState.FAILED,
        exit_code=3,
        failure_class="user",
        started_at=now - timedelta(minutes=5),
        finished_at=now,
        admitted_at=now - timedelta(minutes=6),
        deadline=now + timedelta(hours=1),
        reproduce={"image_digest": "sha256:" + "4" * 64},
        excluded_gpus=["GPU-1"],
    )
    assert client.post(f"/api/v1/jobs/{first['id']}/reproduce/").status_code == 201
    assert explicit.status_code == 201, explicit.json()
    jobs = list(Job.objects.select_related("owner", "team", "queue", "spec").order_by("submitted_at"))
    assert len(jobs) == 3 and jobs[1].spec is None and jobs[2].reproduced_from_id == jobs[0].id
    for cls in (JobSerializer, JobDetailSerializer, JobSubmittedSerializer):
        for job in jobs:
            fast = JSONRenderer().render(cls(job).data)
            generic = JSONRenderer().render(serializers.ModelSerializer.to_representation(cls(), job))
            assert fast == generic, cls.__name__


def test_gpu_models_are_checked_against_the_pool_and_shown_on_the_job(world):
    from cluster.inventory import GpuInfo, NodeInfo
    from cluster.services import inventory_sync

    gpus = tuple(GpuInfo(uuid=f"GPU-h-{i}", index=i, model="NVIDIA H100 80GB HBM3", memory_mib=81559) for i in range(2))
    inventory_sync(
        info=NodeInfo(
            name="h100-node",
            emulated=True,
            driver_version="550.54.15",
            cuda_version="12.4",
            cpu_milli=64000,
            memory_mib=512 * 1024,
            gpus=gpus,
        )
    )
    client = client_for("demo")
    refused = client.post("/api/v1/jobs/", body(gpu_models=["B200"]), format="json")
    assert refused.status_code == 400
    assert refused.json()["code"] == "unknown_gpu_model" and "NVIDIA H100 80GB HBM3" in refused.json()["detail"]
    wrong_type = client.post("/api/v1/jobs/", body(gpu_models="H100"), format="json")
    assert wrong_type.status_code == 400
    accepted = client.post("/api/v1/jobs/", body(gpu_models=["h100"]), format="json")
    assert accepted.status_code == 201, accepted.json()
    detail = client.get(f"/api/v1/jobs/{accepted.json()['id']}/").json()
    assert detail["gpu_models"] == ["h100"]


def test_every_problem_of_a_submission_is_reported_at_once_in_the_forms_order(world):
    demo = client_for("demo")
    bad = body(
        queue="debug",
        spec="guaranteed",  # debug offers shared only
        image="evil.example.com/x:1",  # a registry that is not allowed
        command="",
        env={"CUDA_VISIBLE_DEVICES": "0", "1BAD": "x"},
        timeout_s="soon",  # refused by the input serializer; the service still judges the rest
        max_retries=99,
    )
    response = demo.post("/api/v1/jobs/", bad, format="json")
    assert response.status_code == 400
    answer = response.json()
    assert list(answer["fields"]) == ["spec", "image", "command", "env", "timeout_s", "max_retries"]
    assert answer["code"] == "spec_not_allowed_in_queue"  # the first, in the form's order
    assert [e["code"] for e in answer["fields"]["env"]] == ["reserved_env_name", "invalid_env_name"]
    assert answer["fields"]["timeout_s"][0]["code"] == "invalid"
    assert answer["fields"]["max_retries"][0]["code"] == "invalid_max_retries"
    assert answer["detail"].startswith("7 problems: ")
    assert not Job.objects.exists()

    batch = demo.post("/api/v1/jobs/batch/", {"jobs": [body(), bad]}, format="json")
    assert batch.status_code == 400 and list(batch.json()["jobs"]["1"]) == list(answer["fields"])

    one = demo.post("/api/v1/jobs/", body(max_retries=99), format="json").json()
    assert one["code"] == "invalid_max_retries" and list(one["fields"]) == ["max_retries"]


@pytest.mark.parametrize(("given", "seconds"), [("4h", 14400), ("30m", 1800), ("1h30m", 5400), (600, 600), ("90", 90)])
def test_time_limits_are_accepted_in_human_units(world, given, seconds):
    response = client_for("demo").post("/api/v1/jobs/", body(timeout_s=given), format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["timeout_s"] == seconds


def test_a_time_limit_over_the_queue_maximum_is_said_in_human_units(world):
    answer = client_for("demo").post("/api/v1/jobs/", body(queue="debug", timeout_s="5h"), format="json").json()
    assert answer["code"] == "timeout_exceeds_queue_maximum"
    assert "time limit 5h is over queue 'debug''s maximum of 4h" in answer["detail"]


def test_a_request_larger_than_the_queue_is_said_in_gpus(world):
    import re

    answer = client_for("demo").post("/api/v1/jobs/", body(spec="guaranteed", gpus=16), format="json").json()
    assert answer["code"] == "request_exceeds_queue_capability"
    assert re.search(
        r"the job needs 16 GPUs; queue 'train' holds at most \d+ GPUs?, so it could never", answer["detail"]
    )


def test_places_in_the_line_are_ranked_when_read_and_left_out_of_a_submissions_answer(world):
    """A waiting job's `queue_position` is its rank in its line when the response is made (docs/api.md); the answer
    to a submission or a batch leaves it null (counting a long line would cost more than the submission, and a
    batch's answer reads nothing after the commit); a list ranks its page in one query."""
    demo = client_for("demo")
    Queue.objects.filter(name="train").update(state="closed")  # nothing is admitted: every job waits
    first = demo.post("/api/v1/jobs/", body(name="first"), format="json").json()
    assert first["state"] == "pending" and first["queue_position"] is None
    batch = demo.post("/api/v1/jobs/batch/", {"jobs": [body(name=f"b{i}") for i in range(5)]}, format="json")
    assert [job["queue_position"] for job in batch.json()] == [None] * 5
    with CaptureQueriesContext(connection) as queries:
        listed = demo.get("/api/v1/jobs/?state=pending").json()["results"]
    assert sorted(job["queue_position"] for job in listed) == [1, 2, 3, 4, 5, 6]
    assert sum("row_number()" in q["sql"] for q in queries.captured_queries) == 1
    assert demo.get(f"/api/v1/jobs/{first['id']}/").json()["queue_position"] == 1
    demo.post(f"/api/v1/jobs/{first['id']}/cancel/")
    assert demo.get(f"/api/v1/jobs/{batch.json()[0]['id']}/").json()["queue_position"] == 1
    assert demo.get(f"/api/v1/jobs/{first['id']}/").json()["queue_position"] is None
