"""Idle lending: a pool below its threshold long enough lends its idle nodes to a borrowing pool's preemptible
jobs (not to its other jobs); when the owner's queue has a waiting job the borrower there is preempted, the loan
taken back, and the owner's job admitted."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from cluster.inventory import LENT_LABEL
from cluster.models import Node, PoolRepair, PoolState
from jobs import lending, lifecycle, store
from jobs.models import Job, JobEvent
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from quotas.models import Queue
from scheduler.tests.test_dispatch import fresh_pool, node, open_up, placed_on, submit
from scheduler.tests.test_pools import A100, in_pool

pytestmark = pytest.mark.django_db(transaction=True)


def lent_to(name: str) -> str | None:
    return Node.objects.get(name=name).labels.get(LENT_LABEL)


def test_an_idle_pool_lends_its_nodes_to_borrowers_and_takes_them_back_for_its_owner(platform, settings):  # noqa: F811
    settings.TRAINYARD_POOL_LENDING = "whole-card>inference"
    settings.TRAINYARD_LEND_AFTER_S = 1800
    fresh_pool(in_pool(node("big-0", 2, A100), "whole-card"), in_pool(node("small-0", 1, A100), "inference"))
    owner_queue = open_up("train")
    Queue.objects.filter(pk=owner_queue.pk).update(pools=["whole-card"])
    borrow_queue = open_up("debug")
    Queue.objects.filter(pk=borrow_queue.pk).update(pools=["inference"], allow_preemptible=True)
    Queue.objects.get(pk=borrow_queue.pk).specs.add(*Queue.objects.get(pk=owner_queue.pk).specs.all())

    now = timezone.now()
    assert lending.pools_lend(now=now) == {"lent": 0, "reclaimed": 0}  # below 40% from now on: not long enough
    assert PoolState.objects.get(name="whole-card").below_since == now
    assert lending.pools_lend(now=now + timedelta(minutes=29)) == {"lent": 0, "reclaimed": 0}
    assert lending.pools_lend(now=now + timedelta(minutes=31)) == {"lent": 1, "reclaimed": 0}
    assert lent_to("big-0") == "inference" and lent_to("small-0") is None

    borrower = submit(platform, queue="debug", gpus=2, preemptible=True)  # too big for small-0: only big-0 fits
    guaranteed = submit(platform, queue="debug", gpus=2)  # not preemptible: never on a lent node
    assert store.dispatch().admitted == 1
    assert placed_on(borrower)[0][0] == "big-0"
    assert Job.objects.get(pk=guaranteed.pk).reason == "no_capacity"
    lifecycle.job_cancel(job_id=guaranteed.id, actor="demo")

    owner = submit(platform, queue="train", gpus=1)
    store.dispatch()  # the owner waits for big-0's cards: the borrower there yields
    event = JobEvent.objects.get(job=borrower, kind="preemption")
    assert event.data["for_job"] == str(owner.id)
    assert lending.pools_lend(now=now + timedelta(minutes=32)) == {"lent": 0, "reclaimed": 1}  # the owner waits
    assert lent_to("big-0") is None
    assert store.dispatch().admitted == 1
    assert Job.objects.get(pk=owner.pk).state == "admitted" and placed_on(owner)[0][0] == "big-0"
    # Busy again (50% own use): nothing is lent, and the borrower waits rather than take big-0's other card.
    assert lending.pools_lend(now=now + timedelta(hours=2)) == {"lent": 0, "reclaimed": 0}
    assert PoolRepair.objects.filter(kind="node_lent").count() == 1
    assert Job.objects.get(pk=borrower.pk).state == "pending"


def test_a_waiting_owner_takes_every_loan_back(platform, settings):  # noqa: F811
    settings.TRAINYARD_POOL_LENDING = "whole-card>inference"
    fresh_pool(in_pool(node("big-0", 1, A100), "whole-card"), in_pool(node("big-1", 1, A100), "whole-card"))
    owner_queue = open_up("train")
    Queue.objects.filter(pk=owner_queue.pk).update(pools=["whole-card"], state="closed")
    now = timezone.now()
    PoolState.objects.create(name="whole-card", below_since=now - timedelta(hours=1))
    assert lending.pools_lend(now=now) == {"lent": 2, "reclaimed": 0}
    submit(platform, queue="train")  # the queue is closed: it waits, and it holds quota
    assert lending.pools_lend(now=now) == {"lent": 0, "reclaimed": 2}
    assert lent_to("big-0") is None and lent_to("big-1") is None
    assert PoolRepair.objects.filter(kind="node_reclaimed", detail__contains="queues of pool whole-card wait")
