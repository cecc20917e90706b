"""Reads about jobs: what a user may see, queue positions, estimated waits."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import NamedTuple

from django.conf import settings
from django.db import connection
from django.db.models import CharField, QuerySet
from django.db.models.functions import Cast

from jobs.models import LINE_ORDER, Job
from jobs.states import JobState
from kernel.sentences import stored
from quotas.models import Membership


def jobs_visible_to(user) -> QuerySet[Job]:
    qs = Job.objects.select_related("owner", "team", "queue", "spec")
    if user.is_staff:
        return qs
    # The user's team ids as constants (one small query): joined through memberships instead, the planner misjudges
    # how many jobs match and sorts every visible job rather than walking the newest-first index (see bench/api.py).
    return qs.filter(team_id__in=list(Membership.objects.filter(user=user).values_list("team_id", flat=True)))


# What the waiting line is read for (the line on queue pages and in the API, the estimated starts): a job row has
# some 60 columns, several of them JSON, and a line of 5,000 jobs read whole took half a second to load.
LINE_FIELDS = (
    "id",
    "name",
    "state",
    "priority",
    "preemptible",
    "reason",
    "message",
    "submitted_at",
    "total_gpu_milli",
    "timeout_s",
    "command",
    "labels",
    "queue_id",
    "owner__username",
    "team__slug",
    "spec__name",
)


def queue_waiting(queue, *, ids=None) -> list[Job]:
    """The queue's waiting line in the dispatcher's order, with the columns the line and its estimates use
    (`LINE_FIELDS`; touching another one costs a query per job); `ids`: only those jobs of it."""
    qs = Job.objects.filter(queue=queue, state=JobState.PENDING)
    if ids is not None:
        qs = qs.filter(id__in=list(ids))
    qs = qs.select_related("owner", "team", "spec").only(*LINE_FIELDS)
    return list(qs.order_by(*LINE_ORDER))


# Each given waiting job's place in its line: its rank among its queue's waiting jobs in `LINE_ORDER` (the row
# comparison orders as LINE_ORDER does). A few jobs count what is ahead of each (a job's page: 1.6-6 ms behind
# 5,000, the heap rows visited); a page of them ranks the lines of the queues involved once (~5 ms for 5,000; fifty
# counts took 65). Jobs no longer waiting are left out.
AHEAD_SQL = """
SELECT j.id, 1 + (
    SELECT count(*) FROM jobs_job a
    WHERE a.queue_id = j.queue_id AND a.state = 'pending'
      AND (a.preemptible, -a.priority, a.submitted_at, a.id) < (j.preemptible, -j.priority, j.submitted_at, j.id)
)
FROM jobs_job j WHERE j.id = ANY(%(ids)s::uuid[]) AND j.state = 'pending'
"""
RANKS_SQL = """
SELECT id, place FROM (
    SELECT id, row_number() OVER (PARTITION BY queue_id ORDER BY preemptible, priority DESC, submitted_at, id) place
    FROM jobs_job
    WHERE state = 'pending'
      AND queue_id IN (SELECT DISTINCT queue_id FROM jobs_job WHERE id = ANY(%(ids)s::uuid[]) AND state = 'pending')
) line
WHERE id = ANY(%(ids)s::uuid[])
"""
COUNT_AT_MOST = 4  # jobs asked for at once that are counted rather than ranked


def queue_positions(ids) -> dict[uuid.UUID, int]:
    """job id -> its place in its queue's waiting line (1: next), for those of `ids` that wait."""
    ids = [str(i) for i in ids]
    if not ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(AHEAD_SQL if len(ids) <= COUNT_AT_MOST else RANKS_SQL, {"ids": ids})
        return dict(cursor.fetchall())


def with_positions(jobs):
    """Give the waiting ones of `jobs` (a page) their places in one query instead of one each; returns `jobs`."""
    waiting = [job for job in jobs if job.state == JobState.PENDING]
    places = queue_positions([job.id for job in waiting])
    for job in waiting:
        job.queue_position = places.get(job.id)
    return jobs


class Place(NamedTuple):
    """A waiting job's place in its line, as pages list and count it."""

    id: uuid.UUID
    owner_id: int


def line_places(queue) -> list[Place]:
    """The queue's waiting line in the dispatcher's order, ids and owners only: what a page counts and lists. The
    estimates read their own columns (`eta.waiting_line`), and only when they are computed."""
    rows = Job.objects.filter(queue=queue, state=JobState.PENDING).order_by(*LINE_ORDER)
    return [Place(*row) for row in rows.values_list("id", "owner_id")]


def line_ends(queue) -> tuple[int, uuid.UUID | None]:
    """How many jobs wait in the queue, and the id of the last of them (None when none waits)."""
    rows = Job.objects.filter(queue=queue, state=JobState.PENDING)
    last = rows.order_by("-preemptible", "priority", "-submitted_at", "-id").values_list("id", flat=True).first()
    return (rows.count() if last is not None else 0), last


