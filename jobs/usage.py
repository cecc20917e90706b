"""What each team and queue holds against its quota now: reserved, non-preemptible jobs (a preemptible job holds
no quota), summed over the request vector. Registered as the source of `quotas.usage` (jobs.apps)."""

from django.db.models import Count, Sum
from django.db.models.functions import Coalesce

from jobs.checkpoints import team_storage_used  # noqa: F401 - part of the source quotas.usage reads
from jobs.models import Job
from jobs.selectors import line_places, line_rows  # noqa: F401 - part of the source quotas.usage reads
from quotas.models import Queue, Team


def _usage(qs) -> dict[str, int]:
    agg = qs.aggregate(
        gpu_milli=Coalesce(Sum("total_gpu_milli"), 0),
        gpu_memory_mib=Coalesce(Sum("total_gpu_memory_mib"), 0),
        cpu_milli=Coalesce(Sum("total_cpu_milli"), 0),
        memory_mib=Coalesce(Sum("total_memory_mib"), 0),
        jobs=Count("id"),
    )
    return {k: int(v) for k, v in agg.items()}


def queue_usage(queue: Queue) -> dict[str, int]:
    return _usage(Job.objects.filter(queue=queue, reserved=True, preemptible=False))  # preemptible: no quota held


def team_usage(team: Team) -> dict[str, int]:
    return _usage(Job.objects.filter(team=team, reserved=True, preemptible=False))


def team_usage_by_spec(team: Team) -> list[dict]:
    rows = (
        Job.objects.filter(team=team, reserved=True)
        .values("spec__name")
        .annotate(
            jobs=Count("id"),
            gpu_milli=Coalesce(Sum("total_gpu_milli"), 0),
            gpu_memory_mib=Coalesce(Sum("total_gpu_memory_mib"), 0),
        )
        .order_by("spec__name")
    )
    return [
        {"spec": r["spec__name"] or "explicit", **{k: r[k] for k in ("jobs", "gpu_milli", "gpu_memory_mib")}}
        for r in rows
    ]
