"""Reads of the monitoring app: who sees which alert, the pool's allocation and fragmentation, GPUs with their
latest telemetry, a job's three layers (host, scheduling, business), scheduling series, and the usage report."""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.db.models import Count, Max, Q, QuerySet, Sum
from django.utils import timezone

from cluster.models import GPU, LogicalDevice, Node
from jobs.models import Job, SucceededRun
from jobs.states import ATTEMPT_FINISHED
from kernel.errors import ValidationFailed
from kernel.prepared import prepared_cursor
from kernel.sentences import stored
from monitoring import rightsizing
from monitoring.models import (
    Alert,
    BusinessMetric,
    GpuSample,
    GpuStatus,
    JobGpuSample,
    SchedulingSample,
    UsageProfile,
)
from monitoring.rules import stale_after
from quotas.selectors import visible_teams

NO_TELEMETRY_EMULATED = stored("emulated: no telemetry")
# The request shapes the pool serves (shared, performance, whole card) and how common each is.
REQUEST_SHAPES = ((250, 0.5), (750, 0.2), (1000, 0.3))
FINISHED_ATTEMPTS = [s.value for s in ATTEMPT_FINISHED]


# ------------------------------------------------------------------------------------------------ alerts


def alerts_visible_to(user) -> QuerySet[Alert]:
    """Alerts are about shared infrastructure (cards, queues, the pool): every signed-in user may read them."""
    return Alert.objects.select_related("gpu__node", "queue", "rule")


def alert_visible(alert: Alert, user) -> bool:
    return bool(user and user.is_authenticated)


JOB_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
ANOTHER_TEAM = "(another team)"


def actions_visible(actions: list[dict[str, Any]], visible_job_ids: set[str] | None) -> list[dict[str, Any]]:
    """An alert's actions as a reader may see them: other teams' job ids are replaced (None: staff, sees all)."""
    if visible_job_ids is None:
        return actions

    def hide(value: Any) -> Any:
        if isinstance(value, str):
            return JOB_ID.sub(lambda m: m.group(0) if m.group(0) in visible_job_ids else ANOTHER_TEAM, value)
        if isinstance(value, list):
            return [hide(v) for v in value]
        if isinstance(value, dict):
            return {k: hide(v) for k, v in value.items()}
        return value

    return [hide(action) for action in actions]


def may_handle_alert(alert: Alert, user) -> bool:
    return bool(user and user.is_staff)


def open_alert_counts() -> dict[str, int]:
    rows = Alert.objects.exclude(state=Alert.State.RESOLVED).values_list("level").annotate(n=Count("id"))
    return dict(rows.values_list("level", "n"))


# ----------------------------------------------------------------------------------------- pool and jobs


@dataclass(frozen=True)
class PoolAllocation:
    schedulable_cards: int
    held_milli: int
    total_milli: int
    held_memory_mib: int
    total_memory_mib: int
    free_milli: int
    stranded_milli: float

    @property
    def allocation_ratio(self) -> float:
        return self.held_milli / self.total_milli if self.total_milli else 0.0

    @property
    def memory_allocation_ratio(self) -> float:
        return self.held_memory_mib / self.total_memory_mib if self.total_memory_mib else 0.0

    @property
    def fragmentation(self) -> float:
        """Share of the free compute that the usual request shapes can no longer use (FGD's idea, per card)."""
        return self.stranded_milli / self.free_milli if self.free_milli else 0.0


def _stranded(free_milli: int) -> float:
    return sum(weight * free_milli for size, weight in REQUEST_SHAPES if size > free_milli)


def pool_allocation() -> PoolAllocation:
    """Compute and memory held by live attempts on the cards placement may use (healthy, in service, ready)."""
    cards = dict(
        GPU.objects.filter(health=GPU.Health.HEALTHY, quarantined=False, node__state=Node.State.READY).values_list(
            "id", "memory_mib"
        )
    )
    held = (
        LogicalDevice.objects.filter(gpu_id__in=list(cards), released_at__isnull=True, attempt__isnull=False)
        .exclude(attempt__state__in=FINISHED_ATTEMPTS)
        .values("gpu_id")
        .annotate(milli=Sum("compute_milli"), memory=Sum("memory_mib"))
    )
    by_card = {row["gpu_id"]: row for row in held}
    free_total, stranded = 0, 0.0
    for gpu_id in cards:
        free = max(0, 1000 - int((by_card.get(gpu_id) or {}).get("milli") or 0))
        free_total += free
        stranded += _stranded(free)
    return PoolAllocation(
        schedulable_cards=len(cards),
        held_milli=sum(int(r["milli"] or 0) for r in by_card.values()),
        total_milli=1000 * len(cards),
        held_memory_mib=sum(int(r["memory"] or 0) for r in by_card.values()),
        total_memory_mib=sum(cards.values()),
        free_milli=free_total,
        stranded_milli=stranded,
    )


