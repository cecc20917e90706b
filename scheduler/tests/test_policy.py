"""Placement policies (cluster.placement) and the allocator benchmark's replay, on small made-up pools.

Plain pytest: no database, no Django.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from bench import allocator as bench
from scheduler.policy import (
    FULL_MILLI,
    GPU,
    POLICIES,
    Allocator,
    Node,
    Placement,
    Request,
    Workload,
    apply_placement,
    choose,
    fragmentation,
)

# A mix of request shapes used as the target workload wherever a test does not care about it.
MIX = Workload.from_requests(
    [
        Request.whole(1, cpu_milli=4000),
        Request.whole(1, cpu_milli=4000),
        Request.whole(2, cpu_milli=8000),
        Request.fraction(500, cpu_milli=2000),
        Request.fraction(250, cpu_milli=1000),
        Request.cpu_only(2000),
    ]
)


def make_node(
    name: str,
    free: list[int],
    cpu: int = 32_000,
    *,
    memory_free_mib: int | None = None,
    eligible: bool = True,
) -> Node:
    gpus = [GPU(i, m) for i, m in enumerate(free)]
    return Node(name, cpu, gpus, memory_free_mib, eligible=eligible, cpu_total_milli=cpu)


def fits_somewhere(nodes: list[Node], req: Request) -> bool:
    """Independent, brute-force answer to 'could this request be placed at all?'."""
    for n in nodes:
        if not n.eligible or n.cpu_free_milli < req.cpu_milli:
            continue
        if n.memory_free_mib is not None and n.memory_free_mib < req.memory_mib:
            continue
        usable = [g for g in n.gpus if g.eligible]
        if req.num_gpus == 0:
            return True
        if req.gpu_milli == FULL_MILLI:
            if sum(1 for g in usable if g.milli_free == FULL_MILLI) >= req.num_gpus:
                return True
        elif any(g.milli_free >= req.gpu_milli for g in usable):
            return True
    return False


def random_request(rng: random.Random) -> Request:
    kind = rng.random()
    cpu = rng.choice([500, 2000, 4000, 8000])
    if kind < 0.15:
        return Request.cpu_only(cpu)
    if kind < 0.55:
        return Request.whole(rng.choice([1, 1, 1, 2, 4]), cpu_milli=cpu)
    return Request.fraction(rng.choice([100, 250, 470, 500, 810]), cpu_milli=cpu)


def small_pool(rng: random.Random, n: int = 12) -> list[Node]:
    nodes = []
    for i in range(n):
        gpus = rng.choice([1, 2, 4, 8])
        nodes.append(make_node(f"n{i}", [FULL_MILLI] * gpus, cpu=rng.choice([8000, 16_000, 32_000, 64_000])))
    return nodes


# ---- requests ------------------------------------------------------------------------------------


def test_request_validation() -> None:
    with pytest.raises(ValueError):
        Request(num_gpus=2, gpu_milli=500)
    with pytest.raises(ValueError):
        Request(num_gpus=1, gpu_milli=1500)
    with pytest.raises(ValueError):
        Request.whole(0)
    assert Request.cpu_only(1000) == Request(0, 700, 1000)  # a CPU-only request carries no GPU share
    assert Request.whole(2).exclusive and not Request.whole(2).fractional
    assert Request.fraction(300).fractional and Request.fraction(300).gpu_demand_milli == 300


@pytest.mark.parametrize("policy", POLICIES)
def test_unknown_names_are_rejected(policy: str) -> None:
    with pytest.raises(ValueError):
        Allocator([], "no-such-policy")
    with pytest.raises(ValueError):
        Allocator([], policy, MIX, tie_break="sideways")


def test_fgd_needs_a_workload() -> None:
    with pytest.raises(ValueError):
        Allocator([make_node("a", [FULL_MILLI])], "fgd")


# ---- whole GPUs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_whole_gpu_request_gets_only_fully_free_gpus(policy: str) -> None:
    nodes = [make_node("a", [FULL_MILLI, 600, FULL_MILLI, 0, 999])]
    alloc = Allocator(nodes, policy, MIX, seed=3)
    p = alloc.choose(Request.whole(2))
    assert p is not None and p.exclusive
    assert sorted(p.gpu_indices) == [0, 2]
    alloc.commit(p)
    assert [g.milli_free for g in nodes[0].gpus] == [0, 600, 0, 0, 999]
    # No third fully free card is left, although 1,599 milli are free in all.
    assert alloc.choose(Request.whole(1)) is None


@pytest.mark.parametrize("policy", POLICIES)
def test_whole_gpu_is_exclusive(policy: str) -> None:
    nodes = [make_node("a", [FULL_MILLI]), make_node("b", [FULL_MILLI])]
    alloc = Allocator(nodes, policy, MIX, seed=1)
    first = alloc.place(Request.whole(1))
    assert first is not None
    taken = first.node
    # Shares must go to the other card, however small they are.
    for _ in range(3):
        share = alloc.place(Request.fraction(100))
        assert share is not None and share.node != taken
    assert alloc.place(Request.whole(1)) is None


@pytest.mark.parametrize("policy", POLICIES)
def test_multi_gpu_request_stays_on_one_node(policy: str) -> None:
    # Four free cards in all, but no node has more than two.
    nodes = [make_node("a", [FULL_MILLI, FULL_MILLI]), make_node("b", [FULL_MILLI, FULL_MILLI])]
    alloc = Allocator(nodes, policy, MIX)
    assert alloc.choose(Request.whole(4)) is None
    p = alloc.choose(Request.whole(2))
    assert p is not None and len(p.gpu_indices) == 2


# ---- shares of one GPU ---------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_fraction_fits_on_one_gpu(policy: str) -> None:
    nodes = [make_node("a", [300, 300, 300])]
    alloc = Allocator(nodes, policy, MIX)
    # 900 milli are free on the node, but no single card has 500.
    assert alloc.choose(Request.fraction(500)) is None
    p = alloc.place(Request.fraction(300))
    assert p is not None and len(p.gpu_indices) == 1 and p.gpu_milli == 300 and not p.exclusive
    assert sorted(g.milli_free for g in nodes[0].gpus) == [0, 300, 300]


@pytest.mark.parametrize("policy", POLICIES)
def test_fraction_respects_gpu_memory(policy: str) -> None:
    gpus = [GPU(0, FULL_MILLI, 4000, 16_000), GPU(1, 500, 10_000, 16_000)]
    nodes = [Node("a", 32_000, gpus, cpu_total_milli=32_000)]
    alloc = Allocator(nodes, policy, MIX)
    p = alloc.place(Request.fraction(400, gpu_memory_mib=8000))
    assert p is not None and p.gpu_indices == (1,)
    assert (gpus[1].milli_free, gpus[1].memory_free_mib) == (100, 2000)
    # Card 0 has compute but only 4,000 MiB; card 1 has neither.
    assert alloc.choose(Request.fraction(100, gpu_memory_mib=6000)) is None
    # A card with memory in use is not fully free, so it cannot be handed out whole.
    assert alloc.choose(Request.whole(1)) is None


# ---- never over-commit ---------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_never_overcommits_and_only_fails_when_nothing_fits(policy: str) -> None:
    rng = random.Random(7)
    nodes = small_pool(rng)
    cpu_total = {n.name: n.cpu_free_milli for n in nodes}
    alloc = Allocator(nodes, policy, MIX, seed=11)
    taken: dict[tuple[str, int], int] = {}
    for _ in range(400):
        req = random_request(rng)
        p = alloc.place(req)
        if p is None:
            assert not fits_somewhere(nodes, req), f"{policy} refused {req} although it fits"
            continue
        assert len(p.gpu_indices) == req.num_gpus
        for idx in p.gpu_indices:
            taken[(p.node, idx)] = taken.get((p.node, idx), 0) + p.gpu_milli
    for n in nodes:
        assert 0 <= n.cpu_free_milli <= cpu_total[n.name]
        for g in n.gpus:
            assert 0 <= g.milli_free <= FULL_MILLI
            assert g.milli_free + taken.get((n.name, g.index), 0) == FULL_MILLI


def test_apply_placement_refuses_to_overcommit() -> None:
    node = make_node("a", [400, FULL_MILLI], cpu=1000)
    too_much = Placement("a", 0, (0,), 500, 0, 100, 0, False, "manual")
    with pytest.raises(ValueError):
        apply_placement(node, too_much)
    not_free = Placement("a", 0, (0,), FULL_MILLI, 0, 100, 0, True, "manual")
    with pytest.raises(ValueError):
        apply_placement(node, not_free)
    twice = Placement("a", 0, (1, 1), 500, 0, 0, 0, False, "manual")
    with pytest.raises(ValueError):
        apply_placement(node, twice)
    cpu = Placement("a", 0, (1,), 100, 0, 2000, 0, False, "manual")
    with pytest.raises(ValueError):
        apply_placement(node, cpu)
    assert [g.milli_free for g in node.gpus] == [400, FULL_MILLI] and node.cpu_free_milli == 1000


@pytest.mark.parametrize("policy", POLICIES)
def test_cpu_and_memory_are_respected(policy: str) -> None:
    nodes = [
        make_node("small", [FULL_MILLI], cpu=2000, memory_free_mib=8000),
        make_node("big", [0], cpu=64_000, memory_free_mib=8000),
    ]
    alloc = Allocator(nodes, policy, MIX)
    assert alloc.choose(Request.whole(1, cpu_milli=3000)) is None
    assert alloc.choose(Request.whole(1, cpu_milli=1000, memory_mib=9000)) is None
    p = alloc.choose(Request.cpu_only(3000, memory_mib=1000))
    assert p is not None and p.node == "big"


# ---- excluded hardware ---------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_ineligible_gpus_and_nodes_are_never_chosen(policy: str) -> None:
    sick = make_node("sick", [FULL_MILLI, FULL_MILLI, FULL_MILLI])
    sick.gpus[0].eligible = False
    sick.gpus[2].eligible = False
    cordoned = make_node("cordoned", [FULL_MILLI] * 8, eligible=False)
    nodes = [cordoned, sick]
    alloc = Allocator(nodes, policy, MIX, seed=5)
    assert alloc.choose(Request.whole(2)) is None
    for req in (Request.fraction(200), Request.fraction(300), Request.whole(1)):
        p = alloc.place(req)
        if p is None:
            break
        assert p.node == "sick" and p.gpu_indices == (1,)
    assert [g.milli_free for g in sick.gpus][0::2] == [FULL_MILLI, FULL_MILLI]
    assert all(g.milli_free == FULL_MILLI for g in cordoned.gpus)


def test_refresh_picks_up_a_card_marked_unhealthy() -> None:
    nodes = [make_node("a", [FULL_MILLI, FULL_MILLI])]
    alloc = Allocator(nodes, "fgd", MIX)
    nodes[0].gpus[0].eligible = False
    alloc.refresh(0)
    p = alloc.choose(Request.whole(1))
    assert p is not None and p.gpu_indices == (1,)
    assert alloc.choose(Request.whole(2)) is None


# ---- fgd -----------------------------------------------------------------------------------------


def test_fragmentation_measure_on_a_crafted_pool() -> None:
    wl = Workload({Request.whole(1): 1.0, Request.fraction(500): 1.0})
    # Whole-GPU type: the 500 free on a half-used card is stranded; the 500-share type can use it.
    assert fragmentation(make_node("x", [500]), wl) == pytest.approx(250.0)
    assert fragmentation(make_node("x", [FULL_MILLI]), wl) == pytest.approx(0.0)
    # 300 free: useless to both types.
    assert fragmentation(make_node("x", [300]), wl) == pytest.approx(300.0)
    # A node without the CPU for a type strands all its free GPU for that type.
    starved = make_node("x", [FULL_MILLI], cpu=1000)
    wl_cpu = Workload({Request.whole(1, cpu_milli=2000): 1.0})
    assert fragmentation(starved, wl_cpu) == pytest.approx(1000.0)
    assert fragmentation([make_node("x", [500]), make_node("y", [300])], wl) == pytest.approx(550.0)


def test_fgd_leaves_less_fragmentation_than_first_fit() -> None:
    wl = Workload({Request.whole(1): 1.0, Request.fraction(500): 1.0})
    req = Request.fraction(500)

    def pool() -> list[Node]:
        return [make_node("fresh", [FULL_MILLI]), make_node("half", [500])]

    ff_nodes, fgd_nodes = pool(), pool()
    ff = choose("first_fit", ff_nodes, req, wl)
    fg = choose("fgd_pure", fgd_nodes, req, wl)
    assert ff is not None and ff.node == "fresh"
    assert fg is not None and fg.node == "half"
    apply_placement(ff_nodes[ff.node_index], ff)
    apply_placement(fgd_nodes[fg.node_index], fg)
    assert fragmentation(fgd_nodes, wl) < fragmentation(ff_nodes, wl)
    assert fragmentation(fgd_nodes, wl) == pytest.approx(0.0)
    # choose() does not change the nodes it is given.
    assert [g.milli_free for n in pool() for g in n.gpus] == [FULL_MILLI, 500]


@pytest.mark.parametrize("policy", ["fgd", "fgd_pure"])
def test_fgd_picks_the_card_within_a_node(policy: str) -> None:
    wl = Workload({Request.whole(1): 1.0, Request.fraction(500): 1.0})
    nodes = [make_node("a", [FULL_MILLI, 500])]
    p = choose(policy, nodes, Request.fraction(500), wl)
    assert p is not None and p.gpu_indices == (1,)
    ff = choose("first_fit", nodes, Request.fraction(500), wl)
    assert ff is not None and ff.gpu_indices == (0,)


def test_fgd_keeps_cpu_for_the_gpus_that_need_it() -> None:
    # Only 1-GPU jobs needing 8 cores are expected; a CPU-only job should not take the cores that the free
    # card on "gpu-free" needs, when "gpu-busy" has cores to spare next to a card that is already taken.
    wl = Workload({Request.whole(1, cpu_milli=8000): 1.0})
    nodes = [make_node("gpu-free", [FULL_MILLI], cpu=10_000), make_node("gpu-busy", [0], cpu=10_000)]
    p = choose("fgd_pure", nodes, Request.cpu_only(4000), wl)
    assert p is not None and p.node == "gpu-busy"
    ff = choose("first_fit", nodes, Request.cpu_only(4000), wl)
    assert ff is not None and ff.node == "gpu-free"


def test_incremental_bookkeeping_matches_a_fresh_allocator() -> None:
    rng = random.Random(3)
    nodes = small_pool(rng, n=16)
    wl = MIX
    alloc = Allocator(nodes, "fgd", wl)
    placed: list[Placement] = []
    for step in range(300):
        req = random_request(rng)
        fresh = Allocator(nodes, "fgd", wl).choose(req)
        got = alloc.choose(req)
        assert (got is None) == (fresh is None)
        if got is not None and fresh is not None:
            assert (got.node, got.gpu_indices) == (fresh.node, fresh.gpu_indices)
            alloc.commit(got)
            placed.append(got)
        if placed and step % 5 == 4:
            alloc.release(placed.pop(rng.randrange(len(placed))))
    assert alloc.fragmentation() == pytest.approx(fragmentation(nodes, wl))


def test_release_gives_everything_back() -> None:
    rng = random.Random(9)
    nodes = small_pool(rng)
    before = [(n.cpu_free_milli, [g.milli_free for g in n.gpus]) for n in nodes]
    alloc = Allocator(nodes, "fgd", MIX)
    placed = [p for p in (alloc.place(random_request(rng)) for _ in range(60)) if p is not None]
    assert placed
    for p in reversed(placed):
        alloc.release(p)
    assert [(n.cpu_free_milli, [g.milli_free for g in n.gpus]) for n in nodes] == before


# ---- determinism ---------------------------------------------------------------------------------


def _sequence(policy: str, seed: int, tie_break: str = "index") -> list[tuple[str, tuple[int, ...]] | None]:
    rng = random.Random(42)
    nodes = small_pool(rng, n=20)
    alloc = Allocator(nodes, policy, MIX, seed=seed, tie_break=tie_break)
    out: list[tuple[str, tuple[int, ...]] | None] = []
    for _ in range(150):
        p = alloc.place(random_request(rng))
        out.append(None if p is None else (p.node, p.gpu_indices))
    return out


@pytest.mark.parametrize("policy", POLICIES)
def test_same_seed_same_placements(policy: str) -> None:
    assert _sequence(policy, seed=1) == _sequence(policy, seed=1)
    assert _sequence(policy, seed=1, tie_break="random") == _sequence(policy, seed=1, tie_break="random")


def test_random_policy_depends_on_the_seed() -> None:
    assert _sequence("random", seed=1) != _sequence("random", seed=2)


def test_random_policy_finds_the_one_node_that_fits() -> None:
    nodes = [make_node(f"n{i}", [0, 0]) for i in range(300)]
    nodes[137] = make_node("n137", [0, FULL_MILLI])
    for seed in range(5):
        p = choose("random", nodes, Request.whole(1), seed=seed)
        assert p is not None and p.node == "n137" and p.gpu_indices == (1,)


def test_random_policy_draws_feasible_nodes_uniformly() -> None:
    nodes = [make_node(f"n{i}", [FULL_MILLI] * (i % 3 + 1)) for i in range(6)] + [make_node("full", [0])]
    alloc = Allocator(nodes, "random", seed=8)
    counts = Counter()
    for _ in range(6000):
        p = alloc.choose(Request.fraction(300))
        assert p is not None
        counts[p.node] += 1
    assert "full" not in counts
    assert all(800 <= counts[f"n{i}"] <= 1200 for i in range(6)), counts


# ---- replays -------------------------------------------------------------------------------------


def test_tiny_replay_fgd_packs_shares_where_worst_fit_spreads_them() -> None:
    wl = Workload({Request.whole(1): 1.0, Request.fraction(500): 2.0})
    arrivals = [Request.fraction(500), Request.fraction(500), Request.whole(1)]
    outcome = {}
    for policy in ("fgd", "fgd_pure", "worst_fit"):
        nodes = [make_node("a", [FULL_MILLI]), make_node("b", [FULL_MILLI])]
        alloc = Allocator(nodes, policy, wl)
        outcome[policy] = [alloc.place(r) is not None for r in arrivals]
    assert outcome["fgd"] == outcome["fgd_pure"] == [True, True, True]
    assert outcome["worst_fit"] == [True, True, False]


SYNTH_SHAPES = [(96_000, 8, "G2")] * 4 + [(16_000, 2, "P100")] * 4 + [(104_000, 2, "T4")] * 4
SYNTH_SHAPES += [(8000, 1, "V100")] * 2
SYNTH_NODES = [bench.NodeSpec(f"node-{i}", c, 256_000, g, m) for i, (c, g, m) in enumerate(SYNTH_SHAPES)]
SYNTH_PODS = (
    [Request.whole(1, cpu_milli=11_000, memory_mib=40_000)] * 30
    + [Request.fraction(810, cpu_milli=3000, memory_mib=5000)] * 10
    + [Request.fraction(470, cpu_milli=8000, memory_mib=30_000)] * 12
    + [Request.fraction(160, cpu_milli=2000, memory_mib=4000)] * 4
    + [Request.whole(2, cpu_milli=16_000)] * 2
    + [Request.whole(8, cpu_milli=64_000)] * 1
    + [Request.cpu_only(12_000, memory_mib=50_000)] * 8
)


@pytest.mark.parametrize("policy", POLICIES)
def test_bench_replay_on_a_synthetic_cluster(policy: str) -> None:
    res = bench.replay(SYNTH_NODES, SYNTH_PODS, policy, seed=4)
    assert 0.0 <= res.unallocated_pct <= 100.0
    assert set(res.failed_pct_at) == {"80%", "90%", "95%", "100%"}
    assert res.decisions > len(SYNTH_PODS) * 0.8 and res.decisions_per_s > 0
    # Unallocated capacity at 100% arrived is exactly the GPU demand that failed, up to the crossing pod.
    capacity = FULL_MILLI * sum(n.num_gpus for n in SYNTH_NODES)
    assert res.unallocated_pct <= 100.0 * res.failed_gpu_milli / capacity + 1e-9
    again = bench.replay(SYNTH_NODES, SYNTH_PODS, policy, seed=4)
    assert again.unallocated_pct == res.unallocated_pct


def test_bench_arrivals_keep_every_pod_and_reach_capacity() -> None:
    capacity = FULL_MILLI * sum(n.num_gpus for n in SYNTH_NODES)
    seq = bench.arrivals(SYNTH_PODS, capacity, random.Random(0))
    assert sum(r.gpu_demand_milli for r in seq) >= capacity
    # The pod list itself, plus resampled extras, in a shuffled order.
    assert not Counter(SYNTH_PODS) - Counter(seq)
    assert seq != SYNTH_PODS + seq[len(SYNTH_PODS) :]
    assert seq == bench.arrivals(SYNTH_PODS, capacity, random.Random(0))


def _write_trace(folder: Path) -> None:
    with open(folder / bench.NODE_FILE, "w") as fh:
        fh.write("sn,cpu_milli,memory_mib,gpu,model\n")
        for n in SYNTH_NODES:
            fh.write(f"{n.name},{n.cpu_milli},{n.memory_mib},{n.num_gpus},{n.gpu_model}\n")
    with open(folder / bench.POD_FILE, "w") as fh:
        fh.write(
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
            "deletion_time,scheduled_time\n"
        )
        for i, p in enumerate(SYNTH_PODS):
            fh.write(f"pod-{i},{p.cpu_milli},{p.memory_mib},{p.num_gpus},{p.gpu_milli},,LS,Running,0,1,0\n")


def test_bench_main_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_trace(tmp_path)
    nodes, pods = bench.load_trace(tmp_path)
    assert nodes == SYNTH_NODES and pods == SYNTH_PODS
    monkeypatch.setenv("TRAINYARD_TRACE_DIR", str(tmp_path))
    out = tmp_path / "results" / "allocator.json"
    assert bench.main(["--seeds", "2", "--quiet", "--output", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data["policies"]) == set(POLICIES)
    fgd = data["policies"]["fgd"]
    assert len(fgd["unallocated_pct_by_seed"]) == 2 and fgd["decisions_per_s"] > 0
    assert data["published_unallocated_pct"]["FGD"] == 4.77
    assert {"unallocated_met", "decisions_per_s_met", "met"} <= set(data["targets"])
    assert "fgd" in capsys.readouterr().out


def test_bench_without_a_trace_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the trace the benchmark writes nothing and says where to point it; it skips (exit 0) on a
    developer's machine and fails (exit 1) under CI=true, where a missing data file must not pass."""
    monkeypatch.setenv("TRAINYARD_TRACE_DIR", str(tmp_path / "missing"))
    out = tmp_path / "allocator.json"
    monkeypatch.delenv("CI", raising=False)
    assert bench.main(["--quick", "--output", str(out)]) == 0
    assert not out.exists()
    assert "TRAINYARD_TRACE_DIR" in capsys.readouterr().out
    monkeypatch.setenv("CI", "true")
    assert bench.main(["--quick", "--output", str(out)]) == 1
    assert not out.exists()


