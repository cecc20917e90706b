"""What each team and queue holds against its quota now: reserved, non-preemptible jobs (a preemptible job holds
no quota), summed over the request vector, read from the quota-use log admission reads (migration jobs/0027), so
the pages show the figure the dispatcher checks. Registered as the source of `quotas.usage` (jobs.apps)."""

from django.db.models import Count, Sum
from django.db.models.functions import Coalesce

from jobs.checkpoints import team_storage_used  # noqa: F401 - part of the source quotas.usage reads
from jobs.models import Job
from jobs.selectors import line_places, line_rows  # noqa: F401 - part of the source quotas.usage reads
from jobs.store import quota_use
from quotas.models import Queue, Team
from quotas.selectors import VECTOR_FIELDS as VECTOR


def _held(**key) -> dict[str, int]:
    """The quota-use log's sums (jobs.store.quota_use: what admission checks) for one queue or one team."""
    total = {**dict.fromkeys(VECTOR, 0), "jobs": 0}
    for _queue, _team, _owner, used, jobs in quota_use(**key):
        for k, v in used.items():
            total[k] += v
        total["jobs"] += jobs
    return total


def queue_usage(queue: Queue) -> dict[str, int]:
    return _held(queue_id=queue.id)


def team_usage(team: Team) -> dict[str, int]:
    return _held(team_id=team.id)


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
