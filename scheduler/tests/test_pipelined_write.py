"""The pipelined write of a large pass (scheduler/dispatch.py `_Writer`): chunks written on a thread of their own
while the pass decides the rest commit exactly what the write in one piece would, in one transaction, checked by the
database chunk by chunk; a refused chunk or a failure while deciding commits nothing."""

from __future__ import annotations

import threading

import pytest

from cluster.models import LogicalDevice
from jobs.models import Attempt, Job
from jobs.store import JobStore
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from jobs.tests.test_quota_use import _logged, _summed
from scheduler import dispatch as scheduler
from scheduler.pool import Pool
from scheduler.tests.test_dispatch import fresh_pool, node, open_up, submit
from scheduler.tests.test_several_dispatchers import card_milli, ledger_problems

pytestmark = pytest.mark.django_db(transaction=True)
A100 = "NVIDIA A100-SXM4-80GB"


@pytest.fixture(autouse=True)
def _forget_pool():
    scheduler.reset()
    yield
    scheduler.reset()


def _writers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "admission-writer"]


def _placed(job_id) -> list[tuple[str, int]]:
    attempt = Attempt.objects.get(job_id=job_id)
    return sorted((d["node"], d["gpu_index"]) for d in attempt.placement["devices"])


def test_a_pipelined_pass_commits_what_the_pass_decided_chunk_by_chunk(platform, monkeypatch):  # noqa: F811
    monkeypatch.setattr(scheduler, "WRITE_CHUNK", 3)
    fresh_pool(*(node(f"n{i}", 4, A100, cpu=96000) for i in range(4)))
    open_up()
    specs = ["guaranteed", "shared", "performance", "shared", "guaranteed"] * 5
    jobs = [submit(platform, spec=spec) for spec in specs]
    too_big = [submit(platform, gpus=8) for _ in range(2)]  # no node has 8 cards: they wait
    # What the pass will decide, decided in memory on a pool of its own read from the same rows.
    store = JobStore()
    expected_pool = Pool()
    expected_pool.sync(lambda p: scheduler.workload(store, p))
    expected = scheduler.plan(store.backlog(queue_ids=None), expected_pool)
    assert len(expected.admissions) > 3 * scheduler.WRITE_CHUNK  # several chunks, and a rest

    report = scheduler.run_pass(store=JobStore(), full=True)

    assert report.pipelined and report.refused == 0
    assert report.admitted == len(expected.admissions)
    for a in expected.admissions:
        assert _placed(a.job.id) == sorted((s.node, s.gpu_index) for s in a.slices)
    admitted = {j.id for j in jobs if Job.objects.get(pk=j.pk).state == "admitted"}
    assert admitted == {a.job.id for a in expected.admissions}
    assert Attempt.objects.filter(job_id__in=admitted).count() == len(admitted)  # one attempt each, none twice
    assert ledger_problems() == [] and max(card_milli().values()) <= 1000
    assert _logged() == _summed()  # the quota-use log, written by every chunk's statements, agrees with the rows
    # The writer wrote the changed reasons after its commit, beside the start messages.
    assert report.waits_written and report.waiting >= len(too_big)
    assert {Job.objects.get(pk=j.pk).reason for j in too_big} == {"no_capacity"}
    assert _writers() == []
    # The pool in memory is current after its own pipelined write: the next pass reads nothing new.
    pool = scheduler.current()
    assert (pool.structure_version, pool.ledger_version) == Pool.read_versions()


def test_a_chunk_the_database_refuses_rolls_back_the_whole_pass_which_retries_on_a_fresh_read(
    platform,  # noqa: F811
    monkeypatch,
):
    monkeypatch.setattr(scheduler, "WRITE_CHUNK", 1)
    fresh_pool(*(node(f"n{i}", 1, A100) for i in range(4)))
    open_up()
    a, b = Pool(), Pool()
    submit(platform)
    assert scheduler.run_pass(store=JobStore(), pool=b, full=True).admitted == 1
    taken = [submit(platform) for _ in range(2)]
    assert scheduler.run_pass(store=JobStore(), pool=a, full=True).admitted == 2
    # B believes it is current: it sees three free cards where one is.
    b.ledger_version = Pool.read_versions()[1]
    late = [submit(platform) for _ in range(3)]
    attempts_before = Attempt.objects.count()

    report = scheduler.run_pass(store=JobStore(), pool=b, full=True)

    assert report.refused == 1  # a chunk over-booked a card: the whole first write rolled back ...
    assert report.admitted == 1  # ... and the retry, on a fresh read, took the one free card
    assert Attempt.objects.count() == attempts_before + 1
    assert sum(Job.objects.get(pk=j.pk).state == "admitted" for j in late) == 1
    assert all(Job.objects.get(pk=j.pk).state == "admitted" for j in taken)
    assert ledger_problems() == [] and max(card_milli().values()) == 1000
    assert _logged() == _summed()
    assert _writers() == []


def test_a_failure_while_deciding_ends_the_writer_and_commits_nothing(platform, monkeypatch):  # noqa: F811
    monkeypatch.setattr(scheduler, "WRITE_CHUNK", 2)
    fresh_pool(node("n1", 8, A100))
    open_up()
    jobs = [submit(platform) for _ in range(6)]
    decide = scheduler._decide
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:  # two chunks handed over already
            raise RuntimeError("the policy failed")
        return decide(*args, **kwargs)

    monkeypatch.setattr(scheduler, "_decide", failing)
    with pytest.raises(RuntimeError, match="the policy failed"):
        scheduler.run_pass(store=JobStore(), full=True)

    assert _writers() == []
    assert Attempt.objects.count() == 0 and LogicalDevice.objects.count() == 0
    assert all(Job.objects.get(pk=j.pk).state == "pending" for j in jobs)
    assert _logged() == _summed()
    # The pool in memory had taken the undone placements: it reads everything again, and the next pass admits all.
    monkeypatch.setattr(scheduler, "_decide", decide)
    assert scheduler.run_pass(store=JobStore(), full=True).admitted == 6
    assert ledger_problems() == []


def test_a_pass_inside_a_callers_transaction_writes_in_one_piece(platform, monkeypatch, settings):  # noqa: F811
    # The write must then stay in the caller's transaction; and the setting turns the pipeline off everywhere.
    from django.db import transaction

    monkeypatch.setattr(scheduler, "WRITE_CHUNK", 1)
    fresh_pool(node("n1", 4, A100))
    open_up()
    [submit(platform) for _ in range(2)]
    with transaction.atomic():
        assert scheduler._pipeline(JobStore(), scheduler.current()) is None
    settings.TRAINYARD_PIPELINED_WRITE = False
    report = scheduler.run_pass(store=JobStore(), full=True)
    assert report.admitted == 2 and not report.pipelined