# ---- model sets and memory in eighths -------------------------------------------------------------------


def test_a_request_with_a_model_set_lands_only_on_those_models():
    nodes = [
        Node.empty("t4", 2, 32000, gpu_model="T4"),
        Node.empty("v16", 2, 32000, gpu_model="V100M16"),
        Node.empty("v32", 2, 32000, gpu_model="V100M32"),
    ]
    req = Request.whole(1, gpu_model="V100M16|V100M32")
    wl = Workload({req: 1.0, Request.fraction(500): 1.0})
    alloc = Allocator(nodes, "fgd", wl)
    placed = [alloc.place(req) for _ in range(5)]
    assert {p.node for p in placed[:4]} == {"v16", "v32"}
    assert placed[4] is None  # four V100s in all; the T4s never qualify
    # The workload counts the T4 node's free cards as stranded for that type, not the V100s'.
    assert fragmentation(nodes[0], Workload({req: 1.0})) == 2000.0


def test_memory_in_eighths_follows_the_card_it_lands_on():
    small = Node("s", 64000, [GPU(0, 1000, 40960, 40960)])
    big = Node("b", 64000, [GPU(0, 1000, 81920, 81920)])
    req = Request.fraction(250, gpu_memory_eighths=2)
    alloc = Allocator([small, big], "first_fit", None)
    first = alloc.place(req)
    assert (first.node, first.gpu_memory_mib) == ("s", 10240)
    second = alloc.place(req)
    assert second.node == "s" and small.gpus[0].memory_free_mib == 40960 - 2 * 10240
    # 7/8 of the big card fits nowhere but on it.
    wide = alloc.place(Request.fraction(250, gpu_memory_eighths=7))
    assert (wide.node, wide.gpu_memory_mib) == ("b", 71680)
    with pytest.raises(ValueError):
        Request.fraction(250, gpu_memory_eighths=9)


