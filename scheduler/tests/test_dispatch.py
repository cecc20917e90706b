"""The live dispatcher against real PostgreSQL: GPU-model constraints, host CPU and memory, one pass that reads
nothing when the pool did not change, coalesced wake-ups, and the same placements as the in-memory allocator."""

from __future__ import annotations

import random
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from cluster.inventory import GpuInfo, NodeInfo
from cluster.models import GPU, LogicalDevice, Node
from cluster.services import inventory_sync, node_cordon
from jobs import lifecycle, selectors, services, store
from jobs.models import Job
from jobs.store import JobStore
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from kernel.errors import ValidationFailed
from quotas.models import Queue, Team
from scheduler import dispatch as scheduler
from scheduler import policy
from scheduler.pool import current, model_matches

pytestmark = pytest.mark.django_db(transaction=True)
GIB = 1024


def node(name: str, count: int, model: str, *, mib: int = 80 * GIB, cpu: int = 64000, mem: int = 512 * GIB):
    gpus = tuple(GpuInfo(uuid=f"GPU-{name}-{i}", index=i, model=model, memory_mib=mib) for i in range(count))
    return NodeInfo(
        name=name,
        emulated=True,
        driver_version="550.54.15",
        cuda_version="12.4",
        cpu_milli=cpu,
        memory_mib=mem,
        gpus=gpus,
    )


def fresh_pool(*infos: NodeInfo, backend: str = "volcano") -> None:
    """Replace the seeded emulated node with the given nodes."""
    Node.objects.all().delete()
    for info in infos:
        inventory_sync(info=info, backend=backend)


def open_up(queue: str = "train", *, ordering: str = "backfill", explicit: bool = False) -> Queue:
    big = {"gpu_milli": 10**7, "gpu_memory_mib": 10**10, "cpu_milli": 10**9, "memory_mib": 10**10}
    Team.objects.filter(slug="demo").update(**big, max_running_jobs=10**6, max_jobs_per_user=10**6)
    Queue.objects.filter(name=queue).update(**big, ordering=ordering, allow_explicit_request=explicit)
    return Queue.objects.get(name=queue)


def submit(user, **data) -> Job:
    body = {"team": "demo", "queue": "train", "spec": "guaranteed", "image": "python-3.11", "command": ["true"]}
    body.update(data)
    job, _ = services.job_submit(user=user, data=body)
    return job


def placed_on(job: Job) -> list[tuple[str, int]]:
    attempt = Job.objects.get(pk=job.pk).attempts.get()
    return [(d["node"], d["gpu_index"]) for d in attempt.placement["devices"]]


@pytest.fixture(autouse=True)
def _forget_pool():
    scheduler.reset()
    yield
    scheduler.reset()


def test_model_names_and_families_match_as_users_write_them():
    assert model_matches("A100", "NVIDIA A100-SXM4-80GB")
    assert model_matches("a100-sxm4-80gb", "NVIDIA A100-SXM4-80GB")
    assert not model_matches("A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB")
    assert not model_matches("A10", "NVIDIA A100-SXM4-80GB")
    assert model_matches("A10", "NVIDIA A10")
    assert policy.Request.whole(1, gpu_model="V100M16|V100M32").gpu_model == frozenset({"V100M16", "V100M32"})


def test_a_model_pinned_job_lands_on_that_model_and_waits_with_a_reason(platform):  # noqa: F811
    fresh_pool(node("a100-0", 2, "NVIDIA A100-SXM4-80GB"), node("h100-0", 2, "NVIDIA H100 80GB HBM3"))
    train = open_up()
    jobs = [submit(platform, gpu_models=["H100"]) for _ in range(3)]
    anywhere = submit(platform)
    assert store.dispatch(queue_ids=[train.id]).admitted == 3
    assert {n for j in jobs[:2] for n, _ in placed_on(j)} == {"h100-0"}
    assert placed_on(anywhere)[0][0] == "a100-0"
    third = Job.objects.get(pk=jobs[2].pk)
    assert third.state == "pending" and third.reason == "no_capacity"
    assert "NVIDIA H100 80GB HBM3" in third.message

    node_cordon(node_id=Node.objects.get(name="h100-0").id, actor="test")
    store.dispatch(queue_ids=[train.id])
    third.refresh_from_db()
    assert third.reason == "gpu_model_unavailable" and "H100" in third.message

    with pytest.raises(ValidationFailed) as refused:
        submit(platform, gpu_models=["B200"])
    assert refused.value.code == "unknown_gpu_model" and "NVIDIA A100-SXM4-80GB" in str(refused.value)
    with pytest.raises(ValidationFailed) as bad:
        submit(platform, gpu_models={"model": "a100"})
    assert bad.value.code == "invalid_gpu_models"
    assert submit(platform, gpu_models="A100|H100").gpu_models == ["A100", "H100"]


