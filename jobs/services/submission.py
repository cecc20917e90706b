"""Submission: part of `jobs.services` (see its package docstring)."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import shlex
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, models, transaction

from cluster import selectors as cluster_selectors
from images import registry as image_registry
from images import services as image_services
from jobs import reference, validation
from jobs.models import Job, JobBatch, JobEvent, written_fields
from jobs.services.common import ENV_NAME, RESERVED_ENV_PREFIXES, log
from jobs.states import JobState, PendingReason
from jobs.store import new_job_reason
from kernel.errors import Conflict, NotFound, ValidationErrors, ValidationFailed
from kernel.prepared import prepared_cursor
from kernel.sentences import stored
from kernel.units import human_duration, human_resource, parse_duration
from kernel.wake import dispatch_soon
from kernel.watch import watch_validate
from quotas import selectors as quota
from quotas.models import Team


@dataclass
class Resolved:
    """A submission after validation: everything the Job row needs."""

    fields: dict[str, Any]


def _reference_card_mib() -> int:
    return reference.cluster_facts(settings.TRAINYARD_DEFAULT_GPU_MEMORY_MIB).card_mib


def _registry_of(reference: str) -> str:
    first = reference.split("/", 1)[0]
    if "/" in reference and ("." in first or ":" in first or first == "localhost"):
        return first.split(":")[0] if first.count(":") == 1 and not first.startswith("[") else first
    return "docker.io"


def _registry_endpoint(image: str, ref: reference.Snapshot) -> str | None:
    """Where an image's registry is asked (its mirror when the allow-list names one); None: its own host."""
    platform = image_registry.platform_registry()
    if platform and image.startswith(platform + "/"):
        return None
    return ref.registry_endpoints.get(_registry_of(image))


def _resolve_image(name: str, team: Team, ref: reference.Snapshot) -> dict[str, Any]:
    """The image a submission names, pinned: a catalog image's built digest, a reference's own digest, else the
    digest its tag points to now in the registry (images.services.image_pin: 400 `image_not_found`, 503
    `registry_unavailable`), so the job and its reproduce record always name `repo@sha256:…`."""
    base = ref.base_images.get(name)
    project = None if base else ref.project_images.get((team.pk, name))
    image = base or project
    if image is not None:
        reference = image.reference
        digest = image.digest
        min_driver = image.min_driver_version or (project.base.min_driver_version if project else "")
        if not reference:
            raise ValidationFailed(f"image '{name}' has not been built yet", code="image_not_built", field="image")
        if "@" in reference:
            reference, digest = reference.split("@", 1)
    else:
        reference = name.strip()
        if not reference or any(ch.isspace() for ch in reference) or len(reference) > 300:
            raise ValidationFailed(
                stored("'%(name)s' is not an image name or reference", name=name), code="unknown_image", field="image"
            )
        if "/" not in reference:
            # A bare name is a catalog name mistyped far more often than a Docker Hub shorthand: say so at once.
            raise ValidationFailed(
                stored(
                    "'%(name)s' is not in the image catalog (%(names)s); name a catalog image, or a full reference "
                    "such as docker.io/library/%(name)s",
                    name=reference,
                    names=", ".join(sorted({*ref.base_images, *(n for t, n in ref.project_images if t == team.pk)})),
                ),
                code="unknown_image",
                field="image",
            )
        image_services.check_team_repository(reference, team_slug=team.slug)
        digest = ""
        if "@" in reference:
            reference, digest = reference.split("@", 1)
            if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
                raise ValidationFailed(
                    stored("an image digest must look like sha256:<64 hex>"), code="invalid_digest", field="image"
                )
        min_driver = ""
    platform = image_registry.platform_registry()
    if not (platform and reference.startswith(platform + "/")):
        registry = _registry_of(reference)
        if registry not in ref.allowed_registries:
            raise ValidationFailed(
                stored("registry '%(registry)s' is not on the allow-list", registry=registry),
                code="image_registry_not_allowed",
                field="image",
            )
    endpoint = _registry_endpoint(reference, ref)
    if not digest and base is not None and settings.TRAINYARD_BACKEND == "local":
        # An external catalog base nobody pulled: the local backend runs the command on the host, so there is no
        # digest to pin, and the record says so ("" = unresolved) instead of inventing one.
        pass
    elif not digest:
        digest = image_services.image_pin(reference=reference, endpoint=endpoint)
    return dict(
        image_reference=reference,
        image_digest=digest,
        min_driver_version=min_driver,
        base_image=base,
        project_image=project,
    )