def line_rows(queue, line: list, *, first: int, also=()) -> tuple[Mapping, list[Job]]:
    """A long line shown in part: (the estimates of the whole line, the full rows of the `first` jobs of `line`
    (`line_places`) and of the jobs in `also`). The estimates cover the whole line; pages and the API list a part
    of it."""
    waits = estimated_waits(queue)
    also = set(also)
    wanted = {j.id for j in line[:first]} | {j.id for j in line if j.id in also}
    return waits, queue_waiting(queue, ids=wanted) if wanted else []


def waiting_line(queue) -> list:
    """The waiting line with only what its estimates need (jobs.eta.LineJob)."""
    from jobs import eta

    return eta.waiting_line(queue)


def estimated_waits(queue, waiting: list | None = None, *, fleet=None):
    """When each waiting job may start: job id -> jobs.eta.Estimate (a range, or unknown), a mapping. `waiting`:
    the line already read (`queue_waiting` or `waiting_line`), else the columns the estimate needs are read when
    it is computed. `fleet`: a `jobs.eta.Fleet` shared by the queues of one page (`estimate_fleet`).

    A queue whose estimates took longer than `ESTIMATE_SLOW_S` to compute (a fleet's line) is answered from the
    kept estimates, aged by the time since, for up to `ESTIMATE_KEEP_S`, while a worker computes them again
    (`jobs.refresh_estimates`, asked once per `ESTIMATE_REUSE_S`); jobs newer than the kept answer have none
    yet. Cheaper ones are computed for every request, as before."""
    import time

    from django.core.cache import cache

    kept = cache.get(_estimates_key(queue.id))
    if kept is not None and kept["cost_s"] >= ESTIMATE_SLOW_S:
        age = time.time() - kept["at"]
        if age > ESTIMATE_REUSE_S:
            _ask_refresh(queue.id)
        return AgedWaits(kept["waits"], age)
    return estimates_compute(queue, waiting, fleet=fleet)


def estimate_fleet():
    """The inputs every queue's estimates share, read once (jobs.eta.Fleet), for a page of several queues."""
    from jobs import eta

    return eta.Fleet()


# A waiting job's own estimate is asked for again and again (its page's live refresh, `trainyard submit --wait`
# polling the job): the queue's estimates are kept this long and shared by every job of the line, aged by the time
# since. A job the kept answer does not know (it came later) gets a fresh replay.
ESTIMATE_REUSE_S = 5
# Estimates that cost more than this to compute are kept longer, and refreshed by a worker, not by the request.
ESTIMATE_SLOW_S = 0.1
ESTIMATE_KEEP_S = 120


def _estimates_key(queue_id: int) -> str:
    return f"eta:queue:{queue_id}"


def estimates_compute(queue, waiting: list | None = None, *, fleet=None) -> dict:
    """Compute a queue's estimates now and keep them (with what they cost) for the requests that follow."""
    import time

    from django.core.cache import cache

    from jobs import eta

    t0 = time.perf_counter()
    waits = eta.estimate_starts(queue, eta.waiting_line(queue) if waiting is None else waiting, fleet=fleet)
    cost = time.perf_counter() - t0
    keep = ESTIMATE_KEEP_S if cost >= ESTIMATE_SLOW_S else ESTIMATE_REUSE_S
    try:
        cache.set(_estimates_key(queue.id), {"at": time.time(), "waits": _packed(waits), "cost_s": cost}, keep)
    except Exception:  # noqa: BLE001 - without Redis every request computes its own
        pass
    return waits


def _ask_refresh(queue_id: int) -> None:
    from celery import current_app
    from django.core.cache import cache

    try:
        if cache.add(f"eta:refreshing:{queue_id}", 1, timeout=60):
            current_app.send_task("jobs.refresh_estimates", args=[queue_id])
    except Exception:  # noqa: BLE001 - the kept answer ages on; the next request asks again
        pass


def _packed(waits: dict) -> dict:
    """The estimates as the cache keeps them: the id's 16 bytes -> a plain tuple. Every read of a fleet's line
    unpickles all of it: 5,000 Estimate objects keyed by UUID objects took 46 ms of CPU, these take 3."""
    return {
        job_id.bytes: None if e is None else (e.low, e.mid, e.high, e.known, e.outlived, e.holders)
        for job_id, e in waits.items()
    }


def _key_of(job_id) -> bytes:
    return (job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(str(job_id))).bytes


def _unpacked(packed):
    from jobs.eta import Estimate

    return None if packed is None else Estimate(*packed)


def _aged(estimate, age: float):
    import dataclasses

    if estimate is None or age <= 0:
        return estimate
    return dataclasses.replace(
        estimate, **{k: max(0.0, v - age) for k in ("low", "mid", "high") if (v := getattr(estimate, k)) is not None}
    )


class AgedWaits(Mapping):
    """Kept estimates (`_packed`) read as of now: each unpacked and aged by `age` seconds when looked up (a line
    of 5,000 is not copied)."""

    def __init__(self, waits: dict, age: float):
        self._waits, self._age = waits, age

    def __getitem__(self, job_id):
        try:
            key = _key_of(job_id)
        except ValueError:
            raise KeyError(job_id) from None
        return _aged(_unpacked(self._waits[key]), self._age)

    def __iter__(self):
        return (uuid.UUID(bytes=key) for key in self._waits)

    def __len__(self) -> int:
        return len(self._waits)


