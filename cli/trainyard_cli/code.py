"""Packing a folder as a code snapshot for `trainyard run` and a job file's `code:` (the server side: jobs/code.py).

What goes in: inside a git work tree, what git would keep (`git ls-files --cached --others --exclude-standard`,
so `.gitignore` holds); elsewhere every file but the usual clutter (`.git`, `__pycache__`, virtualenvs,
`node_modules`) and what the folder's `.gitignore` files ignore (read here, in git's syntax, without git); in both,
less what `.trainyardignore` names (the same syntax). Symbolic links are left out (said on stderr). The archive is
reproducible: sorted names, no owners, no times, so the same files give the same digest and are uploaded once.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
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


class Patterns:
    """One ignore file's rules, in git's `.gitignore` syntax: globs (`*`, `?`, `[a-z]`) that do not cross `/`,
    `**` for any number of folders (`**/x`, `x/**`, `a/**/b`), a trailing `/` for folders only, a `/` at the start
    or in the middle anchoring the pattern at the file's folder (otherwise it matches at any depth), `!` to take
    a path back, `#` comments, `\\` to escape. The last rule that matches a path decides."""

    def __init__(self, lines: list[str]) -> None:
        self.rules: list[tuple[re.Pattern[str], bool, bool]] = []  # (regex, negated, folders only)
        for line in lines:
            rule = _rule(line)
            if rule is not None:
                self.rules.append(rule)

    @classmethod
    def read(cls, path: Path) -> Patterns | None:
        try:
            return cls(path.read_text(encoding="utf-8", errors="surrogateescape").splitlines())
        except OSError:
            return None

    def decides(self, rel: str, is_dir: bool) -> bool | None:
        """True (ignored), False (taken back by a `!` rule) or None (no rule names it) for a path relative to the
        ignore file's folder."""
        decision = None
        for regex, negated, folders_only in self.rules:
            if folders_only and not is_dir:
                continue
            if regex.fullmatch(rel):
                decision = not negated
        return decision


def _rule(line: str) -> tuple[re.Pattern[str], bool, bool] | None:
    if not line or line.startswith("#"):
        return None
    # Trailing spaces go unless escaped ("a\\ " keeps its space).
    while line.endswith(" ") and not line.endswith("\\ "):
        line = line[:-1]
    if line.endswith("\\ "):
        line = line[:-2] + " "
    negated = line.startswith("!")
    if negated or line.startswith(("\\!", "\\#")):
        line = line[1:]
    folders_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    segments = line.lstrip("/").split("/")
    regex = ""
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "**":
            regex += ".*" if last else "(?:.*/)?"
        else:
            regex += _glob(segment) + ("" if last else "/")
    if not anchored:
        regex = "(?:.*/)?" + regex
    return re.compile(regex, re.DOTALL), negated, folders_only


def _glob(segment: str) -> str:
    """One path segment of a pattern as a regular expression (nothing in it matches a `/`)."""
    out, i = [], 0
    while i < len(segment):
        c = segment[i]
        if c == "\\" and i + 1 < len(segment):
            out.append(re.escape(segment[i + 1]))
            i += 2
            continue
        if c == "*":
            while i + 1 < len(segment) and segment[i + 1] == "*":
                i += 1  # "**" inside a segment is one "*"
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = segment.find("]", i + 2 if segment[i + 1 : i + 2] in ("!", "^", "]") else i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = segment[i + 1 : end]
                if body[:1] in ("!", "^"):
                    body = "^" + body[1:]
                out.append("(?!/)[" + body.replace("\\", "\\\\") + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _decide(layers: list[tuple[str, Patterns]], rel: str, is_dir: bool) -> bool:
    """Whether `rel` is ignored by the ignore files that apply to it, the deepest folder's having the last word."""
    decision = None
    for base, patterns in layers:
        if base and not rel.startswith(base + "/"):
            continue
        said = patterns.decides(rel[len(base) + 1 :] if base else rel, is_dir)
        if said is not None:
            decision = said
    return bool(decision)


def _walk(folder: Path) -> list[str]:
    """Every file outside a git work tree, less the clutter and what the `.gitignore` files (the folder's and any
    below it, each for its own folder) ignore; a folder they ignore is not entered, as git does."""
    out = []
    layers: list[tuple[str, Patterns]] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        here = os.path.relpath(dirpath, folder)
        here = "" if here == "." else here.replace(os.sep, "/")
        if ".gitignore" in filenames and (found := Patterns.read(Path(dirpath) / ".gitignore")) is not None:
            layers.append((here, found))
        prefix = here + "/" if here else ""
        dirnames[:] = sorted(
            d for d in dirnames if d not in CLUTTER and not _decide(layers, prefix + d, Path(dirpath, d).is_dir())
        )
        for name in filenames:
            if name.endswith((".pyc", ".pyo")) or _decide(layers, prefix + name, False):
                continue
            out.append(prefix + name)
    return out


def _ignored(rel: str, patterns: Patterns) -> bool:
    """Whether `.trainyardignore` leaves out `rel`: the file itself, or a folder it lies in."""
    parts = rel.split("/")
    layer = [("", patterns)]
    return any(_decide(layer, "/".join(parts[:i]), True) for i in range(1, len(parts))) or _decide(layer, rel, False)


def files_of(folder: Path) -> list[str]:
    """The relative paths that travel, sorted."""
    listed = _git_files(folder)
    names = listed if listed is not None else _walk(folder)
    patterns = Patterns.read(folder / ".trainyardignore") if (folder / ".trainyardignore").is_file() else None
    if patterns is None:
        return sorted(names)
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
