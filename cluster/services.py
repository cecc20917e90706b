"""Writes to the GPU pool: inventory sync, slice placement and release, quarantine, reconcile."""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import structlog
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from cluster.inventory import LENT_LABEL, POOL_LABEL, NodeInfo, node_pool
from cluster.models import GPU, LogicalDevice, Node, PoolRepair
from cluster.selectors import slice_filter_live
from kernel.errors import Conflict, ValidationFailed

log = structlog.get_logger(__name__)
POOL_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,49}\Z")
POOL_LOCK_KEY = 0x7472_6169  # advisory lock id for "the pool" (serialises placement across queues)


def pool_lock() -> None:
    """Serialise placement decisions inside the current transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [POOL_LOCK_KEY])


VANISHED = "GPU no longer reported by the node"
K8S_READY_LABEL = "trainyard.io/k8s-ready"


def inventory_sync(*, info: NodeInfo, backend: str = "local") -> Node:
    """One node's inventory (`inventories_sync` of one)."""
    inventories_sync(infos=[info], backend=backend)
    return Node.objects.get(name=info.name)


_NODE_FIELDS = ("backend", "emulated", "driver_version", "cuda_version", "cpu_milli", "memory_mib", "labels", "rack",
                "nvlink_domain")  # fmt: skip
_GPU_FIELDS = ("node_id", "index", "model", "memory_mib", "mig_profile", "mig_parent")


def inventories_sync(*, infos: Sequence[NodeInfo], backend: str = "local") -> list[str]:
    """Create or update nodes and their GPUs from what the backend reports; GPUs that vanished turn unhealthy,
    and come back into service when their node reports them again. A Kubernetes node that is not Ready keeps its
    cards (nothing is known to be wrong with them) but takes no placements until it is Ready again. One
    transaction with a fixed number of queries however many nodes are reported (a whole cluster every 5 minutes):
    the known rows are read at once, only what changed is written. Returns the names of the nodes."""
    now = timezone.now()
    infos = list({info.name: info for info in infos}.values())
    with transaction.atomic():
        # Locked in one order, so a concurrent sync waits instead of deadlocking, and an admin's pool move or loan
        # (which locks the node) is not overwritten by labels read before it.
        known = {n.name: n for n in Node.objects.select_for_update().filter(name__in=[i.name for i in infos])
                 .order_by("pk")}  # fmt: skip
        created, changed = [], []
        for info in infos:
            labels = dict(info.labels)
            node = known.get(info.name)
            for kept in (POOL_LABEL, LENT_LABEL):  # an admin's pool and a loan (jobs/lending.py) outlive the report
                if node is not None and kept in node.labels:
                    labels[kept] = node.labels[kept]
            values = dict(
                backend=backend,
                emulated=info.emulated,
                driver_version=info.driver_version,
                cuda_version=info.cuda_version,
                cpu_milli=info.cpu_milli,
                memory_mib=info.memory_mib,
                labels=labels,
                rack=info.labels.get("trainyard.io/rack", ""),
                nvlink_domain=info.labels.get("trainyard.io/nvlink-domain", ""),
            )
            if node is None:
                created.append(Node(name=info.name, last_seen=now, **values))
            elif _differs_then_set(node, values):
                changed.append(node)
        if changed:
            Node.objects.bulk_update(changed, _NODE_FIELDS)
        if known:
            Node.objects.filter(pk__in=[n.pk for n in known.values()]).update(last_seen=now)
        # A node another sync created meanwhile (not locked above: it did not exist) is updated, not a conflict.
        created = Node.objects.bulk_create(
            created, update_conflicts=True, unique_fields=["name"], update_fields=[*_NODE_FIELDS, "last_seen"]
        )
        nodes = {**known, **{n.name: n for n in created}}
        _gpus_sync(nodes=nodes, infos=infos, now=now)
        if backend != "local":
            ready = {i.name: i.labels[K8S_READY_LABEL] == "true" for i in infos if K8S_READY_LABEL in i.labels}
            if ready:
                nodes_reachability_apply(backend=backend, ready=ready)
    return [info.name for info in infos]


def _differs_then_set(row, values: Mapping[str, object]) -> bool:
    """Whether `row` differs from `values` in any field; if it does, the row takes them all (to be written in bulk)."""
    if all(getattr(row, k) == v for k, v in values.items()):
        return False
    for k, v in values.items():
        setattr(row, k, v)
    return True


