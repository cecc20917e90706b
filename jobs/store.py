"""The job side of a dispatch pass: what the scheduler reads of the job tables, and how its decisions are written.

`JobStore.backlog` reads every waiting line and the quota in use with a handful of aggregate queries (no model
objects). `JobStore.write_admissions` records a pass's admissions in the caller's transaction with one statement:
the admitted jobs (pending -> admitted, the same fields and event a single transition writes), their attempts and
slices; `record_waits` the reason of every waiting job whose reason changed. Nothing is written for a job that does
not fit and whose reason stays the same.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import timedelta
from functools import lru_cache
from queue import SimpleQueue

import structlog
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, Count, Value, When
from django.utils import timezone

from cluster.models import GPU, LogicalDevice, PoolRepair
from cluster.services import gpu_mark_suspect
from jobs import realtime
from jobs.models import Attempt, Job, JobEvent
from jobs.states import UNDECIDED, JobState
from kernel import gctune
from kernel.prepared import prepared_cursor
from kernel.sentences import stored
from quotas.models import Queue, Team
from scheduler import dispatch as scheduler
from scheduler import policy

log = structlog.get_logger(__name__)
START_BATCH = 20  # attempts per start message, at least
START_MESSAGES = 32  # start messages per pass, at most: a pass of thousands sends larger batches, not hundreds
KEEPS_STATE = 100  # a fast pass admitting this many is frozen after it as a full one is (kernel/gctune.py)
SHAPE_FIELDS = (
    "replicas",
    "gpu_count",
    "gpu_milli",
    "gpu_memory_mib",
    "gpu_memory_eighths",
    "exclusive",
    "cpu_milli",
    "memory_mib",
)
# Queues in admission order: inference before training (docs/pools.md), then the queue's own priority.
CLASS_ORDER = Case(When(priority_class=Queue.PriorityClass.INFERENCE, then=Value(0)), default=Value(1))


def _vector(row: dict) -> dict[str, int]:
    return {k: int(row[k] or 0) for k in scheduler.VECTOR}


# The waiting lines as plain rows (no model objects, no per-row converters): a pass over 5,000 waiting jobs
# reads them in tens of milliseconds. The three JSON lists come as one text column, NULL when all are empty;
# the submission time as epoch seconds (decoding 5,000 timestamps cost more than everything else read). The
# rows come unsorted: sorting wide rows cost the server more than sorting the lines' order keys costs here.
PENDING_SQL = """
SELECT id, queue_id, team_id, owner_id, replicas, gpu_count, gpu_milli, gpu_memory_mib, gpu_memory_eighths,
       exclusive, cpu_milli, memory_mib, total_gpu_milli, total_gpu_memory_mib, total_cpu_milli, total_memory_mib,
       min_driver_version,
       CASE WHEN excluded_gpus = '[]'::jsonb AND excluded_nodes = '[]'::jsonb AND gpu_models = '[]'::jsonb
            THEN NULL ELSE jsonb_build_array(excluded_gpus, excluded_nodes, gpu_models)::text END,
       reason, priority, extract(epoch FROM submitted_at)::float8, preemptible, mig_profile,
       extract(epoch FROM not_before)::float8
FROM jobs_job WHERE state = 'pending' {where}
"""


# Over-limit quotas touched by a set of newly admitted jobs, from the committed rows plus this transaction's. A
# preemptible job holds no quota (docs/pools.md), so neither side counts it. `new` is the distinct (queue, team,
# owner) of the admissions (given, as the write's rows returned them, or read by job id), a handful however many
# were admitted: with a row per admission, a pass of 2,000 spent
# 310 ms here when statistics that had not yet seen a burst of submissions made the planner loop over both sides.
OVER_QUOTA_BY_ID = """
    UNION
    SELECT DISTINCT queue_id, team_id, owner_id FROM jobs_job WHERE id = ANY(%(jobs)s::uuid[]) AND NOT preemptible"""
OVER_QUOTA_SQL = """
WITH new AS MATERIALIZED (
    SELECT * FROM unnest(%(queues)s::bigint[], %(teams)s::bigint[], %(owners)s::bigint[]){by_id}
),
held AS (SELECT queue_id, team_id, owner_id, sum(gpu_milli) g, sum(gpu_memory_mib) gm, sum(cpu_milli) c,
                sum(memory_mib) m, sum(jobs) n FROM trainyard_quota_use GROUP BY queue_id, team_id, owner_id)
SELECT 'queue', q.name, format('%%s/%%s GPU milli, %%s/%%s GPU MiB, %%s/%%s CPU milli, %%s/%%s MiB',
       sum(h.g), q.gpu_milli, sum(h.gm), q.gpu_memory_mib, sum(h.c), q.cpu_milli, sum(h.m), q.memory_mib)
FROM held h JOIN quotas_queue q ON q.id = h.queue_id
WHERE h.queue_id IN (SELECT queue_id FROM new)
GROUP BY q.id, q.name
HAVING sum(h.g) > q.gpu_milli OR sum(h.gm) > q.gpu_memory_mib OR sum(h.c) > q.cpu_milli OR sum(h.m) > q.memory_mib
UNION ALL
SELECT 'team', t.slug, format('%%s/%%s GPU milli, %%s/%%s GPU MiB, %%s/%%s CPU milli, %%s/%%s MiB, %%s/%%s jobs',
       sum(h.g), t.gpu_milli, sum(h.gm), t.gpu_memory_mib, sum(h.c), t.cpu_milli, sum(h.m), t.memory_mib,
       sum(h.n), t.max_running_jobs)
