"""A build as Kubernetes objects: a ConfigMap with the (digest-pinned) Containerfile and a rootless BuildKit Job,
valid against the Kubernetes schema (strict) for 1.29 and the newest release kubernetes-validate knows."""

import io
import re

import kubernetes_validate
import pytest
import yaml
from django.conf import settings
from django.core.management import call_command

from images import k8s_build, registry, services
from images.tests.test_builds import built, define_base
from quotas.tests.factories import TeamFactory

K8S_VERSIONS = ("1.29", kubernetes_validate.latest_version())


def render(**overrides):
    args = dict(
        build_id=7,
        containerfile="FROM registry.local/trainyard/base/b@sha256:" + "1" * 64 + "\nRUN true\n",
        files={"requirements.txt": "numpy\n"},
        destination="registry.local/trainyard/vision/trainer:b7",
        namespace="trainyard",
        insecure_registry=False,
        timeout_s=3600,
    )
    return k8s_build.render_build_job(**{**args, **overrides})


@pytest.mark.parametrize("insecure", [False, True])
def test_the_build_job_validates_and_runs_rootless(insecure):
    configmap, job = render(insecure_registry=insecure)
    for version in K8S_VERSIONS:
        for obj in (configmap, job):
            kubernetes_validate.validate(obj, version, strict=True)
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["securityContext"]["runAsNonRoot"] and "privileged" not in container["securityContext"]
    assert pod["volumes"][0]["configMap"]["name"] == configmap["metadata"]["name"] == "trainyard-image-build-7"
    output = container["args"][container["args"].index("--output") + 1]
    assert output.startswith("type=image,name=registry.local/trainyard/vision/trainer:b7,push=true")
    assert output.endswith(",registry.insecure=true") == insecure
    assert configmap["data"]["requirements.txt"] == "numpy\n" and job["spec"]["backoffLimit"] == 0


def test_the_push_credential_is_a_secret_of_the_builds_own_mounted_where_buildkit_reads_it():
    configmap, secret, job = render(push_auth='{"auths": {}}')
    for version in K8S_VERSIONS:
        for obj in (configmap, secret, job):
            kubernetes_validate.validate(obj, version, strict=True)
    pod = job["spec"]["template"]["spec"]
    assert secret["metadata"]["name"] == job["metadata"]["name"] and secret["stringData"]["config.json"]
    assert {"name": "push-auth", "secret": {"secretName": secret["metadata"]["name"], "defaultMode": 0o444}} in (
        pod["volumes"]
    )
    mount = {"name": "push-auth", "mountPath": "/home/user/.docker", "readOnly": True}
    assert mount in pod["containers"][0]["volumeMounts"] and pod["automountServiceAccountToken"] is False


PROXY = "http://trainyard-build-proxy.trainyard.svc:3128"


def opts_of(job) -> list[str]:
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    return [args[i + 1] for i, arg in enumerate(args) if arg == "--opt"]