def jobs_by_queue_and_state() -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for queue, state, n in (
        Job.objects.values_list("queue__name", "state").annotate(n=Count("id")).values_list("queue__name", "state", "n")
    ):
        out[queue][state] = n
    return out


# ------------------------------------------------------------------------------------------- host layer


def telemetry_note(gpu: GPU, latest: GpuSample | None, now: datetime) -> str:
    """What the UI says instead of numbers when there are none to show."""
    if gpu.node.emulated:
        return NO_TELEMETRY_EMULATED
    if latest is None:
        return stored("no telemetry yet")
    if now - latest.at > stale_after():
        return stored("stale: last sample %(at)s UTC", at=f"{latest.at:%Y-%m-%d %H:%M:%S}")
    return ""


def latest_samples(gpu_ids: list[int], *, now: datetime) -> dict[int, GpuSample]:
    recent = GpuSample.objects.filter(gpu_id__in=gpu_ids, at__gte=now - timedelta(days=1))
    return {s.gpu_id: s for s in recent.order_by("gpu_id", "-at").distinct("gpu_id")}


@dataclass
class GpuOverview:
    gpu: GPU
    status: GpuStatus | None
    latest: GpuSample | None
    note: str
    jobs: list[str]
    held_milli: int


def gpu_overview(*, now: datetime | None = None) -> list[GpuOverview]:
    now = now or timezone.now()
    gpus = list(GPU.objects.select_related("node").order_by("node__name", "index"))
    ids = [g.id for g in gpus]
    statuses = {s.gpu_id: s for s in GpuStatus.objects.filter(gpu_id__in=ids)}
    latest = latest_samples(ids, now=now)
    held: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for gpu_id, job_id, milli in (
        LogicalDevice.objects.filter(gpu_id__in=ids, released_at__isnull=True, attempt__isnull=False)
        .exclude(attempt__state__in=FINISHED_ATTEMPTS)
        .values_list("gpu_id", "attempt__job_id", "compute_milli")
    ):
        held[gpu_id].append((str(job_id), milli))
    return [
        GpuOverview(
            gpu=g,
            status=statuses.get(g.id),
            latest=latest.get(g.id),
            note=telemetry_note(g, latest.get(g.id), now),
            jobs=sorted({j for j, _ in held[g.id]}),
            held_milli=sum(m for _, m in held[g.id]),
        )
        for g in gpus
    ]


def gpu_samples(gpu: GPU, *, since: datetime | None, until: datetime | None, limit: int = 2000) -> list[GpuSample]:
    qs = GpuSample.objects.filter(gpu=gpu)
    if since:
        qs = qs.filter(at__gte=since)
    if until:
        qs = qs.filter(at__lte=until)
    newest = list(qs.order_by("-at")[:limit])
    newest.reverse()
    return newest


def _thin(points: list, limit: int) -> list:
    if len(points) <= limit:
        return points
    step = len(points) / limit
    return [points[int(i * step)] for i in range(limit - 1)] + [points[-1]]


def job_business_metrics(job: Job, *, limit: int = 1000) -> list[BusinessMetric]:
    """What the job reported about itself, in time order, thinned to at most 5 x limit reports."""
    return _thin(list(BusinessMetric.objects.filter(job=job).order_by("at", "id")[:20000]), 5 * limit)


def business_version(job_id) -> int:
    """Moves whenever the job reports something new (the newest report's id; 0 before the first)."""
    return BusinessMetric.objects.filter(job_id=job_id).order_by("-id").values_list("id", flat=True).first() or 0


@dataclass
class DeviceTelemetry:
    device: LogicalDevice
    attempt_number: int
    emulated: bool
    note: str
    samples: list[GpuSample]