FROM held h JOIN quotas_team t ON t.id = h.team_id
WHERE h.team_id IN (SELECT team_id FROM new)
GROUP BY t.id, t.slug
HAVING sum(h.g) > t.gpu_milli OR sum(h.gm) > t.gpu_memory_mib OR sum(h.c) > t.cpu_milli OR sum(h.m) > t.memory_mib
    OR sum(h.n) > t.max_running_jobs
UNION ALL
SELECT 'user', h.owner_id::text || ' in ' || t.slug, format('%%s/%%s jobs', sum(h.n), t.max_jobs_per_user)
FROM held h JOIN quotas_team t ON t.id = h.team_id
WHERE (h.team_id, h.owner_id) IN (SELECT team_id, owner_id FROM new)
GROUP BY t.id, t.slug, h.owner_id, t.max_jobs_per_user
HAVING sum(h.n) > t.max_jobs_per_user
"""


# The slices a write just made that sit on a card or a node placement may not use now (a card marked unhealthy or
# quarantined, a node cordoned or lost after the pass read the pool): asked only when the pool's structure number
# moved since that read.
UNUSABLE_SQL = """
SELECT g.uuid, n.name, g.health, g.quarantined, n.state
FROM cluster_logicaldevice d JOIN cluster_gpu g ON g.id = d.gpu_id JOIN cluster_node n ON n.id = g.node_id
WHERE d.attempt_id = ANY(%s) AND (g.health <> 'healthy' OR g.quarantined OR n.state <> 'ready')
"""


def _pending_rows(where: str = "", params: Sequence = ()) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(PENDING_SQL.format(where=where), list(params))
        return cursor.fetchall()


def _order(job: scheduler.Waiting) -> tuple:
    return job.order


def _row_waiting(row: tuple) -> scheduler.Waiting:
    (jid, queue_id, team_id, owner_id, replicas, count, milli, mem, eighths, exclusive, cpu, host_mem) = row[:12]
    tg, tgm, tc, tm, driver, lists, reason, priority, submitted_at, preemptible, mig, not_before = row[12:]
    ex_gpus, ex_nodes, models = json.loads(lists) if lists else ((), (), ())
    return scheduler.Waiting(
        id=jid,
        queue_id=queue_id,
        team_id=team_id,
        owner_id=owner_id,
        replicas=replicas,
        gpu_count=count,
        gpu_milli=milli,
        gpu_memory_mib=mem,
        gpu_memory_eighths=eighths or 0,
        exclusive=exclusive,
        cpu_milli=cpu,
        memory_mib=host_mem,
        total={"gpu_milli": tg, "gpu_memory_mib": tgm, "cpu_milli": tc, "memory_mib": tm},
        min_driver=driver or "",
        excluded_gpus=tuple(sorted(ex_gpus)),
        excluded_nodes=tuple(sorted(ex_nodes)),
        gpu_models=tuple(models),
        reason=reason,
        order=(preemptible, -priority, submitted_at, jid),
        preemptible=preemptible,
        mig_profile=mig,
        not_before=not_before or 0.0,
    )


# Is a job before a new one in its line (`Waiting.order`: preemptible last, then priority, then age) waiting with a
# reason a pass gave it? One EXISTS per kind of "before", each a range of `job_dispatch_order` (queue, state,
# priority, submitted_at) read until its first decided job: the first one when a pass has been through the line. One
# statement, no query built per submission. When no pass has decided anything yet (no dispatcher running), each
# range is read to its end (5,000 waiting jobs: ~3 ms).
DECIDED_AHEAD_SQL = """
SELECT EXISTS (SELECT 1 FROM jobs_job WHERE {waiting} AND preemptible = %(preemptible)s AND priority > %(priority)s)
    OR EXISTS (
        SELECT 1 FROM jobs_job WHERE {waiting}
        AND preemptible = %(preemptible)s AND priority = %(priority)s AND submitted_at < %(when)s
    )
    OR (%(preemptible)s AND EXISTS (SELECT 1 FROM jobs_job WHERE {waiting} AND NOT preemptible))