def test_time_sliced_nodes_take_shares_and_plain_nodes_whole_cards(platform):  # noqa: F811
    from dataclasses import replace

    from cluster.inventory import SHARING_LABEL, SHARING_TIME_SLICED, SHARING_WHOLE

    sliced = replace(node("sliced-0", 2, "NVIDIA A100-SXM4-80GB"), labels={SHARING_LABEL: SHARING_TIME_SLICED})
    plain = replace(node("plain-0", 2, "NVIDIA A100-SXM4-80GB"), labels={SHARING_LABEL: SHARING_WHOLE})
    fresh_pool(sliced, plain)
    train = open_up()
    whole = [submit(platform) for _ in range(3)]
    shares = [submit(platform, spec="shared") for _ in range(2)]
    assert store.dispatch(queue_ids=[train.id]).admitted == 4
    assert {placed_on(j)[0][0] for j in whole[:2]} == {"plain-0"}
    assert {placed_on(j)[0][0] for j in shares} == {"sliced-0"}
    waiting = Job.objects.get(pk=whole[2].pk)
    assert waiting.state == "pending" and waiting.reason == "no_capacity"


def test_whole_cards_wait_with_the_reason_when_every_node_is_time_sliced(platform):  # noqa: F811
    from dataclasses import replace

    from cluster.inventory import SHARING_LABEL, SHARING_TIME_SLICED

    fresh_pool(replace(node("sliced-0", 2, "NVIDIA A100-SXM4-80GB"), labels={SHARING_LABEL: SHARING_TIME_SLICED}))
    train = open_up()
    whole, share = submit(platform), submit(platform, spec="shared")
    assert store.dispatch(queue_ids=[train.id]).admitted == 1
    assert placed_on(share)[0][0] == "sliced-0"
    waiting = Job.objects.get(pk=whole.pk)
    assert waiting.state == "pending" and waiting.reason == "no_capacity"
    assert "every ready node is time-sliced" in waiting.message


def test_host_cpu_and_memory_are_accounted_on_cluster_nodes(platform):  # noqa: F811
    # 8 free cards but 20 cores: the guaranteed spec asks 8 cores per card, so only two 1-card jobs fit.
    fresh_pool(node("small-cpu", 8, "NVIDIA A100-SXM4-80GB", cpu=20000))
    train = open_up()
    jobs = [submit(platform) for _ in range(3)]
    assert store.dispatch(queue_ids=[train.id]).admitted == 2
    waiting = Job.objects.get(pk=jobs[2].pk)
    assert waiting.state == "pending" and waiting.reason == "no_capacity"
    devices = LogicalDevice.objects.filter(released_at__isnull=True)
    assert sum(devices.values_list("cpu_milli", flat=True)) == 16000
    # One finishes: its CPU comes back, and the waiting job fits.
    lifecycle.job_cancel(job_id=jobs[0].id, actor="test")
    assert store.dispatch(queue_ids=[train.id]).admitted == 1


def test_local_nodes_share_host_cpu_unless_asked(platform, settings):  # noqa: F811
    fresh_pool(node("laptop", 4, "NVIDIA RTX 4090", mib=24 * GIB, cpu=2000), backend="local")
    train = open_up()
    jobs = [submit(platform) for _ in range(3)]
    assert store.dispatch(queue_ids=[train.id]).admitted == 3  # 8 cores per card asked, 2 cores present: shared
    settings.TRAINYARD_LOCAL_ACCOUNT_HOST = True
    scheduler.reset()
    more = submit(platform)
    assert store.dispatch(queue_ids=[train.id]).admitted == 0
    assert Job.objects.get(pk=more.pk).reason == "no_capacity"
    assert len(jobs) == 3


def test_a_pass_over_jobs_that_do_not_fit_reads_no_pool_rows_and_writes_nothing(platform):  # noqa: F811
    fresh_pool(node("n0", 2, "NVIDIA A100-SXM4-80GB"))
    train = open_up()
    for _ in range(2):
        submit(platform)
    assert store.dispatch(queue_ids=[train.id]).admitted == 2
    for _ in range(40):
        submit(platform, gpus=2)
    store.dispatch(queue_ids=[train.id])  # records their reasons once
    with CaptureQueriesContext(connection) as queries:
        assert store.dispatch(queue_ids=[train.id]).admitted == 0
    sql = [q["sql"] for q in queries.captured_queries]
    assert not any("cluster_gpu" in s or "cluster_logicaldevice" in s or 'FROM "cluster_node"' in s for s in sql)
    assert not any(s.lstrip().upper().startswith(("UPDATE", "INSERT")) for s in sql)
    assert len(sql) <= 12, "\n".join(s[:90] for s in sql)
    waiting = Job.objects.filter(state="pending").values_list("id", flat=True)
    assert sorted(selectors.queue_positions(waiting).values()) == list(range(1, 41))