def job_telemetry(job: Job, *, now: datetime | None = None, limit: int = 1000) -> dict[str, Any]:
    """The three layers of one job: the cards its attempts held (through the pool's ledger, so dcgm series
    without pod labels still map to the job) with their samples in the holding window, its own processes'
    memory, its scheduling facts, and what it reported about itself."""
    now = now or timezone.now()
    devices = []
    for device in (
        LogicalDevice.objects.filter(attempt__job=job)
        .select_related("gpu__node", "attempt")
        .order_by("created_at", "id")
    ):
        gpu = device.gpu
        if gpu.node.emulated:
            devices.append(DeviceTelemetry(device, device.attempt.number, True, NO_TELEMETRY_EMULATED, []))
            continue
        window = GpuSample.objects.filter(gpu=gpu, at__gte=device.created_at, at__lte=device.released_at or now)
        samples = _thin(list(window.order_by("at")[:20000]), limit)
        devices.append(
            DeviceTelemetry(
                device, device.attempt.number, False, "" if samples else "no telemetry in this window", samples
            )
        )
    processes = _thin(list(JobGpuSample.objects.filter(job=job).select_related("gpu").order_by("at")[:20000]), limit)
    metrics = job_business_metrics(job, limit=limit)
    waited = None
    if job.admitted_at:
        waited = (job.admitted_at - job.submitted_at).total_seconds()
    return {
        "devices": devices,
        "processes": processes,
        "business": metrics,
        "scheduling": {
            "queue": job.queue.name,
            "state": job.state,
            "reason": job.reason,
            "queue_position": job.queue_position,
            "wait_s": waited,
            "attempts": job.attempts.count(),
            "retries_used": job.retries_used,
        },
        "peak_memory_mib": JobGpuSample.objects.filter(job=job).aggregate(m=Max("memory_used_mib"))["m"],
    }


def business_series(metrics: list[BusinessMetric]) -> dict[str, list[tuple[float, float]]]:
    """Per metric name, (x, y) points: x is the step where the job gave one, else seconds since its first report."""
    if not metrics:
        return {}
    use_step = all(m.step is not None for m in metrics)
    origin = metrics[0].at
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for m in metrics:
        x = float(m.step) if use_step else (m.at - origin).total_seconds()
        for key, value in m.values.items():
            series[key].append((x, float(value)))
    return dict(series)


# ------------------------------------------------------------------------------------- scheduling layer


def scheduling_series(*, since: datetime, queue_name: str | None = None) -> list[SchedulingSample]:
    qs = SchedulingSample.objects.filter(at__gte=since).select_related("queue").order_by("at")
    if queue_name:
        qs = qs.filter(queue__name=queue_name)
    return list(qs[:50000])


# ---------------------------------------------------------------------------------------- usage report


MAX_REPORT_DAYS = 366


@dataclass(frozen=True)
class UsageRow:
    day: date
    team: str
    user: str
    spec: str
    gpu_model: str
    gpu_hours: float
    jobs: int
    gpu_hours_used: float = 0.0  # of the measured hours, what the cards' utilization says was used
    gpu_hours_unmeasured: float = 0.0  # held hours with no utilization reading (no telemetry for them)


def _utilization_of(attempt_ids) -> dict[int, float]:
    """Mean GPU utilization (0..1 of a card) of the attempts whose usage profile has one."""
    return {
        pk: util / 100
        for pk, util in UsageProfile.objects.filter(
            attempt_id__in=attempt_ids, gpu_util_mean_pct__isnull=False
        ).values_list("attempt_id", "gpu_util_mean_pct")
    }


