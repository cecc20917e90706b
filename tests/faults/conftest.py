"""The fault suite's harness: a seeded platform on an emulated node, and the end-state checks every fault ends with.

Every test drives the lifecycle the way beat would (dispatch, then the reconciler, which also observes) and ends
with `assert_settled`: exactly one recorded final state, no slice held, no process of any attempt left, and
each attempt's command run at most once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jobs.tests.conftest import platform  # noqa: F401 - the same seeded platform as the lifecycle tests

TERMINAL_STATES = {"succeeded", "failed", "cancelled", "timed_out"}


@pytest.fixture(autouse=True)
def _markers_outside_the_job(settings):
    """These jobs record each run in a marker file outside their own folders, which the sandbox (rightly)
    forbids: the fault suite runs them unsandboxed; the sandbox has its own suite (jobs/tests/test_sandbox.py)."""
    settings.TRAINYARD_SANDBOX = "off"


@pytest.fixture
def fast_lifecycle(settings):
    """Overdue at once: each reconciler pass re-drives whatever has not moved."""
    settings.TRAINYARD_START_OVERDUE_S = 0
    settings.TRAINYARD_STOP_OVERDUE_S = 1
    settings.TRAINYARD_CANCEL_GRACE_S = 2.0
    return settings


def submit(user, *, script: str, marks: Path, **overrides):
    """A job whose command records each start in `marks` (one line per run of attempt N), then runs `script`."""
    from jobs import services

    data = {
        "team": "demo",
        "queue": "train",
        "spec": "shared",
        "image": "python-3.11",
        "command": ["sh", "-c", f'echo "run $TRAINYARD_ATTEMPT" >> "$MARKS"; {script}'],
        "env": {"MARKS": str(marks)},
        "max_retries": 2,
    }
    data.update(overrides)
    job, created = services.job_submit(user=user, data=data)
    assert created
    return job


def drive_once() -> None:
    """One pass of what beat runs: dispatch every queue, then the lifecycle reconciler (which observes)."""
    from jobs import lifecycle, tasks

    tasks.dispatch_all()
    lifecycle.lifecycle_reconcile()


def drive_until(predicate, *, timeout: float = 60.0, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        drive_once()
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("condition not met in time")


def settled(job):
    from jobs.models import Job

    fresh = Job.objects.get(pk=job.pk)
    return fresh if fresh.is_terminal else None


def runs(marks: Path) -> list[str]:
    try:
        return marks.read_text().split()[1::2]
    except FileNotFoundError:
        return []


def assert_settled(job, marks: Path | None = None, *, state: str | None = None):
    """The end state every fault must reach."""
    from cluster.models import LogicalDevice
    from jobs.models import Job
    from kernel import proctree

    job = Job.objects.get(pk=job.pk)
    assert job.state in TERMINAL_STATES, job.state
    if state:
        assert job.state == state, (job.state, job.message)
    finals = list(job.events.filter(kind="state", to_state__in=TERMINAL_STATES).values_list("to_state", flat=True))
    assert finals == [job.state], finals
    assert not job.reserved
    assert not LogicalDevice.objects.filter(attempt__job=job, released_at__isnull=True).exists()
    attempts = list(job.attempts.all())
    assert all(a.is_finished for a in attempts), [(a.number, a.state) for a in attempts]
    left = {a.number: proctree.tagged(str(job.id), a.number) for a in attempts}
    assert not any(left.values()), left
    if marks is not None:
        started = runs(marks)
        assert sorted(started) == sorted(set(started)), f"an attempt ran twice: {started}"
        assert len(started) <= len(attempts)
    return job
