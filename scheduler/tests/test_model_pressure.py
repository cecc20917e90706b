"""fgd on pools where requests name GPU models: each node scored against the requests its model will see, and a
scarce model's cards kept for the requests pinned to it. Plain pytest: no database, no Django."""

from __future__ import annotations

import random

import pytest

from bench import allocator as bench
from scheduler.policy import Allocator, Node, Request, Workload, fragmentation, model_levels, route

T4 = frozenset({"T4"})
ANYWHERE = Request.whole(1, cpu_milli=4000)
ON_T4 = Request.whole(1, cpu_milli=4000, gpu_model="T4")


def pool() -> list[Node]:
    # A scarce model on a small node and a common one on a large node: packing alone prefers the small node.
    return [Node.empty("t4", 2, 32_000, gpu_model="T4"), Node.empty("g2", 8, 96_000, gpu_model="G2")]


def test_levels_even_out_while_requests_that_can_go_anywhere_can_balance_them() -> None:
    capacity = {"G2": 8000, "T4": 2000}
    # 10% of the demand for a fifth of the cards: the rest can even the load out.
    assert model_levels({None: 0.9, T4: 0.1}, capacity) == pytest.approx({"G2": 1e-4, "T4": 1e-4})
    shares = route({None: 0.9, T4: 0.1}, capacity)
    assert shares[T4] == {"T4": 1.0}
    assert shares[None]["T4"] == pytest.approx(0.1 / 0.9)  # T4 gets 0.1 of the free demand: 0.2 in all
    # 30% for a fifth: T4 is over-asked by its pinned requests alone and gets none of the others.
    levels = model_levels({None: 0.7, T4: 0.3}, capacity)
    assert levels["T4"] == pytest.approx(0.3 / 2000) and levels["G2"] == pytest.approx(0.7 / 8000)
    assert route({None: 0.7, T4: 0.3}, capacity)[None] == pytest.approx({"G2": 1.0})
    # Demand for a model the pool lacks reaches nothing; a model nobody can use has no load.
    assert model_levels({frozenset({"H100"}): 1.0}, capacity) == {"G2": 0.0, "T4": 0.0}


@pytest.mark.parametrize("pinned_share, expected", [(0.0, "t4"), (0.1, "t4"), (0.3, "g2")])
def test_a_request_that_can_go_anywhere_leaves_a_scarce_model_to_its_pinned_requests(
    pinned_share: float, expected: str
) -> None:
    weights = {ANYWHERE: 1.0 - pinned_share}
    if pinned_share:
        weights[ON_T4] = pinned_share
    wl = Workload(weights)
    alloc = Allocator(pool(), "fgd", wl)
    placed = alloc.choose(ANYWHERE)
    assert placed is not None and placed.node == expected
    # The pinned requests themselves still go there.
    if pinned_share:
        assert alloc.choose(ON_T4).node == "t4"


def test_the_pressure_follows_what_is_free() -> None:
    # Balanced at first; once requests that could go anywhere took the T4 node's first card, what is left of it
    # is wanted by the pinned requests: the next such request goes to the large node.
    wl = Workload({ANYWHERE: 0.84, ON_T4: 0.16})
    alloc = Allocator(pool(), "fgd", wl)
    first = alloc.place(ANYWHERE)
    assert first is not None and first.node == "t4"
    assert alloc.choose(ANYWHERE).node == "g2"
    assert alloc.choose(ON_T4).node == "t4"


def test_a_node_is_scored_against_the_requests_its_model_will_see() -> None:
    on_g2 = Request.whole(1, gpu_model="G2")
    wl = Workload({on_g2: 1.0, Request.fraction(500): 1.0})
    t4 = pool()[0]
    # The paper's measure: the G2-only type sees every free T4 card as stranded.
    assert fragmentation(t4, wl) == pytest.approx(1000.0)
    # Against what T4 nodes will see (shares only), nothing on an empty T4 node is stranded.
    view = wl.routed({"T4": 2000, "G2": 8000})
    assert fragmentation(t4, view) == pytest.approx(0.0)
    assert wl.routed({"T4": 2000, "G2": 8000}) is view  # one view per capacity, its caches shared
    # Without pinned types the view is the workload itself, decision for decision.
    plain = Workload({ANYWHERE: 1.0, Request.fraction(500): 1.0})
    assert fragmentation(t4, plain.routed({"T4": 2000, "G2": 8000})) == fragmentation(t4, plain)


def _scarce_replay_pods() -> tuple[list[bench.NodeSpec], list[Request]]:
    nodes = [bench.NodeSpec(f"t4-{i}", 32_000, 131_072, 2, "T4") for i in range(6)]
    nodes += [bench.NodeSpec(f"g2-{i}", 96_000, 393_216, 8, "G2") for i in range(3)]
    rng = random.Random(5)
    pods = []
    for _ in range(60):
        pods.append(Request(1, rng.choice([1000, 1000, 500]), 4000, 8192, 0, None))
    base = [p for p in pods]
    # Pinned to T4: 150% of its 12 cards over the 36 the pool has.
    pinned = 0
    while pinned < 1.5 * 12_000 * sum(p.gpu_demand_milli for p in base) / 36_000:
        pods.append(Request(1, 1000, 4000, 8192, 0, "T4"))
        pinned += 1000
    return nodes, pods


def test_a_replay_with_a_scarce_model_keeps_fgd_at_or_below_best_fit_and_random() -> None:
    nodes, pods = _scarce_replay_pods()
    med = {}
    for policy in ("fgd", "best_fit", "random"):
        runs = [bench.replay(nodes, pods, policy, seed).unallocated_pct for seed in range(5)]
        med[policy] = sorted(runs)[2]
    assert med["fgd"] <= med["best_fit"] and med["fgd"] <= med["random"], med
