"""Checkpoints on the object store: where an attempt's go, what a resumed attempt gets back, and their records.

The uploads themselves run beside the job (jobs/backends/checkpoint_sync.py, in the local supervisor); they report
in the attempt's manifest, which the observer hands to `checkpoints_record` here. Keys are
`<team>/<job>/attempt-<n>/<path in the checkpoint folder>` in the bucket `TRAINYARD_S3_BUCKET`.

A checkpoint is one top-level file or folder of the checkpoint folder (`ckpt-100.pt`, or `step-100/` holding a
model and an optimizer file). It is recorded once all of its files are uploaded and verified; its step is the last
number in its name. The latest complete checkpoint is the one with the highest step (the newest, for names without
a number).
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Any

import structlog
from django.conf import settings
from django.db.models import F, Q

from jobs.models import Attempt, Checkpoint, Job, JobEvent
from kernel import objectstore
from kernel.sentences import stored

log = structlog.get_logger(__name__)
STEP = re.compile(r"(\d+)")


def store_config() -> objectstore.S3Config | None:
    """The object store checkpoints go to, or None when none is configured (checkpoints then stay local)."""
    if not settings.TRAINYARD_S3_URL:
        return None
    return objectstore.S3Config(
        url=settings.TRAINYARD_S3_URL.rstrip("/"),
        bucket=settings.TRAINYARD_S3_BUCKET,
        region=settings.TRAINYARD_S3_REGION,
        access_key_id=settings.TRAINYARD_S3_ACCESS_KEY_ID,
        secret_access_key=settings.TRAINYARD_S3_SECRET_ACCESS_KEY,
    )


def attempt_prefix(*, team_slug: str, job_id, number: int) -> str:
    return f"{team_slug}/{job_id}/attempt-{number}/"


def step_of(name: str) -> int | None:
    numbers = STEP.findall(name)
    return int(numbers[-1]) if numbers else None


# A job's checkpoints, the one a resume takes first: highest step, then newest.
RESUME_ORDER = (F("step").desc(nulls_last=True), "-saved_at", "-id")


def latest(job_id) -> Checkpoint | None:
    """The checkpoint a resumed attempt starts from: highest step, then newest."""
    return Checkpoint.objects.filter(job_id=job_id, deleted_at__isnull=True).order_by(*RESUME_ORDER).first()


def resume_source(job: Job, attempt_number: int) -> Checkpoint | None:
    """A retried attempt resumes from the job's own latest checkpoint; a first attempt (or one whose job saved
    none yet) from the job it names in `resume_from`."""
    own = latest(job.id) if attempt_number > 1 else None
    if own is not None:
        return own
    if job.resume_from_id:
        return latest(job.resume_from_id)
    return None


def restore_plan(checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "name": checkpoint.name,
        "job": str(checkpoint.job_id),
        "attempt": checkpoint.attempt.number,
        "checkpoint_id": checkpoint.id,
        "files": [
            {"path": f["path"], "key": f["key"], "sha256": f["sha256"], "size": f["size"]} for f in checkpoint.files
        ],
    }


def attempt_plan(attempt: Attempt) -> dict[str, Any]:
    """What the backend needs for the attempt's checkpoints: the key prefix, and the checkpoint to restore."""
    job = attempt.job
    source = resume_source(job, attempt.number)
    return {
        "prefix": attempt_prefix(team_slug=job.team.slug, job_id=job.id, number=attempt.number),
        "restore": restore_plan(source) if source is not None else None,
    }


def _entry(path: str) -> str:
    return path.split("/", 1)[0]


def _combined_sha(files: list[dict]) -> str:
    if len(files) == 1 and "/" not in files[0]["path"]:
        return files[0]["sha256"]
    lines = "".join(f"{f['path']} {f['sha256']}\n" for f in sorted(files, key=lambda f: f["path"]))
    return hashlib.sha256(lines.encode()).hexdigest()


