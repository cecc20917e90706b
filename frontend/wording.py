"""What the portal says about states, reasons and failure classes, in words a user can act on (translated)."""

from __future__ import annotations

from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _

from jobs.states import TERMINAL, AttemptState, JobState, PendingReason

STATE_LABELS: dict[str, Promise] = {
    JobState.PENDING: _("pending"),
    JobState.ADMITTED: _("admitted"),
    JobState.STARTING: _("starting"),
    JobState.RUNNING: _("running"),
    JobState.RETRYING: _("retrying"),
    JobState.CANCELLING: _("cancelling"),
    JobState.SUCCEEDED: _("succeeded"),
    JobState.FAILED: _("failed"),
    JobState.CANCELLED: _("cancelled"),
    JobState.TIMED_OUT: _("timed out"),
}

ATTEMPT_STATE_LABELS: dict[str, Promise] = {
    AttemptState.PLACED: _("placed"),
    AttemptState.STARTING: _("starting"),
    AttemptState.RUNNING: _("running"),
    AttemptState.SUCCEEDED: _("succeeded"),
    AttemptState.FAILED: _("failed"),
    AttemptState.CANCELLED: _("cancelled"),
    AttemptState.TIMED_OUT: _("timed out"),
    AttemptState.LOST: _("lost"),
    AttemptState.PREEMPTED: _("preempted"),
}

# One sentence per reason a job can wait for (jobs.states.PendingReason); a test checks none is missing.
PENDING_REASONS: dict[str, Promise] = {
    PendingReason.QUEUED: _("Its queue's and its team's quota allow it; the dispatcher is looking for GPUs for it."),
    PendingReason.QUEUE_QUOTA_EXHAUSTED: _(
        "The queue's capacity is taken by running jobs; it starts when enough of them finish."
    ),
    PendingReason.TEAM_QUOTA_EXHAUSTED: _(
        "Your team's quota is taken by its running jobs; it starts when some of them finish, or when an admin "
        "raises the quota."
    ),
    PendingReason.TEAM_JOB_LIMIT: _("Your team already runs as many jobs at once as it may."),
    PendingReason.USER_JOB_LIMIT: _("You already run as many jobs at once as one member of this team may."),
    PendingReason.NO_CAPACITY: _(
        "The quota allows it, but no healthy GPU has enough free compute and memory for it right now."
    ),
    PendingReason.IMAGE_INCOMPATIBLE: _("No node has an NVIDIA driver new enough for the job's image."),
    PendingReason.GPU_MODEL_UNAVAILABLE: _(
        "None of the GPU models the job accepts has a healthy card on a ready node; it starts when one is back."
    ),
    PendingReason.QUEUE_CLOSED: _("An admin closed the queue; nothing new starts until it reopens."),
    PendingReason.WAITING_FOR_GANG: _("Waiting until GPUs for all replicas are free at the same time."),
    PendingReason.BEHIND_HIGHER_PRIORITY: _(
        "The queue is strictly first in, first out, and a job ahead of this one cannot start yet."
    ),
    PendingReason.STORE_UNAVAILABLE: _(
        "The object store could not be reached to restore its checkpoint; it is tried again after a pause, without "
        "using up its retries, until the outage has lasted longer than the platform waits."
    ),
}

OTHER_REASONS: dict[str, Promise] = {
    "cancelled_by_user": _("Cancelled by a user."),
    "timeout": _("Ran past its time limit and was stopped."),
    "user_failure": _("The job itself failed (its code, input or request); retrying would not help."),
    "platform_failure": _("The platform failed under the job (node, GPU, network or image pull)."),
    "resource_failure": _("The job ran out of a resource it asked for."),
    "preempted": _(
        "Preempted: quota-holding work needed its GPUs. It waits for capacity and resumes from its last checkpoint."
    ),
}

FAILURE_CLASSES: dict[str, Promise] = {
    "user": _("user: the job's code, input or request"),
    "platform": _("platform: the node, GPU, network or image pull"),
    "resource": _("resource: ran out of what it asked for"),
}