def usage_report(
    *, user, start: date, end: date, team: str | None = None, username: str | None = None, now: datetime | None = None
) -> list[UsageRow]:
    """GPU-hours per day, team, user, spec and card model, from the pool's ledger: a slice counts
    compute_milli/1000 of a GPU for as long as it was held (`end` is inclusive; days are UTC). Next to that
    requested (held) figure, what was used: held time x the attempt's mean utilization of its card, never more
    than held; hours of attempts without a utilization reading are counted apart as unmeasured."""
    if end < start:
        raise ValidationFailed("'to' is before 'from'", code="invalid_range", field="to")
    if (end - start).days + 1 > MAX_REPORT_DAYS:
        raise ValidationFailed(f"a report covers at most {MAX_REPORT_DAYS} days", code="range_too_long", field="from")
    now = now or timezone.now()
    t0 = datetime.combine(start, time.min, tzinfo=UTC)
    upper = min(datetime.combine(end + timedelta(days=1), time.min, tzinfo=UTC), now)
    qs = LogicalDevice.objects.filter(attempt__isnull=False, created_at__lt=upper).filter(
        Q(released_at__isnull=True) | Q(released_at__gt=t0)
    )
    if user is not None and not user.is_staff:  # None: the caller already checked the team is visible
        qs = qs.filter(attempt__job__team__in=visible_teams(user))
    if team:
        qs = qs.filter(attempt__job__team__slug=team)
    if username:
        qs = qs.filter(attempt__job__owner__username=username)
    rows = list(
        qs.values_list(
            "created_at",
            "released_at",
            "compute_milli",
            "attempt__job_id",
            "attempt__job__team__slug",
            "attempt__job__owner__username",
            "attempt__job__spec__name",
            "gpu__model",
            "attempt_id",
        )
    )
    utilization = _utilization_of({r[8] for r in rows})
    totals: dict[tuple, list] = defaultdict(lambda: [0.0, set(), 0.0, 0.0])
    for created, released, milli, job_id, team_slug, owner, spec, model, attempt_id in rows:
        util = utilization.get(attempt_id)
        a, b = max(created, t0), min(released or now, upper)
        while a < b:
            day_end = datetime.combine(a.astimezone(UTC).date() + timedelta(days=1), time.min, tzinfo=UTC)
            piece_end = min(b, day_end)
            key = (a.astimezone(UTC).date(), team_slug, owner, spec or "explicit", model)
            hours = (piece_end - a).total_seconds() / 3600
            held = hours * milli / 1000
            totals[key][0] += held
            totals[key][1].add(job_id)
            if util is None:
                totals[key][3] += held
            else:
                totals[key][2] += min(held, hours * util)
            a = piece_end
    return [
        UsageRow(
            day=k[0],
            team=k[1],
            user=k[2],
            spec=k[3],
            gpu_model=k[4],
            gpu_hours=round(v[0], 6),
            jobs=len(v[1]),
            gpu_hours_used=round(v[2], 6),
            gpu_hours_unmeasured=round(v[3], 6),
        )
        for k, v in sorted(totals.items())
    ]


# ------------------------------------------------------------------------------------------ comparison


@dataclass(frozen=True)
class Comparison:
    """The business metrics of several jobs on common axes: per metric, each job's (x, y) points; each job's
    last value of every metric it reported; x is the step when every report of every job has one."""

    step_axis: bool
    names: list[str]
    series: dict[str, dict[str, list[tuple[float, float]]]]
    final: dict[str, dict[str, float]]
    reports: dict[str, int]


def compare_metrics(jobs: list[Job], *, limit: int = 5000) -> Comparison:
    by_job: dict[str, list[BusinessMetric]] = defaultdict(list)
    for metric in BusinessMetric.objects.filter(job__in=jobs).order_by("job", "at", "id"):
        by_job[str(metric.job_id)].append(metric)
    step_axis = all(m.step is not None for rows in by_job.values() for m in rows)
    series: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(dict)
    final: dict[str, dict[str, float]] = {}
    for job in jobs:
        rows = by_job.get(str(job.id), [])
        last: dict[str, float] = {}
        points: dict[str, list[tuple[float, float]]] = defaultdict(list)
        origin = rows[0].at if rows else None
        for m in rows:
            x = float(m.step) if step_axis else (m.at - origin).total_seconds()
            for key, value in m.values.items():
                points[key].append((x, float(value)))
                last[key] = float(value)
        for key, values in points.items():
            series[key][str(job.id)] = _thin(values, limit)
        final[str(job.id)] = last
    return Comparison(
        step_axis=step_axis,
        names=sorted(series),
        series=dict(series),
        final=final,
        reports={str(job.id): len(by_job.get(str(job.id), [])) for job in jobs},
    )


# ------------------------------------------------------------------------------------------- right-sizing


# What the lookup and `_runs_of` read of each run (a job row has some 60 columns, several of them JSON).
SIMILAR_FIELDS = ("id", "owner_id", "finished_at", "gpu_count", "gpu_memory_mib")
# The two likenesses, as the keys of jobs_succeededrun (filled by the database: jobs/0028) are made: the md5 of the
# JSON text. Each is read from its own index there, newest first, and stops `limit` deep; only those rows are read
# from jobs_job. Plain SQL: the ORM spent more CPU building these statements than the database spent answering
# them, and this lookup runs in every submission.
_SIMILAR_SQL = {
    "command": "r.command_key = md5(COALESCE((%s::jsonb)::text, '') || COALESCE((%s::jsonb)::text, ''))",
    "labels": "r.labels_key = md5((%s::jsonb)::text)",
}
# Two values may share an md5: the row's own values are compared too, by the database, so that the rows come back
# without their JSON (decoding ten rows' command, args and labels cost a submission ~0.4 ms of the web's CPU).
_SAME_SQL = {
    "command": "j.command = %s::jsonb AND j.args = %s::jsonb",
    "labels": "j.labels = %s::jsonb",
}