def checkpoints_record(*, attempt: Attempt, manifest: dict) -> list[Checkpoint]:
    """Record (or bring up to date) the attempt's complete checkpoints from its upload manifest; returns the
    checkpoints that are new or changed. Idempotent: the observer calls it on every pass."""
    uploaded: dict[str, dict] = manifest.get("files") or {}
    busy = {_entry(p) for p in manifest.get("pending") or []}
    groups: dict[str, list[dict]] = {}
    for path, record in uploaded.items():
        groups.setdefault(_entry(path), []).append({"path": path, **record})
    existing = {c.name: c for c in Checkpoint.objects.filter(attempt=attempt)}
    changed = []
    for name, files in sorted(groups.items()):
        if name in busy:
            continue  # part of it is still being written or uploaded: not complete yet
        files = sorted(
            ({k: f[k] for k in ("path", "key", "size", "sha256", "etag", "uploaded_at")} for f in files),
            key=lambda f: f["path"],
        )
        sha = _combined_sha(files)
        current = existing.get(name)
        if current is not None and current.sha256 == sha and current.files == files:
            continue
        fields = {
            "job_id": attempt.job_id,
            "step": step_of(name),
            "size_bytes": sum(int(f["size"]) for f in files),
            "sha256": sha,
            "bucket": manifest.get("bucket") or settings.TRAINYARD_S3_BUCKET,
            "key": (manifest.get("prefix") or "") + name,
            "files": files,
            "saved_at": datetime.fromtimestamp(max(float(f["uploaded_at"]) for f in files), tz=UTC),
            "deleted_at": None,
        }
        checkpoint, _ = Checkpoint.objects.update_or_create(attempt=attempt, name=name, defaults=fields)
        changed.append(checkpoint)
        JobEvent.objects.create(
            job_id=attempt.job_id,
            attempt=attempt,
            kind="checkpoint_saved",
            actor="checkpoint-sync",
            message=stored(
                "checkpoint %(name)s saved (%(size)s, %(n)s file)"
                if len(files) == 1
                else "checkpoint %(name)s saved (%(size)s, %(n)s files)",
                name=name,
                size=_size(checkpoint.size_bytes),
                n=len(files),
            ),
            data={"checkpoint": checkpoint.id, "step": checkpoint.step, "key": checkpoint.key, "sha256": sha},
        )
    _sync_health(attempt, manifest)
    return changed


def _sync_health(attempt: Attempt, manifest: dict) -> None:
    """One event per attempt and kind for a failing store, a held upload and what the last sync could not save."""
    error = manifest.get("error") or ""
    if error:
        _event_once(
            attempt,
            "checkpoint_sync_failing",
            level="warning",
            message=stored(
                "checkpoint upload failing (%(error)s); retrying with backoff, the job keeps running", error=error
            ),
            data={"error": error, "failures": manifest.get("failures", 0)},
        )
    if manifest.get("held"):
        waiting = manifest.get("pending") or []
        _event_once(
            attempt,
            "checkpoint_upload_waiting",
            level="warning",
            message=stored(
                "team storage quota is full: %(n)s checkpoint file(s) wait to be uploaded (kept on the node, nothing "
                "is lost); free space or raise the quota",
                n=len(waiting),
            ),
            data={"pending": waiting[:50]},
        )
    unsaved = manifest.get("unsaved") or []
    if manifest.get("final") and unsaved:
        _event_once(
            attempt,
            "checkpoint_unsaved",
            level="error",
            message=stored(
                "%(n)s checkpoint file(s) were not saved to the object store: %(files)s",
                n=len(unsaved),
                files=f"{', '.join(unsaved[:5])}{' …' if len(unsaved) > 5 else ''}" + (f" ({error})" if error else ""),
            ),
            data={"unsaved": unsaved[:200], "error": error},
        )


def _event_once(attempt: Attempt, kind: str, *, level: str, message: str, data: dict) -> None:
    event = JobEvent.objects.filter(attempt=attempt, kind=kind).first()
    if event is None:
        JobEvent.objects.create(
            job_id=attempt.job_id, attempt=attempt, kind=kind, level=level, actor="checkpoint-sync",
            message=message, data=data,
        )  # fmt: skip
    elif event.data != data:
        JobEvent.objects.filter(pk=event.pk).update(data=data, message=message)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def open_file(checkpoint: Checkpoint, path: str | None):
    """(file entry, streaming body) of one file of a checkpoint; `path` may be omitted for a single file."""
    files = checkpoint.files
    if path is None:
        if len(files) != 1:
            raise KeyError("this checkpoint has several files: name one with ?path=")
        entry = files[0]
    else:
        entry = next((f for f in files if f["path"] == path), None)
        if entry is None:
            raise KeyError(f"the checkpoint has no file '{path}'")
    config = store_config()
    if config is None:
        raise objectstore.StoreError("no object store is configured (TRAINYARD_S3_URL)")
    try:
        body = objectstore.client(config).get_object(Bucket=checkpoint.bucket, Key=entry["key"])["Body"]
    except Exception as exc:  # noqa: BLE001 - any store failure is one clear message
        raise objectstore.StoreError(f"the object store could not return {entry['key']}: "
                                     f"{objectstore.describe_error(exc)}") from None  # fmt: skip
    return entry, body


