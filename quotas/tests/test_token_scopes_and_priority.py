"""Token scopes, tokens that cannot outlive or out-scope their maker, and the per-queue priority cap."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.models import Job
from ops.seed import seed
from quotas.models import ApiToken, Membership, Queue, Team
from quotas.tests.factories import MembershipFactory, UserFactory
from quotas.tokens import token_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(settings):
    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_LOCAL_GPUS = "4x24GiB"
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    member = UserFactory(username="mia")
    MembershipFactory(team=Team.objects.get(slug="demo"), user=member, role=Membership.Role.MEMBER)
    return member


def with_token(username, **kwargs):
    token, raw = token_create(user=get_user_model().objects.get(username=username), name="t", **kwargs)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client, token


def job(**overrides):
    data = {"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": ["true"]}
    return {**data, **overrides}


def test_a_read_token_reads_but_cannot_submit_or_manage_tokens(world):
    client, _ = with_token("demo", scopes=["read"])
    assert client.get("/api/v1/jobs/").status_code == 200
    refused = client.post("/api/v1/jobs/", job(), format="json")
    assert refused.status_code == 403 and refused.json()["code"] == "token_scope"
    assert client.get("/api/v1/tokens/").json()["code"] == "token_scope"
    assert Job.objects.count() == 0


def test_a_submit_token_submits_but_cannot_list_mint_or_revoke_tokens(world):
    client, token = with_token("demo")  # the default: read and submit
    assert token.scopes == ["read", "submit"]
    assert client.post("/api/v1/jobs/", job(), format="json").status_code == 201
    other, _ = token_create(user=token.user, name="other")
    for response in [
        client.get("/api/v1/tokens/"),
        client.post("/api/v1/tokens/", {"name": "forever"}, format="json"),
        client.delete(f"/api/v1/tokens/{other.id}/"),
    ]:
        assert response.status_code == 403 and response.json()["code"] == "token_scope"
    assert ApiToken.objects.get(pk=other.pk).revoked_at is None


def test_staff_only_writes_also_need_the_admin_scope(world):
    client, _ = with_token("admin", scopes=["read", "submit"])
    response = client.post("/api/v1/nodes/local/cordon/")
    assert response.status_code == 403 and response.json()["code"] == "token_scope"
    response = client.patch("/api/v1/teams/demo/quota/", {"max_running_jobs": 1}, format="json")
    assert response.status_code == 403 and response.json()["code"] == "token_scope"


def test_a_token_cannot_make_a_token_that_outlives_it_or_has_more_scopes(world):
    client, parent = with_token("demo", scopes=["read", "submit", "admin"], expires_in_days=1)
    forever = client.post("/api/v1/tokens/", {"name": "forever"}, format="json")
    assert forever.status_code == 201
    assert ApiToken.objects.get(pk=forever.json()["id"]).expires_at == parent.expires_at
    longer = client.post("/api/v1/tokens/", {"name": "long", "expires_in_days": 30}, format="json")
    assert longer.status_code == 400 and longer.json()["code"] == "token_outlives_parent"
    shorter = client.post("/api/v1/tokens/", {"name": "short", "scopes": ["read"]}, format="json")
    assert shorter.status_code == 201 and shorter.json()["scopes"] == ["read"]

    reader, _ = with_token("demo", scopes=["read", "admin"])
    more = reader.post("/api/v1/tokens/", {"name": "x", "scopes": ["submit"]}, format="json")
    assert more.status_code == 400 and more.json()["code"] == "scope_exceeds_token"


def test_a_session_manages_tokens_with_any_scope_and_expiry(world):
    client = APIClient()
    client.force_login(get_user_model().objects.get(username="demo"))
    made = client.post("/api/v1/tokens/", {"name": "ci", "scopes": ["admin", "read"]}, format="json")
    assert made.status_code == 201 and made.json()["scopes"] == ["admin", "read"]
    assert made.json()["expires_at"] is None
    bad = client.post("/api/v1/tokens/", {"name": "ci", "scopes": ["root"]}, format="json")
    assert bad.status_code == 400


def test_expired_and_revoked_tokens_are_refused(world):
    client, token = with_token("demo", expires_in_days=1)
    ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert client.get("/api/v1/jobs/").status_code == 401
    client, token = with_token("demo")
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    assert client.get("/api/v1/jobs/").status_code == 401


def test_members_are_capped_at_the_queues_member_priority(world):
    member = APIClient()
    member.force_authenticate(world)
    refused = member.post("/api/v1/jobs/", job(priority=100), format="json")
    assert refused.status_code == 400 and refused.json()["code"] == "priority_exceeds_queue_maximum"
    Queue.objects.filter(name="train").update(max_member_priority=10)
    ok = member.post("/api/v1/jobs/", job(priority=10), format="json")
    assert ok.status_code == 201, ok.json()
    assert not Job.objects.get(pk=ok.json()["id"]).events.filter(kind="priority_elevated").exists()


def test_maintainers_may_go_higher_and_it_is_audited(world):
    maintainer = APIClient()
    maintainer.force_authenticate(get_user_model().objects.get(username="demo"))
    made = maintainer.post("/api/v1/jobs/", job(priority=100), format="json")
    assert made.status_code == 201, made.json()
    event = Job.objects.get(pk=made.json()["id"]).events.get(kind="priority_elevated")
    assert event.actor == "demo" and event.data == {"priority": 100, "queue_maximum": 0}


def test_a_user_holds_a_bounded_number_of_live_tokens(world, settings):
    from quotas.tokens import token_revoke

    settings.TRAINYARD_MAX_TOKENS_PER_USER = 3
    client = APIClient()
    client.force_login(world)
    made = [client.post("/api/v1/tokens/", {"name": f"t{i}"}, format="json") for i in range(3)]
    assert [r.status_code for r in made] == [201, 201, 201]
    refused = client.post("/api/v1/tokens/", {"name": "one-too-many"}, format="json")
    assert refused.status_code == 400 and refused.json()["code"] == "too_many_tokens"
    token_revoke(token=ApiToken.objects.filter(user=world).first())  # a revoked one frees its place
    assert client.post("/api/v1/tokens/", {"name": "again"}, format="json").status_code == 201
