"""When a waiting job may start: a range from evidence, or "unknown" when there is none.

The estimate replays the near future twice, once with every job ending early and once ending late:

- each running job ends after its own remaining time: from the run times of earlier finished jobs like it
  (the same owner, command and labels; else the same owner and command; else the same command; else any job of
  its queue), given how long it has already run, and never after its own time limit;
- the jobs ahead in the line start as capacity, the queue's quota and their team's quota allow (FIFO queues in
  order, backfill queues whoever fits), and run for their own expected time;
- the job starts at the first moment it fits, GPUs and its team's and queue's quota alike.

The early replay takes each duration's low quantile, the late one its high quantile (`Q_LOW`, `Q_HIGH`), and a
third, the median, gives the single figure benchmarks compare with real waits. A job that waits for capacity
starts no sooner than the first running job ends, so the range never begins at 0 for a blocked job. Where the
replay leans on a duration nobody has seen (no finished job like it, no time limit to bound it) the estimate is
"unknown"; the time limits alone still bound the late end when they can.

Two things keep the range honest over the whole wait, not only at its start. A handful of runs says little
about the slow end: while fewer than `THIN_RUNS` runs like a job are longer than what it has already run, the
late replay lets it go on to `THIN_SPREAD` times the longest of them (never past its limit), so a job that ran
once in 80 s is not promised to end in 80 s. And a holder that has run longer than every run like it is
counted (`Estimate.outlived`, among the holders the job waits for: its team's when the team's quota holds it,
its queue's for the queue's, every one for capacity): the page says so in words instead of a range that
shrinks towards zero and then jumps to the time limits.

GPUs are counted as thousandths of a card over the cards the job may use: placement details (fragmentation,
host CPU) are the dispatcher's business; `bench/eta.py` measures how often real starts land in the range.
"""

from __future__ import annotations

import bisect
import heapq
import json
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property

from django.db.models import DateTimeField, F, FloatField, Func, TextField, Value
from django.db.models.functions import Cast, Coalesce, Greatest
from django.utils import timezone

from jobs.models import LINE_ORDER, Job
from jobs.states import JobState

# Chosen on the tuning half of bench/eta.py's replay (seeds 1-3), reported on the other (seeds 11-15).
Q_LOW = 0.1
Q_HIGH = 0.9
HISTORY_DAYS = 30
HISTORY_ROWS = 20000
FINISHED = (JobState.SUCCEEDED, JobState.FAILED)
THIN_RUNS = 5  # fewer runs than this to go by: the late replay widens (below)
THIN_SPREAD = 2.0  # ... to this many times the longest of them
# The reasons whose holders are the team's own or the queue's own jobs (every holder counts for the others).
TEAM_REASONS = ("team_quota_exhausted", "team_job_limit", "user_job_limit")
QUEUE_REASONS = ("queue_quota_exhausted",)


@dataclass(frozen=True, slots=True)
class LineJob:
    """A waiting job as the estimate reads it: a few columns instead of a whole row (`waiting_line`)."""

    id: object
    reason: str
    total_gpu_milli: int
    team_id: int
    queue_id: int
    owner_id: int
    command: str  # as the database prints the JSON (see `json_text`): a key, never parsed
    labels: str
    timeout_s: int


LINE_COLUMNS = (
    "id",
    "reason",
    "total_gpu_milli",
    "team_id",
    "queue_id",
    "owner_id",
    "command_t",
    "labels_t",
    "timeout_s",
)


def _as_text(rows):
    """`command` and `labels` as the database prints them (`::text`): the estimate only compares them, and parsing
    the JSON of 20,000 finished and 7,000 running jobs was most of an estimate's cost on a fleet."""
    return rows.annotate(command_t=Cast("command", TextField()), labels_t=Cast("labels", TextField()))


def json_text(value) -> str:
    """A JSON value as PostgreSQL prints a `jsonb` (object keys by length, then bytes; ", " and ": "), so a value
    read as text and one held in Python make the same key; text is taken as already printed."""
    return value if isinstance(value, str) else _jsonb(value)


def _jsonb(value) -> str:
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: (len(kv[0].encode()), kv[0].encode()))
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_jsonb(v)}" for k, v in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_jsonb(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _labels_text(labels) -> str:
    return "{}" if labels is None else json_text(labels)


