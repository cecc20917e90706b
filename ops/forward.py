"""A loopback TCP port whose every connection is passed on to a unix socket (no Django here).

The embedded SeaweedFS runs in a network namespace of its own, so its master, volume and filer ports (which take
no credentials) are reachable by nothing outside it. Its S3 gateway, which checks an access key and secret on every
request, also listens on a unix socket in var/run/; this process makes that socket the store's loopback port for
the platform's processes (web, workers, local supervisors), which speak S3 over TCP.

`python -m ops.forward 127.0.0.1 PORT /path/to/socket` — bytes are copied both ways (splice through a pipe, so
they never pass through Python) until both sides have closed.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

CHUNK = 1 << 20


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy `source` to `sink` until `source` ends, then end `sink`'s sending side (a half close is passed on)."""
    read_end, write_end = os.pipe()
    try:
        while True:
            moved = os.splice(source.fileno(), write_end, CHUNK)
            if moved == 0:
                break
            while moved:
                moved -= os.splice(read_end, sink.fileno(), moved)
    except OSError:
        pass  # a reset or a closed peer: the connection is over either way
    finally:
        os.close(read_end)
        os.close(write_end)
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _serve(client: socket.socket, target: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(target)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def listen(host: str, port: int) -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, port))
    server.listen(256)
    return server


def forward(server: socket.socket, target: str) -> None:
    while True:
        client, _ = server.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_serve, args=(client, target), daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m ops.forward HOST PORT UNIX_SOCKET", file=sys.stderr)
        return 2
    host, port, target = argv[0], int(argv[1]), argv[2]
    try:
        server = listen(host, port)
    except OSError as exc:
        print(f"trainyard: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    try:
        forward(server, target)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
