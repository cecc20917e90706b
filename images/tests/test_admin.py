"""The admin console: bases with the catalog limit, a feed file upload, a Trivy import, a policy exception that
records who granted it."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.utils import timezone

from images.models import Advisory, BaseImage, ScanException, ScanPolicy
from images.tests.conftest import DATA
from quotas.models import Queue

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client_():
    user = get_user_model().objects.create_superuser("root", password="x")
    client = Client()
    client.force_login(user)
    return client, user


def test_a_feed_file_loads_and_a_bad_one_is_refused(admin_client_):
    client, _ = admin_client_
    assert "Load a feed file" in client.get("/admin/images/advisory/").content.decode()
    good = SimpleUploadedFile("osv.json", (DATA / "osv-feed.json").read_bytes())
    assert client.post("/admin/images/advisory/load/", {"feed": good}).status_code == 302
    assert Advisory.objects.filter(vuln_id="GHSA-8q59-q68h-6hv4", package="pyyaml", severity="critical").exists()
    bad = SimpleUploadedFile("osv.json", b"{not json")
    response = client.post("/admin/images/advisory/load/", {"feed": bad})
    assert response.status_code == 200 and "not an OSV feed" in response.content.decode()


def test_the_catalog_limit_holds_in_the_admin(admin_client_, settings):
    client, _ = admin_client_
    settings.TRAINYARD_MAX_BASE_IMAGES = 1
    BaseImage.objects.create(name="only", reference="nvcr.io/x:1")
    response = client.post("/admin/images/baseimage/add/", {"name": "second", "containerfile": "FROM scratch\n"})
    assert response.status_code == 200 and "the maximum" in response.content.decode()
    assert BaseImage.objects.count() == 1


def test_an_exception_is_granted_on_the_policy_page_with_who_and_until_when(admin_client_):
    client, user = admin_client_
    queue = Queue.objects.create(name="prod")
    policy = ScanPolicy.objects.create(queue=queue, max_severity="high")
    expires = (timezone.now() + timedelta(days=3)).replace(microsecond=0)
    form = {
        "queue": queue.pk,
        "max_severity": "high",
        "exceptions-TOTAL_FORMS": "1",
        "exceptions-INITIAL_FORMS": "0",
        "exceptions-0-vuln_id": "GHSA-8q59-q68h-6hv4",
        "exceptions-0-image": "",
        "exceptions-0-reason": "not reachable in our code",
        "exceptions-0-expires_at_0": expires.strftime("%Y-%m-%d"),
        "exceptions-0-expires_at_1": expires.strftime("%H:%M:%S"),
    }
    response = client.post(f"/admin/images/scanpolicy/{policy.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[-2000:]
    granted = ScanException.objects.get()
    assert granted.created_by == user and granted.reason == "not reachable in our code"
    assert granted.expires_at > timezone.now()