# ------------------------------------------------------------------------------------------- quota and retention


def team_storage_used(team_ids=None) -> dict[int, int]:
    """Bytes each team's live checkpoints take in the object store."""
    from django.db.models import Sum

    rows = Checkpoint.objects.filter(deleted_at__isnull=True)
    if team_ids is not None:
        rows = rows.filter(job__team_id__in=team_ids)
    return {
        team_id: int(total or 0)
        for team_id, total in rows.values("job__team_id")
        .annotate(total=Sum("size_bytes"))
        .values_list("job__team_id", "total")
    }


def teams_over_storage_quota(team_ids) -> set[int]:
    """The teams (of those given) whose checkpoints fill their storage quota: their uploads wait."""
    from quotas.models import Team

    limits = dict(
        Team.objects.filter(pk__in=set(team_ids), storage_quota_bytes__gt=0).values_list("id", "storage_quota_bytes")
    )
    if not limits:
        return set()
    used = team_storage_used(limits)
    return {team_id for team_id, limit in limits.items() if used.get(team_id, 0) >= limit}


def _protected(now) -> set[int]:
    """The latest checkpoint (as `latest` picks it) of every job that may still resume from it: a job not finished
    yet (its retry resumes), and a job an unfinished job names in `resume_from`. One query, whatever the number of
    unfinished jobs (a query per job took 15 s an hour with 19,000 of them)."""
    from jobs.states import TERMINAL

    unfinished = Job.objects.exclude(state__in=[s.value for s in TERMINAL])
    return set(
        Checkpoint.objects.filter(deleted_at__isnull=True)
        .filter(
            Q(job__in=unfinished.values("id"))
            | Q(job__in=unfinished.exclude(resume_from__isnull=True).values("resume_from_id"))
        )
        .order_by("job_id", *RESUME_ORDER)
        .distinct("job_id")
        .values_list("id", flat=True)
    )


def checkpoints_prune(*, now=None) -> dict[str, int]:
    """Apply each team's retention: keep the newest `checkpoint_keep_last` per job, delete what is older than
    `checkpoint_retention_days`, never the latest checkpoint of a job that may resume. Objects are deleted from
    the store first; a row is marked deleted only once its objects are gone (a failing store: the next pass)."""
    from datetime import timedelta

    from django.utils import timezone

    now = now or timezone.now()
    protected = _protected(now)
    doomed: list[Checkpoint] = []
    rows = (
        Checkpoint.objects.filter(deleted_at__isnull=True).select_related("job__team").order_by("job_id", *RESUME_ORDER)
    )
    seen: dict = {}
    for checkpoint in rows.iterator(chunk_size=2000):
        team = checkpoint.job.team
        rank = seen[checkpoint.job_id] = seen.get(checkpoint.job_id, 0) + 1
        too_many = team.checkpoint_keep_last and rank > team.checkpoint_keep_last
        days = team.checkpoint_retention_days
        too_old = days and checkpoint.saved_at < now - timedelta(days=days)
        if (too_many or too_old) and checkpoint.id not in protected:
            doomed.append(checkpoint)
    report = {"deleted": 0, "bytes": 0, "failed": 0}
    if not doomed:
        return report
    config = store_config()
    if config is None:
        return report
    s3 = objectstore.client(config)
    for checkpoint in doomed:
        keys = [{"Key": f["key"]} for f in checkpoint.files]
        try:
            for start in range(0, len(keys), 1000):
                answer = s3.delete_objects(Bucket=checkpoint.bucket, Delete={"Objects": keys[start : start + 1000]})
                if answer.get("Errors"):
                    raise objectstore.StoreError(str(answer["Errors"][0].get("Message", "delete refused")))
        except Exception as exc:  # noqa: BLE001 - kept for the next pass
            report["failed"] += 1
            log.warning("checkpoint_prune_failed", checkpoint=checkpoint.id, error=objectstore.describe_error(exc))
            continue
        Checkpoint.objects.filter(pk=checkpoint.pk).update(deleted_at=now)
        JobEvent.objects.create(
            job_id=checkpoint.job_id,
            attempt_id=checkpoint.attempt_id,
            kind="checkpoint_deleted",
            actor="retention",
            message=stored("checkpoint %(name)s deleted by team retention", name=checkpoint.name),
            data={"checkpoint": checkpoint.id, "key": checkpoint.key},
        )
        report["deleted"] += 1
        report["bytes"] += checkpoint.size_bytes
    return report