@dataclass(frozen=True, slots=True)
class PastRun:
    """What right-sizing reads of an earlier run (SIMILAR_FIELDS), made straight from the row: built as Job objects
    through a raw queryset, ten of them cost more of a submission's CPU than the statement that found them."""

    pk: Any
    owner_id: int
    finished_at: datetime
    gpu_count: int
    gpu_memory_mib: int
    # The GPU numbers of the run's last attempt that has them (peak MiB, p95 MiB, utilisation p95 %), read by the
    # same statement; None without a final profile. `_runs_of` reads no profile again for a PastRun.
    profile: tuple | None = None


# A run's usage evidence, beside each row the lookup finds (what `_runs_of` reads for Job rows in one more query).
_PROFILE_SQL = (
    "LEFT JOIN LATERAL (SELECT p.gpu_memory_peak_mib, p.gpu_memory_p95_mib, p.gpu_util_p95_pct "
    "FROM monitoring_usageprofile p JOIN jobs_attempt a ON a.id = p.attempt_id "
    "WHERE p.job_id = s.id AND p.final AND p.gpu_memory_peak_mib IS NOT NULL ORDER BY a.number DESC LIMIT 1) pr ON true"
)


def similar_runs(job: Job, *, owner_only: bool, limit: int) -> list[PastRun]:
    """Succeeded jobs like this one (same image and same command, or the same labels when it has labels),
    newest first, at most `limit`: the user's own, or the whole team's. Each likeness is read from its own index
    (jobs.models.SucceededRun), newest first and `limit` deep, and the two merged, so a submission costs the same
    with ten runs in the team's history or a million."""
    scope, value = ("r.team_id", job.team_id)
    if owner_only:
        scope, value = "r.member_key", SucceededRun.member(job.team_id, job.owner_id)
    fields = ", ".join(f"j.{f}" for f in SIMILAR_FIELDS)
    head = (
        f"SELECT {fields} FROM jobs_succeededrun r JOIN jobs_job j ON j.id = r.job_id "
        f"WHERE {scope} = %s AND r.image_reference = %s AND r.job_id <> %s"
    )
    params: list[Any] = [value, job.image_reference, job.pk]
    likeness = [("command", [json.dumps(job.command), json.dumps(job.args)])]
    if job.labels:
        likeness.append(("labels", [json.dumps(job.labels)]))
    parts, values = [], []
    for kind, key in likeness:
        parts.append(f"({head} AND {_SIMILAR_SQL[kind]} AND {_SAME_SQL[kind]} ORDER BY r.finished_at DESC LIMIT %s)")
        values += [*params, *key, *key, limit]
    found: dict[Any, PastRun] = {}
    with prepared_cursor() as cursor:
        cursor.execute(
            f"SELECT s.*, pr.* FROM ({' UNION ALL '.join(parts)}) s {_PROFILE_SQL}",
            values,
        )
        rows = cursor.fetchall()
    width = len(SIMILAR_FIELDS)
    for row in rows:
        if row[0] not in found:  # a run alike in both ways comes back twice
            profile = row[width:]
            found[row[0]] = PastRun(*row[:width], profile=None if profile[0] is None else tuple(profile))
    return sorted(found.values(), key=lambda j: j.finished_at, reverse=True)[:limit]


