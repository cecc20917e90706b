"""The filtering HTTP proxy of an image build with TRAINYARD_BUILD_NETWORK=allowlist: per build on a unix socket for a
local build, or as a platform service on a TCP port for the BuildKit Jobs on Kubernetes (`serve`, at the end).

The build's jail has a network namespace with a loopback alone; inside it a small relay (images/build_jail.py)
listens on 127.0.0.1:RELAY_PORT and hands each connection to this proxy's unix socket, which lives in a folder
beside the build's context that only the build's user can open. podman build passes http_proxy/https_proxy to the
RUN steps, so `pip`, `apt-get` and `curl` go through here, and nothing else leaves the namespace.

The proxy runs in the platform's process, a thread per connection, for the length of the build step. It takes
`CONNECT host:port` (https tunnels) and absolute-URI requests (`GET http://host:port/path`). A host:port is let
through only when TRAINYARD_BUILD_ALLOWED_HOSTS names it; the proxy then resolves the name itself and connects to
the addresses it checked, never to a name again, so a name that resolves to a loopback, unspecified, link-local or
multicast address, or to one of the platform's own services (database, Redis, object store, registry, web), is
refused even when the list names it (DNS rebinding). Everything refused gets a plain-text answer (400, 403, 502,
503) and one line in the build's log.

On Kubernetes (k8s/build-proxy.yaml) the same proxy runs as its own Deployment: `python -m images.build_proxy serve
--port 3128` listens on TCP for every build pod at once, takes the list from TRAINYARD_BUILD_ALLOWED_HOSTS (the
platform's ConfigMap), refuses exactly what the local one refuses, and writes each refusal as a JSON line on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from kernel.netns import local_addresses
from kernel.relay import pump

RELAY_PORT = 3128  # inside the build's own network namespace, so never in anyone's way
SOCKET_NAME = "proxy.sock"
MAX_CONNECTIONS = 32  # at once, per build
IDLE_S = 120.0  # a tunnel or request with no byte either way for this long is closed
HEADER_TIMEOUT_S = 15.0  # to send the request line and headers
CONNECT_TIMEOUT_S = 15.0
MAX_HEADER_BYTES = 32 * 1024
MAX_LOGGED = 200  # refusal lines one build's log gets; past that a count

HOST = re.compile(r"(?:\[[0-9a-f:.]+\]|[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?)")
AUTHORITY = re.compile(rf"(?P<host>{HOST.pattern}):(?P<port>[0-9]{{1,5}})")
METHOD = re.compile(r"[A-Z]{1,20}")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te",
              "trailer", "upgrade"}  # fmt: skip
REASONS = {400: "Bad Request", 403: "Forbidden", 408: "Request Timeout", 431: "Request Header Fields Too Large",
           502: "Bad Gateway", 503: "Service Unavailable"}  # fmt: skip


def relay_env() -> dict[str, str]:
    """The environment podman build gets, and passes to every RUN step (its --http-proxy)."""
    url = f"http://127.0.0.1:{RELAY_PORT}"
    proxies = {name: url for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")}
    return {**proxies, "no_proxy": "", "NO_PROXY": ""}  # even `localhost` goes to the proxy, which refuses it


class Refused(Exception):
    """A request the proxy does not forward: the status to answer and why (one line)."""

    def __init__(self, status: int, reason: str, *, what: str = ""):
        super().__init__(reason)
        self.status = status
        self.reason = reason
        # "CONNECT host:port", "GET host:port", "a malformed request" (400) or "a request"
        self.what = what or ("a malformed request" if status == 400 else "a request")


@dataclass(frozen=True)
class Request:
    method: str
    host: str  # lowercase; an IPv6 address in brackets
    port: int
    head: bytes  # what goes to the upstream host: b"" for CONNECT, else the request in origin form

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def what(self) -> str:
        return f"{self.method} {self.endpoint}"


def parse_request(head: bytes) -> Request:
    """The request line and headers (up to and without the blank line) of a proxy request; Refused 400 when they are
    not `CONNECT host:port HTTP/1.x` or `METHOD http://host[:port]/path HTTP/1.x` with well-formed headers."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not METHOD.fullmatch(parts[0]) or parts[2] not in ("HTTP/1.0", "HTTP/1.1"):
        raise Refused(400, "the request line is not 'METHOD TARGET HTTP/1.x'")
    method, target, version = parts
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or any(c in name for c in " \t") or any(c in line for c in "\r\n\0"):
            raise Refused(400, "a header line is not 'Name: value'")
        headers.append((name, value.strip()))
    if method == "CONNECT":
        match = AUTHORITY.fullmatch(target.lower())
        if not match:
            raise Refused(400, "CONNECT wants host:port")
        return Request(method, match["host"], _port(match["port"]), b"")
    if not target.lower().startswith("http://"):
        raise Refused(400, "only absolute http:// URLs are proxied (https goes through CONNECT)")
    try:
        url = urlsplit(target)
        port = url.port or 80
    except ValueError:
        raise Refused(400, "the URL's host or port is malformed") from None
    host = (url.hostname or "").lower()
    host = f"[{host}]" if ":" in host else host
    if not HOST.fullmatch(host) or "@" in url.netloc:
        raise Refused(400, "the URL's host is malformed")
    path = url.path or "/"
    if url.query:
        path += f"?{url.query}"
    # One request per connection: the next one on a kept-alive connection would never be looked at.
    named = {v.strip().lower() for n, v in headers if n.lower() == "connection" for v in v.split(",")}
    kept = [(n, v) for n, v in headers if n.lower() not in HOP_BY_HOP and n.lower() not in named]
    if not any(n.lower() == "host" for n, _ in kept):
        kept.insert(0, ("Host", host if port == 80 else f"{host}:{port}"))
    forward = [f"{method} {path} {version}", *(f"{n}: {v}" for n, v in kept), "Connection: close", "", ""]
    return Request(method, host, port, "\r\n".join(forward).encode("latin-1"))


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise Refused(400, "the port is out of range")
    return port


