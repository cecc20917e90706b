"""The attempt lifecycle: start, observe, finish, cancel, time out, and the reconciler that re-drives them.

The database drives the lifecycle (DESIGN.md §3): a Celery message only wakes a worker early, and
`lifecycle_reconcile` (beat, and on every worker start) finds each attempt whose next step is overdue and runs
that step again. Every step is idempotent. One writer per attempt state:

- placed → starting (claimed, no backend ref yet): `_attempt_claim`;
- starting + backend ref: `_attempt_handed_over` (after `Backend.submit`, itself a no-op when repeated);
- starting → running: `attempts_observe`;
- → succeeded | failed | lost | cancelled | timed_out: `attempt_finish` (and `job_cancel` for an attempt that
  never left `placed`);
- stop requested (cancel, timeout, share enforcement): `attempt_stop_on_commit`.

Fencing: a backend reports an attempt `lost` only once its processes are known dead, and the database allows one
unfinished attempt per job, so a retry never runs beside its predecessor.
"""

from __future__ import annotations

import dataclasses
import math
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from cluster.models import GPU
from cluster.services import slices_follow_assignment
from jobs import checkpoints, classifier
from jobs.backends import AttemptDescription, Device, Observation, checkpoint_sync, get_backend
from jobs.backends.base import DISK_FULL, UNOBSERVABLE, disk_full_message
from jobs.code import code_description
from jobs.models import Attempt, Job, JobEvent
from jobs.services import InvalidTransition, event_record, job_transition
from jobs.states import TERMINAL, AttemptState, JobState, PendingReason
from jobs.store import reason_at_once
from kernel.sentences import stored
from kernel.units import human_duration
from kernel.wake import dispatch_soon

log = structlog.get_logger(__name__)
LIVE = (AttemptState.STARTING, AttemptState.RUNNING)
PREEMPTED_REASON = "Preempted"  # what a preempted attempt's observation reports
# Failures before the command started, whose message names what failed (the checkpoint to resume from, a dataset).
STARTUP_FAILURE_REASONS = frozenset(
    {
        checkpoint_sync.RESTORE_FAILED,
        checkpoint_sync.RESTORE_STORE_DOWN,
        "DatasetFetchError",
        "DatasetChanged",
        "DatasetCacheFull",
    }
)


# ------------------------------------------------------------------------------------------- start

# The words of the classifier's verdicts in a stored sentence (each a msgid with context "stored").
FAILURE_WORDS = {"user": "user failure", "platform": "platform failure", "resource": "resource failure"}
REACTION_WORDS = {"retry": "retry", "no_retry": "no retry", "retry_elsewhere": "retry elsewhere"}
ALREADY = {
    JobState.SUCCEEDED: "the job already succeeded",
    JobState.FAILED: "the job already failed",
    JobState.CANCELLED: "the job already cancelled",
    JobState.TIMED_OUT: "the job already timed out",
}


def _gpu_products(job: Job, attempt: Attempt) -> list[str]:
    """The product labels of the models a model-pinned job was placed on (GFD writes spaces as dashes)."""
    if not job.gpu_models:
        return []
    models = {d.get("model", "") for d in attempt.placement.get("devices", [])}
    return sorted(m.replace(" ", "-") for m in models if m)


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
        outbound_network=job.queue.outbound_network,
        gpu_products=_gpu_products(job, attempt),
        checkpoint=checkpoints.attempt_plan(attempt),
        preempt_notice_s=math.ceil(settings.TRAINYARD_PREEMPT_GRACE_S) if job.preemptible else 0,
        priority_class="preemptible" if job.preemptible else job.queue.priority_class,
        mig_profile=job.mig_profile,
        datasets=list(job.datasets),
        code=code_description(team_slug=job.team.slug, digest=job.code_digest) if job.code_digest else {},
        runtime_class=job.queue.runtime_class,
        dedicated_pools=[p for p in job.queue.pools or [] if p in settings.TRAINYARD_DEDICATED_POOLS],
    )


def attempt_start(*, attempt_id: int) -> None:
    """Hand an admitted attempt to the backend. Safe to run twice, at once or after a crash at any point: the
    claim is a row update, the backend's submit is a no-op when repeated, and the hand-over records one ref."""
    attempt = _attempt_claim(attempt_id=attempt_id)
    if attempt is None:
        return
    desc = describe_attempt(attempt)
    try:
        ref = get_backend(attempt.backend).submit(desc)
    except Exception as exc:  # noqa: BLE001 - a backend failure is a platform failure of this attempt
        log.exception("attempt_submit_failed", job_id=str(attempt.job_id), attempt=attempt.number)
        # A backend may name the cause (`reason`, e.g. ClusterUnsupported) so the classifier can tell a refusal
        # that no retry will change from a passing failure.
        reason = str(getattr(exc, "reason", "") or "SubmitError")
        attempt_finish(attempt_id=attempt.id, obs=Observation(phase="failed", reason=reason, message=str(exc)[:500]))
        return
    _attempt_handed_over(attempt_id=attempt.id, ref=ref)


