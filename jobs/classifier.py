"""Failure classification: exit code, signal, reason, log text and node health → class and reaction.

The rules are rows of `FailureRule` (admin-editable); `DEFAULT_RULES` seeds them. The lowest `order` that
matches wins. When none does, a plain non-zero exit of the user's own process (no signal, no platform reason,
no sign of trouble on the node) is the user's and is not retried; anything else unknown (a signal nobody
explained, a lost attempt) is retried up to the job's limit.
"""

import re
from dataclasses import dataclass

from jobs.models import FailureRule

DEFAULT_RULES = [
    dict(
        name="gpu-share-exceeded",
        order=5,
        reason_pattern=r"^GpuShareExceeded$",
        failure_class="user",
        reaction="no_retry",
        suggestion="The job held more GPU memory than its share of the card, so the platform stopped it to protect "
        "the jobs sharing that card: use a larger spec (performance or guaranteed) or a smaller batch size.",
    ),
    dict(
        name="oom-killed",
        order=10,
        reason_pattern=r"^OOMKilled$",
        failure_class="user",
        reaction="no_retry",
        suggestion="The container ran out of host memory: choose a spec with more memory per GPU.",
    ),
    dict(
        name="cuda-out-of-memory",
        order=20,
        log_pattern=r"CUDA out of memory|CUDA error: out of memory",
        failure_class="user",
        reaction="no_retry",
        suggestion="The job ran out of GPU memory: use a larger spec (performance or guaranteed) "
        "or a smaller batch size.",
    ),
    dict(
        name="xid-gpu-lost",
        order=30,
        log_pattern=r"\bXid\b|GPU is lost|fallen off the bus",
        failure_class="platform",
        reaction="retry_elsewhere",
        suggestion="The GPU failed under the job; it is retried on another card.",
    ),
    dict(
        name="nccl-timeout",
        order=40,
        log_pattern=r"NCCL.*(timeout|Timeout|timed out)|Watchdog caught collective",
        failure_class="platform",
        reaction="retry_elsewhere",
        suggestion="Collective communication timed out; retried with the workers placed elsewhere.",
    ),
    dict(
        name="node-unhealthy",
        order=50,
        node_unhealthy=True,
        failure_class="platform",
        reaction="retry_elsewhere",
        suggestion="The node or GPU turned unhealthy; retried elsewhere.",
    ),
    dict(
        name="deadline-exceeded",
        order=55,
        reason_pattern=r"^DeadlineExceeded$",
        failure_class="user",
        reaction="no_retry",
        suggestion="The job ran past its time limit (the pod's active deadline): raise the job's timeout.",
    ),
    dict(
        name="pods-refused",
        order=52,
        # The API server refused the pods Volcano creates (ResourceQuota, PodSecurity, a missing service account, an
        # invalid spec): the same pods would be refused again, and no card is at fault.
        reason_pattern=r"^PodsRefused$",
        failure_class="platform",
        reaction="no_retry",
        suggestion="The cluster refused to create the job's pods (the message says why: a quota, a security policy, a "
        "missing service account or an invalid field). A retry would be refused the same way: an admin fixes the "
        "namespace or the platform's settings, then the job is resubmitted.",
    ),
    dict(
        name="cluster-unsupported",
        order=51,
        reason_pattern=r"^ClusterUnsupported$",
        failure_class="platform",
        reaction="no_retry",
        suggestion="The cluster cannot run the platform's jobs as it is (the message says what is missing: a newer "
        "Kubernetes, or Volcano). An admin upgrades or installs it; then the job is resubmitted.",
    ),
    dict(
        name="evicted-or-lost",
        order=60,
        # Volcano records a preemption or reclaim as `Evict`; a graceful node shutdown ends pods as `Terminated`.
        reason_pattern=r"^(Evicted|Evict|NodeLost|Preempt\w*|NodeShutdown|Shutdown|Terminated|Lost)$",
        failure_class="platform",
        reaction="retry_elsewhere",
        suggestion="The platform stopped the job (eviction, lost node or preemption); retried elsewhere.",
    ),
    dict(
        name="image-pull",
        order=70,
        reason_pattern=r"ImagePullBackOff|ErrImagePull|ImagePullTimeout",
        failure_class="platform",
        reaction="retry",
        suggestion="The image could not be pulled in time; retried.",
    ),
    dict(
        name="killed-by-platform-signal",
        order=80,
        signals=[9],
        failure_class="platform",
        reaction="retry_elsewhere",
        suggestion="The process was killed from outside; retried elsewhere.",
    ),
    dict(
        name="user-exit-1-2",
        order=90,
        exit_codes=[1, 2],
        failure_class="user",
        reaction="no_retry",
        suggestion="The command exited with an error: read the end of the log.",
    ),
    dict(
        name="dataset-cache-full",
        order=58,
        reason_pattern=r"^DatasetCacheFull$",
        failure_class="resource",
        reaction="no_retry",
        suggestion="The node's dataset cache has no room for the job's datasets next to those running jobs use: "
        "try again when they end, or ask an admin to raise TRAINYARD_DATASET_CACHE_BYTES.",
    ),
    dict(
        name="dataset-changed",
        order=57,
        reason_pattern=r"^DatasetChanged$",
        failure_class="user",
        reaction="no_retry",
        suggestion="The files under the dataset's prefix in the object store are no longer the version that was "
        "registered (files added, removed or resized since): register them as a new version of the dataset and "
        "submit again naming it. Not retried: a retry would find the same files.",
    ),
    dict(
        name="dataset-fetch-failed",
        order=59,
        reason_pattern=r"^DatasetFetchError$",
        failure_class="platform",
        reaction="retry",
        suggestion="A dataset could not be fetched from the object store (or no longer matches its registration); "
        "the log says which. Retried.",
    ),
    dict(
        name="code-fetch-failed",
        order=60,
        reason_pattern=r"^CodeFetchError$",
        failure_class="platform",
        reaction="retry",
        suggestion="The job's code snapshot could not be fetched from the object store into the pod (the log says "
        "why: the store, or bytes that no longer match the digest). Retried.",
    ),
    dict(
        name="checkpoint-restore-failed",
        order=56,
        reason_pattern=r"^CheckpointRestoreError$",
        failure_class="platform",
        reaction="no_retry",
        suggestion="The checkpoint to resume from could not be restored: it is missing from the object store or its "
        "bytes no longer match their checksum (the message says which). Restoring it again would fail the same "
        "way: resubmit without resuming, or resume from a job whose checkpoint is intact.",
    ),
    dict(
        name="checkpoint-store-unavailable",
        order=57,
        reason_pattern=r"^CheckpointStoreUnavailable$",
        failure_class="platform",
        reaction="retry",
        suggestion="The object store could not be reached to restore the checkpoint to resume from; retried.",
    ),
    dict(
        name="disk-full",
        order=54,
        # The job's work or checkpoint filesystem ran full (the local supervisor saw it): a rerun would fill it again.
        reason_pattern=r"^DiskFull$",
        failure_class="resource",
        reaction="no_retry",
        suggestion="The job's work or checkpoint disk ran full, so it could not go on: write less (keep fewer "
        "checkpoints, delete old ones as new ones are written) or ask an admin for more room. It is not retried, "
        "since a rerun would fill the disk again.",
    ),
    dict(
        name="exit-137-oom",
        order=95,
        exit_codes=[137],
        failure_class="resource",
        reaction="no_retry",
        suggestion="Killed with exit 137, usually the memory limit: choose a spec with more memory.",
    ),
]