def waiting_line(queue) -> list[LineJob]:
    """The queue's waiting line in the dispatcher's order, with only what the estimate needs: reading 5,000
    whole rows (some 60 columns, JSON among them, and their owners, teams and specs) took about half a second,
    these columns a fraction of it."""
    rows = _as_text(Job.objects.filter(queue=queue, state=JobState.PENDING)).order_by(*LINE_ORDER)
    return [LineJob(*row) for row in rows.values_list(*LINE_COLUMNS)]


@dataclass(frozen=True, slots=True)
class Holder:
    """A job holding capacity (reserved), as the estimate reads it."""

    id: object
    owner_id: int
    command: str
    labels: str
    queue_id: int
    team_id: int
    total_gpu_milli: int
    timeout_s: int
    ran_s: float  # since it started (else since it was admitted) as of the estimate's now; 0 if neither
    deadline_s: float | None  # until its deadline (negative: past it), None without one


HOLDER_COLUMNS = (
    "id",
    "owner_id",
    "command_t",
    "labels_t",
    "queue_id",
    "team_id",
    "total_gpu_milli",
    "timeout_s",
    "ran_s",
    "deadline_s",
)


class Seconds(Func):
    """An interval in seconds as a float: PostgreSQL computes it exactly and rounds once, as
    `timedelta.total_seconds()` does, so the figure is the same as computing it in Python. Reading the timestamps
    instead (Django parses them in Python) was most of the cost of reading 7,000 holders."""

    template = "EXTRACT(EPOCH FROM %(expressions)s)::float8"
    output_field = FloatField()


def holders(now: datetime) -> list[Holder]:
    at = Value(now, output_field=DateTimeField())
    rows = _as_text(Job.objects.filter(reserved=True)).annotate(
        ran_s=Seconds(at - Coalesce("started_at", "admitted_at", at)), deadline_s=Seconds(F("deadline") - at)
    )
    return [Holder(*row) for row in rows.values_list(*HOLDER_COLUMNS)]


@dataclass(frozen=True)
class Estimate:
    """Seconds from now until the job may start: `low`..`high`, `mid` the median replay's figure. `known` is
    False when the replay had to guess a duration with no evidence; `high` may then still be bounded (None when
    not even time limits bound it)."""

    low: float | None
    mid: float | None
    high: float | None
    known: bool
    outlived: int = 0  # holders it waits for that have run longer than every finished run like them
    holders: int = 0  # holders it waits for (see the module docstring)

    def as_dict(self) -> dict:
        r = {
            k: None if v is None else round(v)
            for k, v in (("low_s", self.low), ("mid_s", self.mid), ("high_s", self.high))
        }
        return {**r, "known": self.known, "holders": self.holders, "outlived": self.outlived}


def _quantile(ordered: list[float], q: float, start: int = 0) -> float:
    """The q-quantile of `ordered[start:]` (sorted ascending), by index: no copy, no sort."""
    n = len(ordered) - start
    return ordered[start + min(n - 1, max(0, round(q * (n - 1))))]


