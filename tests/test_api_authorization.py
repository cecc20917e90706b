"""Every API operation in the OpenAPI schema × every kind of caller: who gets in, who is refused, and how.

The operations come from the schema, so a new endpoint is in the matrix the day it is added. Rules that hold for
every operation: no 5xx; an error is JSON with a code; no caller without valid credentials gets in; a read-only
token writes nothing and manages no tokens; another team never reaches team demo's job or team, and never sees
its job id or its secret in any answer; only staff change shared infrastructure; 2xx bodies match the schema.
"""

import pytest

from tests.api_matrix import (
    PRINCIPALS,
    SECRET_ENV_VALUE,
    call,
    check_against_schema,
    client_for,
    make_world,
    operations,
    url_for,
)

pytestmark = pytest.mark.django_db

# Writes on shared infrastructure (nodes, GPUs, alert rules and alerts, team quotas) are for staff alone.
STAFF_ONLY_WRITES = (
    "/api/v1/nodes/",
    "/api/v1/monitoring/gpus/",
    "/api/v1/monitoring/rules/",
    "/api/v1/monitoring/alerts/",
)


def _staff_only(op) -> bool:
    return op.unsafe and (op.path.startswith(STAFF_ONLY_WRITES) or op.path.endswith("/quota/"))


@pytest.fixture
def world(settings, registry_url):
    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_LOCAL_GPUS = "4x24GiB"
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_CLASSES": []}
    return make_world(registry_url)


def test_the_matrix_covers_every_operation():
    ops = operations()
    assert len(ops) >= 50
    assert {str(op) for op in ops} >= {"GET /api/v1/jobs/{id}/", "DELETE /api/v1/tokens/{id}/"}


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_every_operation_for(world, principal):
    client = client_for(principal)
    problems = []
    for op in operations():
        url = url_for(op, world)
        response = call(client, op, url)
        status = response.status_code
        where = f"{principal}: {op} -> {status}"
        text = response.content.decode(errors="replace")
        if status >= 500:
            problems.append(f"{where} (server error)")
            continue
        if status >= 400:
            body = response.json()
            if not body.get("code"):
                problems.append(f"{where} without an error code: {text[:200]}")
            if status < 500 and str(status) not in op.spec.get("responses", {}):
                problems.append(f"{where}: a {status} its schema does not declare")
        if principal in {"anonymous", "revoked", "expired"} and status not in (401, 403):
            problems.append(f"{where}: no valid credentials, yet not refused")
        if principal == "read_token" and op.unsafe and status != 403:
            problems.append(f"{where}: a read-only token must be refused")
        if principal == "read_token" and "/tokens/" in op.path and response.json().get("code") != "token_scope":
            problems.append(f"{where}: token management needs the admin scope")
        if principal == "other_team":
            if (world.job_id in url or "/teams/demo/" in url) and status not in (403, 404):
                problems.append(f"{where}: another team reached team demo's object")
            if world.job_id in text or SECRET_ENV_VALUE in text:
                problems.append(f"{where}: team demo's job id or secret in the answer")
        if principal in {"member", "maintainer", "other_team"} and _staff_only(op) and status not in (403, 404):
            problems.append(f"{where}: only staff may do this")
        if principal == "member" and op.unsafe and op.path.startswith("/api/v1/teams/") and status not in (403,):
            problems.append(f"{where}: a plain member manages the team")
        if status < 300:
            try:
                check_against_schema(op, response)
            except Exception as exc:  # noqa: BLE001 - collected, reported together
                problems.append(f"{where}: body does not match the schema: {str(exc).splitlines()[0]}")
    assert not problems, "\n".join(problems)


def test_staff_and_members_really_get_in(world):
    """The refusals above mean something only if the same operations work for those who may use them."""
    for principal, op_text, allowed in [
        ("member", "GET /api/v1/jobs/{id}/", 200),
        ("maintainer", "GET /api/v1/teams/{slug}/", 200),
        ("staff", "POST /api/v1/nodes/{name}/cordon/", 200),
        ("staff", "GET /api/v1/monitoring/alerts/{id}/", 200),
        ("maintainer", "DELETE /api/v1/tokens/{id}/", 204),
        ("member", "POST /api/v1/jobs/{id}/cancel/", 200),
    ]:
        op = next(o for o in operations() if str(o) == op_text)
        response = call(client_for(principal), op, url_for(op, world))
        assert response.status_code == allowed, (principal, op_text, response.status_code, response.content[:200])
