"""Every change of a job's state: submit, transition, dispatch (admission + placement), start, observe,
finish (classify, retry), cancel, time out, resubmit and reproduce.

`job_transition` is the only writer of `Job.state`. Dispatch runs under the pool lock with the queue and
team rows locked, so concurrent submissions can never over-admit a hard quota.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import structlog
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from cluster import services as pool
from cluster.models import GPU, LogicalDevice
from jobs import classifier, reference, validation
from jobs.backends import AttemptDescription, Device, Observation, get_backend
from jobs.models import Attempt, Job, JobEvent
from jobs.states import ALLOWED, TERMINAL, AttemptState, JobState, PendingReason
from quotas import selectors as quota
from quotas.models import Queue, Team
from trainyard.errors import Conflict, NotFound, ValidationFailed

log = structlog.get_logger(__name__)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_ENV_PREFIXES = ("TRAINYARD_", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_")


class InvalidTransition(Conflict):
    code = "invalid_transition"


# ------------------------------------------------------------------------------------------- submission


@dataclass
class Resolved:
    """A submission after validation: everything the Job row needs."""

    fields: dict[str, Any]


def _reference_card_mib() -> int:
    return reference.cluster_facts(settings.TRAINYARD_DEFAULT_GPU_MEMORY_MIB)[0]


def _registry_of(reference: str) -> str:
    first = reference.split("/", 1)[0]
    if "/" in reference and ("." in first or ":" in first or first == "localhost"):
        return first.split(":")[0] if first.count(":") == 1 and not first.startswith("[") else first
    return "docker.io"


def _resolve_image(name: str, team: Team, ref: reference.Snapshot) -> dict[str, Any]:
    base = ref.base_images.get(name)
    project = None if base else ref.project_images.get((team.pk, name))
    image = base or project
    if image is not None:
        reference = image.reference
        digest = image.digest
        min_driver = image.min_driver_version or (project.base.min_driver_version if project else "")
    else:
        reference = name.strip()
        if not reference or any(ch.isspace() for ch in reference) or len(reference) > 300:
            raise ValidationFailed(f"'{name}' is not an image name or reference", code="unknown_image", field="image")
        digest = ""
        if "@" in reference:
            reference, digest = reference.split("@", 1)
            if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
                raise ValidationFailed(
                    "an image digest must look like sha256:<64 hex>", code="invalid_digest", field="image"
                )
        min_driver = ""
    registry = _registry_of(reference)
    if registry not in ref.allowed_registries:
        raise ValidationFailed(
            f"registry '{registry}' is not on the allow-list", code="image_registry_not_allowed", field="image"
        )
    return dict(
        image_reference=reference,
        image_digest=digest,
        min_driver_version=min_driver,
        base_image=base,
        project_image=project,
    )


def _validate_env(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise ValidationFailed("env must be a mapping of NAME: value", code="invalid_env", field="env")
    clean = {}
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_NAME.match(key):
            raise ValidationFailed(
                f"'{key}' is not a valid environment variable name", code="invalid_env_name", field="env"
            )
        if key.startswith(RESERVED_ENV_PREFIXES):
            raise ValidationFailed(f"'{key}' is set by the platform", code="reserved_env_name", field="env")
        clean[key] = "" if value is None else str(value)
    return clean


def _command(value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise ValidationFailed(f"cannot parse the command: {exc}", code="invalid_command", field="command")
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        argv = list(value)
    else:
        argv = []
    if not argv or not argv[0].strip():
        raise ValidationFailed("the command is empty", code="empty_command", field="command")
    return argv


def _name(value: Any) -> str | None:
    """A name to look up, or None for anything that is not a string (a list is not even a dict key)."""
    return value if isinstance(value, str) else None


def job_validate(*, user, data: dict[str, Any]) -> Resolved:
    """Check a submission up front; raise ValidationFailed (400, with field and code) or NotFound."""
    ref = reference.current()
    team = ref.teams.get(_name(data.get("team")))
    if team is None or not ref.is_member(user, team):
        raise NotFound("team not found (or you are not a member)", code="unknown_team")
    queue = ref.queues.get(_name(data.get("queue")))
    if queue is None:
        raise ValidationFailed(f"queue '{data.get('queue')}' does not exist", code="unknown_queue", field="queue")
    if not ref.queue_allows_team(queue, team):
        raise ValidationFailed(
            f"team {team.slug} may not use queue '{queue.name}'", code="queue_not_allowed", field="queue"
        )
    replicas = int(data.get("replicas") or 1)
    if replicas < 1 or replicas > 64:
        raise ValidationFailed("replicas must be between 1 and 64", code="invalid_replicas", field="replicas")
    if replicas > 1 and not queue.gang:
        raise ValidationFailed(
            f"multi-replica jobs need a gang-scheduled queue; '{queue.name}' is not",
            code="replicas_need_gang_queue",
            field="replicas",
        )
    card_mib, drivers = reference.cluster_facts(settings.TRAINYARD_DEFAULT_GPU_MEMORY_MIB)
    spec_name = data.get("spec")
    explicit = data.get("gpu_milli") is not None or data.get("gpu_memory_mib") is not None
    spec = None
    if spec_name:
        if explicit:
            raise ValidationFailed(
                "give a spec or an explicit gpu_milli/gpu_memory_mib, not both",
                code="spec_and_explicit_request",
                field="spec",
            )
        spec = ref.specs.get(_name(spec_name))
        if spec is None:
            raise ValidationFailed(f"spec '{spec_name}' does not exist", code="unknown_spec", field="spec")
        if not ref.queue_allows_spec(queue, spec):
            allowed = ", ".join(ref.queue_spec_names(queue)) or "none"
            raise ValidationFailed(
                f"queue '{queue.name}' does not allow spec '{spec.name}' (allowed: {allowed})",
                code="spec_not_allowed_in_queue",
                field="spec",
            )
        gpu_count = int(data.get("gpus") or spec.gpu_count)
        if gpu_count != spec.gpu_count and not spec.exclusive:
            raise ValidationFailed("only the guaranteed tier takes several GPUs", code="invalid_gpus", field="gpus")
        if gpu_count < 1 or gpu_count > 16:
            raise ValidationFailed("gpus must be between 1 and 16", code="invalid_gpus", field="gpus")
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
        default_timeout = min(spec.default_timeout_s, queue.max_timeout_s)
    elif explicit:
        if not queue.allow_explicit_request:
            raise ValidationFailed(
                f"queue '{queue.name}' takes specs only", code="explicit_request_not_allowed", field="gpu_milli"
            )
        milli = int(data.get("gpu_milli") or 0)
        memory = int(data.get("gpu_memory_mib") or 0)
        if not 1 <= milli <= 1000:
            raise ValidationFailed("gpu_milli must be 1..1000", code="invalid_gpu_milli", field="gpu_milli")
        if not 1 <= memory <= card_mib:
            raise ValidationFailed(
                f"gpu_memory_mib must be 1..{card_mib}", code="invalid_gpu_memory", field="gpu_memory_mib"
            )
        request = dict(
            spec=None,
            gpu_count=1,
            gpu_milli=milli,
            exclusive=milli == 1000,
            gpu_memory_eighths=None,
            gpu_memory_mib=card_mib if milli == 1000 else memory,
            cpu_milli=int(data.get("cpu_milli") or 2000),
            memory_mib=int(data.get("memory_mib") or 8192),
        )
        default_timeout = queue.default_timeout_s
    else:
        raise ValidationFailed("a spec is required", code="unknown_spec", field="spec")
    cards = request["gpu_count"] * replicas
    totals = dict(
        total_gpu_milli=request["gpu_milli"] * cards,
        total_gpu_memory_mib=request["gpu_memory_mib"] * cards,
        total_cpu_milli=request["cpu_milli"] * replicas,
        total_memory_mib=request["memory_mib"] * replicas,
    )
    vector = {k.removeprefix("total_"): v for k, v in totals.items()}
    over = quota.fits(vector, {}, queue.vector())
    if over:
        raise ValidationFailed(
            f"the request ({vector[over]} {over}) is larger than queue '{queue.name}' can ever hold "
            f"({queue.vector()[over]})",
            code="request_exceeds_queue_capability",
            field="spec",
        )
    over = quota.fits(vector, {}, team.vector())
    if over:
        raise ValidationFailed(
            f"the request ({vector[over]} {over}) is larger than team {team.slug}'s whole quota "
            f"({team.vector()[over]})",
            code="request_exceeds_team_quota",
            field="spec",
        )
    timeout = data.get("timeout_s")
    timeout = default_timeout if timeout in (None, "") else int(timeout)
    if timeout < 1:
        raise ValidationFailed("timeout_s must be positive", code="invalid_timeout", field="timeout_s")
    if timeout > queue.max_timeout_s:
        raise ValidationFailed(
            f"timeout {timeout} s is over queue '{queue.name}''s maximum of {queue.max_timeout_s} s",
            code="timeout_exceeds_queue_maximum",
            field="timeout_s",
        )
    if not data.get("image"):
        raise ValidationFailed("an image is required", code="unknown_image", field="image")
    image = _resolve_image(str(data["image"]), team, ref)
    needs = image["min_driver_version"]
    if needs and drivers and not any(pool.driver_satisfies(d, needs) for d in drivers):
        raise ValidationFailed(
            f"the image needs NVIDIA driver >= {image['min_driver_version']}; the newest node has "
            f"{max(drivers, key=pool.version_tuple)}",
            code="image_incompatible_with_all_nodes",
            field="image",
        )
    env = _validate_env(data.get("env"))
    command = _command(data.get("command"))
    args = data.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValidationFailed("args must be a list of strings", code="invalid_args", field="args")
    labels = data.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise ValidationFailed("labels must map strings to strings", code="invalid_labels", field="labels")
    max_retries = int(data.get("max_retries") if data.get("max_retries") is not None else 2)
    if not 0 <= max_retries <= 10:
        raise ValidationFailed("max_retries must be 0..10", code="invalid_max_retries", field="max_retries")
    name = (data.get("name") or command[0].rsplit("/", 1)[-1])[:120]
    paths = validation.job_paths(data, backend=settings.TRAINYARD_BACKEND)
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
            priority=validation.job_priority(data.get("priority"), user=user, team=team, queue=queue),
            timeout_s=timeout,
            max_retries=max_retries,
            tensorboard=bool(data.get("tensorboard")),
            tensorboard_logdir=paths.tensorboard_logdir,
            mounts=paths.mounts,
            labels=labels,
            ci=dict(data.get("ci") or {}),
        )
    )


def request_fingerprint(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def job_submit(
    *, user, data: dict[str, Any], idempotency_key: str | None = None, reproduced_from: Job | None = None
) -> tuple[Job, bool]:
    """Validate and create a pending job; returns (job, created). The same key and body return the first job."""
    fingerprint = request_fingerprint(data)
    resolved = job_validate(user=user, data=data)
    team = resolved.fields["team"]
    if idempotency_key:
        existing = Job.objects.filter(team=team, idempotency_key=idempotency_key).first()
        if existing is not None:
            return _same_request_or_conflict(existing, fingerprint), False
    try:
        with transaction.atomic():
            job = Job.objects.create(
                owner=user,
                idempotency_key=idempotency_key or None,
                request_fingerprint=fingerprint,
                reproduced_from=reproduced_from,
                state=JobState.PENDING,
                reason=PendingReason.QUEUED,
                **resolved.fields,
            )
            JobEvent.objects.create(
                job=job,
                kind="submitted",
                to_state=JobState.PENDING,
                actor=user.username,
                message=f"submitted to queue {job.queue.name}",
                data={"idempotency_key": idempotency_key} if idempotency_key else {},
            )
            if job.priority > job.queue.max_member_priority:
                _event(
                    job,
                    "priority_elevated",
                    actor=user.username,
                    message=f"priority {job.priority}, over queue {job.queue.name}'s maximum of "
                    f"{job.queue.max_member_priority} for members",
                    data={"priority": job.priority, "queue_maximum": job.queue.max_member_priority},
                )
    except IntegrityError:
        existing = Job.objects.filter(team=team, idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        return _same_request_or_conflict(existing, fingerprint), False
    queue_id = job.queue_id
    transaction.on_commit(lambda: _enqueue_dispatch(queue_id))
    log.info("job_submitted", job_id=str(job.id), team=team.slug, queue=job.queue.name)
    return job, True


def _same_request_or_conflict(existing: Job, fingerprint: str) -> Job:
    if existing.request_fingerprint != fingerprint:
        raise Conflict(
            "this Idempotency-Key was used for a different request",
            code="idempotency_key_reused",
            job_id=str(existing.id),
        )
    return existing


def _enqueue_dispatch(queue_id: int) -> None:
    from jobs.tasks import dispatch_queue

    dispatch_queue.delay(queue_id)


# ------------------------------------------------------------------------------------------- transitions


def _event(
    job: Job,
    kind: str,
    *,
    actor: str,
    message: str = "",
    level: str = "info",
    data=None,
    attempt: Attempt | None = None,
    from_state: str = "",
    to_state: str = "",
) -> JobEvent:
    return JobEvent.objects.create(
        job=job,
        attempt=attempt,
        kind=kind,
        actor=actor,
        message=message[:2000],
        level=level,
        data=data or {},
        from_state=from_state,
        to_state=to_state,
    )


def _release(job: Job, *, why: str) -> None:
    """Give back the job's quota reservation and its slices; safe to call again (releases once)."""
    for attempt in job.attempts.all():
        pool.slices_release(attempt_id=attempt.id, reason=why)
    if job.reserved:
        job.reserved = False
        queue_id = job.queue_id
        transaction.on_commit(lambda: _enqueue_dispatch(queue_id))