class History:
    """Run times of finished jobs, looked up from the most to the least specific likeness."""

    def __init__(self, rows=(), *, grouped=()):
        """`rows`: (owner id, command, labels, queue id, seconds) of each finished run; `grouped`: the same with
        the seconds of every run alike in a list."""
        self.by: dict[tuple, list[float]] = {}
        for owner, command, labels, queue_id, seconds in (*((o, c, lb, q, (s,)) for o, c, lb, q, s in rows), *grouped):
            c = json_text(command)
            for key in ((owner, c, _labels_text(labels)), (owner, c), ("cmd", c), ("queue", queue_id)):
                self.by.setdefault(key, []).extend(seconds)
        # Sorted once here: each lookup is then a bisection and an index, whatever the history's length (a fleet
        # with 20,000 finished runs and 7,000 running jobs cost seconds per estimate when each sorted its own copy).
        for durations in self.by.values():
            durations.sort()
        self._for_job: dict = {}

    @classmethod
    def load(cls, queue_ids, now: datetime) -> History:
        """The last `HISTORY_ROWS` runs of the last `HISTORY_DAYS` in those queues, the runs alike grouped by the
        database: 20,000 rows read one by one, each with its command's text, took most of a fleet's read."""
        from django.db import connection

        recent = (
            Job.objects.filter(
                queue_id__in=list(queue_ids),
                state__in=FINISHED,
                started_at__isnull=False,
                finished_at__gte=now - timedelta(days=HISTORY_DAYS),
            )
            .annotate(ran_s=Greatest(Seconds(F("finished_at") - F("started_at")), Value(0.0)))
            .order_by("-finished_at")
        )
        recent = _as_text(recent).values_list("owner_id", "command_t", "labels_t", "queue_id", "ran_s")
        sql, params = recent[:HISTORY_ROWS].query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT owner_id, command_t, labels_t, queue_id, array_agg(ran_s) "
                f"FROM ({sql}) AS recent (owner_id, command_t, labels_t, queue_id, ran_s) GROUP BY 1, 2, 3, 4",
                params,
            )
            return cls(grouped=cursor.fetchall())

    def durations(self, job) -> list[float]:
        """The run times (sorted ascending) of the finished jobs most like `job`; [] with none."""
        hit = self._for_job.get(job.id)
        if hit is not None:
            return hit
        c = json_text(job.command)
        hit = []
        for key in (
            (job.owner_id, c, _labels_text(job.labels)),
            (job.owner_id, c),
            ("cmd", c),
            ("queue", job.queue_id),
        ):
            if key in self.by:
                hit = self.by[key]
                break
        self._for_job[job.id] = hit
        return hit


def _remaining(durations: list[float], elapsed: float, limit: float | None, q: float) -> tuple[float | None, bool]:
    """How much longer a job that has run `elapsed` s goes on, at quantile q; (None, False) with no evidence.
    `durations` is sorted ascending (History keeps it so)."""
    first_longer = bisect.bisect_right(durations, elapsed)
    if first_longer < len(durations):
        value = _quantile(durations, q, first_longer) - elapsed
        if q >= Q_HIGH and len(durations) - first_longer < THIN_RUNS:
            value = max(value, THIN_SPREAD * durations[-1] - elapsed)
        return (min(value, limit) if limit is not None else value), True
    if durations:  # it has outlived every run like it: it may end any moment, at the latest at its limit
        return (0.0 if q < 0.5 else limit), limit is not None or q < 0.5
    return (limit if q >= 0.5 else 0.0), False  # no evidence: any moment, or as late as its limit


QUANTILES = (Q_LOW, 0.5, Q_HIGH)  # the early, middle and late replays


def _run_time(durations: list[float], q: float, timeout_s: float) -> tuple[float, bool]:
    """How long a job of the line runs once it starts, at quantile q, and whether evidence says so (else a guess:
    no time at all early, its whole time limit late)."""
    if durations:
        run = _quantile(durations, q)
        if q >= Q_HIGH and len(durations) < THIN_RUNS:
            run = max(run, THIN_SPREAD * durations[-1])
        return min(run, float(timeout_s)), True
    return (float(timeout_s) if q >= 0.5 else 0.0), False


def _ends(held: list[tuple], q: float) -> tuple[list[tuple], bool]:
    """The holders' ends at quantile q, a heap of (seconds from now, n, need, queue id, team id), and whether each
    leaned on evidence. `held`: (durations, elapsed, limit left, need, queue id, team id) of each holder."""
    known = True
    ends = []
    for durations, elapsed, limit_left, need, queue_id, team_id in held:
        left, ok = _remaining(durations, elapsed, limit_left, q)
        known = known and ok
        if left is not None:  # else it holds its GPUs for as long as anyone can tell
            ends.append((left, len(ends), need, queue_id, team_id))
    heapq.heapify(ends)  # the keys (left, n) are unique: the same pops as pushing them one by one
    return ends, known


