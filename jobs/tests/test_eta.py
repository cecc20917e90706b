"""Estimated starts (jobs/eta.py): ranges from evidence, "unknown" without it, team quota, never 0 when blocked."""

import json
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from frontend.templatetags.portal import eta as eta_words
from jobs import eta, selectors, services
from jobs.models import Job
from jobs.states import JobState
from jobs.store import dispatch
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from quotas.models import Queue, Team

pytestmark = pytest.mark.django_db(transaction=True)
GUARANTEED = {"team": "demo", "queue": "train", "spec": "guaranteed", "image": "python-3.11"}


def _submit(user, command="train.py", gpus=1, **extra):
    data = {**GUARANTEED, "command": ["python", command], **extra}
    if gpus > 1:
        data["gpus"] = gpus
    return services.job_submit(user=user, data=data)[0]


def _run(job, started):
    """Admit, start and backdate a job as a backend would have."""
    dispatch(full=True)
    job = Job.objects.get(pk=job.pk)
    assert job.state == JobState.ADMITTED, (job.state, job.reason)
    services.job_transition(job_id=job.id, to=JobState.STARTING, actor="test")
    services.job_transition(job_id=job.id, to=JobState.RUNNING, actor="test")
    Job.objects.filter(pk=job.pk).update(
        started_at=started, admitted_at=started, deadline=started + timedelta(seconds=job.timeout_s)
    )
    return job


def _history(user, now, runs_s, command="train.py"):
    """Finished jobs of `command` that ran for `runs_s` seconds each (the last month)."""
    for k, seconds in enumerate(runs_s):
        job = _run(_submit(user, command), now - timedelta(days=2, seconds=k))
        services.job_transition(job_id=job.id, to=JobState.SUCCEEDED, actor="test", message="exit code 0")
        end = now - timedelta(days=1, seconds=k)
        Job.objects.filter(pk=job.pk).update(started_at=end - timedelta(seconds=seconds), finished_at=end)


def _open(queue_gpus=4, team_gpus=4):
    Queue.objects.filter(name="train").update(gpu_milli=queue_gpus * 1000, ordering="fifo", max_timeout_s=10**6)
    Team.objects.filter(slug="demo").update(gpu_milli=team_gpus * 1000, max_running_jobs=100, max_jobs_per_user=100)


def test_a_blocked_job_gets_a_range_from_the_running_jobs_history_never_zero(platform):  # noqa: F811
    now = timezone.now()
    _open()
    _history(platform, now, [3600] * 5 + [7200] * 5)  # runs of this script take 1 h or 2 h
    running = [_run(_submit(platform, timeout_s=86400), now - timedelta(minutes=30)) for _ in range(4)]
    assert len(running) == 4
    waiting = _submit(platform, timeout_s=86400)
    dispatch(full=True)
    assert Job.objects.get(pk=waiting.pk).reason in {"no_capacity", "queue_quota_exhausted"}
    queue = Queue.objects.get(name="train")
    est = eta.estimate_starts(queue, selectors.queue_waiting(queue), now=now)[waiting.id]
    assert est.known
    # Each running job has run 30 min of a 1 h or 2 h script: one ends between 30 min and 90 min from now.
    assert 1700 <= est.low <= 1900 and 1700 <= est.mid <= 5500 and 5300 <= est.high <= 5500, est
    words = eta_words(est)
    assert words.startswith("between 30 min") and words.endswith("1 h 30 min from now"), words


def test_without_any_history_the_estimate_is_unknown_but_bounded_by_the_time_limits(platform):  # noqa: F811
    now = timezone.now()
    _open()
    for _ in range(4):
        _run(_submit(platform, command="new.py", timeout_s=4 * 3600), now - timedelta(hours=1))
    waiting = _submit(platform, command="new.py", timeout_s=4 * 3600)
    dispatch(full=True)
    queue = Queue.objects.get(name="train")
    est = eta.estimate_starts(queue, selectors.queue_waiting(queue), now=now)[waiting.id]
    assert not est.known and 3 * 3600 - 60 <= est.high <= 3 * 3600 + 60, est
    assert eta_words(est) == "unknown (at the latest in 3 h, when running jobs reach their time limits)"