def _attempt_claim(*, attempt_id: int) -> Attempt | None:
    """placed → starting (no ref yet), or the attempt as it is when a start was claimed but never handed over;
    None when there is nothing to start."""
    with transaction.atomic():
        job_id = Attempt.objects.filter(pk=attempt_id).values_list("job_id", flat=True).first()
        if job_id is None:
            return None
        _lock(job_id=job_id, attempt_id=attempt_id)
        attempt = Attempt.objects.select_related("job__team", "job__queue", "job__owner", "job__spec", "node").get(
            pk=attempt_id
        )
        if attempt.backend_ref:
            return None
        job = attempt.job
        if attempt.state == AttemptState.PLACED:
            if job.state != JobState.ADMITTED:
                return None
            attempt.state = AttemptState.STARTING
            attempt.started_at = timezone.now()
            attempt.save(update_fields=["state", "started_at"])
            return attempt
        if attempt.state == AttemptState.STARTING:
            return attempt  # claimed by a start that died before the hand-over: submit again (a no-op if done)
        return None


def backend_runtime(name: str) -> dict:
    """What a backend runs a command with: the local backend says which host Python and PATH; a cluster backend
    runs the job's image (no `runtime` of its own)."""
    if name == "local":
        from jobs.backends.local import runtime

        return runtime()
    return {"kind": "container", "image_used": True}


def _lock(*, job_id, attempt_id: int) -> None:
    """Row locks in the one order every writer uses: the job, then its attempt."""
    list(Job.objects.select_for_update().filter(pk=job_id).values_list("pk", flat=True))
    list(Attempt.objects.select_for_update().filter(pk=attempt_id).values_list("pk", flat=True))


