"""The dispatch loop: one pass over every queue's waiting line against the pool in memory.

A pass (`run_pass`) reads what waits and what is used (the store: jobs/store.py, the only place that knows
the job tables), brings the pool in memory up to date (`scheduler.pool`), decides every admission in memory
(`plan`: hard quotas, FIFO or backfill, placement by the policy), and hands the decisions to the store: the
admissions in one transaction with bulk writes, the only thing done under the pool lock (a big pass writes them on
a second connection while it still decides: `WriteAhead`); then, in a second transaction without it, the reasons
that changed (places in a line are not stored). One pass runs at a time per
database (a session advisory lock); a pass asked for while one runs is queued once, never more
(`kernel.wake`). Level-triggered: a lost wake-up costs one beat period (30 s), never a stranded job.

The module imports nothing from `jobs`: the store comes in as an argument.
"""

from __future__ import annotations

import sys
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from queue import SimpleQueue
from typing import Protocol

import structlog
from django.conf import settings
from django.db import connection, transaction

from cluster.probes import planted_faults, planted_outcome, probe_card, probes_planted, remote_health
from cluster.services import pool_lock
from kernel import wake
from kernel.sentences import stored
from kernel.units import human_resource
from quotas.selectors import VECTOR_FIELDS, fits
from scheduler import policy
from scheduler.pool import Pool, current, overbooked

log = structlog.get_logger(__name__)

PASS_LOCK_KEY = 0x7472_6170  # session lock: one dispatch pass at a time


# Reason codes (the same strings as jobs.states.PendingReason; kept here so the scheduler needs nothing above).
QUEUE_CLOSED = "queue_closed"
QUEUE_QUOTA = "queue_quota_exhausted"
TEAM_QUOTA = "team_quota_exhausted"
TEAM_JOB_LIMIT = "team_job_limit"
USER_JOB_LIMIT = "user_job_limit"
NO_CAPACITY = "no_capacity"
IMAGE_INCOMPATIBLE = "image_incompatible_with_all_nodes"
GPU_MODEL_UNAVAILABLE = "gpu_model_unavailable"
BEHIND = "behind_earlier_job"
STORE_UNAVAILABLE = "waiting_for_object_store"

VECTOR = VECTOR_FIELDS


@dataclass(frozen=True)
class QueueRules:
    id: int
    name: str
    open: bool
    fifo: bool
    limit: dict[str, int]
    pools: tuple[str, ...] = ()  # node pools its jobs are placed in; empty: every pool (docs/pools.md)


@dataclass(frozen=True)
class TeamRules:
    id: int
    slug: str
    limit: dict[str, int]
    max_running_jobs: int
    max_jobs_per_user: int


@dataclass
class Waiting:
    """One pending job, as the scheduler needs it."""

    id: object
    queue_id: int
    team_id: int
    owner_id: int
    replicas: int
    gpu_count: int
    gpu_milli: int
    gpu_memory_mib: int
    gpu_memory_eighths: int
    exclusive: bool
    cpu_milli: int
    memory_mib: int
    total: dict[str, int]
    min_driver: str = ""
    excluded_gpus: tuple[str, ...] = ()
    excluded_nodes: tuple[str, ...] = ()
    gpu_models: tuple[str, ...] = ()
    reason: str = ""
    # Where it stands in its queue's line: (preemptible, -priority, submitted at in epoch seconds, id).
    order: tuple = ()
    preemptible: bool = False  # holds no quota; decided after every queue's quota-holding jobs (docs/pools.md)
    mig_profile: str = ""  # one MIG instance of this profile per replica (exclusive devices), docs/pools.md
    not_before: float = 0.0  # epoch seconds: a retry waiting out an outage is not admitted before (0: any time)

    def shape(self) -> tuple:
        """What placement depends on: jobs with the same shape fit or fail together within a pass. Kept once made
        (a waiting job's fields do not change; the lines carry the same objects from pass to pass)."""
        made = self.__dict__.get("_shape")
        if made is not None:
            return made
        made = self.__dict__["_shape"] = (
            self.replicas,
            self.gpu_count,
            self.gpu_milli,
            self.gpu_memory_mib,
            self.gpu_memory_eighths,
            self.exclusive,
            self.cpu_milli,
            self.memory_mib,
            self.min_driver,
            self.excluded_gpus,
            self.excluded_nodes,
            self.gpu_models,
            self.mig_profile,
        )
        return made


@dataclass
class Backlog:
    """What a pass reads: queues in dispatch order, their waiting lines in order, and what is in use."""

    queues: list[QueueRules]
    teams: dict[int, TeamRules]
    waiting: dict[int, list[Waiting]]
    queue_used: dict[int, dict[str, int]]
    team_used: dict[int, dict[str, int]]  # also "jobs": how many the team runs
    user_jobs: dict[tuple[int, int], int]  # (team, owner) -> running jobs


@dataclass
class Slice:
    """One device handed to an admitted job: which card, and what of it and of its node."""

    gpu_id: int
    gpu_uuid: str
    gpu_index: int
    node_id: int
    node: str
    model: str
    compute_milli: int
    memory_mib: int
    exclusive: bool
    cpu_milli: int
    host_memory_mib: int
    reclaim: tuple[int, ...] = ()  # slices of finished attempts to free before an exclusive hand-out


@dataclass
class Admission:
    job: Waiting
    slices: list[Slice]
    placements: list[policy.Placement]

    @property
    def node_id(self) -> int:
        return self.slices[0].node_id


@dataclass
class Wait:
    job: Waiting
    code: str
    message: str


@dataclass
class Line:
    """Where a queue's waiting line stands after a pass: what the next job in it would be told."""

    blocked: bool = False
    tail: tuple = ()  # order key of the last job left waiting in the line


