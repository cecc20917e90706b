"""Portal: API tokens are created (the secret shown once), listed and revoked; the REST API revokes by the id shown."""

import re

import pytest
from rest_framework.test import APIClient

from frontend.tests.conftest import login
from quotas.models import ApiToken
from quotas.tokens import token_create

pytestmark = pytest.mark.django_db


def secret_on(body: str) -> str | None:
    match = re.search(r'id="new-token"[^>]*value="(ty_[^"]+)"', body)
    return match.group(1) if match else None


def test_create_shows_the_secret_once_and_it_works(portal):
    client = login(portal.demo)
    page = client.get("/tokens/")
    assert page.status_code == 200 and "No tokens yet." in page.content.decode()
    created = client.post("/tokens/", {"name": "gitlab-ci", "scopes": ["read", "submit"], "expires_in_days": "30"})
    body = created.content.decode()
    assert created.status_code == 200 and "no-store" in created["Cache-Control"]
    raw = secret_on(body)
    token = ApiToken.objects.get()
    assert raw and raw.startswith(f"ty_{token.prefix}_") and token.scopes == ["read", "submit"]
    assert token.expires_at is not None and token.user == portal.demo
    assert f'data-prefix="{token.prefix}" data-status="active"' in body
    # the secret is never shown again
    again = client.get("/tokens/").content.decode()
    assert secret_on(again) is None and raw not in again and token.prefix in again
    # and the token works against the API
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.get("/api/v1/jobs/").status_code == 200


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"name": "", "scopes": ["read"]}, "name"),
        ({"name": "x" * 101, "scopes": ["read"]}, "name"),
        ({"name": "ci", "scopes": []}, "scopes"),
        ({"name": "ci", "scopes": ["root"]}, "scopes"),
        ({"name": "ci", "scopes": ["read"], "expires_in_days": "soon"}, "expires_in_days"),
        ({"name": "ci", "scopes": ["read"], "expires_in_days": "0"}, "expires_in_days"),
    ],
)
def test_bad_input_is_a_form_error(portal, data, field):
    response = login(portal.demo).post("/tokens/", data)
    assert response.status_code == 400 and f'id="err-{field}"' in response.content.decode()
    assert not ApiToken.objects.exists()


def test_revoke_asks_first_then_the_token_stops_working(portal):
    token, raw = token_create(user=portal.demo, name="ci")
    client = login(portal.demo)
    confirm = client.get(f"/tokens/{token.pk}/revoke/")
    assert confirm.status_code == 200 and token.prefix in confirm.content.decode()
    token.refresh_from_db()
    assert token.revoked_at is None, "GET only asks"
    assert client.post(f"/tokens/{token.pk}/revoke/").status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert f'data-prefix="{token.prefix}" data-status="revoked"' in client.get("/tokens/").content.decode()
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.get("/api/v1/jobs/").status_code == 401


def test_nobody_sees_or_revokes_another_users_tokens(portal):
    token, _ = token_create(user=portal.demo, name="demo-ci")
    other = login(portal.outsider)
    assert token.prefix not in other.get("/tokens/").content.decode()
    assert other.get(f"/tokens/{token.pk}/revoke/").status_code == 404
    assert other.post(f"/tokens/{token.pk}/revoke/").status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None


def test_the_api_revokes_by_the_id_the_portal_shows(portal):
    token, _ = token_create(user=portal.demo, name="ci")
    api = APIClient()
    api.force_authenticate(portal.outsider)
    assert api.delete(f"/api/v1/tokens/{token.prefix}/").status_code == 404
    api.force_authenticate(portal.demo)
    assert api.delete("/api/v1/tokens/zzzzzzzz/").status_code == 404
    assert api.delete(f"/api/v1/tokens/{token.prefix}/").status_code == 204
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_huge_ids_are_404s_not_errors(portal):
    client = login(portal.demo)
    assert client.get("/tokens/99999999999999/revoke/").status_code == 404
    assert client.get("/templates/99999999999999/edit/").status_code == 404
    assert client.get("/jobs/new/?template=99999999999999").status_code == 404
