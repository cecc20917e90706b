"""The schema says what the API does: the 4xx every operation can answer, with the Error body, and
`additionalProperties: false` on request bodies the serializers refuse extras for (the authorization matrix and
the fuzzer check every 4xx they get is declared)."""

import pytest
from rest_framework.test import APIClient

from tests.api_matrix import schema


def test_every_operation_declares_its_auth_and_throttle_answers_with_the_error_body():
    for path, methods in schema()["paths"].items():
        if not path.startswith("/api/v1/"):
            continue
        for method, operation in methods.items():
            declared = operation["responses"]
            assert {"401", "403", "429"} <= set(declared), (method, path)
            if method in {"post", "put", "patch", "delete"}:
                assert {"400", "404", "409"} <= set(declared), (method, path)
            ref = declared["403"]["content"]["application/json"]["schema"]["$ref"]
            assert ref == "#/components/schemas/Error"
            assert "Retry-After" in declared["503"]["headers"], (method, path)
            assert (
                declared["503"]["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/Unavailable"
            )


def test_the_outage_answer_of_a_submission_is_in_the_schema_as_the_api_sends_it():
    """The 503 body's fields a client acts on (job_id, job_ids, job_exists) are declared, as sent by the API."""
    from kernel.errors import OutageAfterWrite, exception_handler

    unavailable = schema()["components"]["schemas"]["Unavailable"]
    sent = exception_handler(OutageAfterWrite("database_unavailable", "gone", job_id="x", job_exists=None), {})
    assert set(sent.data) <= set(unavailable["properties"])
    assert {"job_ids", "job_exists", "retry_after"} <= set(unavailable["properties"])
    assert unavailable["properties"]["job_exists"]["nullable"] is True
    assert sent["Retry-After"]


@pytest.mark.django_db
def test_a_body_the_schema_closes_is_one_the_api_refuses_extras_in(settings):
    from django.contrib.auth import get_user_model

    from ops.seed import seed

    components = schema()["components"]["schemas"]
    assert components["JobSubmitRequest"]["additionalProperties"] is False
    assert components["TokenCreateRequest"]["additionalProperties"] is False
    settings.TRAINYARD_BACKEND = "local"
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    client = APIClient()
    client.force_login(get_user_model().objects.get(username="demo"))
    answer = client.post("/api/v1/tokens/", {"name": "x", "surprise": 1}, format="json")
    assert answer.status_code == 400 and answer.json()["code"] == "unknown_field"


@pytest.mark.django_db
def test_the_edge_answers_every_operation_can_give_are_declared_on_every_operation(settings):
    """A NUL in the query string (400), an unknown `?format=` (404), an Accept the API cannot render (406) and a
    Content-Length over the limit (413) are answered before any view, on every route: the lists without a path or
    query parameter once declared none of them."""
    from django.contrib.auth import get_user_model

    from ops.seed import seed

    settings.TRAINYARD_BACKEND = "local"
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    client = APIClient()
    client.force_login(get_user_model().objects.get(username="demo"))
    probes = [("?x=%00", {}, 400), ("?format=bogus", {}, 404), ("", {"HTTP_ACCEPT": "application/xml"}, 406),
              ("", {"CONTENT_LENGTH": str(10**9)}, 413)]  # fmt: skip
    checked = 0
    for path, methods in schema()["paths"].items():
        if not path.startswith("/api/v1/") or "{" in path or "get" not in methods:
            continue
        declared = set(methods["get"]["responses"])
        for query, headers, status in probes:
            answer = client.get(f"{path}{query}", **headers)
            assert answer.status_code == status, (path, query, headers, answer.status_code)
            assert str(status) in declared, (path, status)
        checked += 1
    assert checked >= 20
