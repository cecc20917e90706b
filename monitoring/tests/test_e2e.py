"""End to end with real processes and a real Celery worker on the local backend: a card fails under a running
job (the job is retried on another card), and a job's printed metrics reach its charts."""

import pytest
from django.test import Client

from cluster.models import GPU
from jobs import lifecycle, logstore
from jobs import services as jobs
from jobs.models import Job
from monitoring import services
from monitoring.models import Alert, BusinessMetric
from monitoring.tests.conftest import api_as, plant_faults, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def submit(user, command, **extra):
    job, _ = jobs.job_submit(
        user=user,
        data={"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": command, **extra},
    )
    return job


def running_attempt(job, number):
    attempt = job.attempts.filter(number=number, state="running").first()
    return attempt if Job.objects.get(pk=job.pk).state == "running" else None


def test_a_card_lost_under_a_running_job_is_quarantined_and_the_job_retried_elsewhere(live_platform, settings):
    job = submit(live_platform, ["sh", "-c", "echo started; sleep 0.2; echo working; sleep 60"], max_retries=2)
    first = wait_for(lambda: running_attempt(job, 1))
    wait_for(lambda: "started" in logstore.tail_text(logstore.attempt_dir(str(job.id), 1)))
    lost = first.placement["devices"][0]["gpu_uuid"]
    plant_faults(settings, {lost: "gpu_lost"})

    services.gpu_probe_all()

    gpu = GPU.objects.get(uuid=lost)
    assert gpu.health == GPU.Health.UNHEALTHY and gpu.quarantined
    alert = Alert.objects.get(rule_name="gpu-lost")
    assert alert.level == "fatal" and alert.job_ids == [str(job.id)]
    assert [a["action"] for a in alert.actions_taken] == ["quarantine_gpu", "restart_job", "notify"]
    second = wait_for(lambda: running_attempt(job, 2), timeout=60)

    first.refresh_from_db()
    assert (first.state, first.failure_class, first.reaction, first.rule) == (
        "failed",
        "platform",
        "retry_elsewhere",
        "node-unhealthy",
    )
    assert second.placement["devices"][0]["gpu_uuid"] != lost
    assert lost in Job.objects.get(pk=job.pk).excluded_gpus
    kinds = list(job.events.values_list("kind", flat=True))
    assert "alert" in kinds and "restart_requested" in kinds
    lifecycle.job_cancel(job_id=job.id, actor="demo")


def test_printed_metrics_reach_the_api_and_the_charts(live_platform):
    script = (
        "import json\n"
        "for step in range(1, 6):\n"
        "    print('TRAINYARD_METRIC ' + json.dumps({'step': step, 'loss': 1 / step, 'throughput': 100 + step}),"
        " flush=True)\n"
        "print('done')\n"
    )
    job = submit(live_platform, ["python3", "-c", script])
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "succeeded")

    scan = services.business_metrics_scan()

    assert scan.metrics == 5
    rows = list(BusinessMetric.objects.filter(job=job).order_by("step"))
    assert [r.step for r in rows] == [1, 2, 3, 4, 5] and rows[1].values == {"loss": 0.5, "throughput": 102.0}
    body = api_as("demo").get(f"/api/v1/monitoring/jobs/{job.id}/metrics/").json()
    assert [r["values"]["loss"] for r in body] == [1.0, 0.5, 1 / 3, 0.25, 0.2]
    browser = Client()
    browser.force_login(live_platform)
    html = browser.get(f"/monitoring/jobs/{job.id}/charts/").content.decode()
    assert 'data-series="loss"' in html and 'data-series="throughput"' in html
    assert services.business_metrics_scan().attempts == 0  # done with this attempt


def test_celery_task_latency_from_a_real_worker(live_platform):
    job = submit(live_platform, ["true"])
    wait_for(lambda: Job.objects.get(pk=job.pk).state == "succeeded")
    metrics = Client().get("/metrics").content.decode()
    assert 'trainyard_celery_task_runtime_seconds_count{task="jobs.dispatch_queue"}' in metrics
    assert 'trainyard_celery_task_queue_wait_seconds_count{task="jobs.start_attempts"}' in metrics


def test_a_shared_job_holding_more_than_its_gpu_memory_share_is_stopped_as_a_user_failure(
    live_platform, settings, fake_nvml, tmp_path
):
    """NVML is faked at its boundary (it reports the job's real process holding 30 GiB of a 20 GiB share); the
    rest is real: the worker, the local runner, the stop, the classification."""
    import json

    from monitoring.tests.conftest import REAL_UUIDS, make_real_node
    from monitoring.tests.test_collectors import wait_for_environ

    make_real_node()
    job = submit(live_platform, ["sh", "-c", "echo holding; sleep 60"], max_retries=2)
    attempt = wait_for(lambda: running_attempt(job, 1))
    device = attempt.placement["devices"][0]
    assert device["gpu_uuid"] in REAL_UUIDS and device["memory_mib"] == 20480 and not device["exclusive"]
    child = settings.TRAINYARD_STATE_ROOT / str(job.id) / "attempt-1" / "child.json"
    pid = wait_for(lambda: child.exists() and json.loads(child.read_text())["pid"])
    wait_for_environ(pid, str(job.id))
    card = next(c for c in fake_nvml.cards if c.uuid == device["gpu_uuid"])

    card.processes = [(pid, 20480 + 400)]  # over the share, within the tolerance: left alone
    assert services.telemetry_collect().stopped == []
    card.processes = [(pid, 30000)]
    report = services.telemetry_collect()
    assert report.stopped == [f"{job.id}#1"]
    assert services.telemetry_collect().stopped == []  # once is enough

    job = wait_for(lambda: (lambda j: j if j.is_terminal else None)(Job.objects.get(pk=job.pk)), timeout=60)
    attempt.refresh_from_db()
    assert job.state == "failed" and job.retries_used == 0 and job.attempts.count() == 1
    assert (attempt.reason, attempt.failure_class, attempt.reaction, attempt.rule) == (
        "GpuShareExceeded",
        "user",
        "no_retry",
        "gpu-share-exceeded",
    )
    assert "larger spec" in job.suggestion
    event = job.events.get(kind="gpu_share_exceeded")
    assert event.data["used_mib"] == 30000 and event.data["share_mib"] == 20480
