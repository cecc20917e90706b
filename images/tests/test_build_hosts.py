"""The admin's allow-list of hosts a build may reach (TRAINYARD_BUILD_ALLOWED_HOSTS): a base image's FROM on
another registry and an ADD <url> must name an allowed host:port or the platform's own registry; anything else is
refused with a stable code, when the image is defined and again when it is built."""

import pytest

from images import services
from images.tests.test_builds import built, define_base
from kernel.errors import ValidationFailed
from quotas.tests.factories import TeamFactory

pytestmark = pytest.mark.django_db


def define(containerfile: str, name: str = "hosted"):
    return services.base_image_define(
        name=name, containerfile=containerfile, cuda_version="12.4", framework="none", min_driver_version="550.54"
    )


@pytest.mark.parametrize(
    "containerfile, needs",
    [
        ("FROM ubuntu:24.04\n", "registry-1.docker.io:443"),  # no host written: Docker Hub
        ("FROM docker.io/library/ubuntu:24.04\n", "registry-1.docker.io:443"),
        ("FROM nvcr.io/nvidia/pytorch:24.10-py3\n", "nvcr.io:443"),
        ("FROM mirror.example:5000/debian:12\n", "mirror.example:5000"),
        ("FROM scratch\nADD https://Mirror.example/pkgs/x.tar.gz /x\n", "mirror.example:443"),
        ("FROM scratch\nADD --chmod=644 http://mirror.example:8080/x.tar.gz /x\n", "mirror.example:8080"),
    ],
)
def test_a_base_reaches_only_allowed_hosts(settings, containerfile, needs):
    settings.TRAINYARD_BUILD_ALLOWED_HOSTS = []
    with pytest.raises(ValidationFailed) as err:
        define(containerfile)
    assert err.value.code == "build_host_not_allowed" and needs in err.value.detail
    host, port = needs.rsplit(":", 1)
    settings.TRAINYARD_BUILD_ALLOWED_HOSTS = [f"{host}:{int(port) + 1}"]  # the same host on another port is not it
    with pytest.raises(ValidationFailed):
        define(containerfile)
    settings.TRAINYARD_BUILD_ALLOWED_HOSTS = [needs]
    assert define(containerfile).containerfile == containerfile


def test_the_platforms_registry_is_always_allowed_and_a_shrunk_list_fails_the_build(images_env, settings):
    settings.TRAINYARD_BUILD_ALLOWED_HOSTS = []
    base = define_base(images_env)  # FROM <platform registry>/upstream/tiny:1
    assert built(base).status == "succeeded"
    settings.TRAINYARD_BUILD_ALLOWED_HOSTS = ["mirror.example:443"]
    outside = define("FROM scratch\nADD https://mirror.example/x.tar.gz /x\n", name="outside")
    settings.TRAINYARD_BUILD_ALLOWED_HOSTS = []  # the admin took the mirror off the list since
    build = built(outside)
    assert build.status == "failed" and "mirror.example:443 is not one of them" in build.log
    assert "podman" not in build.log  # refused before anything ran


def test_a_project_image_adds_from_an_allowed_mirror_only(images_env, settings):
    settings.TRAINYARD_BUILD_ALLOWED_HOSTS = ["mirror.example:443"]
    built(define_base(images_env))
    team = TeamFactory(slug="hosts")
    for url in ("https://elsewhere.example/w.bin", "http://mirror.example/w.bin", "http://127.0.0.1:8000/x"):
        with pytest.raises(ValidationFailed) as err:
            services.project_image_define(team=team, name="adds", base="tiny-base",
                                          containerfile=f"FROM tiny-base\nADD {url} /w.bin\n")  # fmt: skip
        assert err.value.code == "add_url_not_allowed" and "TRAINYARD_BUILD_ALLOWED_HOSTS" in err.value.detail
    image = services.project_image_define(
        team=team, name="adds", base="tiny-base", containerfile="FROM tiny-base\nADD https://mirror.example/w.bin /w\n"
    )
    assert image.containerfile.endswith("/w\n")
