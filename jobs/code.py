"""Code snapshots: the engineer's working directory, uploaded once per content digest, as a job's working directory.

`trainyard run -- python train.py` (or a job file's `code: .`) packs a folder into a gzip'd tar (git's view of it
where it is a git work tree, so `.gitignore` holds; `.trainyardignore` patterns on top), and uploads it with
`PUT /api/v1/code/sha256:<hex>/?team=<slug>` unless `HEAD` says the team already has it. The platform checks the
digest, the sizes and every member (regular files and folders only, relative paths that stay inside), and keeps it
in the object store (`code/<team>/<hex>.tar.gz`) where one is configured, the source of truth every web replica and
worker reads, with `TRAINYARD_CODE_ROOT/<team>/` on each machine a cache filled from it on a miss (without a store,
that folder is the only copy). A submission names it (`code: sha256:…`); the job records the digest (and so
do its reproduce record, Run again and Reproduce), and the first attempt starts with a copy of those bytes as its
working directory (a retry finds it as the earlier attempt left it, like any job's work folder). On Kubernetes
each pod's init container fetches it from the store (jobs/backends/code_fetch.py).
The portal makes snapshots too: from an uploaded archive or a git commit the platform fetches (re-packed as the
CLI packs a folder). Each team's snapshots count against its code quota, and an hourly task applies its retention
(`snapshots_prune`).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import stat
import subprocess
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import structlog
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max, Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from jobs.models import CodeSnapshot, Job
from jobs.states import TERMINAL
from kernel.errors import DomainError, NotFound, ValidationFailed
from kernel.sentences import stored
from quotas.models import Team

log = structlog.get_logger(__name__)
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}\Z")
UPLOAD_PREFIX = ".upload-"  # an upload being received (removed when it fails; a day-old one by the prune)
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
    """The team's snapshot `digest` when the platform still holds its bytes (in the object store, or this machine's
    cache where there is no store), else None: a client then uploads it again."""
    digest = _check_digest(digest, "digest")
    snapshot = CodeSnapshot.objects.filter(team=team, digest=digest).first()
    if snapshot is None or not _held(team.slug, digest):
        return None
    return snapshot


class CodeStoreUnavailable(DomainError):
    """The object store, where snapshots are kept, does not answer now (503, with Retry-After)."""

    code = "object_store_unavailable"
    http_status = 503


def _store():
    """(config, client) of the object store that holds every snapshot, or None where none is configured (then
    TRAINYARD_CODE_ROOT on this machine is the only copy)."""
    from jobs.checkpoints import store_config
    from kernel import objectstore

    config = store_config()
    if config is None:
        return None
    return config, objectstore.client(config, timeout_s=30.0, attempts=2)


def _unavailable(exc: BaseException) -> CodeStoreUnavailable:
    from kernel import objectstore

    return CodeStoreUnavailable(
        stored(
            "the object store that keeps code snapshots cannot be reached now (%(why)s); try again",
            why=objectstore.describe_error(exc),
        ),
        field="body",
    )


def _missing(exc: BaseException) -> bool:
    text = str(exc)
    return "404" in text or "Not Found" in text or "NoSuchKey" in text


def _held(team_slug: str, digest: str) -> bool:
    """Whether the snapshot's bytes are kept: in the store where there is one (this machine's cached copy is put
    there when the store lacks it: a snapshot from before uploads went to the store), else on this machine."""
    local = snapshot_path(team_slug, digest)
    store = _store()
    if store is None:
        return local.exists()
    config, s3 = store
    key = store_key(team_slug, digest)
    try:
        try:
            s3.head_object(Bucket=config.bucket, Key=key)
            return True
        except Exception as exc:  # noqa: BLE001 - a 404 is the usual answer; anything else is an outage
            if not _missing(exc):
                raise
        if not local.exists():
            return False
        _put(store, key, local)
        return True
    except Exception as exc:  # noqa: BLE001
        raise _unavailable(exc) from None


def _put(store, key: str, path: Path) -> None:
    from kernel import objectstore

    config, s3 = store
    objectstore.ensure_bucket(config, s3)
    s3.upload_file(str(path), config.bucket, key)


def cached(team_slug: str, digest: str) -> Path:
    """The snapshot's archive on this machine: TRAINYARD_CODE_ROOT is a cache, filled from the object store on a
    miss (the bytes checked against the digest). NotFound (`code_missing`) when the store does not have it either,
    CodeStoreUnavailable when the store does not answer."""
    path = snapshot_path(team_slug, digest)
    if path.exists():
        return path
    store = _store()
    if store is None:
        raise NotFound(f"code snapshot {digest} is no longer kept", code="code_missing")
    config, s3 = store
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=UPLOAD_PREFIX)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                s3.download_fileobj(config.bucket, store_key(team_slug, digest), out)
            except Exception as exc:  # noqa: BLE001
                if _missing(exc):
                    raise NotFound(f"code snapshot {digest} is no longer kept", code="code_missing") from None
                raise _unavailable(exc) from None
        hasher = hashlib.sha256()
        with tmp.open("rb") as f:
            while chunk := f.read(1 << 20):
                hasher.update(chunk)
        if "sha256:" + hasher.hexdigest() != digest:
            raise NotFound(f"the object store's copy of code snapshot {digest} is damaged", code="code_missing")
        tmp.chmod(0o600)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("code_snapshot_cached", team=team_slug, digest=digest)
    return path


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
    if existing is not None and _held(team.slug, digest):
        return existing, False
    _check_quota(team, digest, 1)  # already full: refused before the body is read
    folder = _root() / team.slug
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, name = tempfile.mkstemp(dir=folder, prefix=UPLOAD_PREFIX)
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
        _check_quota(team, digest, size)
        files, unpacked = _check_members(tmp)
        tmp.chmod(0o600)
        store = _store()
        if store is not None:
            # The store is where snapshots are kept (every web replica and worker reads it); this folder caches.
            try:
                _put(store, store_key(team.slug, digest), tmp)
            except Exception as exc:  # noqa: BLE001
                raise _unavailable(exc) from None
        if store is None or settings.TRAINYARD_BACKEND == "local":
            os.replace(tmp, snapshot_path(team.slug, digest))
        # else: pods fetch from the store and nothing here reads the archive again; a web replica's cache volume
        # keeps only uploads in flight.
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


def _check_quota(team: Team, digest: str, size: int) -> None:
    """A 400 `code_quota_exceeded` when `size` more bytes would take the team's snapshots past its code quota."""
    quota = team.code_quota_bytes
    if not quota:
        return
    used = CodeSnapshot.objects.filter(team=team).exclude(digest=digest).aggregate(n=Sum("size_bytes"))["n"] or 0
    if used + size <= quota:
        return
    days = team.code_retention_days
    raise ValidationFailed(
        stored(
            "team %(team)s's code snapshots use %(used)s of its %(quota)s; this one (%(size)s) does not fit. A "
            "snapshot no live job uses is removed %(days)s days after its last use; or ask an admin to raise the "
            "team's code quota",
            team=team.slug,
            used=_size(used),
            quota=_size(quota),
            size=_size(size),
            days=days or "∞",
        ),
        code="code_quota_exceeded",
        field="body",
    )


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.0f} KiB"


