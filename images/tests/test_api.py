"""The images API: project images with the FROM check, builds with their log and findings, base rebuilds on demand,
the feed and Trivy imports, the catalog's compatibility and scan columns."""

import json

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from images import services
from images.models import Advisory, ImageBuild
from images.tests.conftest import DATA
from images.tests.test_builds import base_built, built, define_base
from quotas.tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = pytest.mark.django_db


def client_for(user):
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def people():
    team = TeamFactory(slug="vision")
    member = UserFactory(username="ana")
    MembershipFactory(team=team, user=member)
    staff = get_user_model().objects.create_user("ops", password="x", is_staff=True)
    return {"team": team, "member": client_for(member), "outsider": client_for(UserFactory(username="eve")),
            "staff": client_for(staff)}  # fmt: skip


def test_a_project_image_is_defined_built_and_shown_with_its_findings(images_env, people, feed):
    services.feed_load(document=feed, source="planted")
    base_built(images_env)
    member = people["member"]
    bad = member.post(
        "/api/v1/project-images/",
        {"team": "vision", "name": "trainer", "base": "tiny-base", "containerfile": "FROM ubuntu:24.04\n"},
        format="json",
    )
    assert bad.status_code == 400 and bad.json()["code"] == "base_not_in_catalog"
    assert people["outsider"].post(
        "/api/v1/project-images/", {"team": "vision", "name": "x", "base": "tiny-base", "requirements": "numpy\n"},
        format="json",
    ).status_code == 404  # fmt: skip
    created = member.post(
        "/api/v1/project-images/",
        {
            "team": "vision",
            "name": "trainer",
            "base": "tiny-base",
            "containerfile": "FROM tiny-base\nRUN echo 1 > /x\n",
        },
        format="json",
    )
    assert created.status_code == 201, created.json()
    image = created.json()
    assert image["last_build"]["status"] == "queued" and image["digest"] == ""
    services.build_run(build_id=image["last_build"]["id"])
    listed = member.get("/api/v1/project-images/").json()
    row = next(r for r in listed["results"] if r["name"] == "trainer") if isinstance(listed, dict) else listed[0]
    assert row["digest"].startswith("sha256:") and row["last_build"]["findings"]["critical"] == 1
    detail = member.get(f"/api/v1/image-builds/{image['last_build']['id']}/").json()
    assert detail["status"] == "succeeded" and "podman build" in detail["log"]
    assert {"GHSA-8q59-q68h-6hv4", "DSA-TEST-0001"} == {f["vuln_id"] for f in detail["finding_list"]}
    assert any(p["name"] == "PyYAML" for p in detail["sbom"])
    assert people["outsider"].get(f"/api/v1/image-builds/{image['last_build']['id']}/").status_code == 404
    again = member.post(f"/api/v1/project-images/{image['id']}/build/")
    assert again.status_code == 202 and again.json()["status"] == "queued"


def test_only_staff_or_owners_rebuild_a_base_and_the_catalog_says_which_nodes_can_run_it(images_env, people):
    from cluster.models import Node

    Node.objects.create(name="old-node", driver_version="535.104")
    Node.objects.create(name="new-node", driver_version="560.35")
    define_base(images_env)
    assert people["member"].post("/api/v1/images/tiny-base/build/").status_code == 403
    response = people["staff"].post("/api/v1/images/tiny-base/build/")
    assert response.status_code == 202 and response.json()["trigger"] == "manual"
    services.build_run(build_id=response.json()["id"])
    row = people["member"].get("/api/v1/images/tiny-base/").json()
    assert row["compatible_nodes"] == ["new-node"] and row["incompatible_nodes"][0]["node"] == "old-node"
    assert row["built_by_platform"] and row["last_build"]["status"] == "succeeded" and row["last_build"]["size_bytes"]


def test_the_feed_and_trivy_reports_load_through_the_api_for_staff_only(images_env, people, feed):
    assert people["member"].post("/api/v1/vulnerability-feed/", feed, format="json").status_code == 403
    loaded = people["staff"].post("/api/v1/vulnerability-feed/", feed, format="json")
    assert loaded.status_code == 201 and loaded.json()["loaded"] == 3 and Advisory.objects.count() == 3
    bad = people["staff"].post("/api/v1/vulnerability-feed/", [{"summary": "no id"}], format="json")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_feed"

    build = built(define_base(images_env))
    report = json.loads((DATA / "trivy-report.json").read_text())
    imported = people["staff"].post(f"/api/v1/image-builds/{build.pk}/trivy/", report, format="json")
    assert imported.status_code == 200 and imported.json()["findings"]["high"] == 1
    trivy = build.findings.get(source="trivy")
    assert (trivy.vuln_id, trivy.package, trivy.fixed_version) == ("CVE-2024-0001", "tzdata", "2024b-0+deb12u1")
    assert ImageBuild.objects.get(pk=build.pk).findings.filter(source="feed").count() == 2  # the feed's are kept


def test_scan_policies_are_readable_and_staff_grant_expiring_exceptions_through_the_api(people):
    from datetime import timedelta

    from django.utils import timezone

    from images.models import ScanPolicy
    from quotas.models import Queue

    ScanPolicy.objects.create(queue=Queue.objects.create(name="prod"), max_severity="medium")
    listed = people["member"].get("/api/v1/scan-policies/").json()
    assert listed == [
        {"queue": "prod", "max_severity": "medium", "require_scan": False, "refuse_root": False, "exceptions": []}
    ]
    grant = {"vuln_id": "GHSA-8q59-q68h-6hv4", "reason": "not reachable", "expires_at": (
        timezone.now() + timedelta(days=2)).isoformat()}  # fmt: skip
    assert people["member"].post("/api/v1/scan-policies/prod/exceptions/", grant, format="json").status_code == 403
    granted = people["staff"].post("/api/v1/scan-policies/prod/exceptions/", grant, format="json")
    assert granted.status_code == 201 and granted.json()["created_by"] == "ops"
    expired = {**grant, "expires_at": (timezone.now() - timedelta(days=1)).isoformat()}
    refused = people["staff"].post("/api/v1/scan-policies/prod/exceptions/", expired, format="json")
    assert refused.status_code == 400 and refused.json()["code"] == "exception_expired"
    no_reason = people["staff"].post("/api/v1/scan-policies/prod/exceptions/", {**grant, "reason": " "}, format="json")
    assert no_reason.status_code == 400