@dataclass
class Plan:
    lines: dict[int, Line] = field(default_factory=dict)
    admissions: list[Admission] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)
    probe_failures: list[tuple[int, str, str]] = field(default_factory=list)  # (GPU id, uuid, why)
    dedicated: tuple[str, ...] | None = None  # TRAINYARD_DEDICATED_POOLS, read once a pass
    placement_calls: int = 0
    shape_hits: int = 0
    wake_at: float = 0.0  # the earliest not-before among the jobs held back (0: none): a full pass is due then
    health_asks: int = 0  # hand-out checks of cluster cards asked card by card in this pass
    fleet_health: dict | None = None  # every cluster card's, read once when a pass hands out more (REMOTE_ASKS)
    planted: dict[str, str] | None = None  # emulated cards' planted faults (cluster.probes), read once a pass
    requests: dict[tuple, policy.Request] = field(default_factory=dict)  # (shape, models) -> one replica's request

    def changes_pool(self) -> bool:
        """Whether writing this plan takes or marks GPUs: only that is written under the pool lock."""
        return bool(self.admissions or self.probe_failures)

    def changed_waits(self) -> list[Wait]:
        """The waiting jobs whose reason this pass changed; nobody else's row is written (a job's place in its line
        is not stored: `jobs.models.Job.queue_position` computes it when read)."""
        return [w for w in self.waits if w.job.reason != w.code]

    def changes_anything(self) -> bool:
        """Whether writing this plan would change a row: nothing to lock or write for a pass that only
        confirms every waiting job's reason."""
        return self.changes_pool() or bool(self.changed_waits())


class Store(Protocol):
    """Where the waiting jobs come from and where the decisions go (jobs/store.py)."""

    def backlog(self, *, queue_ids: Sequence[int] | None) -> Backlog: ...

    def backlog_version(self) -> int: ...

    def horizon(self) -> int: ...  # a mark read before the lines: what joined after it is found from it

    def joined(self, *, known: set, since: int) -> list[Waiting]: ...  # waiting jobs not known, from `since`

    # These lines, with these queues and teams, and the quota in use read now (a pass that re-decides carried lines)
    def with_use(self, queues: list[QueueRules], teams: dict[int, TeamRules], waiting: dict) -> Backlog: ...

    def shapes(self) -> list[tuple[Waiting, float]]: ...

    def begin_write(self) -> None: ...  # a write starts: forget what an earlier (refused) one wrote

    # Part of a write (WriteAhead): these admissions, in the caller's transaction; the ids of the jobs admitted
    def write_admissions(self, admissions: list[Admission], now, *, skip_locked: bool = False) -> set: ...

    def write_marks(self, plan: Plan) -> None: ...  # the cards whose hand-out probes failed (part of a write)

    def over_quota(self, admitted: set) -> list[str]: ...  # quotas the written admissions exceed (same transaction)

    def unusable(self, admitted: set) -> list[str]: ...  # cards, nodes the written admissions may no longer use (same)

    def record_waits(self, waits: list[Wait]) -> None: ...  # changed reasons, in a transaction of their own

    def after_write(self, plan: Plan, admitted: set) -> None: ...


# -------------------------------------------------------------------------------------------- decisions


def request_of(job: Waiting, models: frozenset[str] | None) -> policy.Request:
    """One replica of the job as a placement request."""
    if job.exclusive:
        return policy.Request.whole(job.gpu_count, cpu_milli=job.cpu_milli, memory_mib=job.memory_mib, gpu_model=models)
    return policy.Request.fraction(
        job.gpu_milli,
        cpu_milli=job.cpu_milli,
        memory_mib=job.memory_mib,
        gpu_memory_mib=0 if job.gpu_memory_eighths else job.gpu_memory_mib,
        gpu_memory_eighths=job.gpu_memory_eighths or 0,
        gpu_model=models,
    )


def quota_check(
    job: Waiting, queue: QueueRules, team: TeamRules, backlog: Backlog, used: dict[str, int]
) -> tuple[str, str] | None:
    """Why the queue's or the team's rules hold `job` back, as (code, sentence), or None when they allow it. The
    one place that says so: every pass asks it, and so does a submission for its first reason (jobs/store.py)."""
    if not queue.open:
        return QUEUE_CLOSED, stored("queue %(queue)s is closed", queue=queue.name)
    if job.preemptible:
        return None  # borrows idle capacity: no quota is held, so none is checked
    over = fits(job.total, used, queue.limit)
    if over:
        return QUEUE_QUOTA, (
            stored(
                "queue %(queue)s has %(free)s free; the job needs %(need)s",
                queue=queue.name,
                free=human_resource(over, queue.limit[over] - used[over]),
                need=human_resource(over, job.total[over]),
            )
        )
    tused = backlog.team_used.get(team.id)
    if tused is None:
        tused = backlog.team_used[team.id] = {**dict.fromkeys(VECTOR, 0), "jobs": 0}
    over = fits(job.total, tused, team.limit)
    if over:
        return TEAM_QUOTA, (
            stored(
                "team %(team)s has %(left)s left; the job needs %(need)s",
                team=team.slug,
                left=human_resource(over, team.limit[over] - tused[over]),
                need=human_resource(over, job.total[over]),
            )
        )
    if tused["jobs"] >= team.max_running_jobs:
        return TEAM_JOB_LIMIT, stored("team %(team)s already runs %(n)s jobs", team=team.slug, n=team.max_running_jobs)
    if backlog.user_jobs.get((team.id, job.owner_id), 0) >= team.max_jobs_per_user:
        return USER_JOB_LIMIT, stored(
            "you already run %(n)s jobs in %(team)s", n=team.max_jobs_per_user, team=team.slug
        )
    return None


def _charge(job: Waiting, queue: QueueRules, backlog: Backlog) -> None:
    if job.preemptible:
        return
    used = backlog.queue_used.get(queue.id)
    if used is None:
        used = backlog.queue_used[queue.id] = dict.fromkeys(VECTOR, 0)
    tused = backlog.team_used.get(job.team_id)
    if tused is None:
        tused = backlog.team_used[job.team_id] = {**dict.fromkeys(VECTOR, 0), "jobs": 0}
    for name in VECTOR:
        used[name] += job.total[name]
        tused[name] += job.total[name]
    tused["jobs"] += 1
    key = (job.team_id, job.owner_id)
    backlog.user_jobs[key] = backlog.user_jobs.get(key, 0) + 1