REACTIONS: dict[str, Promise] = {
    "retry": _("retry"),
    "no_retry": _("no retry"),
    "retry_elsewhere": _("retry on other GPUs"),
}


def state_label(state: str) -> str:
    return str(STATE_LABELS.get(state, state))


def reason_sentence(reason: str) -> str:
    """A plain sentence for a reason code; an unknown code (a rule name, say) is shown as it is."""
    if not reason:
        return ""
    sentence = PENDING_REASONS.get(reason) or OTHER_REASONS.get(reason)
    return str(sentence) if sentence else reason


def is_terminal(state: str) -> bool:
    return state in TERMINAL


# Monitoring's own words: alert levels and states, rule metrics, the actions a rule takes, GPU faults.
MONITORING_WORDS: dict[str, Promise] = {
    "warning": _("warning"),
    "critical": _("critical"),
    "fatal": _("fatal"),
    "firing": _("firing"),
    "acknowledged": _("acknowledged"),
    "resolved": _("resolved"),
    "gpu_memory_pct": _("GPU memory used, % of the card"),
    "gpu_temperature_c": _("GPU temperature, °C"),
    "gpu_power_w": _("GPU power draw, W"),
    "gpu_utilization_pct": _("GPU utilization, %"),
    "job_failure_rate": _("failed jobs, % of jobs finished in the window"),
    "queue_depth": _("pending jobs in a queue"),
    "gpu_fault": _("GPU out of service for one of the listed faults"),
    "notify": _("notify"),
    "webhook": _("webhook"),
    "quarantine_gpu": _("quarantine the GPU"),
    "restart_job": _("restart the job"),
    "xid": _("fatal Xid error"),
    "gpu_lost": _("GPU lost"),
    "driver_reset": _("driver reset required"),
    "probe_failed": _("health probe failing"),
    "unhealthy": _("device unhealthy"),
}


def monitoring_word(value: str) -> str:
    return str(MONITORING_WORDS.get(value, value))


# What a timeline entry that is not a state change records (JobEvent.kind), and who did it (JobEvent.actor).
EVENT_KINDS: dict[str, Promise] = {
    "submitted": _("submitted"),
    "submitted_from_template": _("submitted from a template"),
    "resubmitted": _("resubmitted"),
    "reproduced": _("reproduction"),
    "waiting": _("waiting"),
    "backend_pending": _("backend"),
    "attempt_failed": _("attempt failed"),
    "priority_elevated": _("priority above the members' maximum"),
    "checkpoint_saved": _("checkpoint saved"),
    "checkpoint_deleted": _("checkpoint deleted"),
    "checkpoint_unsaved": _("checkpoint not saved"),
    "checkpoint_sync_failing": _("checkpoint upload failing"),
    "checkpoint_upload_waiting": _("checkpoint upload waiting"),
    "logs_degraded": _("logging degraded"),
    "gpu_share_exceeded": _("GPU share exceeded"),
    "restart_requested": _("restart requested"),
    "alert": _("alert"),
    "slice_moved": _("placement corrected"),
    "slices_moved": _("placement corrected"),
}

ACTORS: dict[str, Promise] = {
    "dispatcher": _("the dispatcher"),
    "backend": _("the backend"),
    "classifier": _("the failure classifier"),
    "platform": _("the platform"),
    "monitoring": _("monitoring"),
    "timeout-reaper": _("the time-limit reaper"),
    "checkpoint-sync": _("checkpoint sync"),
    "retention": _("checkpoint retention"),
    "health-probe": _("the health probe"),
}


def event_kind(kind: str) -> str:
    return str(EVENT_KINDS.get(kind, kind))


def actor_label(actor: str) -> str:
    """A platform component in words; a user name (or `alert:<rule>`) as it is."""
    if actor.startswith("alert:"):
        return str(_("alert rule %(rule)s")) % {"rule": actor.removeprefix("alert:")}
    return str(ACTORS.get(actor, actor))