def _runs_of(jobs: list) -> list[rightsizing.Run]:
    """The usage evidence of `jobs` (Job rows or PastRun records: `pk`, `gpu_count`, `gpu_memory_mib` are read;
    a PastRun's profile came with it)."""
    if not jobs:
        return []
    profiles: dict[Any, tuple] = {j.pk: j.profile for j in jobs if isinstance(j, PastRun) and j.profile is not None}
    unread = [j.pk for j in jobs if not isinstance(j, PastRun)]
    if unread:
        with connection.cursor() as cursor:
            # Each job's last attempt with GPU numbers.
            cursor.execute(
                "SELECT DISTINCT ON (p.job_id) p.job_id, p.gpu_memory_peak_mib, p.gpu_memory_p95_mib, "
                "p.gpu_util_p95_pct FROM monitoring_usageprofile p JOIN jobs_attempt a ON a.id = p.attempt_id "
                "WHERE p.job_id = ANY(%s) AND p.final AND p.gpu_memory_peak_mib IS NOT NULL "
                "ORDER BY p.job_id, a.number DESC",
                [unread],
            )
            for row in cursor.fetchall():
                profiles[row[0]] = row[1:]
    batches: dict[Any, float] = {}
    if profiles:
        for job_id, values in (
            BusinessMetric.objects.filter(job__in=list(profiles), values__has_key="batch_size")
            .order_by("job", "at", "id")
            .values_list("job_id", "values")
        ):
            try:
                batches[job_id] = float(values["batch_size"])
            except (TypeError, ValueError):
                continue
    runs = []
    for job in jobs:
        p = profiles.get(job.pk)
        if p is None:
            continue
        peak, p95, util_p95 = p
        runs.append(
            rightsizing.Run(
                job_id=str(job.pk),
                gpu_count=job.gpu_count,
                gpu_memory_mib=job.gpu_memory_mib,
                gpu_memory_peak_mib=peak,
                gpu_memory_p95_mib=p95 or peak,
                gpu_util_p95_pct=util_p95,
                batch_size=batches.get(job.pk),
            )
        )
    return runs


def spec_options(job: Job) -> list[rightsizing.SpecOption]:
    """Every spec the job's queue offers, per card on the card size the job's own request was sized for."""
    from jobs.services import _reference_card_mib

    card = _reference_card_mib()
    if job.gpu_memory_eighths:
        card = job.gpu_memory_mib * 8 // job.gpu_memory_eighths
    options = []
    for spec in job.queue.specs.filter(enabled=True):
        counts = range(1, max(job.gpu_count, spec.gpu_count) + 1) if spec.exclusive else [spec.gpu_count]
        for count in counts:
            options.append(
                rightsizing.SpecOption(
                    name=spec.name,
                    gpu_count=count,
                    gpu_milli=spec.gpu_milli,
                    gpu_memory_mib=card * spec.gpu_memory_eighths // 8,
                )
            )
    return options


def _recommend(job: Job, runs: list, *, scope: str, replicas: int = 1):
    """rightsizing.recommend for this job's request, among its queue's specs, with the configured margins."""
    request = rightsizing.SpecOption(
        name=job.spec.name if job.spec_id else "",
        gpu_count=job.gpu_count,
        gpu_milli=job.gpu_milli,
        gpu_memory_mib=job.gpu_memory_mib,
    )
    return rightsizing.recommend(
        runs,
        request=request,
        options=spec_options(job),
        margin=settings.TRAINYARD_RIGHTSIZE_MARGIN,
        uncertainty=settings.TRAINYARD_RIGHTSIZE_UNCERTAINTY,
        scope=scope,
        replicas=replicas,
    )


def recommendation_for(job: Job) -> dict | None:
    """What earlier runs like this job say it needs (docs/rightsizing.md); None without evidence. Advice only:
    the job's request is never changed."""
    history = settings.TRAINYARD_RIGHTSIZE_HISTORY
    # The team's runs first: with none (a command never run in the team, what most submissions are) there is no
    # evidence at either scope, and the user's own lookup is not made.
    team = similar_runs(job, owner_only=False, limit=history)
    if not team:
        return None
    mine = [j for j in team if j.owner_id == job.owner_id]
    if len(team) >= history and len(mine) < history:  # the team's newest `history` may hide older ones of mine
        mine = similar_runs(job, owner_only=True, limit=history)
    # The usage profiles of both scopes in one read (mine are most often among the team's).
    profiled = {run.job_id: run for run in _runs_of(list({j.pk: j for j in (*mine, *team)}.values()))}
    runs, scope = [profiled[str(j.pk)] for j in mine if str(j.pk) in profiled], "user"
    if not runs:
        runs, scope = [profiled[str(j.pk)] for j in team if str(j.pk) in profiled], "team"
    if not runs:  # no evidence: no advice, and no need to read the queue's specs for it
        return None
    rec = _recommend(job, runs, scope=scope, replicas=job.replicas)
    if rec is None:
        return None
    out = rec.as_dict()
    out["expected_waits"] = expected_waits(job, out)
    return out


