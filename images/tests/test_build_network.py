"""A real build with TRAINYARD_BUILD_NETWORK=allowlist, through the platform's build path: its RUN steps fetch from
the allowed mirror (a test host in a namespace of its own, not loopback) through the platform's proxy, and fail to
reach a host off the list, the mirror itself without the proxy, and the platform's own registry and object store
(on this machine's loopback), also by an allowed name that points there."""

import os
import shutil
from urllib.parse import urlparse

import pytest

from images import services
from images.tests.test_builds import _escape_upstream, built, image_files
from quotas.tests.factories import TeamFactory

pytestmark = pytest.mark.django_db


def test_allowlist_run_steps_reach_the_allowed_mirror_and_nothing_else(
    images_env, settings, tmp_path, registry_url, build_root, mirror
):
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("builds are isolated only when the platform runs as root: run the suite as root")
        pytest.skip("builds are isolated when the platform runs as root")
    if shutil.which("curl") is None or shutil.which("perl") is None:
        pytest.fail("the probe image needs perl and curl on the machine (apt-get install perl-base curl)")
    registry_host = urlparse(registry_url).netloc
    store = urlparse(os.environ.get("TRAINYARD_S3_URL") or registry_url).port
    settings.TRAINYARD_BUILD_NETWORK = "allowlist"
    # The object store's port by a name the list allows: that name resolves to loopback, so it is refused all the same.
    settings.TRAINYARD_BUILD_ALLOWED_HOSTS = [mirror["endpoint"], f"localhost:{store}"]
    reference = _escape_upstream(registry_url, build_root, tmp_path / "probe")
    base = services.base_image_define(
        name="probe-base", containerfile=f"FROM {reference}\nRUN echo base > /base\n", cuda_version="12.4",
        framework="none", min_driver_version="550.54",
    )  # fmt: skip
    assert built(base).status == "succeeded"
    team = TeamFactory(slug="alpha")
    url = f"http://{mirror['endpoint']}/pkg.txt"
    code = "-o /dev/null -w %{http_code}"
    # Each probe's answer goes to a file of the image too, read back from the pushed layers (image_files).
    probes_of = [
        ("mirror", f"curl -sS -f -m 20 {url} -o /pkg.txt && cat /pkg.txt"),
        ("off-list", f"curl -sS -m 20 {code} http://evil.example/ 2>&1"),
        ("off-list-tls", "curl -sS -m 20 https://evil.example/ 2>&1"),
        ("direct", f"curl -sS -m 10 --noproxy '*' {url} 2>&1"),
        ("registry", f"curl -sS -m 20 {code} http://{registry_host}/v2/ 2>&1"),
        ("registry-direct", f"curl -sS -m 10 --noproxy '*' http://{registry_host}/v2/ 2>&1"),
        ("store-by-name", f"curl -sS -m 20 {code} http://localhost:{store}/ 2>&1"),
    ]
    containerfile = "FROM probe-base\n" + "".join(
        f'RUN echo "PROBE {name}: $({command})" > /probe-{name}; cat /probe-{name}; true\n'
        for name, command in probes_of
    )
    image = services.project_image_define(team=team, name="fetch", base="probe-base", containerfile=containerfile)
    build = built(image)
    log = build.log
    assert build.status == "succeeded", log
    probes = image_files(registry_url, build, "probe-")
    probes = {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in probes.values() if line.startswith("PROBE ")}
    assert len(probes) == 7, (probes, log)
    assert f"(as trainyard-b{team.pk}, network allowlist)" in log
    assert probes["PROBE mirror"] == mirror["body"].strip(), log
    assert probes["PROBE off-list"] == "403", log
    assert "CONNECT tunnel failed, response 403" in probes["PROBE off-list-tls"], log
    # No way around the proxy: the namespace has a loopback alone, and nothing of the platform's listens on it.
    assert "Failed to connect" in probes["PROBE direct"] or "Couldn't connect" in probes["PROBE direct"], log
    assert probes["PROBE registry"] == "403", log
    assert "Failed to connect" in probes["PROBE registry-direct"], log
    assert probes["PROBE store-by-name"] == "403", log
    refused = [line for line in log.splitlines() if line.startswith("[trainyard] network: refused")]
    assert "[trainyard] network: refused GET evil.example:80 (not in TRAINYARD_BUILD_ALLOWED_HOSTS)" in refused
    assert "[trainyard] network: refused CONNECT evil.example:443 (not in TRAINYARD_BUILD_ALLOWED_HOSTS)" in refused
    assert f"[trainyard] network: refused GET {registry_host} (not in TRAINYARD_BUILD_ALLOWED_HOSTS)" in refused
    assert any(line.startswith(f"[trainyard] network: refused GET localhost:{store} (localhost resolves to ")
               and line.endswith("a loopback address)") for line in refused), refused  # fmt: skip
    assert len(refused) == 4, refused


@pytest.mark.parametrize("mode, ok", [("none", True), ("allowlist", True), ("outbound", True), ("open", False)])
def test_an_unknown_build_network_fails_at_settings_load(mode, ok):
    import subprocess
    import sys

    env = {**os.environ, "TRAINYARD_BUILD_NETWORK": mode, "DJANGO_SETTINGS_MODULE": "trainyard.settings"}
    loaded = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; print(settings.TRAINYARD_BUILD_NETWORK)"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if ok:
        assert loaded.returncode == 0 and loaded.stdout.strip() == mode, loaded.stderr
    else:
        assert loaded.returncode != 0
        assert "TRAINYARD_BUILD_NETWORK must be 'none', 'allowlist' or 'outbound', not 'open'" in loaded.stderr