def snapshots_prune(*, now: datetime | None = None) -> dict[str, int]:
    """Each team's retention, level-triggered (a beat task, hourly): remove the snapshots that no live job
    (one not yet finished) uses and whose last use (uploaded, or a job naming it submitted or finished) is older
    than the team's `code_retention_days`; the archive first, then the row. A finished job's snapshot is kept as
    long as that job is within the window, so Reproduce and its job.yaml run the same bytes; past it, they get
    `unknown_code` until the same folder is uploaded again (its digest is the same). Also removes files under
    TRAINYARD_CODE_ROOT that no row names (an interrupted upload) once they are a day old."""
    now = now or timezone.now()
    live = set(Job.objects.exclude(state__in=TERMINAL).exclude(code_digest="").values_list("team_id", "code_digest"))
    last_job = {
        (r["team_id"], r["code_digest"]): r["last"]
        for r in Job.objects.exclude(code_digest="")
        .values("team_id", "code_digest")
        .annotate(last=Max(Coalesce("finished_at", "submitted_at")))
        .order_by()
    }
    report = {"removed": 0, "bytes": 0, "kept_live": 0, "orphans": 0, "store_orphans": 0}
    kept: set[tuple[str, str]] = set()
    for snapshot in CodeSnapshot.objects.select_related("team").iterator(chunk_size=2000):
        team, key = snapshot.team, (snapshot.team_id, snapshot.digest)
        last = max(filter(None, (snapshot.created_at, last_job.get(key))))
        days = team.code_retention_days
        if key in live:
            report["kept_live"] += 1
        if key in live or not days or last >= now - timedelta(days=days):
            kept.add((team.slug, snapshot.digest))
            continue
        with transaction.atomic():
            # Re-checked under the row lock: a submission naming it since the read above keeps it.
            locked = CodeSnapshot.objects.select_for_update().filter(pk=snapshot.pk).first()
            if locked is None:
                continue
            if (
                Job.objects.filter(team_id=snapshot.team_id, code_digest=snapshot.digest)
                .annotate(last=Coalesce("finished_at", "submitted_at"))
                .filter(Q(last__gte=now - timedelta(days=days)) | ~Q(state__in=TERMINAL))
                .exists()
            ):
                kept.add((team.slug, snapshot.digest))
                continue
            snapshot_path(team.slug, snapshot.digest).unlink(missing_ok=True)
            _unpublish(team.slug, snapshot.digest)
            locked.delete()
        report["removed"] += 1
        report["bytes"] += snapshot.size_bytes
        log.info("code_snapshot_removed", team=team.slug, digest=snapshot.digest, last_use=last.isoformat())
    root = _root()
    if root.is_dir():
        day_ago = now.timestamp() - 86400
        for path in root.glob("*/*"):
            digest = "sha256:" + path.name.removesuffix(".tar.gz")
            if (path.parent.name, digest) in kept or not path.is_file():
                continue
            if path.stat().st_mtime >= day_ago:
                continue
            named = CodeSnapshot.objects.filter(team__slug=path.parent.name, digest=digest).exists()
            if path.name.startswith(UPLOAD_PREFIX) or not named:
                path.unlink(missing_ok=True)
                report["orphans"] += 1
    report["store_orphans"] = _prune_store(now)
    return report