def _gpus_sync(*, nodes: Mapping[str, Node], infos: Sequence[NodeInfo], now) -> None:
    """The cards of `infos` (their nodes already in `nodes`): created, updated where they changed, the nodes' cards
    no longer reported taken out of service and the ones reported again given back."""
    reported = {gpu.uuid: (nodes[info.name], gpu) for info in infos for gpu in info.gpus}
    node_ids = [n.pk for n in nodes.values()]
    known = {g.uuid: g for g in GPU.objects.filter(Q(uuid__in=list(reported)) | Q(node_id__in=node_ids))}
    created, changed = [], []
    for uuid, (node, gpu) in reported.items():
        values = dict(node_id=node.pk, index=gpu.index, model=gpu.model, memory_mib=gpu.memory_mib,
                      mig_profile=gpu.mig_profile, mig_parent=gpu.mig_parent)  # fmt: skip
        row = known.get(uuid)
        if row is None:
            created.append(GPU(uuid=uuid, **values))
        elif _differs_then_set(row, values):
            changed.append(row)
    if changed:
        GPU.objects.bulk_update(changed, _GPU_FIELDS)
    if created:
        GPU.objects.bulk_create(created, update_conflicts=True, unique_fields=["uuid"], update_fields=_GPU_FIELDS)
    vanished = [g for g in known.values() if g.uuid not in reported and g.health != GPU.Health.UNHEALTHY]
    if vanished:
        GPU.objects.filter(pk__in=[g.pk for g in vanished]).update(
            health=GPU.Health.UNHEALTHY, health_changed_at=now, quarantined=True, quarantine_reason=VANISHED
        )
        for gpu in vanished:
            log.warning("gpu_unhealthy", gpu=gpu.uuid, reason=VANISHED)
    back = [
        g
        for g in known.values()
        if g.uuid in reported and g.health == GPU.Health.UNHEALTHY and g.quarantine_reason == VANISHED
    ]
    if back:
        GPU.objects.filter(pk__in=[g.pk for g in back]).update(
            health=GPU.Health.HEALTHY, quarantined=False, quarantine_reason="", health_changed_at=now
        )
        for gpu in back:
            log.info("gpu_reported_again", gpu=gpu.uuid, node=reported[gpu.uuid][0].name)


def nodes_reachability_apply(*, backend: str, ready: Mapping[str, bool], complete: bool = False) -> int:
    """Take the backend's nodes that are not Ready (or, with `complete`, not in `ready` at all: deleted) out of
    placement, and give back those Ready again: `ready` → `unhealthy` → `ready`. A node an admin cordoned stays
    cordoned. No card is marked and no alert raised: an unreachable node says nothing about its cards, and jobs
    on it are judged by the backend (NodeLost after TRAINYARD_K8S_NODE_LOST_S). Returns how many nodes changed."""
    down = [name for name, ok in ready.items() if not ok]
    up = [name for name, ok in ready.items() if ok]
    gone = Node.objects.filter(backend=backend, state=Node.State.READY)
    gone = gone.filter(name__in=down) | (gone.exclude(name__in=list(ready)) if complete else gone.none())
    left = list(gone.values_list("name", flat=True))
    changed = Node.objects.filter(name__in=left).update(state=Node.State.UNHEALTHY)
    back = list(
        Node.objects.filter(backend=backend, state=Node.State.UNHEALTHY, name__in=up).values_list("name", flat=True)
    )
    changed += Node.objects.filter(name__in=back).update(state=Node.State.READY)
    for name in left:
        log.warning("node_unreachable", node=name, backend=backend, deleted=name not in ready)
    for name in back:
        log.info("node_ready_again", node=name, backend=backend)
    if back:
        transaction.on_commit(_dispatch_all)
    return changed


def gpu_mark_unhealthy(*, gpu: GPU, reason: str, quarantine: bool = True) -> GPU:
    gpu.health = GPU.Health.UNHEALTHY
    gpu.health_changed_at = timezone.now()
    if quarantine:
        gpu.quarantined = True
        gpu.quarantine_reason = reason[:300]
    gpu.save(update_fields=["health", "health_changed_at", "quarantined", "quarantine_reason"])
    log.warning("gpu_unhealthy", gpu=gpu.uuid, reason=reason)
    return gpu