def job_transition(
    *,
    job_id,
    to: str,
    actor: str,
    reason: str = "",
    message: str = "",
    data=None,
    attempt: Attempt | None = None,
    level: str = "info",
) -> Job:
    """Move a job to `to`: row lock, allowed-transition table, idempotent, one event, releases on terminal."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state == to:
            return job
        if to not in ALLOWED[job.state]:
            raise InvalidTransition(f"a {job.state} job cannot become {to}", from_state=job.state, to_state=to)
        previous = job.state
        now = timezone.now()
        job.state = to
        if reason or to in TERMINAL or to == JobState.RUNNING:
            job.reason = reason
        if message:
            job.message = message
        if to == JobState.ADMITTED:
            job.admitted_at = now
            job.reserved = True
            job.queue_position = None
        if to == JobState.RUNNING and job.started_at is None:
            job.started_at = now
        if to in TERMINAL:
            job.finished_at = now
            job.queue_position = None
            _release(job, why=to)
            if job.tensorboard:
                from jobs.tensorboard import route_expire

                route_expire(job_id=job.id)
        if to == JobState.RETRYING:
            _release(job, why="retrying")
        job.save()
        _event(
            job,
            "state",
            actor=actor,
            from_state=previous,
            to_state=to,
            message=message or reason,
            data=data,
            attempt=attempt,
            level=level,
        )
    _broadcast(job)
    return job


def _broadcast(job: Job) -> None:
    job_id, state = str(job.id), job.state

    def send() -> None:
        try:
            from jobs.realtime import job_changed

            job_changed(job_id=job_id, state=state)
        except Exception:  # noqa: BLE001 - a missing listener must never fail a transition
            log.debug("broadcast_failed", job_id=job_id)

    transaction.on_commit(send)


# ------------------------------------------------------------------------------------------- dispatch


def queue_dispatch(*, queue_id: int) -> int:
    """Admit what fits from one queue, in priority then FIFO order; returns how many were admitted."""
    admitted_attempts: list[int] = []
    with transaction.atomic(durable=True):
        pool.pool_lock()
        queue = Queue.objects.select_for_update().get(pk=queue_id)
        pending = list(
            Job.objects.filter(queue=queue, state=JobState.PENDING)
            .select_related("team", "owner")
            .order_by("-priority", "submitted_at", "id")
        )
        if not pending:
            return 0
        team_ids = sorted({j.team_id for j in pending})
        teams = {t.id: t for t in Team.objects.select_for_update().filter(id__in=team_ids).order_by("id")}
        queue_used = quota.queue_usage(queue)
        team_used = {tid: quota.team_usage(t) for tid, t in teams.items()}
        position = 0
        blocked = False
        for job in pending:
            code, message = _admission_check(job, queue, teams[job.team_id], queue_used, team_used[job.team_id])
            if code is None and blocked and queue.ordering == Queue.Ordering.FIFO:
                code, message = PendingReason.BEHIND_HIGHER_PRIORITY, "waiting behind an earlier job (strict FIFO)"
            attempt = None
            if code is None:
                attempt = Attempt.objects.create(
                    job=job, number=job.attempts.count() + 1, backend=settings.TRAINYARD_BACKEND
                )
                try:
                    with transaction.atomic():
                        devices = pool.slices_place(job=job, attempt=attempt)
                except pool.NoPlacement as exc:
                    attempt.delete()
                    attempt = None
                    code, message = exc.reason, exc.message
            if code is not None:
                position += 1
                if code != PendingReason.QUEUE_CLOSED:
                    blocked = True
                if job.reason != code or job.queue_position != position:
                    if job.reason != code:
                        _event(job, "waiting", actor="dispatcher", message=message, data={"reason": code})
                    Job.objects.filter(pk=job.pk).update(reason=code, message=message, queue_position=position)
                continue
            assert attempt is not None
            node = devices[0].gpu.node if devices else None
            attempt.node = node
            attempt.placement = {"devices": [_device_dict(d) for d in devices]}
            attempt.save(update_fields=["node", "placement"])
            job_transition(
                job_id=job.id,
                to=JobState.ADMITTED,
                actor="dispatcher",
                attempt=attempt,
                message=f"admitted; placed on {', '.join(sorted({d.gpu.node.name for d in devices}))}",
                data=attempt.placement,
            )
            for name, value in job.total_request().items():
                queue_used[name] += value
                team_used[job.team_id][name] += value
            team_used[job.team_id]["jobs"] += 1
            admitted_attempts.append(attempt.id)
        for attempt_id in admitted_attempts:
            transaction.on_commit(lambda a=attempt_id: _enqueue_start(a))
    return len(admitted_attempts)


def _device_dict(device: LogicalDevice) -> dict:
    return {
        "gpu_uuid": device.gpu.uuid,
        "gpu_index": device.gpu.index,
        "node": device.gpu.node.name,
        "model": device.gpu.model,
        "compute_milli": device.compute_milli,
        "memory_mib": device.memory_mib,
        "exclusive": device.exclusive,
        "slice_id": device.id,
    }


def _admission_check(job: Job, queue: Queue, team: Team, queue_used: dict, team_used: dict):
    if queue.state == Queue.State.CLOSED:
        return PendingReason.QUEUE_CLOSED, f"queue {queue.name} is closed"
    request = job.total_request()
    over = quota.fits(request, queue_used, queue.vector())
    if over:
        return PendingReason.QUEUE_QUOTA_EXHAUSTED, (
            f"queue {queue.name} has {queue.vector()[over] - queue_used[over]} {over} free; "
            f"the job needs {request[over]}"
        )
    over = quota.fits(request, team_used, team.vector())
    if over:
        return PendingReason.TEAM_QUOTA_EXHAUSTED, (
            f"team {team.slug} has {team.vector()[over] - team_used[over]} {over} left; the job needs {request[over]}"
        )
    if team_used["jobs"] >= team.max_running_jobs:
        return PendingReason.TEAM_JOB_LIMIT, f"team {team.slug} already runs {team.max_running_jobs} jobs"
    if quota.user_running_jobs(team, job.owner_id) >= team.max_jobs_per_user:
        return PendingReason.USER_JOB_LIMIT, f"you already run {team.max_jobs_per_user} jobs in {team.slug}"
    return None, ""


def _enqueue_start(attempt_id: int) -> None:
    from jobs.tasks import start_attempt

    start_attempt.delay(attempt_id)


# ------------------------------------------------------------------------------------------- execution


def describe_attempt(attempt: Attempt) -> AttemptDescription:
    job = attempt.job
    devices = [
        Device(
            gpu_uuid=d["gpu_uuid"],
            gpu_index=d["gpu_index"],
            node=d["node"],
            compute_milli=d["compute_milli"],
            memory_mib=d["memory_mib"],
            exclusive=d["exclusive"],
        )
        for d in attempt.placement.get("devices", [])
    ]
    return AttemptDescription(
        job_id=str(job.id),
        attempt_id=attempt.id,
        attempt_number=attempt.number,
        name=job.name,
        owner=job.owner.username,
        team=job.team.slug,
        namespace=job.team.namespace,
        queue=job.queue.name,
        volcano_queue=job.queue.volcano_name,
        image=f"{job.image_reference}@{job.image_digest}" if job.image_digest else job.image_reference,
        command=list(job.command),
        args=list(job.args),
        env=dict(job.env),
        working_dir=job.working_dir,
        replicas=job.replicas,
        gpu_count=job.gpu_count,
        exclusive=job.exclusive,
        cpu_milli=job.cpu_milli,
        memory_mib=job.memory_mib,
        timeout_s=job.timeout_s,
        priority=job.priority,
        min_driver_version=job.min_driver_version,
        tensorboard=job.tensorboard,
        tensorboard_logdir=job.tensorboard_logdir,
        devices=devices,
        mounts=list(job.mounts),
        labels=dict(job.labels),
        gang=job.queue.gang and job.replicas > 1,
        secondary_network=job.queue.secondary_network,
    )


def attempt_start(*, attempt_id: int) -> None:
    """Hand an admitted attempt to the backend and record the reproduce record."""
    attempt = Attempt.objects.select_related("job__team", "job__queue", "job__owner", "job__spec", "node").get(
        pk=attempt_id
    )
    job = attempt.job
    if job.state != JobState.ADMITTED or attempt.state != AttemptState.PLACED:
        return
    desc = describe_attempt(attempt)
    backend = get_backend(attempt.backend)
    try:
        ref = backend.submit(desc)
    except Exception as exc:  # noqa: BLE001 - a backend failure is a platform failure of this attempt
        log.exception("attempt_submit_failed", job_id=str(job.id), attempt=attempt.number)
        attempt_finish(
            attempt_id=attempt.id, obs=Observation(phase="failed", reason="SubmitError", message=str(exc)[:500])
        )
        return
    with transaction.atomic():
        now = timezone.now()
        Attempt.objects.filter(pk=attempt.pk, state=AttemptState.PLACED).update(
            state=AttemptState.STARTING, backend_ref=ref, started_at=now
        )
        node = attempt.node
        reproduce = {
            "image_reference": job.image_reference,
            "image_digest": job.image_digest,
            "image_pinned": bool(job.image_digest),
            "spec": job.spec.name if job.spec else None,
            "request": {
                "gpu_count": job.gpu_count,
                "gpu_milli": job.gpu_milli,
                "gpu_memory_mib": job.gpu_memory_mib,
                "cpu_milli": job.cpu_milli,
                "memory_mib": job.memory_mib,
                "replicas": job.replicas,
            },
            "command": job.command,
            "args": job.args,
            "env": job.env,
            "working_dir": job.working_dir,
            "placement": attempt.placement,
            "node": node.name if node else None,
            "driver_version": node.driver_version if node else None,
            "cuda_version": node.cuda_version if node else None,
            "emulated_gpus": bool(node and node.emulated),
            "backend": attempt.backend,
            "platform_version": settings.PLATFORM_VERSION,
            "ci": job.ci,
            "attempt": attempt.number,
        }
        Job.objects.filter(pk=job.pk).update(reproduce=reproduce, deadline=now + timedelta(seconds=job.timeout_s))
        job_transition(
            job_id=job.id,
            to=JobState.STARTING,
            actor="backend",
            attempt=attempt,
            message=f"handed to the {attempt.backend} backend as {ref}",
        )
        if job.tensorboard:
            job_id = str(job.id)
            transaction.on_commit(lambda: _enqueue_tensorboard(job_id))


def _enqueue_tensorboard(job_id: str) -> None:
    from jobs.tasks import issue_tensorboard

    issue_tensorboard.delay(job_id)


def attempts_observe(*, backend_name: str | None = None) -> int:
    """Observe every live attempt of a backend in one batch and apply what changed."""
    backend_name = backend_name or settings.TRAINYARD_BACKEND
    live = list(
        Attempt.objects.filter(backend=backend_name, state__in=[AttemptState.STARTING, AttemptState.RUNNING]).exclude(
            backend_ref=""
        )
    )
    if not live:
        return 0
    observations = get_backend(backend_name).observe([a.backend_ref for a in live])
    changed = 0
    for attempt in live:
        obs = observations.get(attempt.backend_ref)
        if obs is None:
            continue
        if obs.phase == "running" and attempt.state == AttemptState.STARTING:
            with transaction.atomic():
                Attempt.objects.filter(pk=attempt.pk, state=AttemptState.STARTING).update(state=AttemptState.RUNNING)
                job = Job.objects.get(pk=attempt.job_id)
                if job.state == JobState.STARTING:
                    job_transition(
                        job_id=job.id,
                        to=JobState.RUNNING,
                        actor="backend",
                        attempt=attempt,
                        message=obs.message or "running",
                    )
            changed += 1
        elif obs.finished:
            attempt_finish(attempt_id=attempt.id, obs=obs)
            changed += 1
        elif obs.phase == "pending" and obs.message:
            job = attempt.job
            if job.message != obs.message:
                Job.objects.filter(pk=job.pk).update(message=obs.message[:2000])
                _event(job, "backend_pending", actor="backend", message=obs.message, attempt=attempt)
    return changed


def attempt_finish(*, attempt_id: int, obs: Observation) -> None:
    """Record how an attempt ended; classify failures; retry, or finish the job."""
    with transaction.atomic():
        attempt = Attempt.objects.select_for_update().select_related("job").get(pk=attempt_id)
        if attempt.is_finished:
            return
        job = Job.objects.select_for_update().get(pk=attempt.job_id)
        now = timezone.now()
        attempt.ended_at = now
        attempt.exit_code = obs.exit_code
        attempt.signal = obs.signal
        attempt.reason = (obs.reason or "")[:200]
        backend = get_backend(attempt.backend)
        node_unhealthy = _attempt_hit_unhealthy_gpu(attempt)
        if job.state == JobState.CANCELLING:
            attempt.state = AttemptState.TIMED_OUT if job.reason == "timeout" else AttemptState.CANCELLED
            attempt.save()
            final = JobState.TIMED_OUT if job.reason == "timeout" else JobState.CANCELLED
            job_transition(
                job_id=job.id,
                to=final,
                actor="backend",
                attempt=attempt,
                reason=job.reason,
                message="timed out and stopped" if final == JobState.TIMED_OUT else "cancelled",
            )
            return
        if obs.phase == "succeeded":
            attempt.state = AttemptState.SUCCEEDED
            attempt.save()
            Job.objects.filter(pk=job.pk).update(exit_code=obs.exit_code)
            job_transition(
                job_id=job.id, to=JobState.SUCCEEDED, actor="backend", attempt=attempt, message="exit code 0"
            )
            return
        tail = backend.log_tail(attempt.backend_ref) if attempt.backend_ref else ""
        verdict = classifier.classify(
            classifier.Observation(
                exit_code=obs.exit_code,
                signal=obs.signal,
                reason=obs.reason,
                log_tail=tail,
                node_unhealthy=node_unhealthy,
            )
        )
        attempt.state = AttemptState.LOST if obs.phase == "lost" else AttemptState.FAILED
        attempt.failure_class = verdict.failure_class
        attempt.reaction = verdict.reaction
        attempt.rule = verdict.rule
        attempt.save()
        detail = _describe_exit(obs)
        _event(
            job,
            "attempt_failed",
            actor="classifier",
            attempt=attempt,
            level="warning",
            message=f"attempt {attempt.number} {detail}: {verdict.failure_class} failure ({verdict.rule}); "
            f"{verdict.reaction.replace('_', ' ')}",
            data={
                "failure_class": verdict.failure_class,
                "reaction": verdict.reaction,
                "rule": verdict.rule,
                "exit_code": obs.exit_code,
                "signal": obs.signal,
                "reason": obs.reason,
            },
        )
        retry = verdict.reaction != "no_retry" and job.retries_used < job.max_retries
        Job.objects.filter(pk=job.pk).update(
            exit_code=obs.exit_code, failure_class=verdict.failure_class, suggestion=verdict.suggestion
        )
        if not retry:
            job_transition(
                job_id=job.id,
                to=JobState.FAILED,
                actor="classifier",
                attempt=attempt,
                reason=f"{verdict.failure_class}_failure",
                level="error",
                message=f"{detail}. {verdict.suggestion}".strip(),
            )
            return
        job = job_transition(
            job_id=job.id,
            to=JobState.RETRYING,
            actor="classifier",
            attempt=attempt,
            reason=verdict.rule,
            message=f"{detail}; retry {job.retries_used + 1} of {job.max_retries}",
        )
        updates: dict[str, Any] = {"retries_used": job.retries_used + 1}
        if verdict.reaction == "retry_elsewhere":
            uuids = [d["gpu_uuid"] for d in attempt.placement.get("devices", [])]
            updates["excluded_gpus"] = sorted(set(job.excluded_gpus) | set(uuids))
        Job.objects.filter(pk=job.pk).update(**updates)
        job_transition(
            job_id=job.id,
            to=JobState.PENDING,
            actor="classifier",
            reason=PendingReason.QUEUED,
            message="queued for another attempt" + (" on other GPUs" if "excluded_gpus" in updates else ""),
        )
        queue_id = job.queue_id
        transaction.on_commit(lambda: _enqueue_dispatch(queue_id))


def _describe_exit(obs: Observation) -> str:
    if obs.signal:
        return f"was killed by signal {obs.signal}"
    if obs.exit_code is not None:
        return f"exited with code {obs.exit_code}" + (f" ({obs.reason})" if obs.reason not in {"", "Error"} else "")
    return f"ended: {obs.reason or 'unknown'}" + (f" — {obs.message}" if obs.message else "")


def _attempt_hit_unhealthy_gpu(attempt: Attempt) -> bool:
    uuids = [d["gpu_uuid"] for d in attempt.placement.get("devices", [])]
    return GPU.objects.filter(uuid__in=uuids).exclude(health=GPU.Health.HEALTHY).exists()


# ------------------------------------------------------------------------------------------- user actions


def job_cancel(*, job_id, actor: str) -> Job:
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state in TERMINAL or job.state == JobState.CANCELLING:
            if job.state == JobState.CANCELLED or job.state == JobState.CANCELLING:
                return job
            raise InvalidTransition(
                f"the job already {job.state.replace('_', ' ')}", from_state=job.state, to_state=JobState.CANCELLED
            )
        live = (
            job.attempts.filter(state__in=[AttemptState.STARTING, AttemptState.RUNNING]).exclude(backend_ref="").first()
        )
        if live is None:
            for attempt in job.attempts.filter(state=AttemptState.PLACED):
                Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.CANCELLED, ended_at=timezone.now())
            return job_transition(
                job_id=job.id,
                to=JobState.CANCELLED,
                actor=actor,
                reason="cancelled_by_user",
                message=f"cancelled by {actor}",
            )
        job = job_transition(
            job_id=job.id,
            to=JobState.CANCELLING,
            actor=actor,
            reason="cancelled_by_user",
            message=f"cancel requested by {actor}",
        )
        attempt_stop_on_commit(live)
        return job


def attempt_stop_on_commit(attempt: Attempt, *, reason: str = "", robust: bool = False) -> None:
    """Ask the backend to stop the attempt once this transaction commits; `reason` is what its observation will
    report (see Backend.cancel). `robust`: a failing stop is logged instead of raised (the observer settles it)."""
    backend_name, ref = attempt.backend, attempt.backend_ref

    def stop() -> None:
        get_backend(backend_name).cancel(ref, grace_s=settings.TRAINYARD_CANCEL_GRACE_S, reason=reason)

    transaction.on_commit(stop, robust=robust)


def timeouts_enforce() -> int:
    """Stop every job past its wall-clock limit; it ends as timed_out once the backend confirms."""
    expired = list(
        Job.objects.filter(state__in=[JobState.STARTING, JobState.RUNNING], deadline__lt=timezone.now()).values_list(
            "id", flat=True
        )
    )
    for job_id in expired:
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job_id)
            if job.state not in {JobState.STARTING, JobState.RUNNING}:
                continue
            live = job.attempts.filter(state__in=[AttemptState.STARTING, AttemptState.RUNNING]).first()
            job_transition(
                job_id=job.id,
                to=JobState.CANCELLING,
                actor="timeout-reaper",
                reason="timeout",
                message=f"ran past its {job.timeout_s} s limit; stopping",
                level="warning",
            )
            if live is not None and live.backend_ref:
                attempt_stop_on_commit(live)
            else:
                job_transition(job_id=job.id, to=JobState.TIMED_OUT, actor="timeout-reaper", reason="timeout")
    return len(expired)


def _clone_data(job: Job, *, pin_digest: bool) -> dict[str, Any]:
    image = job.base_image.name if job.base_image else (job.project_image.name if job.project_image else None)
    if pin_digest or image is None:
        image = f"{job.image_reference}@{job.image_digest}" if job.image_digest else job.image_reference
    data: dict[str, Any] = {
        "name": job.name,
        "team": job.team.slug,
        "queue": job.queue.name,
        "image": image,
        "command": job.command,
        "args": job.args,
        "env": job.env,
        "working_dir": job.working_dir,
        "replicas": job.replicas,
        "priority": job.priority,
        "timeout_s": job.timeout_s,
        "max_retries": job.max_retries,
        "tensorboard": job.tensorboard,
        "tensorboard_logdir": job.tensorboard_logdir,
        "mounts": job.mounts,
        "labels": job.labels,
        "ci": job.ci,
    }
    if job.spec:
        data["spec"] = job.spec.name
        if job.spec.exclusive:
            data["gpus"] = job.gpu_count
    else:
        data["gpu_milli"], data["gpu_memory_mib"] = job.gpu_milli, job.gpu_memory_mib
    return data


def job_resubmit(*, job_id, user) -> Job:
    """Retry a finished job as a new job with the same request (the image tag is resolved again)."""
    job = Job.objects.select_related("team", "queue", "spec", "base_image", "project_image").get(pk=job_id)
    if not job.is_terminal:
        raise InvalidTransition("only a finished job can be resubmitted", from_state=job.state, to_state="pending")
    new, _ = job_submit(user=user, data=_clone_data(job, pin_digest=False))
    _event(new, "resubmitted", actor=user.username, message=f"resubmitted from job {job.id}")
    return new


def job_reproduce(*, job_id, user) -> Job:
    """A new job with the same pinned image digest, spec, command and env as the original."""
    job = Job.objects.select_related("team", "queue", "spec", "base_image", "project_image").get(pk=job_id)
    new, _ = job_submit(user=user, data=_clone_data(job, pin_digest=True), reproduced_from=job)
    _event(
        new,
        "reproduced",
        actor=user.username,
        message=f"reproduces job {job.id}",
        data={"image_digest": job.image_digest},
    )
    return new