@pytest.mark.parametrize("network", ["none", "allowlist", "outbound"])
def test_the_build_pod_carries_its_network_and_only_allowlist_gets_the_proxy(network):
    """The label picks the pod's NetworkPolicies (k8s/build-network.yaml); with allowlist the RUN steps get the
    build proxy as the Dockerfile frontend's predefined proxy ARGs (no_proxy empty: everything goes there), and
    BuildKit's own pulls go there too, all but its push to the platform registry."""
    configmap, job = render(network=network, proxy_url=PROXY)
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(job, version, strict=True)
    template = job["spec"]["template"]
    assert template["metadata"]["labels"][k8s_build.NETWORK_LABEL] == network
    container = template["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    build_args = [o for o in opts_of(job) if o.startswith("build-arg:")]
    if network == "allowlist":
        assert sorted(build_args) == sorted(
            [f"build-arg:{arg}={PROXY}" for arg in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")]
            + ["build-arg:no_proxy=", "build-arg:NO_PROXY="]
        )
        assert env["HTTP_PROXY"] == env["HTTPS_PROXY"] == PROXY and env["NO_PROXY"] == "registry.local"
        assert container["args"].index("--output") > container["args"].index(build_args[-1])
    else:  # none: DNS and the registry alone; outbound: the internet, without a proxy in between
        assert build_args == [] and PROXY not in str(job) and "HTTPS_PROXY" not in env
    assert opts_of(job)[0] == "filename=Containerfile"


@pytest.mark.parametrize(
    "overrides, said",
    [
        ({"network": "open"}, "the build network must be 'none', 'allowlist' or 'outbound', not 'open'"),
        ({"network": "allowlist"}, "a build with network 'allowlist' needs the build proxy's URL"),
    ],
)
def test_a_build_job_without_a_known_network_is_not_rendered(overrides, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        render(**overrides)


@pytest.mark.django_db
def test_the_platform_renders_its_build_network_setting(images_env, settings):
    build = services.build_request(image=define_base(images_env))
    assert services.build_manifest(build)[-1]["spec"]["template"]["metadata"]["labels"][k8s_build.NETWORK_LABEL] == (
        "none"
    )
    settings.TRAINYARD_BUILD_NETWORK = "allowlist"
    settings.TRAINYARD_K8S_BUILD_PROXY_URL = "http://proxy.example:3128"
    *_, job = services.build_manifest(build)
    assert job["spec"]["template"]["metadata"]["labels"][k8s_build.NETWORK_LABEL] == "allowlist"
    assert "build-arg:https_proxy=http://proxy.example:3128" in opts_of(job)
    env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["NO_PROXY"] == registry.platform_registry().rsplit(":", 1)[0]


@pytest.mark.django_db
def test_the_manifest_command_prints_a_project_build_pinned_to_its_base(images_env):
    base = built(define_base(images_env))
    assert base.status == "succeeded", base.log
    image = services.project_image_define(
        team=TeamFactory(slug="vision"), name="trainer", base="tiny-base", containerfile="FROM tiny-base\nRUN true\n"
    )
    build = services.build_request(image=image)
    out = io.StringIO()
    call_command("image_build_manifest", str(build.pk), stdout=out)
    configmap, *secrets, job = list(yaml.safe_load_all(out.getvalue()))
    if settings.TRAINYARD_REGISTRY_TOKEN_KEY:  # the build's push credential, mounted where BuildKit reads it
        assert [s["kind"] for s in secrets] == ["Secret"] and "build." in secrets[0]["stringData"]["config.json"]
    else:  # the platform's shared credential never goes into a build pod
        assert secrets == []
    assert configmap["data"]["Containerfile"].startswith(f"FROM {base.reference.rsplit(':', 1)[0]}@{base.digest}")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"/trainyard/vision/trainer:b{build.pk},push=true,registry.insecure=true" in args[-1]
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(job, version, strict=True)


# ----------------------------------------------------------------------------- builds on the cluster
# A build's run, failure and clean-up on the real control plane: tests/k8s. Here, on the fake API server, only what
# needs its request log or a Job completed at will: a create that met 409 is adopted, and a finished Job waits for a
# registry that is down. What BuildKit would push is pushed with podman (the session's tiny upstream image).


@pytest.fixture
def cluster(settings, images_env):
    from tests.fake_k8s import FakeKubernetes, crds

    crds.require()
    with FakeKubernetes() as kube:
        kube.create("namespaces", {"metadata": {"name": "builds"}})
        settings.TRAINYARD_IMAGE_BUILDER = "kubernetes"
        settings.TRAINYARD_K8S_API_URL = kube.url
        settings.TRAINYARD_K8S_BUILD_NAMESPACE = "builds"
        yield kube
        assert kube.internal_errors == []


def push_as_buildkit(build_root, build, cluster=None) -> str:
    """What the Job's BuildKit would have pushed, with the credential of the build's Secret (the platform's own
    where no token service is configured, or with no `cluster` to read the Secret from: the real-cluster test
    pushes before the platform makes the Job and its Secret): an image under the build's tag; its digest."""
    import base64

    from images.tests.conftest import auth_args, podman

    destination = f"{registry.platform_registry()}/{services.repository_of(build.image)}:b{build.pk}"
    digestfile = build_root / f"digest-{build.pk}"
    auth = auth_args(build_root, registry.platform_registry())
    secret = cluster.try_get("secrets", job_name(build), "builds") if cluster is not None else None
    assert cluster is None or (secret is not None) == bool(settings.TRAINYARD_REGISTRY_TOKEN_KEY)
    if secret is not None:
        data = secret.get("stringData") or {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
        authfile = build_root / f"push-{build.pk}.json"
        authfile.write_text(data["config.json"])
        auth = ["--authfile", str(authfile)]
    pushed = podman(
        build_root, "push", "--tls-verify=false", *auth, "--digestfile", str(digestfile), "localhost/upstream-tiny",
        destination,
    )  # fmt: skip
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    return digestfile.read_text().strip()


def job_name(build) -> str:
    return k8s_build.build_name(build.pk)


@pytest.mark.django_db
def test_a_job_created_before_is_adopted_and_another_builds_is_refused(cluster, images_env):
    base = define_base(images_env)
    build = services.build_request(image=base)
    # A try whose create went through but whose answer was lost: the objects are there already.
    for obj in services.build_manifest(build):
        cluster.create({"ConfigMap": "configmaps", "Secret": "secrets"}.get(obj["kind"], "batch/v1/jobs"), obj)
    build = services.build_run(build_id=build.pk)
    assert build.status == "running" and "adopted the existing build Job" in build.log
    assert len(cluster.list("batch/v1/jobs", "builds")) == 1
    # A create that meets 409 AlreadyExists (the Job appeared between the look and the create) adopts it too.
    jobs = k8s_build.BuildJobs.from_settings()
    assert jobs.create(build.pk, services.build_manifest(build)) is False
    assert [r.status for r in cluster.requests_matching("POST", "/apis/batch/v1/namespaces/builds/jobs")] == [409]
    jobs.close()
    # An object of the same name made for another build (another platform sharing the namespace) is not adopted.
    other = services.build_request(image=define_base(images_env, name="other-base"))
    *_, job = services.build_manifest(other)
    job["metadata"]["labels"]["trainyard.io/image-build"] = "999"
    cluster.create("batch/v1/jobs", job)
    other = services.build_run(build_id=other.pk)
    assert other.status == "failed" and "belongs to image build 999" in other.log


@pytest.mark.django_db
def test_a_finished_job_waits_for_a_registry_that_is_down(cluster, images_env, build_root, settings):
    from ops.embedded import free_port

    base = define_base(images_env)
    build = services.build_request(image=base)
    cluster.controller.script("trainyard-image-build-", logs="#6 pushing layers done")
    build = services.build_run(build_id=build.pk)
    digest = push_as_buildkit(build_root, build, cluster)
    cluster.controller.tick(3)
    good = settings.TRAINYARD_REGISTRY_URL
    settings.TRAINYARD_REGISTRY_URL = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(services.RegistryWaiting):
        services.build_run(build_id=build.pk)
    build.refresh_from_db()
    assert build.status == "waiting_registry" and "registry unreachable" in build.log
    assert cluster.try_get("batch/v1/jobs", job_name(build), "builds") is not None  # kept until it is recorded
    settings.TRAINYARD_REGISTRY_URL = good
    build = services.build_run(build_id=build.pk)
    assert build.status == "succeeded" and build.digest == digest
    assert build.log.count("#6 pushing layers done") == 1


@pytest.mark.django_db
def test_without_the_token_service_no_credential_goes_into_the_build_pod(images_env, settings):
    """Shared mode (an external registry): the only credential is the platform's, which reaches every team's images;
    it stays out of the BuildKit pod, whose RUN steps could likely read it."""
    settings.TRAINYARD_REGISTRY_TOKEN_KEY = ""
    settings.TRAINYARD_REGISTRY_USERNAME, settings.TRAINYARD_REGISTRY_PASSWORD = "platform", "shared-secret"
    build = services.build_request(image=define_base(images_env))
    objects = services.build_manifest(build)
    assert [o["kind"] for o in objects] == ["ConfigMap", "Job"] and "shared-secret" not in str(objects)