def expected_waits(job: Job, rec: dict) -> list[dict]:
    """If a job with the recommended request were submitted now: when it might start in each open queue of the
    team that offers the recommended spec (the estimator the job page uses, the job placed at the end of each
    line). Seconds from now; `known` False where the estimator had to guess."""
    import copy

    from jobs.eta import estimate_starts
    from jobs.selectors import waiting_line
    from quotas.models import Queue

    queues = [job.queue]
    if rec["spec"]:
        queues = list(
            Queue.objects.filter(teams=job.team_id, state=Queue.State.OPEN, specs__name=rec["spec"])
            .distinct()
            .order_by("name")
        )
    milli = rec["gpu_count"] * rec["gpu_milli"] * job.replicas
    waits = []
    for queue in queues:
        key = _waits_key(job, queue, milli)
        found = cache.get(key)
        if found is None:
            probe = copy.copy(job)
            probe.queue, probe.queue_id, probe.total_gpu_milli, probe.reason = queue, queue.id, milli, ""
            line = [j for j in waiting_line(queue) if j.id != job.pk] + [probe]
            estimate = estimate_starts(queue, line).get(job.pk)
            found = {"at": timezone.now().timestamp(), "estimate": estimate.as_dict() if estimate is not None else None}
            cache.set(key, found, WAITS_TTL_S)
        if found["estimate"] is not None:
            waits.append({"queue": queue.name, **_aged(found["estimate"], timezone.now().timestamp() - found["at"])})
    return waits


# The expected waits replay the queue's whole line (hundreds of ms at 5,000 waiting jobs): a submission that
# repeats one made in the last few seconds (a CI pipeline's burst, the form's resubmission) reuses that answer,
# aged by the time since.
WAITS_TTL_S = 15


def _waits_key(job: Job, queue, milli: int) -> str:
    like = json.dumps(
        [queue.id, job.team_id, job.owner_id, job.command, job.args, job.labels, milli, job.timeout_s],
        sort_keys=True,
        default=str,
    )
    return "rightsizing:waits:" + hashlib.sha256(like.encode()).hexdigest()[:32]


def _aged(estimate: dict, elapsed: float) -> dict:
    out = dict(estimate)
    for k in ("low_s", "mid_s", "high_s"):
        if out.get(k) is not None:
            out[k] = max(0, round(out[k] - elapsed))
    return out


def usage_of(job: Job) -> list[UsageProfile]:
    return list(UsageProfile.objects.filter(job=job).select_related("attempt").order_by("attempt__number"))


def _round(value, digits=1):
    return None if value is None else round(value, digits)


def usage_payload(job: Job) -> dict:
    """A job's usage next to its request: one profile per attempt, the idle state, and the recommendation."""
    attempts = []
    idle = None
    for p in usage_of(job):
        attempts.append(
            {
                "attempt": p.attempt.number,
                "gpu_source": p.gpu_source or None,
                "host_source": p.host_source or None,
                "samples": p.samples,
                "final": p.final,
                "first_at": p.first_at.isoformat() if p.first_at else None,
                "last_at": p.last_at.isoformat() if p.last_at else None,
                "gpu_memory_peak_mib": _round(p.gpu_memory_peak_mib),
                "gpu_memory_p95_mib": _round(p.gpu_memory_p95_mib),
                "gpu_util_mean_pct": _round(p.gpu_util_mean_pct),
                "gpu_util_p95_pct": _round(p.gpu_util_p95_pct),
                "cpu_peak_milli": _round(p.cpu_peak_milli, 0),
                "host_memory_peak_mib": _round(p.host_memory_peak_mib),
                "idle_since": p.idle_since.isoformat() if p.idle_since else None,
                "idle_flagged_at": p.idle_flagged_at.isoformat() if p.idle_flagged_at else None,
                "leak_flagged_at": p.leak_flagged_at.isoformat() if p.leak_flagged_at else None,
                "series": p.series,
            }
        )
        if p.idle_flagged_at and not p.final:
            idle = {"since": p.idle_since.isoformat() if p.idle_since else None, "flagged_at": p.idle_flagged_at}
    return {
        "requested": {
            "spec": job.spec.name if job.spec_id else None,
            "gpu_count": job.gpu_count,
            "gpu_milli": job.gpu_milli,
            "gpu_memory_mib": job.gpu_memory_mib,
            "cpu_milli": job.cpu_milli,
            "memory_mib": job.memory_mib,
        },
        "attempts": attempts,
        "idle": idle,
        "idle_policy": {
            "threshold_pct": job.queue.idle_threshold_pct,
            "after_s": job.queue.idle_after_s,
            "action": job.queue.idle_action,
            "stop_after_s": job.queue.idle_stop_after_s,
        },
        "recommendation": recommendation_for(job),
    }


