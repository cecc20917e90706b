"""A big pass writes its admissions while it still decides (scheduler.dispatch.WriteAhead), on a second database
connection, in one transaction: the rows are those the one-batch write makes, a refusal or a failure leaves
nothing behind, and a job another transaction holds is passed over, not waited for."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from django.db import connection, transaction

from cluster.models import LogicalDevice
from jobs.models import Attempt, Job, JobEvent
from jobs.store import JobStore
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from quotas.models import Team
from scheduler import dispatch as scheduler
from scheduler.pool import Pool
from scheduler.tests.test_dispatch import fresh_pool, node, open_up, placed_on, submit
from scheduler.tests.test_several_dispatchers import A100, _forget_pool, ledger_problems  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db(transaction=True)


def outcome(jobs: list[Job]) -> list[tuple]:
    """Each job's state, reason and message, the cards it was placed on, and what its attempt and its events say of
    the placement (slice ids aside: they come from a sequence)."""
    out = []
    for job in jobs:
        row = Job.objects.get(pk=job.pk)
        placement = []
        if row.state == "admitted":
            attempt = row.attempts.get()
            placement = [{k: v for k, v in d.items() if k != "slice_id"} for d in attempt.placement["devices"]]
            event = JobEvent.objects.get(job=row, kind="state", to_state="admitted")
            assert event.data == attempt.placement and event.message == row.message and event.attempt_id == attempt.id
            slices = {d.id for d in LogicalDevice.objects.filter(attempt=attempt)}
            assert {d["slice_id"] for d in attempt.placement["devices"]} == slices
        waits = list(JobEvent.objects.filter(job=row, kind="waiting").values_list("message", "data"))
        out.append((row.state, row.reason, row.message, placed_on(job) if placement else [], placement, waits))
    return out


def test_a_pass_written_ahead_makes_the_rows_the_one_batch_write_makes(platform, settings):  # noqa: F811
    settings.TRAINYARD_DISPATCH_WRITE_AHEAD = 0
    fresh_pool(node("n1", 4, A100), node("n2", 4, A100))
    open_up()
    specs = ["guaranteed", "shared", "performance"] * 4 + ["guaranteed"] * 2  # the last two find no room
    jobs = [submit(platform, spec=spec) for spec in specs]
    one_batch = scheduler.run_pass(store=JobStore(), full=True)
    assert not one_batch.written_ahead
    expected = outcome(jobs)
    assert sum(1 for state, *_ in expected if state == "admitted") == one_batch.admitted == 12
    assert [reason for _, reason, *_ in expected[-2:]] == ["no_capacity"] * 2
    assert all(len(waits) == 1 for *_, waits in expected[-2:])

    # The same submissions on a fresh ledger, written three at a time while the pass decides.
    Job.objects.all().delete()
    fresh_pool(node("n1", 4, A100), node("n2", 4, A100))
    scheduler.reset()
    settings.TRAINYARD_DISPATCH_WRITE_AHEAD = 3
    jobs = [submit(platform, spec=spec) for spec in specs]
    switch = sys.getswitchinterval()
    report = scheduler.run_pass(store=JobStore(), full=True)
    assert report.written_ahead and report.admitted == 12
    assert report.waits_s == 0  # the reasons were written in the write's own transaction
    assert report.lock_s > 0
    assert sys.getswitchinterval() == switch
    assert outcome(jobs) == expected
    assert Attempt.objects.count() == 12
    assert JobEvent.objects.filter(kind="state", to_state="admitted").count() == 12
    assert LogicalDevice.objects.filter(released_at__isnull=True).count() == 12
    assert ledger_problems() == []
    # The pool in memory is current after its own write: the next pass needs no read of the ledger.
    pool = scheduler.current()
    assert (pool.structure_version, pool.ledger_version) == Pool.read_versions()


def test_a_refused_batch_written_ahead_leaves_nothing_and_the_pass_retries(platform, settings):  # noqa: F811
    # B is told it has read a ledger it has not (its nodes still show n1's card free): the write of B's pass, one
    # admission a batch, reaches the card A took, the database refuses it, and the batches already written roll
    # back with it. The retry, on a fresh read, admits what fits.
    settings.TRAINYARD_DISPATCH_WRITE_AHEAD = 1
    fresh_pool(node("n1", 1, A100), node("n2", 1, A100), node("n3", 1, A100))
    open_up()
    a, b = Pool(), Pool()
    b.sync(lambda p: scheduler.workload(JobStore(), p))
    taken = submit(platform)
    assert scheduler.run_pass(store=JobStore(), pool=a, full=True).admitted == 1
    b.ledger_version = Pool.read_versions()[1]
    late = [submit(platform) for _ in range(3)]
    report = scheduler.run_pass(store=JobStore(), pool=b, full=True)
    assert report.refused == 1
    assert report.admitted == 2
    assert Attempt.objects.count() == 3  # A's and the retry's: nothing of the refused write
    assert JobEvent.objects.filter(kind="state", to_state="admitted").count() == 3
    assert sorted(Job.objects.get(pk=j.pk).state for j in late) == ["admitted", "admitted", "pending"]
    assert Job.objects.get(pk=taken.pk).state == "admitted"
    assert ledger_problems() == []


def test_a_pass_that_fails_while_deciding_rolls_back_what_it_wrote_ahead(platform, settings, monkeypatch):  # noqa: F811
    settings.TRAINYARD_DISPATCH_WRITE_AHEAD = 1
    fresh_pool(node("n1", 4, A100))
    open_up()
    jobs = [submit(platform) for _ in range(4)]
    real, calls = scheduler._decide, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # two admissions already handed to the writer
            raise RuntimeError("decision failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(scheduler, "_decide", failing)
    with pytest.raises(RuntimeError, match="decision failed"):
        scheduler.run_pass(store=JobStore(), full=True)
    assert Attempt.objects.count() == 0
    assert {Job.objects.get(pk=j.pk).state for j in jobs} == {"pending"}
    monkeypatch.setattr(scheduler, "_decide", real)
    # Neither the pool lock nor the pass lock was left held: the next pass admits all four.
    scheduler.reset()
    assert scheduler.run_pass(store=JobStore(), full=True).admitted == 4
    assert ledger_problems() == []


def test_a_job_another_transaction_holds_is_passed_over_not_waited_for(platform, settings):  # noqa: F811
    settings.TRAINYARD_DISPATCH_WRITE_AHEAD = 1
    fresh_pool(node("n1", 4, A100))
    open_up()
    jobs = [submit(platform) for _ in range(3)]
    held, release, done = threading.Event(), threading.Event(), threading.Event()

    def hold_row():
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(pk=jobs[1].pk)
                held.set()
                release.wait(30)
        finally:
            connection.close()
            done.set()

    holder = threading.Thread(target=hold_row)
    holder.start()
    assert held.wait(10)
    try:
        report = scheduler.run_pass(store=JobStore(), full=True)
    finally:
        release.set()
        holder.join(10)
    assert report.admitted == 2
    assert [Job.objects.get(pk=j.pk).state for j in jobs] == ["admitted", "pending", "admitted"]
    assert ledger_problems() == []
    # Its card was given back in memory: once the row is free the next pass admits it beside the others.
    assert scheduler.run_pass(store=JobStore(), full=True).admitted == 1
    assert ledger_problems() == []
    assert LogicalDevice.objects.filter(released_at__isnull=True).count() == 3


def test_no_write_ahead_inside_a_callers_transaction(platform, settings):  # noqa: F811
    # A second connection could not see the caller's uncommitted rows: the pass writes in the caller's transaction.
    settings.TRAINYARD_DISPATCH_WRITE_AHEAD = 1
    fresh_pool(node("n1", 2, A100))
    open_up()
    with transaction.atomic():
        jobs = [submit(platform) for _ in range(2)]
        assert scheduler.WriteAhead.for_pass(JobStore(), scheduler.current()) is None
    assert scheduler.WriteAhead.for_pass(JobStore(), scheduler.current()) is not None
    settings.TRAINYARD_DISPATCH_WRITE_AHEAD = 0
    assert scheduler.WriteAhead.for_pass(JobStore(), scheduler.current()) is None
    assert {Job.objects.get(pk=j.pk).state for j in jobs} == {"pending"}


def test_a_refusal_after_batches_were_written_rolls_back_every_batch(platform, settings, monkeypatch):  # noqa: F811
    # The database's check refuses once it sees two batches written (as it would a card booked by another process
    # meanwhile): the batches written are rolled back with it, and the retry writes all three once.
    settings.TRAINYARD_DISPATCH_WRITE_AHEAD = 1
    fresh_pool(node("n1", 4, A100))
    open_up()
    jobs = [submit(platform) for _ in range(3)]
    real, seen = scheduler.overbooked, []

    def refusing_once_two_are_written(**kwargs):
        seen.append(Attempt.objects.count())  # run on the writer's connection: its own uncommitted rows count
        if seen[-1] >= 2 and len([n for n in seen if n >= 2]) == 1:
            return ["card GPU-n1-0: refused for the test"]
        return real(**kwargs)

    monkeypatch.setattr(scheduler, "overbooked", refusing_once_two_are_written)
    report = scheduler.run_pass(store=JobStore(), full=True)
    assert report.refused == 1 and report.admitted == 3
    assert Attempt.objects.count() == 3
    assert JobEvent.objects.filter(kind="state", to_state="admitted").count() == 3
    assert {Job.objects.get(pk=j.pk).state for j in jobs} == {"admitted"}
    assert ledger_problems() == []


def test_a_writer_behind_the_pass_checks_its_batches_in_one_query(platform, settings, monkeypatch):  # noqa: F811
    # The writer is slow with its first batch, so the pass hands over the other three and its plan meanwhile: the
    # ledger is then asked once, about every node the four batches used, instead of once per batch.
    settings.TRAINYARD_DISPATCH_WRITE_AHEAD = 1
    fresh_pool(*(node(f"n{i}", 1, A100) for i in range(4)))
    open_up()
    jobs = [submit(platform) for _ in range(4)]
    real_write, real_check, asked = JobStore.write_admissions, scheduler.overbooked, []

    def slow_first(self, admissions, now, **kwargs):
        if not asked and not getattr(self, "_slowed", False):
            self._slowed = True
            time.sleep(0.5)
        return real_write(self, admissions, now, **kwargs)

    def checking(**kwargs):
        asked.append(sorted(kwargs["node_ids"]))
        return real_check(**kwargs)

    monkeypatch.setattr(JobStore, "write_admissions", slow_first)
    monkeypatch.setattr(scheduler, "overbooked", checking)
    report = scheduler.run_pass(store=JobStore(), full=True)
    assert report.written_ahead and report.admitted == 4
    assert len(asked) == 1 and len(asked[0]) == 4, asked
    assert {Job.objects.get(pk=j.pk).state for j in jobs} == {"admitted"}
    assert ledger_problems() == []


@pytest.mark.parametrize("ahead", [0, 1])
def test_the_write_refuses_admissions_a_stale_view_of_the_quota_allowed(platform, settings, monkeypatch, ahead):  # noqa: F811
    # The pass believes every quota has room (as a pass that read the use before another process admitted would);
    # the write checks the queues, teams and users its rows hold against the database and refuses every try.
    settings.TRAINYARD_DISPATCH_WRITE_AHEAD = ahead
    fresh_pool(node("n1", 4, A100))
    open_up()
    Team.objects.filter(slug="demo").update(max_running_jobs=2)
    jobs = [submit(platform) for _ in range(3)]
    monkeypatch.setattr(scheduler, "quota_check", lambda *args, **kwargs: None)
    with pytest.raises(scheduler.StaleView, match="team demo: .*3/2 jobs"):
        scheduler.run_pass(store=JobStore(), full=True)
    assert {Job.objects.get(pk=j.pk).state for j in jobs} == {"pending"}
    assert Attempt.objects.count() == 0 and LogicalDevice.objects.count() == 0
    monkeypatch.undo()
    settings.TRAINYARD_DISPATCH_WRITE_AHEAD = ahead
    scheduler.reset()
    assert scheduler.run_pass(store=JobStore(), full=True).admitted == 2
    assert ledger_problems() == []