def _attempt_handed_over(*, attempt_id: int, ref: str) -> None:
    """Record the backend ref; move the job to starting, or stop what was started if the job moved on."""
    with transaction.atomic():
        job_id = Attempt.objects.values_list("job_id", flat=True).get(pk=attempt_id)
        _lock(job_id=job_id, attempt_id=attempt_id)
        job = Job.objects.select_related("spec").get(pk=job_id)
        attempt = Attempt.objects.select_related("node").get(pk=attempt_id)
        if attempt.backend_ref:
            return
        if attempt.state != AttemptState.STARTING:
            # Ended (cancelled) while its start was in flight: stop whatever the backend started.
            backend_name = attempt.backend
            transaction.on_commit(
                lambda: get_backend(backend_name).cancel(ref, grace_s=settings.TRAINYARD_CANCEL_GRACE_S),
                robust=True,
            )
            return
        attempt.backend_ref = ref
        attempt.save(update_fields=["backend_ref"])
        if job.state == JobState.CANCELLING:
            attempt_stop_on_commit(attempt, robust=True)  # cancelled while it was being started
            return
        if attempt.preempt_requested_at is not None:
            attempt_stop_on_commit(attempt, reason=PREEMPTED_REASON, robust=True)  # preempted while starting
        if job.state != JobState.ADMITTED:
            return
        now = timezone.now()
        node = attempt.node
        runtime = backend_runtime(attempt.backend)
        image_used = runtime.get("image_used", True)
        reproduce = {
            # What ran: the image only where the backend runs one; the local backend runs on the host (runtime).
            "image_reference": job.image_reference if image_used else None,
            "image_digest": job.image_digest if image_used else None,
            "image_pinned": bool(job.image_digest) if image_used else False,
            "image_used": image_used,
            "image_requested": {"reference": job.image_reference, "digest": job.image_digest},
            "runtime": runtime,
            "spec": job.spec.name if job.spec else None,
            "request": {
                "gpu_count": job.gpu_count,
                "gpu_milli": job.gpu_milli,
                "gpu_memory_mib": job.gpu_memory_mib,
                "cpu_milli": job.cpu_milli,
                "memory_mib": job.memory_mib,
                "replicas": job.replicas,
                "gpu_models": job.gpu_models,
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
            # What each dataset was at submission (name, version, source, size and file count) and where it sat.
            "datasets": job.datasets,
            "code_digest": job.code_digest or None,
        }
        pinning = getattr(get_backend(attempt.backend), "cpu_pinning", None)
        pinned = pinning(ref) if pinning is not None else None
        if pinned is not None:  # shown with the attempt on the job page, and kept in the reproduce record
            attempt.placement = {**attempt.placement, "cpu_pinning": pinned}
            attempt.save(update_fields=["placement"])
            reproduce["placement"] = attempt.placement
        Job.objects.filter(pk=job.pk).update(reproduce=reproduce, deadline=now + timedelta(seconds=job.timeout_s))
        job_transition(
            job_id=job.id,
            to=JobState.STARTING,
            actor="backend",
            attempt=attempt,
            message=stored("handed to the %(backend)s backend as %(ref)s", backend=attempt.backend, ref=ref),
        )
        if job.tensorboard:
            job_id_text = str(job.id)
            transaction.on_commit(lambda: _enqueue_tensorboard(job_id_text), robust=True)


def _enqueue_tensorboard(job_id: str) -> None:
    from jobs.tasks import issue_tensorboard

    issue_tensorboard.delay(job_id)


# ------------------------------------------------------------------------------------------- observe and finish


def attempts_observe(*, backend_name: str | None = None, attempt_ids: list[int] | None = None) -> int:
    """Observe every live attempt of a backend in one batch and apply what changed."""
    backend_name = backend_name or settings.TRAINYARD_BACKEND
    live_qs = Attempt.objects.filter(backend=backend_name, state__in=LIVE).exclude(backend_ref="")
    if attempt_ids is not None:
        live_qs = live_qs.filter(pk__in=attempt_ids)
    live = list(live_qs)
    if not live:
        return 0
    backend = get_backend(backend_name)
    observations = backend.observe([a.backend_ref for a in live])
    _hold_checkpoint_uploads(backend, live)
    changed = 0
    for attempt in live:
        obs = observations.get(attempt.backend_ref)
        if obs is None:
            continue
        # What one attempt's observation costs stays with it: an error here is logged and the pass goes on.
        try:
            changed += _apply_observation(attempt, obs, backend)
        except Exception:  # noqa: BLE001
            log.exception("attempt_observation_failed", attempt=attempt.id, job_id=str(attempt.job_id))
    return changed


def nodes_reachability_check(*, backend_name: str | None = None) -> int:
    """Between inventory syncs, follow which cluster nodes are Ready (at most every TRAINYARD_K8S_NODE_CHECK_S, on
    the observe loop): a node NotReady or deleted leaves placement within seconds and comes back when Ready, so a
    retry is never placed on a node that is gone. Returns how many nodes changed."""
    from django.core.cache import cache

    backend_name = backend_name or settings.TRAINYARD_BACKEND
    backend = get_backend(backend_name)
    nodes_ready = getattr(backend, "nodes_ready", None)
    if nodes_ready is None or not cache.add("trainyard:node-check", 1, timeout=settings.TRAINYARD_K8S_NODE_CHECK_S):
        return 0
    from cluster.services import nodes_reachability_apply

    return nodes_reachability_apply(backend=backend_name, ready=nodes_ready(), complete=True)


def _unobservable(attempt: Attempt, obs: Observation, backend) -> int:
    """The backend cannot tell this attempt's state (its state files cannot be read or written): say so on the
    job once, and when it lasts past TRAINYARD_OBSERVE_FAILING_S stop every process of the attempt (fencing) and
    end it as a platform failure, retried like a lost attempt."""
    now = timezone.now()
    since = attempt.observe_failing_since
    if since is None:
        Attempt.objects.filter(pk=attempt.pk, observe_failing_since__isnull=True).update(observe_failing_since=now)
        event_record(
            attempt.job, "observe_failing", actor="backend", level="warning", message=obs.message, attempt=attempt
        )
        return 0
    waited = (now - since).total_seconds()
    if waited < settings.TRAINYARD_OBSERVE_FAILING_S:
        return 0
    fence = getattr(backend, "fence", None)
    if fence is not None and fence(attempt.backend_ref):
        return 0  # processes still alive: never a retry beside them; the next pass tries again
    attempt_finish(
        attempt_id=attempt.id,
        obs=Observation(
            phase="lost",
            reason="ObserveFailed",
            message=stored(
                "its state could not be read for %(waited)s (%(why)s); every process of the attempt was stopped",
                waited=human_duration(waited),
                why=obs.message,
            ),
            ended_at=now.timestamp(),
        ),
    )
    return 1


def _apply_observation(attempt: Attempt, obs: Observation, backend) -> int:
    """Apply one attempt's observation; 1 when its state changed."""
    changed = 0
    if obs.phase == UNOBSERVABLE:
        return _unobservable(attempt, obs, backend)
    if attempt.observe_failing_since is not None:
        Attempt.objects.filter(pk=attempt.pk).update(observe_failing_since=None)
        event_record(attempt.job, "observe_recovered", actor="backend", message=stored("its state can be read again"),
               attempt=attempt)  # fmt: skip
    if obs.log_lines_lost and not obs.finished:
        _logs_degraded(attempt, obs)
    if obs.disk_full:
        _disk_full(attempt, obs.disk_full)
    if obs.assigned_gpus and not obs.finished:
        _follow_assignment(attempt, obs.assigned_gpus)
    if obs.checkpoints and not obs.finished:
        with transaction.atomic():  # two observers at once record each checkpoint once
            _lock(job_id=attempt.job_id, attempt_id=attempt.id)
            checkpoints.checkpoints_record(attempt=attempt, manifest=obs.checkpoints)
    if obs.phase == "running" and attempt.state == AttemptState.STARTING:
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=attempt.job_id)
            began = _process_time(obs.started_at)
            updated = Attempt.objects.filter(pk=attempt.pk, state=AttemptState.STARTING).update(
                state=AttemptState.RUNNING, **({"started_at": began} if began else {})
            )
            if updated and job.state == JobState.STARTING:
                job_transition(
                    job_id=job.id,
                    to=JobState.RUNNING,
                    actor="backend",
                    attempt=attempt,
                    message=obs.message or stored("running"),
                    started_at=began,
                )
        changed += 1
    elif obs.finished:
        attempt_finish(attempt_id=attempt.id, obs=obs)
        changed += 1
    elif obs.phase == "pending" and obs.message:
        job = attempt.job
        if job.message != obs.message:
            Job.objects.filter(pk=job.pk).update(message=obs.message[:2000])
            event_record(job, "backend_pending", actor="backend", message=obs.message, attempt=attempt)
    return changed


