"""The topology rules of placement, each in a pool where breaking it changes the outcome: the replicas of a
multi-replica job on one rack (a pool with two racks) and a job's whole cards in one NVLink domain (a node whose
domains, as NVML reports them, do not follow the card order, so the policy's own pick would cross them)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cluster.tests.test_nvlink import FakeNvml
from cluster.topology import nvlink_labels
from jobs import store
from jobs.models import Job
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from scheduler import dispatch as scheduler
from scheduler.tests.test_dispatch import fresh_pool, node, open_up, placed_on, submit

pytestmark = pytest.mark.django_db(transaction=True)
A100 = "NVIDIA A100-SXM4-80GB"
RACK = "trainyard.io/rack"


def dispatch(queue) -> int:
    """One dispatch pass over ``queue``; the number of jobs admitted."""
    return store.dispatch(queue_ids=[queue.id]).admitted


@pytest.fixture(autouse=True)
def _forget_pool():
    scheduler.reset()
    yield
    scheduler.reset()


def on_rack(name: str, count: int, rack: str):
    return replace(node(name, count, A100), labels={RACK: rack})


def test_the_replicas_of_a_job_share_the_rack_of_the_first(platform):  # noqa: F811
    # The first replica takes the 1-card node (rack a). Left to itself the policy would put the second on the
    # 2-card node of rack b (it packs: one card left free there, three on a-1); the rule keeps it on rack a.
    fresh_pool(on_rack("a-0", 1, "a"), on_rack("a-1", 4, "a"), on_rack("b-0", 2, "b"))
    queue = open_up("distributed")
    job = submit(platform, queue="distributed", replicas=2)
    assert dispatch(queue) == 1
    nodes = [n for n, _ in placed_on(job)]
    assert len(nodes) == 2 and nodes[0] == "a-0"
    assert set(nodes) == {"a-0", "a-1"}, f"replicas split across racks: {nodes}"


def test_the_rack_rule_yields_when_the_rack_is_full(platform):  # noqa: F811
    # Rack a has one card: the second replica goes to rack b rather than wait.
    fresh_pool(on_rack("a-0", 1, "a"), on_rack("b-0", 2, "b"))
    queue = open_up("distributed")
    job = submit(platform, queue="distributed", replicas=2)
    assert dispatch(queue) == 1
    assert sorted(n for n, _ in placed_on(job)) == ["a-0", "b-0"]


def test_whole_cards_stay_in_one_nvlink_domain(platform):  # noqa: F811
    # NVML links cards 0 and 3, and 1 and 2: the policy's first two free cards (0, 1) would cross domains.
    labels = nvlink_labels(FakeNvml({frozenset({0, 3}), frozenset({1, 2})}), [(i, f"h{i}") for i in range(4)])
    domains = {i: labels[f"trainyard.io/nvlink-domain-gpu{i}"] for i in range(4)}
    fresh_pool(replace(node("nv-0", 4, A100), labels=labels))
    queue = open_up()
    first, second = submit(platform, gpus=2), submit(platform, gpus=2)
    assert dispatch(queue) == 2
    for job in (first, second):
        cards = [i for _, i in placed_on(job)]
        assert len(cards) == 2 and len({domains[i] for i in cards}) == 1, f"cards {cards} cross NVLink domains"
    assert Job.objects.get(pk=first.pk).state == "admitted"
