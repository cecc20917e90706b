"""The GPU pool in memory: nodes (host CPU and memory, GPUs, live slices) in the structures the placement
policy works on, loaded once per process and kept current from the ledger.

Two version numbers (migration cluster/0004) say when to look again: the structure number moves when nodes or
GPUs change in a way placement cares about (state, health, driver, capacity), the ledger number when a slice is
handed out or released or an attempt finishes. A pass that finds both unchanged reads nothing else; a changed
ledger costs a read of the GPUs each move touched (`trainyard_ledger_change`, migration cluster/0008) and of their
live slices, or, when that chain has a gap, one query over every live slice, and refreshes only the nodes whose use
changed; a changed structure reloads the pool (a few hundred milliseconds for a 6,000-GPU fleet, and it happens
when an admin or the inventory changes a node, not per job).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import structlog
from django.conf import settings
from django.db import connection

from cluster.inventory import LENT_LABEL, SHARING_LABEL, SHARING_TIME_SLICED, SHARING_WHOLE, node_pool
from cluster.selectors import version_tuple
from scheduler import policy

log = structlog.get_logger(__name__)

# A node's sharing label (set by the inventory) as the placement policy's mode.
NODE_SHARING = {SHARING_WHOLE: policy.WHOLE_ONLY, SHARING_TIME_SLICED: policy.SHARES_ONLY}
UNTRACKED = 1 << 40  # host CPU/memory of a node whose capacity is not reserved (see `host_accounted`)
FINISHED_ATTEMPT = ("succeeded", "failed", "cancelled", "timed_out", "lost", "preempted")
LEDGER_FULL_READ_S = 300.0  # every live slice is read at least this often, whatever the changes say

# The live slices as the ledger counts them: held, and whether stale (its attempt finished or is gone).
SLICES_SQL = (
    "SELECT d.id, d.gpu_id, d.compute_milli, d.memory_mib, d.cpu_milli, d.host_memory_mib, "
    "a.id IS NULL OR a.state = ANY(%s) "
    "FROM cluster_logicaldevice d LEFT JOIN jobs_attempt a ON a.id = d.attempt_id "
    "WHERE d.released_at IS NULL"
)
# Both numbers, the ledger's row locked (one statement: a pass's write counts its statements).
HELD_VERSIONS_SQL = (
    "SELECT id, n FROM trainyard_pool_version WHERE id = 1 "
    "UNION ALL SELECT id, n FROM (SELECT id, n FROM trainyard_pool_version WHERE id = 2 FOR UPDATE) held"
)
# The ledger's moves after a number, up to another: each names the number it replaced (migration cluster/0008).
LEDGER_CHANGES_SQL = (
    "SELECT version, previous, gpu_ids FROM trainyard_ledger_change WHERE version > %s AND version <= %s "
    "ORDER BY version"
)


def model_key(name: str) -> str:
    """A GPU model name as matching compares it: case and spacing folded, the vendor prefix dropped."""
    key = " ".join(name.replace("-", " ").replace("_", " ").lower().split())
    return key.removeprefix("nvidia ").strip()


def model_matches(wanted: str, model: str) -> bool:
    """`A100` (a family) matches `NVIDIA A100-SXM4-80GB`; `A100-SXM4-80GB` matches only that model."""
    w, m = model_key(wanted), model_key(model)
    return bool(w) and (m == w or m.startswith(w + " "))


@dataclass
class Card:
    id: int
    uuid: str
    index: int
    model: str
    memory_mib: int
    healthy: bool
    mig_profile: str = ""


@dataclass
class NodeMeta:
    id: int
    name: str
    backend: str
    emulated: bool
    driver_version: str
    driver: tuple[int, ...]
    rack: str
    labels: dict
    ready: bool
    cpu_milli: int
    memory_mib: int
    host_accounted: bool
    cards: dict[int, Card] = field(default_factory=dict)  # by index


@dataclass
class Usage:
    """What live slices take from one card, and the slices of finished attempts still on it (stale)."""

    milli: int = 0
    memory: int = 0
    cpu: int = 0
    host_memory: int = 0
    stale: tuple[int, ...] = ()


def host_accounted(backend: str) -> bool:
    """Whether a node's host CPU and memory are reserved per job: always on a cluster, where the kubelet refuses
    pods that do not fit; on the local backend only when asked, since local jobs share the machine's cores."""
    return backend != "local" or settings.TRAINYARD_LOCAL_ACCOUNT_HOST


