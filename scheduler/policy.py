"""GPU placement policies: which node, which GPUs (or which slice of which GPU) a request gets.

Pure Python, standard library only, and free of Django, so that the pool service, the allocator benchmark in
``bench/`` and the tests share one implementation.

Data model
    * :class:`Node`: free CPU (milli-cores), optionally free memory (MiB), a GPU model, a list of
      :class:`GPU`, an ``eligible`` flag (a cordoned or unhealthy node is never chosen), and what its cards
      can be handed out as (``sharing``): anything (the default), whole cards only (:data:`WHOLE_ONLY`: a
      plain device plugin advertises no shares) or shares only (:data:`SHARES_ONLY`: a time-sliced node
      advertises only its shared resource).
    * :class:`GPU`: free compute in milli (0..1000), optionally free and total memory (MiB), and an
      ``eligible`` flag; an ineligible card (unhealthy, quarantined, excluded for a retry) is never chosen.
    * :class:`Request`: ``num_gpus`` whole GPUs (exclusive, only fully free cards), or a share
      ``gpu_milli < 1000`` of exactly one GPU, or CPU only; plus CPU, memory and (for a share) GPU memory.
    * :class:`Placement`: the answer: node, GPU indices, what is taken from each.

Policies (:data:`POLICIES`)
    ``random``, ``first_fit``, ``best_fit`` (least normalised CPU + GPU left on the node), ``worst_fit``,
    ``fgd_pure`` and ``fgd``, the platform policy.

    ``fgd_pure`` follows the idea of fragmentation gradient descent (Weng et al., "Beware of Fragmentation",
    USENIX ATC '23). A :class:`Workload` lists the request types the cluster expects and how popular each is.
    For one type, a node's free GPU compute counts as fragmented where that type could not use it: all of it
    when the type does not fit on the node at all (too little CPU or memory, wrong model, no card that can
    take it), otherwise the free compute of the cards that cannot take it. A node's expected fragmentation is
    the popularity-weighted sum over the types; a request goes to the node and card where that expectation
    grows least. ``fgd`` adds a small packing term to that growth (:data:`DEFAULT_PACK_WEIGHT`).

Entry points
    :func:`choose` for a one-off decision over a list of nodes; :class:`Allocator` to place many requests
    against the same pool. The allocator groups nodes whose free state is identical and caches, per request
    shape, the score of each group, so a decision is one pass over the distinct states that could take the
    request, evaluating only the states it has not scored before.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import mul

FULL_MILLI = 1000
POLICIES: tuple[str, ...] = ("random", "first_fit", "best_fit", "worst_fit", "fgd_pure", "fgd")
TIE_BREAKS: tuple[str, ...] = ("index", "random")
# ``fgd`` adds this many milli-GPUs to a candidate's fragmentation growth for every whole GPU of compute the
# node would still have free afterwards. Fragmentation growth alone is zero for most candidates of a CPU-only
# or whole-GPU request; among those it pays to fill nodes already in use: CPU-only work goes where the GPUs
# are taken (its CPU strands nothing there) and empty nodes stay whole for multi-GPU requests. On the Alibaba
# 2023 trace (bench/allocator.py) 20..30 works best; 25 was chosen on seeds the reported run does not use.
DEFAULT_PACK_WEIGHT = 25.0
_FGD_POLICIES = frozenset({"fgd", "fgd_pure"})

# Stands in for "not tracked" memory: larger than any request, so it never blocks a placement.
_UNTRACKED = 1 << 62
_EPS = 1e-9
_MISS = object()
# Caches are dropped and rebuilt past these sizes so that a long-lived process stays bounded.
_MAX_STATES = 200_000
_MAX_WORKLOAD_CACHE = 500_000
_MAX_REQUEST_SHAPES = 10_000
# Random draws the ``random`` policy tries before it falls back to scanning every feasible node.
_RANDOM_DRAWS = 64
# Demand sets whose unions are tried as the most loaded group of models (2**N unions at most).
_MAX_UNION_SETS = 10

# A GPU's free state as the caches see it: (free milli, free memory or _UNTRACKED, fully free, total memory
# or _UNTRACKED). The total only matters to requests that ask for a share of the card's memory in eighths.
GpuState = tuple[int, int, bool, int]
# A node's free state: (free CPU milli, free memory or _UNTRACKED, GPU model, sorted eligible GPU states,
# sharing mode).
NodeState = tuple[int, int, str, tuple[GpuState, ...], str]

# Node sharing modes: what the node's cards can be handed out as.
ANY_SHARING = ""
WHOLE_ONLY = "whole"
SHARES_ONLY = "shares"
SHARING_MODES = (ANY_SHARING, WHOLE_ONLY, SHARES_ONLY)


@dataclass
class GPU:
    """One physical card as the placement sees it."""

    index: int
    milli_free: int = FULL_MILLI
    memory_free_mib: int | None = None
    memory_total_mib: int | None = None
    eligible: bool = True

    @property
    def fully_free(self) -> bool:
        if self.milli_free < FULL_MILLI:
            return False
        if self.memory_total_mib is None or self.memory_free_mib is None:
            return True
        return self.memory_free_mib >= self.memory_total_mib

    def state(self) -> GpuState:
        mem = _UNTRACKED if self.memory_free_mib is None else self.memory_free_mib
        total = _UNTRACKED if self.memory_total_mib is None else self.memory_total_mib
        return (self.milli_free, mem, self.fully_free, total)


@dataclass
class Node:
    """A node's free resources. ``cpu_total_milli``/``memory_total_mib`` only feed best/worst-fit scoring;
    when absent, the free amounts seen when an :class:`Allocator` is built stand in for the capacity."""

    name: str
    cpu_free_milli: int
    gpus: list[GPU] = field(default_factory=list)
    memory_free_mib: int | None = None
    gpu_model: str = ""
    eligible: bool = True
    cpu_total_milli: int | None = None
    memory_total_mib: int | None = None
    sharing: str = ANY_SHARING

    def __post_init__(self) -> None:
        if self.sharing not in SHARING_MODES:
            raise ValueError(f"unknown node sharing mode {self.sharing!r}")

    @classmethod
    def empty(
        cls,
        name: str,
        num_gpus: int,
        cpu_milli: int,
        memory_mib: int | None = None,
        gpu_model: str = "",
        gpu_memory_mib: int | None = None,
    ) -> Node:
        """A node with nothing allocated yet."""
        gpus = [GPU(i, FULL_MILLI, gpu_memory_mib, gpu_memory_mib) for i in range(num_gpus)]
        return cls(name, cpu_milli, gpus, memory_mib, gpu_model, True, cpu_milli, memory_mib)

    def state(self) -> NodeState:
        mem = _UNTRACKED if self.memory_free_mib is None else self.memory_free_mib
        gpus = tuple(sorted(g.state() for g in self.gpus if g.eligible))
        return (self.cpu_free_milli, mem, self.gpu_model, gpus, self.sharing)


@dataclass(frozen=True)
class Request:
    """What one placement asks for.

    ``num_gpus == 0``: CPU only. ``num_gpus >= 1`` with ``gpu_milli == 1000``: that many whole GPUs,
    exclusively. ``num_gpus == 1`` with ``gpu_milli < 1000``: a share of one GPU (and ``gpu_memory_mib`` of
    its memory, where the pool tracks GPU memory; or ``gpu_memory_eighths`` of whichever card it lands on).
    ``gpu_model`` restricts GPU requests to nodes of one of the given models: a name, or a set of names (the
    trace's ``V100M16|V100M32``); it is stored as a frozenset.
    """

    num_gpus: int = 0
    gpu_milli: int = FULL_MILLI
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_memory_mib: int = 0
    gpu_model: frozenset[str] | str | None = None
    gpu_memory_eighths: int = 0

    def __post_init__(self) -> None:
        if self.num_gpus < 0 or self.cpu_milli < 0 or self.memory_mib < 0 or self.gpu_memory_mib < 0:
            raise ValueError("request amounts must not be negative")
        if not 0 <= self.gpu_memory_eighths <= 8:
            raise ValueError("gpu_memory_eighths must be in 0..8")
        model = self.gpu_model
        if isinstance(model, str):
            model = frozenset(m.strip() for m in model.split("|") if m.strip()) or None
        elif model is not None:
            model = frozenset(model) or None
        object.__setattr__(self, "gpu_model", model)
        if self.num_gpus == 0:
            # A CPU-only request carries no GPU share; normalise so equal requests hash equal.
            object.__setattr__(self, "gpu_milli", 0)
            object.__setattr__(self, "gpu_memory_mib", 0)
            object.__setattr__(self, "gpu_memory_eighths", 0)
            object.__setattr__(self, "gpu_model", None)
            return
        if not 0 < self.gpu_milli <= FULL_MILLI:
            raise ValueError(f"gpu_milli must be in 1..{FULL_MILLI}, got {self.gpu_milli}")
        if self.num_gpus > 1 and self.gpu_milli != FULL_MILLI:
            raise ValueError("a share of a GPU (gpu_milli < 1000) is only possible with num_gpus == 1")
        if self.gpu_milli == FULL_MILLI:
            object.__setattr__(self, "gpu_memory_mib", 0)
            object.__setattr__(self, "gpu_memory_eighths", 0)
        elif self.gpu_memory_eighths:
            object.__setattr__(self, "gpu_memory_mib", 0)

    @classmethod
    def whole(
        cls,
        num_gpus: int,
        *,
        cpu_milli: int = 0,
        memory_mib: int = 0,
        gpu_model: frozenset[str] | str | None = None,
    ) -> Request:
        if num_gpus < 1:
            raise ValueError("a whole-GPU request needs at least one GPU")
        return cls(num_gpus, FULL_MILLI, cpu_milli, memory_mib, 0, gpu_model)

    @classmethod
    def fraction(
        cls,
        gpu_milli: int,
        *,
        cpu_milli: int = 0,
        memory_mib: int = 0,
        gpu_memory_mib: int = 0,
        gpu_model: frozenset[str] | str | None = None,
        gpu_memory_eighths: int = 0,
    ) -> Request:
        return cls(1, gpu_milli, cpu_milli, memory_mib, gpu_memory_mib, gpu_model, gpu_memory_eighths)

    @classmethod
    def cpu_only(cls, cpu_milli: int, memory_mib: int = 0) -> Request:
        return cls(0, 0, cpu_milli, memory_mib)

    @property
    def exclusive(self) -> bool:
        return self.num_gpus >= 1 and self.gpu_milli == FULL_MILLI

    @property
    def fractional(self) -> bool:
        return self.num_gpus == 1 and self.gpu_milli < FULL_MILLI

    def memory_on(self, total_mib: int) -> int:
        """GPU memory this request takes from a card with ``total_mib`` (untracked totals give 0)."""
        if self.gpu_memory_eighths:
            return 0 if total_mib >= _UNTRACKED else total_mib * self.gpu_memory_eighths // 8
        return self.gpu_memory_mib

    @property
    def gpu_demand_milli(self) -> int:
        """GPU compute asked for in all, in milli-GPUs (2 whole GPUs = 2000)."""
        return self.num_gpus * self.gpu_milli


@dataclass(frozen=True)
class Placement:
    """Where a request goes. ``gpu_indices`` are :attr:`GPU.index` values on ``node``; each of them gives
    ``gpu_milli`` compute (1000 and the whole card when ``exclusive``) and ``gpu_memory_mib`` memory."""

    node: str
    node_index: int
    gpu_indices: tuple[int, ...]
    gpu_milli: int
    gpu_memory_mib: int
    cpu_milli: int
    memory_mib: int
    exclusive: bool
    policy: str
    score: float | None = None


class Workload:
    """The target workload: request types and their popularity, used by ``fgd`` and :func:`fragmentation`.

    Only the shape of a request matters (GPU count and share, CPU, memory, model); weights are normalised to
    sum to one. The object also holds caches of per-state computations, so reuse one instance.
    """

    def __init__(self, weights: Mapping[Request, float]) -> None:
        total = float(sum(w for w in weights.values() if w > 0))
        if total <= 0:
            raise ValueError("a workload needs at least one request type with a positive weight")
        classes: dict[tuple[int, int, int, int], int] = {}
        raw: list[tuple[int, int, frozenset[str] | None, int, float]] = []
        for req, w in weights.items():
            if w <= 0:
                continue
            key = (req.num_gpus, req.gpu_milli, req.gpu_memory_mib, req.gpu_memory_eighths)
            cls_idx = classes.setdefault(key, len(classes))
            model = req.gpu_model if req.num_gpus else None
            raw.append((req.cpu_milli, req.memory_mib, model, cls_idx, w / total))
        # GPU classes: (num_gpus, milli per GPU, GPU memory per GPU, eighths of the card); index == position.
        self._classes: tuple[tuple[int, int, int, int], ...] = tuple(classes)
        # Whether a type fits a node's CPU and memory only depends on how many of the distinct CPU (memory)
        # amounts of the workload the node can cover, so host weights are cached by those two counts.
        self._cpu_levels = sorted({t[0] for t in raw})
        self._mem_levels = sorted({t[1] for t in raw})
        cpu_rank = {v: i for i, v in enumerate(self._cpu_levels)}
        mem_rank = {v: i for i, v in enumerate(self._mem_levels)}
        self._types = tuple((cpu_rank[c], mem_rank[m], model, k, w) for c, m, model, k, w in raw)
        self.weights: dict[Request, float] = {r: w / total for r, w in weights.items() if w > 0}
        self._host_cache: dict[tuple[int, int, str], tuple[float, tuple[float, ...]]] = {}
        self._gpu_cache: dict[tuple[GpuState, ...], tuple[int, tuple[int, ...]]] = {}
        self._frag_cache: dict[NodeState, float] = {}
        # Per GPU model, each type's weight among the requests that model's nodes will see (None: every node
        # sees the whole mix, and a type that cannot run on a node counts all of its free GPU as fragmented).
        self._per_model: dict[str, tuple[float, ...]] | None = None
        self._routed: dict[tuple[tuple[str, int], ...], Workload] = {}
        # GPU demand per set of models a type accepts (None: any model), as shares of the mix's GPU demand.
        demand: dict[frozenset[str] | None, float] = {}
        for _c, _m, model, k, w in self._types:
            num, milli = self._classes[k][:2]
            if num:
                demand[model] = demand.get(model, 0.0) + w * num * milli
        total_demand = math.fsum(demand.values())
        self.demand_by_models: dict[frozenset[str] | None, float] = (
            {k: v / total_demand for k, v in demand.items()} if total_demand > 0 else {}
        )
        self.pinned = any(k is not None for k in self.demand_by_models)

    def routed(self, capacity: Mapping[str, int]) -> Workload:
        """The same mix as each GPU model's nodes will see it on a pool with ``capacity`` (GPU milli per model).

        Every type's GPU demand goes to the models it accepts, spread as :func:`route` balances it: a model that
        pinned requests already ask for more than it has gets none of the requests that could run elsewhere. A
        node's fragmentation then counts only the types that may land on its model, each weighted by how often
        it is expected there (its share of the demand routed to the model, per request), so a type that can
        never run on a node does not make that node's free GPUs look stranded. Equal to this workload when no
        type names a model. Cached per capacity, so that allocators rebuilt on the same pool share caches."""
        key = tuple(sorted((m, int(c)) for m, c in capacity.items() if c > 0))
        hit = self._routed.get(key)
        if hit is not None:
            return hit
        view = Workload.__new__(Workload)
        view.__dict__.update(self.__dict__)
        view._host_cache, view._gpu_cache, view._frag_cache, view._routed = {}, {}, {}, {}
        cap = dict(key)
        shares = route(self.demand_by_models, cap)
        total_cap = float(sum(cap.values())) or 1.0
        per_model: dict[str, list[float]] = {m: [0.0] * len(self._types) for m in cap}
        for i, (_c, _m, model, k, w) in enumerate(self._types):
            num = self._classes[k][0]
            for m, c in cap.items():
                # CPU-only types go anywhere, in proportion to the GPUs (their nodes).
                share = shares.get(model, {}).get(m, 0.0) if num else c / total_cap
                per_model[m][i] = w * share
        normalised: dict[str, tuple[float, ...]] = {}
        for m, ws in per_model.items():
            tot = math.fsum(ws)
            if tot > 0:
                normalised[m] = tuple(x / tot for x in ws)
        view._per_model = normalised if self.pinned else None
        if len(self._routed) > 64:
            self._routed.clear()
        self._routed[key] = view
        return view

    @classmethod
    def from_requests(cls, requests: Iterable[Request]) -> Workload:
        """Popularity = how often each request shape occurs in ``requests``."""
        counts: dict[Request, float] = {}
        for r in requests:
            counts[r] = counts.get(r, 0.0) + 1.0
        return cls(counts)

    def __len__(self) -> int:
        return len(self._types)

    def clear_cache(self) -> None:
        self._host_cache.clear()
        self._gpu_cache.clear()
        self._frag_cache.clear()

    def node_fragmentation(self, node: Node) -> float:
        """Expected fragmented GPU compute of ``node`` (milli-GPUs) against this workload."""
        if not node.eligible:
            return 0.0
        return self._state_frag(node.state())

    # -- internals, all keyed by plain tuples so that equal states share work ------------------------------

    def _host_weights(
        self, cpu: int, mem: int, model: str, sharing: str = ANY_SHARING
    ) -> tuple[float, tuple[float, ...]]:
        """Weight of the types whose CPU, memory, model and sharing mode fit, summed per GPU class; plus their
        total."""
        n_cpu = bisect_right(self._cpu_levels, cpu)
        n_mem = bisect_right(self._mem_levels, mem)
        key = (n_cpu, n_mem, model, sharing)
        hit = self._host_cache.get(key)
        if hit is not None:
            return hit
        acc = [0.0] * len(self._classes)
        per_model = self._per_model.get(model) if self._per_model is not None else None
        if per_model is None:
            for t_cpu, t_mem, t_model, cls_idx, w in self._types:
                num, milli = self._classes[cls_idx][:2]
                if not _sharing_allows(sharing, num, milli):
                    continue
                if t_cpu < n_cpu and t_mem < n_mem and (t_model is None or model in t_model):
                    acc[cls_idx] += w
        else:
            # Only the types routed to this model count; those that cannot be hosted here strand every free GPU.
            for (t_cpu, t_mem, _t_model, cls_idx, _w), w in zip(self._types, per_model, strict=True):
                if not w:
                    continue
                num, milli = self._classes[cls_idx][:2]
                if t_cpu < n_cpu and t_mem < n_mem and _sharing_allows(sharing, num, milli):
                    acc[cls_idx] += w
        res = (math.fsum(acc), tuple(acc))
        if len(self._host_cache) > _MAX_WORKLOAD_CACHE:
            self._host_cache.clear()
        self._host_cache[key] = res
        return res

    def _gpu_frag(self, gpus: tuple[GpuState, ...]) -> tuple[int, tuple[int, ...]]:
        """Free compute of the node, and per GPU class the part of it that class could not use."""
        hit = self._gpu_cache.get(gpus)
        if hit is not None:
            return hit
        total = 0
        full = 0
        for milli, _mem, is_full, _total in gpus:
            total += milli
            if is_full:
                full += 1
        out: list[int] = []
        for num, milli_req, mem_req, eighths in self._classes:
            if num == 0:
                out.append(0)
            elif milli_req == FULL_MILLI:
                # Only fully free cards serve whole-GPU types; partly used ones are stranded for them.
                out.append(total - FULL_MILLI * full if full >= num else total)
            else:
                usable = 0
                fits = False
                for milli, mem, _f, card in gpus:
                    need = (0 if card >= _UNTRACKED else card * eighths // 8) if eighths else mem_req
                    if milli >= milli_req and mem >= need:
                        usable += milli
                        fits = True
                out.append(total - usable if fits else total)
        res = (total, tuple(out))
        if len(self._gpu_cache) > _MAX_WORKLOAD_CACHE:
            self._gpu_cache.clear()
        self._gpu_cache[gpus] = res
        return res

    def _combine(self, host: tuple[float, tuple[float, ...]], gpus: tuple[GpuState, ...]) -> float:
        ok, per_class = host
        total, frag = self._gpu_frag(gpus)
        # Types that cannot be hosted at all see every free GPU as a fragment.
        return total * (1.0 - ok) + sum(map(mul, per_class, frag))

    def _state_frag(self, state: NodeState) -> float:
        hit = self._frag_cache.get(state)
        if hit is not None:
            return hit
        cpu, mem, model, gpus, sharing = state
        val = self._combine(self._host_weights(cpu, mem, model, sharing), gpus)
        if len(self._frag_cache) > _MAX_WORKLOAD_CACHE:
            self._frag_cache.clear()
        self._frag_cache[state] = val
        return val


# ---- GPU demand against each model's capacity ----------------------------------------------------------------


def _peel(
    demand: Mapping[frozenset[str] | None, float], capacity: Mapping[str, float]
) -> tuple[dict[str, float], list[tuple[float, list[str], dict[frozenset[str] | None, list[str]]]]]:
    """Split the models into groups by load: the group whose capacity the demand that can only go to it loads
    most takes that level (demand / capacity), leaves with that demand, and the rest is split again. The
    result is the balanced spread in which no demand sits on a more loaded model than it has to. Returns each
    model's level and, per group (most loaded first), its level, models and the demand sets it serves with
    the models of the group each may use. Models without capacity and demand that reaches none are left out."""
    models = sorted(m for m, c in capacity.items() if c > 0)
    bit = {m: 1 << i for i, m in enumerate(models)}
    full = (1 << len(models)) - 1
    sets: dict[int, float] = {}
    members: dict[int, list[frozenset[str] | None]] = {}
    for key, d in demand.items():
        if d <= 0:
            continue
        mask = full if key is None else sum(bit.get(m, 0) for m in key)
        if mask:
            sets[mask] = sets.get(mask, 0.0) + d
            members.setdefault(mask, []).append(key)
    cap = [float(capacity[m]) for m in models]
    levels: dict[str, float] = {}
    groups: list[tuple[float, list[str], dict[frozenset[str] | None, list[str]]]] = []
    remaining = full
    while remaining and sets:
        # Candidate groups: unions of the demand sets (the most demanded ones, to stay bounded).
        unions = {0}
        for mask in sorted(sets, key=sets.__getitem__, reverse=True)[:_MAX_UNION_SETS]:
            unions |= {u | mask for u in unions}
        unions.add(remaining)
        best, best_u = -1.0, 0
        for u in unions:
            if not u:
                continue
            c = math.fsum(cap[i] for i in range(len(models)) if u >> i & 1)
            d = math.fsum(v for mask, v in sets.items() if not mask & ~u)
            level = d / c
            if level > best * (1 + 1e-12) or (level >= best * (1 - 1e-12) and u.bit_count() > best_u.bit_count()):
                best, best_u = level, u
        names = [m for i, m in enumerate(models) if best_u >> i & 1]
        served = {}
        for mask in [m for m in sets if not m & ~best_u]:
            del sets[mask]
            for key in members.pop(mask):
                served[key] = [m for i, m in enumerate(models) if mask >> i & 1]
        for m in names:
            levels[m] = best
        groups.append((best, names, served))
        remaining &= ~best_u
        rest_sets: dict[int, float] = {}
        rest_members: dict[int, list[frozenset[str] | None]] = {}
        for mask, v in sets.items():
            r = mask & remaining
            rest_sets[r] = rest_sets.get(r, 0.0) + v
            rest_members.setdefault(r, []).extend(members[mask])
        sets, members = rest_sets, rest_members
    for m in models:
        levels.setdefault(m, 0.0)
    return levels, groups


def model_levels(demand: Mapping[frozenset[str] | None, float], capacity: Mapping[str, float]) -> dict[str, float]:
    """Each model's load when ``demand`` (per set of models a request accepts; None: any) is spread over
    ``capacity`` as evenly as the sets allow: above the others where pinned demand alone asks for more."""
    return _peel(demand, capacity)[0]


def route(
    demand: Mapping[frozenset[str] | None, float], capacity: Mapping[str, float]
) -> dict[frozenset[str] | None, dict[str, float]]:
    """Per demand set, the share of its demand each model takes in that balanced spread: within a group of
    equally loaded models, by iterative proportional fitting (each model gets the group's level times its
    capacity; each set spreads over its models of the group as evenly as that allows)."""
    out: dict[frozenset[str] | None, dict[str, float]] = {}
    for level, names, served in _peel(demand, capacity)[1]:
        keys = [k for k in served if demand.get(k, 0.0) > 0]
        flow = {k: {m: float(capacity[m]) for m in served[k]} for k in keys}
        for _ in range(200):
            for k in keys:
                row = math.fsum(flow[k].values())
                for m in flow[k]:
                    flow[k][m] *= demand[k] / row
            col = dict.fromkeys(names, 0.0)
            for k in keys:
                for m, v in flow[k].items():
                    col[m] += v
            worst = 0.0
            for k in keys:
                for m in flow[k]:
                    want = level * capacity[m]
                    if col[m] > 0:
                        flow[k][m] *= want / col[m]
                        worst = max(worst, abs(col[m] - want) / want)
            if worst < 1e-9:
                break
        for k in keys:
            row = math.fsum(flow[k].values())
            out[k] = {m: v / row for m, v in flow[k].items()} if row > 0 else {}
    return out


def fragmentation(nodes: Node | Iterable[Node], workload: Workload) -> float:
    """Expected fragmented GPU compute (milli-GPUs) of one node or of a whole pool against ``workload``.

    Divide by the pool's GPU capacity in milli to get a share.
    """
    if isinstance(nodes, Node):
        return workload.node_fragmentation(nodes)
    return math.fsum(workload.node_fragmentation(n) for n in nodes)


# ---- feasibility and GPU choice on one node ------------------------------------------------------


def _sharing_allows(sharing: str, num_gpus: int, gpu_milli: int) -> bool:
    """Whether a node of this sharing mode can hand out a request of this shape (CPU-only always fits)."""
    if not num_gpus or sharing == ANY_SHARING:
        return True
    return (gpu_milli == FULL_MILLI) == (sharing == WHOLE_ONLY)


def _node_admits(state: NodeState, req: Request) -> bool:
    cpu, mem, model, _gpus, sharing = state
    if cpu < req.cpu_milli or mem < req.memory_mib:
        return False
    if not _sharing_allows(sharing, req.num_gpus, req.gpu_milli):
        return False
    return not (req.num_gpus and req.gpu_model is not None and model not in req.gpu_model)


def _gpu_fits(g: GpuState, req: Request) -> bool:
    if req.gpu_milli == FULL_MILLI:
        return g[2]
    return g[0] >= req.gpu_milli and g[1] >= req.memory_on(g[3])


def _feasible(state: NodeState, req: Request) -> bool:
    if not _node_admits(state, req):
        return False
    if req.num_gpus == 0:
        return True
    gpus = state[3]
    if req.exclusive:
        return sum(1 for g in gpus if g[2]) >= req.num_gpus
    return any(_gpu_fits(g, req) for g in gpus)


def has_room(node: Node, req: Request) -> bool:
    """Whether the node's eligible cards and host have room for one placement of `req` now."""
    return _feasible(node.state(), req)


def _after(state: NodeState, req: Request) -> list[tuple[GpuState | None, tuple[GpuState, ...]]]:
    """The distinct GPU states a request could leave on a node: (GPU state used, resulting GPU tuple)."""
    gpus = state[3]
    if req.num_gpus == 0:
        return [(None, gpus)]
    if req.exclusive:
        out = list(gpus)
        taken = 0
        for i, g in enumerate(out):
            if g[2]:
                out[i] = (0, g[1] if g[1] == _UNTRACKED else 0, False, g[3])
                taken += 1
                if taken == req.num_gpus:
                    break
        return [(None, tuple(sorted(out)))]
    res: list[tuple[GpuState | None, tuple[GpuState, ...]]] = []
    prev: GpuState | None = None
    for i, g in enumerate(gpus):
        if g == prev or not _gpu_fits(g, req):
            continue
        prev = g
        mem = g[1] if g[1] == _UNTRACKED else g[1] - req.memory_on(g[3])
        out = list(gpus)
        out[i] = (g[0] - req.gpu_milli, mem, False, g[3])
        res.append((g, tuple(sorted(out))))
    return res


def _pick_gpus(
    node: Node,
    req: Request,
    policy: str,
    want: GpuState | None,
    rng: random.Random,
) -> tuple[int, ...]:
    """Concrete GPU indices on ``node`` for an already feasible request."""
    if req.num_gpus == 0:
        return ()
    usable = [g for g in node.gpus if g.eligible]
    if req.exclusive:
        free = [g for g in usable if g.fully_free]
        chosen = rng.sample(free, req.num_gpus) if policy == "random" else free[: req.num_gpus]
        return tuple(sorted(g.index for g in chosen))
    fits = [g for g in usable if _gpu_fits(g.state(), req)]
    if want is not None:
        for g in fits:
            if g.state() == want:
                return (g.index,)
    if policy == "random":
        return (rng.choice(fits).index,)
    if policy == "worst_fit":
        return (max(fits, key=lambda g: (g.milli_free, -g.index)).index,)
    if policy == "best_fit" or policy in _FGD_POLICIES:
        return (min(fits, key=lambda g: (g.milli_free, g.index)).index,)
    return (fits[0].index,)


def apply_placement(node: Node, placement: Placement) -> None:
    """Take a placement's resources from ``node`` (raises ValueError, changing nothing, rather than
    over-commit)."""
    by_index = {g.index: g for g in node.gpus}
    if placement.node != node.name:
        raise ValueError(f"placement is for {placement.node}, not {node.name}")
    if len(set(placement.gpu_indices)) != len(placement.gpu_indices):
        raise ValueError(f"{node.name}: a GPU appears twice in the placement")
    unknown = [i for i in placement.gpu_indices if i not in by_index]
    if unknown:
        raise ValueError(f"{node.name}: no GPU with index {unknown[0]}")
    if node.cpu_free_milli < placement.cpu_milli:
        raise ValueError(f"{node.name}: not enough CPU")
    if node.memory_free_mib is not None and node.memory_free_mib < placement.memory_mib:
        raise ValueError(f"{node.name}: not enough memory")
    for idx in placement.gpu_indices:
        g = by_index[idx]
        if not g.eligible:
            raise ValueError(f"{node.name}: GPU {idx} is not eligible")
        if placement.exclusive and not g.fully_free:
            raise ValueError(f"{node.name}: GPU {idx} is not fully free")
        if g.milli_free < placement.gpu_milli:
            raise ValueError(f"{node.name}: GPU {idx} lacks compute")
        if g.memory_free_mib is not None and g.memory_free_mib < placement.gpu_memory_mib:
            raise ValueError(f"{node.name}: GPU {idx} lacks memory")
    node.cpu_free_milli -= placement.cpu_milli
    if node.memory_free_mib is not None:
        node.memory_free_mib -= placement.memory_mib
    for idx in placement.gpu_indices:
        g = by_index[idx]
        g.milli_free -= placement.gpu_milli
        if g.memory_free_mib is not None:
            g.memory_free_mib = 0 if placement.exclusive else g.memory_free_mib - placement.gpu_memory_mib


def release_placement(node: Node, placement: Placement) -> None:
    """Give a placement's resources back to ``node``."""
    by_index = {g.index: g for g in node.gpus}
    node.cpu_free_milli += placement.cpu_milli
    if node.memory_free_mib is not None:
        node.memory_free_mib += placement.memory_mib
    for idx in placement.gpu_indices:
        g = by_index[idx]
        g.milli_free = min(FULL_MILLI, g.milli_free + placement.gpu_milli)
        if g.memory_free_mib is not None:
            if placement.exclusive and g.memory_total_mib is not None:
                g.memory_free_mib = g.memory_total_mib
            else:
                g.memory_free_mib += placement.gpu_memory_mib


# ---- the allocator -------------------------------------------------------------------------------


class Allocator:
    """Places requests one after another on a pool, keeping its own bookkeeping in step.

    ``nodes`` are used in place: :meth:`commit` / :meth:`release` change them. After changing a node from the
    outside (health, an allocation made elsewhere), call :meth:`refresh` with its position.

    ``tie_break`` decides between equally good nodes: ``"index"`` takes the first in ``nodes`` order,
    ``"random"`` a random one (seeded by ``seed``). ``pack_weight`` only concerns ``fgd``: see
    :data:`DEFAULT_PACK_WEIGHT`.
    """

    def __init__(
        self,
        nodes: Sequence[Node],
        policy: str = "fgd",
        workload: Workload | None = None,
        *,
        seed: int | None = None,
        tie_break: str = "index",
        pack_weight: float | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
        if policy in _FGD_POLICIES and workload is None:
            raise ValueError(f"the {policy} policy needs a target workload")
        if tie_break not in TIE_BREAKS:
            raise ValueError(f"unknown tie_break {tie_break!r}; one of {', '.join(TIE_BREAKS)}")
        self.nodes: list[Node] = list(nodes)
        self.policy = policy
        self.workload = workload
        self.tie_break = tie_break
        if policy == "fgd_pure":
            pack_weight = 0.0
        self.pack_weight = DEFAULT_PACK_WEIGHT if pack_weight is None else float(pack_weight)
        self._rng = random.Random(seed)
        self._index_by_name = {n.name: i for i, n in enumerate(self.nodes)}
        # Capacity per node, for best/worst-fit normalisation: (cpu, gpu milli).
        self._capacity: list[tuple[int, int]] = []
        for n in self.nodes:
            cpu_cap = n.cpu_total_milli if n.cpu_total_milli else n.cpu_free_milli
            gpu_cap = FULL_MILLI * sum(1 for g in n.gpus if g.eligible)
            self._capacity.append((max(cpu_cap, 1), gpu_cap))
        # ``fgd`` scores each node against the requests its model will see, and keeps a model's cards for the
        # requests that can only run there while pinned demand loads it more than their other choices.
        self._scoring = workload
        self._pressure = False
        self._demand: dict[frozenset[str] | None, float] = {}
        if policy == "fgd" and workload is not None:
            capacity: dict[str, int] = {}
            for n in self.nodes:
                if n.eligible:
                    cards = sum(1 for g in n.gpus if g.eligible)
                    capacity[n.gpu_model] = capacity.get(n.gpu_model, 0) + FULL_MILLI * cards
            self._scoring = workload.routed(capacity)
            self._demand = self._fit_demand(workload)
            self._pressure = any(k is not None for k in self._demand)
        self._rebuild()

    # -- bookkeeping --------------------------------------------------------------------------------------

    def _rebuild(self) -> None:
        # A group is (capacity, state): the nodes in it are interchangeable for every policy.
        self._group_ids: dict[tuple[tuple[int, int], NodeState], int] = {}
        self._group_keys: list[tuple[tuple[int, int], NodeState]] = []
        self._members: dict[int, set[int]] = {}
        # Per group: (free GPU milli in all, fully free cards, most free milli on one card); read often.
        self._group_gpu: list[tuple[int, int, int]] = []
        # Live groups by the most free compute any of their GPUs has, so that a GPU request only looks at
        # groups that might take it (late in a busy pool that is a small share of them).
        self._by_top: dict[int, dict[int, None]] = {}
        self._tops: list[int] = []
        self._node_group: list[int | None] = [None] * len(self.nodes)
        self._scores: dict[Request, dict[int, float | None]] = {}
        # Free GPU compute per model (eligible nodes), and the models' levels against it (None: stale).
        self._model_free: dict[str, int] = {}
        self._levels: dict[str, float] | None = None
        for i in range(len(self.nodes)):
            self._enter(i)

    def _enter(self, i: int) -> None:
        node = self.nodes[i]
        if not node.eligible:
            self._node_group[i] = None
            return
        key = (self._capacity[i], node.state())
        gid = self._group_ids.get(key)
        if gid is None:
            gid = len(self._group_keys)
            self._group_ids[key] = gid
            self._group_keys.append(key)
            gpus = key[1][3]
            self._group_gpu.append(
                (sum(g[0] for g in gpus), sum(1 for g in gpus if g[2]), max((g[0] for g in gpus), default=0))
            )
        members = self._members.get(gid)
        if members is None:
            members = self._members[gid] = set()
            top = self._group_gpu[gid][2]
            bucket = self._by_top.get(top)
            if bucket is None:
                bucket = self._by_top[top] = {}
                insort(self._tops, top)
            bucket[gid] = None
        members.add(i)
        self._node_group[i] = gid
        model = key[1][2]
        self._model_free[model] = self._model_free.get(model, 0) + self._group_gpu[gid][0]
        self._levels = None

    def _leave(self, i: int) -> None:
        gid = self._node_group[i]
        if gid is None:
            return
        members = self._members[gid]
        members.discard(i)
        if not members:
            del self._members[gid]
            del self._by_top[self._group_gpu[gid][2]][gid]
        self._node_group[i] = None
        model = self._group_keys[gid][1][2]
        self._model_free[model] -= self._group_gpu[gid][0]
        self._levels = None

    def _maybe_shrink(self) -> None:
        if len(self._group_keys) > _MAX_STATES or len(self._scores) > _MAX_REQUEST_SHAPES:
            self._rebuild()

    def refresh(self, node_index: int) -> None:
        """Re-read one node after it was changed outside the allocator."""
        self._leave(node_index)
        self._enter(node_index)
        self._maybe_shrink()

    def index_of(self, node_name: str) -> int:
        return self._index_by_name[node_name]

    # -- scoring ------------------------------------------------------------------------------------------

    def _fits(self, gid: int, req: Request) -> bool:
        state = self._group_keys[gid][1]
        if not _node_admits(state, req):
            return False
        if not req.num_gpus:
            return True
        _free, full_cards, top = self._group_gpu[gid]
        if req.exclusive:
            return full_cards >= req.num_gpus
        return top >= req.gpu_milli and (not (req.gpu_memory_mib or req.gpu_memory_eighths) or _feasible(state, req))

    def _fgd(self, gid: int, req: Request) -> tuple[float, GpuState | None]:
        """Growth of expected fragmentation (plus the packing term) and the card to use for a share."""
        wl = self._scoring
        assert wl is not None
        state = self._group_keys[gid][1]
        before = wl._state_frag(state)
        cpu, mem, model, _gpus, sharing = state
        host = wl._host_weights(cpu - req.cpu_milli, mem - req.memory_mib, model, sharing)
        best = math.inf
        best_gpu: GpuState | None = None
        for used, gpus_after in _after(state, req):
            val = wl._combine(host, gpus_after)
            # Candidates come tightest card first; keep it unless a looser one is strictly better.
            if val < best - _EPS:
                best, best_gpu = val, used
        score = best - before
        if self.pack_weight:
            score += self.pack_weight * (self._group_gpu[gid][0] - req.gpu_demand_milli) / FULL_MILLI
        return score, best_gpu

    def _score(self, gid: int, req: Request) -> float | None:
        """Score of placing ``req`` on a node of group ``gid`` (lower is better); None if it does not fit."""
        if not self._fits(gid, req):
            return None
        policy = self.policy
        if policy in _FGD_POLICIES:
            return self._fgd(gid, req)[0]
        if policy in ("first_fit", "random"):
            return 0.0
        (cpu_cap, gpu_cap), state = self._group_keys[gid]
        left = (state[0] - req.cpu_milli) / cpu_cap
        if gpu_cap:
            left += (self._group_gpu[gid][0] - req.gpu_demand_milli) / gpu_cap
        return left if policy == "best_fit" else -left

    def _cache(self, request: Request) -> dict[int, float | None]:
        cache = self._scores.get(request)
        if cache is None:
            cache = self._scores[request] = {}
        return cache

    def _sample_feasible(self, request: Request) -> int | None:
        """A node drawn uniformly from those that can take ``request``: a few random draws usually find one
        (rejection sampling keeps the draw uniform); a full scan settles the rare remainder."""
        cache = self._cache(request)
        rng = self._rng
        n = len(self.nodes)
        for _ in range(_RANDOM_DRAWS if n else 0):
            i = rng.randrange(n)
            gid = self._node_group[i]
            if gid is None:
                continue
            s = cache.get(gid, _MISS)
            if s is _MISS:
                s = cache[gid] = self._score(gid, request)
            if s is not None:
                return i
        _best, feasible = self._best_groups(request)
        if not feasible:
            return None
        gid = rng.choices(feasible, [len(self._members[g]) for g in feasible])[0]
        return rng.choice(tuple(self._members[gid]))

    def _fit_demand(self, wl: Workload) -> dict[frozenset[str] | None, float]:
        """The mix's GPU demand per set of models whose nodes could hold it (when empty): the models a request
        names, less those without a node with enough cards, CPU and memory for it. None: every model."""
        shapes: dict[str, set[tuple[int, int, int, str]]] = {}
        for i, n in enumerate(self.nodes):
            if n.eligible:
                mem = n.memory_total_mib or n.memory_free_mib
                shapes.setdefault(n.gpu_model, set()).add(
                    (
                        self._capacity[i][0],
                        _UNTRACKED if mem is None else mem,
                        self._capacity[i][1] // FULL_MILLI,
                        n.sharing,
                    )
                )
        every = frozenset(shapes)
        out: dict[frozenset[str] | None, float] = {}
        for cpu_rank, mem_rank, model, cls_idx, w in wl._types:
            num, milli = wl._classes[cls_idx][:2]
            if not num:
                continue
            cpu, mem = wl._cpu_levels[cpu_rank], wl._mem_levels[mem_rank]
            fit = frozenset(
                m
                for m, profiles in shapes.items()
                if (model is None or m in model)
                and any(
                    c >= cpu and me >= mem and k >= num and _sharing_allows(sh, num, milli) for c, me, k, sh in profiles
                )
            )
            if fit:
                key = None if fit == every else fit
                out[key] = out.get(key, 0.0) + w * num * milli
        total = math.fsum(out.values())
        return {k: v / total for k, v in out.items()} if total > 0 else {}

    def _model_levels(self) -> dict[str, float]:
        """How much the requests still to come load each model's free GPUs (:func:`model_levels`): the mix's
        GPU demand, as many GPUs of it as are free now (the workload is what fills the pool)."""
        if self._levels is None:
            wl = self.workload
            assert wl is not None
            free = {m: float(v) for m, v in self._model_free.items() if v > 0}
            total = math.fsum(free.values())
            self._levels = model_levels({k: v * total for k, v in self._demand.items()}, free)
        return self._levels

    def _best_groups(self, request: Request) -> tuple[float, list[int]]:
        """The lowest score and every group that reaches it (within rounding)."""
        if self._pressure and request.num_gpus:
            return self._best_groups_by_model(request)
        cache = self._cache(request)
        get = cache.get
        score_of = self._score
        best = lo = hi = math.inf
        tied: list[int] = []
        if request.num_gpus == 0:
            sources: Iterable[Iterable[int]] = (self._members,)
        else:
            tops = self._tops
            sources = [self._by_top[t] for t in tops[bisect_left(tops, request.gpu_milli) :]]
        # The hot loop of every decision: one cached score per distinct node state.
        for source in sources:
            for gid in source:
                s = get(gid, _MISS)
                if s is _MISS:
                    s = cache[gid] = score_of(gid, request)
                if s is None or s > hi:
                    continue
                if s < lo:
                    best, lo, hi = s, s - _EPS, s + _EPS
                    tied = [gid]
                else:
                    tied.append(gid)
        return best, tied

    def _best_groups_by_model(self, request: Request) -> tuple[float, list[int]]:
        """``fgd`` when requests name models: the best groups of each model, then, on every model more loaded
        (:meth:`_model_levels`) than the least loaded model the request can go to, the part of its GPU demand
        that the load above that floor claims: ``demand x (1 - floor / level)``. That is the share of the
        model's remaining demand that has nowhere else to go (the requests pinned to it beyond what the other
        models are asked for), so the share of the cards taken there that one of those will be missing, while
        the cards the request could have taken elsewhere stay free: GPUs left unallocated, counted in the same
        milli as fragmentation. Zero while the requests that could go elsewhere keep every model equally loaded."""
        cache = self._cache(request)
        get = cache.get
        score_of = self._score
        keys = self._group_keys
        per_model: dict[str, tuple[float, list[int]]] = {}
        tops = self._tops
        for top in tops[bisect_left(tops, request.gpu_milli) :]:
            for gid in self._by_top[top]:
                s = get(gid, _MISS)
                if s is _MISS:
                    s = cache[gid] = score_of(gid, request)
                if s is None:
                    continue
                model = keys[gid][1][2]
                hit = per_model.get(model)
                if hit is None or s < hit[0] - _EPS:
                    per_model[model] = (s, [gid])
                elif s <= hit[0] + _EPS:
                    hit[1].append(gid)
        if not per_model:
            return math.inf, []
        levels = self._model_levels()
        floor = min(levels.get(m, 0.0) for m in per_model)
        extra = float(request.gpu_demand_milli)
        best = lo = hi = math.inf
        tied: list[int] = []
        for model, (s, gids) in per_model.items():
            level = levels.get(model, 0.0)
            if level > floor * (1 + 1e-9):
                s += extra * (1.0 - floor / level)
            if s > hi:
                continue
            if s < lo:
                best, lo, hi = s, s - _EPS, s + _EPS
                tied = list(gids)
            else:
                tied.extend(gids)
        return best, tied

    def choose(self, request: Request) -> Placement | None:
        """The placement the policy picks for ``request``, without taking anything; None when nothing fits."""
        if self.policy == "random":
            best = 0.0
            picked = self._sample_feasible(request)
            if picked is None:
                return None
            node_index = picked
        else:
            best, tied = self._best_groups(request)
            if not tied:
                return None
            if self.tie_break == "random" and self.policy != "first_fit":
                gid = tied[0]
                if len(tied) > 1:
                    gid = self._rng.choices(tied, [len(self._members[g]) for g in tied])[0]
                node_index = self._rng.choice(tuple(self._members[gid]))
            else:
                node_index = min(min(self._members[g]) for g in tied)
        gid = self._node_group[node_index]
        assert gid is not None
        want = self._fgd(gid, request)[1] if self.policy in _FGD_POLICIES and request.fractional else None
        node = self.nodes[node_index]
        indices = _pick_gpus(node, request, self.policy, want, self._rng)
        gpu_memory = request.gpu_memory_mib
        if request.gpu_memory_eighths and indices:
            card = next(g for g in node.gpus if g.index == indices[0])
            gpu_memory = request.memory_on(_UNTRACKED if card.memory_total_mib is None else card.memory_total_mib)
        return Placement(
            node=node.name,
            node_index=node_index,
            gpu_indices=indices,
            gpu_milli=request.gpu_milli if request.num_gpus else 0,
            gpu_memory_mib=gpu_memory,
            cpu_milli=request.cpu_milli,
            memory_mib=request.memory_mib,
            exclusive=request.exclusive,
            policy=self.policy,
            score=best,
        )

    def commit(self, placement: Placement) -> None:
        """Take the placement's resources from its node (ValueError, nothing taken, if they are not free)."""
        i = placement.node_index
        self._leave(i)
        try:
            apply_placement(self.nodes[i], placement)
        finally:
            self._enter(i)
        self._maybe_shrink()

    def place(self, request: Request) -> Placement | None:
        """Choose and commit in one step."""
        placement = self.choose(request)
        if placement is not None:
            self.commit(placement)
        return placement

    def release(self, placement: Placement) -> None:
        """Give a placement's resources back (the job ended)."""
        i = placement.node_index
        self._leave(i)
        try:
            release_placement(self.nodes[i], placement)
        finally:
            self._enter(i)
        self._maybe_shrink()

    def fragmentation(self, workload: Workload | None = None) -> float:
        """Expected fragmented GPU compute of the eligible nodes (milli-GPUs)."""
        wl = self.workload if workload is None else workload
        if wl is None:
            raise ValueError("fragmentation needs a workload")
        return math.fsum(wl._state_frag(self._group_keys[g][1]) * len(m) for g, m in self._members.items())


def choose(
    policy: str,
    nodes: Sequence[Node],
    request: Request,
    workload: Workload | None = None,
    *,
    seed: int | None = None,
    tie_break: str = "index",
    pack_weight: float | None = None,
) -> Placement | None:
    """One placement decision over ``nodes`` (left unchanged); None when the request fits nowhere.

    Apply the answer with :func:`apply_placement` (or through the pool service's ledger).
    """
    alloc = Allocator(nodes, policy, workload, seed=seed, tie_break=tie_break, pack_weight=pack_weight)
    return alloc.choose(request)
