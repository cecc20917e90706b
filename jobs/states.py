"""Job states and the one table of allowed transitions (DESIGN.md §3)."""

from django.db import models


class JobState(models.TextChoices):
    PENDING = "pending"
    ADMITTED = "admitted"
    STARTING = "starting"
    RUNNING = "running"
    RETRYING = "retrying"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


S = JobState
TERMINAL = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.TIMED_OUT})
ACTIVE = frozenset({S.ADMITTED, S.STARTING, S.RUNNING, S.CANCELLING})
ALLOWED: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.ADMITTED, S.CANCELLED, S.FAILED}),
    S.ADMITTED: frozenset({S.STARTING, S.RETRYING, S.CANCELLING, S.CANCELLED, S.FAILED, S.TIMED_OUT}),
    S.STARTING: frozenset({S.RUNNING, S.SUCCEEDED, S.FAILED, S.RETRYING, S.CANCELLING, S.TIMED_OUT}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.RETRYING, S.CANCELLING, S.TIMED_OUT}),
    S.RETRYING: frozenset({S.PENDING, S.CANCELLED, S.FAILED}),
    S.CANCELLING: frozenset({S.CANCELLED, S.SUCCEEDED, S.FAILED, S.TIMED_OUT}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.TIMED_OUT: frozenset(),
}


class AttemptState(models.TextChoices):
    PLACED = "placed"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    LOST = "lost"
    PREEMPTED = "preempted"  # stopped to give its cards back: not a failure, not counted against retries


ATTEMPT_FINISHED = frozenset(
    {
        AttemptState.SUCCEEDED,
        AttemptState.FAILED,
        AttemptState.CANCELLED,
        AttemptState.TIMED_OUT,
        AttemptState.LOST,
        AttemptState.PREEMPTED,
    }
)


class PendingReason(models.TextChoices):
    QUEUED = "queued"
    QUEUE_QUOTA_EXHAUSTED = "queue_quota_exhausted"
    TEAM_QUOTA_EXHAUSTED = "team_quota_exhausted"
    TEAM_JOB_LIMIT = "team_job_limit"
    USER_JOB_LIMIT = "user_job_limit"
    NO_CAPACITY = "no_capacity"
    IMAGE_INCOMPATIBLE = "image_incompatible_with_all_nodes"
    GPU_MODEL_UNAVAILABLE = "gpu_model_unavailable"
    QUEUE_CLOSED = "queue_closed"
    WAITING_FOR_GANG = "waiting_for_gang"
    BEHIND_HIGHER_PRIORITY = "behind_earlier_job"
    STORE_UNAVAILABLE = "waiting_for_object_store"


# Reasons of a waiting job that no pass has weighed in its line: just queued, or in a closed queue. A strictly FIFO
# queue holds a new job behind an earlier one only when that one has any other reason (jobs.store).
UNDECIDED = (PendingReason.QUEUED.value, PendingReason.QUEUE_CLOSED.value)
