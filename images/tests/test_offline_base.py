"""The offline base `python-local`: made with the real podman from this machine's Debian Python, numpy and shell
(FROM scratch: nothing is pulled, the build has no network), pushed to the session's real registry and resolved in
the catalog; found again by its inputs on a later start; a project image built on it, pushed and scanned; a local
job naming it runs."""

import subprocess
import time

import pytest
from rest_framework.test import APIClient

from images import host_rootfs, registry, services
from images.models import BaseImage, ImageBuild
from quotas.tests.factories import MembershipFactory, TeamFactory, UserFactory

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def dpkg_version(package: str) -> str:
    out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True)
    return out.stdout.strip()


def test_the_offline_base_is_built_here_resolved_and_found_again_by_its_inputs(offline_base):
    import numpy

    outcome, base = offline_base
    build = base.builds.get(status=ImageBuild.Status.SUCCEEDED)
    if outcome == "built":  # the session's first: podman really built it (a later test finds it in the registry)
        assert "assembled rootfs/ from this machine's files" in build.log, build.log
        assert "podman pull" not in build.log  # FROM scratch: nothing to pull, nothing fetched
        assert "network none" in build.log or not build.log.count("(as ")  # the jail's network, when it has one
    assert build.containerfile.startswith("# Assembled") and "FROM scratch\n" in build.containerfile
    assert f"LABEL {services.INPUTS_LABEL}=" in build.containerfile
    # Resolved: the catalog names the digest its registry holds under that reference.
    assert base.digest.startswith("sha256:") and base.rootfs == "host" and base.containerfile
    assert registry.resolve(base.reference) == base.digest == build.digest
    assert base.framework == "numpy" and base.framework_version == numpy.__version__
    # The SBOM is what the image holds: Debian's Python at this machine's version, and the numpy copied in.
    python_package = next(p["name"] for p in build.sbom if p["name"].startswith("python3.") and "minimal" in p["name"])
    assert {"type": "deb", "name": python_package, "version": dpkg_version(python_package)} in build.sbom
    assert {"type": "deb", "name": "libc6", "version": dpkg_version("libc6")} in build.sbom
    assert {"type": "pypi", "name": "numpy", "version": numpy.__version__} in build.sbom
    assert build.scanned_at is not None and base.scan_status == "unscanned"  # no feed loaded: proves nothing
    assert 5 * 2**20 < build.size_bytes < 80 * 2**20, build.size_bytes  # compressed, as the registry holds it

    # A second start with the same inputs: one registry lookup, no build.
    started = time.monotonic()
    assert services.offline_base_ensure()[0] == "reused"
    assert time.monotonic() - started < 10
    assert base.builds.count() == 1

    # A fresh catalog on a registry that still holds it (a reset database): read back and scanned, not built.
    BaseImage.objects.filter(pk=base.pk).update(digest="", reference="")
    ImageBuild.objects.filter(base_image=base).delete()
    outcome, sentence = services.offline_base_ensure()
    assert outcome == "adopted", sentence
    base.refresh_from_db()
    adopted = base.builds.get()
    assert base.digest == build.digest and "read back, not built" in adopted.log
    assert adopted.sbom == build.sbom and adopted.trigger == "setup"

    # The catalog shows it resolved, and the API names its digest.
    member = UserFactory(username="ana")
    MembershipFactory(team=TeamFactory(slug="vision"), user=member)
    client = APIClient()
    client.force_authenticate(member)
    answer = client.get("/api/v1/images/").json()
    listed = {i["name"]: i for i in (answer["results"] if isinstance(answer, dict) else answer)}
    assert listed["python-local"]["digest"] == base.digest and listed["python-local"]["built_by_platform"]
    from django.test import Client

    browser = Client()
    browser.force_login(member)
    row = next(r for r in browser.get("/images/").content.decode().split("<tr") if ">python-local<" in r)
    assert 'data-role="offline-base"' in row and 'data-role="unresolved"' not in row