def gpu_mark_suspect(*, gpu: GPU, reason: str) -> None:
    GPU.objects.filter(pk=gpu.pk).update(health=GPU.Health.SUSPECT, health_changed_at=timezone.now())
    PoolRepair.objects.create(kind="probe_failed", gpu=gpu, detail=reason)
    log.warning("gpu_probe_failed", gpu=gpu.uuid, reason=reason)


def node_cordon(*, node_id: int, actor: str) -> tuple[Node, bool]:
    """Stop new placements on a ready node (running jobs continue). Returns (node, whether it changed); a node
    already cordoned is left as it is; an unhealthy one is a 409 (`node_not_ready`)."""
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if node.state == Node.State.CORDONED:
            return node, False
        if node.state != Node.State.READY:
            raise Conflict(
                f"node {node.name} is {node.state}; only a ready node can be cordoned", code="node_not_ready"
            )
        node.state = Node.State.CORDONED
        node.save(update_fields=["state"])
    log.info("node_cordoned", node=node.name, actor=actor)
    return node, True


def node_uncordon(*, node_id: int, actor: str) -> tuple[Node, bool]:
    """Let a cordoned node take placements again and re-dispatch the queues at commit (jobs waiting for room
    start now rather than at the next beat). A ready node is left as it is; an unhealthy one is a 409."""
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if node.state == Node.State.READY:
            return node, False
        if node.state != Node.State.CORDONED:
            raise Conflict(f"node {node.name} is {node.state}, not cordoned", code="node_not_cordoned")
        node.state = Node.State.READY
        node.save(update_fields=["state"])
        transaction.on_commit(_dispatch_all)
    log.info("node_uncordoned", node=node.name, actor=actor)
    return node, True


def node_move(*, node_id: int, pool: str, actor: str) -> tuple[Node, bool]:
    """Move a node to another pool (its `trainyard.io/pool` label). Refused (409 `node_work_cannot_stay`) while
    it runs work of a queue not bound to that pool: the work could not stay there. Returns (node, whether it
    moved); jobs waiting for the target pool are dispatched at commit."""
    from quotas.models import Queue

    pool = (pool or "").strip()
    if not POOL_NAME.match(pool):
        raise ValidationFailed(
            "a pool name is 1-50 lower-case letters, digits or -, starting with a letter or digit",
            code="invalid_pool",
            field="pool",
        )
    with transaction.atomic():
        pool_lock()  # no placement on this node decides against its old pool meanwhile
        node = Node.objects.select_for_update().get(pk=node_id)
        if node_pool(node.labels) == pool:
            return node, False
        held = (
            LogicalDevice.objects.filter(
                slice_filter_live(), gpu__node=node, attempt__state__in=("placed", "starting", "running")
            )
            .values_list("attempt__job_id", "attempt__job__queue_id")
            .distinct()
        )
        bound = {q.id: q for q in Queue.objects.filter(id__in={queue for _, queue in held})}
        dedicated = pool in settings.TRAINYARD_DEDICATED_POOLS  # only its own queues' work may stay there
        stuck = sorted(
            str(job) for job, queue in held if (bound[queue].pools or dedicated) and pool not in bound[queue].pools
        )
        if stuck:
            raise Conflict(
                f"node {node.name} runs {len(stuck)} job(s) of queues not bound to pool {pool} "
                f"({', '.join(j[:8] for j in stuck[:5])}); they could not stay: move it when they end",
                code="node_work_cannot_stay",
                jobs=stuck,
            )
        before = node_pool(node.labels)
        node.labels = {**node.labels, POOL_LABEL: pool}
        node.save(update_fields=["labels"])
        PoolRepair.objects.create(kind="node_moved", detail=f"{node.name}: pool {before} -> {pool} by {actor}")
        transaction.on_commit(_dispatch_all)
    log.info("node_moved", node=node.name, pool=pool, before=before, actor=actor)
    return node, True