def _follow_assignment(attempt: Attempt, assigned: dict[str, tuple[str, ...]]) -> None:
    """The device plugin gave the attempt other cards than placed (it could not be told which): move the slices
    in the ledger to the cards really in use, and the attempt's placement with them, once."""
    devices = attempt.placement.get("devices", [])
    if all(d.get("gpu_uuid") in assigned.get(d.get("node", ""), (d.get("gpu_uuid"),)) for d in devices):
        return
    moved = dict(slices_follow_assignment(attempt_id=attempt.id, assigned=assigned))
    if not moved:
        return
    placement = {
        **attempt.placement,
        "devices": [{**d, "gpu_uuid": moved.get(d["gpu_uuid"], d["gpu_uuid"])} for d in devices],
    }
    Attempt.objects.filter(pk=attempt.pk).update(placement=placement)
    attempt.placement = placement
    event_record(
        attempt.job,
        "slices_moved",
        actor="backend",
        attempt=attempt,
        message=stored(
            "the device plugin chose other cards than placed: %(moves)s",
            moves=", ".join(f"{a} -> {b}" for a, b in moved.items()),
        ),
        data={"moved": moved},
    )


def _hold_checkpoint_uploads(backend, live: list[Attempt]) -> None:
    """Checkpoint uploads of teams over their storage quota wait (nothing is lost); the others go on."""
    hold = getattr(backend, "hold_checkpoints", None)
    if hold is None:
        return
    teams = dict(Job.objects.filter(pk__in={a.job_id for a in live}).values_list("id", "team_id"))
    over = checkpoints.teams_over_storage_quota(set(teams.values()))
    for attempt in live:
        hold(attempt.backend_ref, teams.get(attempt.job_id) in over)


def _logs_degraded(attempt: Attempt, obs: Observation) -> None:
    """One platform event per attempt when its log store fails; its count is brought up to date."""
    data = {"lines_lost": obs.log_lines_lost, "error": obs.log_error}
    cause = obs.log_error or "log store unavailable"
    message = stored(
        "logging degraded: %(n)s lines lost (%(cause)s); the job keeps running", n=obs.log_lines_lost, cause=cause
    )
    event = JobEvent.objects.filter(attempt=attempt, kind="logs_degraded").first()
    if event is None:
        event_record(
            attempt.job, "logs_degraded", actor="platform", level="warning", attempt=attempt, message=message, data=data
        )
    elif event.data != data:
        JobEvent.objects.filter(pk=event.pk).update(data=data, message=message)


def _disk_full(attempt: Attempt, seen: dict) -> None:
    """One warning per attempt when its work or checkpoint filesystem runs full (the job may still free space)."""
    if JobEvent.objects.filter(attempt=attempt, kind="disk_full").exists():
        return
    event_record(
        attempt.job, "disk_full", actor="backend", level="warning", attempt=attempt,
        message=disk_full_message(seen), data=seen,
    )  # fmt: skip


