"""Digests always, and the scan gate: a submitted tag is pinned to its digest in the registry; a missing tag is a
400, a registry that is down a 503; a tag moved after submission does not change what the job runs; a queue's
policy refuses an image with a finding over its severity unless an unexpired exception covers it."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from images import registry, services
from images.models import ImageBuild, ScanException, ScanPolicy
from images.tests.conftest import auth_args, podman
from jobs.lifecycle import describe_attempt
from jobs.models import Job
from ops.seed import seed
from quotas.models import Queue, Team

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(settings, images_env):
    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_LOCAL_GPUS = "4x24GiB"
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    client = APIClient()
    client.force_authenticate(get_user_model().objects.get(username="demo"))
    return client


def body(image):
    return {"team": "demo", "queue": "train", "spec": "shared", "image": image, "command": ["python", "train.py"]}


def push_tag(build_root, tmp_path, reference: str, marker: str) -> str:
    """Push a fresh one-file image to `reference` (moving the tag if it exists); its digest."""
    context = tmp_path / marker
    context.mkdir()
    (context / "marker").write_text(marker)
    (context / "Containerfile").write_text("FROM scratch\nCOPY marker /marker\n")
    assert (
        podman(build_root, "build", "--isolation", "chroot", "-t", f"localhost/{marker}", str(context)).returncode == 0
    )
    digestfile = tmp_path / f"{marker}.digest"
    auth = auth_args(tmp_path, registry.platform_registry())
    pushed = podman(
        build_root, "push", "--tls-verify=false", *auth, "--digestfile", str(digestfile), f"localhost/{marker}",
        reference,
    )  # fmt: skip
    assert pushed.returncode == 0, pushed.stderr
    return digestfile.read_text().strip()


def test_a_tag_is_pinned_at_submission_and_a_moved_tag_does_not_change_what_runs(world, build_root, tmp_path):
    from jobs.store import dispatch

    reference = f"{registry.platform_registry()}/team/trainer:stable"
    first = push_tag(build_root, tmp_path, reference, "first")
    response = world.post("/api/v1/jobs/", body(reference), format="json")
    assert response.status_code == 201, response.json()
    job = response.json()
    assert job["image_digest"] == first and job["image_reference"] == reference.rsplit(":", 1)[0] + ":stable"

    second = push_tag(build_root, tmp_path, reference, "second")  # the tag moves before the job starts
    assert second != first and registry.resolve(reference) == second
    dispatch()
    attempt = Job.objects.get(pk=job["id"]).attempts.get()
    assert describe_attempt(attempt).image == f"{reference}@{first}"
    with registry.Client(registry.endpoint_for(registry.platform_registry())) as client:
        assert client.manifest("team/trainer", first)[1]["layers"]  # the pinned digest is still pullable

    again = world.post("/api/v1/jobs/", body(reference), format="json").json()
    assert again["image_digest"] == second  # a new submission pins what the tag names now
    reproduced = world.post(f"/api/v1/jobs/{job['id']}/reproduce/", format="json")
    assert reproduced.status_code == 201 and reproduced.json()["image_digest"] == first


def test_a_missing_tag_or_repository_is_a_400_with_a_code(world):
    host = registry.platform_registry()
    for image in (f"{host}/upstream/tiny:no-such-tag", f"{host}/nobody/nothing:1"):
        response = world.post("/api/v1/jobs/", body(image), format="json")
        assert response.status_code == 400
        assert response.json()["code"] == "image_not_found" and "image" in response.json()["fields"]


def test_a_registry_that_is_down_at_submission_is_a_503(world, settings):
    from ops.embedded import free_port

    settings.TRAINYARD_REGISTRY_URL = f"http://127.0.0.1:{free_port()}"
    response = world.post("/api/v1/jobs/", body(f"{registry.platform_registry()}/upstream/tiny:1"), format="json")
    assert response.status_code == 503 and response.json()["code"] == "registry_unavailable"
    assert int(response["Retry-After"]) >= 1  # every 503 says when to come back
    assert not Job.objects.exists()
    # With other errors, sending it again cannot help: a 400 with every problem, the registry's among them.
    bad = {**body(f"{registry.platform_registry()}/upstream/tiny:1"), "command": [], "env": {"1BAD": "x"}}
    response = world.post("/api/v1/jobs/", bad, format="json")
    assert response.status_code == 400, response.json()
    codes = {field: [e["code"] for e in errors] for field, errors in response.json()["fields"].items()}
    assert codes == {"image": ["registry_unavailable"], "env": ["invalid_env_name"], "command": ["empty_command"]}
    assert "Retry-After" not in response and not Job.objects.exists()


def test_a_catalog_image_runs_its_built_digest_and_an_unbuilt_one_is_refused(world, images_env):
    from images.tests.test_builds import built, define_base

    base = define_base(images_env, "tiny-base")
    assert world.post("/api/v1/jobs/", body("tiny-base"), format="json").json()["code"] == "image_not_built"
    build = built(base)
    job = world.post("/api/v1/jobs/", body("tiny-base"), format="json").json()
    assert job["image_digest"] == build.digest and Job.objects.get(pk=job["id"]).base_image == base


def test_the_queue_policy_refuses_a_critical_finding_until_an_exception_covers_it(world, images_env, feed):
    from images.tests.test_builds import built, define_base

    services.feed_load(document=feed, source="planted")
    base = define_base(images_env, "tiny-base")
    build = built(base)
    assert build.findings.filter(severity="critical").exists()
    train = Queue.objects.get(name="train")
    policy = ScanPolicy.objects.create(queue=train, max_severity="high")

    refused = world.post("/api/v1/jobs/", body("tiny-base"), format="json")
    assert refused.status_code == 400
    assert refused.json()["code"] == "image_vulnerable" and "GHSA-8q59-q68h-6hv4" in refused.json()["detail"]
    assert refused.json()["findings"] == ["GHSA-8q59-q68h-6hv4"]  # the medium one is within the policy

    admin = get_user_model().objects.get(username="admin")
    expired = ScanException.objects.create(
        policy=policy, vuln_id="GHSA-8q59-q68h-6hv4", reason="old", created_by=admin,
        expires_at=timezone.now() - timedelta(minutes=1),
    )  # fmt: skip
    assert world.post("/api/v1/jobs/", body("tiny-base"), format="json").status_code == 400
    services.scan_exception_grant(
        policy=policy, vuln_id=expired.vuln_id, reason="no full_load calls; fix next week", user=admin,
        expires_at=timezone.now() + timedelta(days=7),
    )  # fmt: skip
    assert world.post("/api/v1/jobs/", body("tiny-base"), format="json").status_code == 201
    ScanPolicy.objects.filter(pk=policy.pk).update(max_severity="low")  # the medium finding now counts too
    refused = world.post("/api/v1/jobs/", body("tiny-base"), format="json").json()
    assert refused["code"] == "image_vulnerable" and refused["findings"] == ["DSA-TEST-0001"]


def test_a_policy_that_wants_scans_refuses_an_image_the_platform_never_scanned(world):
    ScanPolicy.objects.create(queue=Queue.objects.get(name="train"), max_severity="critical", require_scan=True)
    response = world.post("/api/v1/jobs/", body(f"{registry.platform_registry()}/upstream/tiny:1"), format="json")
    assert response.status_code == 400 and response.json()["code"] == "image_not_scanned"
    assert not ImageBuild.objects.exists() and Team.objects.filter(slug="demo").exists()


def test_another_teams_project_image_is_refused_by_its_path_and_the_shared_bases_stay_open(world, build_root, tmp_path):
    """Team alpha's private image, really pushed to the platform's registry: demo naming its (guessable)
    reference gets a 400 that says nothing of whether it exists; alpha runs it; trainyard/base/… is everyone's."""
    from quotas.tests.factories import MembershipFactory, TeamFactory, UserFactory

    host = registry.platform_registry()
    alpha_image = f"{host}/trainyard/alpha/secret-model:1"
    push_tag(build_root, tmp_path, alpha_image, "alpha-private")
    shared = f"{host}/trainyard/base/tiny:1"
    push_tag(build_root, tmp_path, shared, "shared-base")
    alpha = TeamFactory(slug="alpha", name="Alpha")
    for queue in Queue.objects.all():
        queue.teams.add(alpha)
    alice = UserFactory(username="alice")
    MembershipFactory(team=alpha, user=alice)

    for image in (alpha_image, f"{host}/trainyard/alpha/no-such-image:1", f"{host}/trainyard/ALPHA/secret-model:1"):
        refused = world.post("/api/v1/jobs/", body(image), format="json")
        assert refused.status_code == 400, refused.json()
        assert refused.json()["code"] == "image_of_another_team" and "image" in refused.json()["fields"]
    assert not Job.objects.exists()

    own = APIClient()
    own.force_authenticate(alice)
    ran = own.post("/api/v1/jobs/", {**body(alpha_image), "team": "alpha"}, format="json")
    assert ran.status_code == 201, ran.json()
    assert world.post("/api/v1/jobs/", body(shared), format="json").status_code == 201