def test_wake_ups_coalesce_into_one_queued_pass(platform, _isolated_broker_queue):  # noqa: F811
    import redis
    from django.conf import settings as dj_settings
    from django.core.cache import cache

    from kernel import wake

    client = redis.Redis.from_url(dj_settings.CELERY_BROKER_URL)
    queue = wake.dispatch_queue()  # the dispatcher's own queue (ops.processes "dispatcher")
    assert queue == f"{_isolated_broker_queue}.dispatch"
    client.delete(queue, _isolated_broker_queue)
    cache.delete(wake.wake_key())
    for _ in range(50):
        wake.dispatch_soon()
    assert client.llen(queue) == 1 and client.llen(_isolated_broker_queue) == 0
    wake.dispatch_started()  # the queued pass begins: the next request queues one more
    wake.dispatch_soon()
    assert client.llen(queue) == 2
    client.delete(queue)
    cache.delete(wake.wake_key())


def test_a_pass_says_when_it_built_a_new_allocator_and_how_long_bringing_the_pool_up_to_date_took(platform):  # noqa: F811
    fresh_pool(node("n1", 4, "NVIDIA A100-SXM4-80GB"))
    open_up()
    submit(platform)
    first = scheduler.run_pass(store=JobStore(), full=True)
    assert first.allocator_built and 0 < first.sync_s <= first.read_s
    submit(platform)
    again = scheduler.run_pass(store=JobStore(), full=True)
    assert not again.allocator_built and again.admitted == 1
    scheduler._workload = None  # the workload's refresh period is over and its mix moved
    submit(platform)
    refreshed = scheduler.run_pass(store=JobStore(), full=True)
    assert refreshed.allocator_built and refreshed.admitted == 1


def test_requested_passes_are_spaced_so_close_submissions_share_one(settings, monkeypatch):
    from kernel import wake

    settings.TRAINYARD_DISPATCH_SPACING_S = 0.3
    monkeypatch.setattr(wake, "_last_pass_began", float("-inf"))
    assert wake.space_passes() == 0.0  # the first pass in a while starts at once
    t0 = time.monotonic()
    waited = wake.space_passes()  # the next one waits out the rest of the spacing
    assert 0.25 <= waited <= 0.3 and time.monotonic() - t0 >= 0.25
    time.sleep(0.35)
    assert wake.space_passes() == 0.0  # passes rarer than the spacing never wait
    settings.TRAINYARD_DISPATCH_SPACING_S = 0
    assert wake.space_passes() == 0.0


def test_live_dispatch_and_the_in_memory_allocator_place_a_trace_identically(platform):  # noqa: F811
    """A small made-up trace (mixed models, shares, multi-card jobs, CPU-heavy jobs) through job_submit and the
    live dispatcher, and through the in-memory Allocator with the same workload: placement by placement."""
    specs = [
        node("a-0", 8, "NVIDIA A100-SXM4-80GB", cpu=96000, mem=1024 * GIB),
        node("a-1", 8, "NVIDIA A100-SXM4-80GB", cpu=64000, mem=512 * GIB),
        node("v-0", 4, "Tesla V100-SXM2-32GB", mib=32 * GIB, cpu=32000, mem=256 * GIB),
        node("v-1", 2, "Tesla V100-SXM2-32GB", mib=32 * GIB, cpu=16000, mem=128 * GIB),
        node("t-0", 2, "Tesla T4", mib=16 * GIB, cpu=24000, mem=96 * GIB),
    ]
    fresh_pool(*specs)
    open_up(explicit=True)
    rng = random.Random(7)
    jobs = []
    for i in range(70):
        kind = rng.random()
        models = rng.choice([[], [], ["A100"], ["Tesla V100-SXM2-32GB", "Tesla T4"]])
        if kind < 0.5:
            milli = rng.choice([250, 300, 500, 750])
            data = {"spec": None, "gpu_milli": milli, "gpu_memory_mib": rng.choice([2048, 8192, 12288])}
            data.update(cpu_milli=rng.choice([2000, 4000, 12000]), memory_mib=rng.choice([8192, 32768]))
        elif kind < 0.8:
            data = {"spec": None, "gpu_milli": 1000, "gpu_memory_mib": 16 * GIB, "cpu_milli": rng.choice([4000, 30000])}
        else:
            data = {"spec": "guaranteed", "gpus": rng.choice([2, 4])}
        if models:
            data["gpu_models"] = models
        jobs.append(submit(platform, name=f"trace-{i}", **data))

    pool = current()
    job_store = JobStore()
    backlog = job_store.backlog(queue_ids=None)
    pool.sync(lambda p: scheduler.workload(job_store, p))
    weights = dict(pool.workload.weights)
    waiting = [w for line in backlog.waiting.values() for w in line]

    nodes = [
        policy.Node.empty(s.name, len(s.gpus), s.cpu_milli, s.memory_mib, s.gpus[0].model, s.gpus[0].memory_mib)
        for s in sorted(specs, key=lambda s: s.name)
    ]
    alloc = policy.Allocator(nodes, "fgd", policy.Workload(weights))
    expected = {}
    for w in waiting:
        models = pool.resolve_models(w.gpu_models) if w.gpu_models else None
        placement = alloc.place(scheduler.request_of(w, models))
        expected[w.id] = None if placement is None else [(placement.node, i) for i in placement.gpu_indices]

    scheduler.reset()
    store.dispatch()
    live = {}
    for job in Job.objects.filter(pk__in=[j.pk for j in jobs]):
        live[job.id] = placed_on(job) if job.state == "admitted" else None
    assert sum(1 for v in live.values() if v) >= 12 and any(v is None for v in live.values())
    mismatches = [(str(k)[:8], expected[k], live[k]) for k in expected if expected[k] != live[k]]
    assert not mismatches
    assert GPU.objects.count() == 24