def test_the_team_quota_holds_a_job_back_while_cards_are_free(platform):  # noqa: F811
    now = timezone.now()
    _open(queue_gpus=4, team_gpus=2)
    _history(platform, now, [600] * 6, command="short.py")
    _history(platform, now, [10 * 3600] * 6, command="long.py")
    # Team quota 2 cards: one 10-hour job started 1 h ago and one 10-min job started 5 min ago; 2 cards idle.
    _run(_submit(platform, command="long.py", timeout_s=86400), now - timedelta(hours=1))
    _run(_submit(platform, command="short.py", timeout_s=86400), now - timedelta(minutes=5))
    waiting = _submit(platform, command="short.py", timeout_s=86400)
    dispatch(full=True)
    assert Job.objects.get(pk=waiting.pk).reason.startswith("team_quota")
    queue = Queue.objects.get(name="train")
    est = eta.estimate_starts(queue, selectors.queue_waiting(queue), now=now)[waiting.id]
    # Not "now" (cards are free but the team's quota is full), not 9 h: when the short run ends, 5 min from now.
    assert est.known and 250 <= est.low <= est.high <= 350, est


def test_the_api_and_the_job_page_show_the_range(platform, client):  # noqa: F811
    now = timezone.now()
    _open()
    _history(platform, now, [3600] * eta.THIN_RUNS)  # enough runs for a narrow range
    for _ in range(4):
        _run(_submit(platform, timeout_s=86400), now - timedelta(minutes=10))
    waiting = _submit(platform, timeout_s=86400)
    dispatch(full=True)
    client.force_login(platform)
    rows = client.get("/api/v1/queues/train/").json()["jobs"]
    row = next(r for r in rows if r["id"] == str(waiting.id))
    assert row["estimated_start"]["known"] and row["estimated_start"]["low_s"] > 0
    assert row["estimated_wait_s"] == row["estimated_start"]["mid_s"]
    page = client.get(f"/jobs/{waiting.id}/").content.decode()
    header = page[page.index('class="job-state-line"') :][:800]
    assert "estimated start: in about 4" in header or "estimated start: in about 50 min" in header, header