def _nvlink_indices(pool: Pool, i: int, placement: policy.Placement, count: int) -> tuple[int, ...]:
    """Whole cards on one node: keep them in one NVLink domain where the node labels domains."""
    labels = pool.meta[i].labels
    if not any(k.startswith("trainyard.io/nvlink-domain-gpu") for k in labels):
        return placement.gpu_indices
    free = [g.index for g in pool.nodes[i].gpus if g.eligible and g.fully_free]
    domains: dict[str, list[int]] = {}
    for index in free:
        domains.setdefault(labels.get(f"trainyard.io/nvlink-domain-gpu{index}", ""), []).append(index)
    for members in sorted(domains.values(), key=len):
        if len(members) >= count:
            return tuple(sorted(members)[:count])
    return placement.gpu_indices


def _slices(pool: Pool, job: Waiting, placement: policy.Placement) -> list[Slice]:
    i = placement.node_index
    meta = pool.meta[i]
    n = len(placement.gpu_indices)
    out = []
    for k, index in enumerate(placement.gpu_indices):
        card = meta.cards[index]
        # The replica's host CPU and memory, split over its devices (the first takes the remainder).
        cpu = job.cpu_milli // n + (job.cpu_milli % n if k == 0 else 0)
        mem = job.memory_mib // n + (job.memory_mib % n if k == 0 else 0)
        use = pool.usage.get(card.id)
        out.append(
            Slice(
                gpu_id=card.id,
                gpu_uuid=card.uuid,
                gpu_index=index,
                node_id=meta.id,
                node=meta.name,
                model=card.model,
                compute_milli=policy.FULL_MILLI if job.exclusive else placement.gpu_milli,
                memory_mib=card.memory_mib if job.exclusive else placement.gpu_memory_mib,
                exclusive=job.exclusive,
                cpu_milli=cpu,
                host_memory_mib=mem,
                reclaim=use.stale if (job.exclusive and use is not None) else (),
            )
        )
    return out


_UNMASKED = nullcontext()  # reusable: a job with nothing to mask places on the pool as it is

REMOTE_ASKS = 8  # hand-out checks a pass asks card by card; after these, one read of every card for the rest


def _first_failed_probe(pool: Pool, placement: policy.Placement, plan: Plan) -> int | None:
    meta = pool.meta[placement.node_index]
    if meta.backend != "local":
        # A cluster node's cards: what its dcgm-exporter says now (a fatal Xid the health loop has not seen yet).
        uuids = [meta.cards[index].uuid for index in placement.gpu_indices]
        if plan.fleet_health is not None:
            known = plan.fleet_health
        elif plan.health_asks < REMOTE_ASKS:
            plan.health_asks += 1
            known = remote_health(uuids)
            if not known:
                # Nothing known: the source did not answer (a timeout each time) or has no series for these
                # cards. The next hand-out reads every card once instead of asking again.
                plan.health_asks = REMOTE_ASKS
        else:
            # A pass handing out many cards reads every card's health once: thousands of admissions made one
            # Prometheus query each (seconds each when it does not answer). Fresh as of this placement.
            known = plan.fleet_health = remote_health(None)
        for index, uuid in zip(placement.gpu_indices, uuids, strict=True):
            outcome = known.get(uuid)
            if outcome is not None and not outcome.ok:
                plan.probe_failures.append((meta.cards[index].id, uuid, outcome.reason))
                return index
        return None
    faults = None
    if probes_planted(emulated=meta.emulated, backend=meta.backend):
        if plan.planted is None:
            plan.planted = planted_faults()  # read once a pass: thousands of hand-outs had read the file each
        faults = plan.planted
    for index in placement.gpu_indices:
        card = meta.cards[index]
        if faults is not None:
            result = planted_outcome(card.uuid, faults)
        else:
            result = probe_card(uuid=card.uuid, emulated=meta.emulated, backend=meta.backend)
        if result is not None and not result.ok:
            plan.probe_failures.append((card.id, card.uuid, result.reason))
            return index
    return None


def _no_capacity(job: Waiting) -> tuple[str, str]:
    if job.exclusive:
        return NO_CAPACITY, stored("%(n)s whole free GPU(s) on one node are not available", n=job.gpu_count)
    return NO_CAPACITY, stored("no GPU has the compute and memory free for this share")


def _place(
    job: Waiting, pool: Pool, plan: Plan, pools: tuple[str, ...] = ()
) -> list[tuple[policy.Placement, list[Slice]]] | tuple[str, str]:
    """Place every replica (all or nothing) in the given node pools (all when empty), or say why not."""
    models = None
    if job.gpu_models:
        models = pool.resolve_models(job.gpu_models)
        if not models:
            return GPU_MODEL_UNAVAILABLE, stored(
                "no GPU of model %(models)s is in the pool", models=" or ".join(job.gpu_models)
            )
    masked_nodes: list[int] = []
    if job.min_driver:
        masked_nodes = list(pool.too_old(job.min_driver))
        if masked_nodes and len(masked_nodes) == len(pool.meta):
            return IMAGE_INCOMPATIBLE, stored(
                "the image needs driver >= %(driver)s; no healthy node has it", driver=job.min_driver
            )
    masked_nodes += [pool.by_name[n] for n in job.excluded_nodes if n in pool.by_name]
    if plan.dedicated is None:
        plan.dedicated = tuple(sorted(settings.TRAINYARD_DEDICATED_POOLS))
    dedicated = plan.dedicated
    if pools or dedicated:
        outside = pool.outside(pools, borrowing=job.preemptible, dedicated=dedicated)
        if len(outside) == len(pool.meta):
            if not pools:
                return NO_CAPACITY, stored("every node is in a pool dedicated to other queues")
            return NO_CAPACITY, stored("no node is in pool %(pools)s", pools=" or ".join(pools))
        masked_nodes += outside
    masked_gpus = [pool.gpu_by_uuid[u] for u in job.excluded_gpus if u in pool.gpu_by_uuid]
    if job.mig_profile and not pool.mig.get(job.mig_profile):
        return NO_CAPACITY, stored("no card in MIG mode offers a %(profile)s instance", profile=job.mig_profile)
    if pool.mig:
        masked_gpus += pool.mig_masked(job.mig_profile)
    key = (job.shape(), models)
    request = plan.requests.get(key)
    if request is None:
        request = plan.requests[key] = request_of(job, models)
    done: list[tuple[policy.Placement, list[Slice]]] = []
    with pool.masked(nodes=masked_nodes, gpus=masked_gpus) if masked_nodes or masked_gpus else _UNMASKED:
        assert pool.allocator is not None
        rack: str | None = None
        for _replica in range(job.replicas):
            while True:
                plan.placement_calls += 1
                placement = None
                if rack is not None:
                    others = [i for i, m in enumerate(pool.meta) if m.rack != rack]
                    with pool.masked(nodes=others):
                        placement = pool.allocator.choose(request)
                if placement is None:
                    placement = pool.allocator.choose(request)
                if placement is None:
                    for p, s in reversed(done):
                        pool.give_back(p, s)
                    code, message = _why_not(job, pool, models)
                    if pools:
                        message = stored("%(why)s in pool %(pools)s", why=message, pools=" or ".join(pools))
                    return code, message
                if job.exclusive:
                    indices = _nvlink_indices(pool, placement.node_index, placement, job.gpu_count)
                    if indices != placement.gpu_indices:
                        placement = replace(placement, gpu_indices=indices)
                failed = _first_failed_probe(pool, placement, plan)
                if failed is None:
                    break
                pool.mark_unusable(placement.node_index, failed)
            slices = _slices(pool, job, placement)
            pool.take(placement, slices)
            done.append((placement, slices))
            if job.replicas > 1 and rack is None:
                rack = pool.meta[placement.node_index].rack
    return done