def _ended_at(obs: Observation):
    """The process's own end time where the backend knows it, else now."""
    return _process_time(obs.ended_at) or timezone.now()


def _process_time(stamp: float | None):
    """A time the backend read off the attempt's own process (epoch seconds), never later than now; None unknown."""
    if stamp is None:
        return None
    return min(timezone.now(), datetime.fromtimestamp(stamp, tz=UTC))


def _hidden_by_sandbox(job: Job, attempt: Attempt, tail: str) -> str:
    """When a local job failed on a missing file that this machine has (a script in /tmp or a home folder, which
    the sandbox hides on purpose), say so and how to bring it, instead of "read the end of the log"."""
    if attempt.backend != "local" or "No such file or directory" not in tail:
        return ""
    from jobs.backends import sandbox

    if not sandbox.enabled():
        return ""
    for word in [*job.command, *job.args]:
        candidate = str(word).split("=", 1)[-1]
        if candidate.startswith("/") and os.path.exists(candidate):
            return stored(
                "%(path)s is on this machine but hidden by the job's sandbox: bring it with the job's code "
                "(trainyard run, or code: in the job file)",
                path=candidate,
            )
    return ""


def attempt_finish(*, attempt_id: int, obs: Observation) -> None:
    """Record how an attempt ended; classify failures; retry, or finish the job."""
    with transaction.atomic():
        _lock(job_id=Attempt.objects.values_list("job_id", flat=True).get(pk=attempt_id), attempt_id=attempt_id)
        attempt = Attempt.objects.select_related("job").get(pk=attempt_id)
        if attempt.is_finished:
            return
        job = Job.objects.get(pk=attempt.job_id)
        attempt.ended_at = _ended_at(obs)
        began = _process_time(obs.started_at)
        if began is not None and began <= attempt.ended_at:
            attempt.started_at = began  # its process's own start, not when the platform asked for it
        if obs.log_lines_lost:
            _logs_degraded(attempt, obs)
        if obs.disk_full:
            _disk_full(attempt, obs.disk_full)
        if obs.checkpoints:
            checkpoints.checkpoints_record(attempt=attempt, manifest=obs.checkpoints)
        attempt.exit_code = obs.exit_code
        attempt.signal = obs.signal
        attempt.reason = (obs.reason or "")[:200]
        if job.store_wait_since is not None and obs.reason != checkpoint_sync.RESTORE_STORE_DOWN:
            # Its checkpoint was restored (or it ended otherwise): an outage it waited out is over.
            Job.objects.filter(pk=job.pk).update(store_wait_since=None, not_before=None)
            job.store_wait_since = job.not_before = None
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
                message=stored("timed out and stopped") if final == JobState.TIMED_OUT else stored("cancelled"),
            )
            return
        if obs.phase == "succeeded":
            attempt.state = AttemptState.SUCCEEDED
            attempt.save()
            Job.objects.filter(pk=job.pk).update(exit_code=obs.exit_code)
            job_transition(
                job_id=job.id, to=JobState.SUCCEEDED, actor="backend", attempt=attempt, message=stored("exit code 0")
            )
            return
        if attempt.preempt_requested_at is not None:
            attempt.state = AttemptState.PREEMPTED
            attempt.reason = PREEMPTED_REASON
            attempt.save()
            _requeue_preempted(job, attempt, detail=_describe_exit(obs))
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
        hint = _hidden_by_sandbox(job, attempt, tail)
        if hint:
            verdict = dataclasses.replace(verdict, suggestion=hint)
        attempt.state = AttemptState.LOST if obs.phase == "lost" else AttemptState.FAILED
        attempt.failure_class = verdict.failure_class
        attempt.reaction = verdict.reaction
        attempt.rule = verdict.rule
        attempt.save()
        detail = _describe_exit(obs)
        event_record(
            job,
            "attempt_failed",
            actor="classifier",
            attempt=attempt,
            level="warning",
            message=stored(
                "attempt %(n)s %(detail)s: %(failure)s (%(rule)s); %(reaction)s",
                n=attempt.number,
                detail=detail,
                failure=stored(FAILURE_WORDS[verdict.failure_class])
                if verdict.failure_class in FAILURE_WORDS
                else f"{verdict.failure_class} failure",
                rule=verdict.rule,
                reaction=stored(REACTION_WORDS[verdict.reaction])
                if verdict.reaction in REACTION_WORDS
                else verdict.reaction,
            ),
            data={
                "failure_class": verdict.failure_class,
                "reaction": verdict.reaction,
                "rule": verdict.rule,
                "exit_code": obs.exit_code,
                "signal": obs.signal,
                "reason": obs.reason,
            },
        )
        if obs.reason == checkpoint_sync.RESTORE_STORE_DOWN and verdict.reaction != "no_retry":
            waited = (timezone.now() - job.store_wait_since).total_seconds() if job.store_wait_since else 0.0
            if waited < settings.TRAINYARD_STORE_OUTAGE_WAIT_S:
                _wait_for_store(job, attempt, detail=detail, waited=waited)
                return
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
                message=stored("%(detail)s. %(suggestion)s", detail=detail, suggestion=verdict.suggestion)
                if verdict.suggestion
                else detail,
            )
            return
        job = job_transition(
            job_id=job.id,
            to=JobState.RETRYING,
            actor="classifier",
            attempt=attempt,
            reason=verdict.rule,
            message=stored(
                "%(detail)s; retry %(n)s of %(max)s", detail=detail, n=job.retries_used + 1, max=job.max_retries
            ),
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
            message=stored("queued for another attempt on other GPUs")
            if "excluded_gpus" in updates
            else stored("queued for another attempt"),
        )
        reason_at_once(job, actor="dispatcher")
        transaction.on_commit(dispatch_soon, robust=True)


