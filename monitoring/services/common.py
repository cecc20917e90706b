"""Shared pieces: part of `monitoring.services` (see its package docstring)."""

from __future__ import annotations

from datetime import datetime

import structlog
from django.db import connection
from django.utils import timezone

from cluster.models import GPU
from monitoring.models import (
    Fault,
    GpuHealthEvent,
)

log = structlog.get_logger(__name__)

ALERTS_LOCK_KEY = 0x6D6F_6E69  # advisory lock id for "opening and resolving alerts"

FAULT_SEVERITY = {Fault.GPU_LOST: 4, Fault.DRIVER_RESET: 3, Fault.XID: 2, Fault.PROBE_FAILED: 1, Fault.UNHEALTHY: 0}

WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)


def alerts_lock() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ALERTS_LOCK_KEY])


def at_or_now(now: datetime | None) -> datetime:
    return now or timezone.now()


def health_event(gpu: GPU, *, previous: str, fault: str, reason: str, actor: str, now: datetime) -> None:
    GpuHealthEvent.objects.create(
        gpu=gpu,
        at=now,
        from_health=previous,
        to_health=gpu.health,
        quarantined=gpu.quarantined,
        fault=fault,
        reason=reason[:300],
        actor=actor[:150],
    )
