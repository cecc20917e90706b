"""Copying bytes both ways between two connected sockets until both ends are done or the pair sits idle (the image
build's filtering proxy and the relay inside its jail, images/build_proxy.py). Standard library only: the relay runs
inside the build jail, where the platform's files are hidden once it starts."""

from __future__ import annotations

import select
import socket

CHUNK = 64 * 1024


def pump(a: socket.socket, b: socket.socket, *, idle_s: float) -> None:
    """Forward `a` to `b` and `b` to `a`; an end that closes its side is passed on as a half-close, and the pair
    ends when both sides closed, on an error, or after `idle_s` seconds with no byte either way."""
    a.settimeout(idle_s)  # a peer that stops reading stalls a send no longer than an idle pair
    b.settimeout(idle_s)
    peer = {a: b, b: a}
    open_ = {a, b}  # sides still sending
    while open_:
        ready, _, broken = select.select(list(open_), [], list(open_), idle_s)
        if not ready and not broken:
            return  # idle
        for sock in ready:
            try:
                data = sock.recv(CHUNK)
            except OSError:
                return
            if not data:
                open_.discard(sock)
                try:
                    peer[sock].shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                continue
            try:
                peer[sock].sendall(data)
            except OSError:
                return
        if broken:
            return