class Pool:
    """The pool as the policy sees it (`nodes`, `allocator`), with what the database calls each thing (`meta`)."""

    def __init__(self) -> None:
        self.structure_version: int | None = None
        self.ledger_version: int | None = None
        # The ledger number `usage` was last read at, or updated to by our own write; kept when `ledger_version`
        # is forgotten (another write came between ours), so the next read asks only what moved since. With the
        # monotonic time of the last read of every live slice.
        self._ledger_base: int | None = None
        self._full_read_at = 0.0
        self.nodes: list[policy.Node] = []
        self.meta: list[NodeMeta] = []
        self.by_name: dict[str, int] = {}
        self.gpu_at: dict[int, tuple[int, int]] = {}  # GPU id -> (node position, card index)
        self.gpu_by_uuid: dict[str, tuple[int, int]] = {}
        self.usage: dict[int, Usage] = {}  # GPU id -> use
        self.models: frozenset[str] = frozenset()
        self.allocator: policy.Allocator | None = None
        self.workload: policy.Workload | None = None
        self._too_old: dict[str, list[int]] = {}
        self._outside: dict[tuple[tuple[str, ...], bool, tuple[str, ...]], list[int]] = {}
        # MIG instances by profile, as (node position, card index): devices only jobs asking for that profile get.
        self.mig: dict[str, list[tuple[int, int]]] = {}
        self._ready: tuple[bool, frozenset[int], frozenset[str]] | None = None
        # Request shapes that found no place, with why and one replica as a request of any model, since capacity
        # last grew where they could use it: capacity only shrinks while this pool places jobs itself, so a shape
        # that failed keeps failing until a node with room for it changes (a release there) or the nodes do.
        self.failed: dict[tuple, tuple[tuple[str, str], policy.Request]] = {}

    # -- keeping current ---------------------------------------------------------------------------------

    @staticmethod
    def read_versions(*, hold_ledger: bool = False) -> tuple[int, int]:
        """(structure, ledger). `hold_ledger`: lock the ledger's number until the transaction ends first, so no
        other transaction moves it between this read and our own write (a pass's write: `wrote`)."""
        with connection.cursor() as cursor:
            cursor.execute(HELD_VERSIONS_SQL if hold_ledger else "SELECT id, n FROM trainyard_pool_version")
            rows = dict(cursor.fetchall())
        return rows.get(1, 0), rows.get(2, 0)

    def sync(self, workload_for: Callable[[Pool], policy.Workload]) -> None:
        """Bring the pool up to the committed state: nothing to read when neither number moved.
        `workload_for(pool)` gives the request mix the policy keeps room for (it may resolve GPU models)."""
        structure, ledger = self.read_versions()
        if structure != self.structure_version or self.allocator is None:
            self.failed.clear()
            self._load_structure()
            self._load_ledger()
            self.workload = workload_for(self)
            self._rebuild_all()
            self.structure_version, self.ledger_version = structure, ledger
            self._ledger_base = ledger
            return
        # The ledger first, whatever else changed: a new workload rebuilds the allocator from `self.nodes`, and
        # nodes that still hold another process's old view would be booked again (issue: double-booked cards).
        if ledger != self.ledger_version:
            changed = self._load_ledger(self._changed_gpus(ledger))
            for i in changed:
                self._apply(i)
                assert self.allocator is not None
                self.allocator.refresh(i)
            self._retry_failed_on(changed)
        workload = workload_for(self)
        if workload is not self.workload:
            self.workload = workload
            self.allocator = policy.Allocator(self.nodes, "fgd", workload)
        self.structure_version, self.ledger_version = structure, ledger
        self._ledger_base = ledger

    RETRY_ALL_AT = 64  # changed nodes past which every failed shape is simply tried again

    def _retry_failed_on(self, changed: set[int]) -> None:
        """After the ledger moved: forget the failed shapes that one of the changed nodes now has room for. Every
        other node is as it was when they failed, so the rest still fail. Room is judged without the masks a job
        may add (its excluded nodes, its pools, its model: any model counts), so a doubt means trying again."""
        if len(changed) > self.RETRY_ALL_AT:
            self.failed.clear()
            return
        nodes = [self.nodes[i] for i in changed]
        for shape in [k for k, (_why, one) in self.failed.items() if any(policy.has_room(n, one) for n in nodes)]:
            del self.failed[shape]

    def invalidate(self) -> None:
        """Forget everything: the next `sync` reloads (after a failed write, say)."""
        self.structure_version = self.ledger_version = self._ledger_base = None
        self.allocator = None
        self.failed.clear()

    def wrote(self, before: tuple[int, int], after: tuple[int, int]) -> None:
        """Our own write moved the numbers from `before` to `after`: if nobody else changed the pool in between,
        the pool in memory (which already holds our placements) is current at `after`. `before` is read with the
        ledger's number held (`read_versions(hold_ledger=True)`): a release committed after it would otherwise be
        counted as read, and with the GPUs read by what moved since, its card would look taken until the next
        read of every slice."""
        if before == (self.structure_version, self.ledger_version):
            self.structure_version, self.ledger_version = after
            self._ledger_base = after[1]
        else:
            self.ledger_version = None  # someone else wrote too: read the ledger again next time

    def _load_structure(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, name, backend, emulated, driver_version, rack, labels, state, cpu_milli, memory_mib "
                "FROM cluster_node ORDER BY name"
            )
            node_rows = cursor.fetchall()
            cursor.execute(
                "SELECT id, node_id, uuid, index, model, memory_mib, health = 'healthy' AND NOT quarantined, "
                "mig_profile FROM cluster_gpu ORDER BY node_id, index"
            )
            gpu_rows = cursor.fetchall()
        self.meta, self.by_name, position = [], {}, {}
        for nid, name, backend, emulated, driver, rack, labels, state, cpu, mem in node_rows:
            if isinstance(labels, str):  # Django leaves jsonb undecoded on a raw cursor
                labels = json.loads(labels)
            position[nid] = len(self.meta)
            self.by_name[name] = len(self.meta)
            self.meta.append(
                NodeMeta(
                    id=nid,
                    name=name,
                    backend=backend,
                    emulated=emulated,
                    driver_version=driver,
                    driver=version_tuple(driver) if driver else (),
                    rack=rack,
                    labels=labels or {},
                    ready=state == "ready",
                    cpu_milli=cpu,
                    memory_mib=mem,
                    host_accounted=host_accounted(backend),
                )
            )
        self.gpu_at, self.gpu_by_uuid = {}, {}
        models = set()
        self.mig = {}
        for gid, nid, uuid, index, model, mem, healthy, profile in gpu_rows:
            i = position[nid]
            self.meta[i].cards[index] = Card(gid, uuid, index, model, mem, bool(healthy), profile)
            if profile:
                self.mig.setdefault(profile, []).append((i, index))
            self.gpu_at[gid] = (i, index)
            self.gpu_by_uuid[uuid] = (i, index)
            models.add(model)
        self.models = frozenset(models)
        self.nodes = [self._node(m) for m in self.meta]
        self._too_old = {}
        self._outside = {}
        self._ready = None

    def _changed_gpus(self, ledger: int) -> set[int] | None:
        """The GPUs whose slices changed between the number our use was read at and `ledger`, or None when that is
        not known (never read, a gap in the chain of moves, or every live slice is due to be read again)."""
        base = self._ledger_base
        if base is None or time.monotonic() - self._full_read_at > LEDGER_FULL_READ_S:
            return None
        with connection.cursor() as cursor:
            cursor.execute(LEDGER_CHANGES_SQL, [base, ledger])
            rows = cursor.fetchall()
        gpus: set[int] = set()
        at = base
        for version, previous, ids in rows:
            if previous != at:
                return None  # a move that named no GPUs (an attempt deleted, a TRUNCATE), or one pruned
            gpus.update(ids)
            at = version
        return gpus if at == ledger else None

    def _load_ledger(self, gpus: set[int] | None = None) -> set[int]:
        """Read the live slices, of the GPUs `gpus` only when given; returns the positions of the nodes whose use
        changed."""
        if gpus is not None and not gpus:
            return set()
        fresh: dict[int, Usage] = defaultdict(Usage)
        stale: dict[int, list[int]] = defaultdict(list)
        with connection.cursor() as cursor:
            if gpus is None:
                cursor.execute(SLICES_SQL, [list(FINISHED_ATTEMPT)])
            else:
                cursor.execute(SLICES_SQL + " AND d.gpu_id = ANY(%s)", [list(FINISHED_ATTEMPT), list(gpus)])
            rows = cursor.fetchall()
        for did, gid, milli, mem, cpu, host_mem, is_stale in rows:
            if is_stale:
                stale[gid].append(did)
                continue
            u = fresh[gid]
            u.milli += milli
            u.memory += mem
            u.cpu += cpu
            u.host_memory += host_mem
        for gid, ids in stale.items():
            fresh[gid].stale = tuple(sorted(ids))
        changed = set()
        for gid in (set(fresh) | set(self.usage)) if gpus is None else gpus:
            if self.usage.get(gid) != fresh.get(gid):
                at = self.gpu_at.get(gid)
                if at is not None:
                    changed.add(at[0])
        if gpus is None:
            self.usage = dict(fresh)
            self._full_read_at = time.monotonic()
        else:
            for gid in gpus:
                if gid in fresh:
                    self.usage[gid] = fresh[gid]
                else:
                    self.usage.pop(gid, None)
        return changed

    def _node(self, m: NodeMeta) -> policy.Node:
        cpu_used = mem_used = 0
        gpus = []
        model = ""
        for index in sorted(m.cards):
            card = m.cards[index]
            use = self.usage.get(card.id) or Usage()
            cpu_used += use.cpu
            mem_used += use.host_memory
            model = model or card.model
            gpus.append(
                policy.GPU(
                    index=index,
                    milli_free=max(0, policy.FULL_MILLI - use.milli),
                    memory_free_mib=max(0, card.memory_mib - use.memory),
                    memory_total_mib=card.memory_mib,
                    eligible=card.healthy,
                )
            )
        cpu_total = m.cpu_milli if m.host_accounted else UNTRACKED
        mem_total = m.memory_mib if m.host_accounted else UNTRACKED
        return policy.Node(
            name=m.name,
            cpu_free_milli=max(0, cpu_total - cpu_used),
            gpus=gpus,
            memory_free_mib=max(0, mem_total - mem_used),
            gpu_model=model,
            eligible=m.ready,
            cpu_total_milli=max(cpu_total, 1),
            memory_total_mib=mem_total,
            sharing=NODE_SHARING.get(str(m.labels.get(SHARING_LABEL, "")), policy.ANY_SHARING),
        )

    def _apply(self, i: int) -> None:
        fresh = self._node(self.meta[i])
        node = self.nodes[i]
        node.cpu_free_milli, node.memory_free_mib, node.gpus, node.eligible = (
            fresh.cpu_free_milli,
            fresh.memory_free_mib,
            fresh.gpus,
            fresh.eligible,
        )

    def _rebuild_all(self) -> None:
        for i in range(len(self.nodes)):
            self._apply(i)
        assert self.workload is not None
        self.allocator = policy.Allocator(self.nodes, "fgd", self.workload)

    # -- per-job views ---------------------------------------------------------------------------------

    def resolve_models(self, wanted: Iterable[str]) -> frozenset[str]:
        """The pool's models that the names or families a job asks for cover."""
        wanted = list(wanted)
        return frozenset(m for m in self.models if any(model_matches(w, m) for w in wanted))

    def too_old(self, min_driver: str) -> list[int]:
        """Positions of the nodes whose driver is older than `min_driver` (cached until the structure changes)."""
        hit = self._too_old.get(min_driver)
        if hit is None:
            want = version_tuple(min_driver)
            hit = self._too_old[min_driver] = [i for i, m in enumerate(self.meta) if m.driver < want]
        return hit

    def mig_masked(self, profile: str) -> list[tuple[int, int]]:
        """The cards a job may not take: every MIG instance for a job without a profile; for a job asking for
        one, every card that is not an instance of that profile."""
        if not profile:
            return [at for ats in self.mig.values() for at in ats]
        mine = set(self.mig.get(profile, ()))
        return [(i, index) for i, m in enumerate(self.meta) for index in m.cards if (i, index) not in mine]

    def outside(self, pools: tuple[str, ...], *, borrowing: bool = False, dedicated: tuple[str, ...] = ()) -> list[int]:
        """Positions of the nodes a queue bound to `pools` (every pool when empty) may not use, cached until the
        structure changes: those in none of `pools`, and those of a `dedicated` pool it is not bound to (lent or
        not). `borrowing` (a preemptible job): nodes lent to one of `pools` count as inside (jobs/lending.py)."""
        key = (pools, borrowing, dedicated)
        hit = self._outside.get(key)
        if hit is None:
            hit = self._outside[key] = [
                i
                for i, m in enumerate(self.meta)
                if (node_pool(m.labels) in dedicated and node_pool(m.labels) not in pools)
                or (
                    pools and node_pool(m.labels) not in pools and not (borrowing and m.labels.get(LENT_LABEL) in pools)
                )
            ]
        return hit

    def ready_summary(self) -> tuple[bool, frozenset[int], frozenset[str]]:
        """Whether any healthy card on a ready node exists, the positions of such nodes, and their models
        (cached until the structure changes; probe failures in a pass make it conservative, never wrong)."""
        if self._ready is None:
            nodes, models = set(), set()
            for i, m in enumerate(self.meta):
                if not m.ready:
                    continue
                for c in m.cards.values():
                    if c.healthy:
                        nodes.add(i)
                        models.add(c.model)
            self._ready = (bool(nodes), frozenset(nodes), frozenset(models))
        return self._ready

    @contextlib.contextmanager
    def masked(self, *, nodes: Iterable[int] = (), gpus: Iterable[tuple[int, int]] = ()) -> Iterator[None]:
        """Within the block, the given nodes (positions) and cards ((position, index)) cannot be chosen."""
        assert self.allocator is not None
        saved_nodes = [(i, self.nodes[i].eligible) for i in set(nodes)]
        saved_gpus = []
        for i, index in set(gpus):
            for g in self.nodes[i].gpus:
                if g.index == index:
                    saved_gpus.append((i, g, g.eligible))
                    g.eligible = False
        for i, _ in saved_nodes:
            self.nodes[i].eligible = False
        touched = {i for i, _ in saved_nodes} | {i for i, _, _ in saved_gpus}
        for i in touched:
            self.allocator.refresh(i)
        try:
            yield
        finally:
            for i, eligible in saved_nodes:
                self.nodes[i].eligible = eligible
            for _i, g, eligible in saved_gpus:
                g.eligible = eligible
            for i in touched:
                self.allocator.refresh(i)

    def mark_unusable(self, i: int, index: int) -> None:
        """A card failed its probe: out of placement until the structure is read again."""
        self.meta[i].cards[index].healthy = False
        self._ready = None
        for g in self.nodes[i].gpus:
            if g.index == index:
                g.eligible = False
        assert self.allocator is not None
        self.allocator.refresh(i)

    def take(self, placement: policy.Placement, slices: list) -> None:
        """Record a placement in memory (the policy's node and the ledger's use) before it is written."""
        assert self.allocator is not None
        self.allocator.commit(placement)
        for s in slices:
            u = self.usage.get(s.gpu_id) or Usage()
            self.usage[s.gpu_id] = Usage(
                u.milli + s.compute_milli,
                u.memory + s.memory_mib,
                u.cpu + s.cpu_milli,
                u.host_memory + s.host_memory_mib,
                () if s.reclaim else u.stale,
            )

    def shift(self, slices: list[tuple[int, int, int, int, int]], sign: int) -> None:
        """Add (sign 1) or remove (sign -1) slices given as (GPU id, compute milli, GPU memory, CPU milli, host
        memory) in memory only: what the pool would look like with an attempt gone (preemption's what-if)."""
        assert self.allocator is not None
        touched = set()
        for gpu_id, milli, memory, cpu, host_memory in slices:
            at = self.gpu_at.get(gpu_id)
            if at is None:
                continue
            u = self.usage.get(gpu_id) or Usage()
            self.usage[gpu_id] = Usage(
                u.milli + sign * milli,
                u.memory + sign * memory,
                u.cpu + sign * cpu,
                u.host_memory + sign * host_memory,
                u.stale,
            )
            touched.add(at[0])
        self.failed.clear()
        for i in touched:
            self._apply(i)
            self.allocator.refresh(i)

    def give_back(self, placement: policy.Placement, slices: list) -> None:
        """Undo `take` for a placement that was not written (its job left the queue meanwhile)."""
        assert self.allocator is not None
        self.failed.clear()
        self.allocator.release(placement)
        for s in slices:
            u = self.usage.get(s.gpu_id) or Usage()
            self.usage[s.gpu_id] = Usage(
                u.milli - s.compute_milli,
                u.memory - s.memory_mib,
                u.cpu - s.cpu_milli,
                u.host_memory - s.host_memory_mib,
                u.stale,
            )


