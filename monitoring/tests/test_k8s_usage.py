"""Usage profiles of Kubernetes attempts end to end: the platform runs a job on the fake cluster (real HTTP, the
official client unpatched, a real Celery worker), the fake metrics-server reports its pod's CPU and memory, and the
telemetry task folds them into the attempt's profile through the path the local samples take (peaks, series,
leak checks), or records nothing, once per pass, when the cluster has no resource metrics API."""

from __future__ import annotations

from datetime import timedelta

import pytest
import structlog

from jobs.backends.volcano import parse_ref
from jobs.tests import test_volcano_backend as volcano_tests
from jobs.tests.test_volcano_backend import TEAM_NS, attempt_ref, drive, reload, submit
from monitoring import tasks
from monitoring.models import UsageProfile

# the fake cluster and the seeded platform on the volcano backend, as the backend's end-to-end tests set them up
kube, platform = volcano_tests.kube, volcano_tests.platform

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def running_job(kube, platform, settings, celery_worker_thread):
    settings.TRAINYARD_TELEMETRY_SOURCE = "none"  # GPU telemetry is not what these tests look at
    kube.controller.script("ty-", run_ticks=None)
    job = submit(platform, tensorboard=True)
    drive(kube, lambda: reload(job).state == "running")
    [pod] = kube.controller.job_pods(TEAM_NS, parse_ref(attempt_ref(job))[1])
    return job, pod["metadata"]["name"]


def profile_of(job) -> UsageProfile:
    return UsageProfile.objects.get(attempt=reload(job).attempts.get(number=1))


def test_pod_cpu_and_memory_make_the_profile_of_a_running_attempt(kube, running_job):
    job, pod = running_job
    t0 = kube.now().replace(microsecond=0)
    sidecar = {"cpu": "6", "memory": "30Gi"}  # the TensorBoard sidecar's use is not the job's
    kube.set_pod_metrics(TEAM_NS, pod, {"trainer": {"cpu": "1500m", "memory": "2Gi"}, "tensorboard": sidecar}, at=t0)

    result = tasks.collect_telemetry()
    assert result["host_metrics_error"] == ""
    profile = profile_of(job)
    assert (profile.cpu_peak_milli, profile.host_memory_peak_mib) == (1500, 2048)
    assert profile.host_source == "metrics" and profile.samples == 1
    assert profile.series == [[t0.timestamp(), None, None, 1500, 2048]]
    assert profile.metrics_at == t0 and not profile.final

    tasks.collect_telemetry()  # metrics-server has not measured again: nothing new
    assert profile_of(job).samples == 1

    kube.set_pod_metrics(
        TEAM_NS, pod, {"trainer": {"cpu": "250000000n", "memory": "1048576Ki"}}, at=t0 + timedelta(seconds=15)
    )
    tasks.collect_telemetry()
    profile = profile_of(job)
    assert profile.samples == 2 and len(profile.series) == 2
    assert (profile.cpu_peak_milli, profile.host_memory_peak_mib) == (1500, 2048)  # a peak stays
    assert profile.series[-1][3:] == [250, 1024]

    kube.set_pod_metrics(TEAM_NS, pod, {"trainer": {"cpu": "3", "memory": "3.5Gi"}}, at=t0 + timedelta(seconds=30))
    tasks.collect_telemetry()
    profile = profile_of(job)
    assert (profile.samples, profile.cpu_peak_milli, profile.host_memory_peak_mib) == (3, 3000, 3584)

    body = usage_api(job)
    assert body["attempts"][0]["cpu_peak_milli"] == 3000 and body["attempts"][0]["host_source"] == "metrics"
    from django.test import Client

    browser = Client()
    browser.force_login(job.owner)
    page = browser.get(f"/jobs/{job.id}/").content.decode()
    assert "resource metrics API: the job's own container, in its busiest pod" in page
    assert "CPU (peak)" in page and "3.00" in page


def usage_api(job) -> dict:
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(job.owner)
    response = client.get(f"/api/v1/jobs/{job.id}/usage/")
    assert response.status_code == 200
    return response.json()


def test_host_memory_that_keeps_growing_is_a_suspected_leak(kube, running_job, settings):
    settings.TRAINYARD_LEAK_MIN_SAMPLES = 8
    job, pod = running_job
    t0 = kube.now().replace(microsecond=0)
    for step in range(8):
        memory = f"{1024 * (step + 1)}Mi"  # 1 GiB more every measurement, never levelling off
        kube.set_pod_metrics(
            TEAM_NS, pod, {"trainer": {"cpu": "1", "memory": memory}}, at=t0 + timedelta(seconds=15 * step)
        )
        result = tasks.collect_telemetry()
    assert result["leaks"] == 1
    event = reload(job).events.get(kind="memory_leak")
    assert "host memory grew from 1024 to 8192 MiB" in event.message


@pytest.mark.parametrize(("state", "says"), [("absent", "HTTP 404"), ("unavailable", "HTTP 503")])
def test_without_a_metrics_api_the_pass_records_no_numbers_and_says_why_once(kube, running_job, state, says):
    job, pod = running_job
    kube.set_pod_metrics(TEAM_NS, pod, {"trainer": {"cpu": "1", "memory": "1Gi"}})
    kube.metrics_api = state
    with structlog.testing.capture_logs() as logged:
        result = tasks.collect_telemetry()
    assert says in result["host_metrics_error"] and result["usage_attempts"] == 1
    lines = [e for e in logged if e["event"] == "pod_metrics_unavailable"]
    assert len(lines) == 1 and says in lines[0]["reason"]
    profile = profile_of(job)
    assert (profile.cpu_peak_milli, profile.host_memory_peak_mib, profile.host_source) == (None, None, "")
    assert profile.series == [] and not profile.final

    kube.metrics_api = "served"  # metrics-server installed later: the next pass measures
    kube.set_pod_metrics(TEAM_NS, pod, {"trainer": {"cpu": "2", "memory": "1Gi"}})
    assert tasks.collect_telemetry()["host_metrics_error"] == ""
    assert profile_of(job).cpu_peak_milli == 2000
