"""The reference rows submission validation reads, kept in memory per process.

Validating one submission used to read about ten rows (team, membership, queue and its teams and specs, spec,
image, registry allow-list) with one query each; they change only when an admin or a maintainer edits them.
`current()` returns an immutable snapshot of all of them and checks it with one small query: the version number
that a trigger on those tables moves on every write (migration jobs/0005). A snapshot is only reused while the
number it was loaded under is still the committed one, so a change is seen by the very next request, in every
process, and never depends on signals (queryset `.update()` and raw SQL move the number too).

GPU health and node drivers are not part of it: they change while jobs run. `cluster_facts()` keeps what
validation needs of them the same way, under the pool's structure number (migration cluster/0004: it moves when
a node or a card appears, goes, or changes health, model, memory, driver or state): three aggregates over every
card and node cost a submission milliseconds on a cluster of thousands of cards.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from cluster.models import GPU, Node
from images.models import BaseImage, ProjectImage, Registry, ScanPolicy
from kernel.prepared import prepared_cursor
from quotas.models import Membership, Queue, ResourceSpec, Team


@dataclass(frozen=True)
class Snapshot:
    version: int | None
    teams: dict[str, Team]  # by slug
    members: frozenset[tuple[int, int]]  # (user id, team id)
    queues: dict[str, Queue]  # by name
    queue_teams: dict[int, frozenset[int]]
    queue_specs: dict[int, tuple[ResourceSpec, ...]]  # every spec the queue lists, enabled or not
    specs: dict[str, ResourceSpec]  # enabled specs, by name
    base_images: dict[str, BaseImage]
    project_images: dict[tuple[int, str], ProjectImage]  # (team id, name), with .base loaded
    allowed_registries: frozenset[str]
    scan_policies: dict[int, ScanPolicy]  # by queue id
    registry_endpoints: dict[str, str]  # host -> where its tags are resolved (a mirror), where one is set

    def is_member(self, user, team: Team) -> bool:
        return user.is_staff or (user.pk, team.pk) in self.members

    def queue_allows_team(self, queue: Queue, team: Team) -> bool:
        return team.pk in self.queue_teams.get(queue.pk, ())

    def queue_allows_spec(self, queue: Queue, spec: ResourceSpec) -> bool:
        return any(s.pk == spec.pk for s in self.queue_specs.get(queue.pk, ()))

    def queue_spec_names(self, queue: Queue) -> list[str]:
        return [s.name for s in self.queue_specs.get(queue.pk, ())]


_cached: Snapshot | None = None


def _version() -> int | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT n FROM trainyard_reference_version WHERE id = 1")
        row = cursor.fetchone()
    return row[0] if row else None


def _load(version: int | None) -> Snapshot:
    queue_teams: dict[int, set[int]] = {}
    for queue_id, team_id in Queue.teams.through.objects.values_list("queue_id", "team_id"):
        queue_teams.setdefault(queue_id, set()).add(team_id)
    all_specs = {s.pk: s for s in ResourceSpec.objects.all()}
    queue_specs: dict[int, list[ResourceSpec]] = {}
    for queue_id, spec_id in Queue.specs.through.objects.values_list("queue_id", "resourcespec_id"):
        queue_specs.setdefault(queue_id, []).append(all_specs[spec_id])
    return Snapshot(
        version=version,
        teams={t.slug: t for t in Team.objects.all()},
        members=frozenset(Membership.objects.values_list("user_id", "team_id")),
        queues={q.name: q for q in Queue.objects.all()},
        queue_teams={k: frozenset(v) for k, v in queue_teams.items()},
        # In ResourceSpec's own order (largest share first), as error messages list them.
        queue_specs={k: tuple(sorted(v, key=lambda s: (-s.gpu_milli, s.name))) for k, v in queue_specs.items()},
        specs={s.name: s for s in all_specs.values() if s.enabled},
        base_images={b.name: b for b in BaseImage.objects.all()},
        project_images={(p.team_id, p.name): p for p in ProjectImage.objects.select_related("base")},
        allowed_registries=frozenset(Registry.objects.filter(allowed=True).values_list("host", flat=True)),
        scan_policies={p.queue_id: p for p in ScanPolicy.objects.all()},
        registry_endpoints=dict(Registry.objects.exclude(endpoint="").values_list("host", "endpoint")),
    )


def current() -> Snapshot:
    """The reference rows as committed now (or as this transaction sees them)."""
    return _snapshot_at(_version())


def current_and_facts(default_card_mib: int) -> tuple[Snapshot, ClusterFacts]:
    """`current()` and `cluster_facts()` with both numbers read in one statement (a submission needs both)."""
    with prepared_cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT n FROM trainyard_reference_version WHERE id = 1),"
            " (SELECT n FROM trainyard_pool_version WHERE id = 1)"
        )
        reference_version, pool_version = cursor.fetchone()
    return _snapshot_at(reference_version), _facts_at(pool_version, default_card_mib)


def _snapshot_at(version: int | None) -> Snapshot:
    global _cached
    snapshot = _cached
    if snapshot is not None and version is not None and snapshot.version == version:
        return snapshot
    snapshot = _load(version)
    if version is not None:  # no version row (a flushed test database): never reuse what was read
        _cached = snapshot  # one assignment publishes the whole immutable snapshot to every thread
    return snapshot


@dataclass(frozen=True)
class ClusterFacts:
    card_mib: int  # memory of the largest healthy card, or the default when none
    drivers: list[str]  # the distinct driver versions of the usable nodes
    models: list[str]  # the distinct GPU models the pool has (or had), sorted


_facts: tuple[int, int, ClusterFacts] | None = None  # (pool structure number, default card size, facts)


def cluster_facts(default_card_mib: int) -> ClusterFacts:
    """What validation needs of the live pool: read again (one query of three aggregates of distinct values) only
    when the pool's structure number moved since the last read. The number is read first, so facts newer than
    their number are only read once more, never kept past a change."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT n FROM trainyard_pool_version WHERE id = 1")
        row = cursor.fetchone()
    return _facts_at(row[0] if row else None, default_card_mib)


def _facts_at(version: int | None, default_card_mib: int) -> ClusterFacts:
    global _facts
    kept = _facts
    if kept is not None and version is not None and kept[:2] == (version, default_card_mib):
        return kept[2]
    facts = _read_cluster_facts(default_card_mib)
    if version is not None:
        _facts = (version, default_card_mib, facts)
    return facts


def _read_cluster_facts(default_card_mib: int) -> ClusterFacts:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT max(memory_mib) FROM cluster_gpu WHERE health = %s),"
            " (SELECT array_agg(DISTINCT driver_version) FROM cluster_node WHERE state <> %s),"
            " (SELECT array_agg(DISTINCT model) FROM cluster_gpu)",
            [GPU.Health.HEALTHY.value, Node.State.UNHEALTHY.value],
        )
        card_mib, drivers, models = cursor.fetchone()
    return ClusterFacts(int(card_mib or default_card_mib), list(drivers or []), sorted(models or []))