def test_other_inputs_are_another_image(offline_base, monkeypatch):
    _, base = offline_base
    layout = host_rootfs.plan()
    key = services.inputs_key(base, layout)
    assert key == services.inputs_key(base, host_rootfs.plan())  # the same machine, the same key
    monkeypatch.setattr(host_rootfs, "RECIPE_VERSION", "test-other")
    assert services.inputs_key(base, host_rootfs.plan()) != key
    base.containerfile += "ENV EXTRA=1\n"
    assert services.inputs_key(base, layout) != key


def test_a_project_image_on_the_offline_base_builds_pushes_and_is_scanned(offline_base):
    _, base = offline_base
    team = TeamFactory(slug="vision")
    image = services.project_image_define(
        team=team,
        name="trainer",
        base="python-local",
        containerfile=(
            "FROM python-local\n"
            # Runs the image's own Python and numpy at build time: a rootfs that cannot run them fails here.
            "RUN python3 -c \"import numpy; open('/numpy-version', 'w').write(numpy.__version__)\"\n"
            "RUN test -s /numpy-version && ls /usr/local/lib/python3*/dist-packages\n"
        ),
    )
    advisory = {
        "id": "OSV-TEST-PYTHON",
        "affected": [{"package": {"ecosystem": "Debian:12", "name": "libpython3.11-stdlib"}, "ranges": [
            {"type": "ECOSYSTEM", "events": [{"introduced": "0"}]}]}],
        "database_specific": {"severity": "HIGH"},
    }  # fmt: skip
    services.feed_load(document=[advisory], source="planted: every libpython3.11-stdlib")
    build = services.build_run(build_id=services.build_request(image=image).pk)
    assert build.status == "succeeded", build.log
    image.refresh_from_db()
    assert build.base_digest == base.digest and f"@{base.digest}" in build.containerfile.splitlines()[0]
    assert image.reference.endswith("/trainyard/vision/trainer:latest") and registry.resolve(image.reference) == (
        image.digest
    )
    assert len(build.layers) == len(base.builds.first().layers) + 2
    # The scan ran against what the image holds: the Debian package it inherited from the base is found.
    if any(p["name"] == "libpython3.11-stdlib" for p in build.sbom):
        assert {(f.vuln_id, f.package) for f in build.findings.all()} == {("OSV-TEST-PYTHON", "libpython3.11-stdlib")}
        assert image.scan_status == "failed"
    else:
        pytest.skip("this machine's Python is not Debian's 3.11: the planted advisory names another package")


def test_the_built_image_runs_its_own_python_and_numpy(offline_base, build_root):
    """Not the platform's path (the local backend runs on the host, see the job test): the image itself, run by
    podman, is a working Python with numpy."""
    _, base = offline_base
    from images.services import podman_command

    def podman(*args):
        return subprocess.run(podman_command(build_root, *args), capture_output=True, text=True, timeout=180)

    pinned = base.pinned_reference
    from images.tests.conftest import auth_args

    host = pinned.split("/", 1)[0]
    pulled = podman("pull", "--tls-verify=false", "--quiet", *auth_args(build_root, host), pinned)
    assert pulled.returncode == 0, pulled.stderr
    script = "import numpy, sys; print(sys.version_info[:2], numpy.__version__, int(numpy.arange(4).sum()))"
    ran = podman("run", "--rm", "--network=none", pinned, "python3", "-c", script)
    if ran.returncode != 0 and ("cgroup" in ran.stderr or "namespace" in ran.stderr or "OCI" in ran.stderr):
        pytest.skip(f"podman cannot run containers on this machine: {ran.stderr.strip()[-200:]}")
    import numpy

    assert ran.returncode == 0, ran.stderr
    assert f"{numpy.__version__} 6" in ran.stdout


def test_off_means_neither_built_nor_looked_for(settings, registry_url):
    settings.TRAINYARD_REGISTRY_URL = registry_url
    settings.TRAINYARD_OFFLINE_BASE = False
    assert services.offline_base_ensure() == ("skipped", "TRAINYARD_OFFLINE_BASE is off")
    assert not BaseImage.objects.filter(name="python-local").exists()