def place(
    job: Waiting, pool: Pool, pools: tuple[str, ...] = ()
) -> list[tuple[policy.Placement, list[Slice]]] | tuple[str, str]:
    """Place a job in `pool` (taken there, in memory only) or say why not: what preemption asks of a what-if pool."""
    return _place(job, pool, Plan(), pools=pools)


def _why_not(job: Waiting, pool: Pool, models: frozenset[str] | None) -> tuple[str, str]:
    if job.excluded_nodes or job.excluded_gpus:
        ready = [
            (i, c)
            for i, m in enumerate(pool.meta)
            if m.ready and m.name not in job.excluded_nodes
            for c in m.cards.values()
            if c.healthy and c.uuid not in job.excluded_gpus
        ]
        any_ready, nodes, ready_models = bool(ready), {i for i, _ in ready}, {c.model for _, c in ready}
    else:
        any_ready, nodes, ready_models = pool.ready_summary()
    if not any_ready:
        return NO_CAPACITY, stored("no healthy GPU is available")
    if job.min_driver:
        old = set(pool.too_old(job.min_driver))
        if all(i in old for i in nodes):
            return IMAGE_INCOMPATIBLE, stored(
                "the image needs driver >= %(driver)s; no healthy node has it", driver=job.min_driver
            )
    if models is not None and not (models & ready_models):
        return GPU_MODEL_UNAVAILABLE, stored(
            "no healthy GPU of model %(models)s is ready", models=" or ".join(sorted(models))
        )
    if job.gpu_count >= 1:
        refused = policy.SHARES_ONLY if job.exclusive else policy.WHOLE_ONLY
        if all(pool.nodes[i].sharing == refused for i in nodes):
            if job.exclusive:
                return NO_CAPACITY, stored("no ready node hands out whole GPUs (every ready node is time-sliced)")
            return NO_CAPACITY, stored("no ready node hands out shares of a GPU (none is time-sliced)")
    code, message = _no_capacity(job)
    if models is not None:
        message = stored("%(why)s among %(models)s", why=message, models=" / ".join(sorted(models)))
    return code, message


def plan(backlog: Backlog, pool: Pool, lines: dict[int, Line] | None = None, ahead: WriteAhead | None = None) -> Plan:
    """Every decision of one pass, in memory; the pool in memory already holds the admissions it makes.
    `lines`: where each queue's line stood after the previous pass, when only jobs that join the lines' ends
    are given (the fast pass); the lines are not changed. Preemptible jobs (last in their lines) are decided
    after every queue's other jobs, so borrowed capacity never goes to them before quota-holding work.
    `ahead`: given the admissions in batches as they are decided, to write them meanwhile (`WriteAhead`)."""
    out = Plan()
    state: dict[int, Line] = {}
    deferred: list[tuple[QueueRules, Waiting]] = []
    batch = ahead.batch if ahead is not None else 0
    handed = waited = 0
    for queue in backlog.queues:
        start = (lines or {}).get(queue.id) or Line()
        state[queue.id] = Line(start.blocked, start.tail)
        for job in backlog.waiting.get(queue.id, ()):
            if job.preemptible:
                deferred.append((queue, job))
                continue
            _decide(job, queue, state[queue.id], backlog, pool, out)
            if batch and _batch_due(ahead, out, handed, waited):
                ahead.hand(out.admissions[handed:], out.waits[waited:])
                handed, waited = len(out.admissions), len(out.waits)
    for queue, job in deferred:
        _decide(job, queue, state[queue.id], backlog, pool, out)
        if batch and _batch_due(ahead, out, handed, waited):
            ahead.hand(out.admissions[handed:], out.waits[waited:])
            handed, waited = len(out.admissions), len(out.waits)
    if ahead is not None and ahead.started:
        ahead.hand(out.admissions[handed:], out.waits[waited:])
    out.lines.update(state)
    return out


def _batch_due(ahead: WriteAhead, out: Plan, handed: int, waited: int) -> bool:
    """A batch of admissions is decided, or, once the writer runs, a batch of jobs left waiting (their reasons are
    written beside; a full cluster's last thousand decisions are mostly waits, which otherwise all fell to the
    write's tail)."""
    return len(out.admissions) - handed >= ahead.batch or (ahead.started and len(out.waits) - waited >= ahead.batch)


