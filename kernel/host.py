"""The host machine: system users the platform runs things as, files only their owner may read."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path


def platform_scope() -> str:
    """Eight hex digits naming this platform among others on the same machine: a digest of the database that hands
    out its job and build ids. Two platforms on one host (a `make run` beside a test run, two test workers, two CI
    lanes) count their ids from 1 each; the names they give host-wide things (control groups, process tags, a
    build's local image tag) carry this scope, so neither can take, reuse or kill what the other made."""
    import hashlib

    from django.db import connections

    db = connections["default"].settings_dict
    key = f"{db.get('HOST') or ''}:{db.get('PORT') or ''}/{db.get('NAME') or ''}"
    return hashlib.sha256(key.encode()).hexdigest()[:8]


class ServiceError(RuntimeError):
    """A problem with a one-line explanation and what to do about it."""


def private_file(path: Path, text: str) -> None:
    """Write a file only its owner may read, with no moment where it is readable by others."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def system_user(name: str):
    """The passwd entry of a system user the platform runs something as (made once, no home, no login shell);
    ServiceError when it must be made and `useradd` is missing."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        useradd = shutil.which("useradd")
        if not useradd:
            raise ServiceError(f"running as root needs the system user {name}, and 'useradd' is missing") from None
        subprocess.run([useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                       capture_output=True)  # fmt: skip
        return pwd.getpwnam(name)
