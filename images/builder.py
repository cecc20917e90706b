"""Who an image build runs as on the platform's own machine, and the jail around it.

A build is a tenant like a job: its RUN steps execute whatever a team member wrote. When the platform runs as root
each team builds as a system user of its own (`trainyard-b<team id>`; base images as `trainyard-bbase`), with
subordinate uid/gid ranges of its own, in rootless podman (`--isolation chroot` inside a user namespace that user
owns), with storage of its own (`<TRAINYARD_BUILD_ROOT>/rootless/<who>/`, mode 0700). So a step that escapes the
chroot is that unprivileged user on the host, never root, and reads neither the platform's files nor another team's
layers. The `podman build` itself runs in a jail (images/build_jail.py): a network namespace of its own (no network
by default; `TRAINYARD_BUILD_NETWORK=allowlist` gives it a loopback with a relay to the platform's filtering proxy,
so the hosts of TRAINYARD_BUILD_ALLOWED_HOSTS and nothing else, images/build_proxy.py; `outbound` gives it slirp4netns
without the host's loopback, so any internet host but no platform service) and a mount namespace in which the
platform's folders, every other team's storage and every other build's context are covered. Pulls of the (checked)
base images and the push to the platform registry run outside the jail, as the same user, before and after it.

When the platform does not run as root, podman is already rootless as that user; the jail needs root, so builds run
as the platform's user with its network (docs/images.md says so).
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from kernel.host import ServiceError, system_user
from kernel.paths import BASE_DIR, VAR_DIR

SUBID_BASE = 300_000  # first subordinate id handed to build users; each gets SUBID_COUNT of them
SUBID_COUNT = 65_536


class BuilderUnavailable(Exception):
    """The machine lacks what an isolated build needs; the message says what to install."""


def short_run_root(root: Path) -> Path:
    """podman refuses a run root longer than 50 characters: a short one in /tmp named after the storage `root`.
    Never under $TMPDIR: podman's storage records its run root and refuses another one later ('database
    configuration mismatch' after a restart with another TMPDIR), and a build user may not write in a private one."""
    return Path("/tmp") / f"trainyard-podman-{hashlib.sha256(str(root).encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class Builder:
    """The identity and storage one build runs with."""

    name: str  # system user, or "" when builds run as the platform's own user
    uid: int
    gid: int
    root: Path  # podman --root parent (storage/ under it), home/ and tmp/ beside it

    @property
    def isolated(self) -> bool:
        return bool(self.name)

    @property
    def runroot(self) -> Path:
        return short_run_root(self.root)

    def podman(self, *args: str, env: dict[str, str] | None = None) -> list[str]:
        """A podman command as this builder; `env` is added to its environment (an isolated builder's alone)."""
        base = ["podman", "--root", str(self.root / "storage"), "--runroot", str(self.runroot), *args]
        if not self.isolated:
            return base
        own = [f"HOME={self.root / 'home'}", f"XDG_RUNTIME_DIR={self.runroot}", f"TMPDIR={self.root / 'tmp'}"]
        own += [f"{name}={value}" for name, value in (env or {}).items()]
        return ["runuser", "-u", self.name, "--", "env", "-i", f"PATH={os.environ.get('PATH', '')}", *own, *base]


def _slot(who: str) -> int:
    return 0 if who == "base" else int(who)


def _ensure_user(name: str, slot: int) -> pwd.struct_passwd:
    try:
        entry = system_user(name)
    except ServiceError as exc:
        raise BuilderUnavailable(str(exc)) from None
    first = SUBID_BASE + slot * SUBID_COUNT
    for table, flag in (("/etc/subuid", "--add-subuids"), ("/etc/subgid", "--add-subgids")):
        try:
            lines = Path(table).read_text().splitlines()
        except FileNotFoundError:
            lines = []
        if not any(line.split(":")[0] == name for line in lines):
            subprocess.run(["usermod", flag, f"{first}-{first + SUBID_COUNT - 1}", name], check=True,
                           capture_output=True)  # fmt: skip
    return entry


def _traversable(path: Path) -> None:
    """Let other users pass through (not list) every folder above `path`, as PostgreSQL's data folder needs too."""
    p = path
    while p != p.parent:
        p = p.parent
        mode = p.stat().st_mode
        if mode & 0o001 == 0:
            p.chmod(mode | 0o001)