def _prune_store(now: datetime) -> int:
    """Remove the store's copies that no snapshot row names once they are a day old (an upload whose row was
    never written: the process died between the two), so the store holds what the quota counts. A store that
    does not answer is logged and tried again on the next pass."""
    store = _store()
    if store is None:
        return 0
    config, s3 = store
    named = set(CodeSnapshot.objects.values_list("team__slug", "digest"))
    removed = 0
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=config.bucket, Prefix="code/"):
            for item in page.get("Contents", []):
                parts = item["Key"].split("/")
                if len(parts) != 3 or not parts[2].endswith(".tar.gz"):
                    continue
                digest = "sha256:" + parts[2].removesuffix(".tar.gz")
                if (parts[1], digest) in named or item["LastModified"] >= now - timedelta(days=1):
                    continue
                if CodeSnapshot.objects.filter(team__slug=parts[1], digest=digest).exists():
                    continue  # uploaded since the list above was read
                s3.delete_object(Bucket=config.bucket, Key=item["Key"])
                removed += 1
                log.info("code_snapshot_orphan_removed", key=item["Key"])
    except Exception as exc:  # noqa: BLE001
        if not _missing(exc):  # no bucket yet: nothing to remove
            log.warning("code_snapshot_store_prune_failed", error=str(exc)[:200])
    return removed


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
        _publish(team.slug, digest)
    return digest