def _decide(job: Waiting, queue: QueueRules, line: Line, backlog: Backlog, pool: Pool, out: Plan) -> None:
    """Admit one job (placed, charged) or record why it waits and where it stands in its line."""
    failed_shapes = pool.failed  # shared by the queues, and kept across passes while capacity only shrank
    if job.not_before and job.not_before > time.time():
        # Held back until its not-before (an outage it waits out): it keeps its place and blocks nobody behind it.
        out.waits.append(Wait(job, STORE_UNAVAILABLE, stored("waiting for the object store")))
        out.wake_at = min(out.wake_at or job.not_before, job.not_before)
        return
    used = backlog.queue_used.get(queue.id)
    if used is None:
        used = backlog.queue_used[queue.id] = dict.fromkeys(VECTOR, 0)
    team = backlog.teams[job.team_id]
    why = quota_check(job, queue, team, backlog, used)
    if why is None and line.blocked and queue.fifo:
        why = (BEHIND, stored("waiting behind an earlier job (strict FIFO)"))
    placed = None
    if why is None:
        shape = (job.shape(), queue.pools, job.preemptible)
        hit = failed_shapes.get(shape)
        if hit is not None:
            why = hit[0]
            out.shape_hits += 1
        else:
            result = _place(job, pool, out, pools=queue.pools)
            if isinstance(result, tuple):
                why = result
                failed_shapes[shape] = (result, request_of(job, None))
            else:
                placed = result
    if why is not None:
        if why[0] != QUEUE_CLOSED:
            line.blocked = True
        out.waits.append(Wait(job, why[0], why[1]))
        line.tail = max(line.tail, job.order) if line.tail else job.order
        return
    assert placed is not None
    out.admissions.append(Admission(job, [s for _, slices in placed for s in slices], [p for p, _ in placed]))
    _charge(job, queue, backlog)


# ----------------------------------------------------------------------------------------------- the pass


@dataclass
class PassReport:
    admitted: int = 0
    waiting: int = 0
    skipped: bool = False  # another pass held the lock; one more was queued
    fast: bool = False  # only jobs that joined the ends of the lines were decided
    resumed: int = 0  # in a fast pass, carried jobs decided again behind a newcomer that went ahead of them
    redecided: bool = False  # every carried line decided again (after a release or a jump): no line was read
    read_s: float = 0.0
    decide_s: float = 0.0
    decide_cpu_s: float = 0.0  # the deciding thread's CPU time: well under decide_s when it waited for a core
    write_s: float = 0.0  # the pool lock is held for this long, no longer
    starts_s: float = 0.0  # after commit: publishing the admitted attempts' starts
    waits_s: float = 0.0  # writing changed reasons, after the pool lock is released (in write_s when written ahead)
    total_s: float = 0.0
    cpu_s: float = 0.0  # the process's CPU time over the pass (every thread: the writer ahead, the starts)
    placement_calls: int = 0
    shape_hits: int = 0
    refused: int = 0  # writes the database refused as over-booked (a stale view); each pass re-read and retried
    sync_s: float = 0.0  # bringing the pool up to date (part of read_s): the ledger, the workload, a new allocator
    allocator_built: bool = False  # this pass built a new allocator (a new workload or pool structure)
    written_ahead: bool = False  # its admissions were written while it decided (WriteAhead): write_s is the wait after
    lock_s: float = 0.0  # how long the pool lock was held: write_s, or from the first batch written ahead to the commit


_workload: tuple[float, tuple, policy.Workload] | None = None


def workload(store: Store, pool: Pool) -> policy.Workload:
    """The request mix the policy keeps room for: the shapes of recent jobs (TRAINYARD_WORKLOAD_WINDOW_H), re-read
    at most every TRAINYARD_WORKLOAD_REFRESH_S, and the same object while the mix and the pool's models stay."""
    global _workload
    now = time.monotonic()
    fresh = _workload is not None and now - _workload[0] <= settings.TRAINYARD_WORKLOAD_REFRESH_S
    if fresh and _workload[1][1] == pool.models:
        return _workload[2]
    rows = store.shapes()
    key = (tuple(sorted((repr(w.shape()), n) for w, n in rows)), pool.models)
    if _workload is not None and _workload[1] == key:
        _workload = (now, key, _workload[2])
        return _workload[2]
    weights: dict[policy.Request, float] = {}
    for shape, n in rows:
        models = pool.resolve_models(shape.gpu_models) if shape.gpu_models else None
        if shape.gpu_models and not models:
            continue
        request = request_of(shape, models)
        weights[request] = weights.get(request, 0.0) + n
    if not weights:
        weights = {policy.Request.fraction(250): 1.0, policy.Request.whole(1): 1.0}
    _workload = (now, key, policy.Workload(weights))
    return _workload[2]


def reset() -> None:
    """Forget the process's pool and workload (tests, and after the schema changes under a running process)."""
    global _workload, _carry, _last_full
    _workload = None
    _carry = None
    _last_full = None
    current().invalidate()


def _try_pass_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [PASS_LOCK_KEY])
        return bool(cursor.fetchone()[0])


def _pass_unlock() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s)", [PASS_LOCK_KEY])


@dataclass
class Carry:
    """What a pass over every queue leaves for the next: enough to decide for newly arrived jobs alone while
    nothing else changed (no slice released, no quota or queue edited, no waiting job gone), and, while no waiting
    job left its line, enough to decide every line again without reading one (after a release, or a newcomer that
    goes ahead of a waiting job)."""

    key: tuple  # (pool structure, pool ledger, reference rows, waiting lines) version numbers
    backlog: Backlog  # queues, teams and the quota in use after the pass
    lines: dict[int, Line]
    known: set  # ids of the jobs left waiting (as the store gives them: hashing a UUID is cheaper than its text)
    since: int  # the store's horizon read before the lines: every job that joined before it is known
    wake_at: float = 0.0  # when a job held back by its not-before may go: the carry is stale from then on
    waiting: dict[int, list[Waiting]] = field(default_factory=dict)  # the jobs left waiting, per queue, in order


_carry: Carry | None = None
_last_full: float | None = None  # time.monotonic() when this process last read every waiting line


def full_pass_due() -> bool:
    """Whether beat's pass should read every line although the carry may say only newcomers changed: when this
    process has not read them all for TRAINYARD_FULL_PASS_EVERY_S. Between such passes the version numbers (kept by
    the database's triggers) are trusted; the periodic full read bounds what a change they missed could cost."""
    return _last_full is None or time.monotonic() - _last_full >= settings.TRAINYARD_FULL_PASS_EVERY_S


def _reference_version() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT n FROM trainyard_reference_version WHERE id = 1")
        row = cursor.fetchone()
    return row[0] if row else 0