def _replay(line, running, free, queue_used, team_used, limits, history, q, fifo) -> dict:
    """One replay at quantile q: job id -> (start in s from now or None, whether every duration it leaned on
    had evidence). `running`: (job, elapsed, limit_left) of the jobs holding GPUs; jobs of `line` with a
    waiting reason wait at least for the first running job to end (the dispatcher found no room for them)."""
    held = [
        (history.durations(j), elapsed, limit_left, j.total_gpu_milli, j.queue_id, j.team_id)
        for j, elapsed, limit_left in running
    ]
    ends, known = _ends(held, q)
    runs = [_run_time(history.durations(job), q, job.timeout_s) for job in line]
    starts = _replay_line(line, ends, known, runs, free, queue_used, team_used, limits, fifo)
    return {job.id: start for job, start in zip(line, starts, strict=True)}


def _replay_line(line, ends, known, runs, free, queue_used, team_used, limits, fifo) -> list[tuple]:
    """The replay proper: (start in s from now or None, whether it leaned only on evidence) of each job of `line`,
    by index. `ends`: the holders' ends (`_ends`; the heap is consumed); `runs[i]`: how long line[i] runs once
    started, and whether from evidence (`_run_time`)."""
    heappop, heappush = heapq.heappop, heapq.heappush
    queue_limit, team_limits = limits
    out: list[tuple] = [(None, False)] * len(line)
    # The line in groups whose jobs fit or not together: the same need, queue, team, and whether the dispatcher
    # already found no room for them (those wait for a release). Each group keeps line order, so the next job to
    # start is the earliest head among the groups that fit (FIFO: the earliest head of all, if it fits) — the
    # same choice as walking the whole line, for a cost in groups (a few dozen shapes) instead of jobs (5,000
    # walked at each of ~12,000 ends took seconds on a fleet).
    groups: dict[tuple, deque] = {}
    for index, job in enumerate(line):
        if job.reason == "queue_closed":
            continue
        key = (job.total_gpu_milli, job.queue_id, job.team_id, bool(job.reason))
        members = groups.get(key)
        if members is None:
            groups[key] = members = deque()
        members.append(index)

    def fits(key) -> bool:
        need, queue_id, team_id, waited = key
        team_limit = team_limits.get(team_id)
        return (
            (released or not waited)
            and need <= free
            and queue_used.get(queue_id, 0) + need <= queue_limit
            and (team_limit is None or team_used.get(team_id, 0) + need <= team_limit)
        )

    def by_need() -> list[tuple]:  # the groups that may start now, smallest need first
        return sorted((key for key in groups if released or not key[3]), key=lambda key: key[0])

    n = len(ends)
    t = 0.0
    released = False
    order = by_need()
    while groups:
        while ends and ends[0][0] <= t:
            _, _, need, queue_id, team_id = heappop(ends)
            if not released:
                released = True
                order = by_need()
            free += need
            queue_used[queue_id] = queue_used.get(queue_id, 0) - need
            team_used[team_id] = team_used.get(team_id, 0) - need
        while order and order[0][0] <= free:
            if fifo:
                best = min(groups, key=lambda key: groups[key][0])
                if not fits(best):
                    break
            else:
                # The groups in `order` may all start once released (by_need): only room and quotas to check.
                best, best_index = None, None
                for key in order:
                    need, queue_id, team_id, _ = key
                    if need > free:
                        break  # the rest need more still
                    index = groups[key][0]
                    if best_index is not None and index > best_index:
                        continue
                    if queue_used.get(queue_id, 0) + need > queue_limit:
                        continue
                    team_limit = team_limits.get(team_id)
                    if team_limit is None or team_used.get(team_id, 0) + need <= team_limit:
                        best, best_index = key, index
                if best is None:
                    break
            members = groups[best]
            index = members.popleft()
            if not members:
                del groups[best]
                order = by_need()
            need, queue_id, team_id, _ = best
            out[index] = (t, known)
            free -= need
            queue_used[queue_id] = queue_used.get(queue_id, 0) + need
            team_used[team_id] = team_used.get(team_id, 0) + need
            run, evidence = runs[index]
            if not evidence:
                known = False  # every job behind this one leans on a guess
            heappush(ends, (t + run, n, need, queue_id, team_id))
            n += 1
        if not ends:
            break  # nothing will ever free enough for the rest: they wait on something no replay sees end
        t = max(t, ends[0][0])
    return out