def _unpublish(team_slug: str, digest: str) -> None:
    """Remove the snapshot's copy in the object store, where there is a store (a failure is logged: a stale copy
    costs bytes, never a wrong run, since pods check the digest)."""
    from jobs.checkpoints import store_config
    from kernel import objectstore

    config = store_config()
    if config is None:
        return
    try:
        objectstore.client(config).delete_object(Bucket=config.bucket, Key=store_key(team_slug, digest))
    except Exception as exc:  # noqa: BLE001
        log.warning("code_snapshot_unpublish_failed", team=team_slug, digest=digest, error=str(exc)[:200])


def store_key(team_slug: str, digest: str) -> str:
    """Where a snapshot lies in the object store for the pods of a Kubernetes job (jobs/backends/code_fetch.py)."""
    return f"code/{team_slug}/{digest.removeprefix('sha256:')}.tar.gz"


def code_description(*, team_slug: str, digest: str) -> dict[str, str]:
    """What an attempt's backend needs of its code snapshot: the team's folder (local) or the store key (pods)."""
    return {"team": team_slug, "digest": digest, "key": store_key(team_slug, digest)}


def _publish(team_slug: str, digest: str) -> None:
    """Make sure the object store holds the snapshot a Kubernetes job will fetch (uploaded once per digest); a 400
    `code_not_supported` without a store, `object_store_unavailable` when the store cannot take it now."""
    from jobs.checkpoints import store_config
    from kernel import objectstore

    config = store_config()
    if config is None:
        raise ValidationFailed(
            stored(
                "on Kubernetes a job's code reaches its pods through the object store, and this platform has none "
                "(TRAINYARD_S3_URL): build the code into a project image"
            ),
            code="code_not_supported",
            field="code",
        )
    key = store_key(team_slug, digest)
    try:
        s3 = objectstore.client(config)
        try:
            s3.head_object(Bucket=config.bucket, Key=key)
            return
        except Exception as exc:  # noqa: BLE001 - a 404 is the usual answer; anything else shows on the put
            if "404" not in str(exc) and "Not Found" not in str(exc) and "NoSuchKey" not in str(exc):
                raise
        local = snapshot_path(team_slug, digest)
        if not local.exists():  # neither the store nor this machine has it: gone, upload it again
            raise ValidationFailed(
                stored(
                    "code snapshot %(digest)s is no longer kept: upload it again (trainyard run, or PUT "
                    "/api/v1/code/%(digest)s/?team=%(team)s)",
                    digest=digest,
                    team=team_slug,
                ),
                code="unknown_code",
                field="code",
            )
        objectstore.ensure_bucket(config, s3)
        s3.upload_file(str(local), config.bucket, key)
    except ValidationFailed:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ValidationFailed(
            stored(
                "the object store cannot take the code snapshot now (%(why)s); try again",
                why=objectstore.describe_error(exc),
            ),
            code="object_store_unavailable",
            field="code",
        ) from None
    log.info("code_snapshot_published", team=team_slug, digest=digest, key=key)


def unpack(*, team_slug: str, digest: str, into: Path, owner: int | None = None) -> None:
    """Lay the snapshot out in `into` (a job's working directory) unless it already holds it; every file becomes
    the job's (`owner`) so the job may change its copy. Raises NotFound when the archive is gone."""
    marker = into / MARKER
    if marker.exists() and marker.read_text().strip() == digest:
        return
    archive = cached(team_slug, digest)
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:gz") as tar:
        tar.extractall(into, filter="data")
    marker.write_text(digest + "\n")
    if owner is not None:
        for dirpath, dirnames, filenames in os.walk(into):
            for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
                os.chown(name, owner, owner, follow_symlinks=False)


# ------------------------------------------------------------------ snapshots made by the platform (the portal)

GIT_SCHEMES = ("https", "ssh")


def _bad_archive(message: str) -> ValidationFailed:
    return ValidationFailed(message, code="invalid_code_archive", field="code")


