"""The jail an image build runs in on the platform's own machine (see images/builder.py).

Started by the platform (as root) under `unshare --net --mount --propagation private --fork`, so this process is
already in a network namespace of its own (no interface but a loopback that is down, unless the platform attached
an outbound-only network to it) and a private mount namespace. Here it hides the platform's files — every path the
plan names is covered with an empty tmpfs (a file: with /dev/null) — optionally waits for the outbound interface or
starts the proxy relay, then replaces itself with the build command, which drops to the team's unprivileged build
user.

The relay (TRAINYARD_BUILD_NETWORK=allowlist) is a child process running as the build's user: it listens on
127.0.0.1:<port> of the namespace's loopback and hands each connection to the platform's filtering proxy, a unix
socket in a folder the plan leaves visible (images/build_proxy.py). It listens before the build command starts and
dies with it (a parent-death signal, and the build's control group).

Imports nothing of the platform but the kernel's standard-library helpers, all of them before the platform's folders
are covered: it runs before Django is configured and must stay small.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from kernel.netns import loopback_up
from kernel.proctree import die_with_parent
from kernel.relay import pump

RELAY_CONNECTIONS = 32
RELAY_IDLE_S = 120.0


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def enter(plan: dict) -> None:
    for path in plan.get("hide_dirs", []):
        if Path(path).is_dir():
            _mount("-t", "tmpfs", "-o", "size=64k,mode=0755,nosuid,nodev,noexec", "trainyard-hidden", path)
    for path in plan.get("hide_files", []):
        if Path(path).is_file():
            _mount("--bind", "/dev/null", path)
    if plan.get("resolv_conf"):
        _mount("--bind", plan["resolv_conf"], "/etc/resolv.conf")
    if plan.get("wait_for", ""):
        deadline = time.monotonic() + 10
        while f"{plan['wait_for']}:" not in Path("/proc/self/net/dev").read_text():
            if time.monotonic() > deadline:
                sys.exit("trainyard build jail: the build's network did not come up")
            time.sleep(0.02)
    if plan.get("relay"):
        start_relay(plan["relay"])


def start_relay(relay: dict) -> None:
    """Listen on 127.0.0.1:relay[port] (loopback brought up), then serve in a child that is the build's user."""
    loopback_up()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(relay["port"])))
    listener.listen(64)
    parent = os.getpid()
    if os.fork():
        listener.close()
        return
    try:
        os.setgroups([])
        os.setgid(int(relay["gid"]))
        os.setuid(int(relay["uid"]))
        die_with_parent()  # after setuid, which clears it
        if os.getppid() != parent:
            os._exit(0)
        os.chdir(relay["folder"])  # the socket by a short relative path, whatever the build root's length
        quiet = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # never hold the build's output pipe open
            os.dup2(quiet, fd)
    except OSError as exc:
        print(f"trainyard build jail: the network relay did not start: {exc}", file=sys.stderr, flush=True)
        os._exit(1)
    try:
        _relay(listener, relay["socket"])
    finally:
        os._exit(0)


def _relay(listener: socket.socket, path: str) -> None:
    slots = threading.BoundedSemaphore(RELAY_CONNECTIONS)

    def serve(client: socket.socket) -> None:
        try:
            with client, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as proxy:
                proxy.connect(path)
                pump(client, proxy, idle_s=RELAY_IDLE_S)
        except OSError:
            pass
        finally:
            slots.release()

    while True:
        client, _ = listener.accept()
        if not slots.acquire(blocking=False):
            client.close()
            continue
        threading.Thread(target=serve, args=(client,), daemon=True).start()


def main(argv: list[str]) -> int:
    plan = json.loads(argv[0])
    try:
        enter(plan)
    except subprocess.CalledProcessError as exc:
        print(f"trainyard build jail: {exc.stderr.decode(errors='replace').strip()}", file=sys.stderr)
        return 125
    except OSError as exc:
        print(f"trainyard build jail: {exc}", file=sys.stderr)
        return 125
    os.execvp(plan["argv"][0], plan["argv"])
    return 127  # not reached


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