def test_a_pass_after_new_arrivals_only_decides_for_them_and_falls_back_when_anything_else_changed(platform):  # noqa: F811
    from jobs.store import dispatch

    fresh_pool(node("n0", 2, "NVIDIA A100-SXM4-80GB"))
    open_up()
    empty = dispatch()  # nothing waits: the pass remembers an empty backlog
    assert empty.admitted == 0 and empty.waiting == 0
    first = submit(platform, gpus=2)
    waiting = [submit(platform, gpus=2) for _ in range(3)]
    full = dispatch()
    assert not full.fast and full.admitted == 1
    assert [Job.objects.get(pk=j.pk).queue_position for j in waiting] == [1, 2, 3]

    late = submit(platform, gpus=2)
    with CaptureQueriesContext(connection) as queries:
        quick = dispatch()
    assert quick.fast and quick.admitted == 0 and quick.waiting == 1
    assert Job.objects.get(pk=late.pk).queue_position == 4 and Job.objects.get(pk=late.pk).reason == "no_capacity"
    assert not any("cluster_gpu" in q["sql"] or "cluster_logicaldevice" in q["sql"] for q in queries.captured_queries)
    assert dispatch().fast  # nothing new: nothing to decide

    # New arrivals are told apart by id, not by a window of submission times.
    slow = submit(platform, gpus=2)
    after = dispatch()
    assert after.fast and after.waiting == 1 and Job.objects.get(pk=slow.pk).queue_position == 5
    lifecycle.job_cancel(job_id=slow.id, actor="test")

    lifecycle.job_cancel(job_id=waiting[0].id, actor="test")  # a waiting job leaves: every place behind it moves
    moved = dispatch()
    assert not moved.fast
    assert [Job.objects.get(pk=j.pk).queue_position for j in [*waiting[1:], late]] == [1, 2, 3]

    urgent = submit(platform, gpus=2, priority=50)  # jumps the line: everyone's place changes
    jumped = dispatch()
    assert jumped.fast and jumped.resumed == 3  # decided with the three it went ahead of, no line read
    assert Job.objects.get(pk=urgent.pk).queue_position == 1

    lifecycle.job_cancel(job_id=first.id, actor="test")  # a release: capacity comes back
    released = dispatch()
    assert not released.fast and released.admitted == 1
    assert Job.objects.get(pk=urgent.pk).state == "admitted"

    Queue.objects.filter(name="train").update(state="closed")  # an admin edit
    closed = submit(platform, gpus=2)
    assert not dispatch().fast
    assert Job.objects.get(pk=closed.pk).reason == "queue_closed"


def test_a_fast_pass_finds_a_job_whose_transaction_began_before_the_last_pass_and_committed_after(platform):  # noqa: F811
    """A submission that commits late: its transaction wrote the row before a pass read the lines and committed
    after it. The next fast pass reads from the oldest transaction running at the last read, so it still finds it."""
    import threading

    from django.db import transaction

    from jobs.store import dispatch

    fresh_pool(node("n0", 2, "NVIDIA A100-SXM4-80GB"))
    open_up()
    submit(platform, gpus=2)
    assert dispatch().admitted == 1  # the node is full from here on
    inserted, release, done = threading.Event(), threading.Event(), {}

    def late_submission() -> None:
        try:
            with transaction.atomic():
                done["job"] = submit(platform, gpus=2, priority=-1)  # behind the on-time one: still the end
                inserted.set()
                release.wait(30)
        finally:
            connection.close()

    writer = threading.Thread(target=late_submission)
    writer.start()
    assert inserted.wait(30)
    on_time = submit(platform, gpus=2)
    first = dispatch()  # sees the on-time job; the late one is not committed yet
    assert first.fast and first.waiting == 1 and Job.objects.get(pk=on_time.pk).reason == "no_capacity"
    release.set()
    writer.join(30)
    late = done["job"]
    second = dispatch()
    assert second.fast and second.waiting == 1, second
    assert Job.objects.get(pk=late.pk).reason == "no_capacity"
    assert Job.objects.get(pk=late.pk).queue_position == 2
    assert dispatch().fast and dispatch().waiting == 0  # nothing new after that