def builder_for(who: str) -> Builder:
    """The builder of a team (its id as text) or of the base images ("base")."""
    root = Path(settings.TRAINYARD_BUILD_ROOT)
    if os.geteuid() != 0:
        return Builder(name="", uid=os.getuid(), gid=os.getgid(), root=root)
    for tool in ("newuidmap", "newgidmap"):
        if shutil.which(tool) is None:
            raise BuilderUnavailable(
                f"image builds run rootless as a user of their own and need {tool}: run 'apt-get install uidmap'"
            )
    name = f"trainyard-b{who}"
    entry = _ensure_user(name, _slot(who))
    home = root / "rootless" / who
    for folder in (home, home / "home", home / "tmp", home / "storage"):
        folder.mkdir(parents=True, exist_ok=True)
        if folder.stat().st_uid != entry.pw_uid:
            os.chown(folder, entry.pw_uid, entry.pw_gid)
    home.chmod(0o700)
    (root / "rootless").chmod(0o711)
    _traversable(home)
    builder = Builder(name=name, uid=entry.pw_uid, gid=entry.pw_gid, root=home)
    # Made here, the build user's own (a run root another user made first would refuse it).
    run = builder.runroot
    run.mkdir(mode=0o700, exist_ok=True)
    if run.stat().st_uid != entry.pw_uid:
        os.chown(run, entry.pw_uid, entry.pw_gid)
    _traversable(run)
    return builder


def context_dir(builder: Builder, build_id: int) -> Path:
    """A fresh build context only this build's user can read."""
    parent = Path(settings.TRAINYARD_BUILD_ROOT) / "contexts"
    parent.mkdir(parents=True, exist_ok=True)
    parent.chmod(0o711)
    context = Path(tempfile.mkdtemp(prefix=f"build-{build_id}-", dir=parent))
    if builder.isolated:
        _traversable(context)
    return context


def give(builder: Builder, path: Path) -> None:
    """Hand a context (every file in it) to the build's user."""
    if not builder.isolated:
        return
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.chown(name, builder.uid, builder.gid)


def _hidden(tops: list[Path], keep: list[Path]) -> tuple[list[str], list[str]]:
    """Folders and files to cover so that of `tops` only the `keep` paths (and the folders above them) remain."""
    keep = [k.resolve() for k in keep]
    dirs: list[str] = []
    files: list[str] = []

    def visit(path: Path) -> None:
        try:
            real = path.resolve()
        except OSError:
            return
        if any(k == real for k in keep):
            return
        if not any(real in k.parents for k in keep):
            if real.is_dir():
                dirs.append(str(real))
            elif real.is_file():
                files.append(str(real))
            return
        try:
            children = sorted(real.iterdir())
        except OSError:
            return
        for child in children:
            visit(child)

    seen: set[Path] = set()
    for top in tops:
        if top.exists() and top.resolve() not in seen:
            seen.add(top.resolve())
            visit(top)
    return sorted(set(dirs)), sorted(set(files))


def jailed(
    builder: Builder, argv: list[str], *, context: Path, resolv_conf: str | None = None, relay: dict | None = None
) -> list[str]:
    """`argv` (a podman build) inside the build jail; unchanged when builds cannot be isolated (not root). `relay`
    (`folder`, `socket`, `port`): the jail's loopback relays that port to the unix socket in that folder, which stays
    visible (images/build_jail.py)."""
    if not builder.isolated:
        return argv
    tops = [
        BASE_DIR,
        VAR_DIR,
        Path(settings.TRAINYARD_BUILD_ROOT),
        Path(settings.TRAINYARD_WORK_ROOT),
        Path(settings.TRAINYARD_STATE_ROOT),
        Path(settings.TRAINYARD_LOG_ROOT),
        Path(settings.TRAINYARD_DATASET_CACHE_DIR),
        Path("/root"),
        Path("/home"),
    ]
    keep = [builder.root, context, *([Path(relay["folder"])] if relay else [])]
    dirs, files = _hidden(tops, keep=keep)
    plan = {
        "hide_dirs": dirs,
        "hide_files": files,
        "resolv_conf": resolv_conf,
        "wait_for": "tap0" if settings.TRAINYARD_BUILD_NETWORK == "outbound" else "",
        "relay": {**relay, "uid": builder.uid, "gid": builder.gid} if relay else None,
        "argv": argv,
    }
    return [
        "unshare", "--net", "--mount", "--propagation", "private", "--fork", "--",
        sys.executable, "-m", "images.build_jail", json.dumps(plan),
    ]  # fmt: skip
