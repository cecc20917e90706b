"""Right-sizing arithmetic, free of the database: a usage profile from samples, leak detection, and the
smallest spec that covers what earlier runs used (docs/rightsizing.md). `monitoring.services` feeds it samples
and stores profiles; `monitoring.selectors.recommendation_for` feeds it history; `bench/rightsizing.py` replays it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MAX_POINTS = 720  # points a profile keeps for its charts and percentiles; older pairs are merged
GIB = 1024.0


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation, or None without values."""
    data = sorted(v for v in values if v is not None)
    if not data:
        return None
    pos = (len(data) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _max(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def _mean(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return (a + b) / 2


def thin(series: list[list], max_points: int = MAX_POINTS) -> list[list]:
    """Halve a series by merging neighbours until it fits: memory and CPU keep their maximum (a peak is never
    lost, percentiles can only move up), utilization its mean."""
    while len(series) > max_points:
        merged = []
        for i in range(0, len(series) - 1, 2):
            a, b = series[i], series[i + 1]
            merged.append([a[0], _max(a[1], b[1]), _mean(a[2], b[2]), _max(a[3], b[3]), _max(a[4], b[4])])
        if len(series) % 2:
            merged.append(series[-1])
        series = merged
    return series


@dataclass
class Stats:
    gpu_memory_peak_mib: float | None = None
    gpu_memory_p95_mib: float | None = None
    gpu_util_mean_pct: float | None = None
    gpu_util_p95_pct: float | None = None
    cpu_peak_milli: float | None = None
    host_memory_peak_mib: float | None = None


def stats_of(series: list[list], *, peaks: Stats, gpu_util_sum: float, gpu_samples: int) -> Stats:
    """Percentiles from the (thinned) series; peaks and the mean from the exact running values."""
    return Stats(
        gpu_memory_peak_mib=peaks.gpu_memory_peak_mib,
        gpu_memory_p95_mib=percentile([p[1] for p in series], 0.95),
        gpu_util_mean_pct=(gpu_util_sum / gpu_samples) if gpu_samples else None,
        gpu_util_p95_pct=percentile([p[2] for p in series], 0.95),
        cpu_peak_milli=peaks.cpu_peak_milli,
        host_memory_peak_mib=peaks.host_memory_peak_mib,
    )


def leak_suspected(values: list[float], *, min_samples: int, min_growth: float) -> bool:
    """Memory growing without bound: over at least `min_samples` points, each quarter of the run reaches a higher
    maximum than the one before, and the last quarter is `min_growth` (e.g. 0.5 = 50%) above the first. A job
    that ramps up and then holds steady stops growing in its later quarters, so it never qualifies."""
    values = [v for v in values if v is not None]
    if len(values) < max(min_samples, 4):
        return False
    n = len(values)
    quarters = [max(values[i * n // 4 : (i + 1) * n // 4]) for i in range(4)]
    rising = all(b > a for a, b in zip(quarters, quarters[1:], strict=False))
    base = max(quarters[0], 1.0)
    return rising and quarters[-1] >= base * (1 + min_growth)


# ------------------------------------------------------------------------------------------ recommendation


@dataclass(frozen=True)
class Run:
    """One earlier run's profile, as the recommendation needs it."""

    job_id: str
    gpu_count: int
    gpu_memory_mib: float  # requested per card
    gpu_memory_peak_mib: float
    gpu_memory_p95_mib: float
    gpu_util_p95_pct: float | None
    batch_size: float | None = None


@dataclass(frozen=True)
class SpecOption:
    name: str
    gpu_count: int
    gpu_milli: int  # per card
    gpu_memory_mib: int  # per card


@dataclass
class Recommendation:
    spec: str | None
    gpu_count: int
    gpu_milli: int
    gpu_memory_mib: int
    fits_request: bool  # the request is already the smallest that covers the evidence
    evidence: str
    runs: int
    scope: str  # user | team
    peak_mib: float
    p95_mib: float
    need_memory_mib: float
    need_milli: float
    memory_margin: float
    saves_gpu_milli: int  # per replica, whole job: request - recommendation (0 when it fits)
    saves_gpu_memory_mib: int
    batch_size: int | None = None
    batch_evidence: str = ""
    job_ids: list[str] = field(default_factory=list)
    asked_mib: float = 0.0  # the highest per-card memory the runs asked for
    util_p95_pct: float | None = None  # the highest utilization p95 of the runs
    covered: bool = True  # some spec of the queue covers what the runs need

    def as_dict(self) -> dict:
        return {
            "spec": self.spec,
            "gpu_count": self.gpu_count,
            "gpu_milli": self.gpu_milli,
            "gpu_memory_mib": self.gpu_memory_mib,
            "fits_request": self.fits_request,
            "evidence": self.evidence,
            "runs": self.runs,
            "scope": self.scope,
            "peak_gpu_memory_mib": round(self.peak_mib, 1),
            "p95_gpu_memory_mib": round(self.p95_mib, 1),
            "needed_gpu_memory_mib": round(self.need_memory_mib, 1),
            "needed_gpu_milli": round(self.need_milli),
            "memory_margin": round(self.memory_margin, 3),
            "saves": {"gpu_milli": self.saves_gpu_milli, "gpu_memory_mib": self.saves_gpu_memory_mib},
            # The evidence's figures, for a reader in another language (the portal says them in the reader's own).
            "evidence_parts": {
                "runs": self.runs,
                "peak_mib": round(self.peak_mib, 1),
                "asked_mib": round(self.asked_mib, 1),
                "util_p95_pct": None if self.util_p95_pct is None else round(self.util_p95_pct, 1),
                "covered": self.covered,
                "memory_margin": round(self.memory_margin, 3),
            },
            "batch_size": self.batch_size,
            "batch_evidence": self.batch_evidence,
            "based_on": self.job_ids,
        }


def memory_margin(runs: list[Run], *, margin: float, uncertainty: float) -> float:
    """The margin over the p95 for GPU memory: `margin`, plus `uncertainty` shared among the runs of evidence.
    Few runs say little about how much the next one may differ (data-dependent activations): one run gets the
    whole allowance, ten get a tenth of it."""
    return margin + uncertainty / max(1, len(runs))


def needs(runs: list[Run], *, margin: float, uncertainty: float = 0.0) -> tuple[float, float, int]:
    """(memory per card, compute per card in milli, cards) that cover every run: the p95 plus the memory margin
    (`memory_margin`), and never less than any observed peak; compute is the utilization p95 plus `margin` (too
    little compute is slower, never a crash); cards shrink only when the busiest card's p95 says they sit unused."""
    grow = memory_margin(runs, margin=margin, uncertainty=uncertainty)
    memory = max(max(r.gpu_memory_p95_mib * (1 + grow), r.gpu_memory_peak_mib) for r in runs)
    utils = [r.gpu_util_p95_pct for r in runs if r.gpu_util_p95_pct is not None]
    milli = min(1000.0, max(utils) * 10 * (1 + margin)) if utils else 1000.0
    cards = max(r.gpu_count for r in runs)
    if cards > 1 and utils:
        cards = max(1, min(cards, math.ceil(cards * max(utils) * (1 + margin) / 100)))
    return memory, milli, cards


def _gib(mib: float) -> str:
    return f"{mib / GIB:.1f} GiB"


def suggest_batch(runs: list[Run], *, memory_mib: float, margin: float) -> tuple[int | None, str]:
    """The batch size that fills `memory_mib` less the margin, from (batch size, peak memory) pairs: a line
    through two or more distinct sizes, else proportional (which errs small: fixed memory does not grow)."""
    pairs = [(r.batch_size, r.gpu_memory_peak_mib) for r in runs if r.batch_size and r.gpu_memory_peak_mib]
    if not pairs:
        return None, ""
    usable = memory_mib / (1 + margin)
    sizes = {b for b, _ in pairs}
    if len(sizes) >= 2:
        n = len(pairs)
        mb = sum(b for b, _ in pairs) / n
        mm = sum(m for _, m in pairs) / n
        var = sum((b - mb) ** 2 for b, _ in pairs)
        slope = sum((b - mb) * (m - mm) for b, m in pairs) / var if var else 0
        if slope > 0:
            fixed = mm - slope * mb
            size = math.floor((usable - fixed) / slope)
            how = f"fit over batch sizes {', '.join(str(int(s)) for s in sorted(sizes))}: {slope:.0f} MiB per sample"
            return (size if size >= 1 else None), how
    batch, peak = max(pairs, key=lambda p: p[1])
    size = math.floor(batch * usable / peak)
    return (size if size >= 1 else None), f"batch {int(batch)} peaked at {_gib(peak)}; scaled to {_gib(usable)}"


def recommend(
    runs: list[Run],
    *,
    request: SpecOption,
    options: list[SpecOption],
    margin: float,
    scope: str,
    replicas: int = 1,
    uncertainty: float = 0.0,
) -> Recommendation | None:
    """The cheapest option (compute, then memory) that covers the runs; None without runs."""
    if not runs:
        return None
    memory, milli, cards = needs(runs, margin=margin, uncertainty=uncertainty)
    fitting = [o for o in options if o.gpu_memory_mib >= memory and o.gpu_milli >= milli and o.gpu_count >= cards]
    fitting.sort(key=lambda o: (o.gpu_count * o.gpu_milli, o.gpu_count * o.gpu_memory_mib, o.name))
    best = fitting[0] if fitting else request
    covered = bool(fitting)
    req_cost = (request.gpu_count * request.gpu_milli, request.gpu_count * request.gpu_memory_mib)
    best_cost = (best.gpu_count * best.gpu_milli, best.gpu_count * best.gpu_memory_mib)
    if best_cost >= req_cost:
        best = request  # never recommend more quota than asked just to be "smallest" by another measure
    peak = max(r.gpu_memory_peak_mib for r in runs)
    p95 = max(r.gpu_memory_p95_mib for r in runs)
    asked = max(r.gpu_memory_mib for r in runs)
    evidence = f"{len(runs)} run{'s' if len(runs) != 1 else ''}, peak {_gib(peak)} of {_gib(asked)}"
    utils = [r.gpu_util_p95_pct for r in runs if r.gpu_util_p95_pct is not None]
    if utils:
        evidence += f", GPU utilization p95 {max(utils):.0f}%"
    if not covered:
        evidence += "; no spec of this queue covers it"
    grow = memory_margin(runs, margin=margin, uncertainty=uncertainty)
    evidence += f"; memory margin {grow:.0%}"
    batch, batch_how = suggest_batch(runs, memory_mib=best.gpu_memory_mib, margin=grow)
    return Recommendation(
        spec=best.name or None,
        gpu_count=best.gpu_count,
        gpu_milli=best.gpu_milli,
        gpu_memory_mib=best.gpu_memory_mib,
        fits_request=best == request and covered,
        evidence=evidence,
        runs=len(runs),
        scope=scope,
        peak_mib=peak,
        p95_mib=p95,
        need_memory_mib=memory,
        need_milli=milli,
        memory_margin=grow,
        saves_gpu_milli=max(0, (req_cost[0] - best_cost[0]) * replicas) if best != request else 0,
        saves_gpu_memory_mib=max(0, (req_cost[1] - best_cost[1]) * replicas) if best != request else 0,
        batch_size=batch,
        batch_evidence=batch_how,
        job_ids=[r.job_id for r in runs],
        asked_mib=asked,
        util_p95_pct=max(utils) if utils else None,
        covered=covered,
    )
