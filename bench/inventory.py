"""The inventory sync (``jobs.tasks.sync_inventory``) on the Volcano backend at the trace's scale: seconds and
database queries.

What runs: a benchmark database (``<db>_bench_inventory``), migrated and seeded; the openb trace's GPU nodes as
the Kubernetes Node objects ``make bench-k8s`` gives kwok (bench/k8s.py), Ready, read by the Volcano backend's own
parser (``node_info``); the task itself, in this process, with the backend's node list answered from those objects
(the API server's list is not part of the figure: one request, measured by ``make bench-k8s``). Each step is one
sync: the first (every node and card created), one with nothing changed, one with a tenth of the nodes NotReady,
one with them Ready again, and one where one card of each of a tenth of the nodes is no longer reported.

Target: a sync of the whole trace in seconds, with a number of queries that does not grow with the nodes.

Run: ``make bench-inventory`` (``--nodes N``: the first N trace nodes). Results: ``bench/results/inventory.json``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "inventory.json"
PROCESS_MODEL = "one process: the sync task's code called in the benchmark's process, as a worker runs it"


def cluster_nodes(specs, *, not_ready: set[str] = frozenset(), fewer_cards: set[str] = frozenset()) -> list[dict]:
    """The trace's nodes as the API server lists them (bench/k8s.py's kwok nodes), with their Ready condition."""
    from bench.k8s import node_object

    out = []
    for spec in specs:
        node = node_object(spec, kwok_port=10247)
        name = node["metadata"]["name"]
        if name in fewer_cards:
            node["metadata"]["labels"]["nvidia.com/gpu.count"] = str(spec.num_gpus - 1)
        ready = "False" if name in not_ready else "True"
        node["status"]["conditions"] = [{"type": "Ready", "status": ready}]
        out.append(node)
    return out


class ListedBackend:
    """The Volcano backend's inventory of a node list given here instead of read from an API server."""

    def __init__(self, nodes: list[dict]) -> None:
        self.nodes = nodes

    def inventory(self):
        from django.conf import settings

        from jobs.backends.volcano import node_info

        rack_labels = settings.TRAINYARD_K8S_RACK_LABELS
        infos = (node_info(n, rack_labels) for n in self.nodes)
        return [info for info in infos if info is not None]


def timed_sync(nodes: list[dict]) -> dict[str, Any]:
    from django.db import connection

    import jobs.backends
    from jobs.tasks import sync_inventory

    queries = 0

    def count(execute, sql, params, many, context):
        nonlocal queries
        queries += 1
        return execute(sql, params, many, context)

    real = jobs.backends.get_backend
    jobs.backends.get_backend = lambda *a, **k: ListedBackend(nodes)
    try:
        with connection.execute_wrapper(count):
            began = time.perf_counter()
            sync_inventory()
            seconds = time.perf_counter() - began
    finally:
        jobs.backends.get_backend = real
    return {"seconds": round(seconds, 3), "queries": queries}


def _baseline(path: Path) -> dict[str, Any]:
    """Another run's figures with its own commit and load, e.g. the code before a change."""
    import json

    kept = json.loads(path.read_text())
    return {k: kept[k] for k in ("nodes", "gpus", "syncs", "provenance")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inventory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=None, help="the first N trace GPU nodes (default all)")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument(
        "--baseline", type=Path, default=None, help="a result of this benchmark at another commit, kept alongside"
    )
    args = parser.parse_args(argv)

    from bench.allocator import load_trace, trace_dir_from_env, write_json
    from bench.api import setup_django
    from bench.scheduler import own_database, trace_present

    trace_dir = trace_dir_from_env()
    if not trace_present(trace_dir, "inventory"):
        return 1 if os.environ.get("CI") == "true" else 0
    specs = [n for n in load_trace(trace_dir)[0] if n.num_gpus][: args.nodes]
    gpus = sum(n.num_gpus for n in specs)
    own_database(url_name="inventory")
    os.environ["TRAINYARD_BACKEND"] = "volcano"
    setup_django()
    from django.core.management import call_command

    from cluster.models import GPU, Node
    from ops.seed import seed

    call_command("migrate", verbosity=0, interactive=False)
    seed(admin_password="bench-admin-pass", demo_password="bench-demo-pass")
    tenth = {n["metadata"]["name"] for n in cluster_nodes(specs)[::10]}
    steps = {
        "first": cluster_nodes(specs),
        "unchanged": cluster_nodes(specs),
        "tenth_not_ready": cluster_nodes(specs, not_ready=tenth),
        "ready_again": cluster_nodes(specs),
        "tenth_lose_a_card": cluster_nodes(specs, fewer_cards=tenth),
    }
    print(f"inventory: {len(specs)} nodes, {gpus} GPUs")
    print(f"{'sync':<20} {'seconds':>9} {'queries':>8}")
    results: dict[str, Any] = {}
    for name, nodes in steps.items():
        results[name] = timed_sync(nodes)
        print(f"{name:<20} {results[name]['seconds']:>9} {results[name]['queries']:>8}")
    down = Node.objects.filter(state=Node.State.UNHEALTHY).count()
    out = GPU.objects.filter(health=GPU.Health.UNHEALTHY).count()
    if Node.objects.count() != len(specs) or down or out != len(tenth):
        print(f"inventory: unexpected rows after the steps ({Node.objects.count()} nodes, {down} not ready, {out} "
              f"cards out of service; expected {len(specs)}, 0, {len(tenth)})")  # fmt: skip
        return 1
    write_json(
        args.output or RESULTS,
        {
            "benchmark": "inventory sync of the trace's nodes on the Volcano backend (jobs.tasks.sync_inventory)",
            "process_model": PROCESS_MODEL,
            "nodes": len(specs),
            "gpus": gpus,
            "changed_nodes": len(tenth),
            "syncs": results,
            **({"baseline": _baseline(args.baseline)} if args.baseline else {}),
        },
    )
    print(f"wrote {args.output or RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
