"""The portal's image catalog: base, age, last scan, findings, size, stale marks and which nodes can run each
image; a rebuild button for the team's images; a build page with its log, findings and SBOM."""

import pytest

from frontend.tests.conftest import login, portal  # noqa: F401 - the seeded portal fixture
from images import services
from images.models import ImageBuild, ProjectImage
from images.tests.test_builds import built, define_base
from quotas.models import Team

pytestmark = pytest.mark.django_db


def test_the_catalog_shows_scans_sizes_and_stale_images_and_rebuilds_on_request(
    portal,  # noqa: F811
    images_env,
    feed,
):
    services.feed_load(document=feed, source="planted")
    base = define_base(images_env)
    built(base)
    image = services.project_image_define(
        team=Team.objects.get(slug="demo"), name="trainer", base="tiny-base", containerfile="FROM tiny-base\n"
    )
    build = built(image)
    ProjectImage.objects.filter(pk=image.pk).update(stale=True)
    client = login(portal.demo)
    body = client.get("/images/").content.decode()
    assert "trainer" in body and "on tiny-base" in body and "stale: its base was rebuilt" in body
    assert "1 critical" in body and "1 medium" in body and "0 days ago" in body
    assert f"/images/builds/{build.pk}/" in body and "MB" in body  # the compressed size, human-readable

    response = client.post(f"/images/project/{image.pk}/build/")
    queued = ImageBuild.objects.filter(project_image=image, status="queued").get()
    assert response.status_code == 302 and response["Location"] == f"/images/builds/{queued.pk}/"
    assert client.post(f"/images/base/{base.pk}/build/").status_code == 404  # only staff rebuild bases

    page = client.get(f"/images/builds/{build.pk}/").content.decode()
    assert "GHSA-8q59-q68h-6hv4" in page and "PyYAML" in page and "podman build" in page and build.digest in page
    assert login(portal.outsider).get(f"/images/builds/{build.pk}/").status_code == 404


@pytest.mark.parametrize("down", [False, True])
def test_the_submit_form_names_a_tag_the_registry_lacks_or_a_registry_that_is_down(
    portal,  # noqa: F811
    images_env,
    settings,
    down,
):
    from images import registry
    from jobs.models import Job
    from ops.embedded import free_port

    if down:
        settings.TRAINYARD_REGISTRY_URL = f"http://127.0.0.1:{free_port()}"
    host = registry.platform_registry()
    form = {"team": "demo", "queue": "train", "spec": "shared", "image": "__reference__",
            "image_reference": f"{host}/upstream/tiny:gone", "command": "python train.py", "timeout_s": "3600",
            "max_retries": "0"}  # fmt: skip
    response = login(portal.demo).post("/jobs/new/", form)
    assert response.status_code == 400
    expected = "registry_unavailable" if down else "image_not_found"
    assert f'<code class="error-code">{expected}</code>' in response.content.decode()
    assert not Job.objects.exists()


def test_the_catalog_says_what_its_scans_stand_on_and_which_digests_are_unresolved(portal, feed):  # noqa: F811
    import html

    client = login(portal.demo)
    body = html.unescape(client.get("/images/").content.decode())
    assert "No vulnerability feed is loaded: no image is shown as passed until one is." in body
    assert body.count('data-role="unresolved"') == 4  # the four seeded external bases: no made-up digest
    services.feed_load(document=feed, source="planted")
    body = html.unescape(client.get("/images/").content.decode())
    assert "Scans match the vulnerability feed:" in body and "from planted, loaded" in body
