# ruff: noqa: F811 - fixtures are imported from test_volcano_backend and used as arguments
"""What an observe pass does with the logs of running pods whose copy is not due: nothing at all (no read, no
write of the attempt's log state), until the copy falls due, someone watches the log, or a pod ends or changes."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from jobs import logstore
from jobs.backends import volcano_render as render
from jobs.backends.volcano import VolcanoBackend
from jobs.tests.test_volcano_backend import backend, kube, logs  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db


def running_pod(name: str, uid: str, *, ended: bool = False) -> dict:
    state = {"terminated": {"exitCode": 0}} if ended else {"running": {"startedAt": "2026-12-03T10:00:00Z"}}
    return {
        "metadata": {"name": name, "uid": uid, "labels": {}},
        "spec": {"nodeName": "gpu-node-0"},
        "status": {
            "phase": "Succeeded" if ended else "Running",
            "containerStatuses": [{"name": render.MAIN_CONTAINER, "state": state}],
        },
    }


def every(backend: VolcanoBackend, seconds: float) -> None:
    backend.config = dataclasses.replace(backend.config, log_every_s=seconds)


class Reads:
    """Stands in for the API's pods/log read: counts the reads and returns no new lines."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, pod, entry):
        self.count += 1
        return [], True


def test_a_running_pod_not_due_costs_no_read_and_no_write_and_is_read_when_due_watched_or_ended(
    backend: VolcanoBackend, logs, monkeypatch
):
    job_id = str(uuid.uuid4())
    name = f"ty-{job_id.replace('-', '')}-1"
    reads = Reads()
    monkeypatch.setattr(backend, "_read_pod_log", reads)
    every(backend, 3600)
    pod = running_pod(f"{name}-main-0", "uid-1")
    state = logstore.attempt_dir(job_id, 1) / "k8s-logs.json"

    backend._collect_logs(name, [pod], final=False)  # first seen started: recorded, its first copy due in an hour
    assert reads.count == 0 and state.exists()
    written = state.stat().st_mtime_ns
    opened = []
    monkeypatch.setattr("jobs.backends.volcano._locked", lambda path: opened.append(path) or _Nothing())
    for _ in range(5):
        backend._collect_logs(name, [pod], final=False)
    assert reads.count == 0
    assert opened == []  # not even the lock file: the process knows nothing is due before the hour
    assert state.stat().st_mtime_ns == written
    monkeypatch.undo()
    monkeypatch.setattr(backend, "_read_pod_log", reads)

    logstore.mark_watched(job_id)  # someone opened the log: read every pass
    backend._collect_logs(name, [pod], final=False)
    backend._collect_logs(name, [pod], final=False)
    assert reads.count == 2
    (logstore.attempt_dir(job_id, 1).parent / logstore.WATCHED_FILE).unlink()

    every(backend, 0.0)  # due every time: read each pass
    backend._collect_logs(name, [pod], final=False)
    assert reads.count == 3
    every(backend, 3600)
    backend._collect_logs(name, [pod], final=False)
    assert reads.count == 3  # just read: not due for an hour again

    backend._collect_logs(name, [running_pod(pod["metadata"]["name"], "uid-1", ended=True)], final=False)
    assert reads.count == 4  # its trainer ended: the rest of its log is read at once
    backend._collect_logs(name, [running_pod(pod["metadata"]["name"], "uid-2")], final=False)
    assert reads.count == 4  # a new pod of the same name: first seen, due in an hour
    backend._collect_logs(name, [running_pod(pod["metadata"]["name"], "uid-2")], final=True)
    assert reads.count == 5  # the attempt ended: everything started is read in full


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_process_forgets_the_schedule_of_jobs_no_longer_observed(backend: VolcanoBackend, logs, monkeypatch):
    backend._logs_quiet["ty-gone-1"] = ((), float("inf"))
    backend.observe([])
    assert "ty-gone-1" not in backend._logs_quiet