def _wait_for_store(job: Job, attempt: Attempt, *, detail: str, waited: float) -> None:
    """The checkpoint to resume from could not be restored because the store is down: back in the line, held back
    by a not-before that doubles (capped at TRAINYARD_STORE_RETRY_MAX_S), without using a retry, until the outage
    has lasted TRAINYARD_STORE_OUTAGE_WAIT_S; after that its retries count as for any platform failure."""
    now = timezone.now()
    since = job.store_wait_since or now
    left = settings.TRAINYARD_STORE_OUTAGE_WAIT_S - waited
    delay = max(1.0, min(settings.TRAINYARD_STORE_RETRY_MAX_S, max(2.0, waited), left))
    gives_up = since + timedelta(seconds=settings.TRAINYARD_STORE_OUTAGE_WAIT_S)
    job_transition(
        job_id=job.id,
        to=JobState.RETRYING,
        actor="classifier",
        attempt=attempt,
        reason="checkpoint-store-unavailable",
        message=stored(
            "%(detail)s; the object store is unreachable: tried again in %(delay)s, no retry used", detail=detail,
            delay=human_duration(delay),
        ),
    )  # fmt: skip
    Job.objects.filter(pk=job.pk).update(not_before=now + timedelta(seconds=delay), store_wait_since=since)
    job_transition(
        job_id=job.id,
        to=JobState.PENDING,
        actor="classifier",
        reason=PendingReason.STORE_UNAVAILABLE,
        message=stored(
            "waiting for the object store since %(since)s UTC: next try in %(delay)s; retries count again after "
            "%(until)s UTC", since=since.strftime("%H:%M:%S"), delay=human_duration(delay),
            until=gives_up.strftime("%H:%M:%S"),
        ),
    )  # fmt: skip
    transaction.on_commit(lambda: _dispatch_at(delay), robust=True)


def _dispatch_at(delay: float) -> None:
    """A pass when a held-back retry may go (the beat's full pass comes anyway, within its period)."""
    from celery import current_app

    from kernel.wake import DISPATCH_TASK

    current_app.send_task(DISPATCH_TASK, args=[None], countdown=delay + 0.5)


def _requeue_preempted(job: Job, attempt: Attempt, *, detail: str) -> None:
    """A preempted attempt's job waits again: no retry used, and the next attempt resumes from its checkpoint."""
    event_record(
        job,
        "attempt_preempted",
        actor="preemption",
        attempt=attempt,
        level="warning",
        message=f"attempt {attempt.number} preempted ({detail}); not a failure, no retry used",
        data={"exit_code": attempt.exit_code, "signal": attempt.signal},
    )
    job_transition(
        job_id=job.id, to=JobState.RETRYING, actor="preemption", attempt=attempt, reason="preempted",
        message=f"attempt {attempt.number} preempted; back in the queue",
    )  # fmt: skip
    job_transition(
        job_id=job.id,
        to=JobState.PENDING,
        actor="preemption",
        reason=PendingReason.QUEUED,
        message="preempted: waits for capacity and resumes from its last checkpoint",
    )
    reason_at_once(job, actor="dispatcher")


