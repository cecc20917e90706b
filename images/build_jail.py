"""The jail an image build runs in on the platform's own machine (see images/builder.py).

Started by the platform (as root) under `unshare --net --mount --propagation private --fork`, so this process is
already in a network namespace of its own (no interface but a loopback that is down, unless the platform attached
an outbound-only network to it) and a private mount namespace. Here it hides the platform's files — every path the
plan names is covered with an empty tmpfs (a file: with /dev/null) — optionally waits for the outbound interface,
then replaces itself with the build command, which drops to the team's unprivileged build user.

Imports nothing of the platform: it runs before Django is configured and must stay small.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


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


def main(argv: list[str]) -> int:
    plan = json.loads(argv[0])
    try:
        enter(plan)
    except subprocess.CalledProcessError as exc:
        print(f"trainyard build jail: {exc.stderr.decode(errors='replace').strip()}", file=sys.stderr)
        return 125
    os.execvp(plan["argv"][0], plan["argv"])
    return 127  # not reached


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
