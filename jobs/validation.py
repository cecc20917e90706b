"""Checks on what a submission names on disk: the working dir, the TensorBoard log dir and the mounts.

A job reaches only its own folder and the volumes its team claims. Relative paths are inside the job's
folder (the local work dir, the container's /workspace); an absolute path must lie under one of the job's
own mounts (a PersistentVolumeClaim of the team's namespace), which only the Kubernetes backends take.
`..` and NUL are refused everywhere; symlinks that point out of the job's folder lead nowhere, because the
sandbox binds that folder alone (jobs/backends/sandbox.py).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any

from kernel.errors import ValidationFailed
from kernel.sentences import stored
from quotas.selectors import is_maintainer

CLAIM_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")
MOUNT_KEYS = {"name", "kind", "claim", "path", "read_only", "sub_path"}
RESERVED_MOUNT_PATHS = {"/", "/tmp", "/dev", "/dev/shm", "/proc", "/sys", "/etc", "/usr", "/bin", "/lib"}


@dataclass(frozen=True)
class JobPaths:
    working_dir: str
    tensorboard_logdir: str
    mounts: list[dict]


def _text(value: Any, field: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValidationFailed(f"{field} must be a string", code="invalid_path", field=field)
    if "\x00" in value or len(value) > 500:
        raise ValidationFailed(f"{field} is not a usable path", code="invalid_path", field=field)
    return value.strip()


def _escapes(path: str) -> bool:
    return ".." in path.replace("\\", "/").split("/")


def _job_path(value: Any, field: str, mounts: list[dict]) -> str:
    path = _text(value, field)
    if not path:
        return ""
    if _escapes(path):
        raise ValidationFailed(f"{field} may not contain '..'", code="path_escapes_job", field=field)
    if path.startswith("/"):
        clean = posixpath.normpath(path)
        if not any(clean == m["path"] or clean.startswith(m["path"].rstrip("/") + "/") for m in mounts):
            raise ValidationFailed(
                f"{field} '{path}' is outside the job's folder: give a path relative to it, or one under a mount",
                code="path_outside_job",
                field=field,
            )
        return clean
    return posixpath.normpath(path)


def _mounts(value: Any, *, backend: str) -> list[dict]:
    if value in (None, []):
        return []
    if not isinstance(value, list):
        raise ValidationFailed("mounts must be a list", code="invalid_mount", field="mounts")
    if backend == "local":
        raise ValidationFailed(
            "the local backend runs jobs in their own folder and takes no mounts",
            code="mounts_not_supported",
            field="mounts",
        )
    clean, seen = [], set()
    for index, mount in enumerate(value):
        if not isinstance(mount, dict) or set(mount) - MOUNT_KEYS:
            raise ValidationFailed(
                f"mount {index}: only {', '.join(sorted(MOUNT_KEYS))} are allowed (a claim of the team's namespace)",
                code="invalid_mount",
                field="mounts",
            )
        claim = _text(mount.get("claim"), "mounts")
        path = _text(mount.get("path"), "mounts")
        sub_path = _text(mount.get("sub_path"), "mounts")
        if not CLAIM_NAME.match(claim):
            raise ValidationFailed(
                f"mount {index}: '{claim}' is not a claim name", code="invalid_mount", field="mounts"
            )
        if not path.startswith("/") or _escapes(path) or ":" in path:
            raise ValidationFailed(
                f"mount {index}: path must be absolute, without '..'", code="path_escapes_job", field="mounts"
            )
        path = posixpath.normpath(path)
        if path in RESERVED_MOUNT_PATHS or path in seen:
            raise ValidationFailed(f"mount {index}: '{path}' cannot be mounted", code="invalid_mount", field="mounts")
        if sub_path and (sub_path.startswith("/") or _escapes(sub_path)):
            raise ValidationFailed(
                f"mount {index}: sub_path must stay inside the claim", code="path_escapes_job", field="mounts"
            )
        seen.add(path)
        clean.append({**mount, "claim": claim, "path": path, **({"sub_path": sub_path} if sub_path else {})})
    return clean


def job_paths(data: dict[str, Any], *, backend: str) -> JobPaths:
    """The working dir, TensorBoard log dir and mounts of a submission, or a 400 naming the field."""
    mounts = _mounts(data.get("mounts"), backend=backend)
    return JobPaths(
        working_dir=_job_path(data.get("working_dir"), "working_dir", mounts),
        tensorboard_logdir=_job_path(data.get("tensorboard_logdir"), "tensorboard_logdir", mounts),
        mounts=mounts,
    )


def job_priority(value: Any, *, user, team, queue) -> int:
    """The priority asked for, within the queue's maximum for members; maintainers and staff may go higher
    (job_submit records a `priority_elevated` event for each such job)."""
    try:
        priority = int(value or 0)
    except (TypeError, ValueError):
        raise ValidationFailed(
            stored("priority must be an integer"), code="invalid_priority", field="priority"
        ) from None
    if not -100 <= priority <= 100:
        raise ValidationFailed(stored("priority must be -100..100"), code="invalid_priority", field="priority")
    if priority > queue.max_member_priority and not is_maintainer(user, team):
        raise ValidationFailed(
            stored(
                "priority %(priority)s is over queue '%(queue)s''s maximum for members (%(most)s); "
                "only the team's maintainers and staff may go higher",
                priority=priority,
                queue=queue.name,
                most=queue.max_member_priority,
            ),
            code="priority_exceeds_queue_maximum",
            field="priority",
        )
    return priority