def _entries_of_tar(tar: tarfile.TarFile) -> Iterator[tuple[str, bytes, bool]]:
    for member in tar:
        if member.isdir() or member.name in ("pax_global_header",) or member.type == tarfile.XGLTYPE:
            continue
        if not member.isfile():
            raise _bad_archive(f"{member.name}: only files and folders travel in a snapshot (no links or devices)")
        f = tar.extractfile(member)
        yield member.name, f.read() if f is not None else b"", bool(member.mode & 0o111)


def _entries_of_zip(path: Path) -> Iterator[tuple[str, bytes, bool]]:
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            if info.is_dir():
                continue
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise _bad_archive(f"{info.filename}: only files and folders travel in a snapshot (no links)")
            yield info.filename, z.read(info), bool(mode & 0o111)


def _pack(entries: Iterable[tuple[str, bytes, bool]]) -> bytes:
    """A reproducible gzip'd tar of (relative path, bytes, executable), as the CLI packs a folder (sorted names,
    no owners or times), so the same files give the same digest however they came. One top-level folder that
    holds everything (an archive of `my-experiment/`, a git hosting service's download) is stripped."""
    files: dict[str, tuple[bytes, bool]] = {}
    unpacked = 0
    for name, data, executable in entries:
        rel = name.replace("\\", "/").removeprefix("./")
        parts = Path(rel).parts
        if not rel or rel.startswith("/") or ".." in parts:
            raise _bad_archive(f"{name}: a path outside the snapshot")
        files[str(Path(*parts))] = (data, executable)
        unpacked += len(data)
        if len(files) > settings.TRAINYARD_CODE_MAX_FILES or unpacked > settings.TRAINYARD_CODE_MAX_UNPACKED_BYTES:
            raise ValidationFailed(
                f"the code is over {settings.TRAINYARD_CODE_MAX_FILES} files or "
                f"{settings.TRAINYARD_CODE_MAX_UNPACKED_BYTES // 2**20} MiB unpacked",
                code="code_too_large",
                field="code",
            )
    if not files:
        raise _bad_archive("the archive holds no file")
    tops = {Path(n).parts[0] for n in files}
    if len(tops) == 1 and all(len(Path(n).parts) > 1 for n in files):
        files = {str(Path(*Path(n).parts[1:])): v for n, v in files.items()}
    buffer = io.BytesIO()
    gz = gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0)
    with gz, tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            data, executable = files[name]
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755 if executable else 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _store_packed(team: Team, data: bytes, user) -> CodeSnapshot:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    snapshot, _created = snapshot_store(team=team, digest=digest, body=io.BytesIO(data), user=user)
    return snapshot


def snapshot_from_archive(*, team: Team, upload: IO[bytes], filename: str, user) -> CodeSnapshot:
    """A code snapshot from an archive uploaded on the portal (.zip, .tar, .tar.gz or .tgz), re-packed the way
    the CLI packs a folder; every member checked (plain files at relative paths inside), the limits and the
    team's code quota applied as for any upload."""
    lower = (filename or "").lower()
    if not lower.endswith((".zip", ".tar", ".tar.gz", ".tgz")):
        raise ValidationFailed(
            stored("a code archive is a .zip, .tar, .tar.gz or .tgz file; %(name)s is none of them", name=filename),
            code="invalid_code_archive",
            field="code",
        )
    with tempfile.TemporaryDirectory(prefix="trainyard-code-") as tmp:
        path = Path(tmp) / "upload"
        size = 0
        with path.open("wb") as out:
            while chunk := upload.read(1 << 20):
                size += len(chunk)
                if size > settings.TRAINYARD_CODE_MAX_BYTES:
                    raise ValidationFailed(
                        f"the archive is over {settings.TRAINYARD_CODE_MAX_BYTES // 2**20} MiB",
                        code="code_too_large",
                        field="code",
                    )
                out.write(chunk)
        try:
            if lower.endswith(".zip"):
                data = _pack(_entries_of_zip(path))
            else:
                with tarfile.open(path, "r:*") as tar:
                    data = _pack(_entries_of_tar(tar))
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
            raise _bad_archive(f"{filename} cannot be read as an archive: {exc}")
    return _store_packed(team, data, user)


