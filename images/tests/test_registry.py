"""The embedded registry (started and stopped like the other embedded servers) and the reference parser."""

import time

import httpx
import pytest

from images import registry
from ops import embedded


def test_the_embedded_registry_starts_on_a_free_loopback_port_and_stops_within_its_bound(tmp_path):
    if embedded.registry_binary() is None:
        pytest.skip("docker-registry is not installed (apt-get install docker-registry)")
    running = embedded.Embedded()
    urls = embedded.start_registry(tmp_path, running)
    url = urls["TRAINYARD_REGISTRY_URL"]
    try:
        assert url.startswith("http://127.0.0.1:")
        challenge = httpx.get(f"{url}/v2/", timeout=5)
        assert challenge.status_code == 401  # it wants a token of the platform's token service
        realm = challenge.headers["WWW-Authenticate"].split('realm="', 1)[1].split('"', 1)[0]
        assert realm.startswith("http://127.0.0.1:") and realm.endswith("/registry/token")
        creds = (urls["TRAINYARD_REGISTRY_USERNAME"], urls["TRAINYARD_REGISTRY_PASSWORD"])
        token = httpx.get(realm, params={"service": "trainyard-registry"}, auth=creds, timeout=5).json()["token"]
        assert httpx.get(f"{url}/v2/", headers={"Authorization": f"Bearer {token}"}, timeout=5).status_code == 200
        config = (tmp_path / "registry.yml").read_text()
        assert f"rootdirectory: {tmp_path / 'registry'}" in config and "addr: 127.0.0.1:" in config
        assert (tmp_path / "registry.yml").stat().st_mode & 0o077 == 0
        procs = [proc for _, proc in running.procs]
        token_port = int(realm.split(":")[2].split("/")[0])
    finally:
        started = time.monotonic()
        running.stop()
    assert time.monotonic() - started < embedded.STOP["registry"][1] + 1
    assert all(proc.poll() is not None for proc in procs) and len(procs) == 2
    for port in (int(url.rsplit(":", 1)[1]), token_port):
        assert not embedded.port_open("127.0.0.1", port)


@pytest.mark.parametrize(
    "text, host, repository, tag, digest",
    [
        ("python:3.11", "docker.io", "library/python", "3.11", ""),
        ("pytorch/pytorch", "docker.io", "pytorch/pytorch", "latest", ""),
        ("nvcr.io/nvidia/pytorch:24.10-py3", "nvcr.io", "nvidia/pytorch", "24.10-py3", ""),
        ("127.0.0.1:5000/team/app:v1", "127.0.0.1:5000", "team/app", "v1", ""),
        ("localhost/app@sha256:" + "a" * 64, "localhost", "app", "", "sha256:" + "a" * 64),
        ("127.0.0.1:5000/app", "127.0.0.1:5000", "app", "latest", ""),
    ],
)
def test_references_parse_as_registries_read_them(text, host, repository, tag, digest):
    ref = registry.parse(text)
    assert (ref.host, ref.repository, ref.tag, ref.digest) == (host, repository, tag, digest)