def _walk_the_line(line, running, free, queue_used, team_used, limits, history, q, fifo) -> dict:
    """The replay as first written: at every end, the whole line walked in order (cost: ends × line). The grouped
    replay must start every job at the same moment."""
    import heapq

    known = True
    ends, n = [], 0
    for job, elapsed, limit_left in running:
        left, ok = eta._remaining(history.durations(job), elapsed, limit_left, q)
        known = known and ok
        if left is not None:
            heapq.heappush(ends, (left, n, (job.total_gpu_milli, job.queue_id, job.team_id)))
            n += 1
    queue_limit, team_limits = limits
    waiting = [j for j in line if j.reason != "queue_closed"]
    out = {j.id: (None, False) for j in line}
    t, released = 0.0, False
    while waiting:
        while ends and ends[0][0] <= t:
            _, _, (need, queue_id, team_id) = heapq.heappop(ends)
            released = True
            free += need
            queue_used[queue_id] = queue_used.get(queue_id, 0) - need
            team_used[team_id] = team_used.get(team_id, 0) - need
        left_waiting, blocked = [], False
        for job in waiting:
            need = job.total_gpu_milli
            team_limit = team_limits.get(job.team_id)
            if not (
                not blocked
                and (released or not job.reason)
                and need <= free
                and queue_used.get(job.queue_id, 0) + need <= queue_limit
                and (team_limit is None or team_used.get(job.team_id, 0) + need <= team_limit)
            ):
                left_waiting.append(job)
                blocked = blocked or fifo
                continue
            out[job.id] = (t, known)
            free -= need
            queue_used[job.queue_id] = queue_used.get(job.queue_id, 0) + need
            team_used[job.team_id] = team_used.get(job.team_id, 0) + need
            durations = history.durations(job)
            if durations:
                run = eta._quantile(durations, q)
                if q >= eta.Q_HIGH and len(durations) < eta.THIN_RUNS:
                    run = max(run, eta.THIN_SPREAD * durations[-1])
                run = min(run, float(job.timeout_s))
            else:
                known = False
                run = float(job.timeout_s) if q >= 0.5 else 0.0
            heapq.heappush(ends, (t + run, n, (need, job.queue_id, job.team_id)))
            n += 1
        waiting = left_waiting
        if not ends:
            break
        t = max(t, ends[0][0])
    return out


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize("seed", range(12))
def test_the_grouped_replay_starts_every_job_when_walking_the_whole_line_would(seed):
    import random
    from types import SimpleNamespace

    rng = random.Random(seed)
    teams = rng.choice([1, 2, 4])
    needs = [100, 250, 500, 1000, 2000, 8000]
    commands = [["python", f"t{k}.py"] for k in range(4)] + [["python", "never-seen.py"]]
    reasons = ["", "", "no_capacity", "team_quota", "queue_closed"]
    line = [
        eta.LineJob(
            i, rng.choice(reasons), rng.choice(needs), rng.randrange(teams), 1, 7, rng.choice(commands), {}, 3600
        )
        for i in range(rng.randint(1, 300))
    ]
    running = [
        (
            SimpleNamespace(
                id=f"r{i}",
                total_gpu_milli=rng.choice(needs),
                queue_id=1,
                team_id=rng.randrange(teams),
                owner_id=7,
                command=rng.choice(commands),
                labels={},
            ),
            rng.uniform(0, 5000),
            rng.choice([3600.0, 600.0]),
        )
        for i in range(rng.randint(0, 200))
    ]
    history = eta.History([(7, rng.choice(commands[:4]), {}, 1, rng.uniform(60, 4000)) for _ in range(300)])
    used = sum(j.total_gpu_milli for j, *_ in running)
    team_used: dict = {}
    for j, *_ in running:
        team_used[j.team_id] = team_used.get(j.team_id, 0) + j.total_gpu_milli
    capacity = used + rng.choice([0, 500, 4000, 20000])
    limits = (
        rng.choice([10**9, used + 3000]),
        {k: rng.choice([None, 10**9, team_used.get(k, 0) + 2000]) for k in range(teams)},
    )
    limits = (limits[0], {k: v for k, v in limits[1].items() if v is not None})
    for q in (eta.Q_LOW, 0.5, eta.Q_HIGH):
        for fifo in (False, True):
            args = (line, running, capacity - used, {1: used}, dict(team_used), limits, history, q, fifo)
            expected = _walk_the_line(*args[:3], dict(args[3]), dict(args[4]), *args[5:])
            assert eta._replay(*args[:3], dict(args[3]), dict(args[4]), *args[5:]) == expected, (seed, q, fifo)


