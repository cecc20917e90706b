"""The build proxy's decisions (images/build_proxy.py), through its real unix socket: an allowed host is forwarded,
anything else is refused with a plain reason and a line for the build's log, a name that resolves to loopback or to a
platform service is refused even when the list names it, malformed requests are 400, and connections are bounded.
Nothing here leaves this machine: the allowed host is the session's test mirror, in a namespace of its own."""

import socket
import threading
import time

import pytest

from images.build_proxy import BuildProxy, Policy, Refused, Request, parse_request, platform_endpoints
from kernel.netns import local_addresses


@pytest.fixture
def loopback_server():
    """A real server on loopback that counts the connections it gets: none may come through the proxy."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1], accepted
    listener.close()


def proxy(tmp_path, allowed, guarded=frozenset(), **kwargs) -> BuildProxy:
    return BuildProxy(Policy(allowed=frozenset(allowed), guarded=guarded), tmp_path / "net", **kwargs).start()


def ask(running: BuildProxy, raw: bytes, *, timeout=10.0) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(timeout)
        client.connect(str(running.socket_path))
        client.sendall(raw)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    return answer.decode("latin-1")


def test_a_host_off_the_list_is_refused_with_a_reason_and_a_log_line(tmp_path):
    running = proxy(tmp_path, ["deb.debian.org:80"])
    try:
        answer = ask(running, b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n")
        other_port = ask(running, b"GET http://deb.debian.org:8080/x HTTP/1.1\r\n\r\n")
    finally:
        running.stop()
    assert answer.startswith("HTTP/1.1 403 Forbidden\r\n"), answer
    assert answer.endswith("403 Forbidden: not in TRAINYARD_BUILD_ALLOWED_HOSTS\n")
    assert other_port.startswith("HTTP/1.1 403 ")  # the port is part of what is allowed
    assert running.log().splitlines() == [
        "[trainyard] network: refused CONNECT evil.example:443 (not in TRAINYARD_BUILD_ALLOWED_HOSTS)",
        "[trainyard] network: refused GET deb.debian.org:8080 (not in TRAINYARD_BUILD_ALLOWED_HOSTS)",
    ]


def test_an_allowed_host_is_vetted_by_its_addresses_without_connecting():
    policy = Policy(allowed=frozenset({"198.51.100.7:80", "[2001:db8::7]:443"}))
    assert policy.vet(Request("GET", "198.51.100.7", 80, b"")) == [(socket.AF_INET, ("198.51.100.7", 80))]
    assert policy.vet(Request("CONNECT", "[2001:db8::7]", 443, b""))[0][1][:2] == ("2001:db8::7", 443)
    with pytest.raises(Refused) as refused:
        policy.vet(Request("GET", "198.51.100.8", 80, b""))
    assert refused.value.status == 403


@pytest.mark.parametrize(
    "host, why",
    [
        ("localhost", "a loopback address"),
        ("127.0.0.2", "a loopback address"),
        ("[::ffff:127.0.0.1]", "a loopback address"),
        ("0.0.0.0", "an unspecified address"),
        ("169.254.169.254", "a link-local address"),
        ("224.0.0.1", "a multicast address"),
    ],
)
def test_an_allowed_name_that_resolves_to_loopback_or_the_like_is_refused(tmp_path, loopback_server, host, why):
    port, accepted = loopback_server
    running = proxy(tmp_path, [f"{host}:{port}"])
    try:
        answer = ask(running, f"GET http://{host}:{port}/ HTTP/1.1\r\n\r\n".encode())
        tunnel = ask(running, f"CONNECT {host}:{port} HTTP/1.1\r\n\r\n".encode())
    finally:
        running.stop()
    assert answer.startswith("HTTP/1.1 403 ") and why in answer, answer
    assert tunnel.startswith("HTTP/1.1 403 ") and why in tunnel, tunnel
    assert accepted == []  # nothing reached the server behind the name
    assert f"refused CONNECT {host}:{port} ({host.strip('[]')} resolves to " in running.log()


def test_an_allowed_host_that_is_a_platform_service_is_refused(tmp_path, mirror):
    """The mirror's address stands in for the platform's registry there: the name is allowed, the service is not."""
    guarded = platform_endpoints([f"http://{mirror['endpoint']}"], [])
    running = proxy(tmp_path, [mirror["endpoint"]], guarded)
    try:
        answer = ask(running, f"GET http://{mirror['endpoint']}/pkg.txt HTTP/1.1\r\n\r\n".encode())
    finally:
        running.stop()
    assert answer.startswith("HTTP/1.1 403 ") and "a platform service" in answer, answer
    # A service's port is guarded on every address of this machine (one bound to all of them answers there too).
    ports = platform_endpoints([], [("127.0.0.1", 8000)])
    assert {(address, 8000) for address in local_addresses()} <= ports


def test_an_allowed_host_is_forwarded_by_url_and_by_tunnel(tmp_path, mirror):
    running = proxy(tmp_path, [mirror["endpoint"]])
    try:
        # Keep-alive asked for, the proxy still closes after one request: a second one would not be looked at.
        by_url = ask(
            running,
            f"GET http://{mirror['endpoint']}/pkg.txt HTTP/1.1\r\nProxy-Connection: keep-alive\r\n\r\n".encode(),
        )
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(10)
            client.connect(str(running.socket_path))
            client.sendall(f"CONNECT {mirror['endpoint']} HTTP/1.1\r\n\r\n".encode())
            assert client.recv(4096) == b"HTTP/1.1 200 Connection established\r\n\r\n"
            client.sendall(f"GET /pkg.txt HTTP/1.0\r\nHost: {mirror['endpoint']}\r\n\r\n".encode())
            tunnelled = b""
            while chunk := client.recv(65536):
                tunnelled += chunk
    finally:
        running.stop()
    assert by_url.startswith("HTTP/1.0 200 ") and by_url.endswith(mirror["body"]), by_url
    assert tunnelled.decode().endswith(mirror["body"])
    assert running.log() == ""


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"garbage\r\n\r\n", "the request line is not 'METHOD TARGET HTTP/1.x'"),
        (b"GET http://a b/ HTTP/1.1\r\n\r\n", "the request line is not"),
        (b"GET /relative HTTP/1.1\r\nHost: deb.debian.org\r\n\r\n", "only absolute http:// URLs are proxied"),
        (b"GET https://deb.debian.org/ HTTP/1.1\r\n\r\n", "only absolute http:// URLs are proxied"),
        (b"CONNECT deb.debian.org HTTP/1.1\r\n\r\n", "CONNECT wants host:port"),
        (b"CONNECT deb.debian.org:0 HTTP/1.1\r\n\r\n", "the port is out of range"),
        (b"GET http://deb.debian.org:99999/ HTTP/1.1\r\n\r\n", "the URL's host or port is malformed"),
        (b"GET http://user@deb.debian.org/ HTTP/1.1\r\n\r\n", "the URL's host is malformed"),
        (b"GET http://deb.debian.org/ HTTP/1.1\r\nno colon here\r\n\r\n", "a header line is not 'Name: value'"),
        (b"GET http://deb.debian.org/ HTTP/2\r\n\r\n", "the request line is not"),
        (b"GET http://deb.debian.org/ HTTP/1.1\r\n", "the request ended before its blank line"),
    ],
)
def test_a_malformed_request_is_400_and_logged(tmp_path, raw, reason):
    running = proxy(tmp_path, ["deb.debian.org:80", "deb.debian.org:99999"])
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(10)
            client.connect(str(running.socket_path))
            client.sendall(raw)
            client.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := client.recv(65536):
                answer += chunk
    finally:
        running.stop()
    answer = answer.decode()
    assert answer.startswith("HTTP/1.1 400 Bad Request\r\n") and reason in answer, answer
    assert running.log().startswith(f"[trainyard] network: refused a malformed request ({reason}")


def test_origin_form_forwarding_drops_proxy_headers():
    request = parse_request(
        b"GET http://deb.debian.org/debian/dists?x=1 HTTP/1.1\r\nProxy-Authorization: Basic eA==\r\n"
        b"Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nAccept: */*"
    )
    assert (request.host, request.port) == ("deb.debian.org", 80)
    assert request.head.decode().split("\r\n") == [
        "GET /debian/dists?x=1 HTTP/1.1", "Host: deb.debian.org", "Accept: */*", "Connection: close", "", "",
    ]  # fmt: skip


def test_connections_are_bounded_in_number_and_idle_time(tmp_path, mirror):
    running = proxy(tmp_path, [mirror["endpoint"]], max_connections=2, idle_s=0.5)
    held = []
    try:
        for _ in range(2):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.settimeout(10)
            client.connect(str(running.socket_path))
            client.sendall(f"CONNECT {mirror['endpoint']} HTTP/1.1\r\n\r\n".encode())
            assert client.recv(4096).startswith(b"HTTP/1.1 200 ")
            held.append(client)
        third = ask(running, f"CONNECT {mirror['endpoint']} HTTP/1.1\r\n\r\n".encode())
        assert third.startswith("HTTP/1.1 503 ") and "more than 2 connections at once" in third, third
        assert running.log() == "[trainyard] network: refused a request (more than 2 connections at once)\n"
        started = time.monotonic()
        assert held[0].recv(4096) == b""  # a silent tunnel is closed past its idle time
        assert time.monotonic() - started < 5
        held[1].recv(4096)
        time.sleep(0.2)  # the slots come back once both tunnels are closed
        assert ask(running, b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n").startswith("HTTP/1.1 403 ")
    finally:
        for client in held:
            client.close()
        running.stop()


# ----------------------------------------------------------------------------- the platform service (Kubernetes)


@pytest.fixture
def service(mirror):
    """`python -m images.build_proxy serve` as k8s/build-proxy.yaml runs it, on a free loopback port: the mirror
    allowed, and also named as a platform service (--guard-url) under a second, allowed port of the same host."""
    import json
    import subprocess
    import sys

    from kernel.paths import BASE_DIR

    process = subprocess.Popen(
        [sys.executable, "-m", "images.build_proxy", "serve", "--host", "127.0.0.1", "--port", "0",
         "--allow", mirror["endpoint"], "--allow", f"{mirror['address']}:5000", "--allow", "localhost:8000",
         "--guard-url", f"http://{mirror['address']}:5000"],
        cwd=BASE_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        first = json.loads(process.stdout.readline())
        assert first["event"] == "build_proxy_listening", first
        assert first["allowed"] == sorted([mirror["endpoint"], f"{mirror['address']}:5000", "localhost:8000"])
        yield process, first["port"]
    finally:
        process.terminate()
        process.wait(timeout=10)


def ask_tcp(port: int, raw: bytes) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(raw)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    return answer.decode("latin-1")


def test_the_service_refuses_what_the_build_proxy_refuses_and_logs_json_lines(service, mirror):
    import json

    process, port = service
    fetched = ask_tcp(port, f"GET http://{mirror['endpoint']}/pkg.txt HTTP/1.1\r\n\r\n".encode())
    off_list = ask_tcp(port, b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n")
    loopback = ask_tcp(port, b"GET http://localhost:8000/ HTTP/1.1\r\n\r\n")
    guarded = ask_tcp(port, f"CONNECT {mirror['address']}:5000 HTTP/1.1\r\n\r\n".encode())
    malformed = ask_tcp(port, b"garbage\r\n\r\n")
    assert fetched.startswith("HTTP/1.0 200 ") and fetched.endswith(mirror["body"]), fetched
    assert off_list.startswith("HTTP/1.1 403 ") and "not in TRAINYARD_BUILD_ALLOWED_HOSTS" in off_list, off_list
    assert loopback.startswith("HTTP/1.1 403 ") and "a loopback address" in loopback, loopback
    assert guarded.startswith("HTTP/1.1 403 ") and "a platform service" in guarded, guarded
    assert malformed.startswith("HTTP/1.1 400 "), malformed
    process.terminate()
    out, _ = process.communicate(timeout=10)
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(e["event"], e["request"], e["status"]) for e in lines] == [
        ("build_proxy_refused", "CONNECT evil.example:443", 403),
        ("build_proxy_refused", "GET localhost:8000", 403),
        ("build_proxy_refused", f"CONNECT {mirror['address']}:5000", 403),
        ("build_proxy_refused", "a malformed request", 400),
    ]
    assert {e["client"] for e in lines} == {"127.0.0.1"}
    assert lines[0]["reason"] == "not in TRAINYARD_BUILD_ALLOWED_HOSTS"


@pytest.mark.parametrize(
    "args, said",
    [
        (["--allow", "deb.debian.org"], "TRAINYARD_BUILD_ALLOWED_HOSTS: 'deb.debian.org' is not host:port"),
        (["--allow", "deb.debian.org:70000"], "'deb.debian.org:70000' is not host:port"),
        (["--port", "65536"], "--port 65536 is out of range"),
        (["--max-connections", "0"], "--max-connections must be at least 1"),
    ],
)
def test_the_service_refuses_bad_arguments_saying_why(args, said):
    import subprocess
    import sys

    from kernel.paths import BASE_DIR

    ran = subprocess.run(
        [sys.executable, "-m", "images.build_proxy", "serve", *args], cwd=BASE_DIR, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert ran.returncode == 2 and said in ran.stderr, ran.stderr