@dataclass
class OverRequest:
    job: Job
    held_gpu_hours: float
    used_gpu_hours: float
    freed_gpu_hours: float
    peak_gpu_memory_mib: float | None
    util_mean_pct: float | None
    recommendation: dict | None


@dataclass
class TeamRightsizing:
    start: date
    end: date
    requested_gpu_hours: float
    used_gpu_hours: float
    unmeasured_gpu_hours: float
    freed_gpu_hours: float
    top: list[OverRequest]


def team_rightsizing(team, *, start: date, end: date, top: int = 5, now: datetime | None = None) -> TeamRightsizing:
    """A team's GPU-hours requested (held) vs used over [start, end], its most over-requesting jobs, and what
    right-sizing would have freed: each finished job's held GPU-hours times the share of compute its own
    profile's recommendation would have saved."""
    now = now or timezone.now()
    rows = usage_report(user=None, start=start, end=end, team=team.slug, now=now)
    t0 = datetime.combine(start, time.min, tzinfo=UTC)
    upper = min(datetime.combine(end + timedelta(days=1), time.min, tzinfo=UTC), now)
    held: dict[Any, float] = defaultdict(float)
    used: dict[Any, float] = defaultdict(float)
    devices = LogicalDevice.objects.filter(attempt__job__team=team, attempt__isnull=False, created_at__lt=upper).filter(
        Q(released_at__isnull=True) | Q(released_at__gt=t0)
    )
    device_rows = list(
        devices.values_list("created_at", "released_at", "compute_milli", "attempt__job_id", "attempt_id")
    )
    utilization = _utilization_of({r[4] for r in device_rows})
    for created, released, milli, job_id, attempt_id in device_rows:
        hours = max(0.0, (min(released or now, upper) - max(created, t0)).total_seconds() / 3600)
        held[job_id] += hours * milli / 1000
        util = utilization.get(attempt_id)
        if util is not None:
            used[job_id] += min(hours * milli / 1000, hours * util)
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=list(used)).select_related("spec", "queue", "owner")}
    profiles = {
        p.job_id: p
        for p in UsageProfile.objects.filter(job__in=list(jobs), final=True, gpu_memory_peak_mib__isnull=False)
        .select_related("attempt")
        .order_by("job", "attempt__number")
    }
    over: list[OverRequest] = []
    freed_total = 0.0
    for job_id, job in jobs.items():
        p = profiles.get(job_id)
        rec = None
        freed = 0.0
        if p is not None:
            run = rightsizing.Run(
                job_id=str(job_id),
                gpu_count=job.gpu_count,
                gpu_memory_mib=job.gpu_memory_mib,
                gpu_memory_peak_mib=p.gpu_memory_peak_mib,
                gpu_memory_p95_mib=p.gpu_memory_p95_mib or p.gpu_memory_peak_mib,
                gpu_util_p95_pct=p.gpu_util_p95_pct,
            )
            found = _recommend(job, [run], scope="job")
            if found is not None:
                rec = found.as_dict()
                asked = job.gpu_count * job.gpu_milli
                if asked and not found.fits_request:
                    freed = held[job_id] * (found.saves_gpu_milli / asked)
        freed_total += freed
        over.append(
            OverRequest(
                job=job,
                held_gpu_hours=held[job_id],
                used_gpu_hours=used[job_id],
                freed_gpu_hours=freed,
                peak_gpu_memory_mib=p.gpu_memory_peak_mib if p else None,
                util_mean_pct=p.gpu_util_mean_pct if p else None,
                recommendation=rec,
            )
        )
    over.sort(key=lambda o: o.held_gpu_hours - o.used_gpu_hours, reverse=True)
    return TeamRightsizing(
        start=start,
        end=end,
        requested_gpu_hours=sum(r.gpu_hours for r in rows),
        used_gpu_hours=sum(r.gpu_hours_used for r in rows),
        unmeasured_gpu_hours=sum(r.gpu_hours_unmeasured for r in rows),
        freed_gpu_hours=freed_total,
        top=over[:top],
    )


def recommendation_among(job: Job, peers: list[Job]) -> dict | None:
    """What a set of sibling runs (an experiment's ended trials) says the next one like `job` needs: the same
    rule as `recommendation_for`, with the siblings as the evidence instead of the history of similar jobs."""
    rec = _recommend(job, _runs_of(peers), scope="experiment", replicas=job.replicas)
    return rec.as_dict() if rec is not None else None
