"""A build as Kubernetes objects: a ConfigMap with the (digest-pinned) Containerfile and a rootless BuildKit Job,
valid against the Kubernetes schema (strict) for 1.29 and the newest release kubernetes-validate knows."""

import io

import kubernetes_validate
import pytest
import yaml
from django.core.management import call_command

from images import k8s_build, services
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


@pytest.mark.django_db
def test_the_manifest_command_prints_a_project_build_pinned_to_its_base(images_env):
    base = built(define_base(images_env))
    image = services.project_image_define(
        team=TeamFactory(slug="vision"), name="trainer", base="tiny-base", containerfile="FROM tiny-base\nRUN true\n"
    )
    build = services.build_request(image=image)
    out = io.StringIO()
    call_command("image_build_manifest", str(build.pk), stdout=out)
    configmap, job = list(yaml.safe_load_all(out.getvalue()))
    assert configmap["data"]["Containerfile"].startswith(f"FROM {base.reference.rsplit(':', 1)[0]}@{base.digest}")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"/trainyard/vision/trainer:b{build.pk},push=true,registry.insecure=true" in args[-1]
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(job, version, strict=True)
