"""Registered datasets: registering one (its size and file count read from the store), who may read it, and the
`datasets` field of a submission (resolved, checked, recorded on the job).

A dataset is read-only for every job. Locally an S3 dataset is fetched once into the node's cache and bound into
the job's sandbox at the path it asked for (jobs/backends/dataset_cache.py); on Kubernetes a claim is mounted
read-only and an S3 dataset is fetched by an init container (jobs/backends/volcano_render.py).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

import structlog
from django.db import IntegrityError, transaction
from django.db.models import Q

from jobs.models import Dataset
from kernel import objectstore
from kernel.errors import Conflict, Forbidden, NotFound, ValidationFailed
from kernel.sentences import stored
from quotas.models import Team
from quotas.selectors import is_maintainer, visible_teams

log = structlog.get_logger(__name__)

CLAIM_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,99}\Z")
ITEM_KEYS = {"name", "version", "path", "team"}
# Where a dataset may not be put: the system's folders (read-only in the sandbox, the container's own).
RESERVED_PREFIXES = ("/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/tmp", "/run")
MAX_DATASETS = 16


def readable_by(team: Team):
    """The datasets a team may read: its own and those shared with it."""
    return Dataset.objects.filter(Q(team=team) | Q(shared_with=team)).distinct()


def visible_to(user):
    """The datasets a user sees in the portal and the API: those their teams may read (staff: all)."""
    qs = Dataset.objects.select_related("team").prefetch_related("shared_with")
    if user.is_staff:
        return qs
    teams = Team.objects.filter(memberships__user=user)
    return qs.filter(Q(team__in=teams) | Q(shared_with__in=teams)).distinct()


DATASET_SPACE = "datasets/"  # the bucket's part for datasets; checkpoints live under "<team>/<job>/" beside it


def team_space(team: Team) -> str:
    return f"{DATASET_SPACE}{team.slug}/"


def check_prefix(prefix: str, *, team: Team, staff: bool) -> None:
    """A team registers datasets only under its own space, `datasets/<team>/` (staff: anywhere under `datasets/`),
    so no one can mount another team's files or checkpoints. Checked before the store is read: the answer says
    nothing about what exists elsewhere."""
    space = DATASET_SPACE if staff else team_space(team)
    if not prefix.startswith(space) or prefix == space and not staff:
        raise ValidationFailed(
            f"s3_prefix must be under {space} (the team's own part of the store), e.g. {team_space(team)}imagenet/v3/",
            code="prefix_outside_team_space",
            field="s3_prefix",
        )


def _measure(prefix: str) -> tuple[int, int]:
    """Size and file count of a prefix in the platform's store; a 400 when there is none or it is empty."""
    from jobs.backends.dataset_cache import DatasetError, list_objects
    from jobs.checkpoints import store_config

    store = store_config()
    if store is None:
        raise ValidationFailed(
            "no object store is configured (TRAINYARD_S3_URL): register the dataset as a claim instead",
            code="object_store_unavailable",
            field="s3_prefix",
        )
    try:
        objects = list_objects(objectstore.client(store, timeout_s=30.0, attempts=2), store.bucket, prefix)
    except DatasetError as exc:
        raise ValidationFailed(str(exc), code="object_store_unavailable", field="s3_prefix") from None
    if not objects:
        raise ValidationFailed(
            f"no object under '{prefix}' in bucket {store.bucket}: upload the dataset first",
            code="empty_dataset",
            field="s3_prefix",
        )
    return sum(o["size"] for o in objects), len(objects)


def dataset_register(
    *,
    user,
    team: Team,
    name: str,
    version: int,
    s3_prefix: str = "",
    claim: str = "",
    description: str = "",
    shared_with: list[str] | None = None,
) -> Dataset:
    """Register a dataset version for a team (its maintainers and staff). Size and file count come from the store.
    `shared_with` names the other teams (slugs) that may read it."""
    if not is_maintainer(user, team):
        raise Forbidden(f"only maintainers of team {team.slug} may register its datasets", code="not_maintainer")
    shared = _share_targets(user, shared_with or [])
    if not NAME.match(name or ""):
        raise ValidationFailed(
            "name: lower-case letters, digits, '-' and '_'", code="invalid_dataset_name", field="name"
        )
    s3_prefix, claim = (s3_prefix or "").strip(), (claim or "").strip()
    if bool(s3_prefix) == bool(claim):
        raise ValidationFailed(
            "give either s3_prefix (a prefix in the object store) or claim (a PersistentVolumeClaim)",
            code="invalid_dataset_source",
            field="s3_prefix",
        )
    if claim and not CLAIM_NAME.match(claim):
        raise ValidationFailed(f"'{claim}' is not a claim name", code="invalid_dataset_source", field="claim")
    if s3_prefix:
        if s3_prefix.startswith("/") or ".." in s3_prefix.split("/"):
            raise ValidationFailed("s3_prefix is a key prefix, not a path", code="invalid_dataset_source",
                                   field="s3_prefix")  # fmt: skip
        s3_prefix = s3_prefix.rstrip("/") + "/"
        check_prefix(s3_prefix, team=team, staff=user.is_staff)
    size, count = _measure(s3_prefix) if s3_prefix else (0, 0)
    try:
        with transaction.atomic(durable=True):
            dataset = Dataset.objects.create(
                team=team,
                name=name,
                version=int(version),
                s3_prefix=s3_prefix,
                claim=claim,
                description=description[:300],
                size_bytes=size,
                file_count=count,
                registered_by=user.username,
            )
            if shared:
                dataset.shared_with.set(shared)
    except IntegrityError:
        raise Conflict(
            f"team {team.slug} already has dataset {name} version {version}", code="dataset_exists"
        ) from None
    log.info("dataset_registered", team=team.slug, dataset=name, version=version, size=size, files=count)
    return dataset