# ---- nodes whose device plugin decides what their cards can be -------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_whole_cards_and_shares_go_only_to_nodes_that_serve_them(policy: str) -> None:
    from scheduler.policy import SHARES_ONLY, WHOLE_ONLY

    def pool() -> list[Node]:
        sliced = make_node("time-sliced", [FULL_MILLI] * 4)
        sliced.sharing = SHARES_ONLY
        plain = make_node("plain", [FULL_MILLI] * 4)
        plain.sharing = WHOLE_ONLY
        return [sliced, plain]

    nodes = pool()
    alloc = Allocator(nodes, policy, MIX, seed=5)
    for _ in range(4):
        whole = alloc.place(Request.whole(1, cpu_milli=1000))
        assert whole is not None and whole.node == "plain"
    assert alloc.choose(Request.whole(1)) is None  # the time-sliced node's free cards serve shares only
    for _ in range(12):
        share = alloc.place(Request.fraction(250, cpu_milli=1000))
        assert share is not None and share.node == "time-sliced"
    assert choose(policy, pool(), Request.fraction(500), MIX).node == "time-sliced"
    assert choose(policy, pool(), Request.whole(2), MIX).node == "plain"
    assert alloc.choose(Request.cpu_only(1000)) is not None  # CPU-only work fits either


def test_fragmentation_counts_the_cards_a_node_cannot_hand_out_to_a_type() -> None:
    from scheduler.policy import SHARES_ONLY

    shares_only = Workload.from_requests([Request.fraction(500)])
    whole_only = Workload.from_requests([Request.whole(1)])
    node = make_node("time-sliced", [FULL_MILLI, FULL_MILLI])
    node.sharing = SHARES_ONLY
    assert fragmentation(node, shares_only) == 0
    assert fragmentation(node, whole_only) == 2 * FULL_MILLI  # all of it is useless to whole-card work


def test_an_unknown_sharing_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="sharing mode"):
        Node("x", 1000, [], sharing="mig")
