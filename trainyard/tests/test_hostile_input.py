"""400, never 500: hostile input anywhere in the API gets a JSON error with a stable code."""

import json

import pytest
from rest_framework.test import APIClient

from jobs.tests.conftest import pin_catalog
from ops.seed import seed

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo(settings):
    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_LOCAL_GPUS = "4x24GiB"
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    from django.contrib.auth import get_user_model

    client = APIClient()
    client.force_authenticate(get_user_model().objects.get(username="demo"))
    return client


def job(**overrides):
    data = {"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": ["python", "t.py"]}
    data.update(overrides)
    return data


def assert_400(response, code=None):
    assert response.status_code == 400, (response.status_code, response.content[:300])
    body = response.json()
    assert body["code"], body
    if code:
        assert body["code"] == code, body
    return body


@pytest.mark.parametrize(
    "overrides",
    [
        {"command": ["python", "a\x00b"]},
        {"command": "python a\x00b"},
        {"args": ["\x00"]},
        {"env": {"A": "x\x00y"}},
        {"labels": {"k": "v\x00"}},
        {"ci": {"git_commit": "abc\x00"}},
        {"ci": {"nested": {"deeper": ["\x00"]}}},
        {"name": "n\x00"},
        {"working_dir": "a\x00"},
        {"tensorboard_logdir": "tb\x00"},
        {"mounts": [{"claim": "data", "path": "/data\x00"}]},
        {"image": "python\x00"},
    ],
)
def test_nul_bytes_anywhere_in_a_submission_are_a_400(demo, overrides):
    assert_400(demo.post("/api/v1/jobs/", job(**overrides), format="json"))


@pytest.mark.parametrize("name", ["A\nB", "FOO\n", "A=B", "=", "", "1A", "A B"])
def test_env_names_that_cannot_be_names_are_a_400(demo, name):
    assert_400(demo.post("/api/v1/jobs/", job(env={name: "1"}), format="json"), "invalid_env_name")


def test_json_nested_a_thousand_deep_is_a_400(demo):
    deep = "[" * 1000 + "]" * 1000
    raw = json.dumps(job())[:-1] + f', "ci": {{"x": {deep}}}}}'
    body = assert_400(demo.post("/api/v1/jobs/", raw, content_type="application/json"))
    assert body["code"] in {"too_deep", "parse_error"}


def test_json_nested_deeper_than_the_parser_allows_is_a_400(demo):
    deep = "[" * 100_000 + "]" * 100_000
    assert_400(demo.post("/api/v1/jobs/", deep, content_type="application/json"))


def test_a_body_over_the_documented_limit_is_a_413_or_400(demo, settings):
    raw = json.dumps(job(ci={"blob": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 10)}))
    response = demo.post("/api/v1/jobs/", raw, content_type="application/json")
    assert response.status_code in (400, 413), response.status_code
    assert response.json()["code"] == "request_too_large"


@pytest.mark.parametrize("query", ["since=2025-02-30", "submitted_after=2025-02-30", "submitted_after=%00"])
def test_impossible_dates_in_filters_are_a_400(demo, query):
    response = demo.get(f"/api/v1/jobs/?{query}")
    assert response.status_code in (200, 400), response.status_code
    if query.startswith("submitted_after"):
        assert_400(response)


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/jobs/?state=%00",
        "/api/v1/jobs/?team=%00",
        "/api/v1/jobs/?label=%00",
        "/api/v1/jobs/?label=a%3D%00",
        "/api/v1/jobs/?cursor=" + "A" * 20000,
        "/api/v1/jobs/?cursor=%00",
        "/api/v1/jobs/?cursor=cD0yMDI1LTAyLTMwKzAwJTNBMDA%3D",
        "/api/v1/queues/%00/",
        "/api/v1/teams/%00/",
        "/api/v1/images/%00/",
        "/api/v1/nodes/%00/",
        "/api/v1/jobs/%00/",
        "/api/v1/monitoring/alerts/?since=2025-02-30",
    ],
)
def test_odd_urls_never_500(demo, url):
    response = demo.get(url)
    assert response.status_code < 500, (url, response.status_code)
    if response.status_code >= 400 and response.get("Content-Type", "").startswith("application/json"):
        assert response.json()["code"]