""".format(
    waiting="queue_id = %(queue)s AND state = 'pending' AND id <> %(id)s AND NOT (reason IN ({}))".format(
        ", ".join(f"'{reason}'" for reason in UNDECIDED)
    )
)


def _decided_ahead(job: scheduler.Waiting, queue_id: int) -> bool:
    from datetime import UTC, datetime

    params = {
        "queue": queue_id,
        "id": job.id,
        "preemptible": job.preemptible,
        "priority": -job.order[1],
        "when": datetime.fromtimestamp(job.order[2], tz=UTC),
    }
    with connection.cursor() as cursor:
        cursor.execute(DECIDED_AHEAD_SQL, params)
        return cursor.fetchone()[0]


def _queue_rules(queues) -> list[scheduler.QueueRules]:
    return [
        scheduler.QueueRules(
            id=q["id"],
            name=q["name"],
            open=q["state"] == Queue.State.OPEN,
            fifo=q["ordering"] == Queue.Ordering.FIFO,
            limit=_vector(q),
            pools=tuple(sorted(q["pools"] or ())),
        )
        for q in queues.values("id", "name", "state", "ordering", "pools", *scheduler.VECTOR)
    ]


def _team_rules(team_ids: set[int]) -> dict[int, scheduler.TeamRules]:
    return {
        t["id"]: scheduler.TeamRules(
            id=t["id"],
            slug=t["slug"],
            limit=_vector(t),
            max_running_jobs=t["max_running_jobs"],
            max_jobs_per_user=t["max_jobs_per_user"],
        )
        for t in Team.objects.filter(id__in=team_ids).values(
            "id", "slug", "max_running_jobs", "max_jobs_per_user", *scheduler.VECTOR
        )
    }


# What the jobs holding quota add up to per (queue, team, owner): the log migration jobs/0027 keeps, summed. A job
# holds quota while reserved and not preemptible (docs/pools.md).
QUOTA_USE_SQL = """
SELECT queue_id, team_id, owner_id, sum(gpu_milli), sum(gpu_memory_mib), sum(cpu_milli), sum(memory_mib), sum(jobs)
FROM trainyard_quota_use {where}
GROUP BY queue_id, team_id, owner_id HAVING sum(jobs) <> 0
"""

# The log folded into one row per (queue, team, owner), in one statement: rows committed while it runs are not in
# its snapshot, so they are neither deleted nor summed and stay as they are.
QUOTA_USE_COMPACT_SQL = """
WITH folded AS (DELETE FROM trainyard_quota_use RETURNING *)
INSERT INTO trainyard_quota_use (queue_id, team_id, owner_id, gpu_milli, gpu_memory_mib, cpu_milli, memory_mib, jobs)
SELECT queue_id, team_id, owner_id, sum(gpu_milli), sum(gpu_memory_mib), sum(cpu_milli), sum(memory_mib), sum(jobs)
FROM folded GROUP BY queue_id, team_id, owner_id HAVING sum(jobs) <> 0
"""

QUOTA_USE_LOG_SIZE_SQL = "SELECT count(*), count(DISTINCT (queue_id, team_id, owner_id)) FROM trainyard_quota_use"


def quota_use(*, queue_id: int | None = None, team_id: int | None = None) -> list[tuple]:
    """(queue id, team id, owner id, {resource: amount}, jobs) for every (queue, team, owner) holding quota; only
    those of `queue_id` or of `team_id` when either is given. A few rows, whatever the number of holding jobs."""
    where, params = "", []
    if queue_id is not None or team_id is not None:
        where, params = "WHERE queue_id = %s OR team_id = %s", [queue_id, team_id]
    with prepared_cursor() as cursor:
        cursor.execute(QUOTA_USE_SQL.format(where=where), params)
        rows = cursor.fetchall()
    return [
        (q, t, o, dict(zip(scheduler.VECTOR, map(int, amounts), strict=True)), int(n)) for q, t, o, *amounts, n in rows
    ]


def compact_quota_use(*, slack: int = 256) -> bool:
    """Fold the quota-use log when it holds more than `slack` rows beyond one per key. Returns whether it did."""
    with connection.cursor() as cursor:
        cursor.execute(QUOTA_USE_LOG_SIZE_SQL)
        rows, keys = cursor.fetchone()
        if rows <= keys + slack:
            return False
        cursor.execute(QUOTA_USE_COMPACT_SQL)
    return True


def _with_use(rules, teams, waiting, use: list[tuple]) -> scheduler.Backlog:
    """A backlog with what holds quota (`quota_use` rows, one per (queue, team, owner)) folded three ways."""
    queue_used: dict[int, dict[str, int]] = {}
    team_used: dict[int, dict[str, int]] = {}
    user_jobs: dict[tuple[int, int], int] = {}
    for queue_id, team_id, owner_id, used, jobs in use:
        q = queue_used.setdefault(queue_id, dict.fromkeys(scheduler.VECTOR, 0))
        for k, v in used.items():
            q[k] += v
        if team_id in teams:
            t = team_used.setdefault(team_id, {**dict.fromkeys(scheduler.VECTOR, 0), "jobs": 0})
            for k, v in used.items():
                t[k] += v
            t["jobs"] += jobs
            key = (team_id, owner_id)
            user_jobs[key] = user_jobs.get(key, 0) + jobs
    return scheduler.Backlog(
        queues=rules, teams=teams, waiting=waiting, queue_used=queue_used, team_used=team_used, user_jobs=user_jobs
    )


def first_reason_of(
    job: scheduler.Waiting, queue: scheduler.QueueRules, team: scheduler.TeamRules
) -> tuple[str, str] | None:
    """What the next pass would first tell a job that just joined its line, as far as rules decide it: the queue's
    and the team's quota (`scheduler.quota_check`, the check every pass makes), and, in a strictly FIFO queue, an
    earlier job that the last pass left waiting. None when the rules let it through: then only the pass can tell
    whether GPUs are free. Reads what the queue and the team hold (one aggregate) and, in a FIFO queue, the line."""
    backlog = _with_use(
        [queue],
        {team.id: team},
        {queue.id: [job]},
        quota_use(queue_id=queue.id, team_id=job.team_id),
    )
    used = backlog.queue_used.setdefault(queue.id, dict.fromkeys(scheduler.VECTOR, 0))
    why = scheduler.quota_check(job, queue, backlog.teams[job.team_id], backlog, used)
    if why is None and queue.fifo and _decided_ahead(job, queue.id):
        why = (scheduler.BEHIND, stored("waiting behind an earlier job (strict FIFO)"))
    return why


def new_job_reason(job: Job) -> tuple[str, str] | None:
    """`first_reason_of` for a job about to be inserted (its queue and team as the submission loaded them, its
    place in line after every job already there): the reason can go in with the row instead of an update after."""
    queue, team = job.queue, job.team
    rules = scheduler.QueueRules(
        id=queue.id,
        name=queue.name,
        open=queue.state == Queue.State.OPEN,
        fifo=queue.ordering == Queue.Ordering.FIFO,
        limit={k: int(getattr(queue, k) or 0) for k in scheduler.VECTOR},
        pools=tuple(sorted(queue.pools or ())),
    )
    team_rules = scheduler.TeamRules(
        id=team.id,
        slug=team.slug,
        limit={k: int(getattr(team, k) or 0) for k in scheduler.VECTOR},
        max_running_jobs=team.max_running_jobs,
        max_jobs_per_user=team.max_jobs_per_user,
    )
    waiting = scheduler.Waiting(
        id=job.id,
        queue_id=queue.id,
        team_id=team.id,
        owner_id=job.owner_id,
        replicas=job.replicas,
        gpu_count=job.gpu_count,
        gpu_milli=job.gpu_milli,
        gpu_memory_mib=job.gpu_memory_mib,
        gpu_memory_eighths=job.gpu_memory_eighths or 0,
        exclusive=job.exclusive,
        cpu_milli=job.cpu_milli,
        memory_mib=job.memory_mib,
        total={
            "gpu_milli": job.total_gpu_milli,
            "gpu_memory_mib": job.total_gpu_memory_mib,
            "cpu_milli": job.total_cpu_milli,
            "memory_mib": job.total_memory_mib,
        },
        preemptible=job.preemptible,
        order=(job.preemptible, -job.priority, timezone.now().timestamp(), job.id),
    )
    return first_reason_of(waiting, rules, team_rules)


class JobStore:
    """The scheduler's view of the job tables (scheduler.dispatch.Store)."""

    def __init__(self) -> None:
        self._attempts: dict = {}  # job id -> the attempt the current write made for it (write_admissions)
        self._holders: set = set()  # the (queue, team, owner) that what the current write made holds quota in

    def backlog(self, *, queue_ids: Sequence[int] | None) -> scheduler.Backlog:
        queues = Queue.objects.order_by(CLASS_ORDER, "-priority", "id")
        if queue_ids is not None:
            queues = queues.filter(id__in=list(queue_ids))
        rules = _queue_rules(queues)
        if queue_ids is not None:
            rows = _pending_rows("AND queue_id = ANY(%s)", [[q.id for q in rules]])
        else:
            rows = _pending_rows()
        waiting: dict[int, list[scheduler.Waiting]] = defaultdict(list)
        for row in rows:
            waiting[row[1]].append(_row_waiting(row))
        for line in waiting.values():
            line.sort(key=_order)
        team_ids = {w.team_id for line in waiting.values() for w in line}
        return _with_use(rules, _team_rules(team_ids), dict(waiting), quota_use())

    def first_reason(self, job_id) -> tuple[str, str] | None:
        """What the next pass would first tell a job that just rejoined its line, as far as rules decide it
        (`first_reason_of`); reads the one job, its queue and its team."""
        rows = _pending_rows("AND id = %s", [job_id])
        if not rows:
            return None
        job = _row_waiting(rows[0])
        rules = _queue_rules(Queue.objects.filter(id=job.queue_id))
        if not rules:
            return None
        team = _team_rules({job.team_id}).get(job.team_id)
        return first_reason_of(job, rules[0], team) if team is not None else None

    def backlog_version(self) -> int:
        """Moves when a job leaves or re-enters a waiting line or changes its place (migration jobs/0008)."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT n FROM trainyard_backlog_version WHERE id = 1")
            row = cursor.fetchone()
        return row[0] if row else 0

    def horizon(self) -> int:
        """The oldest transaction still running (PostgreSQL's snapshot xmin): every job inserted by an older one is
        visible to a read from now on, so a pass that reads the lines after this never needs those again."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
            return cursor.fetchone()[0]

    def joined(self, *, known: set, since: int) -> list[scheduler.Waiting]:
        """The waiting jobs whose ids are not `known`, given that every waiting job inserted by a
        transaction older than `since` (a `horizon()` read before the last pass read the lines) is known or left
        its line (which moves the lines' version). Reads the waiting jobs of the transactions from `since` on
        (the `job_joined_waiting` index): the newcomers and the few known ones that committed during the last
        read, whatever the length of the lines. A submission that commits late is found like any other; one long
        transaction elsewhere only widens the read."""
        rows = _pending_rows("AND joined_xid >= %s", [since])
        return [_row_waiting(row) for row in rows if row[0] not in known]

    def with_use(
        self,
        queues: list[scheduler.QueueRules],
        teams: dict[int, scheduler.TeamRules],
        waiting: dict[int, list[scheduler.Waiting]],
    ) -> scheduler.Backlog:
        """These lines, with the quota in use read now (one aggregate over the quota-use log): what a pass that
        decides carried lines again needs from the database."""
        return _with_use(queues, teams, waiting, quota_use())

    def shapes(self) -> list[tuple[scheduler.Waiting, float]]:
        """Shapes of the jobs submitted in the workload window, with how many replicas asked for each."""
        since = timezone.now() - timedelta(hours=settings.TRAINYARD_WORKLOAD_WINDOW_H)
        rows = (
            Job.objects.filter(submitted_at__gte=since)
            .values(*SHAPE_FIELDS, "gpu_models")
            .annotate(n=Count("id"))
            .order_by()
        )
        out = []
        for r in rows:
            shape = scheduler.Waiting(
                id=None,
                queue_id=0,
                team_id=0,
                owner_id=0,
                replicas=r["replicas"],
                gpu_count=r["gpu_count"],
                gpu_milli=r["gpu_milli"],
                gpu_memory_mib=r["gpu_memory_mib"],
                gpu_memory_eighths=r["gpu_memory_eighths"] or 0,
                exclusive=r["exclusive"],
                cpu_milli=r["cpu_milli"],
                memory_mib=r["memory_mib"],
                total={},
                gpu_models=tuple(r["gpu_models"] or ()),
            )
            out.append((shape, float(r["n"] * r["replicas"])))
        return out

    def begin_write(self) -> None:
        self._attempts, self._holders = {}, set()

    def write_marks(self, plan: scheduler.Plan) -> None:
        for gpu_id, _uuid, why in plan.probe_failures:
            gpu_mark_suspect(gpu=GPU(pk=gpu_id, uuid=_uuid), reason=why)

    def write_admissions(self, admissions: list[scheduler.Admission], now, *, skip_locked: bool = False) -> set:
        """Write these admissions (attempts, slices, the jobs' new state, their events) in the caller's transaction;
        the ids of the jobs admitted: those still waiting. A batch written while the pass still decides
        (`skip_locked`, scheduler.dispatch.WriteAhead) passes over a job another transaction holds instead of waiting
        for it: its batches are not in id order, so waiting could deadlock with a writer that locks in id order."""
        if not admissions:
            return set()
        reclaim = defaultdict(list)
        for a in admissions:
            for s in a.slices:
                if s.reclaim:
                    reclaim[s.gpu_id].extend(s.reclaim)
        if reclaim:
            # Free what finished jobs left on a card before handing it out whole (right even for a job that turns
            # out to be no longer waiting: those slices' attempts have ended).
            LogicalDevice.objects.filter(
                pk__in=[d for ds in reclaim.values() for d in ds], released_at__isnull=True
            ).update(released_at=now, release_reason="reclaimed_for_exclusive")
            PoolRepair.objects.bulk_create(
                [
                    PoolRepair(
                        kind="reclaimed_stale_slices",
                        gpu_id=gpu_id,
                        detail=f"{len(ds)} stale slice(s) freed before an exclusive hand-out",
                    )
                    for gpu_id, ds in reclaim.items()
                ]
            )
        # The admissions go as a dozen flat arrays (each one text parameter: quoting thousands of values one by
        # one cost more than the rest of the batch's Python); the database locks the jobs still waiting and makes
        # the rows (ids, placements, messages, events) in one statement, so a pass of thousands spends its Python
        # time deciding, not formatting rows.
        slices = [(n, s) for n, a in enumerate(admissions, 1) for s in a.slices]
        params = {
            "jobs": _array(a.job.id for a in admissions),
            "nodes": _array(a.node_id for a in admissions),
            "of": _array(n for n, _s in slices),
            "gpus": _array(s.gpu_id for _n, s in slices),
            "compute": _array(s.compute_milli for _n, s in slices),
            "memory": _array(s.memory_mib for _n, s in slices),
            "exclusive": _array("t" if s.exclusive else "f" for _n, s in slices),
            "cpu": _array(s.cpu_milli for _n, s in slices),
            "host_memory": _array(s.host_memory_mib for _n, s in slices),
            "now": now,
            "backend": settings.TRAINYARD_BACKEND,
            "message": stored("admitted; placed on %(where)s", where="%s"),
            "admitted": JobState.ADMITTED,
            "pending": JobState.PENDING,
        }
        sql, defaults = _admissions_sql(skip_locked)
        with connection.cursor() as cursor:
            cursor.execute(sql, params | defaults)
            rows = cursor.fetchall()
        still = set()
        for n, attempt_id, queue_id, team_id, owner_id, preemptible in rows:
            job_id = admissions[n - 1].job.id
            still.add(job_id)
            self._attempts[job_id] = attempt_id
            if not preemptible:  # holds quota: what the quota check asks about (the row's own queue, team, owner)
                self._holders.add((queue_id, team_id, owner_id))
        return still

    def _written_attempts(self, admitted: set) -> list[int]:
        """The attempt ids the last write made for the jobs of `admitted`."""
        return [v for k, v in self._attempts.items() if k in admitted]

    def unusable(self, admitted: set) -> list[str]:
        """The cards and nodes that the admissions `admitted` (just written, not yet committed) were placed on and
        that placement may no longer use, read in this transaction; one sentence each, none when all still may."""
        attempts = self._written_attempts(admitted)
        if not attempts:
            return []
        with connection.cursor() as cursor:
            cursor.execute(UNUSABLE_SQL, [attempts])
            rows = cursor.fetchall()
        out = []
        for uuid, node, health, quarantined, state in sorted(set(rows)):
            if state != "ready":
                out.append(f"node {node} is {state}")
            else:
                out.append(f"card {uuid} on {node} is {'quarantined' if quarantined else health}")
        return out

    def over_quota(self, admitted: set) -> list[str]:
        """The queues, teams and users that the admissions `admitted` (just written, not yet committed) take past a
        limit, read from the rows in this transaction: what the pass decided from its own view is checked again
        by the database, so a stale view cannot over-admit a quota. One sentence each; none when all hold. For what
        this store's write made, the (queue, team, owner) its rows said when written are asked about (all of them:
        a key more only asks about a quota the transaction holds anyway); other jobs' are read from their rows (a
        pass of thousands sent thousands of ids where a handful of keys do)."""
        if not admitted:
            return []
        unknown = [str(j) for j in admitted if j not in self._attempts]
        if not self._holders and not unknown:
            return []  # nothing written holds quota (preemptible jobs)
        queues, teams, owners = (list(c) for c in zip(*self._holders, strict=True)) if self._holders else ([], [], [])
        sql = OVER_QUOTA_SQL.format(by_id=OVER_QUOTA_BY_ID if unknown else "")
        with connection.cursor() as cursor:
            cursor.execute(sql, {"jobs": unknown, "queues": queues, "teams": teams, "owners": owners})
            return [f"{kind} {name}: {detail}" for kind, name, detail in cursor.fetchall()]

    def record_waits(self, changed: list[scheduler.Wait]) -> None:
        if not changed:
            return
        updated = set(
            _update_rows(
                "UPDATE jobs_job AS j SET reason = v.reason, message = v.message "
                "FROM {rows} AS v(id, reason, message) "
                "WHERE j.id = v.id AND j.state = %s RETURNING j.id",
                [],
                [(w.job.id, w.code, w.message) for w in changed],
                ("uuid", "text", "text"),
                tail=[JobState.PENDING],
            )
        )
        now = timezone.now()
        _copy(
            JobEvent,
            [
                {
                    "job_id": w.job.id,
                    "kind": "waiting",
                    "actor": "dispatcher",
                    "message": w.message,
                    "data": json.dumps({"reason": w.code}),
                    "at": now,
                }
                for w in changed
                if w.job.reason != w.code and w.job.id in updated
            ],
        )
        told = [(str(w.job.id), w.code) for w in changed if w.job.reason != w.code and w.job.id in updated]
        if told:
            # A new reason without a new state: the job's open page refreshes its header (jobs/consumers.py).
            notices = [realtime.state_notice(j, "pending", reason=r) for j, r in told]
            transaction.on_commit(lambda: _tell_browsers(notices))

    def after_write(self, plan: scheduler.Plan, admitted: set) -> None:
        """After commit: start the admitted attempts and tell the browsers."""
        attempts = self._written_attempts(admitted)
        self._attempts, self._holders = {}, set()
        if attempts:
            starts_soon(attempts)
        if admitted:
            # Browsers learn of admissions a moment later, never at the cost of the next pass (not waited for).
            # Made one by one by the sending thread: thousands of them cost the pass ~20 ms to build here.
            _tell_browsers(realtime.state_notice(str(j), "admitted") for j in admitted)


_starts: SimpleQueue = SimpleQueue()
_starter: threading.Thread | None = None
_starter_lock = threading.Lock()


def starts_soon(attempts: list[int]) -> None:
    """Hand the admitted attempts to this process's start-message sender and return at once: publishing (about a
    millisecond a message, a second when the broker stalls, longer while it is down) is no part of the pass that
    admitted them, so the next pass does not wait for it. What a sender could not publish, or held when its
    process ended, is started by the lifecycle reconciler (TRAINYARD_START_OVERDUE_S); starting is idempotent."""
    global _starter
    _starts.put(list(attempts))
    with _starter_lock:
        if _starter is None or not _starter.is_alive():  # none yet, or this is a forked child
            _starter = threading.Thread(target=_send_starts, daemon=True, name="start-messages")
            _starter.start()


def _send_starts() -> None:
    from jobs.tasks import start_attempts

    while True:
        attempts = _starts.get()
        while not _starts.empty():  # what passes handed over meanwhile goes in the same messages
            attempts += _starts.get_nowait()
        # A message per batch: a pass may admit thousands.
        try:
            # The task's own app: a thread has no current app of its own and would fall back to Celery's default.
            with start_attempts.app.producer_or_acquire() as producer:
                where = settings.TRAINYARD_START_QUEUE or None
                for batch in start_batches(attempts):
                    start_attempts.apply_async((batch,), producer=producer, queue=where)
        except Exception:  # noqa: BLE001 - the reconciler starts them
            log.warning("start_messages_unsent", attempts=len(attempts))


def start_batches(attempts: list[int]) -> list[list[int]]:
    """The start messages of a pass: START_BATCH attempts each, larger when that would make more than
    START_MESSAGES (publishing costs about a millisecond a message; the worker's children share them out)."""
    size = max(START_BATCH, -(-len(attempts) // START_MESSAGES))
    return [attempts[k : k + size] for k in range(0, len(attempts), size)]


def reason_at_once(job: Job, *, actor: str) -> None:
    """Give a job that just (re)joined its line the reason the dispatcher's rules give it, in the caller's
    transaction: its page and its queue's page then say the same from the first second, instead of "waiting for
    the dispatcher" until the next pass. The pass later confirms it or moves it on (only a change is written)."""
    why = JobStore().first_reason(job.id)
    if why is None:
        return
    code, message = why
    Job.objects.filter(pk=job.pk, state=JobState.PENDING).update(reason=code, message=message)
    job.reason, job.message = code, message
    JobEvent.objects.create(job=job, kind="waiting", actor=actor, message=message, data={"reason": code})


# A pass's admissions made into rows by the database, from one array per column (jobs/store.py write_admissions):
# the jobs still waiting locked in id order, as every writer of several jobs locks them (SKIP LOCKED for a batch
# written while the pass decides: scheduler.dispatch.WriteAhead), each attempt numbered after the job's last; then
# the attempts (their placement built from the cards' and nodes' rows, each slice with its id), the slices, the jobs'
# new state and message (the nodes' names sorted by code point, as Python sorts them), and one event each. The
# slices of admission n carry `of` = n. Ids come from the tables' own sequences, in the order the pass decided (a
# volatile output is computed after the ORDER BY sort): preemption takes the youngest attempts first, by time then
# id, and every attempt of one write has the same time; whatever the join, the ids must follow the line.
ADMISSIONS_SQL = """
WITH locked AS MATERIALIZED (
    SELECT j.id, coalesce((SELECT max(t.number) FROM jobs_attempt t WHERE t.job_id = j.id), 0) AS number
    FROM jobs_job j WHERE j.id = ANY(%(jobs)s::uuid[]) AND j.state = %(pending)s ORDER BY j.id FOR UPDATE OF j{skip}
),
adm AS MATERIALIZED (
    SELECT a.job_id, locked.number + 1 AS number, a.node_id, a.n,
           nextval(pg_get_serial_sequence('jobs_attempt', 'id')) AS id
    FROM unnest(%(jobs)s::uuid[], %(nodes)s::bigint[]) WITH ORDINALITY AS a(job_id, node_id, n)
    JOIN locked ON locked.id = a.job_id
    ORDER BY a.n
),
sl AS MATERIALIZED (
    SELECT s.*, adm.id AS attempt_id, nextval(pg_get_serial_sequence('cluster_logicaldevice', 'id')) AS id
    FROM unnest(%(of)s::bigint[], %(gpus)s::bigint[], %(compute)s::int[], %(memory)s::bigint[], %(exclusive)s::bool[],
                %(cpu)s::int[], %(host_memory)s::bigint[])
         WITH ORDINALITY AS s(n, gpu_id, compute_milli, memory_mib, exclusive, cpu_milli, host_memory_mib, k)
    JOIN adm ON adm.n = s.n
    ORDER BY s.k
),
placed AS MATERIALIZED (
    SELECT x.attempt_id,
           jsonb_build_object('devices', jsonb_agg(jsonb_build_object(
               'gpu_uuid', x.uuid, 'gpu_index', x.index, 'node', x.node, 'model', x.model,
               'compute_milli', x.compute_milli, 'memory_mib', x.memory_mib, 'exclusive', x.exclusive,
               'slice_id', x.id) ORDER BY x.k)) AS placement,
           format(%(message)s, string_agg(DISTINCT x.node, ', ' ORDER BY x.node)) AS message
    FROM (
        SELECT sl.*, g.uuid, g.index, g.model, nd.name::text COLLATE "C" AS node
        FROM sl JOIN cluster_gpu g ON g.id = sl.gpu_id JOIN cluster_node nd ON nd.id = g.node_id
    ) AS x
    GROUP BY x.attempt_id
),
attempts AS (
    INSERT INTO jobs_attempt (id, job_id, number, backend, node_id, placement, created_at{attempt_columns})
    SELECT adm.id, adm.job_id, adm.number, %(backend)s, adm.node_id, placed.placement, %(now)s{attempt_values}
    FROM adm JOIN placed ON placed.attempt_id = adm.id
),
devices AS (
    INSERT INTO cluster_logicaldevice (id, gpu_id, attempt_id, compute_milli, memory_mib, exclusive, cpu_milli,
                                       host_memory_mib, created_at{device_columns})
    SELECT sl.id, sl.gpu_id, sl.attempt_id, sl.compute_milli, sl.memory_mib, sl.exclusive, sl.cpu_milli,
           sl.host_memory_mib, %(now)s{device_values}
    FROM sl
),
jobs AS (
    UPDATE jobs_job AS j SET state = %(admitted)s, admitted_at = %(now)s, reserved = true, message = placed.message
    FROM adm JOIN placed ON placed.attempt_id = adm.id WHERE j.id = adm.job_id
    RETURNING adm.n, adm.id, j.queue_id, j.team_id, j.owner_id, j.preemptible
),
events AS (
    INSERT INTO jobs_jobevent (job_id, attempt_id, kind, actor, from_state, to_state, message, data, at{event_columns})
    SELECT adm.job_id, adm.id, 'state', 'dispatcher', %(pending)s, %(admitted)s, placed.message, placed.placement,
           %(now)s{event_values}
    FROM adm JOIN placed ON placed.attempt_id = adm.id
)
SELECT * FROM jobs
"""


@lru_cache(maxsize=2)
def _admissions_sql(skip_locked: bool) -> tuple[str, dict]:
    """ADMISSIONS_SQL with every other column of the three tables set to its field's default (a parameter each), so a
    field added later cannot be silently left to the database; and those parameters."""
    parts, defaults = {}, {}
    for name, model, given in (
        ("attempt", Attempt, {"id", "job_id", "number", "backend", "node_id", "placement", "created_at"}),
        (
            "device",
            LogicalDevice,
            {
                "id",
                "gpu_id",
                "attempt_id",
                "compute_milli",
                "memory_mib",
                "exclusive",
                "cpu_milli",
                "host_memory_mib",
                "created_at",
            },
        ),
        (
            "event",
            JobEvent,
            {"id", "job_id", "attempt_id", "kind", "actor", "from_state", "to_state", "message", "data", "at"},
        ),
    ):
        columns, values = [], []
        for f in model._meta.concrete_fields:
            if f.attname in given:
                continue
            key = f"default_{name}_{f.attname}"
            defaults[key] = _default(f)
            columns.append(connection.ops.quote_name(f.column))
            values.append(f"%({key})s" + ("::jsonb" if f.get_internal_type() == "JSONField" else ""))
        parts[f"{name}_columns"] = "".join(f", {c}" for c in columns)
        parts[f"{name}_values"] = "".join(f", {v}" for v in values)
    return ADMISSIONS_SQL.format(skip=" SKIP LOCKED" if skip_locked else "", **parts), defaults


def _array(values) -> str:
    """A PostgreSQL array literal of plain values (numbers, uuids, t/f), for a text parameter cast to an array."""
    return "{" + ",".join(map(str, values)) + "}"


def _default(f):
    """A field's default as a query or COPY value (JSON as text)."""
    value = f.get_db_prep_save(f.get_default(), connection)
    if f.get_internal_type() == "JSONField":
        return json.dumps(value.obj if hasattr(value, "obj") else value)
    return value


def _copy(model, rows: list[dict]) -> None:
    """Insert rows with COPY. Columns a row leaves out get the field's default, prepared once per column; JSON
    values come as text. Every concrete column is written, so a field added later cannot be silently skipped."""
    if not rows:
        return
    fields = [f for f in model._meta.concrete_fields if not (f.primary_key and f.attname not in rows[0])]
    defaults = {f.attname: _default(f) for f in fields if f.attname not in rows[0]}
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    names = [f.attname for f in fields]
    with connection.cursor() as cursor:
        raw = cursor.cursor
        with raw.copy(f"COPY {model._meta.db_table} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row([row[n] if n in row else defaults[n] for n in names])


def _update_rows(sql: str, head: list, rows: list[tuple], types: Sequence[str], tail: list | None = None) -> list:
    """Run an UPDATE ... FROM {rows} with the rows passed as one array per column (`unnest`): one statement and a
    handful of parameters whatever the number of rows, so neither side spends time on a query of thousands of
    placeholders. Returns what RETURNING gave (if anything)."""
    if not rows:
        return []
    columns = [list(column) for column in zip(*rows, strict=True)]
    unnest = "unnest(" + ", ".join(f"%s::{t}[]" for t in types) + ")"
    with connection.cursor() as cursor:
        cursor.execute(sql.format(rows=unnest), [*head, *columns, *(tail or [])])
        return [r[0] for r in cursor.fetchall()] if cursor.description else []


def _tell_browsers(notices: Iterable[tuple[str, dict]]) -> None:
    """Hand a pass's notices to the process's sender without waiting (jobs/realtime.py)."""
    from jobs.realtime import send

    try:
        send(notices, wait=False)
    except Exception:  # noqa: BLE001 - a missing listener must never fail an admission or a pass
        log.warning("dispatch_notices_not_sent", notices=len(notices))


def dispatch(*, queue_ids: Sequence[int] | None = None, full: bool = False) -> scheduler.PassReport:
    """One dispatch pass over the given queues (all when None); `full` reads every waiting line even when only
    new jobs arrived since the last pass. A pass that leaves jobs waiting then asks preemptible attempts to yield
    the cards quota-holding jobs wait for (jobs/preemption.py); their release wakes the next pass."""
    with gctune.pass_collection_paused():
        report = scheduler.run_pass(store=JobStore(), queue_ids=queue_ids, full=full)
    if report.waiting and not report.skipped:
        from jobs.preemption import preemptions_request

        preemptions_request()
    # What the pass left alive leaves the collector's reach (in a worker process), when it kept new state.
    gctune.after_pass(kept=not report.fast or report.allocator_built or report.admitted >= KEEPS_STATE)
    return report


__all__ = ["JobStore", "dispatch", "policy"]
