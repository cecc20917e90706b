"""Allocator benchmark: replay the Alibaba GPU cluster trace 2023 ("openb") against every placement policy.

Method (that of the FGD paper, Weng et al., USENIX ATC '23, on its default trace): the cluster is the trace's
GPU node list; time is ignored; the pod list is inflated by resampling until its GPU requests exceed the
cluster's GPU capacity, then shuffled (one shuffle per seed); pods arrive in that order and are never removed;
a pod that fits nowhere fails. The figure is the share of the cluster's GPU capacity left unallocated at the
moment the arrived GPU requests equal 100% of that capacity (interpolated within the pod that crosses the
line), the median over the seeds. The ``fgd`` policies get the trace's own pod mix as their target workload.
The benchmark also times every placement decision.

Run from the repository root::

    python -m bench.allocator            # 10 seeds, all policies
    python -m bench.allocator --quick    # a smoke run

The trace is read from ``../shared/traces/alibaba-gpu-v2023/csv`` next to the repository, or from
``$TRAINYARD_TRACE_DIR``. Results go to ``bench/results/allocator.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.policy import (
    DEFAULT_PACK_WEIGHT,
    FULL_MILLI,
    POLICIES,
    TIE_BREAKS,
    Allocator,
    Node,
    Request,
    Workload,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE_DIR = REPO_ROOT.parent / "shared" / "traces" / "alibaba-gpu-v2023" / "csv"
RESULTS_PATH = REPO_ROOT / "bench" / "results" / "allocator.json"
NODE_FILE = "openb_node_list_gpu_node.csv"
POD_FILE = "openb_pod_list_default.csv"

# Published medians of 10 seeds on the default trace (the paper's Figure for 100% arrived workload), in %.
PUBLISHED_UNALLOCATED_PCT: dict[str, float] = {
    "Random": 13.75,
    "DotProd": 9.44,
    "Clustering": 8.42,
    "Packing": 8.19,
    "BestFit": 7.09,
    "FGD": 4.77,
}
# Which of our policies corresponds to which published one.
PUBLISHED_NAME = {"random": "Random", "best_fit": "BestFit", "fgd_pure": "FGD", "fgd": "FGD"}
PLATFORM_POLICY = "fgd"
TARGET_UNALLOCATED_PCT = PUBLISHED_UNALLOCATED_PCT["FGD"]
TARGET_DECISIONS_PER_S = 2000.0
CHECKPOINTS = (0.8, 0.9, 0.95, 1.0)


@dataclass(frozen=True)
class NodeSpec:
    """A node as the trace describes it, before anything is allocated."""

    name: str
    cpu_milli: int
    memory_mib: int | None
    num_gpus: int
    gpu_model: str = ""

    def build(self) -> Node:
        return Node.empty(self.name, self.num_gpus, self.cpu_milli, self.memory_mib, self.gpu_model)


@dataclass
class ReplayResult:
    policy: str
    seed: int
    unallocated_pct: float
    arrived_pods: int
    failed_pods: int
    failed_gpu_milli: int
    decisions: int
    seconds: float
    cpu_seconds: float
    # Per checkpoint ("90%" of capacity arrived, ...): the share of the GPU demand arrived so far that could
    # not be placed. At 100% it equals the unallocated share of capacity.
    failed_pct_at: dict[str, float] = field(default_factory=dict)

    @property
    def decisions_per_s(self) -> float:
        return self.decisions / self.seconds if self.seconds > 0 else float("inf")

    @property
    def decisions_per_cpu_s(self) -> float:
        return self.decisions / self.cpu_seconds if self.cpu_seconds > 0 else float("inf")


def _int(value: str) -> int:
    return int(float(value)) if value.strip() else 0


def load_trace(trace_dir: Path) -> tuple[list[NodeSpec], list[Request]]:
    """GPU nodes and pods of the openb trace, as node specs and placement requests."""
    nodes: list[NodeSpec] = []
    with open(trace_dir / NODE_FILE, newline="") as fh:
        for row in csv.DictReader(fh):
            spec = NodeSpec(
                row["sn"],
                _int(row["cpu_milli"]),
                _int(row["memory_mib"]),
                _int(row["gpu"]),
                row["model"].strip(),
            )
            nodes.append(spec)
    pods: list[Request] = []
    with open(trace_dir / POD_FILE, newline="") as fh:
        for row in csv.DictReader(fh):
            num_gpu = _int(row["num_gpu"])
            model = row.get("gpu_spec", "").strip() or None
            cpu, mem = _int(row["cpu_milli"]), _int(row["memory_mib"])
            if num_gpu == 0:
                pods.append(Request.cpu_only(cpu, mem))
            else:
                milli = _int(row["gpu_milli"]) if num_gpu == 1 else FULL_MILLI
                pods.append(Request(num_gpu, milli or FULL_MILLI, cpu, mem, 0, model))
    return nodes, pods


def arrivals(
    pods: Sequence[Request],
    capacity_milli: int,
    rng: random.Random,
    headroom: float = 1.05,
) -> list[Request]:
    """The pods, inflated by resampling until their GPU requests reach ``headroom`` x capacity, shuffled."""
    if not any(p.gpu_demand_milli for p in pods):
        raise ValueError("the pod list asks for no GPUs")
    out = list(pods)
    demand = sum(p.gpu_demand_milli for p in out)
    while demand < headroom * capacity_milli:
        extra = rng.choice(pods)
        out.append(extra)
        demand += extra.gpu_demand_milli
    rng.shuffle(out)
    return out


# ---- workload families -------------------------------------------------------------------------------
#
# Built from the public pod list, each by one seeded transformation, so that the policy is checked where the
# default trace is thin: the FGD paper's own variants (more sharing, more multi-GPU jobs, GPU-model constraints)
# and CPU-heavy pods. The published figure exists for the default trace only.


def _family_sharing(pods: Sequence[Request], rng: random.Random) -> list[Request]:
    """70% of the single-GPU pods ask for a share (milli drawn from the trace's own shares)."""
    shares = [p.gpu_milli for p in pods if p.fractional] or [500]
    out = []
    for p in pods:
        if p.num_gpus == 1 and not p.fractional and rng.random() < 0.6:
            p = Request(1, rng.choice(shares), p.cpu_milli, p.memory_mib, 0, p.gpu_model)
        out.append(p)
    return out


def _family_multi_gpu(pods: Sequence[Request], rng: random.Random) -> list[Request]:
    """30% of the single whole-GPU pods ask for 2, 4 or 8 cards (CPU and memory scaled)."""
    out = []
    for p in pods:
        if p.num_gpus == 1 and not p.fractional and rng.random() < 0.3:
            n = rng.choice((2, 2, 4, 8))
            p = Request(n, FULL_MILLI, p.cpu_milli * n, p.memory_mib * n, 0, p.gpu_model)
        out.append(p)
    return out


def _family_models(nodes: Sequence[NodeSpec]):
    models = [n.gpu_model for n in nodes for _ in range(n.num_gpus) if n.gpu_model]

    def transform(pods: Sequence[Request], rng: random.Random) -> list[Request]:
        """A third of the GPU pods accept one or two models (the trace's `V100M16|V100M32`), drawn by capacity."""
        out = []
        for p in pods:
            if p.num_gpus and rng.random() < 0.33:
                wanted = {rng.choice(models) for _ in range(rng.choice((1, 2)))}
                p = Request(p.num_gpus, p.gpu_milli, p.cpu_milli, p.memory_mib, 0, "|".join(sorted(wanted)))
            out.append(p)
        return out

    return transform


def _family_cpu_heavy(pods: Sequence[Request], rng: random.Random) -> list[Request]:
    """Half the pods ask for 2.5x their CPU (and 2x their memory): nodes run out of CPU before GPUs."""
    out = []
    for p in pods:
        if rng.random() < 0.5:
            p = Request(p.num_gpus, p.gpu_milli or FULL_MILLI, int(p.cpu_milli * 2.5), p.memory_mib * 2, 0, p.gpu_model)
        out.append(p)
    return out


def families(nodes: Sequence[NodeSpec]) -> dict[str, object]:
    return {
        "default": None,
        "sharing-heavy": _family_sharing,
        "multi-gpu": _family_multi_gpu,
        "model-constrained": _family_models(nodes),
        "cpu-heavy": _family_cpu_heavy,
    }


def replay(
    nodes: Sequence[NodeSpec],
    pods: Sequence[Request],
    policy: str,
    seed: int,
    *,
    workload: Workload | None = None,
    tie_break: str = "index",
    checkpoints: Sequence[float] = CHECKPOINTS,
) -> ReplayResult:
    """One shuffled arrival sequence on a fresh cluster, up to 100% of its GPU capacity arrived."""
    cluster = [spec.build() for spec in nodes]
    capacity = FULL_MILLI * sum(spec.num_gpus for spec in nodes)
    if capacity <= 0:
        raise ValueError("the cluster has no GPUs")
    rng = random.Random(seed)
    sequence = arrivals(pods, capacity, rng)
    # A fresh workload per replay keeps the timing honest: nothing is cached from an earlier run.
    wl = Workload(workload.weights) if workload is not None else Workload.from_requests(pods)
    alloc = Allocator(cluster, policy, wl, seed=seed, tie_break=tie_break)
    marks = sorted(checkpoints)
    at: dict[str, float] = {}
    arrived = allocated = failed = failed_milli = decisions = 0
    seconds = cpu_seconds = 0.0
    clock, cpu_clock = time.perf_counter, time.process_time
    for req in sequence:
        c0, t0 = cpu_clock(), clock()
        placed = alloc.place(req)
        seconds += clock() - t0
        cpu_seconds += cpu_clock() - c0
        decisions += 1
        demand = req.gpu_demand_milli
        if placed is None:
            failed += 1
            failed_milli += demand
        # Record a checkpoint where the line is crossed, crediting only the part of this pod below the line.
        while marks and arrived + demand >= marks[0] * capacity:
            line = marks.pop(0) * capacity
            got = allocated + ((line - arrived) if placed is not None else 0)
            at[_label(line / capacity)] = 100.0 * (line - got) / line
        arrived += demand
        if placed is not None:
            allocated += demand
        if not marks:
            break
    return ReplayResult(
        policy=policy,
        seed=seed,
        unallocated_pct=at.get(_label(1.0), float("nan")),
        arrived_pods=decisions,
        failed_pods=failed,
        failed_gpu_milli=failed_milli,
        decisions=decisions,
        seconds=seconds,
        cpu_seconds=cpu_seconds,
        failed_pct_at=at,
    )


def _label(share: float) -> str:
    return f"{round(100 * share)}%"


def summarize(results: Sequence[ReplayResult]) -> dict[str, object]:
    pct = [r.unallocated_pct for r in results]
    decisions = sum(r.decisions for r in results)
    seconds = sum(r.seconds for r in results)
    cpu_seconds = sum(r.cpu_seconds for r in results)
    marks = results[0].failed_pct_at
    curve = {k: round(statistics.median(r.failed_pct_at[k] for r in results), 3) for k in marks}
    return {
        "unallocated_pct_median": round(statistics.median(pct), 3),
        "unallocated_pct_by_seed": [round(p, 3) for p in pct],
        "unallocated_pct_min": round(min(pct), 3),
        "unallocated_pct_max": round(max(pct), 3),
        "failed_pct_of_arrived_median_at": curve,
        "failed_pods_median": statistics.median(r.failed_pods for r in results),
        "decisions_per_s": round(decisions / seconds, 1) if seconds > 0 else None,
        "decisions_per_s_by_seed": [round(r.decisions_per_s, 1) for r in results],
        # The same on CPU time: what the placement would reach on an idle machine.
        "decisions_per_cpu_s": round(decisions / cpu_seconds, 1) if cpu_seconds > 0 else None,
        "decisions": decisions,
        "published_unallocated_pct": PUBLISHED_UNALLOCATED_PCT.get(PUBLISHED_NAME.get(results[0].policy, "")),
    }


def run(
    nodes: Sequence[NodeSpec],
    pods: Sequence[Request],
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    tie_break: str = "index",
    progress: bool = False,
) -> dict[str, dict[str, object]]:
    """Replay every policy on every seed; per policy a summary."""
    workload = Workload.from_requests(pods)
    out: dict[str, dict[str, object]] = {}
    for policy in policies:
        results = []
        for seed in seeds:
            res = replay(nodes, pods, policy, seed, workload=workload, tie_break=tie_break)
            results.append(res)
            if progress:
                print(
                    f"  {policy:<10} seed {seed:>2}: unallocated {res.unallocated_pct:6.2f}%  "
                    f"failed {res.failed_pods:>4}  {res.decisions_per_s:>9.0f} decisions/s "
                    f"({res.decisions_per_cpu_s:.0f} per CPU-s)",
                    file=sys.stderr,
                )
        out[policy] = summarize(results)
    return out


def format_table(summary: dict[str, dict[str, object]]) -> str:
    columns = [
        f"{'policy':<10}",
        f"{'unallocated @100% (median)':>27}",
        f"{'min..max':>15}",
        f"{'paper':>7}",
        f"{'decisions/s':>12}",
        f"{'per CPU-s':>10}",
    ]
    head = " ".join(columns)
    lines = [head, "-" * len(head)]
    for policy, s in summary.items():
        paper = s["published_unallocated_pct"]
        lines.append(
            f"{policy:<10} {s['unallocated_pct_median']:>26.2f}% "
            f"{s['unallocated_pct_min']:>6.2f}..{s['unallocated_pct_max']:<6.2f} "
            f"{(f'{paper:.2f}%' if paper is not None else '-'):>7} {s['decisions_per_s']:>12,.0f} "
            f"{s['decisions_per_cpu_s']:>10,.0f}"
        )
    others = ", ".join(f"{k} {v:.2f}%" for k, v in PUBLISHED_UNALLOCATED_PCT.items())
    lines.append(f"paper (median of 10 seeds): {others}")
    return "\n".join(lines)


def provenance() -> dict[str, object]:
    """What a result was measured on: the commit (and whether the tree had changes), the machine's load, when."""
    import subprocess
    from datetime import UTC, datetime

    repo = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "git_commit": git("rev-parse", "HEAD") or None,
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "loadavg_1m": _loadavg(),
        "cpu_count": os.cpu_count(),
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write_json(path: Path, payload: dict[str, object]) -> None:
    """Write a result file, stamped with `provenance()` at the end of the run."""
    payload = {**payload, "provenance": provenance()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(path)


def _num(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def trace_dir_from_env() -> Path:
    env = os.environ.get("TRAINYARD_TRACE_DIR")
    return Path(env) if env else DEFAULT_TRACE_DIR


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.allocator", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 10, 3 with --quick)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 seeds")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated, default all")
    parser.add_argument("--tie-break", choices=TIE_BREAKS, default="index")
    parser.add_argument("--output", type=Path, default=RESULTS_PATH)
    parser.add_argument("--quiet", action="store_true", help="no per-seed progress")
    parser.add_argument(
        "--families",
        action="store_true",
        help="replay the workload families (default, sharing-heavy, multi-gpu, model-constrained, cpu-heavy) "
        "with fgd, fgd_pure and best_fit on the reporting seeds 100.. (never the tuning seeds 0..9); writes "
        "bench/results/allocator-families.json",
    )
    args = parser.parse_args(argv)

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        parser.error(f"unknown policies: {', '.join(unknown)}")
    n_seeds = args.seeds if args.seeds is not None else (3 if args.quick else 10)
    if n_seeds < 1:
        parser.error("--seeds must be at least 1")

    trace_dir = trace_dir_from_env()
    missing = [f for f in (NODE_FILE, POD_FILE) if not (trace_dir / f).is_file()]
    if missing:
        print(
            f"allocator benchmark skipped: trace not found ({', '.join(missing)} missing in {trace_dir}). "
            "Set TRAINYARD_TRACE_DIR to the folder holding the openb CSV files."
        )
        return 0

    nodes, pods = load_trace(trace_dir)
    if args.families:
        return run_families(nodes, pods, n_seeds=args.seeds or 5, quiet=args.quiet)
    seeds = list(range(n_seeds))
    capacity = FULL_MILLI * sum(n.num_gpus for n in nodes)
    print(
        f"trace: {len(nodes)} GPU nodes, {capacity // FULL_MILLI} GPUs, {len(pods)} pods; "
        f"seeds {seeds[0]}..{seeds[-1]}; policies {', '.join(policies)}"
    )
    load_before = _loadavg()
    t0 = time.perf_counter()
    summary = run(nodes, pods, policies, seeds, tie_break=args.tie_break, progress=not args.quiet)
    elapsed = time.perf_counter() - t0
    print(format_table(summary))

    ours = summary.get(PLATFORM_POLICY)
    targets: dict[str, object] = {
        "policy": PLATFORM_POLICY,
        "unallocated_pct_max": TARGET_UNALLOCATED_PCT,
        "decisions_per_s_min": TARGET_DECISIONS_PER_S,
    }
    if ours is not None:
        targets["unallocated_met"] = _num(ours["unallocated_pct_median"]) <= TARGET_UNALLOCATED_PCT
        # Judged on the placing process's CPU time: wall-clock rates measure whatever else shares the machine.
        targets["decisions_per_s_basis"] = "decisions per CPU-second of the placing process"
        targets["decisions_per_s_met"] = _num(ours["decisions_per_cpu_s"]) >= TARGET_DECISIONS_PER_S
        targets["decisions_per_s_wall_met"] = _num(ours["decisions_per_s"]) >= TARGET_DECISIONS_PER_S
        cpu_rates = [_num(s["decisions_per_cpu_s"]) for s in summary.values()]
        targets["slowest_policy_decisions_per_cpu_s"] = min(cpu_rates)
        targets["met"] = bool(targets["unallocated_met"] and targets["decisions_per_s_met"])
        print(
            f"target ({PLATFORM_POLICY}): unallocated <= {TARGET_UNALLOCATED_PCT}% -> "
            f"{'met' if targets['unallocated_met'] else 'NOT met'}; "
            f">= {TARGET_DECISIONS_PER_S:,.0f} decisions/s -> "
            f"{'met' if targets['decisions_per_s_met'] else 'NOT met'} per CPU-second, "
            f"{'met' if targets['decisions_per_s_wall_met'] else 'NOT met'} on the wall clock"
            f"{'' if targets['decisions_per_s_wall_met'] else ' (load average ' + str(_loadavg()) + ')'}"
        )

    payload: dict[str, object] = {
        "benchmark": "allocator",
        "trace": {
            "name": "alibaba-gpu-v2023 (openb), default pod list",
            "files": [NODE_FILE, POD_FILE],
            "nodes": len(nodes),
            "gpus": capacity // FULL_MILLI,
            "pods": len(pods),
        },
        "method": {
            "arrival": "pod list inflated by resampling past 100% of GPU capacity, shuffled per seed, "
            "pods never removed",
            "metric": "unallocated share of GPU capacity when arrived GPU requests reach 100% of capacity",
            "checkpoints_pct": [round(100 * c) for c in CHECKPOINTS],
            "failed_pct_of_arrived": "per checkpoint, the share of GPU demand arrived so far that failed; "
            "at 100% it equals the unallocated share of capacity",
            "seeds": seeds,
            "tie_break": args.tie_break,
            "fgd_workload": "the pod list's request shapes weighted by frequency",
            "fgd_pack_weight": DEFAULT_PACK_WEIGHT,
            "fgd_pure": "fragmentation growth alone (the paper's rule); fgd adds the packing term",
        },
        "policies": summary,
        "published_unallocated_pct": PUBLISHED_UNALLOCATED_PCT,
        "published_source": "Weng et al., Beware of Fragmentation, USENIX ATC '23 (median of 10 seeds)",
        "targets": targets,
        "environment": {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            # Wall-clock rates fall when other work shares the machine; the per-CPU-second rates do not.
            "loadavg_1m_before_after": [load_before, _loadavg()],
            "seconds": round(elapsed, 1),
        },
    }
    write_json(args.output, payload)
    out = args.output.resolve()
    print(f"wrote {out.relative_to(REPO_ROOT) if out.is_relative_to(REPO_ROOT) else out}")
    return 0


FAMILY_POLICIES = ("fgd", "fgd_pure", "best_fit")
FAMILIES_PATH = REPO_ROOT / "bench" / "results" / "allocator-families.json"
REPORT_SEED_BASE = 100  # tuning (DEFAULT_PACK_WEIGHT) used seeds 0..9 of the default trace; reports use 100..


def run_families(nodes: Sequence[NodeSpec], pods: Sequence[Request], *, n_seeds: int, quiet: bool) -> int:
    seeds = list(range(REPORT_SEED_BASE, REPORT_SEED_BASE + n_seeds))
    out: dict[str, object] = {}
    print(f"families on seeds {seeds[0]}..{seeds[-1]}; policies {', '.join(FAMILY_POLICIES)}")
    head = f"{'family':<18} " + " ".join(f"{p:>10}" for p in FAMILY_POLICIES) + "   fgd <= best_fit"
    lines = [head, "-" * len(head)]
    for k, (name, transform) in enumerate(families(nodes).items()):
        family_pods = list(pods) if transform is None else transform(pods, random.Random(1000 + k))
        summary = run(nodes, family_pods, FAMILY_POLICIES, seeds, progress=not quiet)
        medians = {p: summary[p]["unallocated_pct_median"] for p in FAMILY_POLICIES}
        holds = medians["fgd"] <= medians["best_fit"]
        out[name] = {
            "unallocated_pct_median": medians,
            "by_seed": {p: summary[p]["unallocated_pct_by_seed"] for p in FAMILY_POLICIES},
            "fgd_at_or_below_best_fit": holds,
            "published_fgd_pct": PUBLISHED_UNALLOCATED_PCT["FGD"] if name == "default" else None,
            "pods": len(family_pods),
            "model_constrained_pods": sum(1 for p in family_pods if p.gpu_model),
        }
        lines.append(
            f"{name:<18} "
            + " ".join(f"{medians[p]:>9.2f}%" for p in FAMILY_POLICIES)
            + f"   {'yes' if holds else 'NO'}"
        )
    print("\n".join(lines))
    payload = {
        "benchmark": "allocator families",
        "seeds": seeds,
        "tuning_seeds_not_reported": list(range(10)),
        "pack_weight": DEFAULT_PACK_WEIGHT,
        "families": out,
        "all_hold": all(v["fgd_at_or_below_best_fit"] for v in out.values()),
        "default_at_or_below_paper": out["default"]["unallocated_pct_median"]["fgd"] <= TARGET_UNALLOCATED_PCT,
    }
    write_json(FAMILIES_PATH, payload)
    print(f"wrote {FAMILIES_PATH.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