def _carried_backlog(store: Store, versions: tuple[int, int]) -> tuple[Backlog, bool, Carry, int] | None:
    """A backlog built on the last pass's carry instead of reading every line, whether every line must be decided
    again, the carry to decide it on, and how many carried jobs it gives again behind a newcomer. While nothing but
    newcomers changed, only they are given (the waiting jobs ahead of them would be told exactly what they were
    told). A newcomer that goes ahead of a waiting job (two submissions that committed in the other order than they
    were stamped) is given with the carried jobs behind it in its line, to be decided again from where the line
    stood before them (`_resumed`): what those behind it are told may change, nothing ahead of it can. When the
    ledger moved (a slice released, a card marked) a job held back may go: the carried lines are given whole, with
    the newcomers in their places and the quota in use read again; the waiting rows themselves did not change (the
    lines' version did not move), so reading them again would read what the carry holds. None when anything else
    changed (a job left its line, an edit, a new structure): then every line is read."""
    carry = _carry
    if carry is None:
        return None
    structure, ledger = Pool.read_versions()
    if (structure, *versions) != (carry.key[0], *carry.key[2:]):
        return None
    again = ledger != carry.key[1] or bool(carry.wake_at and time.time() >= carry.wake_at)
    joined = store.joined(known=carry.known, since=carry.since)
    queues = {q.id for q in carry.backlog.queues}
    jumps: dict[int, tuple] = {}  # queue -> the order of the first newcomer that goes ahead of a waiting job
    for job in joined:
        if job.queue_id not in queues or job.team_id not in carry.backlog.teams:
            return None
        line = carry.lines.get(job.queue_id)
        if line is not None and line.tail and job.order <= line.tail:
            jumps[job.queue_id] = min(jumps.get(job.queue_id, job.order), job.order)
    b = carry.backlog
    if again:
        waiting = {q: list(jobs) for q, jobs in carry.waiting.items()}
    else:
        carry, waiting = _resumed(carry, jumps) if jumps else (carry, {})
    resumed = 0 if again else sum(len(jobs) for jobs in waiting.values())
    for job in joined:
        waiting.setdefault(job.queue_id, []).append(job)
    for queue_id in {job.queue_id for job in joined}:
        waiting[queue_id].sort(key=_line_order)
    if again:
        return store.with_use(b.queues, b.teams, waiting), True, carry, resumed
    return Backlog(b.queues, b.teams, waiting, b.queue_used, b.team_used, b.user_jobs), False, carry, resumed


def _resumed(carry: Carry, jumps: dict[int, tuple]) -> tuple[Carry, dict[int, list[Waiting]]]:
    """The carry with each jumped line cut where its first newcomer goes, and the carried jobs behind that point,
    per queue, to be decided again; the line starts from where it stood before them. A strict FIFO
    line stood blocked there when a job ahead waited for anything but its closed queue or its not-before (what
    `_decide` blocks on); its tail is the last job ahead. Jobs left waiting do not charge quota or hold capacity,
    so the quota in use and the pool are what the jobs ahead left either way."""
    lines, kept, redo = dict(carry.lines), dict(carry.waiting), {}
    for queue_id, first in jumps.items():
        line = carry.waiting.get(queue_id, [])
        cut = bisect_left(line, first, key=_line_order)
        ahead = line[:cut]
        kept[queue_id], redo[queue_id] = ahead, line[cut:]
        blocked = any(job.reason not in (QUEUE_CLOSED, STORE_UNAVAILABLE) for job in ahead)
        lines[queue_id] = Line(blocked, ahead[-1].order if ahead else ())
    return replace(carry, lines=lines, waiting=kept), redo


def _line_order(job: Waiting) -> tuple:
    return job.order


def _left_waiting(waits: list[Wait], carry: Carry | None) -> dict[int, list[Waiting]]:
    """The jobs a pass left waiting, per queue in line order: its waits, after the carried ones for a fast pass
    (whose newcomers joined the ends of the lines, or were decided with the carried jobs behind them: `_resumed`
    kept only the jobs ahead)."""
    out = {q: list(jobs) for q, jobs in carry.waiting.items()} if carry is not None else {}
    for w in waits:
        out.setdefault(w.job.queue_id, []).append(w.job)
    return out


