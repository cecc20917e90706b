"""Code snapshots: the engineer's working directory, uploaded once per content digest, as a job's working directory.

`trainyard run -- python train.py` (or a job file's `code: .`) packs a folder into a gzip'd tar (git's view of it
where it is a git work tree, so `.gitignore` holds; `.trainyardignore` patterns on top), and uploads it with
`PUT /api/v1/code/sha256:<hex>/?team=<slug>` unless `HEAD` says the team already has it. The platform checks the
digest, the sizes and every member (regular files and folders only, relative paths that stay inside), and keeps it
under `TRAINYARD_CODE_ROOT/<team>/`. A submission names it (`code: sha256:…`); the job records the digest (and so
do its reproduce record, Run again and Reproduce), and the first attempt starts with a copy of those bytes as its
working directory (a retry finds it as the earlier attempt left it, like any job's work folder). On Kubernetes a
snapshot is refused at submission for now (bake the code into a project image).
"""

from __future__ import annotations

import hashlib
import os
import re
import tarfile
import tempfile
from pathlib import Path
from typing import IO

import structlog
from django.conf import settings
from django.db import IntegrityError, transaction

from jobs.models import CodeSnapshot
from kernel.errors import NotFound, ValidationFailed
from kernel.sentences import stored
from quotas.models import Team

log = structlog.get_logger(__name__)
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}\Z")
MARKER = ".trainyard-code"  # in a job's working directory: the digest of the snapshot unpacked there


def _root() -> Path:
    return Path(settings.TRAINYARD_CODE_ROOT)


def snapshot_path(team_slug: str, digest: str) -> Path:
    return _root() / team_slug / f"{digest.removeprefix('sha256:')}.tar.gz"


def _check_digest(digest: str, field: str = "code") -> str:
    digest = (digest or "").strip().lower()
    if not DIGEST.match(digest):
        raise ValidationFailed(
            stored("a code snapshot is named by its digest, sha256:<64 hex>"), code="invalid_code", field=field
        )
    return digest


def snapshot_get(*, team: Team, digest: str) -> CodeSnapshot | None:
    return CodeSnapshot.objects.filter(team=team, digest=_check_digest(digest, "digest")).first()


def _check_members(archive: Path) -> tuple[int, int]:
    """Files and unpacked bytes of an archive whose every member is a plain file or folder at a relative path
    inside it; a 400 naming the first member that is not."""
    files = unpacked = 0
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                name = member.name
                parts = Path(name).parts
                if name.startswith("/") or ".." in parts:
                    raise ValidationFailed(
                        f"{name}: a path outside the snapshot", code="invalid_code_archive", field="body"
                    )
                if not (member.isfile() or member.isdir()):
                    raise ValidationFailed(
                        f"{name}: only files and folders travel in a snapshot (no links or devices)",
                        code="invalid_code_archive",
                        field="body",
                    )
                if member.isfile():
                    files += 1
                    unpacked += member.size
                if files > settings.TRAINYARD_CODE_MAX_FILES or unpacked > settings.TRAINYARD_CODE_MAX_UNPACKED_BYTES:
                    raise ValidationFailed(
                        f"the snapshot unpacks to more than {settings.TRAINYARD_CODE_MAX_FILES} files or "
                        f"{settings.TRAINYARD_CODE_MAX_UNPACKED_BYTES // 2**20} MiB",
                        code="code_too_large",
                        field="body",
                    )
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ValidationFailed(f"not a gzip'd tar archive ({exc})", code="invalid_code_archive", field="body") from None
    return files, unpacked


def snapshot_store(*, team: Team, digest: str, body: IO[bytes], user) -> tuple[CodeSnapshot, bool]:
    """Keep an uploaded archive as the team's snapshot `digest`; (snapshot, created). Idempotent per digest."""
    digest = _check_digest(digest, "digest")
    existing = CodeSnapshot.objects.filter(team=team, digest=digest).first()
    if existing is not None and snapshot_path(team.slug, digest).exists():
        return existing, False
    folder = _root() / team.slug
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, name = tempfile.mkstemp(dir=folder, prefix=".upload-")
    tmp = Path(name)
    try:
        hasher, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            while chunk := body.read(1 << 20):
                size += len(chunk)
                if size > settings.TRAINYARD_CODE_MAX_BYTES:
                    raise ValidationFailed(
                        f"the snapshot is over {settings.TRAINYARD_CODE_MAX_BYTES // 2**20} MiB compressed: leave "
                        "data and outputs out of it (.gitignore, .trainyardignore) and use a dataset for data",
                        code="code_too_large",
                        field="body",
                    )
                hasher.update(chunk)
                out.write(chunk)
        got = "sha256:" + hasher.hexdigest()
        if got != digest:
            raise ValidationFailed(
                f"the body's digest is {got}, not {digest}", code="code_digest_mismatch", field="body"
            )
        files, unpacked = _check_members(tmp)
        tmp.chmod(0o600)
        os.replace(tmp, snapshot_path(team.slug, digest))
    finally:
        tmp.unlink(missing_ok=True)
    try:
        with transaction.atomic():
            snapshot, created = CodeSnapshot.objects.get_or_create(
                team=team,
                digest=digest,
                defaults=dict(size_bytes=size, file_count=files, unpacked_bytes=unpacked, uploaded_by=user.username),
            )
    except IntegrityError:  # two uploads of the same bytes at once: the other one won
        snapshot, created = CodeSnapshot.objects.get(team=team, digest=digest), False
    log.info("code_snapshot_stored", team=team.slug, digest=digest, bytes=size, files=files, created=created)
    return snapshot, created


def resolve(value, *, team: Team, backend: str) -> str:
    """The `code` field of a submission: "" (none), or the digest of a snapshot the team has (400s otherwise)."""
    if value in (None, ""):
        return ""
    if not isinstance(value, str):
        raise ValidationFailed(
            stored("a code snapshot is named by its digest, sha256:<64 hex>"), code="invalid_code", field="code"
        )
    digest = _check_digest(value)
    if not CodeSnapshot.objects.filter(team=team, digest=digest).exists():
        raise ValidationFailed(
            stored(
                "team %(team)s has no code snapshot %(digest)s: upload it first (trainyard run, or PUT "
                "/api/v1/code/%(digest)s/?team=%(team)s)",
                team=team.slug,
                digest=digest,
            ),
            code="unknown_code",
            field="code",
        )
    if backend != "local":
        raise ValidationFailed(
            stored(
                "code snapshots run on the local backend only for now; on Kubernetes, build the code into a project "
                "image"
            ),
            code="code_not_supported",
            field="code",
        )
    return digest


def unpack(*, team_slug: str, digest: str, into: Path, owner: int | None = None) -> None:
    """Lay the snapshot out in `into` (a job's working directory) unless it already holds it; every file becomes
    the job's (`owner`) so the job may change its copy. Raises NotFound when the archive is gone."""
    marker = into / MARKER
    if marker.exists() and marker.read_text().strip() == digest:
        return
    archive = snapshot_path(team_slug, digest)
    if not archive.exists():
        raise NotFound(f"code snapshot {digest} is no longer kept", code="code_missing")
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(into, filter="data")
    marker.write_text(digest + "\n")
    if owner is not None:
        for dirpath, dirnames, filenames in os.walk(into):
            for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
                os.chown(name, owner, owner, follow_symlinks=False)
