"""Search spaces and searchers: grid, random, and adaptive (asynchronous successive halving, ASHA).

Pure Python, no Django, so the searchers are tested on their own and the benchmark replays them cheaply.
Everything a searcher decides is a function of the experiment's stored fields (the space, the seed, the trial's
number, the values recorded at each rung), never of state kept in memory: the periodic pass that advances an
experiment can restart anywhere and decide the same.

Why not a library: Optuna's pruners decide inside a `Study` backed by its own storage (SQLAlchemy, RDB or
journal), and Ray Tune's schedulers inside its own trial runner; either would keep a second copy of the trials
beside the platform's database. The rule itself is small (`asha_keep`), so it lives here, tested with the rest.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Any

KINDS = ("categorical", "int", "float", "log_uniform")
SEARCHERS = ("grid", "random", "adaptive")
DIRECTIONS = ("minimize", "maximize")
MAX_PARAMETERS = 16
MAX_CATEGORIES = 64
MAX_GRID_POINTS = 32
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


class SpaceError(ValueError):
    """A search space or searcher configuration that cannot be used; `field` names where (dotted)."""

    def __init__(self, message: str, *, field: str, code: str = "invalid_search_space"):
        super().__init__(message)
        self.field = field
        self.code = code


@dataclass(frozen=True)
class Parameter:
    name: str
    kind: str
    low: float | None = None
    high: float | None = None
    values: tuple = ()
    grid_points: int = 3  # float and log-uniform parameters on a grid: this many points, ends included

    def sample(self, rng: random.Random) -> Any:
        if self.kind == "categorical":
            return rng.choice(self.values)
        assert self.low is not None and self.high is not None
        if self.kind == "int":
            return rng.randint(int(self.low), int(self.high))
        if self.kind == "float":
            return rng.uniform(self.low, self.high)
        return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))

    def grid(self) -> list[Any]:
        if self.kind == "categorical":
            return list(self.values)
        assert self.low is not None and self.high is not None
        if self.kind == "int":
            low, high = int(self.low), int(self.high)
            if high - low + 1 <= MAX_GRID_POINTS:
                return list(range(low, high + 1))
            n = self.grid_points
            return sorted({round(low + (high - low) * i / (n - 1)) for i in range(n)})
        n = self.grid_points
        if n == 1:
            return [self.low if self.kind == "float" else math.sqrt(self.low * self.high)]
        if self.kind == "float":
            return [self.low + (self.high - self.low) * i / (n - 1) for i in range(n)]
        a, b = math.log(self.low), math.log(self.high)
        return [math.exp(a + (b - a) * i / (n - 1)) for i in range(n)]


def _number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpaceError(f"{field} must be a number", field=field)
    return float(value)


def parse_space(raw: Any) -> list[Parameter]:
    """`{"lr": {"type": "log_uniform", "min": 1e-4, "max": 0.1}, "layers": {"type": "int", "min": 1, "max": 4},
    "opt": {"type": "categorical", "values": ["sgd", "adam"]}, "dropout": {"type": "float", "min": 0, "max": 0.5}}`
    (a bare list is shorthand for a categorical). Parameters keep the order given."""
    if not isinstance(raw, dict) or not raw:
        raise SpaceError("the search space is a mapping of parameter name to its range", field="space")
    if len(raw) > MAX_PARAMETERS:
        raise SpaceError(f"at most {MAX_PARAMETERS} parameters", field="space")
    out = []
    for name, spec in raw.items():
        field = f"space.{name}"
        if not isinstance(name, str) or not name or len(name) > 40 or set(name) - NAME_CHARS or name[0].isdigit():
            raise SpaceError(f"'{name}' is not a parameter name (letters, digits and _, at most 40)", field="space")
        if isinstance(spec, list):
            spec = {"type": "categorical", "values": spec}
        if not isinstance(spec, dict):
            raise SpaceError(f"{name}: give a type and its range, or a list of values", field=field)
        unknown = set(spec) - {"type", "min", "max", "values", "grid_points"}
        if unknown:
            raise SpaceError(f"{name}: unknown key(s) {', '.join(sorted(map(str, unknown)))}", field=field)
        kind = spec.get("type")
        if kind not in KINDS:
            raise SpaceError(f"{name}: type must be one of {', '.join(KINDS)}", field=f"{field}.type")
        if kind == "categorical":
            values = spec.get("values")
            if not isinstance(values, list) or not values or len(values) > MAX_CATEGORIES:
                raise SpaceError(f"{name}: values is a list of 1 to {MAX_CATEGORIES} choices", field=f"{field}.values")
            if not all(isinstance(v, str | int | float | bool) for v in values) or len(
                {repr(v) for v in values}
            ) != len(values):
                raise SpaceError(f"{name}: values are distinct strings or numbers", field=f"{field}.values")
            out.append(Parameter(name, kind, values=tuple(values)))
            continue
        if "values" in spec:
            raise SpaceError(f"{name}: values is for categorical parameters", field=f"{field}.values")
        low = _number(spec.get("min"), f"{field}.min")
        high = _number(spec.get("max"), f"{field}.max")
        if low > high:
            raise SpaceError(f"{name}: min is above max", field=f"{field}.min")
        if kind == "int" and (low != int(low) or high != int(high)):
            raise SpaceError(f"{name}: an int parameter has whole-number bounds", field=f"{field}.min")
        if kind == "log_uniform" and low <= 0:
            raise SpaceError(f"{name}: a log-uniform parameter needs min > 0", field=f"{field}.min")
        points = spec.get("grid_points", 3)
        if isinstance(points, bool) or not isinstance(points, int) or not 1 <= points <= MAX_GRID_POINTS:
            raise SpaceError(f"{name}: grid_points is 1..{MAX_GRID_POINTS}", field=f"{field}.grid_points")
        out.append(Parameter(name, kind, low=low, high=high, grid_points=points))
    return out


def space_as_data(params: list[Parameter]) -> dict[str, dict]:
    """The normalized space, as stored and shown."""
    out: dict[str, dict] = {}
    for p in params:
        if p.kind == "categorical":
            out[p.name] = {"type": p.kind, "values": list(p.values)}
        else:
            low, high = (int(p.low), int(p.high)) if p.kind == "int" else (p.low, p.high)  # type: ignore[arg-type]
            out[p.name] = {"type": p.kind, "min": low, "max": high, "grid_points": p.grid_points}
    return out


def grid_size(params: list[Parameter]) -> int:
    return math.prod(len(p.grid()) for p in params)


def suggest(params: list[Parameter], *, searcher: str, seed: int, index: int) -> dict[str, Any] | None:
    """The parameters of trial `index` (0-based), or None when the searcher has none left (the grid is done).
    Random and adaptive draw from the same seeded stream, so the same seed gives both the same configurations:
    what differs between them is only which trials run to the end."""
    if searcher == "grid":
        axes = [p.grid() for p in params]
        if index >= math.prod(len(a) for a in axes):
            return None
        combo = next(itertools.islice(itertools.product(*axes), index, None))
        return {p.name: _clean(v) for p, v in zip(params, combo, strict=True)}
    rng = random.Random(f"{seed}:{index}")
    return {p.name: _clean(p.sample(rng)) for p in params}


def _clean(value: Any) -> Any:
    # Six significant digits: enough for a learning rate, short in a command line and a table.
    return float(f"{value:.6g}") if isinstance(value, float) else value


# ---------------------------------------------------------------------------------------------------- ASHA


@dataclass(frozen=True)
class Adaptive:
    """Asynchronous successive halving: rungs at min_steps * reduction**k below max_steps; a trial that reaches a
    rung is compared with every trial that reached it before; outside the best 1/reduction it stops there."""

    max_steps: int
    min_steps: int
    reduction: int = 3

    def rungs(self) -> list[int]:
        out, step = [], self.min_steps
        while step < self.max_steps:
            out.append(step)
            step *= self.reduction
        return out


def parse_adaptive(raw: Any) -> Adaptive:
    """`{"max_steps": 100, "min_steps": 10, "reduction": 3}`: steps are the `step` a trial reports with its
    metric (TRAINYARD_METRIC)."""
    if not isinstance(raw, dict):
        raise SpaceError(
            "the adaptive searcher needs max_steps (and optionally min_steps, reduction)", field="searcher"
        )
    unknown = set(raw) - {"name", "max_steps", "min_steps", "reduction", "seed"}
    if unknown:
        raise SpaceError(f"unknown searcher key(s) {', '.join(sorted(map(str, unknown)))}", field="searcher")

    def whole(key: str, default: int | None, low: int, high: int) -> int:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise SpaceError(f"searcher.{key} must be a whole number {low}..{high}", field=f"searcher.{key}")
        return value

    max_steps = whole("max_steps", None, 2, 10**9)
    min_steps = whole("min_steps", max(1, max_steps // 27), 1, max_steps - 1)
    reduction = whole("reduction", 3, 2, 16)
    return Adaptive(max_steps=max_steps, min_steps=min_steps, reduction=reduction)


def better(a: float, b: float, direction: str) -> bool:
    return a < b if direction == "minimize" else a > b


def asha_keep(value: float, at_rung: list[float], *, direction: str, reduction: int) -> bool:
    """Whether a trial whose metric at a rung is `value` goes on, given every value recorded at that rung
    (`at_rung` includes its own). With fewer than `reduction` values there is nothing to halve yet: it goes on
    (the asynchronous rule promotes early trials and judges later ones against them). Else it goes on when it
    is among the best max(1, n // reduction); ties go on."""
    n = len(at_rung)
    if n < reduction:
        return True
    keep = max(1, n // reduction)
    ranked = sorted(at_rung, reverse=direction == "maximize")
    return not better(ranked[keep - 1], value, direction)


def value_at_rung(points: list[tuple[int, float]], rung: int) -> float | None:
    """The metric a trial had at a rung: its last report at or before the rung's step, once it reported a step
    at or past the rung (until then it has not reached it)."""
    if not points or max(s for s, _ in points) < rung:
        return None
    before = [(s, v) for s, v in points if s <= rung]
    return (before[-1] if before else min(points))[1]