def run_pass(
    *, store: Store, queue_ids: Sequence[int] | None = None, pool: Pool | None = None, full: bool = False
) -> PassReport:
    """One pass: read, decide in memory, write in one transaction. Returns what it did and how long each took.

    A pass over every queue that finds nothing changed but new jobs at the ends of the lines decides for those
    alone (`fast`); after a release or a line jump it decides the carried lines again without reading them
    (`redecided`); the beat's pass (`full`) and any pass after an edit or a waiting job leaving read every line."""
    global _carry, _last_full
    report = PassReport()
    t0, c0 = time.perf_counter(), time.process_time()
    if not _try_pass_lock():
        report.skipped = True
        wake.dispatch_soon()
        return report
    pool = pool or current()
    try:
        # Read before the lines, so that a change made while this pass runs is seen by the next one.
        versions = (_reference_version(), store.backlog_version())
        horizon = store.horizon()
        backlog = resumed = None
        if queue_ids is None and not full and (carried := _carried_backlog(store, versions)) is not None:
            backlog, report.redecided, resumed, report.resumed = carried
            report.fast = not report.redecided
        # Taken, not shared: a pass that fails leaves none (its charges in the carried quota were not written).
        carry, _carry = (resumed if report.fast else None), None
        if backlog is None:
            backlog = store.backlog(queue_ids=queue_ids)
            if queue_ids is None:
                _last_full = time.monotonic()
        if not any(backlog.waiting.values()):
            if report.fast:
                _carry = carry  # nothing joined: nothing changed
            elif queue_ids is None:
                _carry = Carry((*Pool.read_versions(), *versions), backlog, {}, set(), horizon)
            report.total_s = time.perf_counter() - t0
            return report
        for attempt in range(1, WRITE_TRIES + 1):
            try:
                decided, dropped, lines_before, lines_after = _decide_and_write(
                    store, pool, backlog, carry, versions, report, t0
                )
                break
            except StaleView as stale:
                # Another process changed the pool between our read and our write: nothing was written; read
                # everything again (the carry and the quota in use too) and decide afresh.
                pool.invalidate()
                _carry = carry = None
                report.refused += 1
                log.warning(
                    "dispatch_write_refused", attempt=attempt, problems=stale.problems[:5], count=len(stale.problems)
                )
                if attempt == WRITE_TRIES:
                    raise
                report.fast = report.redecided = False
                versions = (_reference_version(), store.backlog_version())
                backlog = store.backlog(queue_ids=queue_ids)
        changed = decided.changed_waits()
        if changed:
            if not report.written_ahead:  # written ahead: the reasons went with the batches, in the write
                # Reasons need no pool lock (this pass's lock keeps other passes out) and do not move the
                # lines' version (jobs/0008): a job that left its line meanwhile is simply not written.
                t3 = time.perf_counter()
                with transaction.atomic(durable=True):
                    store.record_waits(changed)
                report.waits_s = time.perf_counter() - t3
            for w in changed:  # what the rows now say, for a later pass that decides these jobs again
                w.job.reason = w.code
        if queue_ids is None and not dropped:
            # A ledger left unknown (someone released a slice while we wrote: pool.wrote) keys the carry with None:
            # the next pass then decides the carried lines again on a re-read ledger; they themselves still hold.
            known = {w.job.id for w in decided.waits}
            if carry is not None:
                known |= carry.known
            lines_version = versions[1]
            if decided.changes_pool():
                # Our own admissions moved the lines' number; anyone else's change in between makes it stale.
                lines_version = lines_after if lines_before == versions[1] else None
            key = (pool.structure_version, pool.ledger_version, versions[0], lines_version)
            wake_at = min(filter(None, (decided.wake_at, carry.wake_at if carry is not None else 0.0)), default=0.0)
            carried = Carry(key, backlog, decided.lines, known, horizon, wake_at, _left_waiting(decided.waits, carry))
            _carry = carried if lines_version is not None else None
        else:
            _carry = None
    finally:
        _pass_unlock()
    report.total_s = time.perf_counter() - t0
    report.cpu_s = time.process_time() - c0
    # A pass that read or re-decided every line is logged too (after a release, an edit, beat's full read): what a
    # backlog costs shows there, and so does one that decided jobs behind a newcomer again. The fast passes that
    # admit nothing (a newcomer that must wait) are too many to log.
    if report.admitted or not report.fast or report.resumed or report.total_s > 1.0:
        log.info(
            "dispatch_pass",
            admitted=report.admitted,
            waiting=report.waiting,
            fast=report.fast,
            redecided=report.redecided,
            resumed=report.resumed,
            placement_calls=report.placement_calls,
            shape_hits=report.shape_hits,
            total_ms=round(report.total_s * 1000, 1),
            cpu_ms=round(report.cpu_s * 1000, 1),
            read_ms=round(report.read_s * 1000, 1),
            sync_ms=round(report.sync_s * 1000, 1),
            allocator_built=report.allocator_built,
            decide_ms=round(report.decide_s * 1000, 1),
            decide_cpu_ms=round(report.decide_cpu_s * 1000, 1),
            write_ms=round(report.write_s * 1000, 1),
            written_ahead=report.written_ahead,
            lock_ms=round(report.lock_s * 1000, 1),
            starts_ms=round(report.starts_s * 1000, 1),
            waits_ms=round(report.waits_s * 1000, 1),
        )
    return report


class StaleView(Exception):
    """A pass's write would book a card, a node or a quota past what it holds, or place on a card or a node that
    placement may no longer use: its view was stale."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems[:3]))
        self.problems = problems


WRITE_TRIES = 3  # a pass refused this often in a row raises: something other than a race is wrong
SWITCH_INTERVAL_S = 0.0005  # the interpreter's switch interval while a pass writes ahead (default 0.005)


class WriteAhead:
    """Writes a big pass's admissions on a database connection of its own while the pass still decides.

    The pass hands over each batch of TRAINYARD_DISPATCH_WRITE_AHEAD admissions as soon as it is decided, with the
    jobs it decided to leave waiting since the batch before; the first batch starts a thread that runs the pass's
    write (`_write`, the same one transaction a smaller pass writes in one batch) on those batches as they come,
    and, once the pass has decided everything (`finish`), its closing checks and the commit. The database does the
    write's work on its own core while this one decides, and nothing is committed unless all of it holds: a
    refusal (StaleView) or a failure while deciding (`abandon`) leaves nothing behind. A pass that decides fewer
    admissions than a batch never starts the thread. Deciding reads and writes no row (placement is in memory;
    probes ask the cards and their exporters), so the deciding thread never waits for a lock the writer holds;
    code added to the deciding must keep it so."""

    def __init__(self, store: Store, pool: Pool, batch: int):
        self.store, self.pool, self.batch = store, pool, batch
        self.started = False
        self._inbox: SimpleQueue = SimpleQueue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._result: tuple | None = None
        self._switch = 0.0

    @classmethod
    def for_pass(cls, store: Store, pool: Pool) -> WriteAhead | None:
        """One for this pass, or None: turned off (0), or the pass runs inside a caller's transaction (tests, a
        caller's atomic block), whose rows a second connection could not see."""
        batch = settings.TRAINYARD_DISPATCH_WRITE_AHEAD
        if batch <= 0 or connection.in_atomic_block:
            return None
        return cls(store, pool, batch)

    def hand(self, admissions: list[Admission], waits: list[Wait]) -> None:
        """Write these admissions, and the reasons of these waiting jobs that changed, in the write's transaction."""
        if not self.started:
            self.started = True
            # The writer wakes from the database hundreds of times a pass and each time needs the interpreter back
            # from the deciding thread: at the default 5 ms switch interval it waits most of the pass for it.
            self._switch = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_INTERVAL_S)
            self._thread = threading.Thread(target=self._run, daemon=True, name="dispatch-write-ahead")
            self._thread.start()
        self._inbox.put((admissions, waits))

    def _join(self) -> None:
        assert self._thread is not None
        self._thread.join()
        sys.setswitchinterval(self._switch)

    def finish(self, decided: Plan) -> tuple:
        """Wait for the write of everything handed over, checked and committed: what `_write` returns. Raises what
        the write raised (StaleView: nothing was written)."""
        self._inbox.put(decided)
        self._join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def abandon(self) -> None:
        """The pass failed while deciding: roll back what was written."""
        if self._thread is not None:
            self._inbox.put(None)
            self._join()

    def _items(self) -> Iterator[tuple[list[Admission], list[Wait]] | Plan]:
        """What the pass hands over, as it comes: batches, then the plan (None: the pass failed while deciding)."""
        while True:
            item = self._inbox.get()
            if item is None:
                raise _Abandoned()
            yield item
            if isinstance(item, Plan):
                return

    def _run(self) -> None:
        try:
            self._result = _write(self.store, self.pool, self._items(), ahead=True, caught_up=self._inbox.empty)
        except BaseException as exc:  # noqa: BLE001 - handed to the pass, which raises it (finish)
            self._error = exc
        finally:
            connection.close()