def _write_queries(count: int, platform) -> list[str]:  # noqa: F811
    """The statements of the pass that admits `count` quarter-card shares, from the pool lock to the commit."""
    Job.objects.filter(state__in=("pending", "admitted")).delete()
    LogicalDevice.objects.all().delete()
    scheduler.reset()
    train = open_up(explicit=True)
    data = {"spec": None, "gpu_milli": 250, "gpu_memory_mib": 2048, "cpu_milli": 1000, "memory_mib": 1024}
    jobs = [submit(platform, **data) for _ in range(count)]
    with CaptureQueriesContext(connection) as queries:
        assert store.dispatch(queue_ids=[train.id]).admitted == count
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], state="admitted").count() == count
    sql = [q["sql"] for q in queries.captured_queries]
    begin = next(i for i, s in enumerate(sql) if "pg_advisory_xact_lock" in s)
    return sql[begin : sql.index("COMMIT", begin) + 1]


def test_the_write_of_a_pass_runs_the_same_few_statements_for_one_admission_or_thirty(platform):  # noqa: F811
    fresh_pool(node("n0", 8, "NVIDIA A100-SXM4-80GB"))
    one, thirty = _write_queries(1, platform), _write_queries(30, platform)
    assert len(one) == len(thirty) <= 12, "\n".join(s[:90] for s in thirty)
    # Every id travels in one array parameter, never as one placeholder per admitted job.
    assert max(s.count("::uuid") - s.count("::uuid[]") for s in thirty) <= 1, "\n".join(s[:200] for s in thirty)


def test_a_reconcile_that_frees_nothing_keeps_the_next_pass_fast(platform):  # noqa: F811
    """The pool's numbers move only when a statement changed rows (cluster/0007): a reconcile that found no leak
    leaves the dispatcher's pool and carried lines as they were, and a later reconcile that frees a slice moves
    them."""
    from cluster.services import pool_reconcile
    from jobs.store import dispatch
    from scheduler.pool import Pool

    fresh_pool(node("n0", 2, "NVIDIA A100-SXM4-80GB"))
    open_up()
    holder = submit(platform, gpus=2)
    submit(platform, gpus=2)
    assert dispatch().admitted == 1
    before = Pool.read_versions()
    report = pool_reconcile()
    assert report.freed == 0 and not report.overcommitted
    assert Pool.read_versions() == before
    submit(platform, gpus=2)
    assert dispatch().fast
    # A leak (the holder's attempt ended without releasing its slices) is freed, and the ledger moves.
    holder.attempts.update(state="lost", ended_at=timezone.now())
    assert Pool.read_versions()[1] != before[1]  # an attempt finishing counts, as before
    moved = Pool.read_versions()
    assert pool_reconcile().freed == 2
    assert Pool.read_versions()[1] != moved[1]


def test_beats_pass_reads_every_line_only_once_the_last_full_read_is_a_period_old(platform, settings, monkeypatch):  # noqa: F811
    from jobs import tasks

    settings.TRAINYARD_FULL_PASS_EVERY_S = 300.0
    fresh_pool(node("n1", 1, "NVIDIA A100-SXM4-80GB"))
    open_up()
    reads = []
    real = JobStore.backlog
    monkeypatch.setattr(JobStore, "backlog", lambda self, **kw: reads.append(kw) or real(self, **kw))
    first, second = submit(platform), submit(platform)
    assert tasks.dispatch_all() == 1  # no carry yet: every line is read
    assert len(reads) == 1
    third = submit(platform)
    assert tasks.dispatch_all() == 0  # nothing but a newcomer changed, and the last full read is recent
    assert len(reads) == 1
    assert Job.objects.get(pk=third.pk).queue_position == 2  # decided all the same, behind the second
    monkeypatch.setattr(scheduler, "_last_full", time.monotonic() - 301)
    tasks.dispatch_all()
    assert len(reads) == 2  # the period is over: every line again
    tasks.dispatch_all(full=True)  # asked for (the benchmark's backlog phase)
    assert len(reads) == 3
    lifecycle.job_cancel(job_id=first.pk, actor="test")  # a release: the carried lines are decided again, unread
    tasks.dispatch_all()
    assert len(reads) == 3 and Job.objects.get(pk=second.pk).state == "admitted"
    assert Job.objects.get(pk=third.pk).queue_position == 1