@pytest.mark.parametrize(
    "value",
    [
        ["python", "train.py", "--lr=0.1"],
        {"exp": "a", "b": "x", "longer-key": "y", "é": "ü"},
        {"zz": "1", "a": "2", "mm": 'quote " and \\\\ back', "nl": "line\\nnext"},
        [],
        {},
        ["tab\\there", "über", 3, None, True],
    ],
)
def test_json_text_prints_a_value_as_the_database_prints_its_jsonb(value):
    """The estimate keys finished and running jobs by `command`/`labels` as text: a value held in Python (a
    submission not yet saved) must make the same key as the same value read back from the database."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::jsonb::text", [json.dumps(value)])
        assert eta.json_text(value) == cursor.fetchone()[0]


def test_one_earlier_run_gives_a_range_from_the_start_not_a_countdown(platform):  # noqa: F811
    """Seen on a fresh install: one earlier run of 80 s, shown "in about 1 min", real wait 4 min. A single run says
    little about the slow end: the late replay lets the holders run to twice the longest run like them."""
    now = timezone.now()
    _open()
    _history(platform, now, [240])
    for _ in range(4):
        _run(_submit(platform, timeout_s=86400), now - timedelta(seconds=10))
    waiting = _submit(platform, timeout_s=86400)
    dispatch(full=True)
    queue = Queue.objects.get(name="train")
    est = eta.estimate_starts(queue, selectors.queue_waiting(queue), now=now)[waiting.id]
    assert est.known and 220 <= est.low <= 240 and 460 <= est.high <= 480, est
    assert est.outlived == 0 and est.holders == 4
    assert eta_words(est) == "between 3 min and 7 min from now", eta_words(est)


def test_holders_that_outlived_every_similar_run_are_said_so_plainly(platform, client):  # noqa: F811
    """The holders have run 5 min; every earlier run of their script took 1 min: no countdown to a few seconds,
    no silent jump to the time limit, but words saying what is known."""
    now = timezone.now()
    _open()
    _history(platform, now, [60] * 6)
    for _ in range(4):
        _run(_submit(platform, timeout_s=3 * 3600), now - timedelta(minutes=5))
    waiting = _submit(platform, timeout_s=3 * 3600)
    dispatch(full=True)
    queue = Queue.objects.get(name="train")
    est = eta.estimate_starts(queue, selectors.queue_waiting(queue), now=now)[waiting.id]
    assert est.outlived == 4 and est.holders == 4, est
    words = eta_words(est)
    assert words.endswith(
        "(all 4 jobs it waits for have run longer than any similar job did: they may end any moment, or run on to "
        "their time limits)"
    ), words
    assert "2 h 55 min" in words, words  # the latest moment: the holders' time limits
    client.force_login(platform)
    detail = client.get(f"/api/v1/jobs/{waiting.id}/").json()["estimated_start"]
    assert detail["outlived"] == 4 and detail["holders"] == 4, detail


def test_only_the_teams_own_holders_count_when_the_team_quota_holds_it(platform):  # noqa: F811
    now = timezone.now()
    _open(queue_gpus=4, team_gpus=1)
    _history(platform, now, [60] * 6)
    _run(_submit(platform, timeout_s=3 * 3600), now - timedelta(minutes=5))
    waiting = _submit(platform, timeout_s=3 * 3600)
    dispatch(full=True)
    assert Job.objects.get(pk=waiting.pk).reason == "team_quota_exhausted"
    queue = Queue.objects.get(name="train")
    est = eta.estimate_starts(queue, selectors.queue_waiting(queue), now=now)[waiting.id]
    assert (est.outlived, est.holders) == (1, 1), est
    assert "the job it waits for has run longer than any similar job did" in eta_words(est)


def test_a_slow_queue_is_answered_from_the_kept_estimates_while_a_worker_computes_them_again(platform, monkeypatch):  # noqa: F811
    """A fleet's line costs more than ESTIMATE_SLOW_S to estimate: pages read the kept answer (aged) and ask for
    one refresh (jobs.refresh_estimates); a cheap line is computed for every request, as before."""
    from django.core.cache import cache

    from jobs.tasks import refresh_estimates

    now = timezone.now()
    _open(queue_gpus=1, team_gpus=1)
    _history(platform, now, [3600] * 5)
    _run(_submit(platform, timeout_s=86400), now - timedelta(minutes=30))
    first = _submit(platform, timeout_s=86400)
    dispatch(full=True)
    queue = Queue.objects.get(name="train")
    sent = []
    monkeypatch.setattr("celery.current_app.send_task", lambda name, args=None, **kw: sent.append((name, args)))
    # Cheap: every request computes, so a job that just arrived has its estimate at once.
    assert set(selectors.estimated_waits(queue)) == {first.id}
    second = _submit(platform, timeout_s=86400)
    assert set(selectors.estimated_waits(queue)) == {first.id, second.id} and sent == []
    # Slow: the kept answer is used, aged; the job that came after it has none until the refresh.
    monkeypatch.setattr(selectors, "ESTIMATE_SLOW_S", 0.0)
    kept = selectors.estimates_compute(queue)
    third = _submit(platform, timeout_s=86400)
    waits = selectors.estimated_waits(queue)
    assert set(waits) == {first.id, second.id} and waits[first.id].low <= kept[first.id].low
    assert sent == []  # still fresh enough: no refresh asked
    monkeypatch.setattr(selectors, "ESTIMATE_REUSE_S", 0.0)
    selectors.estimated_waits(queue)
    selectors.estimated_waits(queue)
    assert sent == [("jobs.refresh_estimates", [queue.id])]  # asked once, however many requests
    refresh_estimates(queue.id)
    assert cache.get(f"eta:refreshing:{queue.id}") is None
    assert set(selectors.estimated_waits(queue)) == {first.id, second.id, third.id}
    # A job's own page still gets its estimate when the kept answer predates it.
    fourth = _submit(platform, timeout_s=86400)
    assert selectors.estimated_start(Job.objects.get(pk=fourth.pk)) is not None


def test_the_database_counts_seconds_as_timedelta_does(platform):  # noqa: F811
    """The holders' run and deadline times and the history's run times are computed by PostgreSQL as float seconds
    (Django parses timestamps in Python: most of reading 7,000 holders): the same figures, to the last bit, as
    `timedelta.total_seconds()` of the timestamps, so the estimates do not change."""
    now = timezone.now()
    _open(queue_gpus=8, team_gpus=8)
    _history(platform, now, [60, 61, 62])
    finished = list(Job.objects.filter(state=JobState.SUCCEEDED))
    for k, job in enumerate(finished):  # run times with microseconds, one of them (clock skew) negative
        end = now - timedelta(hours=1, microseconds=k * 7919)
        ran = timedelta(seconds=3600.123457 * (k + 1)) if k else -timedelta(seconds=0.25)
        Job.objects.filter(pk=job.pk).update(started_at=end - ran, finished_at=end)
    held = [_run(_submit(platform, timeout_s=86400), now - timedelta(seconds=s)) for s in (0.000001, 1234.567891, 9e4)]
    Job.objects.filter(pk=held[0].pk).update(deadline=None)
    Job.objects.filter(pk=held[1].pk).update(deadline=now + timedelta(seconds=77.777777))
    Job.objects.filter(pk=held[2].pk).update(deadline=now - timedelta(seconds=5.5))  # past its deadline
    admitted = _submit(platform, timeout_s=600)
    dispatch(full=True)
    assert Job.objects.get(pk=admitted.pk).state == JobState.ADMITTED
    Job.objects.filter(pk=admitted.pk).update(admitted_at=now - timedelta(seconds=3.000003), deadline=None)

    fleet = eta.Fleet(now)
    rows = {j.pk: j for j in Job.objects.filter(reserved=True)}
    assert {j.id for j, *_ in fleet.running} == set(rows) and len(rows) == 4
    for holder, elapsed, left in fleet.running:
        row = rows[holder.id]
        began = row.started_at or row.admitted_at or now
        expected_elapsed = max(0.0, (now - began).total_seconds())
        expected_left = (
            max(0.0, (row.deadline - now).total_seconds())
            if row.deadline
            else max(0.0, row.timeout_s - expected_elapsed)
        )
        assert (elapsed, left) == (expected_elapsed, expected_left), row.pk
    queue = Queue.objects.get(name="train")
    runs = sorted(
        max(0.0, (j.finished_at - j.started_at).total_seconds()) for j in Job.objects.filter(state=JobState.SUCCEEDED)
    )
    assert runs[0] == 0.0 and fleet.history(queue.id).by[("queue", queue.id)] == runs


def test_an_estimate_reads_the_same_few_queries_whatever_the_fleet(platform, django_assert_max_num_queries):  # noqa: F811
    """Capacity, holders, history, the line and the teams' quotas: one query each, however many jobs hold, wait or
    finished (a query per holder or per run would make a fleet's estimate take seconds)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    now = timezone.now()
    _open(queue_gpus=3, team_gpus=3)
    queue = Queue.objects.get(name="train")

    def queries() -> int:
        with CaptureQueriesContext(connection) as seen:
            eta.estimate_starts(queue, selectors.waiting_line(queue), now=timezone.now())
        return len(seen)

    _history(platform, now, [600])
    running = _run(_submit(platform, timeout_s=86400), now - timedelta(minutes=1))
    waiting = _submit(platform, timeout_s=86400)
    small = queries()
    # Many more of each, as copies of those rows: holders, finished runs of another script, waiting jobs.
    finished = Job.objects.filter(state=JobState.SUCCEEDED).first()
    copies = []
    for template, n, fields in (
        (running, 20, {}),
        (finished, 30, {"command": ["python", "other.py"]}),
        (waiting, 40, {}),
    ):
        for _ in range(n):
            copy = Job.objects.get(pk=template.pk)
            copy.pk, copy.idempotency_key = uuid.uuid4(), None
            for key, value in fields.items():
                setattr(copy, key, value)
            copies.append(copy)
    Job.objects.bulk_create(copies)
    assert Job.objects.filter(reserved=True).count() == 21 and Job.objects.filter(state="pending").count() == 41
    assert queries() == small <= 5, small