def estimated_start(job: Job):
    """When this waiting job may start (a jobs.eta.Estimate), or None."""
    import time

    from django.core.cache import cache

    kept = cache.get(_estimates_key(job.queue_id))
    if kept is not None and _key_of(job.id) in kept["waits"]:
        age = time.time() - kept["at"]
        if age <= ESTIMATE_REUSE_S or kept["cost_s"] >= ESTIMATE_SLOW_S:
            if age > ESTIMATE_REUSE_S:
                _ask_refresh(job.queue_id)
            return _aged(_unpacked(kept["waits"][_key_of(job.id)]), age)
    return estimates_compute(job.queue).get(job.id)


def line_clears(last, waits: Mapping):
    """When the last job of the line (its id: `line_ends`) may start (the line has cleared), or None for an empty
    line."""
    return waits.get(last) if last is not None else None


MAX_COMPARED = 20


def jobs_to_compare(user, *, ids: list[str], label: str = "") -> list[Job]:
    """The jobs a comparison shows: those named by id (the first 8+ characters will do), and/or the newest
    `MAX_COMPARED` with a label `key=value`; only jobs the user may see, oldest first."""
    import re

    from kernel.errors import ValidationFailed

    visible = jobs_visible_to(user)
    chosen: dict = {}
    for raw in [part for value in ids for part in re.split(r"[\s,]+", value)]:
        text = raw.strip().lower()
        if not text:
            continue
        if not re.fullmatch(r"[0-9a-f][0-9a-f-]{7,35}", text):
            raise ValidationFailed(
                stored("%(value)s is not a job id", value=repr(raw)), code="invalid_job_id", field="job"
            )
        if len(text) == 36:
            found = list(visible.filter(pk=text)[:1])
        else:
            found = list(
                visible.annotate(id_text=Cast("id", CharField())).filter(id_text__startswith=text).order_by()[:2]
            )
        if len(found) != 1:
            raise ValidationFailed(
                stored("no single job of yours has an id starting %(prefix)s", prefix=text),
                code="unknown_job",
                field="job",
            )
        chosen[found[0].pk] = found[0]
    if label:
        key, sep, value = label.partition("=")
        if not sep or not key:
            raise ValidationFailed(stored("label must be key=value"), code="invalid_label_filter", field="label")
        for job in visible.filter(labels__contains={key: value}).order_by("-submitted_at")[:MAX_COMPARED]:
            chosen.setdefault(job.pk, job)
    if len(chosen) > MAX_COMPARED:
        raise ValidationFailed(
            stored("compare at most %(most)s jobs at once (%(n)s chosen)", most=MAX_COMPARED, n=len(chosen)),
            code="too_many_jobs",
            field="job",
        )
    return sorted(chosen.values(), key=lambda j: (j.submitted_at, str(j.pk)))


def job_parameters(job: Job) -> dict[str, str]:
    """What a job was asked to run with, flattened to comparable text: the rows of a comparison."""
    import shlex

    params = {
        "command": shlex.join([*map(str, job.command), *map(str, job.args)]),
        "image": job.image_reference + (f"@{job.image_digest}" if job.image_digest else ""),
        "queue": job.queue.name,
        "spec": job.spec.name if job.spec_id else "explicit",
        "gpus": f"{job.gpu_count} x {job.gpu_milli / 1000:g} GPU, {job.gpu_memory_mib} MiB",
        "replicas": str(job.replicas),
        "gpu_models": ", ".join(job.gpu_models) or "any",
        "timeout_s": str(job.timeout_s),
        "max_retries": str(job.max_retries),
        "working_dir": job.working_dir,
        "code": job.code_digest or "none",
    }
    for key, value in sorted(job.env.items()):
        params[f"env.{key}"] = str(value)
    for key, value in sorted(job.labels.items()):
        params[f"label.{key}"] = str(value)
    for key, value in sorted((job.ci or {}).items()):
        params[f"ci.{key}"] = str(value)
    return params


def parameter_rows(jobs: list[Job]) -> list[dict]:
    """One row per parameter any of the jobs has: each job's value (None where it has none), and whether they differ."""
    per_job = [job_parameters(job) for job in jobs]
    names: list[str] = []
    for params in per_job:
        names += [n for n in params if n not in names]
    rows = []
    for name in names:
        values = [params.get(name) for params in per_job]
        rows.append({"name": name, "values": values, "differs": len(set(values)) > 1})
    return rows


def store_wait(job: Job) -> dict | None:
    """Where a job's wait for the object store stands (the job page and the API show it), or None."""
    if job.store_wait_since is None:
        return None
    total = settings.TRAINYARD_STORE_OUTAGE_WAIT_S
    return {
        "since": job.store_wait_since,
        "next_try_at": job.not_before,
        "gives_up_at": job.store_wait_since + timedelta(seconds=total),
        "total_wait_s": total,
    }