@dataclass(frozen=True)
class Policy:
    """What RUN steps may reach: `allowed` host:port pairs (as TRAINYARD_BUILD_ALLOWED_HOSTS writes them), never an
    address of `guarded` (the platform's own services, (address, port)) nor a loopback, unspecified, link-local or
    multicast one."""

    allowed: frozenset[str]
    guarded: frozenset[tuple[str, int]] = frozenset()

    def vet(self, request: Request) -> list[tuple[int, tuple]]:
        """The addresses (family, sockaddr) to connect to for the request; Refused when it may not go anywhere."""
        if request.endpoint not in self.allowed:
            raise Refused(403, "not in TRAINYARD_BUILD_ALLOWED_HOSTS", what=request.what)
        name = request.host.strip("[]")
        try:
            found = socket.getaddrinfo(name, request.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise Refused(502, f"{name} does not resolve: {exc.strerror or exc}", what=request.what) from None
        addresses: list[tuple[int, tuple]] = []
        for family, _, _, _, sockaddr in found:
            address = ipaddress.ip_address(sockaddr[0].split("%")[0])
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
                address = address.ipv4_mapped
            why = _forbidden(address) or ("a platform service" if (str(address), request.port) in self.guarded else "")
            if why:
                raise Refused(403, f"{name} resolves to {address}, {why}", what=request.what)
            if (family, sockaddr) not in addresses:
                addresses.append((family, sockaddr))
        return addresses


def _forbidden(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    for test, what in (("is_loopback", "a loopback address"), ("is_unspecified", "an unspecified address"),
                       ("is_link_local", "a link-local address"), ("is_multicast", "a multicast address")):  # fmt: skip
        if getattr(address, test):
            return what
    return ""


def platform_endpoints(urls: list[str], ports: list[tuple[str, int]]) -> frozenset[tuple[str, int]]:
    """The (address, port) pairs of the platform's own services: each URL's host (resolved) and port, each (host,
    port) given, and every port of them on every address of this machine (a service bound to all of them)."""
    pairs: list[tuple[str, int]] = list(ports)
    for url in urls:
        with contextlib.suppress(ValueError):
            parts = urlsplit(url if "://" in url else f"//{url}")
            if parts.hostname:
                default = {"https": 443, "redis": 6379, "rediss": 6379, "postgres": 5432, "postgresql": 5432}
                pairs.append((parts.hostname, parts.port or default.get(parts.scheme, 80)))
    guarded: set[tuple[str, int]] = set()
    mine = local_addresses()
    for host, port in pairs:
        guarded.update((address, port) for address in mine)
        if not host or host.startswith("/"):
            continue  # a unix socket
        with contextlib.suppress(OSError):
            for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
                address = ipaddress.ip_address(sockaddr[0].split("%")[0])
                mapped = getattr(address, "ipv4_mapped", None)
                guarded.add((str(mapped or address), port))
    return frozenset(guarded)


class BuildProxy:
    """The proxy of one build, serving on `<folder>/proxy.sock` between `start()` and `stop()` (or as a context
    manager). `owner` (uid, gid) gets the folder and the socket: the relay in the jail runs as the build's user."""

    def __init__(self, policy: Policy, folder: Path, *, owner: tuple[int, int] | None = None,
                 max_connections: int = MAX_CONNECTIONS, idle_s: float = IDLE_S):  # fmt: skip
        self.policy = policy
        self.folder = folder
        self.owner = owner
        self.idle_s = idle_s
        self.slots = threading.BoundedSemaphore(max_connections)
        self.max_connections = max_connections
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.live: set[socket.socket] = set()
        self.lines: list[str] = []
        self.refused = 0
        self.listener: socket.socket | None = None
        self.thread: threading.Thread | None = None

    @property
    def socket_path(self) -> Path:
        return self.folder / SOCKET_NAME

    @property
    def name(self) -> str:
        return self.folder.name

    def start(self) -> BuildProxy:
        listener = self._listen()
        listener.settimeout(0.2)
        self.listener = listener
        self.thread = threading.Thread(target=self._accept, name=f"build-proxy {self.name}", daemon=True)
        self.thread.start()
        return self

    def _listen(self) -> socket.socket:
        self.folder.mkdir(mode=0o700, exist_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        folder = os.open(self.folder, os.O_PATH | os.O_DIRECTORY)
        try:  # through the folder's descriptor: a socket's path may not be longer than 107 bytes, a build root may
            listener.bind(f"/proc/self/fd/{folder}/{SOCKET_NAME}")
        finally:
            os.close(folder)
        if self.owner is not None:
            os.chown(self.socket_path, *self.owner)
            os.chown(self.folder, *self.owner)
        os.chmod(self.socket_path, 0o600)
        listener.listen(64)
        return listener

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        if self.listener is not None:
            self.listener.close()
        with self.lock:
            for sock in self.live:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._unlisten()

    def _unlisten(self) -> None:
        self.socket_path.unlink(missing_ok=True)

    def __enter__(self) -> BuildProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log(self) -> str:
        """The refusal lines for the build's log."""
        with self.lock:
            more = self.refused - len(self.lines)
            return "".join(self.lines) + (f"[trainyard] network: {more} more requests refused\n" if more > 0 else "")

    def _record(self, conn: socket.socket, refused: Refused) -> None:
        self._note(f"refused {refused.what} ({refused.reason})")

    def _note(self, line: str) -> None:
        with self.lock:
            self.refused += 1
            if len(self.lines) < MAX_LOGGED:
                self.lines.append(f"[trainyard] network: {line}\n")

    def _accept(self) -> None:
        assert self.listener is not None
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self.slots.acquire(blocking=False):
                conn.settimeout(0.5)
                with contextlib.suppress(OSError):
                    conn.recv(MAX_HEADER_BYTES)  # read before answering: closing on unread bytes resets the answer
                self._answer(conn, Refused(503, f"more than {self.max_connections} connections at once"))
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="build-proxy conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        upstream = None
        with self.lock:
            self.live.add(conn)
        try:
            conn.settimeout(HEADER_TIMEOUT_S)
            head, rest = _read_head(conn)
            if head is None:
                return  # opened and closed without a word
            request = parse_request(head)
            addresses = self.policy.vet(request)
            upstream = _connect(request, addresses)
            with self.lock:
                self.live.add(upstream)
            if request.method == "CONNECT":
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                upstream.sendall(rest)
            else:
                upstream.sendall(request.head + rest)
            pump(conn, upstream, idle_s=self.idle_s)
        except Refused as refused:
            self._answer(conn, refused)
        except OSError:
            pass  # the client went away or the upstream broke off: nothing to answer to
        finally:
            with self.lock:
                self.live.discard(conn)
                if upstream is not None:
                    self.live.discard(upstream)
            conn.close()
            if upstream is not None:
                upstream.close()
            self.slots.release()

    def _answer(self, conn: socket.socket, refused: Refused) -> None:
        self._record(conn, refused)
        body = f"{refused.status} {REASONS[refused.status]}: {refused.reason}\n".encode()
        head = (
            f"HTTP/1.1 {refused.status} {REASONS[refused.status]}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        with contextlib.suppress(OSError):
            conn.sendall(head.encode() + body)


def _read_head(conn: socket.socket) -> tuple[bytes | None, bytes]:
    """The request's head (without the blank line) and whatever came after it; (None, b"") for a silent close."""
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        if len(buffer) > MAX_HEADER_BYTES:
            raise Refused(431, f"the request's head is larger than {MAX_HEADER_BYTES // 1024} KiB")
        try:
            data = conn.recv(8192)
        except TimeoutError:
            raise Refused(408, f"no complete request within {HEADER_TIMEOUT_S:g} s") from None
        if not data:
            if buffer:
                raise Refused(400, "the request ended before its blank line")
            return None, b""
        buffer += data
    head, _, rest = buffer.partition(b"\r\n\r\n")
    return head, rest


def _connect(request: Request, addresses: list[tuple[int, tuple]]) -> socket.socket:
    error: OSError | None = None
    for family, sockaddr in addresses:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise Refused(502, f"cannot connect: {getattr(error, 'strerror', None) or error}", what=request.what)


# ------------------------------------------------------------------------------------------- the platform service


class ServiceProxy(BuildProxy):
    """The proxy as a platform service on Kubernetes: one TCP listener for every build pod (which reach it through
    the Service of k8s/build-proxy.yaml, and nothing else may: its NetworkPolicy), the same Policy, and refusals as
    JSON lines on `out` (the pod's log) with the address of the pod that asked."""

    def __init__(self, policy: Policy, address: tuple[str, int], *, out=None, max_connections: int = 256,
                 idle_s: float = IDLE_S):  # fmt: skip
        super().__init__(policy, Path("."), max_connections=max_connections, idle_s=idle_s)
        self.address = address
        self.out = out if out is not None else sys.stdout

    @property
    def name(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    @property
    def port(self) -> int:
        assert self.listener is not None
        return self.listener.getsockname()[1]

    def _listen(self) -> socket.socket:
        host, port = self.address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return socket.create_server((host, port), family=family, backlog=256, dualstack_ipv6=host == "::")

    def _unlisten(self) -> None:
        pass

    def _record(self, conn: socket.socket, refused: Refused) -> None:
        try:
            client = conn.getpeername()[0]
        except OSError:
            client = ""
        self.emit("build_proxy_refused", client=client, request=refused.what, status=refused.status,
                  reason=refused.reason)  # fmt: skip

    def emit(self, event: str, **fields) -> None:
        line = json.dumps({"event": event, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **fields})
        with self.lock:
            self.out.write(line + "\n")
            self.out.flush()


def allowed_hosts(text: str) -> frozenset[str]:
    """TRAINYARD_BUILD_ALLOWED_HOSTS as the platform's settings read it (comma-separated host:port pairs, any case);
    ValueError naming the first entry that is not host:port."""
    hosts = [h.strip().lower() for h in text.split(",") if h.strip()]
    for host in hosts:
        match = AUTHORITY.fullmatch(host)
        if not match or not 0 < int(match["port"]) < 65536:
            raise ValueError(f"TRAINYARD_BUILD_ALLOWED_HOSTS: {host!r} is not host:port")
    return frozenset(hosts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m images.build_proxy", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the build proxy on a TCP port (the platform service)")
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on (`::`: every IPv4 and IPv6 one)")
    serve.add_argument("--port", type=int, default=RELAY_PORT)
    what = "a host:port builds may reach (repeat; default: TRAINYARD_BUILD_ALLOWED_HOSTS)"
    serve.add_argument("--allow", action="append", metavar="HOST:PORT", help=what)
    what = "a platform service (its host and port) never reached, whatever the list says (repeat)"
    serve.add_argument("--guard-url", action="append", default=[], metavar="URL", help=what)
    serve.add_argument("--max-connections", type=int, default=256)
    args = parser.parse_args(argv)
    if not 0 <= args.port < 65536:
        parser.error(f"--port {args.port} is out of range")
    if args.max_connections < 1:
        parser.error("--max-connections must be at least 1")
    try:
        listed = ",".join(args.allow) if args.allow else os.environ.get("TRAINYARD_BUILD_ALLOWED_HOSTS", "")
        allowed = allowed_hosts(listed)
    except ValueError as exc:
        parser.error(str(exc))
    guarded = platform_endpoints([u for u in args.guard_url if u], [])
    proxy = ServiceProxy(Policy(allowed=allowed, guarded=guarded), (args.host, args.port),
                         max_connections=args.max_connections)  # fmt: skip
    try:
        proxy.start()
    except OSError as exc:
        parser.exit(1, f"cannot listen on [{args.host}]:{args.port}: {exc.strerror or exc}\n")
    proxy.emit("build_proxy_listening", port=proxy.port, allowed=sorted(allowed))
    try:
        while proxy.thread is not None and proxy.thread.is_alive():
            proxy.thread.join(timeout=1)
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()


if __name__ == "__main__":
    main()