def _git_url_ok(url: str) -> str:
    url = (url or "").strip()
    scp_like = re.match(r"^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^/]", url) is not None  # git@host:owner/repo
    scheme = "ssh" if scp_like else urlsplit(url).scheme.lower()
    allowed = GIT_SCHEMES + (("file",) if settings.TRAINYARD_CODE_GIT_ALLOW_FILE else ())
    if url.startswith("-") or scheme not in allowed:
        raise ValidationFailed(
            stored(
                "the platform fetches git repositories over %(schemes)s only; %(url)s is not one",
                schemes=", ".join(f"{s}://" for s in allowed),
                url=_redacted(url) or "''",
            ),
            code="code_git_scheme",
            field="code_git_url",
        )
    return url


def _redacted(url: str) -> str:
    """The URL without a password or token in it (they must not reach messages or logs)."""
    return re.sub(r"//[^/@\s]*@", "//***@", url)


def _git(args: list[str], *, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/false",
        "GIT_SSH_COMMAND": "ssh -o BatchMode=yes -o StrictHostKeyChecking=accept-new",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    file_ok = "always" if settings.TRAINYARD_CODE_GIT_ALLOW_FILE else "never"
    return subprocess.run(
        ["git", "-c", f"protocol.file.allow={file_ok}", "-c", "protocol.ext.allow=never", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def snapshot_from_git(*, team: Team, url: str, commit: str, user) -> tuple[CodeSnapshot, str]:
    """A code snapshot of one commit of a git repository, fetched by the platform (never by the job, which keeps
    no network): (snapshot, the commit's full id). https and ssh; file:// only where TRAINYARD_CODE_GIT_ALLOW_FILE."""
    url = _git_url_ok(url)
    commit = (commit or "").strip()
    if not re.fullmatch(r"[0-9a-fA-F]{7,40}|[A-Za-z0-9._/][A-Za-z0-9._/-]{0,199}", commit) or ".." in commit:
        raise ValidationFailed(
            stored("name the commit to run (its id, or a branch or tag)"),
            code="code_git_commit",
            field="code_git_commit",
        )
    timeout = settings.TRAINYARD_CODE_GIT_TIMEOUT_S
    with tempfile.TemporaryDirectory(prefix="trainyard-git-") as tmp:
        repo = Path(tmp) / "repo.git"
        try:
            cloned = _git(["clone", "--bare", "--quiet", "--", url, str(repo)], cwd=Path(tmp), timeout=timeout)
            if cloned.returncode != 0:
                why = cloned.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no answer"]
                raise ValidationFailed(
                    stored("the platform could not fetch %(url)s: %(why)s", url=_redacted(url), why=_redacted(why[0])),
                    code="code_git_unreachable",
                    field="code_git_url",
                )
            found = _git(["rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], cwd=repo, timeout=timeout)
            if found.returncode != 0:
                raise ValidationFailed(
                    stored("%(url)s has no commit %(commit)s", url=_redacted(url), commit=commit),
                    code="code_git_unknown_commit",
                    field="code_git_commit",
                )
            sha = found.stdout.decode().strip()
            archived = _git(["archive", "--format=tar", sha], cwd=repo, timeout=timeout)
            if archived.returncode != 0:
                raise _bad_archive(archived.stderr.decode("utf-8", "replace").strip()[-300:])
        except subprocess.TimeoutExpired:
            raise ValidationFailed(
                stored("fetching %(url)s took more than %(n)s s", url=_redacted(url), n=timeout),
                code="code_git_unreachable",
                field="code_git_url",
            )
        with tarfile.open(fileobj=io.BytesIO(archived.stdout), mode="r:") as tar:
            data = _pack(_entries_of_tar(tar))
    log.info("code_snapshot_from_git", team=team.slug, url=_redacted(url), commit=sha)
    return _store_packed(team, data, user), sha