def attempt_preempt(*, attempt_id: int, for_job: dict[str, str]) -> bool:
    """Ask a preemptible job's live attempt to yield its cards to `for_job` (who needs them: id, team, queue,
    owner). The notice is SIGTERM; SIGKILL follows after TRAINYARD_PREEMPT_GRACE_S. Returns whether a notice
    was sent (False when it ended, was already told, or is being cancelled)."""
    with transaction.atomic():
        job_id = Attempt.objects.filter(pk=attempt_id).values_list("job_id", flat=True).first()
        if job_id is None:
            return False
        _lock(job_id=job_id, attempt_id=attempt_id)
        attempt = Attempt.objects.select_related("job").get(pk=attempt_id)
        job = attempt.job
        if (
            attempt.is_finished
            or attempt.preempt_requested_at is not None
            or not job.preemptible
            or job.state not in {JobState.ADMITTED, JobState.STARTING, JobState.RUNNING}
        ):
            return False
        now = timezone.now()
        attempt.preempt_requested_at = now
        Attempt.objects.filter(pk=attempt.pk).update(preempt_requested_at=now)
        grace = math.ceil(settings.TRAINYARD_PREEMPT_GRACE_S)
        who = f"job {for_job['job']} of team {for_job['team']} in queue {for_job['queue']}"
        event_record(
            job,
            "preemption",
            actor="preemption",
            attempt=attempt,
            level="warning",
            message=f"preempted: {who} needs the cards back; {grace} s to save a checkpoint",
            data={**{f"for_{k}": v for k, v in for_job.items()}, "grace_s": grace},
        )
        if attempt.state == AttemptState.PLACED:
            # Never handed to the backend: nothing runs, it ends here.
            attempt.state = AttemptState.PREEMPTED
            attempt.ended_at = now
            attempt.reason = PREEMPTED_REASON
            attempt.save(update_fields=["state", "ended_at", "reason"])
            _requeue_preempted(job, attempt, detail="before it started")
        elif attempt.backend_ref:
            attempt_stop_on_commit(attempt, reason=PREEMPTED_REASON, robust=True)
        # Starting without a ref: its hand-over sees the request and stops what it started.
    log.info("attempt_preempted", job_id=str(job.id), attempt=attempt.number, for_job=for_job["job"])
    return True


def _describe_exit(obs: Observation) -> str:
    if obs.reason == DISK_FULL and obs.message:
        return stored("ended on a full disk (%(message)s)", message=obs.message)
    if obs.reason == "OOMKilled" and obs.message:
        return stored("was killed: %(message)s", message=obs.message)  # the backend measured the peak
    if obs.signal:
        return stored("was killed by signal %(signal)s", signal=obs.signal)
    if obs.exit_code is not None:
        if obs.reason in {"", "Error"}:
            return stored("exited with code %(code)s", code=obs.exit_code)
        if obs.message and obs.reason in STARTUP_FAILURE_REASONS:
            # The command never started: the message says what stopped it (which checkpoint or dataset, and why).
            return stored(
                "exited with code %(code)s (%(reason)s): %(message)s",
                code=obs.exit_code,
                reason=obs.reason,
                message=obs.message,
            )
        return stored("exited with code %(code)s (%(reason)s)", code=obs.exit_code, reason=obs.reason)
    if obs.message:
        return stored("ended: %(reason)s — %(message)s", reason=obs.reason or "unknown", message=obs.message)
    return stored("ended: %(reason)s", reason=obs.reason or "unknown")


def _attempt_hit_unhealthy_gpu(attempt: Attempt) -> bool:
    uuids = [d["gpu_uuid"] for d in attempt.placement.get("devices", [])]
    return GPU.objects.filter(uuid__in=uuids).exclude(health=GPU.Health.HEALTHY).exists()


# ------------------------------------------------------------------------------------------- user actions


# ------------------------------------------------------------------------------------------- stop


def _live_attempt(job: Job) -> Attempt | None:
    """The job's attempt that runs or is being started (at most one: a database constraint)."""
    return job.attempts.filter(state__in=LIVE).first()


def job_cancel(*, job_id, actor: str, reason: str = "cancelled_by_user", message: str = "") -> Job:
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state in TERMINAL or job.state == JobState.CANCELLING:
            if job.state == JobState.CANCELLED or job.state == JobState.CANCELLING:
                return job
            raise InvalidTransition(
                stored(ALREADY[job.state])
                if job.state in ALREADY
                else f"the job already {job.state.replace('_', ' ')}",
                from_state=job.state,
                to_state=JobState.CANCELLED,
            )
        live = _live_attempt(job)
        if live is None:
            job.attempts.filter(state=AttemptState.PLACED).update(state=AttemptState.CANCELLED, ended_at=timezone.now())
            return job_transition(
                job_id=job.id,
                to=JobState.CANCELLED,
                actor=actor,
                reason=reason,
                message=message or stored("cancelled by %(who)s", who=actor),
            )
        job = job_transition(
            job_id=job.id,
            to=JobState.CANCELLING,
            actor=actor,
            reason=reason,
            message=message or stored("cancel requested by %(who)s", who=actor),
        )
        if live.backend_ref:
            attempt_stop_on_commit(live, robust=True)
        # Without a ref the start is in flight: its hand-over sees `cancelling` and stops what it started.
        return job