def node_lend(*, node_id: int, to: str | None, why: str) -> bool:
    """Lend a node to a borrowing pool (`to`), or take it back (None); returns whether it changed."""
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if node.labels.get(LENT_LABEL) == to:
            return False
        labels = {k: v for k, v in node.labels.items() if k != LENT_LABEL}
        if to:
            labels[LENT_LABEL] = to
        before = node.labels.get(LENT_LABEL)
        node.labels = labels
        node.save(update_fields=["labels"])
        kind = "node_lent" if to else "node_reclaimed"
        PoolRepair.objects.create(kind=kind, detail=f"{node.name} ({node_pool(labels)}) -> {to or before}: {why}")
        transaction.on_commit(_dispatch_all)
    log.info(kind, node=node.name, to=to or before, why=why)
    return True


def _dispatch_all() -> None:
    from kernel.wake import dispatch_soon

    dispatch_soon()


def gpu_return_to_service(*, gpu: GPU) -> GPU:
    gpu.health = GPU.Health.HEALTHY
    gpu.quarantined = False
    gpu.quarantine_reason = ""
    gpu.health_changed_at = timezone.now()
    gpu.save(update_fields=["health", "quarantined", "quarantine_reason", "health_changed_at"])
    return gpu


# ---------------------------------------------------------------------------------------------- the cards


def slices_release(*, attempt_id: int, reason: str) -> int:
    """Free every slice an attempt holds; returns how many were still held (0 on a repeated call)."""
    return LogicalDevice.objects.filter(attempt_id=attempt_id, released_at__isnull=True).update(
        released_at=timezone.now(), release_reason=reason[:100]
    )


# ---------------------------------------------------------------------------------------------- reconcile


@dataclass
class ReconcileReport:
    freed: int = 0
    overcommitted: list[str] | None = None
    lock_wait_s: float = 0.0  # waiting for the pool lock (a dispatch pass's write holds it)
    lock_held_s: float = 0.0  # admission waits this long, no longer: the leak repair, from taking the lock to commit
    total_s: float = 0.0


# Held slices whose holder is gone: no attempt, a finished attempt, or (given what the backend runs) an attempt said
# to run that the backend does not know. One statement under the pool lock, whatever the size of the fleet.
FREE_LEAKED_SQL = """
UPDATE cluster_logicaldevice d SET released_at = %(now)s, release_reason = 'reconcile_leak'
FROM cluster_logicaldevice d2 LEFT JOIN jobs_attempt a ON a.id = d2.attempt_id
WHERE d.id = d2.id AND d.released_at IS NULL AND (
    a.id IS NULL OR a.state = ANY(%(finished)s)
    OR (%(check_refs)s AND a.state = ANY(%(running)s) AND a.backend_ref <> ''
        AND a.created_at < %(observed_at)s AND NOT (a.backend_ref = ANY(%(refs)s)))
)
RETURNING d.id, d.gpu_id, d.compute_milli, d.memory_mib, a.id, a.state
"""

# Cards whose live slices add up to more than they hold (a read: no lock).
OVERCOMMITTED_SQL = """
SELECT g.id, n.name, g.index, sum(d.compute_milli), sum(d.memory_mib), g.memory_mib
FROM cluster_logicaldevice d
JOIN jobs_attempt a ON a.id = d.attempt_id
JOIN cluster_gpu g ON g.id = d.gpu_id
JOIN cluster_node n ON n.id = g.node_id
WHERE d.released_at IS NULL AND NOT (a.state = ANY(%(finished)s))
GROUP BY g.id, n.name, g.index, g.memory_mib
HAVING sum(d.compute_milli) > 1000 OR sum(d.memory_mib) > g.memory_mib
"""

FINISHED_ATTEMPT = ["succeeded", "failed", "cancelled", "timed_out", "lost", "preempted"]
LEDGER_CHANGES_KEEP_S = 900  # rows of trainyard_ledger_change kept (migration cluster/0008)


