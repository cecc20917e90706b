"""Several dispatching processes on one ledger, as `make run` and `k8s/worker.yaml` deploy them: no card, node or
quota is ever booked past what it holds, whichever process decides and however stale its pool in memory is."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pytest
from django.conf import settings as django_settings
from django.db import connection, transaction

from cluster.models import LogicalDevice, Node
from jobs import lifecycle
from jobs.models import Job
from jobs.store import JobStore
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from quotas.models import Team
from scheduler import dispatch as scheduler
from scheduler.pool import Pool, overbooked
from scheduler.tests.test_dispatch import fresh_pool, node, open_up, submit

pytestmark = pytest.mark.django_db(transaction=True)
A100 = "NVIDIA A100-SXM4-80GB"


@pytest.fixture(autouse=True)
def _forget_pool():
    scheduler.reset()
    yield
    scheduler.reset()


def ledger_problems() -> list[str]:
    nodes = list(Node.objects.values_list("id", flat=True))
    return overbooked(node_ids=nodes, host_node_ids=nodes)


def card_milli() -> dict[str, int]:
    out: dict[str, int] = {}
    for uuid, milli in LogicalDevice.objects.filter(
        released_at__isnull=True, attempt__state__in=["placed", "starting", "running"]
    ).values_list("gpu__uuid", "compute_milli"):
        out[uuid] = out.get(uuid, 0) + milli
    return out


def test_two_pools_never_book_a_card_twice_when_one_pools_workload_expires(platform, settings):  # noqa: F811
    # The reproduction from the issue: B admits 1, A admits 2, B's workload expires, B admits a share (job 3).
    fresh_pool(node("n1", 1, A100), node("n2", 1, A100))
    open_up()
    settings.TRAINYARD_WORKLOAD_REFRESH_S = 3600
    a, b = Pool(), Pool()
    first = submit(platform)
    assert scheduler.run_pass(store=JobStore(), pool=b, full=True).admitted == 1
    second = submit(platform)
    assert scheduler.run_pass(store=JobStore(), pool=a, full=True).admitted == 1
    settings.TRAINYARD_WORKLOAD_REFRESH_S = 0  # B's next pass builds a new workload (a new shape arrived)
    third = submit(platform, spec="shared")
    report = scheduler.run_pass(store=JobStore(), pool=b, full=True)
    assert report.admitted == 0
    assert Job.objects.get(pk=third.pk).reason == "no_capacity"
    assert {Job.objects.get(pk=j.pk).state for j in (first, second)} == {"admitted"}
    assert max(card_milli().values()) == 1000
    assert ledger_problems() == []


def test_the_database_refuses_a_pass_decided_on_a_stale_pool_and_the_pass_retries(platform, settings):  # noqa: F811
    # Whatever the cause of a stale view (here: B is told it has read a ledger it has not), the write's own check
    # in the database refuses it, nothing of it is committed, and the pass re-reads and places correctly.
    fresh_pool(node("n1", 1, A100), node("n2", 1, A100))
    open_up()
    a, b = Pool(), Pool()
    submit(platform)
    assert scheduler.run_pass(store=JobStore(), pool=b, full=True).admitted == 1
    submit(platform)
    assert scheduler.run_pass(store=JobStore(), pool=a, full=True).admitted == 1
    b.ledger_version = Pool.read_versions()[1]  # B believes it is current; its nodes still show n2 free
    late = submit(platform, spec="shared")
    report = scheduler.run_pass(store=JobStore(), pool=b, full=True)
    assert report.refused == 1  # the first write was refused by the database ...
    assert report.admitted == 0  # ... and the retry, on a fresh read, found no room
    assert Job.objects.get(pk=late.pk).state == "pending"
    assert ledger_problems() == []
    # A card coming free is then used normally by the same pool.
    lifecycle.job_cancel(job_id=Job.objects.filter(state="admitted").first().id, actor="test")
    assert scheduler.run_pass(store=JobStore(), pool=b, full=True).admitted == 1
    assert ledger_problems() == []


def test_the_quota_check_in_the_write_counts_the_rows_not_the_pass(platform):  # noqa: F811
    fresh_pool(node("n1", 4, A100))
    open_up()
    jobs = [submit(platform) for _ in range(2)]
    assert scheduler.run_pass(store=JobStore(), full=True).admitted == 2
    Team.objects.filter(slug="demo").update(max_running_jobs=1, max_jobs_per_user=1)
    with transaction.atomic():
        problems = JobStore().over_quota({jobs[1].id})
    assert any(p.startswith("team demo:") and "2/1 jobs" in p for p in problems), problems
    assert any(p.startswith("user ") and "2/1 jobs" in p for p in problems), problems
    Team.objects.filter(slug="demo").update(max_running_jobs=10, max_jobs_per_user=10)
    with transaction.atomic():
        assert JobStore().over_quota({jobs[1].id}) == []


def _stopped(process: subprocess.Popen) -> str:
    """Stop a Celery process started by a test; its output."""
    process.terminate()
    try:
        out, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        out, _ = process.communicate()
    return out.decode("utf-8", "replace")


def _worker_env(queue: str) -> dict[str, str]:
    db = connection.settings_dict
    url = f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(
        DATABASE_URL=url,
        REDIS_URL=django_settings.REDIS_URL,
        CELERY_BROKER_URL=django_settings.CELERY_BROKER_URL,
        # Admitted attempts are started by a queue nobody consumes: this test is about who books what.
        TRAINYARD_START_QUEUE=f"{queue}-starts",
        # The deployed refresh is 300 s; 0 makes every pass build a new workload, the path that went stale.
        TRAINYARD_WORKLOAD_REFRESH_S="0",
    )
    return env


def _purge(queue: str) -> None:
    """Empty the session's queue before a real worker consumes it: earlier tests of this session left messages
    nobody ran (an image build's `run_build` queued on commit, for a row their rolled-back database no longer has),
    and the worker would run them and log their `DoesNotExist` tracebacks among its own."""
    from trainyard.celery import app

    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(queue)


def test_a_real_prefork_worker_with_four_children_never_books_a_card_twice(platform, settings, _isolated_broker_queue):  # noqa: F811
    from jobs.tasks import dispatch_all

    settings.TRAINYARD_START_QUEUE = f"{_isolated_broker_queue}-starts"
    # Small cards and scarce CPU: whole cards, shares and host CPU all run out, so any stale view over-books.
    fresh_pool(*(node(f"n{i}", 4, A100, cpu=24000) for i in range(4)))
    open_up()
    _purge(_isolated_broker_queue)
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "trainyard", "worker", "--pool", "prefork", "--concurrency", "4"]
        + [
            "-Q",
            _isolated_broker_queue,
            "-l",
            "WARNING",
            "-n",
            f"several-{os.getpid()}@%h",
            "--prefetch-multiplier",
            "1",
        ],
        env=_worker_env(_isolated_broker_queue),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    rng = random.Random(7)
    seen_problems: list[str] = []

    def drain(until, seconds: float = 45.0) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if until():
                return True
            dispatch_all.apply_async(queue=_isolated_broker_queue)
            time.sleep(0.3)
        return until()

    try:
        submit(platform)
        assert drain(lambda: Job.objects.filter(state="admitted").exists()), "the worker admitted nothing"
        for _round in range(12):
            for _ in range(rng.randint(3, 8)):
                submit(platform, spec=rng.choice(["guaranteed", "shared", "performance", "shared"]))
            for _ in range(4):
                dispatch_all.apply_async(queue=_isolated_broker_queue)
            time.sleep(0.6)
            admitted = list(Job.objects.filter(state="admitted").values_list("id", flat=True))
            for job_id in rng.sample(admitted, k=len(admitted) // 3):
                lifecycle.job_cancel(job_id=job_id, actor="test")
            seen_problems += ledger_problems() + [f"{u}: {m} milli" for u, m in card_milli().items() if m > 1000]
        # Everything admitted goes: every child must see the cards come free (a stale pool sees them full).
        for job_id in Job.objects.filter(state="admitted").values_list("id", flat=True):
            lifecycle.job_cancel(job_id=job_id, actor="test")
        for _ in range(16):
            submit(platform, spec=rng.choice(["guaranteed", "shared"]))
        refilled = drain(lambda: Job.objects.filter(state="admitted").count() >= 8)
        seen_problems += ledger_problems() + [f"{u}: {m} milli" for u, m in card_milli().items() if m > 1000]
    finally:
        log = _stopped(worker)
    assert refilled, (Job.objects.filter(state="pending").count(), log[-3000:])
    assert seen_problems == [], seen_problems[:10]
    assert max(card_milli().values()) <= 1000
    assert "Traceback" not in log, log[-3000:]


def test_the_reconcile_frees_leaks_and_flags_overcommit_in_a_few_statements_whatever_the_fleet(platform):  # noqa: F811
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from cluster.models import GPU, PoolRepair
    from cluster.services import pool_reconcile
    from jobs.models import Attempt

    counts = []
    for size in (2, 8):
        scheduler.reset()
        fresh_pool(*(node(f"r{size}-{i}", 4, A100) for i in range(size)))
        open_up()
        jobs = [submit(platform) for _ in range(3)] + [submit(platform, spec="shared")]
        assert scheduler.run_pass(store=JobStore(), full=True).admitted == 4
        # A leak: an attempt that finished without its slices being freed.
        Attempt.objects.filter(job_id=jobs[0].id).update(state="failed", ended_at=timezone.now())
        # An over-commit: a slice written behind the scheduler's back onto a card already held whole.
        held = LogicalDevice.objects.filter(attempt__job_id=jobs[1].id).get()
        LogicalDevice.objects.create(
            gpu=held.gpu, attempt=Attempt.objects.get(job_id=jobs[3].id), compute_milli=500, memory_mib=1024
        )
        # An attempt said to run that the backend does not know.
        Attempt.objects.filter(job_id=jobs[2].id).update(state="running", backend_ref="gone-1")
        with CaptureQueriesContext(connection) as queries:
            report = pool_reconcile(live_backend_refs={"other"})
        counts.append(len(queries))
        assert report.freed == 2
        assert len(report.overcommitted) == 1 and "1500m" in report.overcommitted[0]
        assert PoolRepair.objects.filter(kind="overcommit", gpu=held.gpu).exists()
        assert not LogicalDevice.objects.filter(attempt__job_id=jobs[0].id, released_at__isnull=True).exists()
        assert GPU.objects.count() == size * 4
    assert counts[0] == counts[1] <= 10, counts


def test_wake_ups_and_beat_passes_travel_to_the_dispatchers_queue(_isolated_broker_queue):
    from kernel.wake import BEAT_DISPATCH_TASK, DISPATCH_TASK
    from trainyard.celery import app

    for name in (DISPATCH_TASK, BEAT_DISPATCH_TASK):
        assert app.amqp.router.route({}, name)["queue"].name == f"{_isolated_broker_queue}.dispatch"
    assert app.amqp.router.route({}, "jobs.start_attempts")["queue"].name == _isolated_broker_queue


def _dispatcher(queue: str, **variables: str) -> subprocess.Popen:
    """The dispatcher as `make run` starts it (`ops.processes` "dispatcher"), on this test's queue."""
    from ops import processes

    env = {**_worker_env(queue), "TRAINYARD_CELERY_QUEUE": queue}
    env.update(TRAINYARD_LOG_LEVEL="INFO", TRAINYARD_WORKLOAD_REFRESH_S="300", **variables)
    return subprocess.Popen(
        [sys.executable, "-m", *processes.command("dispatcher", environ=env)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_the_dispatcher_as_make_run_starts_it_keeps_its_pool_warm(platform, settings, _isolated_broker_queue):  # noqa: F811
    """`ops.processes` "dispatcher" (one solo-pool process) runs every wake-up's pass: after the first, each pass
    finds the lines it carried (`fast`), which 4 prefork children sharing the passes could not (each kept its own)."""
    settings.TRAINYARD_START_QUEUE = f"{_isolated_broker_queue}-starts"
    fresh_pool(*(node(f"d{i}", 4, A100) for i in range(2)))
    open_up()
    dispatcher = _dispatcher(_isolated_broker_queue)
    backends: list[set[int]] = []  # the other sessions open on this database after each pass
    try:
        for k in range(6):
            job = submit(platform, spec="shared")  # its commit wakes a pass (kernel.wake.dispatch_soon)
            deadline = time.monotonic() + 60
            while Job.objects.get(id=job.id).state != "admitted":
                assert time.monotonic() < deadline, f"job {k} never admitted"
                time.sleep(0.1)
            time.sleep(0.2)  # the task's end (where Celery used to close every connection)
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                backends.append({row[0] for row in cursor.fetchall()})
    finally:
        log = _stopped(dispatcher)
    # The dispatcher keeps its database connection from pass to pass (settings.CELERY_DB_REUSE_MAX and
    # trainyard/celery.py): one session, open after the first pass and still the same after the last, instead of a
    # new server process for every pass.
    assert backends[0] and all(backends[0] & later for later in backends[1:]), backends
    assert len(set().union(*backends)) <= 2, backends
    passes = [line for line in log.splitlines() if "'event': 'dispatch_pass'" in line]
    assert len(passes) == 6, log[-3000:]
    # The first pass reads everything; every later one is the carried, fast path.
    assert all("'fast': True" in line for line in passes[1:]), passes
    assert "Traceback" not in log, log[-3000:]


def test_a_burst_of_submissions_shares_passes_and_every_job_is_admitted(platform, settings, _isolated_broker_queue):  # noqa: F811
    """Submissions closer together than `TRAINYARD_DISPATCH_SPACING_S` (kernel.wake.space_passes) join the pass that
    is waiting to start instead of each sending and running one of their own."""
    settings.TRAINYARD_START_QUEUE = f"{_isolated_broker_queue}-starts"
    fresh_pool(*(node(f"b{i}", 8, A100) for i in range(2)))
    open_up()
    dispatcher = _dispatcher(_isolated_broker_queue, TRAINYARD_DISPATCH_SPACING_S="0.2")
    try:
        first = submit(platform, spec="shared")  # the dispatcher is up and has run its first pass
        deadline = time.monotonic() + 60
        while Job.objects.get(id=first.id).state != "admitted":
            assert time.monotonic() < deadline, "the first job was never admitted"
            time.sleep(0.1)
        burst = []
        for _ in range(12):
            burst.append(submit(platform, spec="shared"))  # each commit asks for a pass (kernel.wake.dispatch_soon)
            time.sleep(0.02)
        deadline = time.monotonic() + 30
        while Job.objects.filter(id__in=[j.id for j in burst], state="admitted").count() < len(burst):
            assert time.monotonic() < deadline, "the burst was not all admitted"
            time.sleep(0.1)
    finally:
        log = _stopped(dispatcher)
    passes = [line for line in log.splitlines() if "'event': 'dispatch_pass'" in line]
    # 12 submissions over about 0.3 s: the first pass, then at most one per 0.2 s and the one after the last request.
    assert 2 <= len(passes) <= 5, passes
    assert "Traceback" not in log, log[-3000:]


def _slice_reads(queries) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if "FROM cluster_logicaldevice d LEFT JOIN" in q["sql"]]


def test_a_pool_behind_the_ledger_reads_only_the_gpus_that_moved_and_every_slice_after_a_gap(platform):  # noqa: F811
    """Migration cluster/0008: each move of the ledger's number names the GPUs it touched and the number it replaced;
    a pool that finds the chain unbroken re-reads only those GPUs' slices, else every live slice."""
    from django.test.utils import CaptureQueriesContext

    from jobs.models import Attempt

    fresh_pool(*(node(f"n{i}", 2, A100) for i in range(4)))
    open_up()
    a, b = Pool(), Pool()
    jobs = [submit(platform) for _ in range(4)]
    assert scheduler.run_pass(store=JobStore(), pool=a, full=True).admitted == 4
    b.sync(lambda p: scheduler.workload(JobStore(), p))  # B reads the ledger as A left it

    def gpus_of(job) -> set[int]:
        return set(LogicalDevice.objects.filter(attempt__job=job).values_list("gpu_id", flat=True))

    freed = gpus_of(jobs[0])
    lifecycle.job_cancel(job_id=jobs[0].id, actor="test")  # a release: one card's slices
    later = submit(platform, gpus=2)
    with CaptureQueriesContext(connection) as queries:
        report = scheduler.run_pass(store=JobStore(), pool=b, full=True)
    assert report.admitted == 1
    reads = _slice_reads(queries)
    assert len(reads) == 1 and "d.gpu_id = ANY" in reads[0], reads
    fresh = Pool()
    fresh.sync(lambda p: scheduler.workload(JobStore(), p))
    assert {g: u for g, u in b.usage.items() if u.milli} == {g: u for g, u in fresh.usage.items() if u.milli}
    assert len(freed) == 1 and not freed & set(b.usage)  # the released card no longer counts
    assert gpus_of(later) <= {g for g, u in b.usage.items() if u.milli == 1000}

    # A move that names no GPU (an attempt deleted) breaks the chain: the next read takes every live slice.
    Attempt.objects.filter(job=jobs[0]).delete()
    submit(platform)
    with CaptureQueriesContext(connection) as queries:
        scheduler.run_pass(store=JobStore(), pool=b, full=True)
    reads = _slice_reads(queries)
    assert len(reads) == 1 and "d.gpu_id = ANY" not in reads[0]
    assert ledger_problems() == []

    # The chain itself: each row names the number it replaced, and a cancel's row names the card it freed.
    with connection.cursor() as cursor:
        cursor.execute("SELECT version, previous, gpu_ids FROM trainyard_ledger_change ORDER BY version")
        rows = cursor.fetchall()
    assert rows and all(isinstance(ids, list) and ids for _, _, ids in rows)
    assert any(set(ids) == freed for _, _, ids in rows)


def test_the_pool_reconcile_prunes_old_ledger_changes_and_a_pool_that_far_behind_reads_every_slice(platform):  # noqa: F811
    from cluster.services import pool_reconcile

    fresh_pool(node("n0", 2, A100))
    open_up()
    behind = Pool()
    behind.sync(lambda p: scheduler.workload(JobStore(), p))
    job = submit(platform)
    assert scheduler.run_pass(store=JobStore(), pool=Pool(), full=True).admitted == 1
    with connection.cursor() as cursor:
        cursor.execute("UPDATE trainyard_ledger_change SET at = at - interval '1 hour'")
        cursor.execute("SELECT count(*) FROM trainyard_ledger_change")
        assert cursor.fetchone()[0] >= 1
    lifecycle.job_cancel(job_id=job.id, actor="test")  # a fresh row, kept
    pool_reconcile()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*), min(at) > now() - interval '15 minutes' FROM trainyard_ledger_change")
        kept, all_recent = cursor.fetchone()
    assert kept >= 1 and all_recent
    structure, ledger = Pool.read_versions()
    assert behind._changed_gpus(ledger) is None  # its moves were pruned: a gap, so every live slice is read


def test_a_release_committing_during_a_passs_write_is_seen_by_the_next_pass(platform, monkeypatch):  # noqa: F811
    """The write reads the ledger's number with it held to the commit: a release that would commit between that
    read and the write's own move waits for the commit instead, so its move comes after the write's and the next
    pass reads its card as free (otherwise the pool counted it as read and the card looked taken)."""
    import threading

    fresh_pool(node("n0", 1, A100), node("n1", 1, A100))
    open_up()
    pool = Pool()
    running = submit(platform)
    assert scheduler.run_pass(store=JobStore(), pool=pool, full=True).admitted == 1
    freed = set(LogicalDevice.objects.filter(attempt__job=running).values_list("gpu_id", flat=True))
    newcomer = submit(platform)
    real_write = JobStore.write_admissions
    done = threading.Event()

    def write_beside_a_release(self, admissions, now, **kwargs):
        def cancel():
            lifecycle.job_cancel(job_id=running.id, actor="test")
            connection.close()
            done.set()

        threading.Thread(target=cancel, daemon=True).start()
        done.wait(1.0)  # held: the release waits for this write's commit (without the hold it commits now)
        return real_write(self, admissions, now, **kwargs)

    monkeypatch.setattr(JobStore, "write_admissions", write_beside_a_release)
    assert scheduler.run_pass(store=JobStore(), pool=pool, full=True).admitted == 1
    assert done.wait(30)
    monkeypatch.setattr(JobStore, "write_admissions", real_write)
    pool.sync(lambda p: scheduler.workload(JobStore(), p))
    assert Job.objects.get(pk=running.pk).state == "cancelled" and Job.objects.get(pk=newcomer.pk).state == "admitted"
    assert not any(pool.usage.get(g) and pool.usage[g].milli for g in freed), "the freed card still looks taken"


@pytest.mark.parametrize("change", ["card_unhealthy", "node_cordoned"])
def test_a_card_that_fails_while_a_pass_decides_is_not_written_and_the_pass_places_again(platform, monkeypatch, change):  # noqa: F811
    """The health monitor marks a card unhealthy (or an admin cordons its node) after a pass read the pool and
    before its write: the write finds the pool's structure moved, checks its own slices against the cards and
    nodes as they are now, is refused (nothing written), and the retry, on a re-read pool, places the job on the
    other card."""
    import threading

    from cluster.models import GPU
    from cluster.services import gpu_mark_unhealthy, node_cordon

    fresh_pool(node("n0", 1, A100), node("n1", 1, A100))
    open_up()
    pool = Pool()
    pool.sync(lambda p: scheduler.workload(JobStore(), p))
    job = submit(platform)
    real_write = JobStore.write_admissions
    failed: list[str] = []

    def write_after_a_card_fails(self, admissions, now, **kwargs):
        if not failed:
            chosen = admissions[0].slices[0].gpu_id

            def fail():
                card = GPU.objects.get(pk=chosen)
                failed.append(card.uuid)
                if change == "card_unhealthy":
                    gpu_mark_unhealthy(gpu=card, reason="Xid 79 (test)")
                else:
                    node_cordon(node_id=card.node_id, actor="test")
                connection.close()

            thread = threading.Thread(target=fail, daemon=True)
            thread.start()
            thread.join(30)
        return real_write(self, admissions, now, **kwargs)

    monkeypatch.setattr(JobStore, "write_admissions", write_after_a_card_fails)
    report = scheduler.run_pass(store=JobStore(), pool=pool, full=True)
    assert failed and report.refused == 1 and report.admitted == 1, report
    used = list(LogicalDevice.objects.filter(attempt__job=job).values_list("gpu__uuid", flat=True))
    assert used and failed[0] not in used, (used, failed)
    assert not LogicalDevice.objects.filter(gpu__uuid=failed[0]).exists()


def test_a_pass_hands_its_start_messages_over_and_does_not_wait_for_the_broker(platform, monkeypatch):  # noqa: F811
    """Publishing the start messages is not part of the pass: with the broker stalled (the publish blocked until
    the test lets it go), the pass that admitted the jobs returns, a second pass runs meanwhile, and the messages
    of both go out once the broker answers, every admitted attempt in one of them."""
    import threading

    from jobs.models import Attempt
    from jobs.tasks import start_attempts

    fresh_pool(node("n0", 2, A100))
    open_up()
    pool = Pool()
    broker_answers = threading.Event()
    sent: list[int] = []

    def stalled_publish(args, **options):
        broker_answers.wait(60)
        sent.extend(args[0])

    monkeypatch.setattr(start_attempts, "apply_async", stalled_publish)
    first = submit(platform)
    assert scheduler.run_pass(store=JobStore(), pool=pool, full=True).admitted == 1
    second = submit(platform)
    assert scheduler.run_pass(store=JobStore(), pool=pool, full=True).admitted == 1
    assert sent == []  # both passes returned while the broker held the first message
    broker_answers.set()
    expected = sorted(Attempt.objects.filter(job__in=[first, second]).values_list("id", flat=True))
    for _ in range(600):
        if sorted(sent) == expected:
            break
        time.sleep(0.05)
    assert sorted(sent) == expected
