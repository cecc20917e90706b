"""Reads of the cluster: driver versions compared as versions, the cards placement may use, which slices are
live. Writes are `cluster.services`."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Q

from cluster.models import GPU, LogicalDevice, Node


def version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.replace("-", ".").split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def driver_satisfies(node_driver: str, minimum: str) -> bool:
    if not minimum:
        return True
    if not node_driver:
        return False
    return version_tuple(node_driver) >= version_tuple(minimum)


@dataclass
class CardState:
    gpu: GPU
    free_milli: int
    free_memory: int
    live: list[LogicalDevice]
    stale: list[LogicalDevice]

    @property
    def exclusive_held(self) -> bool:
        return any(s.exclusive for s in self.live)

    @property
    def whole_free(self) -> bool:
        return not self.live


def live_attempt(device: LogicalDevice) -> bool:
    return device.attempt_id is not None and not device.attempt.is_finished


def pool_cards(*, min_driver: str = "", exclude_gpus=(), exclude_nodes=()) -> tuple[list[CardState], int]:
    """Eligible cards with what is free on each; also how many healthy cards the driver check removed."""
    gpus = list(
        GPU.objects.select_related("node")
        .filter(health=GPU.Health.HEALTHY, quarantined=False, node__state=Node.State.READY)
        .exclude(uuid__in=list(exclude_gpus))
        .exclude(node__name__in=list(exclude_nodes))
        .order_by("node__name", "index")
    )
    too_old = 0
    eligible = []
    for gpu in gpus:
        if driver_satisfies(gpu.node.driver_version, min_driver):
            eligible.append(gpu)
        else:
            too_old += 1
    by_gpu: dict[int, list[LogicalDevice]] = defaultdict(list)
    for device in LogicalDevice.objects.select_related("attempt").filter(released_at__isnull=True, gpu__in=eligible):
        by_gpu[device.gpu_id].append(device)
    cards = []
    for gpu in eligible:
        live = [d for d in by_gpu[gpu.id] if live_attempt(d)]
        stale = [d for d in by_gpu[gpu.id] if not live_attempt(d)]
        used_milli = sum(d.compute_milli for d in live)
        used_mem = sum(d.memory_mib for d in live)
        cards.append(CardState(gpu, 1000 - used_milli, gpu.memory_mib - used_mem, live, stale))
    return cards, too_old


def slice_filter_live() -> Q:
    return Q(released_at__isnull=True)