def _told() -> dict:
    """Every job's state, reason and place, as the rows say."""
    return {j.pk: (j.state, j.reason, j.queue_position) for j in Job.objects.all()}


def test_a_release_or_a_jump_decides_the_carried_lines_again_without_reading_them(platform, monkeypatch):  # noqa: F811
    """After a release (capacity and quota come back) the pass decides every carried line again, with the quota in
    use read anew, and reads no line; after a newcomer that goes ahead of waiting jobs, it decides the jobs behind
    it again. Either way a full read afterwards finds nothing to change. A job that leaves its line still makes the
    next pass read every line."""
    from jobs.store import dispatch

    fresh_pool(node("n0", 2, "NVIDIA A100-SXM4-80GB"), node("n1", 2, "NVIDIA A100-SXM4-80GB"))
    open_up()
    Team.objects.filter(slug="demo").update(max_running_jobs=2)  # the team's quota, not the cards, binds first
    reads = []
    real = JobStore.backlog
    monkeypatch.setattr(JobStore, "backlog", lambda self, **kw: reads.append(kw) or real(self, **kw))
    running = [submit(platform, gpus=2) for _ in range(2)]
    line = [submit(platform, gpus=2) for _ in range(3)]
    assert dispatch().admitted == 2 and len(reads) == 1
    assert [_told()[j.pk][1:] for j in line] == [("team_job_limit", i) for i in (1, 2, 3)]
    newcomer = submit(platform, gpus=2)
    assert dispatch().fast and _told()[newcomer.pk][2] == 4

    lifecycle.job_cancel(job_id=running[0].id, actor="test")  # one running job ends: quota and two cards return
    released = dispatch()
    assert released.redecided and not released.fast and released.admitted == 1 and len(reads) == 1
    assert Job.objects.get(pk=line[0].pk).state == "admitted"
    assert [_told()[j.pk][1:] for j in [*line[1:], newcomer]] == [("team_job_limit", i) for i in (1, 2, 3)]
    before = _told()
    assert not dispatch(full=True).admitted and _told() == before and len(reads) == 2  # nothing left to change

    urgent = submit(platform, gpus=2, priority=50)  # goes ahead of every waiting job
    jumped = dispatch()
    assert jumped.fast and jumped.resumed == 3 and len(reads) == 2  # the three behind it are decided again
    assert [_told()[j.pk][2] for j in [urgent, *line[1:], newcomer]] == [1, 2, 3, 4]
    before = _told()
    assert not dispatch(full=True).admitted and _told() == before

    lifecycle.job_cancel(job_id=running[1].id, actor="test")
    also = submit(platform, gpus=2)  # joins during the release: decided with the rest, at the end
    again = dispatch()
    assert again.redecided and again.admitted == 1 and Job.objects.get(pk=urgent.pk).state == "admitted"
    assert [_told()[j.pk][2] for j in [*line[1:], newcomer, also]] == [1, 2, 3, 4]
    assert len(reads) == 3

    lifecycle.job_cancel(job_id=line[1].id, actor="test")  # a waiting job leaves its line: every line is read
    left = dispatch()
    assert not left.redecided and not left.fast and len(reads) == 4
    assert [_told()[j.pk][2] for j in [line[2], newcomer, also]] == [1, 2, 3]