def test_deleting_a_token_by_a_name_that_is_not_an_id_is_a_404(demo):
    response = demo.delete("/api/v1/tokens/abc/")
    assert response.status_code in (400, 404), response.status_code
    assert response.json()["code"]


@pytest.mark.parametrize("name", ["python-3.11", "pytorch-2.5-cuda12.4"])
def test_images_with_dots_in_their_names_can_be_fetched(demo, name):
    from images.models import BaseImage

    assert BaseImage.objects.filter(name=name).exists()
    response = demo.get(f"/api/v1/images/{name}/")
    assert response.status_code == 200, response.status_code
    assert response.json()["name"] == name


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"tensorboard_logdir": "../../other-job/tensorboard"}, "path_escapes_job"),
        ({"tensorboard_logdir": "/srv/trainyard/var/work"}, "path_outside_job"),
        ({"tensorboard_logdir": "runs/../../x"}, "path_escapes_job"),
        ({"working_dir": "/etc"}, "path_outside_job"),
        ({"working_dir": ".."}, "path_escapes_job"),
        ({"working_dir": "a\\..\\..\\b"}, "path_escapes_job"),
        ({"mounts": [{"claim": "team-data", "path": "/data"}]}, "mounts_not_supported"),
        ({"mounts": "nope"}, "not_a_list"),
    ],
)
def test_paths_that_leave_the_job_are_refused(demo, overrides, code):
    body = assert_400(demo.post("/api/v1/jobs/", job(**overrides), format="json"), code)
    assert list(body["fields"]) == [next(iter(overrides))]


def test_paths_inside_the_job_are_kept_normalised(demo):
    response = demo.post(
        "/api/v1/jobs/", job(working_dir="src/./train", tensorboard_logdir="runs/exp1/"), format="json"
    )
    assert response.status_code == 201, response.json()
    from jobs.models import Job

    stored = Job.objects.get(pk=response.json()["id"])
    assert (stored.working_dir, stored.tensorboard_logdir) == ("src/train", "runs/exp1")


@pytest.mark.parametrize(
    ("mount", "code"),
    [
        ({"claim": "data", "path": "/data", "hostPath": "/"}, "invalid_mount"),
        ({"claim": "Bad_Name", "path": "/data"}, "invalid_mount"),
        ({"claim": "data", "path": "data"}, "path_escapes_job"),
        ({"claim": "data", "path": "/data/../etc"}, "path_escapes_job"),
        ({"claim": "data", "path": "/"}, "invalid_mount"),
        ({"claim": "data", "path": "/data", "sub_path": "../other-team"}, "path_escapes_job"),
    ],
)
def test_mounts_on_kubernetes_are_claims_at_clean_paths(demo, settings, mount, code):
    settings.TRAINYARD_BACKEND = "volcano"
    pin_catalog()
    assert_400(demo.post("/api/v1/jobs/", job(mounts=[mount]), format="json"), code)


def test_an_absolute_log_dir_must_lie_under_one_of_the_jobs_mounts(demo, settings):
    settings.TRAINYARD_BACKEND = "volcano"
    pin_catalog()
    mounts = [{"claim": "demo-ckpt", "path": "/ckpt", "kind": "checkpoint"}]
    assert_400(
        demo.post("/api/v1/jobs/", job(mounts=mounts, tensorboard_logdir="/other/tb"), format="json"),
        "path_outside_job",
    )
    ok = demo.post("/api/v1/jobs/", job(mounts=mounts, tensorboard_logdir="/ckpt/tb"), format="json")
    assert ok.status_code == 201, ok.json()


@pytest.mark.parametrize("value", ["2025-02-30", "0000-0-0", "2025-13-01T00:00:00", "not a date"])
def test_impossible_dates_in_monitoring_queries_are_a_400(demo, value):
    assert_400(demo.get("/api/v1/monitoring/scheduling/", {"since": value}), "invalid_datetime")
