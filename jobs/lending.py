"""Idle lending between node pools (docs/pools.md).

`TRAINYARD_POOL_LENDING` names lending pairs (`whole-card>inference`). A lending pool whose own use (the compute
its nodes give to work that is not preemptible) stays below `TRAINYARD_LEND_BELOW_PERCENT` for
`TRAINYARD_LEND_AFTER_S` lends its idle nodes (nothing runs there) to the borrowing pool: preemptible jobs of
queues bound to the borrower may be placed there (the `trainyard.io/lent-to` label). Nothing else changes: the
nodes stay in their pool, so the owner's jobs can always be placed on them, and a borrower there is preempted like
any other when the owner waits for capacity (jobs/preemption.py). When a queue bound to the lending pool has
waiting jobs that hold quota, or the pool's own use is back over the threshold, every loan of that pool is taken
back, so no new borrower lands there.

Level-triggered (beat, every minute): each run reads the pools' use and the waiting lines afresh; what it
remembers between runs is when each lending pool went below the threshold (`cluster.PoolState`).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

import structlog
from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from cluster.inventory import LENT_LABEL, node_pool
from cluster.models import LogicalDevice, Node, PoolState
from cluster.services import node_lend
from jobs.models import Job
from jobs.states import JobState
from quotas.models import Queue

log = structlog.get_logger(__name__)
LIVE_ATTEMPT = ("placed", "starting", "running")


def lending_pairs(text: str | None = None) -> list[tuple[str, str]]:
    text = settings.TRAINYARD_POOL_LENDING if text is None else text
    pairs = []
    for part in (text or "").split(","):
        lender, sep, borrower = part.partition(">")
        if sep and lender.strip() and borrower.strip():
            pairs.append((lender.strip(), borrower.strip()))
    return pairs


def pools_use() -> dict[str, dict[str, int]]:
    """Per pool: its cards (milli), what work that is not preemptible uses of them, and per node what anything
    uses (an idle node uses nothing)."""
    nodes = list(Node.objects.filter(state=Node.State.READY).values("id", "labels"))
    pool_of = {n["id"]: node_pool(n["labels"]) for n in nodes}
    out: dict[str, dict] = defaultdict(lambda: {"total": 0, "own": 0, "busy_nodes": set()})
    for n in nodes:
        out[pool_of[n["id"]]]  # noqa: B018 - a pool with nodes but no cards still shows
    for node_id, cards in Node.objects.filter(id__in=pool_of).values_list("id", "gpus__id"):
        if cards is not None:
            out[pool_of[node_id]]["total"] += 1000
    live = (
        LogicalDevice.objects.filter(released_at__isnull=True, attempt__state__in=LIVE_ATTEMPT)
        .values("gpu__node_id", "attempt__job__preemptible")
        .annotate(milli=Sum("compute_milli"))
    )
    for row in live:
        pool = pool_of.get(row["gpu__node_id"])
        if pool is None:
            continue
        out[pool]["busy_nodes"].add(row["gpu__node_id"])
        if not row["attempt__job__preemptible"]:
            out[pool]["own"] += row["milli"]
    return dict(out)


def _owner_waits(pool: str) -> bool:
    """Whether a queue bound to `pool` has jobs that hold quota and wait."""
    queues = [q.id for q in Queue.objects.filter(pools__contains=[pool])]
    return Job.objects.filter(queue_id__in=queues, state=JobState.PENDING, preemptible=False).exists()


def pools_lend(*, now=None) -> dict[str, int]:
    """One run of the rule over every lending pair; returns how many nodes it lent and took back."""
    now = now or timezone.now()
    report = {"lent": 0, "reclaimed": 0}
    pairs = lending_pairs()
    if not pairs:
        return report
    use = pools_use()
    nodes = list(Node.objects.values("id", "name", "labels", "state"))
    window = timedelta(seconds=settings.TRAINYARD_LEND_AFTER_S)
    for lender, borrower in pairs:
        mine = [n for n in nodes if node_pool(n["labels"]) == lender]
        lent = [n for n in mine if n["labels"].get(LENT_LABEL)]
        if _owner_waits(lender):
            PoolState.objects.update_or_create(name=lender, defaults={"below_since": None})
            for n in lent:
                report["reclaimed"] += node_lend(node_id=n["id"], to=None, why=f"queues of pool {lender} wait")
            continue
        stats = use.get(lender) or {"total": 0, "own": 0, "busy_nodes": set()}
        percent = 100 * stats["own"] / stats["total"] if stats["total"] else 100.0
        state, _ = PoolState.objects.get_or_create(name=lender)
        if percent >= settings.TRAINYARD_LEND_BELOW_PERCENT:
            if state.below_since is not None:
                PoolState.objects.filter(pk=state.pk).update(below_since=None)
            for n in lent:  # busy again: its own work may want these next
                report["reclaimed"] += node_lend(node_id=n["id"], to=None, why=f"pool {lender} is busy again")
            continue
        if state.below_since is None:
            PoolState.objects.filter(pk=state.pk).update(below_since=now)
            continue
        if now - state.below_since < window:
            continue
        for n in mine:
            idle = n["id"] not in stats["busy_nodes"]
            if idle and n["state"] == Node.State.READY and not n["labels"].get(LENT_LABEL):
                why = f"pool {lender} under {settings.TRAINYARD_LEND_BELOW_PERCENT:g}% use for {window}"
                report["lent"] += node_lend(node_id=n["id"], to=borrower, why=why)
    if report["lent"] or report["reclaimed"]:
        log.info("pools_lending", **report)
    return report
