"""Node pools: a queue bound to pools places its jobs on their nodes only; an admin moves a node between pools,
refused while it runs work that could not stay; the portal shows each pool with its use."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from cluster.inventory import POOL_LABEL
from cluster.models import Node, PoolRepair
from cluster.services import inventory_sync
from jobs import store
from jobs.models import Job
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from quotas.models import Queue
from scheduler.tests.test_dispatch import fresh_pool, node, open_up, placed_on, submit

pytestmark = pytest.mark.django_db(transaction=True)
A100 = "NVIDIA A100-SXM4-80GB"


def in_pool(info, pool: str):
    return info.__class__(**{**info.__dict__, "labels": {**info.labels, POOL_LABEL: pool}})


def staff():
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(username="ops", password="x", is_staff=True)
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_a_queue_bound_to_a_pool_places_there_and_a_node_moves_only_when_its_work_can_stay(platform):  # noqa: F811
    fresh_pool(in_pool(node("big-0", 2, A100), "whole-card"), in_pool(node("small-0", 2, A100), "inference"))
    train = open_up("train")
    Queue.objects.filter(pk=train.pk).update(pools=["whole-card"])
    jobs = [submit(platform) for _ in range(3)]
    assert store.dispatch().admitted == 2
    assert {placed_on(j)[0][0] for j in jobs[:2]} == {"big-0"}
    third = Job.objects.get(pk=jobs[2].pk)
    assert third.state == "pending" and third.reason == "no_capacity" and "pool whole-card" in third.message

    ops = staff()
    # big-0 runs train's jobs, and train is bound to whole-card alone: they could not stay in another pool.
    refused = ops.post("/api/v1/nodes/big-0/move/", {"pool": "inference"}, format="json")
    assert refused.status_code == 409 and refused.json()["code"] == "node_work_cannot_stay", refused.content
    assert ops.post("/api/v1/nodes/big-0/move/", {"pool": "Bad Name"}, format="json").json()["code"] == "invalid_pool"
    # small-0 is idle: it moves, keeps its pool across the inventory's next report, and the waiting job lands there.
    moved = ops.post("/api/v1/nodes/small-0/move/", {"pool": "whole-card"}, format="json")
    assert moved.status_code == 200 and moved.json()["pool"] == "whole-card"
    inventory_sync(info=in_pool(node("small-0", 2, A100), "inference"), backend="volcano")
    assert Node.objects.get(name="small-0").labels[POOL_LABEL] == "whole-card"
    assert PoolRepair.objects.filter(kind="node_moved", detail__contains="small-0: pool inference -> whole-card")
    assert store.dispatch().admitted == 1
    assert placed_on(jobs[2])[0][0] == "small-0"
    # An unbound queue may run anywhere, so its work never blocks a move.
    Queue.objects.filter(pk=train.pk).update(pools=[])
    assert ops.post("/api/v1/nodes/big-0/move/", {"pool": "inference"}, format="json").status_code == 200
    user = APIClient()
    user.force_authenticate(platform)
    assert user.post("/api/v1/nodes/big-0/move/", {"pool": "x"}, format="json").status_code == 403


def test_the_portal_shows_each_pool_with_its_use_and_queues(platform):  # noqa: F811
    fresh_pool(in_pool(node("big-0", 2, A100), "whole-card"), in_pool(node("small-0", 2, A100), "inference"))
    train = open_up("train")
    Queue.objects.filter(pk=train.pk).update(pools=["whole-card"])
    submit(platform)
    assert store.dispatch().admitted == 1
    client = Client()
    client.force_login(platform)
    page = client.get("/gpus/").content.decode()
    whole = page.split('data-pool="whole-card"')[1].split("</tr>")[0]
    inference = page.split('data-pool="inference"')[1].split("</tr>")[0]
    assert "1 / 2 (50%)" in whole and "train" in whole
    assert "0 / 2 (0%)" in inference and "train" not in inference and "debug" in inference


def test_a_dedicated_pool_takes_only_the_jobs_of_queues_bound_to_it(platform, settings):  # noqa: F811
    """A pool in TRAINYARD_DEDICATED_POOLS keeps its nodes for the queues bound to it: an unbound queue (every pool)
    and a queue bound elsewhere wait rather than land there, even with its cards idle; the bound queue's pods
    tolerate the pool's taint on Kubernetes, the others' do not."""
    from jobs.lifecycle import describe_attempt
    from scheduler import dispatch as scheduler

    settings.TRAINYARD_DEDICATED_POOLS = ["secure"]
    fresh_pool(in_pool(node("secure-0", 2, A100), "secure"), in_pool(node("open-0", 1, A100), "default"))
    sensitive = open_up("train")
    Queue.objects.filter(pk=sensitive.pk).update(pools=["secure"])
    other = open_up("debug")
    Queue.objects.get(pk=other.pk).specs.add(*Queue.objects.get(pk=sensitive.pk).specs.all())

    anywhere = [submit(platform, queue="debug") for _ in range(2)]  # every pool but the dedicated one
    assert store.dispatch().admitted == 1
    assert placed_on(anywhere[0])[0][0] == "open-0"
    waiting = Job.objects.get(pk=anywhere[1].pk)
    assert waiting.state == "pending" and waiting.reason == "no_capacity"  # secure-0's two idle cards are not its
    kept = submit(platform, queue="train")
    assert store.dispatch().admitted == 1 and placed_on(kept)[0][0] == "secure-0"

    def tolerated(job):
        return describe_attempt(Job.objects.get(pk=job.pk).attempts.get()).dedicated_pools

    assert tolerated(kept) == ["secure"] and tolerated(anywhere[0]) == []

    # open-0 runs the unbound queue's job: it cannot join the dedicated pool while that job runs there.
    refused = staff().post("/api/v1/nodes/open-0/move/", {"pool": "secure"}, format="json")
    assert refused.status_code == 409 and refused.json()["code"] == "node_work_cannot_stay", refused.content

    # Only the dedicated pool's nodes left: an unbound queue's job says why it waits.
    fresh_pool(in_pool(node("secure-1", 2, A100), "secure"))
    scheduler.reset()
    late = submit(platform, queue="debug")
    store.dispatch()
    late = Job.objects.get(pk=late.pk)
    assert late.state == "pending" and late.message == "every node is in a pool dedicated to other queues"
