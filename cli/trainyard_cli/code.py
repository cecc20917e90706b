"""Packing a folder as a code snapshot for `trainyard run` and a job file's `code:` (the server side: jobs/code.py).

What goes in: inside a git work tree, what git would keep (`git ls-files --cached --others --exclude-standard`,
so `.gitignore` holds); elsewhere every file but the usual clutter (`.git`, `__pycache__`, virtualenvs,
`node_modules`); in both, less what `.trainyardignore` names (one glob per line, `#` comments, a trailing `/` for
folders). Symbolic links are left out (said on stderr). The archive is reproducible: sorted names, no owners, no
times, so the same files give the same digest and are uploaded once.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from .client import ApiError
from .errors import EXIT_USAGE, CliError

CLUTTER = {".git", "__pycache__", ".venv", "venv", "node_modules", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
MAX_BYTES = 100 * 2**20  # the server's default limit (TRAINYARD_CODE_MAX_BYTES); it has the last word


def _git_files(folder: Path) -> list[str] | None:
    try:
        inside = subprocess.run(["git", "-C", str(folder), "rev-parse", "--is-inside-work-tree"], capture_output=True,
                                text=True, timeout=30)  # fmt: skip
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        listed = subprocess.run(["git", "-C", str(folder), "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard", "--", "."], capture_output=True, timeout=60)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    if listed.returncode != 0:
        return None
    return [p for p in listed.stdout.decode("utf-8", "surrogateescape").split("\0") if p]


def _walk(folder: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d not in CLUTTER)
        for name in filenames:
            if not name.endswith((".pyc", ".pyo")):
                out.append(os.path.relpath(os.path.join(dirpath, name), folder))
    return out


def _ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    for pattern in patterns:
        folder_only = pattern.endswith("/")
        pat = pattern.rstrip("/")
        if "/" in pat:
            if fnmatch.fnmatch(rel, pat.lstrip("/")) or fnmatch.fnmatch(rel, pat.lstrip("/") + "/*"):
                return True
            continue
        candidates = parts[:-1] if folder_only else parts
        if any(fnmatch.fnmatch(part, pat) for part in candidates):
            return True
    return False


def files_of(folder: Path) -> list[str]:
    """The relative paths that travel, sorted."""
    listed = _git_files(folder)
    names = listed if listed is not None else _walk(folder)
    patterns: list[str] = []
    ignore = folder / ".trainyardignore"
    if ignore.is_file():
        patterns = [ln.strip() for ln in ignore.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return sorted(n for n in names if not _ignored(n, patterns))


def pack(folder: Path, *, max_bytes: int = MAX_BYTES) -> tuple[bytes, str, int]:
    """(archive, "sha256:…", file count) of a folder; a usage error when it is missing, empty or too large."""
    if not folder.is_dir():
        raise CliError(f"code folder {folder} does not exist", EXIT_USAGE)
    buffer = io.BytesIO()
    count = 0
    gz = gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0)
    with gz, tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in files_of(folder):
            path = folder / rel
            if path.is_symlink():
                print(f"trainyard: left out {rel}: a symbolic link", file=sys.stderr)
                continue
            if not path.is_file():
                continue  # listed by git but deleted since
            info = tarfile.TarInfo(rel)
            info.size = path.stat().st_size
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.mtime = 0
            with path.open("rb") as f:
                tar.addfile(info, f)
            count += 1
            if buffer.tell() > max_bytes:
                raise CliError(
                    f"{folder} packs to more than {max_bytes // 2**20} MiB: leave data and outputs out "
                    "(.gitignore or .trainyardignore) and register data as a dataset",
                    EXIT_USAGE,
                )
    data = buffer.getvalue()
    if count == 0:
        raise CliError(f"{folder} has no file to send (everything is ignored?)", EXIT_USAGE)
    return data, "sha256:" + hashlib.sha256(data).hexdigest(), count


def upload(api, folder: Path, *, team: str) -> str:
    """Pack `folder` and make sure the team has the snapshot on the server; returns its digest."""
    data, digest, count = pack(folder)
    try:
        api.request("GET", f"/code/{digest}/", params={"team": team})
        print(f"trainyard: code {digest[:19]} ({count} files) is already on the server", file=sys.stderr)
        return digest
    except ApiError as exc:
        if exc.status != 404 or exc.code != "unknown_code":
            raise
    api.request("PUT", f"/code/{digest}/", params={"team": team}, content=data,
                headers={"Content-Type": "application/gzip"})  # fmt: skip
    print(f"trainyard: uploaded code {digest[:19]} ({count} files, {len(data) / 1024:.0f} KiB)", file=sys.stderr)
    return digest