class Fleet:
    """What every queue's estimate reads alike, read once for a page that shows several queues: the healthy
    capacity, the jobs holding it, and the finished runs (one History per set of queues asked for)."""

    def __init__(self, now: datetime | None = None):
        self.now = now or timezone.now()
        self._history: dict[frozenset, History] = {}

    @cached_property
    def capacity(self) -> int:
        from cluster.models import GPU

        return 1000 * GPU.objects.filter(health="healthy", quarantined=False, node__state="ready").count()

    @cached_property
    def holding(self) -> list[Holder]:  # read only when some queue has a line
        return holders(self.now)

    @cached_property
    def running(self) -> list[tuple[Holder, float, float]]:
        """Each holder with how long it has run and how long its time limit has left (s), as of `now`."""
        out = []
        for j in self.holding:
            elapsed = max(0.0, j.ran_s)
            left = max(0.0, j.deadline_s) if j.deadline_s is not None else max(0.0, j.timeout_s - elapsed)
            out.append((j, elapsed, left))
        return out

    def history(self, queue_id: int) -> History:
        ids = frozenset({queue_id, *(j.queue_id for j in self.holding)})
        if ids not in self._history:
            self._history[ids] = History.load(ids, self.now)
        return self._history[ids]


def estimate_starts(queue, waiting: list, *, now: datetime | None = None, fleet: Fleet | None = None) -> dict:
    """Estimate for each job of `waiting` (the queue's line, in order): job id -> Estimate. `fleet`: inputs
    already read for another queue of the same page."""
    from quotas.models import Team

    if not waiting:
        return {}
    fleet = fleet or Fleet(now)
    now = fleet.now
    capacity = fleet.capacity
    holding = fleet.holding
    history = fleet.history(queue.id)
    queue_used: dict[int, int] = {}
    team_used: dict[int, int] = {}
    held = []  # what the replays read of each holder, looked up once for all three
    for j, elapsed, limit_left in fleet.running:
        held.append((history.durations(j), elapsed, limit_left, j.total_gpu_milli, j.queue_id, j.team_id))
        queue_used[j.queue_id] = queue_used.get(j.queue_id, 0) + j.total_gpu_milli
        team_used[j.team_id] = team_used.get(j.team_id, 0) + j.total_gpu_milli
    team_ids = {j.team_id for j in waiting}
    limits = (queue.gpu_milli, dict(Team.objects.filter(id__in=team_ids).values_list("id", "gpu_milli")))
    fifo = queue.ordering == "fifo"
    free = capacity - sum(j.total_gpu_milli for j in holding)
    durations = [history.durations(job) for job in waiting]
    replays = []
    for q in QUANTILES:
        ends, known = _ends(held, q)
        runs = [_run_time(d, q, job.timeout_s) for d, job in zip(durations, waiting, strict=True)]
        replays.append(_replay_line(waiting, ends, known, runs, free, dict(queue_used), dict(team_used), limits, fifo))
    # (holders, outlived) by team, by queue and over all: counted once, looked up per waiting job.
    counts: dict[tuple, list[int]] = {}
    for d, elapsed, _, _, queue_id, team_id in held:
        old = _outlived(d, elapsed)
        for key in (("team", team_id), ("queue", queue_id), ("all",)):
            c = counts.setdefault(key, [0, 0])
            c[0] += 1
            c[1] += old
    out = {}
    for job, (low, ok_low), (mid, ok_mid), (high, ok_high) in zip(waiting, *replays, strict=True):
        if low is not None and high is not None and low > high:
            low, high = high, low
        if job.reason in TEAM_REASONS:
            key: tuple = ("team", job.team_id)
        elif job.reason in QUEUE_REASONS:
            key = ("queue", job.queue_id)
        else:
            key = ("all",)
        held, old = counts.get(key, (0, 0))
        out[job.id] = Estimate(
            low=low,
            mid=mid,
            high=high,
            known=ok_low and ok_mid and ok_high and high is not None,
            outlived=old,
            holders=held,
        )
    return out


def _outlived(durations: list[float], elapsed: float) -> bool:
    """Whether a running job has run longer than every finished run like it (there being some)."""
    return bool(durations) and elapsed >= durations[-1]
