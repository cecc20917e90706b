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
# A build's run, adoption, failure, wait for a registry that is down and clean-up are tested on the real control plane
# (tests/k8s). What BuildKit would push is pushed there with podman (the session's tiny upstream image).


def push_as_buildkit(build_root, build) -> str:
    """What the Job's BuildKit would have pushed, with the platform's credential (the tests push before the
    platform makes the Job and its Secret: no container runs on kwok): an image under the build's tag; its digest."""
    from images.tests.conftest import auth_args, podman

    destination = f"{registry.platform_registry()}/{services.repository_of(build.image)}:b{build.pk}"
    digestfile = build_root / f"digest-{build.pk}"
    auth = auth_args(build_root, registry.platform_registry())
    pushed = podman(
        build_root, "push", "--tls-verify=false", *auth, "--digestfile", str(digestfile), "localhost/upstream-tiny",
        destination,
    )  # fmt: skip
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    return digestfile.read_text().strip()


@pytest.mark.django_db
def test_without_the_token_service_no_credential_goes_into_the_build_pod(images_env, settings):
    """Shared mode (an external registry): the only credential is the platform's, which reaches every team's images;
    it stays out of the BuildKit pod, whose RUN steps could likely read it."""
    settings.TRAINYARD_REGISTRY_TOKEN_KEY = ""
    settings.TRAINYARD_REGISTRY_USERNAME, settings.TRAINYARD_REGISTRY_PASSWORD = "platform", "shared-secret"
    build = services.build_request(image=define_base(images_env))
    objects = services.build_manifest(build)
    assert [o["kind"] for o in objects] == ["ConfigMap", "Job"] and "shared-secret" not in str(objects)
