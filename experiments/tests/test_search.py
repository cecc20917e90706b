"""The searchers on their own: space parsing, grid order, seeded sampling, rungs and the ASHA stopping rule."""

import math
import random

import pytest

from experiments import search

SPACE = {
    "lr": {"type": "log_uniform", "min": 1e-4, "max": 1e-1},
    "layers": {"type": "int", "min": 1, "max": 4},
    "opt": ["sgd", "adam"],
    "dropout": {"type": "float", "min": 0, "max": 0.5, "grid_points": 2},
}


def test_a_space_parses_in_order_and_normalizes():
    params = search.parse_space(SPACE)
    assert [p.name for p in params] == ["lr", "layers", "opt", "dropout"]
    data = search.space_as_data(params)
    assert data["opt"] == {"type": "categorical", "values": ["sgd", "adam"]}
    assert data["layers"] == {"type": "int", "min": 1, "max": 4, "grid_points": 3}
    assert search.parse_space(data) == params  # stored form reads back the same


@pytest.mark.parametrize(
    ("space", "field"),
    [
        ({}, "space"),
        ([], "space"),
        ({"1x": [1]}, "space"),
        ({"a-b": [1]}, "space"),
        ({"lr": {"type": "normal", "min": 0, "max": 1}}, "space.lr.type"),
        ({"lr": {"type": "float", "min": 2, "max": 1}}, "space.lr.min"),
        ({"lr": {"type": "float", "min": "a", "max": 1}}, "space.lr.min"),
        ({"lr": {"type": "float", "min": 0, "max": float("inf")}}, "space.lr.max"),
        ({"lr": {"type": "log_uniform", "min": 0, "max": 1}}, "space.lr.min"),
        ({"n": {"type": "int", "min": 0.5, "max": 3}}, "space.n.min"),
        ({"n": {"type": "int", "min": 0, "max": 3, "step": 1}}, "space.n"),
        ({"c": {"type": "categorical", "values": []}}, "space.c.values"),
        ({"c": {"type": "categorical", "values": [1, 1]}}, "space.c.values"),
        ({"c": {"type": "categorical", "values": [{"a": 1}]}}, "space.c.values"),
        ({"c": {"type": "float", "min": 0, "max": 1, "values": [1]}}, "space.c.values"),
        ({"x": {"type": "float", "min": 0, "max": 1, "grid_points": 0}}, "space.x.grid_points"),
        ({"x": "text"}, "space.x"),
    ],
)
def test_bad_spaces_say_where(space, field):
    with pytest.raises(search.SpaceError) as info:
        search.parse_space(space)
    assert info.value.field == field


def test_the_grid_walks_every_combination_once_then_ends():
    params = search.parse_space({"a": [1, 2, 3], "b": {"type": "log_uniform", "min": 1e-3, "max": 1e-1}})
    assert search.grid_size(params) == 9
    seen = [search.suggest(params, searcher="grid", seed=0, index=i) for i in range(9)]
    assert len({(s["a"], s["b"]) for s in seen}) == 9
    assert seen[0] == {"a": 1, "b": 0.001} and seen[1] == {"a": 1, "b": 0.01} and seen[8] == {"a": 3, "b": 0.1}
    assert search.suggest(params, searcher="grid", seed=0, index=9) is None


def test_int_grid_takes_every_value_when_few_else_spaced_points():
    few = search.parse_space({"n": {"type": "int", "min": 2, "max": 5}})[0]
    assert few.grid() == [2, 3, 4, 5]
    many = search.parse_space({"n": {"type": "int", "min": 0, "max": 1000, "grid_points": 3}})[0]
    assert many.grid() == [0, 500, 1000]


def test_random_is_seeded_per_trial_and_stays_in_range():
    params = search.parse_space(SPACE)
    a = [search.suggest(params, searcher="random", seed=7, index=i) for i in range(200)]
    b = [search.suggest(params, searcher="random", seed=7, index=i) for i in range(200)]
    assert a == b  # a restarted pass decides the same
    assert a != [search.suggest(params, searcher="random", seed=8, index=i) for i in range(200)]
    # The adaptive searcher draws the same configurations: only early stopping differs.
    assert a == [search.suggest(params, searcher="adaptive", seed=7, index=i) for i in range(200)]
    for s in a:
        assert 1e-4 <= s["lr"] <= 1e-1 and s["layers"] in {1, 2, 3, 4} and s["opt"] in {"sgd", "adam"}
        assert 0 <= s["dropout"] <= 0.5
    assert {s["layers"] for s in a} == {1, 2, 3, 4}


