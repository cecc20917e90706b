# ruff: noqa: F811 - the seeded platform's fixture is imported from test_submission and used as an argument
"""The `runs_as_root` finding and its queue gate, on real images: podman builds one image whose config says
`USER 1000` and one that names no USER, pushes both to the session's registry; the platform reads each config
from the registry (a build's record, or at submission for an image it did not build) and a queue whose scan
policy refuses root turns the second away with 400 `image_runs_as_root`."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from images import registry, scan, services
from images.models import ScanPolicy
from images.tests.conftest import auth_args, podman
from images.tests.test_builds import built, define_base
from images.tests.test_submission import body, world  # noqa: F401 - the same seeded platform and request
from jobs.models import Job
from quotas.models import Queue

pytestmark = pytest.mark.django_db


def push(build_root, tmp_path, reference: str, containerfile: str) -> str:
    """Build `containerfile` with podman (on the session's tiny upstream) and push it to `reference`; its digest."""
    name = reference.rsplit("/", 1)[-1].replace(":", "-")
    context = tmp_path / name
    context.mkdir()
    (context / "Containerfile").write_text(containerfile)
    auth = auth_args(tmp_path, reference.split("/", 1)[0])  # the session's registry wants its password
    made = podman(build_root, "build", "--isolation", "chroot", "--tls-verify=false", *auth, "-t",
                  f"localhost/{name}", str(context))  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    digestfile = tmp_path / f"{name}.digest"
    pushed = podman(
        build_root, "push", "--tls-verify=false", *auth, "--digestfile", str(digestfile), f"localhost/{name}", reference
    )
    assert pushed.returncode == 0, pushed.stderr
    return digestfile.read_text().strip()


@pytest.mark.parametrize(
    "user, root",
    [("", True), ("root", True), ("0", True), ("0:1000", True), ("root:users", True), (" 0 ", True),
     ("1000", False), ("1000:0", False), ("nobody", False), ("rootless", False)],
)  # fmt: skip
def test_which_config_users_start_as_root(user, root):
    assert scan.runs_as_root(user) is root


def test_a_build_records_its_configs_user_and_a_root_one_is_a_finding_on_the_page_and_api(world, images_env):
    as_root = built(define_base(images_env, "root-base"))
    as_user = built(define_base(images_env, "user-base", extra="\nUSER 1000"))
    assert as_root.status == as_user.status == "succeeded", as_root.log + as_user.log
    assert (as_root.config_user, as_root.runs_as_root) == ("", True)
    assert (as_user.config_user, as_user.runs_as_root) == ("1000", False)
    assert [w["code"] for w in as_root.warnings] == ["runs_as_root"] and "no USER" in as_root.warnings[0]["detail"]
    assert as_user.warnings == []

    api = world.get(f"/api/v1/image-builds/{as_root.pk}/").json()
    assert api["runs_as_root"] is True and api["config_user"] == "" and api["warnings"][0]["code"] == "runs_as_root"
    listed = {b["id"]: b for b in world.get("/api/v1/image-builds/").json()}
    assert listed[as_user.pk]["runs_as_root"] is False and listed[as_user.pk]["config_user"] == "1000"
    image = world.get("/api/v1/images/root-base/").json()
    assert image["last_build"]["runs_as_root"] is True

    portal = Client()
    portal.force_login(get_user_model().objects.get(username="demo"))
    page = portal.get(f"/images/builds/{as_root.pk}/").content.decode()
    assert "runs_as_root" in page and 'data-role="config-user"><span class="bad-text">root</span>' in page
    page = portal.get(f"/images/builds/{as_user.pk}/").content.decode()
    assert 'data-role="config-user">USER 1000</dd>' in page and "runs_as_root" not in page
    assert "runs_as_root" in portal.get("/images/").content.decode()


def test_a_queue_that_refuses_root_turns_away_a_root_image_and_takes_a_user_one(world, images_env):
    built(define_base(images_env, "root-base"))
    built(define_base(images_env, "user-base", extra="\nUSER 1000"))
    train = Queue.objects.get(name="train")
    policy = ScanPolicy.objects.create(queue=train, max_severity="critical")
    assert not policy.refuse_root  # off by default: a root image runs
    assert world.post("/api/v1/jobs/", body("root-base"), format="json").status_code == 201
    assert world.get("/api/v1/scan-policies/train/").json()["refuse_root"] is False

    ScanPolicy.objects.filter(pk=policy.pk).update(refuse_root=True)
    refused = world.post("/api/v1/jobs/", body("root-base"), format="json")
    assert refused.status_code == 400, refused.json()
    answer = refused.json()
    assert answer["code"] == "image_runs_as_root" and answer["findings"] == ["runs_as_root"]
    assert "train" in answer["detail"] and "no USER" in answer["detail"] and "image" in answer["fields"]
    assert world.post("/api/v1/jobs/", body("user-base"), format="json").status_code == 201
    assert Job.objects.filter(base_image__name="root-base").count() == 1  # only the one before the policy changed


def test_an_image_the_platform_did_not_build_is_judged_by_its_config_in_the_registry(
    world, images_env, build_root, tmp_path, settings
):
    host = registry.platform_registry()
    upstream = images_env["reference"]
    root_ref = f"{host}/demo/as-root:1"
    user_ref = f"{host}/demo/as-user:1"
    named_root = f"{host}/demo/named-root:1"
    root_digest = push(build_root, tmp_path, root_ref, f"FROM {upstream}\nRUN echo root > /marker\n")
    push(build_root, tmp_path, user_ref, f"FROM {upstream}\nRUN echo user > /marker\nUSER 1000:1000\n")
    push(build_root, tmp_path, named_root, f"FROM {upstream}\nUSER root\n")
    with registry.Client(settings.TRAINYARD_REGISTRY_URL) as client:  # what podman wrote is what the platform reads
        assert scan.config_user(client.image_config("demo/as-user", registry.resolve(user_ref))) == "1000:1000"
    assert services.image_user(reference=root_ref.rsplit(":", 1)[0], digest=root_digest) == ""

    ScanPolicy.objects.create(queue=Queue.objects.get(name="train"), max_severity="critical", refuse_root=True)
    pinned = f"{root_ref.rsplit(':', 1)[0]}@{root_digest}"
    for image, said in ((root_ref, "no USER"), (named_root, "USER root"), (pinned, "no USER")):
        refused = world.post("/api/v1/jobs/", body(image), format="json")
        assert refused.status_code == 400 and refused.json()["code"] == "image_runs_as_root", refused.json()
        assert said in refused.json()["detail"]
    accepted = world.post("/api/v1/jobs/", body(user_ref), format="json")
    assert accepted.status_code == 201, accepted.json()
    # Other queues keep their own policy: debug has none.
    debug = world.post("/api/v1/jobs/", {**body(root_ref), "queue": "debug"}, format="json")
    assert debug.status_code == 201, debug.json()


def test_a_registry_that_is_down_when_the_config_is_read_is_a_503(world, images_env, build_root, tmp_path, settings):
    from ops.embedded import free_port

    host = registry.platform_registry()
    reference = f"{host}/demo/as-root:1"
    digest = push(build_root, tmp_path, reference, f"FROM {images_env['reference']}\nRUN true\n")
    ScanPolicy.objects.create(queue=Queue.objects.get(name="train"), max_severity="critical", refuse_root=True)
    settings.TRAINYARD_REGISTRY_URL = f"http://127.0.0.1:{free_port()}"
    pinned = f"{reference.rsplit(':', 1)[0]}@{digest}".replace(host, registry.platform_registry())
    response = world.post("/api/v1/jobs/", body(pinned), format="json")
    assert response.status_code == 503 and response.json()["code"] == "registry_unavailable", response.json()
    assert not Job.objects.exists()