class _Abandoned(Exception):
    """The pass stopped deciding: the write-ahead's transaction rolls back."""


def _overbooked_by(pool: Pool, written: list[Admission]) -> list[str]:
    nodes = {s.node_id for a in written for s in a.slices}
    host = {m.id for m in pool.meta if m.host_accounted and m.id in nodes}
    return overbooked(node_ids=nodes, host_node_ids=host)


def _write(
    store: Store, pool: Pool, items: Iterable, *, ahead: bool, caught_up: Callable[[], bool] = lambda: True
) -> tuple:
    """A pass's write, in one transaction under the pool lock: each (admissions, waits) batch of `items`, with the
    changed reasons among its waits; what was written is checked against the ledger whenever the write has caught
    up with `items` (`caught_up()`: nothing else queued) and at the end (while the pool lock is held only this
    transaction adds slices, so what passed stays passed; a writer behind the pass checks several batches in one
    query instead of spending one on each); then, at the plan that ends `items`, the cards whose probes failed,
    and the quotas and the cards' and nodes' state checked for all it wrote (StaleView when a check fails: nothing
    is written). `ahead`: written while the pass still decides (WriteAhead): foreign keys checked per statement
    rather than all at the commit, and a job row another transaction holds passed over (its batches are not in id
    order, so waiting could deadlock with a writer that locks in id order). Returns (admitted, the pool's numbers
    before and after, the lines' numbers before and after, how long the pool lock was held)."""
    from django.utils import timezone

    with transaction.atomic(durable=True):
        if ahead:
            with connection.cursor() as cursor:
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        pool_lock()
        locked = time.perf_counter()
        before = pool.read_versions(hold_ledger=True)  # held to the commit: `after` is ours alone
        lines_before = store.backlog_version()
        store.begin_write()
        admitted: set = set()
        decided = None
        unchecked: list[Admission] = []
        for item in items:
            if isinstance(item, Plan):
                decided = item
                break
            batch, waits = item
            written = store.write_admissions(batch, timezone.now(), skip_locked=ahead)
            admitted |= written
            unchecked += [a for a in batch if a.job.id in written] if written else []
            if unchecked and caught_up():
                problems, unchecked = _overbooked_by(pool, unchecked), []
                if problems:
                    raise StaleView(problems)
            changed = [w for w in waits if w.job.reason != w.code]
            if changed:
                # Written with the admissions while the pass waits for them anyway: written after the commit, they
                # ran beside the start messages and the browsers' notices of thousands of admissions.
                store.record_waits(changed)
        assert decided is not None
        store.write_marks(decided)
        after = pool.read_versions()
        problems = (_overbooked_by(pool, unchecked) if unchecked else []) + store.over_quota(admitted)
        if after[0] != pool.structure_version:
            # A card or a node changed since the pool was read (a card marked unhealthy, a node cordoned): the
            # slices just written must still be on ones placement may use.
            problems += store.unusable(admitted)
        if problems:
            raise StaleView(problems)
        lines_after = store.backlog_version()
    return admitted, before, after, lines_before, lines_after, time.perf_counter() - locked


def _decide_and_write(store: Store, pool: Pool, backlog: Backlog, carry, versions, report: PassReport, t0: float):
    """Bring the pool up to date, decide, and write the admissions under the pool lock, checked by the database
    before commit (StaleView when the check fails; nothing is written then)."""
    built_before, synced = pool.allocator, time.perf_counter()
    pool.sync(lambda p: workload(store, p))
    t1 = time.perf_counter()
    report.sync_s = t1 - synced
    report.allocator_built = pool.allocator is not built_before
    report.read_s = t1 - t0
    ahead = WriteAhead.for_pass(store, pool)
    c1 = time.thread_time()
    try:
        decided = plan(backlog, pool, lines=carry.lines if carry is not None else None, ahead=ahead)
    except BaseException:
        if ahead is not None:
            ahead.abandon()
        raise
    t2 = time.perf_counter()
    report.decide_s = t2 - t1
    report.decide_cpu_s = time.thread_time() - c1
    report.waiting = len(decided.waits)
    report.placement_calls = decided.placement_calls
    report.shape_hits = decided.shape_hits
    report.written_ahead = ahead is not None and ahead.started
    dropped: list[Admission] = []
    lines_before = lines_after = versions[1]
    if decided.changes_pool():
        try:
            if ahead is not None and ahead.started:
                admitted, before, after, lines_before, lines_after, held = ahead.finish(decided)
            else:
                admitted, before, after, lines_before, lines_after, held = _write(
                    store, pool, [(decided.admissions, []), decided], ahead=False
                )
        except StaleView:
            raise
        except Exception:
            pool.invalidate()
            raise
        dropped = [a for a in decided.admissions if a.job.id not in admitted]
        for a in dropped:
            for p, s in zip(a.placements, _by_placement(a), strict=True):
                pool.give_back(p, s)
        if dropped and report.written_ahead:
            wake.dispatch_soon()  # some may only have been held by another transaction (skip_locked): decide again
        if dropped:
            pool.ledger_version = None
        else:
            pool.wrote(before, after)
        t3 = time.perf_counter()
        report.write_s = t3 - t2
        report.lock_s = held
        store.after_write(decided, admitted)
        report.starts_s = time.perf_counter() - t3
        report.admitted = len(admitted)
    return decided, dropped, lines_before, lines_after


def _by_placement(a: Admission) -> list[list[Slice]]:
    out, k = [], 0
    for p in a.placements:
        n = len(p.gpu_indices)
        out.append(a.slices[k : k + n])
        k += n
    return out
