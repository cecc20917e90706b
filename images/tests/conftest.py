"""Fixtures for image tests: the session's registry and podman storage, and a tiny "upstream" image made here
(a dynamic /bin/sh with its libraries, a dpkg status file, one Python package's metadata and a shell script standing
in for python3) pushed to it."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from images import registry
from images.services import podman_command

DATA = Path(__file__).parent / "data"

DPKG_STATUS = """Package: libssl3
Status: install ok installed
Version: 3.0.11-1~deb12u1

Package: tzdata
Status: install ok installed
Version: 2024a-0+deb12u1
"""

METADATA = "Metadata-Version: 2.1\nName: PyYAML\nVersion: 5.3\nSummary: YAML parser\n"


def podman(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        podman_command(root, *args),
        capture_output=True,
        text=True,
        timeout=120,
    )


def auth_args(folder: Path, host: str) -> list[str]:
    """`--authfile FILE` with the platform registry's credentials (the session's registry wants them), else []."""
    authfile = folder / "registry-auth.json"
    return ["--authfile", str(authfile)] if registry.write_authfile(authfile, host) else []


def _copy_with_libraries(binary: str, rootfs: Path) -> None:
    """A dynamically linked program and the libraries `ldd` names, at the same paths inside the rootfs."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    for path in [binary, *(p for p in out.split() if p.startswith("/"))]:
        target = rootfs / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(path).resolve(), target)


@pytest.fixture(scope="session")
def upstream(registry_url, build_root, tmp_path_factory):
    """`<registry>/upstream/tiny:1`: what a base image's FROM names; its reference and digest."""
    from urllib.parse import urlparse

    if not Path("/bin/dash").exists() or shutil.which("ldd") is None:
        pytest.skip("needs /bin/dash and ldd to make a tiny rootfs")
    context = tmp_path_factory.mktemp("upstream")
    rootfs = context / "rootfs"
    _copy_with_libraries("/bin/dash", rootfs)
    (rootfs / "bin" / "dash").rename(rootfs / "bin" / "sh")
    status = rootfs / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True)
    status.write_text(DPKG_STATUS)
    meta = rootfs / "usr/lib/python3/dist-packages/PyYAML-5.3.dist-info/METADATA"
    meta.parent.mkdir(parents=True)
    meta.write_text(METADATA)
    # A stand-in for Python, so a requirements-only image's `python3 -m pip install -r …` step runs here.
    python = rootfs / "usr/bin/python3"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text('#!/bin/sh\necho "$@" > /pip-ran\n')
    python.chmod(0o755)
    (context / "Containerfile").write_text("FROM scratch\nCOPY rootfs/ /\n")
    reference = f"{urlparse(registry_url).netloc}/upstream/tiny:1"
    built = podman(build_root, "build", "--isolation", "chroot", "-t", "localhost/upstream-tiny", str(context))
    assert built.returncode == 0, built.stdout + built.stderr
    digestfile = context / "digest"
    auth = auth_args(context, urlparse(registry_url).netloc)
    pushed = podman(
        build_root, "push", "--tls-verify=false", *auth, "--digestfile", str(digestfile), "localhost/upstream-tiny",
        reference,
    )  # fmt: skip
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    return {"reference": reference, "digest": digestfile.read_text().strip()}


@pytest.fixture
def images_env(settings, registry_url, build_root, upstream):
    settings.TRAINYARD_REGISTRY_URL = registry_url
    settings.TRAINYARD_BUILD_ROOT = build_root
    settings.TRAINYARD_BUILD_REGISTRY_RETRY_S = 0.1
    return upstream


@pytest.fixture
def feed():
    return json.loads((DATA / "osv-feed.json").read_text())


MIRROR_BODY = "mirror-package-ok\n"


@pytest.fixture(scope="session")
def mirror(tmp_path_factory):
    """A package mirror that is not on loopback (the build proxy refuses loopback): an HTTP server on a test host of
    its own, a network namespace made here and joined to this one by a veth pair (198.18.0.0/15, the benchmarking
    range), serving `pkg.txt`. The namespace, and with it the pair, goes when the test session ends. Needs root,
    `ip`, `unshare` and `nsenter`; skipped without them, failed under CI=true."""
    missing = [tool for tool in ("ip", "unshare", "nsenter") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        why = f"a test mirror host (a namespace of its own) needs root, ip, unshare, nsenter (missing: {missing})"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    from kernel.netns import local_addresses

    folder = tmp_path_factory.mktemp("mirror")
    (folder / "pkg.txt").write_text(MIRROR_BODY)
    mine = local_addresses()
    octet = next(n for n in range(16 + os.getpid() % 200, 256) if f"198.18.{n}.1" not in mine)
    here, there, port = f"198.18.{octet}.1", f"198.18.{octet}.2", 8080
    outside, inside = f"tym{os.getpid() % 100000}h", f"tym{os.getpid() % 100000}p"
    holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"])
    server = None
    try:
        own = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{holder.pid}/ns/net") == own:
            assert time.monotonic() < deadline, "the mirror's namespace was not made"
            time.sleep(0.01)
        netns = ["nsenter", "-t", str(holder.pid), "-n"]
        for argv in (
            ["ip", "link", "add", outside, "type", "veth", "peer", "name", inside, "netns", str(holder.pid)],
            ["ip", "addr", "add", f"{here}/30", "dev", outside],
            ["ip", "link", "set", outside, "up"],
            [*netns, "ip", "addr", "add", f"{there}/30", "dev", inside],
            [*netns, "ip", "link", "set", inside, "up"],
            [*netns, "ip", "link", "set", "lo", "up"],
        ):
            subprocess.run(argv, check=True, capture_output=True, timeout=30)
        server = subprocess.Popen(
            [*netns, sys.executable, "-m", "http.server", "--bind", there, "--directory", str(folder), str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection((there, port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the test mirror did not start"
                time.sleep(0.1)
        yield {"address": there, "port": port, "endpoint": f"{there}:{port}", "body": MIRROR_BODY}
    finally:
        for process in (server, holder):
            if process is not None:
                process.kill()
                process.wait(timeout=10)
        subprocess.run(["ip", "link", "del", outside], capture_output=True, timeout=30)