def _share_targets(user, slugs: list[str]) -> list[Team]:
    """The teams a dataset is shared with: teams the user sees (a maintainer's own teams; staff: every team). A slug
    that names no team reads exactly like a team the user cannot see, so the answer never says which teams exist."""
    wanted = set(slugs)
    teams = list(visible_teams(user).filter(slug__in=wanted))
    missing = wanted - {t.slug for t in teams}
    if missing:
        raise ValidationFailed(
            stored("team %(teams)s not found (or you are not a member)", teams=", ".join(sorted(missing))),
            code="unknown_team",
            field="shared_with",
        )
    return teams


def dataset_delete(*, user, dataset_id: int) -> None:
    """Unregister a dataset. Jobs using it keep their copy; the store's objects are the owner's to remove."""
    dataset = Dataset.objects.select_related("team").filter(pk=dataset_id).first()
    if dataset is None:
        raise NotFound("no such dataset", code="dataset_not_found")
    if not is_maintainer(user, dataset.team):
        raise Forbidden(f"only maintainers of team {dataset.team.slug} may delete its datasets", code="not_maintainer")
    dataset.delete()
    log.info("dataset_deleted", team=dataset.team.slug, dataset=dataset.name, version=dataset.version)


def _clash(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def resolve(value: Any, *, team: Team | None, backend: str, mounts: list[dict], user) -> list[dict]:
    """The `datasets` of a submission: each `{name, version?, path}` becomes the dataset it names (the latest
    version when none is given), readable by the team, at an absolute path that clashes with no other mount.

    A dataset the submitting user may not see (another team's, not shared with any of theirs) is answered exactly
    like one that does not exist, `team` and `version` included: the answer never tells which names, teams or
    versions exist elsewhere. Only a dataset the user sees but the job's team may not read says so."""
    if value in (None, []):
        return []
    if not isinstance(value, list) or len(value) > MAX_DATASETS:
        raise ValidationFailed(
            f"datasets must be a list of at most {MAX_DATASETS} {{name, version, path}} items",
            code="invalid_dataset",
            field="datasets",
        )
    if team is None:
        return []  # the team's own error is reported
    resolved: list[dict] = []
    for index, item in enumerate(value):
        if not isinstance(item, dict) or set(item) - ITEM_KEYS or not isinstance(item.get("name"), str):
            raise ValidationFailed(
                f"dataset {index}: give name, path and optionally version", code="invalid_dataset", field="datasets"
            )
        path = item.get("path")
        if not isinstance(path, str) or not path.startswith("/") or "\x00" in path or ":" in path or len(path) > 500:
            raise ValidationFailed(
                f"dataset {index}: path must be an absolute path", code="invalid_dataset_path", field="datasets"
            )
        if ".." in path.split("/"):
            raise ValidationFailed(
                f"dataset {index}: path may not contain '..'", code="invalid_dataset_path", field="datasets"
            )
        path = posixpath.normpath(path)
        if path in {"/", "/home"} or any(path == p or path.startswith(p + "/") for p in RESERVED_PREFIXES):
            raise ValidationFailed(
                f"dataset {index}: '{path}' is a system folder; mount it elsewhere (e.g. /data)",
                code="invalid_dataset_path",
                field="datasets",
            )
        taken = [m["path"] for m in mounts] + [d["path"] for d in resolved]
        if any(_clash(path, other) for other in taken):
            raise ValidationFailed(
                f"dataset {index}: '{path}' clashes with another mount or dataset of the job",
                code="dataset_path_clash",
                field="datasets",
            )
        name = item["name"].strip()
        version = item.get("version")
        if version not in (None, ""):
            try:
                version = int(version)
            except (TypeError, ValueError):
                raise ValidationFailed(
                    f"dataset {index}: version must be a number", code="invalid_dataset", field="datasets"
                ) from None
        candidates = Dataset.objects.filter(name=name)
        if version not in (None, ""):
            candidates = candidates.filter(version=version)
        if item.get("team"):
            candidates = candidates.filter(team__slug=item["team"])
        readable = candidates.filter(Q(team=team) | Q(shared_with=team)).distinct()
        dataset = readable.select_related("team").order_by("-version", "team__slug").first()
        label = f"{name}" + (f" version {version}" if version not in (None, "") else "")
        if dataset is None:
            if visible_to(user).filter(pk__in=candidates.values("pk")).exists():
                raise ValidationFailed(
                    f"dataset {label} is not shared with team {team.slug}: ask its owners to share it",
                    code="dataset_not_readable",
                    field="datasets",
                )
            raise ValidationFailed(
                f"there is no dataset {label} (or none your teams may read)", code="unknown_dataset", field="datasets"
            )
        if dataset.claim and backend == "local":
            raise ValidationFailed(
                f"dataset {label} is a PersistentVolumeClaim: only the Kubernetes backend can mount it",
                code="dataset_not_available_here",
                field="datasets",
            )
        resolved.append(
            {
                "id": dataset.id,
                "team": dataset.team.slug,
                "name": dataset.name,
                "version": dataset.version,
                "path": path,
                "kind": dataset.kind,
                "prefix": dataset.s3_prefix,
                "claim": dataset.claim,
                "size_bytes": dataset.size_bytes,
                "file_count": dataset.file_count,
            }
        )
    return resolved


def requested(datasets: list[dict]) -> list[dict]:
    """What a job asked for, as a submission body names it (for retries, reproductions and templates)."""
    return [{"name": d["name"], "version": d["version"], "path": d["path"], "team": d["team"]} for d in datasets]