def pool_reconcile(*, live_backend_refs: set[str] | None = None, observed_at=None) -> ReconcileReport:
    """Compare the ledger with what really runs: free slices whose holder is gone, flag over-committed cards.

    `live_backend_refs` is what the backend says runs now (None: trust the attempts' own states), read at
    `observed_at` (attempts created later are not judged by it). Set-based: one UPDATE frees the leaks under
    the pool lock (held for milliseconds, so admission goes on), one read finds over-commit, and the repair
    rows are written in bulk.
    """
    report = ReconcileReport(overcommitted=[])
    now = timezone.now()
    params = {
        "now": now,
        "finished": FINISHED_ATTEMPT,
        "check_refs": live_backend_refs is not None,
        "running": ["running", "starting"],
        "refs": sorted(live_backend_refs or ()),
        "observed_at": observed_at or now,
    }
    t0 = time.perf_counter()
    with transaction.atomic():
        pool_lock()
        t1 = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute(FREE_LEAKED_SQL, params)
            freed = cursor.fetchall()
        PoolRepair.objects.bulk_create(
            [
                PoolRepair(
                    kind="freed_leaked_slice",
                    gpu_id=gpu_id,
                    detail=f"slice {did} ({milli}m/{mem}MiB) held by "
                    + ("no attempt" if attempt_id is None else f"attempt {attempt_id} ({state})"),
                )
                for did, gpu_id, milli, mem, attempt_id, state in freed
            ],
            batch_size=1000,
        )
    report.lock_wait_s, report.lock_held_s = t1 - t0, time.perf_counter() - t1
    report.freed = len(freed)
    with connection.cursor() as cursor:
        cursor.execute(OVERCOMMITTED_SQL, {"finished": FINISHED_ATTEMPT})
        over = cursor.fetchall()
    repairs = []
    for gpu_id, node, index, milli, memory, total in over:
        detail = f"{node}/gpu{index}: {milli}m compute and {memory} MiB held of 1000m / {total} MiB"
        repairs.append(PoolRepair(kind="overcommit", gpu_id=gpu_id, detail=detail))
        report.overcommitted.append(detail)
    PoolRepair.objects.bulk_create(repairs, batch_size=1000)
    with connection.cursor() as cursor:
        # The ledger's moves a dispatcher reads to refresh only the GPUs that changed (scheduler/pool.py): one
        # further behind than these finds a gap in their chain and reads every live slice instead.
        cursor.execute(
            "DELETE FROM trainyard_ledger_change WHERE at < clock_timestamp() - make_interval(secs => %s)",
            [LEDGER_CHANGES_KEEP_S],
        )
        pruned = cursor.rowcount
    report.total_s = time.perf_counter() - t0
    log.info(
        "pool_reconciled",
        freed=report.freed,
        overcommitted=len(report.overcommitted),
        ledger_changes_pruned=pruned,
        lock_wait_ms=round(report.lock_wait_s * 1000, 1),
        lock_held_ms=round(report.lock_held_s * 1000, 1),
        total_ms=round(report.total_s * 1000, 1),
    )
    return report


def slices_follow_assignment(*, attempt_id: int, assigned: Mapping[str, Sequence[str]]) -> list[tuple[str, str]]:
    """Correct the ledger to the cards a device plugin really gave an attempt (`assigned`: node name -> GPU
    UUIDs, read back from its pods) where the plugin could not be told which to use. Each live slice of the
    attempt on such a node whose card is not among them moves to one that is (and that the attempt does not
    hold yet); each move is a PoolRepair. Returns the moves as (old UUID, new UUID)."""
    moved: list[tuple[str, str]] = []
    with transaction.atomic():
        pool_lock()
        held = list(
            LogicalDevice.objects.select_related("gpu__node").filter(attempt_id=attempt_id, released_at__isnull=True)
        )
        by_node: dict[str, list[LogicalDevice]] = defaultdict(list)
        for device in held:
            by_node[device.gpu.node.name].append(device)
        for node, devices in by_node.items():
            given = [u for u in assigned.get(node, ()) if u]
            spare = [u for u in given if u not in {d.gpu.uuid for d in devices}]
            for device in devices:
                if device.gpu.uuid in given or not spare:
                    continue
                target = GPU.objects.filter(uuid=spare.pop(0), node=device.gpu.node).first()
                if target is None:
                    continue
                LogicalDevice.objects.filter(pk=device.pk).update(gpu=target)
                PoolRepair.objects.create(
                    kind="slice_moved",
                    gpu=target,
                    detail=f"slice {device.pk} of attempt {attempt_id}: the device plugin gave {target.uuid}, "
                    f"not {device.gpu.uuid}",
                )
                moved.append((device.gpu.uuid, target.uuid))
    if moved:
        log.warning("slices_moved_to_assignment", attempt=attempt_id, moved=moved)
    return moved