def test_log_uniform_is_uniform_in_the_logarithm():
    p = search.parse_space({"lr": {"type": "log_uniform", "min": 1e-6, "max": 1.0}})[0]
    rng = random.Random(1)
    logs = [math.log10(p.sample(rng)) for _ in range(6000)]
    below = sum(1 for x in logs if x < -3) / len(logs)  # half of the decades are below 1e-3
    assert 0.46 < below < 0.54


def test_rungs_grow_by_the_reduction_factor():
    assert search.Adaptive(max_steps=100, min_steps=4, reduction=3).rungs() == [4, 12, 36]
    assert search.Adaptive(max_steps=10, min_steps=5, reduction=2).rungs() == [5]
    adaptive = search.parse_adaptive({"name": "adaptive", "max_steps": 81})
    assert adaptive == search.Adaptive(max_steps=81, min_steps=3, reduction=3)


@pytest.mark.parametrize(
    "raw",
    [None, {"name": "adaptive"}, {"max_steps": 1}, {"max_steps": 10, "min_steps": 10},
     {"max_steps": 10, "reduction": 1}, {"max_steps": 10, "eta": 3}, {"max_steps": True}],
)  # fmt: skip
def test_bad_adaptive_settings_are_refused(raw):
    with pytest.raises(search.SpaceError):
        search.parse_adaptive(raw)


def test_asha_keeps_the_best_share_and_stops_the_rest():
    # fewer values than the reduction factor: nothing to halve yet
    assert search.asha_keep(9.0, [1.0, 9.0], direction="minimize", reduction=3)
    # 6 values, reduction 3: the best 2 go on
    values = [0.5, 0.1, 0.9, 0.3, 0.7, 0.2]
    kept = [v for v in values if search.asha_keep(v, values, direction="minimize", reduction=3)]
    assert kept == [0.1, 0.2]
    kept = [v for v in values if search.asha_keep(v, values, direction="maximize", reduction=3)]
    assert kept == [0.9, 0.7]
    # a tie with the last kept value goes on
    assert search.asha_keep(0.2, [0.1, 0.2, 0.2, 0.9, 0.8, 0.7], direction="minimize", reduction=3)


def test_asha_in_arrival_order_stops_a_late_bad_trial_and_keeps_a_late_good_one():
    seen: list[float] = []
    decisions = []
    for value in [0.5, 0.6, 0.4, 0.9, 0.1, 0.8]:
        seen.append(value)
        decisions.append(search.asha_keep(value, seen, direction="minimize", reduction=3))
    #           0.5   0.6   0.4 (best of 3)  0.9 (4th of 4)  0.1 (best)  0.8 (5th of 6)
    assert decisions == [True, True, True, False, True, False]


def test_value_at_rung_waits_until_the_trial_reaches_it():
    points = [(1, 5.0), (2, 4.0), (4, 3.0)]
    assert search.value_at_rung(points, 3) == 4.0  # last report at or before the rung, once past it
    assert search.value_at_rung(points, 4) == 3.0
    assert search.value_at_rung(points, 5) is None
    assert search.value_at_rung([], 1) is None


def test_asha_spends_less_than_running_everything_and_finds_the_same_best():
    """A replay on synthetic curves: ASHA over 64 configurations ends with the best configuration run to the end,
    for a fraction of the steps all 64 run to the end would cost."""
    rng = random.Random(3)
    finals = [rng.uniform(0.05, 1.0) for _ in range(64)]

    def curve(final: float, step: int) -> float:
        return final + (1.0 - final) * math.exp(-step / 10)

    adaptive = search.Adaptive(max_steps=81, min_steps=3, reduction=3)
    at_rung: dict[int, list[float]] = {}
    spent, finished = 0, []
    for i, final in enumerate(finals):
        for rung in adaptive.rungs():
            value = curve(final, rung)
            at_rung.setdefault(rung, []).append(value)
            if not search.asha_keep(value, at_rung[rung], direction="minimize", reduction=3):
                spent += rung
                break
        else:
            spent += adaptive.max_steps
            finished.append(i)
    best = min(range(64), key=lambda i: finals[i])
    assert best in finished
    assert spent < 0.5 * 64 * adaptive.max_steps
