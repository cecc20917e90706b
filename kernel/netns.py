"""Networking for processes in their own network namespace (job sandboxes and image builds, both through
slirp4netns)."""

from __future__ import annotations

from pathlib import Path


def slirp_resolv_conf(folder: Path) -> str | None:
    """A resolv.conf for a job with outbound network when the host's points at a loopback resolver (which the
    job cannot reach): slirp4netns's own forwarder at 10.0.2.3 instead. None when the host's will do."""
    try:
        lines = Path("/etc/resolv.conf").read_text().splitlines()
    except OSError:
        lines = []
    servers = [ln.split()[1] for ln in lines if ln.startswith("nameserver") and len(ln.split()) > 1]
    if servers and not all(s.startswith("127.") or s == "::1" for s in servers):
        return None
    path = folder / "resolv.conf"
    path.write_text("nameserver 10.0.2.3\n")
    path.chmod(0o644)
    return str(path)


def local_addresses() -> set[str]:
    """Every address of this process's network namespace (IPv4 from the kernel's local routing table, IPv6 from
    the interfaces), as text."""
    import ipaddress

    found: set[str] = set()
    last = ""
    try:
        for line in Path("/proc/net/fib_trie").read_text().splitlines():
            words = line.split()
            if words[:1] == ["|--"]:
                last = words[1]
            elif words[1:] == ["host", "LOCAL"] and words[0] == "/32" and last:
                found.add(last)
    except (OSError, IndexError):
        pass
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            found.add(str(ipaddress.IPv6Address(bytes.fromhex(line.split()[0]))))
    except (OSError, ValueError, IndexError):
        pass
    return found


SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def loopback_up() -> None:
    """Bring up `lo` in this process's network namespace (a new one starts with it down)."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def main(argv: list[str]) -> int:
    """`python -m kernel.netns exec CMD...` (run under `unshare --net`): loopback up, then CMD in its place."""
    import os
    import sys

    if len(argv) < 2 or argv[0] != "exec":
        print("usage: python -m kernel.netns exec COMMAND [ARGS...]", file=sys.stderr)
        return 2
    try:
        loopback_up()
    except OSError as exc:
        print(f"trainyard: cannot bring up loopback in the new network namespace: {exc}", file=sys.stderr)
        return 125
    os.execvp(argv[1], argv[1:])
    return 127  # not reached


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