def _validate_watch(value: Any) -> list[dict]:
    return watch_validate(value)


def _validate_env(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise ValidationFailed(stored("env must be a mapping of NAME: value"), code="invalid_env", field="env")
    clean, problems = {}, []
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_NAME.match(key):
            problems.append(
                ValidationFailed(
                    stored("'%(name)s' is not a valid environment variable name", name=key),
                    code="invalid_env_name",
                    field="env",
                )
            )
        elif key.startswith(RESERVED_ENV_PREFIXES):
            problems.append(
                ValidationFailed(
                    stored("'%(name)s' is set by the platform", name=key), code="reserved_env_name", field="env"
                )
            )
        else:
            clean[key] = "" if value is None else str(value)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ValidationErrors(problems)  # every bad variable at once
    return clean


def _command(value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise ValidationFailed(
                stored("cannot parse the command: %(error)s", error=exc), code="invalid_command", field="command"
            )
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        argv = list(value)
    else:
        argv = []
    if not argv or not argv[0].strip():
        raise ValidationFailed(stored("the command is empty"), code="empty_command", field="command")
    return argv


def _name(value: Any) -> str | None:
    """A name to look up, or None for anything that is not a string (a list is not even a dict key)."""
    return value if isinstance(value, str) else None


# The order the submit form shows its fields in (the API's own fields after them): errors are reported in it.
FIELD_ORDER = (
    "team",
    "queue",
    "replicas",
    "spec",
    "gpus",
    "gpu_milli",
    "gpu_memory_mib",
    "cpu_milli",
    "memory_mib",
    "image",
    "command",
    "args",
    "env",
    "timeout_s",
    "max_retries",
    "tensorboard",
    "tensorboard_logdir",
    "gpu_models",
    "labels",
    "name",
    "working_dir",
    "mounts",
    "datasets",
    "code",
    "watch",
    "priority",
    "preemptible",
    "ci",
)


def field_rank(field: str | None) -> int:
    return FIELD_ORDER.index(field) if field in FIELD_ORDER else len(FIELD_ORDER)


class _Problems:
    """Collects every problem of a submission instead of stopping at the first."""

    def __init__(self) -> None:
        self.found: list[ValidationFailed] = []

    @contextmanager
    def check(self) -> Iterator[None]:
        try:
            yield
        except ValidationFailed as exc:
            self.found.extend(getattr(exc, "errors", None) or [exc])
        except (TypeError, ValueError) as exc:  # a number that is not one (the API's serializer says so first)
            self.found.append(ValidationFailed(str(exc), code="invalid"))

    def raise_any(self) -> None:
        if not self.found:
            return
        ordered = sorted(self.found, key=lambda e: field_rank(e.field))  # stable: one field's problems keep order
        if len(ordered) == 1:
            raise ordered[0]
        raise ValidationErrors(ordered)


def _whole(data: dict[str, Any], name: str, default: int) -> int:
    value = data.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValidationFailed(
            stored("%(field)s must be a whole number", field=name), code="invalid", field=name
        ) from None


def job_validate(*, user, data: dict[str, Any]) -> Resolved:
    """Check a submission up front; raise NotFound (the team), or ValidationFailed / ValidationErrors (400) with
    every problem found, each with its field and code, in the form's order."""
    ref, facts = reference.current_and_facts(settings.TRAINYARD_DEFAULT_GPU_MEMORY_MIB)
    team = ref.teams.get(_name(data.get("team")))
    if team is None or not ref.is_member(user, team):
        raise NotFound(stored("team not found (or you are not a member)"), code="unknown_team", field="team")
    problems = _Problems()
    queue = ref.queues.get(_name(data.get("queue")))
    with problems.check():
        if queue is None:
            raise ValidationFailed(
                stored("queue '%(queue)s' does not exist", queue=data.get("queue")), code="unknown_queue", field="queue"
            )
        if not ref.queue_allows_team(queue, team):
            raise ValidationFailed(
                stored("team %(team)s may not use queue '%(queue)s'", team=team.slug, queue=queue.name),
                code="queue_not_allowed",
                field="queue",
            )
    replicas = 1
    with problems.check():
        replicas = _whole(data, "replicas", 1)
        if replicas < 1 or replicas > 64:
            raise ValidationFailed(
                stored("replicas must be between 1 and 64"), code="invalid_replicas", field="replicas"
            )
        if replicas > 1 and queue is not None and not queue.gang:
            raise ValidationFailed(
                stored("multi-replica jobs need a gang-scheduled queue; '%(queue)s' is not", queue=queue.name),
                code="replicas_need_gang_queue",
                field="replicas",
            )
    card_mib, drivers = facts.card_mib, facts.drivers
    spec_name = data.get("spec")
    explicit = data.get("gpu_milli") is not None or data.get("gpu_memory_mib") is not None
    request: dict[str, Any] | None = None
    default_timeout = queue.default_timeout_s if queue is not None else None
    if spec_name:
        spec = None
        with problems.check():
            if explicit:
                raise ValidationFailed(
                    stored("give a spec or an explicit gpu_milli/gpu_memory_mib, not both"),
                    code="spec_and_explicit_request",
                    field="spec",
                )
            spec = ref.specs.get(_name(spec_name))
            if spec is None:
                raise ValidationFailed(
                    stored("spec '%(spec)s' does not exist", spec=spec_name), code="unknown_spec", field="spec"
                )
            if queue is not None and not ref.queue_allows_spec(queue, spec):
                allowed = ", ".join(ref.queue_spec_names(queue)) or "none"
                raise ValidationFailed(
                    stored(
                        "queue '%(queue)s' does not allow spec '%(spec)s' (allowed: %(allowed)s)",
                        queue=queue.name,
                        spec=spec.name,
                        allowed=allowed,
                    ),
                    code="spec_not_allowed_in_queue",
                    field="spec",
                )
        if spec is not None:
            with problems.check():
                gpu_count = _whole(data, "gpus", spec.gpu_count) or spec.gpu_count
                if gpu_count != spec.gpu_count and not spec.exclusive:
                    raise ValidationFailed(
                        stored("only the guaranteed tier takes several GPUs"), code="invalid_gpus", field="gpus"
                    )
                if gpu_count < 1 or gpu_count > 16:
                    raise ValidationFailed(stored("gpus must be between 1 and 16"), code="invalid_gpus", field="gpus")
                request = dict(
                    spec=spec,
                    gpu_count=gpu_count,
                    gpu_milli=spec.gpu_milli,
                    exclusive=spec.exclusive,
                    gpu_memory_eighths=spec.gpu_memory_eighths,
                    gpu_memory_mib=card_mib * spec.gpu_memory_eighths // 8,
                    cpu_milli=spec.cpu_milli_per_gpu * gpu_count,
                    memory_mib=spec.memory_mib_per_gpu * gpu_count,
                )
                if spec.mig_profile:
                    request.update(_mig_request(spec))
            if queue is not None:
                default_timeout = min(spec.default_timeout_s, queue.max_timeout_s)
    elif explicit:
        with problems.check():
            if queue is not None and not queue.allow_explicit_request:
                raise ValidationFailed(
                    stored("queue '%(queue)s' takes specs only", queue=queue.name),
                    code="explicit_request_not_allowed",
                    field="gpu_milli",
                )
            milli = _whole(data, "gpu_milli", 0)
            memory = _whole(data, "gpu_memory_mib", 0)
            if not 1 <= milli <= 1000:
                raise ValidationFailed("gpu_milli must be 1..1000", code="invalid_gpu_milli", field="gpu_milli")
            if not 1 <= memory <= card_mib:
                raise ValidationFailed(
                    f"gpu_memory_mib must be 1..{card_mib}", code="invalid_gpu_memory", field="gpu_memory_mib"
                )
            gpu_count = _whole(data, "gpus", 1) or 1
            if gpu_count < 1 or gpu_count > 16 or (gpu_count > 1 and milli != 1000):
                raise ValidationFailed(
                    "an explicit request takes 1..16 whole GPUs (gpu_milli 1000), or a share of one",
                    code="invalid_gpus",
                    field="gpus",
                )
            cpu_milli, host_memory = _whole(data, "cpu_milli", 2000) or 2000, _whole(data, "memory_mib", 8192) or 8192
            if cpu_milli < 1 or host_memory < 1:
                raise ValidationFailed(
                    "cpu_milli and memory_mib must be positive", code="invalid_host_request", field="cpu_milli"
                )
            request = dict(
                spec=None,
                gpu_count=gpu_count,
                gpu_milli=milli,
                exclusive=milli == 1000,
                gpu_memory_eighths=None,
                gpu_memory_mib=card_mib if milli == 1000 else memory,
                cpu_milli=cpu_milli,
                memory_mib=host_memory,
            )
    else:
        problems.found.append(ValidationFailed(stored("a spec is required"), code="unknown_spec", field="spec"))
    totals: dict[str, int] = {}
    if request is not None and request["exclusive"]:
        # Whole cores for whole cards: a Guaranteed pod with an integer CPU request is what Kubernetes' static CPU
        # manager pins (docs/kubernetes.md); admission counts what the pod will ask for.
        request["cpu_milli"] = -(-request["cpu_milli"] // 1000) * 1000
    if request is not None:
        cards = request["gpu_count"] * replicas
        totals = dict(
            total_gpu_milli=request["gpu_milli"] * cards,
            total_gpu_memory_mib=request["gpu_memory_mib"] * cards,
            total_cpu_milli=request["cpu_milli"] * replicas,
            total_memory_mib=request["memory_mib"] * replicas,
        )
        vector = {k.removeprefix("total_"): v for k, v in totals.items()}
        with problems.check():
            over = quota.fits(vector, {}, queue.vector()) if queue is not None else None
            if over:
                raise ValidationFailed(
                    stored(
                        "the job needs %(need)s; queue '%(queue)s' holds at most %(most)s, "
                        "so it could never start there",
                        need=human_resource(over, vector[over]),
                        queue=queue.name,
                        most=human_resource(over, queue.vector()[over]),
                    ),
                    code="request_exceeds_queue_capability",
                    field="spec",
                )
            over = quota.fits(vector, {}, team.vector())
            if over:
                raise ValidationFailed(
                    stored(
                        "the job needs %(need)s; team %(team)s's whole quota is %(quota)s, so it could never start",
                        need=human_resource(over, vector[over]),
                        team=team.slug,
                        quota=human_resource(over, team.vector()[over]),
                    ),
                    code="request_exceeds_team_quota",
                    field="spec",
                )
    timeout = default_timeout
    with problems.check():
        timeout = parse_duration(data.get("timeout_s"), field="timeout_s", default=default_timeout)
        if timeout is not None and timeout < 1:
            raise ValidationFailed(stored("timeout_s must be positive"), code="invalid_timeout", field="timeout_s")
        if timeout is not None and queue is not None and timeout > queue.max_timeout_s:
            raise ValidationFailed(
                stored(
                    "time limit %(limit)s is over queue '%(queue)s''s maximum of %(most)s",
                    limit=human_duration(timeout),
                    queue=queue.name,
                    most=human_duration(queue.max_timeout_s),
                ),
                code="timeout_exceeds_queue_maximum",
                field="timeout_s",
            )
    image: dict[str, Any] = {}
    unreachable: image_services.RegistryUnavailableError | None = None
    with problems.check():
        try:
            if not data.get("image"):
                raise ValidationFailed(stored("an image is required"), code="unknown_image", field="image")
            image = _resolve_image(str(data["image"]), team, ref)
            policy = ref.scan_policies.get(queue.pk) if queue is not None else None
            if policy is not None:
                image_services.image_admit(
                    policy=policy,
                    queue=queue,
                    reference=image["image_reference"],
                    digest=image["image_digest"],
                    endpoint=_registry_endpoint(image["image_reference"], ref),
                )
            needs = image["min_driver_version"]
            if needs and drivers and not any(cluster_selectors.driver_satisfies(d, needs) for d in drivers):
                raise ValidationFailed(
                    stored(
                        "the image needs NVIDIA driver >= %(needs)s; the newest node has %(newest)s",
                        needs=image["min_driver_version"],
                        newest=max(drivers, key=cluster_selectors.version_tuple),
                    ),
                    code="image_incompatible_with_all_nodes",
                    field="image",
                )
        except image_services.RegistryUnavailableError as exc:
            unreachable = exc  # a 503 only when nothing else is wrong: trying again cannot fix the rest
    env: dict[str, str] = {}
    with problems.check():
        env = _validate_env(data.get("env"))
    command: list[str] = []
    with problems.check():
        command = _command(data.get("command"))
    args = data.get("args") or []
    with problems.check():
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValidationFailed(stored("args must be a list of strings"), code="invalid_args", field="args")
    labels = data.get("labels") or {}
    with problems.check():
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise ValidationFailed(stored("labels must map strings to strings"), code="invalid_labels", field="labels")
    gpu_models: list[str] = []
    with problems.check():
        gpu_models = _gpu_models(data.get("gpu_models"), known=facts.models)
    max_retries = 2
    with problems.check():
        max_retries = _whole(data, "max_retries", 2)
        if not 0 <= max_retries <= 10:
            raise ValidationFailed(stored("max_retries must be 0..10"), code="invalid_max_retries", field="max_retries")
    paths = None
    with problems.check():
        paths = validation.job_paths(data, backend=settings.TRAINYARD_BACKEND)
    datasets: list[dict] = []
    with problems.check():
        from jobs import datasets as datasets_mod

        datasets = datasets_mod.resolve(
            data.get("datasets"),
            team=team,
            backend=settings.TRAINYARD_BACKEND,
            mounts=paths.mounts if paths is not None else [],
            user=user,
        )
    watch: list[dict] = []
    with problems.check():
        watch = _validate_watch(data.get("watch"))
    code_digest = ""
    with problems.check():
        from jobs import code as code_mod

        code_digest = code_mod.resolve(data.get("code"), team=team, backend=settings.TRAINYARD_BACKEND)
    priority = 0
    with problems.check():
        if queue is not None:
            priority = validation.job_priority(data.get("priority"), user=user, team=team, queue=queue)
    preemptible = False
    with problems.check():
        preemptible = _preemptible(data.get("preemptible"), queue)
    if unreachable is not None and problems.found:
        problems.found.append(ValidationFailed(unreachable.detail, code=unreachable.code, field="image"))
    elif unreachable is not None:
        raise unreachable
    problems.raise_any()
    assert queue is not None and request is not None and paths is not None and timeout is not None
    name = (data.get("name") or command[0].rsplit("/", 1)[-1])[:120]
    resume_from = _resume_from(data.get("resume_from"), team=team)
    return Resolved(
        fields=dict(
            name=name,
            team=team,
            queue=queue,
            replicas=replicas,
            **request,
            **totals,
            **image,
            command=command,
            args=args,
            env=env,
            working_dir=paths.working_dir,
            priority=priority,
            preemptible=preemptible,
            timeout_s=timeout,
            max_retries=max_retries,
            tensorboard=bool(data.get("tensorboard")),
            tensorboard_logdir=paths.tensorboard_logdir,
            mounts=paths.mounts,
            datasets=datasets,
            code_digest=code_digest,
            watch=watch,
            labels=labels,
            gpu_models=gpu_models,
            ci=dict(data.get("ci") or {}),
            resume_from=resume_from,
        )
    )


def _mig_request(spec) -> dict[str, Any]:
    """A MIG spec's request per instance: the profile's share of a card's compute (slices of 7) and its memory,
    as quotas count it; placement hands out whole instances of that profile (docs/pools.md)."""
    from cluster.inventory import MIG_SLICES, InventoryError, mig_profile

    try:
        slices, memory = mig_profile(spec.mig_profile)
    except InventoryError as exc:
        raise ValidationFailed(f"spec '{spec.name}' is misconfigured: {exc}", code="invalid_spec", field="spec")
    if not spec.exclusive:
        raise ValidationFailed(
            f"spec '{spec.name}' is misconfigured: a MIG profile needs the guaranteed tier",
            code="invalid_spec",
            field="spec",
        )
    return dict(
        mig_profile=spec.mig_profile,
        gpu_milli=1000 * slices // MIG_SLICES,
        gpu_memory_eighths=None,
        gpu_memory_mib=memory,
    )


def _preemptible(value: Any, queue) -> bool:
    """A job runs preemptible only where its queue lets jobs borrow idle capacity (docs/pools.md)."""
    if value in (None, "", False):
        return False
    if value is not True:
        raise ValidationFailed("preemptible must be true or false", code="invalid_preemptible", field="preemptible")
    if queue is not None and not queue.allow_preemptible:
        raise ValidationFailed(
            f"queue '{queue.name}' does not take preemptible jobs", code="preemptible_not_allowed", field="preemptible"
        )
    return True


def _resume_from(value: Any, *, team: Team) -> Job | None:
    """The job whose latest checkpoint the new job starts from: one of the same team's jobs."""
    if value in (None, ""):
        return None
    try:
        job_id = uuid.UUID(str(value))
    except ValueError:
        raise ValidationFailed(
            f"resume_from must be a job id, got '{value}'", code="invalid_resume_from", field="resume_from"
        ) from None
    source = Job.objects.filter(pk=job_id).only("id", "team_id").first()
    if source is None or source.team_id != team.id:
        raise ValidationFailed(
            f"job {job_id} is not one of team {team.slug}'s jobs: only a job of the same team can be resumed",
            code="unknown_resume_from",
            field="resume_from",
        )
    return source


def _gpu_models(value: Any, *, known: list[str]) -> list[str]:
    """The GPU models (or families, `A100`) a job may run on, each matching at least one model the pool has
    or had; `"a|b"` and a list are both accepted. Empty: any model."""
    if value in (None, "", []):
        return []
    if isinstance(value, str):
        value = value.split("|")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationFailed(
            "gpu_models must be a list of GPU model names", code="invalid_gpu_models", field="gpu_models"
        )
    wanted = list(dict.fromkeys(v.strip() for v in value if v.strip()))
    if len(wanted) > 16 or any(len(v) > 100 or "\x00" in v for v in wanted):
        raise ValidationFailed(
            "gpu_models takes at most 16 names of at most 100 characters", code="invalid_gpu_models", field="gpu_models"
        )
    from scheduler.pool import model_matches

    unknown = [w for w in wanted if not any(model_matches(w, m) for m in known)]
    if unknown:
        raise ValidationFailed(
            stored(
                "no GPU of model %(models)s is in the pool; it has %(known)s",
                models=", ".join(unknown),
                known=", ".join(known) or stored("no GPUs"),
            ),
            code="unknown_gpu_model",
            field="gpu_models",
        )
    return wanted


def request_fingerprint(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def job_submit(
    *,
    user,
    data: dict[str, Any],
    idempotency_key: str | None = None,
    reproduced_from: Job | None = None,
    job_id: uuid.UUID | None = None,
) -> tuple[Job, bool]:
    """Validate and create a pending job; returns (job, created). The same key and body return the first job.
    `job_id`, chosen by the caller before the write, lets an answer name the job when the database goes away
    while the write commits."""
    fingerprint = request_fingerprint(data)
    resolved = job_validate(user=user, data=data)
    team = resolved.fields["team"]
    # A key seen before is found by the insert itself (`ON CONFLICT` on the unique key per team): no lookup on the
    # way of every new submission, and no savepoint to recover from a unique violation (two statements fewer).
    with transaction.atomic(savepoint=False):
        job = Job(
            **({"id": job_id} if job_id else {}),
            owner=user,
            idempotency_key=idempotency_key or None,
            request_fingerprint=fingerprint,
            reproduced_from=reproduced_from,
            state=JobState.PENDING,
            reason=PendingReason.QUEUED,
            **resolved.fields,
        )
        # The dispatcher's own rules give the first reason, written with the row (its page and its queue's
        # page say the same from the first second, not "waiting for the dispatcher" until the next pass).
        why = new_job_reason(job)
        if why is not None:
            job.reason, job.message = why
        events = [
            JobEvent(
                job=job,
                kind="submitted",
                to_state=JobState.PENDING,
                actor=user.username,
                message=stored("submitted to queue %(queue)s", queue=job.queue.name),
                data={"idempotency_key": idempotency_key} if idempotency_key else {},
            )
        ]
        if job.priority > job.queue.max_member_priority:
            events.append(
                JobEvent(
                    job=job,
                    kind="priority_elevated",
                    actor=user.username,
                    message=stored(
                        "priority %(priority)s, over queue %(queue)s's maximum of %(most)s for members",
                        priority=job.priority,
                        queue=job.queue.name,
                        most=job.queue.max_member_priority,
                    ),
                    data={"priority": job.priority, "queue_maximum": job.queue.max_member_priority},
                )
            )
        if why is not None:
            events.append(
                JobEvent(job=job, kind="waiting", actor="dispatcher", message=job.message, data={"reason": job.reason})
            )
        inserted = _insert_with_events(job, events)
    if not inserted:
        # The team already has a job under this key (committed: a concurrent first insert is waited for, and this
        # statement sees it once it commits).
        existing = Job.objects.filter(team=team, idempotency_key=idempotency_key).first()
        if existing is None:  # deleted since the insert found it
            raise IntegrityError(f"job with Idempotency-Key {idempotency_key!r} found by the insert, then gone")
        return _same_request_or_conflict(existing, fingerprint), False
    # The row is the promise: a broker that is down only delays the wake-up (the dispatcher's beat finds the job).
    transaction.on_commit(dispatch_soon, robust=True)
    log.info("job_submitted", job_id=str(job.id), team=team.slug, queue=job.queue.name)
    return job, True


@functools.cache
def _insert_statement() -> tuple[str, list, list]:
    """One statement that inserts a job and its first events: the job's row as one JSON document, the events as a
    JSON array (`jsonb_populate_record(set)` makes typed rows of them), so the statement has two parameters
    whatever the number of columns. Their foreign key to the job is checked at the commit, as Django makes every
    foreign key.

    Through the ORM (`save(force_insert=True)`, then `bulk_create`) the two statements cost ~1 ms of the web
    process's CPU per submission to compile; with one parameter per column, psycopg parsed the statement anew
    each time (it keeps statements of at most 50 parameters). The column lists are read from the models once, so
    a field added later is written as the ORM would write it."""
    qn = connection.ops.quote_name
    job_fields = written_fields(Job)  # a column with a database default (`joined_xid`) is the database's to fill
    event_fields = [f for f in written_fields(JobEvent) if not f.primary_key]
    job_columns = ", ".join(qn(f.column) for f in job_fields)
    event_columns = ", ".join(qn(f.column) for f in event_fields)
    job_table, event_table = qn(Job._meta.db_table), qn(JobEvent._meta.db_table)
    # The arbiter is the partial unique index of (team, idempotency_key): a repeated key inserts nothing, and then
    # neither do the events. Any other unique violation still raises.
    sql = (
        f"WITH job AS (INSERT INTO {job_table} ({job_columns}) "
        f"SELECT {job_columns} FROM jsonb_populate_record(NULL::{job_table}, %s::jsonb) "
        f"ON CONFLICT ({qn('team_id')}, {qn('idempotency_key')}) WHERE {qn('idempotency_key')} IS NOT NULL "
        "DO NOTHING RETURNING 1) "
        f"INSERT INTO {event_table} ({event_columns}) "
        f"SELECT {event_columns} FROM jsonb_populate_recordset(NULL::{event_table}, %s::jsonb) "
        "WHERE EXISTS (SELECT FROM job)"
    )
    return sql, _column_plan(job_fields), _column_plan(event_fields)


# Fields whose database value is their attribute when it already has this exact type (their preparation would give
# it back unchanged, and their pre-save step only reads the attribute); anything else goes the ORM's whole way.
_PLAIN_TYPES: dict[type, type] = {
    models.CharField: str,
    models.TextField: str,
    models.SlugField: str,
    models.IntegerField: int,
    models.SmallIntegerField: int,
    models.BigIntegerField: int,
    models.PositiveIntegerField: int,
    models.PositiveSmallIntegerField: int,
    models.PositiveBigIntegerField: int,
    models.BooleanField: bool,
    models.FloatField: float,
}


def _column_plan(fields) -> list[tuple]:
    """(column, field, attribute name, the type taken as it is or None) for each field, worked out once."""
    plan = []
    for f in fields:
        plain = _PLAIN_TYPES.get(type(f))
        if isinstance(f, models.ForeignKey) and type(f.target_field) in (models.AutoField, models.BigAutoField):
            plain = int
        plan.append((f.column, f, f.attname, plain))
    return plan


def _row(obj, plan) -> dict[str, Any]:
    """`obj`'s columns as JSON values: what `save()` would write (pre-save step, then database preparation)."""
    row = {}
    for column, field, attname, plain in plan:
        if plain is not None:
            value = getattr(obj, attname)
            if value is None or type(value) is plain:
                row[column] = value
                continue
        row[column] = _as_json(field.get_db_prep_save(field.pre_save(obj, True), connection))
    return row


def _as_json(value):
    """A field's prepared value as the JSON that `jsonb_populate_record` reads back into its column's type."""
    if hasattr(value, "obj"):  # psycopg's Json/Jsonb wrapper of a JSON field's value
        return value.obj
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if value is None or isinstance(value, str | int | float | bool | list | dict):
        return value
    raise TypeError(f"no JSON form for a {type(value).__name__} column value")


def _insert_with_events(job: Job, events: list[JobEvent]) -> bool:
    """Insert `job` and `events` (at least one) as `job.save(force_insert=True)` and `bulk_create` would: each
    field's pre-save step (defaults, auto_now_add) and database preparation; no signal is sent for either model.
    False, and nothing written, when the job's team already has a job with its idempotency key."""
    sql, job_plan, event_plan = _insert_statement()
    row, rows = _row(job, job_plan), [_row(event, event_plan) for event in events]
    with prepared_cursor() as cursor:
        cursor.execute(sql, [json.dumps(row), json.dumps(rows)])
        if cursor.rowcount == 0:
            return False
    for made in (job, *events):
        made._state.adding, made._state.db = False, connection.alias
    return True


def _same_request_or_conflict(existing: Job, fingerprint: str) -> Job:
    if existing.request_fingerprint != fingerprint:
        raise Conflict(
            "this Idempotency-Key was used for a different request",
            code="idempotency_key_reused",
            job_id=str(existing.id),
        )
    return existing


def job_batch_submit(
    *,
    user,
    items: list[dict[str, Any]],
    idempotency_key: str | None = None,
    job_ids: list[uuid.UUID] | None = None,
) -> tuple[list[Job], bool]:
    """Create every job of a batch, in order; returns (jobs, created). Called inside the caller's transaction, so a
    batch is all or nothing. With a key (the sender's own), the same key and body return the batch's jobs and a
    different body is 409 `idempotency_key_reused`, as for one submission."""
    fingerprint = request_fingerprint({"jobs": items})
    if idempotency_key:
        existing = JobBatch.objects.filter(owner=user, idempotency_key=idempotency_key).first()
        if existing is not None:
            return _same_batch_or_conflict(existing, fingerprint), False
    try:
        with transaction.atomic():
            # The key's row first: a concurrent batch with the same key waits on it here, before creating any job.
            batch = (
                JobBatch.objects.create(owner=user, idempotency_key=idempotency_key, request_fingerprint=fingerprint)
                if idempotency_key
                else None
            )
            ids = job_ids or [None] * len(items)
            jobs = [job_submit(user=user, data=item, job_id=job_id)[0] for item, job_id in zip(items, ids, strict=True)]
            if batch is not None:
                batch.job_ids = [str(job.id) for job in jobs]
                batch.save(update_fields=["job_ids"])
    except IntegrityError:
        existing = JobBatch.objects.filter(owner=user, idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        return _same_batch_or_conflict(existing, fingerprint), False
    return jobs, True


def _same_batch_or_conflict(existing: JobBatch, fingerprint: str) -> list[Job]:
    if existing.request_fingerprint != fingerprint:
        raise Conflict(
            "this Idempotency-Key was used for a different request",
            code="idempotency_key_reused",
            job_ids=list(existing.job_ids),
        )
    found = Job.objects.select_related("owner", "team", "queue", "spec").in_bulk(existing.job_ids)
    return [found[uuid.UUID(job_id)] for job_id in existing.job_ids if uuid.UUID(job_id) in found]
