"""A job's `started_at` / `finished_at` come from its attempt's own process (the supervisor's child.json and
status.json), not from when an observer happened to look: here the observer looks seconds late, as it does when
the worker was down or busy, and the job's times still match what its command recorded."""

from __future__ import annotations

import time

import pytest

from jobs import lifecycle, tasks
from jobs.models import Attempt
from tests.faults.conftest import assert_settled, drive_until, settled, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.faults, pytest.mark.slow]

LATE_S = 4.0


def _started_unobserved(job) -> Attempt:
    """Dispatched and started (what the start task does), never observed."""
    tasks.dispatch_all()
    attempt = Attempt.objects.get(job=job)
    lifecycle.attempt_start(attempt_id=attempt.id)
    attempt.refresh_from_db()
    assert attempt.backend_ref
    return attempt


def _stamps(path) -> dict[str, float]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.count("\n") >= 1:
            break
        time.sleep(0.05)
    return dict((line.split()[0], float(line.split()[1])) for line in path.read_text().splitlines())


@pytest.mark.parametrize("runs_s", [6.0, 0.5], ids=["noticed-running-late", "ended-before-noticed"])
def test_job_times_are_the_attempts_own(platform, fast_lifecycle, tmp_path, runs_s):
    stamps = tmp_path / "stamps"
    job = submit(
        platform,
        script=f'echo "begin $(date +%s.%N)" >> {stamps}; sleep {runs_s}; echo "end $(date +%s.%N)" >> {stamps}',
        marks=tmp_path / "marks",
    )
    _started_unobserved(job)
    began = _stamps(stamps)["begin"]
    time.sleep(LATE_S)  # nobody looks meanwhile
    lifecycle.attempts_observe()
    job.refresh_from_db()
    assert job.started_at is not None
    assert abs(job.started_at.timestamp() - began) < 1.0, job.started_at.timestamp() - began
    done = settled(drive_until(lambda: settled(job), timeout=60))
    ended = _stamps(stamps)["end"]
    assert done.state == "succeeded"
    assert abs(done.started_at.timestamp() - began) < 1.0
    assert abs(done.finished_at.timestamp() - ended) < 1.0, done.finished_at.timestamp() - ended
    attempt = Attempt.objects.get(job=job)
    assert abs(attempt.started_at.timestamp() - began) < 1.0 and abs(attempt.ended_at.timestamp() - ended) < 1.0
    assert_settled(job, tmp_path / "marks", state="succeeded")


def test_volcano_observation_takes_the_trainers_own_times():
    """The same for pods: the kubelet's startedAt / finishedAt of the main containers, not the observer's clock."""
    from jobs.backends.base import Observation
    from jobs.backends.volcano import _with_pod_times
    from jobs.backends.volcano_render import MAIN_CONTAINER

    def pod(state: dict) -> dict:
        return {"status": {"containerStatuses": [{"name": MAIN_CONTAINER, "state": state}]}}

    pods = [
        pod({"terminated": {"startedAt": "2026-01-05T10:00:03Z", "finishedAt": "2026-01-05T10:20:00Z"}}),
        pod({"terminated": {"startedAt": "2026-01-05T10:00:01Z", "finishedAt": "2026-01-05T10:21:30Z"}}),
    ]
    done = _with_pod_times(Observation(phase="succeeded", exit_code=0), pods)
    assert done.started_at == 1767607201.0 and done.ended_at == 1767608490.0
    running = _with_pod_times(Observation(phase="running"), [pod({"running": {"startedAt": "2026-01-05T10:00:01Z"}})])
    assert running.started_at == 1767607201.0 and running.ended_at is None
    assert _with_pod_times(Observation(phase="pending"), [pod({"waiting": {"reason": "ContainerCreating"}})]) == (
        Observation(phase="pending")
    )
