"""The two numbers the pool's periodic loops turn on, pinned so that a change to either fails here: the 10-minute
reconcile flags a card whose live slices hold more than the card (compute or memory, either alone) and not one that
is exactly full; idle lending lends below 40% of a pool's cards in own use and not at 40%."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from cluster.inventory import LENT_LABEL
from cluster.models import GPU, LogicalDevice, Node, PoolRepair, PoolState
from jobs import lending, services, store
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from quotas.models import Queue
from scheduler.tests.test_dispatch import fresh_pool, node, open_up, submit
from scheduler.tests.test_pools import A100, in_pool

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_pool_reconcile_runs_every_ten_minutes_and_flags_an_overcommitted_card(platform):  # noqa: F811
    from jobs.tasks import reconcile_pool

    schedule = {e["task"]: e["schedule"] for e in django_settings.CELERY_BEAT_SCHEDULE.values()}
    assert schedule["jobs.reconcile_pool"] == 600.0
    fresh_pool(node("r-0", 2, A100), backend="local")
    open_up()
    jobs = [submit(platform, spec="shared") for _ in range(4)]
    assert store.dispatch().admitted == 4
    full, over = GPU.objects.filter(node__name="r-0").order_by("index")
    slices = [LogicalDevice.objects.get(attempt__job=job, released_at__isnull=True) for job in jobs]
    # Card 0 exactly full (compute and memory): no over-commit. Card 1: compute 500m of 1000m, memory one MiB over.
    half = full.memory_mib // 2
    for device, (gpu, milli, mib) in zip(
        slices,
        [(full, 500, half), (full, 500, full.memory_mib - half), (over, 250, over.memory_mib), (over, 250, 1)],
        strict=True,
    ):
        LogicalDevice.objects.filter(pk=device.pk).update(gpu=gpu, compute_milli=milli, memory_mib=mib)
    report = reconcile_pool()  # the beat task itself, on the local backend: nothing leaked, one card flagged
    assert report["freed"] == 0
    assert report["overcommitted"] == [f"r-0/gpu1: 500m compute and {over.memory_mib + 1} MiB held of 1000m / "
                                       f"{over.memory_mib} MiB"]  # fmt: skip
    assert list(PoolRepair.objects.filter(kind="overcommit").values_list("gpu_id", flat=True)) == [over.id]
    # A finished attempt's slice no longer counts (the leak pass frees it first).
    services.job_transition(job_id=jobs[3].id, to="failed", actor="test", reason="test")
    assert reconcile_pool()["overcommitted"] == []


def test_idle_lending_lends_below_forty_percent_and_not_at_forty(platform, settings):  # noqa: F811
    assert settings.TRAINYARD_LEND_BELOW_PERCENT == 40.0  # the documented default (docs/pools.md)
    settings.TRAINYARD_POOL_LENDING = "whole-card>inference"
    fresh_pool(*(in_pool(node(f"big-{i}", 1, A100), "whole-card") for i in range(5)),
               in_pool(node("small-0", 1, A100), "inference"))  # fmt: skip
    owner = open_up("train")
    Queue.objects.filter(pk=owner.pk).update(pools=["whole-card"])
    first, second = submit(platform, queue="train", gpus=1), submit(platform, queue="train", gpus=1)
    assert store.dispatch().admitted == 2  # 2 of 5 cards: 40% in own use
    now = timezone.now()
    PoolState.objects.create(name="whole-card", below_since=now - timedelta(hours=1))
    assert lending.pools_lend(now=now) == {"lent": 0, "reclaimed": 0}
    assert PoolState.objects.get(name="whole-card").below_since is None  # at 40% the pool counts as busy
    services.job_transition(job_id=second.id, to="failed", actor="test", reason="test")  # 1 of 5: 20%
    assert lending.pools_lend(now=now) == {"lent": 0, "reclaimed": 0}  # below from now on
    assert lending.pools_lend(now=now + timedelta(seconds=settings.TRAINYARD_LEND_AFTER_S + 1)) == {
        "lent": 4, "reclaimed": 0,
    }  # fmt: skip
    lent = {n.name for n in Node.objects.all() if n.labels.get(LENT_LABEL) == "inference"}
    busy = {d["node"] for d in first.attempts.get().placement["devices"]}
    assert lent == {f"big-{i}" for i in range(5)} - busy