def attempt_stop_on_commit(attempt: Attempt, *, reason: str = "", robust: bool = False) -> None:
    """Ask the backend to stop the attempt once this transaction commits; `reason` is what its observation will
    report (see Backend.cancel). `robust`: a failing stop is logged instead of raised (the reconciler repeats it
    once the grace period is past)."""
    Attempt.objects.filter(pk=attempt.pk).update(stop_requested_at=timezone.now())
    backend_name, ref = attempt.backend, attempt.backend_ref
    grace = settings.TRAINYARD_PREEMPT_GRACE_S if reason == PREEMPTED_REASON else settings.TRAINYARD_CANCEL_GRACE_S

    def stop() -> None:
        get_backend(backend_name).cancel(ref, grace_s=grace, reason=reason)

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
            live = _live_attempt(job)
            job_transition(
                job_id=job.id,
                to=JobState.CANCELLING,
                actor="timeout-reaper",
                reason="timeout",
                message=stored("ran past its %(limit)s limit; stopping", limit=human_duration(job.timeout_s)),
                level="warning",
            )
            if live is not None and live.backend_ref:
                attempt_stop_on_commit(live, robust=True)
            elif live is None:
                job_transition(job_id=job.id, to=JobState.TIMED_OUT, actor="timeout-reaper", reason="timeout")
    return len(expired)


# ------------------------------------------------------------------------------------------- reconciler


def lifecycle_reconcile() -> dict[str, int]:
    """Re-drive every attempt whose next step is overdue; returns how many of each kind were found.

    - admitted but never claimed, or claimed but never handed over (a worker died, a message was lost,
      the database or broker was down): start again;
    - stopping past the grace period (or never asked): ask again, which kills at once;
    - every live attempt is observed, so one whose supervisor died is fenced and finished.
    """
    now = timezone.now()
    start_due = now - timedelta(seconds=settings.TRAINYARD_START_OVERDUE_S)
    stop_due = now - timedelta(seconds=settings.TRAINYARD_CANCEL_GRACE_S + settings.TRAINYARD_STOP_OVERDUE_S)
    report = {"started": 0, "stopped": 0, "observed": 0}
    unstarted = Attempt.objects.filter(
        Q(state=AttemptState.PLACED, job__state=JobState.ADMITTED, job__admitted_at__lt=start_due)
        | Q(state=AttemptState.STARTING, backend_ref="", started_at__lt=start_due)
    ).values_list("id", "job_id")
    for attempt_id, job_id in list(unstarted):
        log.warning("lifecycle_restart_overdue", attempt_id=attempt_id, job_id=str(job_id))
        attempt_start(attempt_id=attempt_id)
        report["started"] += 1
    stopping = (
        Attempt.objects.filter(state__in=LIVE, job__state=JobState.CANCELLING)
        .exclude(backend_ref="")
        .filter(Q(stop_requested_at__isnull=True) | Q(stop_requested_at__lt=stop_due))
    )
    for attempt in list(stopping):
        log.warning("lifecycle_stop_overdue", attempt_id=attempt.id, job_id=str(attempt.job_id))
        with transaction.atomic():
            attempt_stop_on_commit(attempt, robust=True)
        report["stopped"] += 1
    # Preempted attempts still alive past their notice (or never told, their stop lost): asked again, which kills.
    preempt_due = now - timedelta(seconds=settings.TRAINYARD_PREEMPT_GRACE_S + settings.TRAINYARD_STOP_OVERDUE_S)
    yielding = (
        Attempt.objects.filter(state__in=LIVE, preempt_requested_at__isnull=False)
        .exclude(job__state=JobState.CANCELLING)
        .exclude(backend_ref="")
        .filter(Q(stop_requested_at__isnull=True) | Q(stop_requested_at__lt=preempt_due))
    )
    for attempt in list(yielding):
        log.warning("lifecycle_preempt_overdue", attempt_id=attempt.id, job_id=str(attempt.job_id))
        with transaction.atomic():
            attempt_stop_on_commit(attempt, reason=PREEMPTED_REASON, robust=True)
        report["stopped"] += 1
    for backend_name in set(Attempt.objects.filter(state__in=LIVE).values_list("backend", flat=True)):
        report["observed"] += attempts_observe(backend_name=backend_name)
    return report
