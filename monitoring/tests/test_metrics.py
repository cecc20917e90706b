"""/metrics in Prometheus' text format (parsed by prometheus_client's own parser), and the scheduling layer."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from jobs import services as jobs
from jobs import store
from jobs.models import JobEvent
from monitoring import services
from monitoring.models import QueueWaitStats, SchedulingSample
from monitoring.tests.conftest import api_as, emulated_gpus, plant_faults

pytestmark = pytest.mark.django_db


def scrape(client=None, **headers) -> dict[str, dict[tuple, float]]:
    response = (client or Client()).get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def submit(user, queue, spec, **extra):
    job, _ = jobs.job_submit(
        user=user,
        data={"team": "demo", "queue": queue, "spec": spec, "image": "python-3.11", "command": ["true"], **extra},
    )
    return job


@pytest.fixture
def busy(db_platform):
    """On the four emulated cards: a whole card and a quarter card held, one job pending in debug."""
    submit(db_platform, "train", "guaranteed")
    job = submit(db_platform, "train", "shared")
    store.dispatch(queue_ids=[job.queue_id])
    submit(db_platform, "debug", "shared")
    return db_platform


def test_platform_metrics_are_valid_prometheus_text(busy, settings):
    plant_faults(settings, {emulated_gpus()[3].uuid: "gpu_lost"})
    services.gpu_probe_all()
    services.scheduling_sample(now=timezone.now() + timedelta(seconds=10))

    m = scrape()

    assert m["trainyard_jobs"][(("queue", "train"), ("state", "admitted"))] == 2
    assert m["trainyard_jobs"][(("queue", "debug"), ("state", "pending"))] == 1
    assert m["trainyard_queue_depth"][(("queue", "debug"),)] == 1
    assert m["trainyard_queue_depth"][(("queue", "train"),)] == 0
    # Schedulable: three healthy cards (one was lost). Held: 1000 + 250 of 3000.
    assert m["trainyard_gpu_allocation_ratio"][()] == pytest.approx(1250 / 3000)
    assert m["trainyard_gpu_schedulable"][()] == 3
    # Free: 0, 750, 1000. The 750 left next to a quarter slice cannot take a whole-card job (weight 0.3).
    assert m["trainyard_gpu_fragmentation_ratio"][()] == pytest.approx(0.3 * 750 / 1750)
    assert m["trainyard_gpus"][(("emulated", "true"), ("health", "unhealthy"), ("quarantined", "true"))] == 1
    assert m["trainyard_alerts_firing"][(("level", "fatal"),)] == 1
    assert m["trainyard_alerts_firing"][(("level", "warning"),)] == 0
    assert m["trainyard_queue_wait_seconds_count"][(("queue", "train"),)] == 2
    assert m["trainyard_queue_wait_seconds_bucket"][(("le", "+Inf"), ("queue", "train"))] == 2
    assert m["trainyard_queue_wait_seconds_bucket"][(("le", "5.0"), ("queue", "train"))] == 2
    assert m["trainyard_queue_wait_seconds_count"][(("queue", "debug"),)] == 0
    assert all(name.startswith("trainyard_") for name in m)


def test_the_wait_histogram_only_grows_and_counts_each_admission_once(busy):
    later = timezone.now() + timedelta(seconds=10)
    services.scheduling_sample(now=later)
    services.scheduling_sample(now=later + timedelta(seconds=60))
    stats = QueueWaitStats.objects.get(queue__name="train")
    assert stats.count == 2 and stats.buckets["86400"] == 2
    pool = list(SchedulingSample.objects.filter(queue__isnull=True).order_by("at"))
    assert [p.admissions for p in pool] == [2, 0]
    assert pool[1].interval_s == 60 and pool[1].allocation_ratio == pytest.approx(1250 / 4000)
    depth = SchedulingSample.objects.filter(queue__name="debug").latest("at")
    assert (depth.pending, depth.running) == (1, 0)
    api = api_as("demo").get("/api/v1/monitoring/scheduling/?queue=train").json()
    assert [s["admissions"] for s in api] == [2, 0] and api[0]["wait_avg_s"] is not None


def test_a_retried_job_waits_from_its_requeueing(db_platform):
    job = submit(db_platform, "train", "shared")
    store.dispatch(queue_ids=[job.queue_id])
    # Crafted history: it waited 30 s the first time and 300 s after a retry re-queued it.
    submitted, admitted = JobEvent.objects.filter(job=job).order_by("id")
    t0 = timezone.now() - timedelta(hours=1)
    requeued = JobEvent.objects.create(job=job, kind="transition", to_state="pending", actor="classifier")
    again = JobEvent.objects.create(job=job, kind="transition", to_state="admitted", actor="dispatcher")
    for event, seconds in ((submitted, 0), (admitted, 30), (requeued, 100), (again, 400)):
        JobEvent.objects.filter(pk=event.pk).update(at=t0 + timedelta(seconds=seconds))

    services.scheduling_sample()

    stats = QueueWaitStats.objects.get(queue__name="train")
    assert (stats.count, stats.sum_s) == (2, 330)
    assert (stats.buckets["30"], stats.buckets["120"], stats.buckets["300"]) == (1, 1, 2)


def test_celery_task_latency_is_exported(db_platform):
    from monitoring import celery_metrics

    celery_metrics.observe("runtime", "jobs.dispatch_queue", 0.02)
    celery_metrics.observe("runtime", "jobs.dispatch_queue", 3.0)
    celery_metrics.observe("wait", "jobs.dispatch_queue", 0.5)

    m = scrape()

    key = (("task", "jobs.dispatch_queue"),)
    assert m["trainyard_celery_task_runtime_seconds_count"][key] == 2
    assert m["trainyard_celery_task_runtime_seconds_sum"][key] == pytest.approx(3.02)
    assert m["trainyard_celery_task_runtime_seconds_bucket"][(("le", "0.025"), *key)] == 1
    assert m["trainyard_celery_task_runtime_seconds_bucket"][(("le", "5.0"), *key)] == 2
    assert m["trainyard_celery_task_queue_wait_seconds_count"][key] == 1


def test_celery_task_buckets_are_cumulative_from_one_counter_per_observation(db_platform):
    """Each observation increments the one bucket it falls in; the export adds them up, over every bound, with the
    counts an earlier version kept cumulatively (`le:` fields) and an observation past the last bound in the count
    only. One observation is four commands, not one per bound."""
    from monitoring import celery_metrics

    task = "jobs.test_cumulative"
    key = f"{celery_metrics.prefix()}:runtime:{task}"
    client = celery_metrics.redis_client()
    old = {f"le:{bound}": 1 for bound in celery_metrics.BUCKETS if bound >= 0.01}  # 0.008 s, kept cumulatively
    client.hset(key, mapping={**old, "count": 1, "sum": 0.008})
    sent = []
    real = client.pipeline

    def counting_pipeline(*args, **kwargs):
        pipe = real(*args, **kwargs)
        execute = pipe.execute
        pipe.execute = lambda: (sent.append(len(pipe.command_stack)), execute())[1]
        return pipe

    client.pipeline = counting_pipeline
    try:
        for seconds in (0.004, 0.02, 0.02, 7.0, 400.0):
            celery_metrics.observe("runtime", task, seconds)
    finally:
        del client.pipeline
    assert sent == [4, 4, 4, 4, 3]
    buckets, count, total = celery_metrics.histograms("runtime")[task]
    cumulative = dict(buckets)
    assert cumulative[0.005] == 1  # 0.004
    assert cumulative[0.01] == 2  # + the old 0.008
    assert cumulative[0.025] == 4  # + 0.02 twice
    assert cumulative[5.0] == 4
    assert cumulative[10.0] == 5  # + 7.0
    assert cumulative[300.0] == 5  # 400 s is past every bound: in the count alone
    assert count == 6 and total == pytest.approx(0.008 + 0.004 + 0.04 + 7.0 + 400.0)
    client.delete(key)


def test_metrics_can_require_a_token(db_platform, settings):
    settings.TRAINYARD_METRICS_TOKEN = "s3cret-token"
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert "trainyard_jobs" in scrape(HTTP_AUTHORIZATION="Bearer s3cret-token")
