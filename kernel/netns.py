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
