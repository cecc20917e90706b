"""Preemption: borrowed cards go back to the work that holds quota for them (docs/pools.md).

A preemptible job holds no quota: it runs on whatever capacity is idle, beyond its queue's hard quota. When a job
that does hold quota (it passed its queue's and team's checks) waits only because no card is free, the platform
frees what that job needs from the youngest preemptible attempts: on a copy of the pool in memory it gives back
their slices, youngest first, until the waiting job fits, and keeps only those on the nodes it would use. Each
chosen attempt gets its notice (`lifecycle.attempt_preempt`: SIGTERM, TRAINYARD_PREEMPT_NOTICE seconds to save a
checkpoint, then SIGKILL), syncs its last checkpoint as it stops and ends `preempted`; its job waits again with no
retry used and resumes from that checkpoint when capacity returns.

Level-triggered: it runs after every dispatch pass that leaves jobs waiting, reads the waiting jobs and the live
attempts afresh, and counts attempts already told to yield as freed, so a repeated pass preempts nothing twice.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import structlog
from django.db import connection

from jobs import lifecycle
from jobs.store import CLASS_ORDER, JobStore, _pending_rows, _row_waiting
from quotas.models import Queue
from scheduler import dispatch as scheduler
from scheduler.pool import Pool

log = structlog.get_logger(__name__)


@dataclass
class Victim:
    attempt_id: int
    job_id: object
    yielding: bool  # already told to stop: its cards count as free
    slices: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    nodes: set[int] = field(default_factory=set)  # node positions in the pool


VICTIMS_SQL = """
SELECT a.id, a.job_id, a.preempt_requested_at IS NOT NULL, d.gpu_id, d.compute_milli, d.memory_mib, d.cpu_milli,
       d.host_memory_mib
FROM jobs_attempt a JOIN jobs_job j ON j.id = a.job_id
JOIN cluster_logicaldevice d ON d.attempt_id = a.id AND d.released_at IS NULL
WHERE j.preemptible AND a.state IN ('placed', 'starting', 'running')
ORDER BY a.created_at DESC, a.id DESC
"""


def _victims() -> list[Victim]:
    """Live attempts of preemptible jobs with their slices, youngest first."""
    with connection.cursor() as cursor:
        # The common case (no preemptible job holds cards) costs one index probe (`job_preemptible_holding`).
        cursor.execute("SELECT EXISTS (SELECT 1 FROM jobs_job WHERE preemptible AND reserved)")
        if not cursor.fetchone()[0]:
            return []
        cursor.execute(VICTIMS_SQL)
        rows = cursor.fetchall()
    out: dict[int, Victim] = {}
    for attempt_id, job_id, yielding, gpu_id, milli, memory, cpu, host_memory in rows:
        victim = out.setdefault(attempt_id, Victim(attempt_id, job_id, yielding))
        victim.slices.append((gpu_id, milli, memory, cpu, host_memory))
    return list(out.values())


def _waiting() -> list[tuple[scheduler.Waiting, tuple[str, ...]]]:
    """Quota-holding jobs that wait for capacity alone, in admission order (queue class, queue priority, line),
    each with the node pools of its queue."""
    rows = _pending_rows("AND NOT preemptible AND reason = %s", [scheduler.NO_CAPACITY])
    if not rows:
        return []
    # The dispatcher's own queue order (JobStore.backlog), then each line's.
    ordered = Queue.objects.order_by(CLASS_ORDER, "-priority", "id").values_list("id", "pools")
    place = {queue_id: (k, tuple(sorted(pools or ()))) for k, (queue_id, pools) in enumerate(ordered)}
    jobs = sorted((_row_waiting(row) for row in rows), key=lambda job: (place[job.queue_id][0], job.order))
    return [(job, place[job.queue_id][1]) for job in jobs]


def preemptions_plan() -> list[tuple[Victim, scheduler.Waiting]]:
    """Which attempts must yield, and for which waiting job: nothing when no preemptible attempt runs."""
    victims = _victims()
    if not victims:
        return []
    waiting = _waiting()
    if not waiting:
        return []
    pool = Pool()
    pool.sync(lambda p: scheduler.workload(JobStore(), p))
    for v in victims:
        v.nodes = {pool.gpu_at[s[0]][0] for s in v.slices if s[0] in pool.gpu_at}
        if v.yielding:
            pool.shift(v.slices, -1)
    candidates = [v for v in victims if not v.yielding]
    chosen: list[tuple[Victim, scheduler.Waiting]] = []
    for job, pools in waiting:
        if not candidates:
            break
        if not isinstance(scheduler.place(job, pool, pools), tuple):
            continue  # fits already (freed by attempts told earlier): the next pass admits it
        freed: list[Victim] = []
        placed = None
        for v in candidates:
            pool.shift(v.slices, -1)
            freed.append(v)
            result = scheduler.place(job, pool, pools)
            if not isinstance(result, tuple):
                placed = result
                break
        if placed is None:
            for v in freed:
                pool.shift(v.slices, 1)
            continue
        used_nodes = {p.node_index for p, _ in placed}
        for v in freed:
            if v.nodes & used_nodes:
                chosen.append((v, job))
                candidates.remove(v)
            else:
                pool.shift(v.slices, 1)  # its cards were not needed after all
    return chosen


def preemptions_request() -> int:
    """Send the notices the plan asks for; returns how many attempts were told to yield."""
    plan = preemptions_plan()
    if not plan:
        return 0
    owners = _describe({job.id for _, job in plan})
    sent = 0
    for victim, job in plan:
        if lifecycle.attempt_preempt(attempt_id=victim.attempt_id, for_job=owners[job.id]):
            sent += 1
    if sent:
        log.info("preemptions_requested", attempts=sent)
    return sent


def _describe(job_ids: set) -> dict[object, dict[str, str]]:
    from jobs.models import Job

    out: dict[object, dict[str, str]] = defaultdict(dict)
    for job_id, team, queue, owner in Job.objects.filter(pk__in=job_ids).values_list(
        "id", "team__slug", "queue__name", "owner__username"
    ):
        out[job_id] = {"job": str(job_id), "team": team, "queue": queue, "owner": owner}
    return out