@pytest.mark.parametrize("ordering", ["fifo", "backfill"])
def test_a_newcomer_that_goes_ahead_of_waiting_jobs_decides_only_those_behind_it_again(platform, monkeypatch, ordering):  # noqa: F811
    """Submissions stamped in one order often commit in the other, so a newcomer goes ahead of a job already waiting.
    The pass decides it with the carried jobs behind it, from where the line stood before them (a strict FIFO line
    blocked by the waiting job ahead), and reads no line; a full read afterwards finds nothing to change."""
    from jobs.store import dispatch

    fresh_pool(node("n0", 2, "NVIDIA A100-SXM4-80GB"))
    open_up(ordering=ordering)
    reads = []
    real = JobStore.backlog
    monkeypatch.setattr(JobStore, "backlog", lambda self, **kw: reads.append(kw) or real(self, **kw))
    running = submit(platform, gpus=2)
    assert dispatch().admitted == 1 and len(reads) == 1
    head, tail = submit(platform, gpus=1, priority=20), submit(platform, gpus=1)
    both = dispatch()
    assert both.fast and both.resumed == 0 and both.waiting == 2  # they joined an empty line
    behind = "behind_earlier_job" if ordering == "fifo" else "no_capacity"
    assert [_told()[j.pk] for j in (head, tail)] == [("pending", "no_capacity", 1), ("pending", behind, 2)]

    middle = submit(platform, gpus=1, priority=10)  # between the two
    between = dispatch()
    assert between.fast and between.resumed == 1 and between.waiting == 2 and len(reads) == 1  # itself and tail
    assert [_told()[j.pk] for j in (head, middle, tail)] == [
        ("pending", "no_capacity", 1),
        ("pending", behind, 2),
        ("pending", behind, 3),
    ]
    before = _told()
    assert not dispatch(full=True).admitted and _told() == before and len(reads) == 2

    first = submit(platform, gpus=1, priority=50)  # ahead of every waiting job: the line starts unblocked
    ahead = dispatch()
    assert ahead.fast and ahead.resumed == 3 and len(reads) == 2
    assert _told()[first.pk] == ("pending", "no_capacity", 1)
    assert [_told()[j.pk][1] for j in (head, middle, tail)] == [behind, behind, behind]
    before = _told()
    assert not dispatch(full=True).admitted and _told() == before

    lifecycle.job_cancel(job_id=running.id, actor="test")  # two cards free: the first two in line go
    assert dispatch().admitted == 2
    assert [Job.objects.get(pk=j.pk).state for j in (first, head, middle, tail)] == ["admitted"] * 2 + ["pending"] * 2
    before = _told()
    assert not dispatch(full=True).admitted and _told() == before


def test_beats_pass_keeps_the_quota_use_log_short_when_it_reads_no_line(platform, settings):  # noqa: F811
    from jobs import tasks

    settings.TRAINYARD_FULL_PASS_EVERY_S = 300.0
    fresh_pool(node("n1", 1, "NVIDIA A100-SXM4-80GB"))
    open_up()
    submit(platform), submit(platform)
    tasks.dispatch_all()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO trainyard_quota_use (queue_id, team_id, owner_id, gpu_milli, gpu_memory_mib, cpu_milli, "
            "memory_mib, jobs) SELECT queue_id, team_id, owner_id, 0, 0, 0, 0, 0 FROM trainyard_quota_use, "
            "generate_series(1, 300)"
        )
    submit(platform)
    tasks.dispatch_all()  # a fast pass: it read no line, so the task folds the log itself
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), count(DISTINCT (queue_id, team_id, owner_id)) FROM trainyard_quota_use")
        rows, keys = cursor.fetchone()
    assert rows == keys == 1


def test_a_release_committed_while_a_pass_writes_leaves_the_next_pass_deciding_the_carried_lines(platform, monkeypatch):  # noqa: F811
    """A slice released between a pass's read of the ledger and its write leaves the pool's ledger unknown (read
    again next time); the waiting lines still hold, so the next pass decides them again without reading them."""
    import threading

    from jobs.store import dispatch

    fresh_pool(node("n0", 2, "NVIDIA A100-SXM4-80GB"), node("n1", 2, "NVIDIA A100-SXM4-80GB"))
    open_up()
    first, second, *line = [submit(platform, gpus=2) for _ in range(4)]
    assert dispatch().admitted == 2
    reads = []
    real_backlog = JobStore.backlog
    monkeypatch.setattr(JobStore, "backlog", lambda self, **kw: reads.append(kw) or real_backlog(self, **kw))
    real_lock = scheduler.pool_lock

    def lock_after_a_release() -> None:
        monkeypatch.setattr(scheduler, "pool_lock", real_lock)  # once
        elsewhere = threading.Thread(
            target=lambda: (lifecycle.job_cancel(job_id=second.id, actor="test"), connection.close())
        )
        elsewhere.start()
        elsewhere.join(30)
        real_lock()

    monkeypatch.setattr(scheduler, "pool_lock", lock_after_a_release)
    lifecycle.job_cancel(job_id=first.id, actor="test")
    during = dispatch()  # admits line[0]; second's release commits before its write
    assert during.redecided and during.admitted == 1 and Job.objects.get(pk=second.pk).state == "cancelled"
    assert current().ledger_version is None
    after = dispatch()
    assert after.redecided and after.admitted == 1 and not reads
    assert Job.objects.get(pk=line[1].pk).state == "admitted"