# What the live slices on the given nodes add up to, where that is more than the card or the node holds. Live means
# what `Pool._load_ledger` counts: held and belonging to an attempt that has not finished.
OVERBOOKED_SQL = """
WITH live AS (
    SELECT d.gpu_id, g.node_id, d.compute_milli, d.memory_mib, d.exclusive, d.cpu_milli, d.host_memory_mib
    FROM cluster_logicaldevice d
    JOIN jobs_attempt a ON a.id = d.attempt_id
    JOIN cluster_gpu g ON g.id = d.gpu_id
    WHERE d.released_at IS NULL AND NOT (a.state = ANY(%(finished)s)) AND g.node_id = ANY(%(nodes)s)
)
SELECT 'card', g.uuid, sum(l.compute_milli), 1000, sum(l.memory_mib), g.memory_mib, count(*), bool_or(l.exclusive)
FROM live l JOIN cluster_gpu g ON g.id = l.gpu_id
GROUP BY g.id, g.uuid, g.memory_mib
HAVING sum(l.compute_milli) > 1000 OR sum(l.memory_mib) > g.memory_mib OR (bool_or(l.exclusive) AND count(*) > 1)
UNION ALL
SELECT 'node', n.name, sum(l.cpu_milli), n.cpu_milli, sum(l.host_memory_mib), n.memory_mib, count(*), false
FROM live l JOIN cluster_node n ON n.id = l.node_id
WHERE n.id = ANY(%(host_nodes)s)
GROUP BY n.id, n.name, n.cpu_milli, n.memory_mib
HAVING sum(l.cpu_milli) > n.cpu_milli OR sum(l.host_memory_mib) > n.memory_mib
"""


