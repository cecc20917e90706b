"""Running a job again: resubmit (after a failure, from its checkpoint) and reproduce (the same bytes)."""

from __future__ import annotations

from typing import Any

from jobs.models import Job
from jobs.services.common import InvalidTransition
from jobs.services.submission import job_submit
from jobs.services.transitions import event_record
from kernel.sentences import stored


def _enqueue_start(attempt_id: int) -> None:
    from jobs.tasks import start_attempt

    start_attempt.delay(attempt_id)


def _clone_data(job: Job, *, pin_digest: bool) -> dict[str, Any]:
    image = job.base_image.name if job.base_image else (job.project_image.name if job.project_image else None)
    if image is None or (pin_digest and job.image_digest):
        # The same bytes: the pinned digest. A catalog image that was never resolved (unresolved on the local
        # backend) is named from the catalog again, as it was the first time.
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
    if job.preemptible:
        data["preemptible"] = True
    if job.code_digest:
        data["code"] = job.code_digest
    if job.watch:
        data["watch"] = job.watch
    if job.datasets:
        from jobs.datasets import requested

        data["datasets"] = requested(job.datasets)
    if job.gpu_models:
        data["gpu_models"] = job.gpu_models
    if job.spec:
        data["spec"] = job.spec.name
        if job.spec.exclusive:
            data["gpus"] = job.gpu_count
    else:
        data["gpu_milli"], data["gpu_memory_mib"] = job.gpu_milli, job.gpu_memory_mib
    return data


def _resume_data(job: Job, resume: bool) -> dict[str, Any]:
    """`resume_from` for a retry or reproduction: the original job, when asked (its checkpoints, or the ones it
    resumed from itself while it saved none)."""
    if not resume:
        return {}
    from jobs.checkpoints import latest

    source = job if latest(job.id) is not None or not job.resume_from_id else job.resume_from
    return {"resume_from": str(source.id)}


def job_resubmit(*, job_id, user, resume: bool = True) -> Job:
    """Retry a finished job as a new job with the same request (the image tag is resolved again); with `resume`,
    the new job starts from the latest checkpoint of the original."""
    job = Job.objects.select_related("team", "queue", "spec", "base_image", "project_image").get(pk=job_id)
    if not job.is_terminal:
        raise InvalidTransition("only a finished job can be resubmitted", from_state=job.state, to_state="pending")
    new, _ = job_submit(user=user, data={**_clone_data(job, pin_digest=False), **_resume_data(job, resume)})
    event_record(new, "resubmitted", actor=user.username, message=stored("resubmitted from job %(job)s", job=job.id))
    return new


def job_reproduce(*, job_id, user, resume: bool = False) -> Job:
    """A new job with the same pinned image digest, spec, command and env as the original; with `resume`, it
    starts from the original's latest checkpoint."""
    job = Job.objects.select_related("team", "queue", "spec", "base_image", "project_image").get(pk=job_id)
    data = {**_clone_data(job, pin_digest=True), **_resume_data(job, resume)}
    new, _ = job_submit(user=user, data=data, reproduced_from=job)
    event_record(
        new,
        "reproduced",
        actor=user.username,
        message=stored("reproduces job %(job)s", job=job.id),
        data={"image_digest": job.image_digest},
    )
    return new


def job_submission_data(job: Job) -> dict[str, Any]:
    """What was asked for when `job` was submitted, as a submission body: the start of "run again with changes"
    and of a template saved from a job (the catalog image by name, so its tag is resolved again; no CI facts)."""
    data = _clone_data(job, pin_digest=False)
    data.pop("ci", None)
    return data


def reproduce_data(job: Job) -> dict[str, Any]:
    """The submission body Reproduce sends for `job` (the pinned image digest, the code snapshot, CI facts): what
    its exported job file holds (jobs/jobfile.py)."""
    return _clone_data(job, pin_digest=True)
