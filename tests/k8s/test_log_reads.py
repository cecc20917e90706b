# ruff: noqa: F811 - the real-cluster fixtures are imported from test_real_cluster and used as arguments
"""How often the platform reads a pod's log on the real control plane (`make cluster`, docs/cluster.md): each
`pods/log` read the platform's service account makes is counted in the API server's audit log."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from jobs import lifecycle, logstore
from jobs.tests.test_volcano_backend import submit
from tests.k8s.test_real_cluster import (  # noqa: F401 - fixtures
    TEAM_NS,
    _drive,
    _outcome,
    _pods,
    _state,
    admin,
    platform,
)

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _log_reads(real_cluster, pod: str) -> int:
    """The platform's reads of `pod`'s log, from the API server's audit log."""
    path = Path(real_cluster["dir"]) / "audit" / "audit.log"
    count = 0
    for line in path.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        count += (
            event.get("stage") == "ResponseComplete"
            and event.get("verb") == "get"
            and ref.get("resource") == "pods"
            and ref.get("subresource") == "log"
            and ref.get("namespace") == TEAM_NS
            and ref.get("name") == pod
            and event["user"]["username"].startswith("system:serviceaccount:trainyard:")
        )
    return count


def test_an_unwatched_running_pods_log_is_read_on_its_schedule_every_pass_when_watched_and_at_the_end(
    platform, admin, real_cluster, settings, celery_worker_thread
):
    """`pods/log` is not read for a running pod whose copy is not due (`TRAINYARD_K8S_LOG_EVERY_S`) while nobody
    reads the job's log (reading every pass was most of the platform's API traffic); once someone does, it is read
    every pass; when the job ends its log is read in full."""
    from jobs.backends import reset_backends

    settings.TRAINYARD_K8S_LOG_EVERY_S = 3600
    reset_backends()  # the backend reads its log schedule when made
    job = submit(platform["user"])
    job = _drive(lambda: _state(job, "running"))
    [pod] = _pods(admin, job)
    name = pod.metadata.name
    for _ in range(6):
        lifecycle.attempts_observe(backend_name="volcano")
        time.sleep(0.3)
    assert _log_reads(real_cluster, name) == 0  # running, unwatched, not due: not read
    logstore.mark_watched(str(job.id))
    for passes in (1, 2, 3):
        lifecycle.attempts_observe(backend_name="volcano")
        assert _log_reads(real_cluster, name) == passes  # watched: read once each pass
    _outcome(admin, job, "succeed")
    job = _drive(lambda: _state(job, "succeeded", "failed"))
    assert job.state == "succeeded"
    assert _log_reads(real_cluster, name) >= 4  # read at the end
    text = "\n".join(line.text for line in logstore.read_lines(logstore.attempt_dir(str(job.id), 1))[0])
    assert "kwok: no container runs on this fake node" in text, text