def overbooked(*, node_ids: Iterable[int], host_node_ids: Iterable[int]) -> list[str]:
    """The cards (and, for `host_node_ids`, the nodes' host CPU and memory) on `node_ids` that the committed
    ledger, read in the caller's transaction, books past what they hold; one sentence each, none when all fit.
    The dispatcher runs it after writing a pass's slices and before committing, so a pass decided on a stale
    view of the pool is refused by the database instead of booking a card twice."""
    nodes = sorted(set(node_ids))
    if not nodes:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            OVERBOOKED_SQL,
            {"finished": list(FINISHED_ATTEMPT), "nodes": nodes, "host_nodes": sorted(set(host_node_ids))},
        )
        rows = cursor.fetchall()
    out = []
    for kind, name, used, total, mem_used, mem_total, count, exclusive in rows:
        if kind == "card":
            shared = " (held exclusively and shared)" if exclusive and count > 1 else ""
            out.append(f"card {name}: {used}/{total} milli, {mem_used}/{mem_total} MiB in {count} slices{shared}")
        else:
            out.append(f"node {name}: {used}/{total} CPU milli, {mem_used}/{mem_total} MiB host memory")
    return out


_pool: Pool | None = None


def current() -> Pool:
    """This process's pool (one per process; `sync` keeps it current)."""
    global _pool
    if _pool is None:
        _pool = Pool()
    return _pool