def test_a_release_where_a_failed_shape_cannot_fit_does_not_try_it_again(platform):  # noqa: F811
    """A shape that found no place keeps failing until a node with room for it changes: a card freed on a node too
    small for it costs no placement; a release on a node it fits is tried and admitted."""
    from jobs.store import dispatch

    fresh_pool(node("n0", 2, "NVIDIA A100-SXM4-80GB"), node("n1", 1, "NVIDIA A100-SXM4-80GB"))
    open_up()
    pair, single = submit(platform, gpus=2), submit(platform, gpus=1)
    assert dispatch().admitted == 2
    waiting = submit(platform, gpus=2)
    first = dispatch()
    assert first.placement_calls == 1 and first.waiting == 1
    lifecycle.job_cancel(job_id=single.id, actor="test")  # one card free, on the one-card node
    small = dispatch()
    assert small.redecided and small.placement_calls == 0 and small.shape_hits == 1 and small.admitted == 0
    lifecycle.job_cancel(job_id=pair.id, actor="test")  # the two-card node frees: the shape is tried again
    big = dispatch()
    assert big.placement_calls == 1 and big.admitted == 1
    assert Job.objects.get(pk=waiting.pk).state == "admitted"


def test_a_place_in_the_line_is_its_rank_when_read_and_a_release_rewrites_no_waiting_row(platform):  # noqa: F811
    """Places are not stored (docs/scheduler.md, step 4): a job is ranked in its line's order when read, the
    dispatcher's own order (preemptible last, then priority, then age), so it is right before any pass and after a
    release without the pass writing the rows of the jobs that moved up."""
    from rest_framework.test import APIClient

    from jobs.store import dispatch

    Queue.objects.filter(name="train").update(max_member_priority=100, allow_preemptible=True)
    fresh_pool(node("n0", 2, "NVIDIA A100-SXM4-80GB"))
    open_up()
    held = [submit(platform, gpus=1) for _ in range(2)]
    assert dispatch().admitted == 2
    spare = submit(platform, gpus=1, preemptible=True, priority=90)
    line = [submit(platform, gpus=1) for _ in range(4)]
    urgent = submit(platform, gpus=1, priority=50)
    # Ranked before the dispatcher saw them: the preemptible job last whatever its priority, the urgent one first.
    expected = [urgent, *line, spare]
    assert [Job.objects.get(pk=j.pk).queue_position for j in expected] == [1, 2, 3, 4, 5, 6]
    assert selectors.queue_positions([j.id for j in expected]) == {j.id: i for i, j in enumerate(expected, 1)}
    assert Job.objects.get(pk=held[0].pk).queue_position is None  # admitted: no place
    dispatch(full=True)
    assert {Job.objects.get(pk=j.pk).reason for j in expected} == {"no_capacity"}

    assert spare.queue_position == 6
    lifecycle.job_cancel(job_id=held[0].id, actor="test")  # a release: the head goes, everyone behind moves up
    with CaptureQueriesContext(connection) as queries:
        released = dispatch()
    assert released.admitted == 1 and Job.objects.get(pk=urgent.pk).state == "admitted"
    writes = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith("UPDATE")]
    assert not any('"jobs_job"' in s or "jobs_job AS j SET reason" in s for s in writes), writes
    assert [Job.objects.get(pk=j.pk).queue_position for j in [*line, spare]] == [1, 2, 3, 4, 5]
    assert spare.queue_position == 6  # ranked once, when first read (before the release) ...
    spare.refresh_from_db()
    assert spare.queue_position == 5  # ... and again after a refresh

    # A page of the API ranks its jobs in one query, however many of them wait.
    client = APIClient()
    client.force_authenticate(platform)
    with CaptureQueriesContext(connection) as few:
        client.get("/api/v1/jobs/?state=pending")
    for _ in range(6):
        submit(platform, gpus=1)
    with CaptureQueriesContext(connection) as more:
        page = client.get("/api/v1/jobs/?state=pending").json()["results"]
    assert len(more.captured_queries) == len(few.captured_queries)
    places = sorted(row["queue_position"] for row in page)
    assert places == list(range(1, 12))
    assert client.get(f"/api/v1/jobs/{spare.id}/").json()["queue_position"] == 11  # the six went ahead of it


def test_jobs_of_one_kind_are_held_by_the_quota_their_earlier_twins_used_in_the_same_pass(platform):  # noqa: F811
    """Four identical whole-card jobs against a team quota of two cards: the pass admits two and leaves the other two
    waiting for the team's quota, charged as it goes (a pass that reused what the rules said of the first twin would
    be refused by the write's check in the database, three times, and raise)."""
    fresh_pool(node("n1", 8, "A100"))
    open_up()
    Team.objects.filter(slug="demo").update(gpu_milli=2000)
    jobs = [submit(platform) for _ in range(4)]
    report = scheduler.run_pass(store=JobStore())
    assert report.admitted == 2 and report.refused == 0
    states = {j.pk: (j.state, j.reason) for j in Job.objects.filter(pk__in=[j.pk for j in jobs])}
    assert sorted(s for s, _ in states.values()) == ["admitted", "admitted", "pending", "pending"]
    assert [r for s, r in states.values() if s == "pending"] == [scheduler.TEAM_QUOTA] * 2
