"""`/metrics`: the platform's own Prometheus metrics (all named `trainyard_*`), read from the database and
Redis at scrape time so that every web process answers the same numbers.

When `TRAINYARD_METRICS_TOKEN` is set, a scrape must send `Authorization: Bearer <token>`.
"""

from __future__ import annotations

from collections.abc import Iterator

import structlog
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils.crypto import constant_time_compare
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from cluster.models import GPU
from jobs.states import JobState
from monitoring import celery_metrics, selectors
from monitoring.models import Alert, AlertRule, QueueWaitStats
from monitoring.services import WAIT_BUCKETS
from quotas.models import Queue

log = structlog.get_logger(__name__)


def _histogram(name: str, doc: str, labels: list[str]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=labels)


class PlatformCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        queues = list(Queue.objects.values_list("id", "name"))
        by_queue = selectors.jobs_by_queue_and_state()

        jobs = GaugeMetricFamily(
            "trainyard_jobs",
            "Jobs by queue and state (terminal states count every job kept).",
            labels=["queue", "state"],
        )
        depth = GaugeMetricFamily("trainyard_queue_depth", "Pending jobs per queue.", labels=["queue"])
        for _, name in queues:
            states = by_queue.get(name, {})
            for state in JobState.values:
                jobs.add_metric([name, state], states.get(state, 0))
            depth.add_metric([name], states.get(JobState.PENDING, 0))
        yield jobs
        yield depth

        wait = _histogram("trainyard_queue_wait_seconds", "Time from (re)queueing to admission, per queue.", ["queue"])
        stats = {s.queue_id: s for s in QueueWaitStats.objects.all()}
        for queue_id, name in queues:
            s = stats.get(queue_id)
            buckets = [(str(float(b)), (s.buckets.get(str(b), 0) if s else 0)) for b in WAIT_BUCKETS]
            buckets.append(("+Inf", s.count if s else 0))
            wait.add_metric([name], buckets, sum_value=s.sum_s if s else 0.0)
        yield wait

        pool = selectors.pool_allocation()
        yield GaugeMetricFamily(
            "trainyard_gpu_allocation_ratio",
            "GPU compute held by live attempts / compute of schedulable cards.",
            value=pool.allocation_ratio,
        )
        yield GaugeMetricFamily(
            "trainyard_gpu_memory_allocation_ratio",
            "GPU memory held by live attempts / memory of schedulable cards.",
            value=pool.memory_allocation_ratio,
        )
        yield GaugeMetricFamily(
            "trainyard_gpu_fragmentation_ratio",
            "Share of free GPU compute that the usual request shapes can no longer use.",
            value=pool.fragmentation,
        )
        yield GaugeMetricFamily(
            "trainyard_gpu_schedulable", "Cards placement may use (healthy, in service).", value=pool.schedulable_cards
        )

        gpus = GaugeMetricFamily(
            "trainyard_gpus", "GPUs by health and quarantine.", labels=["health", "quarantined", "emulated"]
        )
        counts: dict[tuple[str, str, str], int] = {}
        for health, quarantined, emulated in GPU.objects.values_list("health", "quarantined", "node__emulated"):
            key = (health, str(quarantined).lower(), str(emulated).lower())
            counts[key] = counts.get(key, 0) + 1
        for key, n in sorted(counts.items()):
            gpus.add_metric(list(key), n)
        yield gpus

        open_alerts = {
            (level, state): 0
            for level in AlertRule.Level.values
            for state in (Alert.State.FIRING, Alert.State.ACKNOWLEDGED)
        }
        for level, state in Alert.objects.exclude(state=Alert.State.RESOLVED).values_list("level", "state"):
            open_alerts[(level, state)] = open_alerts.get((level, state), 0) + 1
        firing = GaugeMetricFamily(
            "trainyard_alerts_firing", "Alerts firing (not yet acknowledged), per level.", labels=["level"]
        )
        opened = GaugeMetricFamily(
            "trainyard_alerts_open", "Open alerts per level and state.", labels=["level", "state"]
        )
        for (level, state), n in sorted(open_alerts.items()):
            opened.add_metric([level, state], n)
            if state == Alert.State.FIRING:
                firing.add_metric([level], n)
        yield firing
        yield opened

        yield from self._celery()

    def _celery(self) -> Iterator[Metric]:
        for kind, name, doc in (
            ("runtime", "trainyard_celery_task_runtime_seconds", "Celery task run time, per task."),
            ("wait", "trainyard_celery_task_queue_wait_seconds", "Time a Celery task waited in the broker."),
        ):
            family = _histogram(name, doc, ["task"])
            try:
                data = celery_metrics.histograms(kind)
            except Exception:  # noqa: BLE001 - Redis down: the rest of the scrape is still worth answering
                log.warning("task_metrics_unreadable", kind=kind)
                data = {}
            for task, (buckets, count, total) in data.items():
                family.add_metric([task], [(str(b), n) for b, n in buckets] + [("+Inf", count)], sum_value=total)
            yield family


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    token = settings.TRAINYARD_METRICS_TOKEN
    if token:
        sent = request.headers.get("Authorization", "")
        if not constant_time_compare(sent, f"Bearer {token}"):
            response = HttpResponse("a bearer token is required\n", status=401, content_type="text/plain")
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PlatformCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