@dataclass(frozen=True)
class Observation:
    """What a backend saw when an attempt ended."""

    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    log_tail: str = ""
    node_unhealthy: bool = False


@dataclass(frozen=True)
class Verdict:
    failure_class: str
    reaction: str
    rule: str
    suggestion: str


UNKNOWN = Verdict("platform", "retry", "unknown", "The failure was not recognised; retried up to the job's limit.")
USER_EXIT = Verdict(
    "user",
    "no_retry",
    "user-exit",
    "The command exited with a non-zero code of its own: read the end of the log. It is not retried, since a rerun "
    "of the same command would most likely fail the same way.",
)
# What backends report for a process that ended by itself with a non-zero code (Kubernetes: "Error").
PLAIN_EXIT_REASONS = frozenset({"", "Error"})


def is_plain_user_exit(obs: "Observation") -> bool:
    """The user's own process exited by itself with a code below 128 (128+N is a shell's way to say signal N)."""
    return (
        obs.exit_code is not None
        and 0 < obs.exit_code < 128
        and not obs.signal
        and obs.reason in PLAIN_EXIT_REASONS
        and not obs.node_unhealthy
    )


def seed_default_rules() -> None:
    for data in DEFAULT_RULES:
        FailureRule.objects.get_or_create(name=data["name"], defaults=data)


def _matches(rule: FailureRule, obs: Observation) -> bool:
    checks = []
    if rule.exit_codes:
        checks.append(obs.exit_code in rule.exit_codes)
    if rule.signals:
        checks.append(obs.signal in rule.signals)
    if rule.reason_pattern:
        checks.append(bool(obs.reason) and re.search(rule.reason_pattern, obs.reason) is not None)
    if rule.log_pattern:
        checks.append(bool(obs.log_tail) and re.search(rule.log_pattern, obs.log_tail) is not None)
    if rule.node_unhealthy:
        checks.append(obs.node_unhealthy)
    return bool(checks) and all(checks)


def classify(obs: Observation, rules: list[FailureRule] | None = None) -> Verdict:
    if rules is None:
        rules = list(FailureRule.objects.filter(enabled=True).order_by("order", "name"))
    for rule in rules:
        try:
            if _matches(rule, obs):
                return Verdict(rule.failure_class, rule.reaction, rule.name, rule.suggestion)
        except re.error:
            continue  # a broken regex typed by an admin must not stop classification
    if is_plain_user_exit(obs):
        return USER_EXIT
    return UNKNOWN
