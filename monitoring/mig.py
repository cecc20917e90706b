"""MIG rebalancing proposals (docs/pools.md): the platform never changes a card's MIG layout; this rule says when an
admin should.

When jobs asking for a MIG profile wait for capacity while a card in MIG mode, in a pool their queue may use, sits
wholly idle and offers only other profiles, the rule opens one alert per such card (`mig-rebalance`, level
warning): the card, its current layout, the proposed one (as many instances of the wanted profile as the card
holds) and why. Admins see it in the admin console (Alerts), on the portal's GPU page and as a notification; an
admin applies the change by hand (`nvidia-smi mig ...`) and the inventory reads the new instances. When no job
waits for that profile any more, or the card is busy, the proposal is resolved.

Level-triggered (beat, with the lending rule): each run reads the waiting jobs and the cards afresh.
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import datetime

import structlog
from django.db import transaction
from django.utils import timezone

from cluster.inventory import mig_profile, node_pool
from cluster.models import GPU, LogicalDevice, Node
from jobs.models import Job
from jobs.states import JobState
from kernel.sentences import stored
from monitoring.models import Alert, AlertRule
from monitoring.services import alert_close, alerts_lock, notification_send

log = structlog.get_logger(__name__)
RULE = "mig-rebalance"
CARD_GB = re.compile(r"(\d+)\s*GB", re.IGNORECASE)


def _layout(profiles: list[str]) -> str:
    return "+".join(sorted(profiles, key=lambda p: (-mig_profile(p)[0], p)))


def _card_mib(model: str, instances: list[str]) -> int:
    """The card's memory: from its model name (A100-SXM4-80GB), else what its instances hold."""
    m = CARD_GB.search(model.split(" MIG ")[0])
    return int(m[1]) * 1024 if m else sum(mig_profile(p)[1] for p in instances)


def _split(profile: str, card_mib: int) -> list[str]:
    slices, mib = mig_profile(profile)
    return [profile] * min(7 // slices, card_mib // mib)


def mig_proposals(*, now: datetime | None = None) -> dict[str, int]:
    """One run of the rule: opens the proposals that hold now and resolves those that no longer do."""
    now = now or timezone.now()
    waiting: dict[str, list[Job]] = defaultdict(list)
    for job in (
        Job.objects.filter(state=JobState.PENDING, reason="no_capacity")
        .exclude(mig_profile="")
        .select_related("queue")
        .order_by("submitted_at")
    ):
        waiting[job.mig_profile].append(job)
    ready = {n["id"]: n for n in Node.objects.filter(state=Node.State.READY).values("id", "name", "labels")}
    cards: dict[str, list[GPU]] = defaultdict(list)
    for gpu in GPU.objects.filter(node_id__in=ready).exclude(mig_parent="").order_by("node_id", "index"):
        cards[gpu.mig_parent].append(gpu)
    busy = set(
        LogicalDevice.objects.filter(released_at__isnull=True, gpu__mig_parent__in=list(cards)).values_list(
            "gpu__mig_parent", flat=True
        )
    )
    wanted: dict[str, dict] = {}  # card -> the proposal
    for profile, jobs in waiting.items():
        need = sum(max(1, j.gpu_count) * max(1, j.replicas) for j in jobs)
        for parent, instances in cards.items():
            if need <= 0:
                break
            have = [g.mig_profile for g in instances]
            node = ready[instances[0].node_id]
            pool = node_pool(node["labels"])
            mine = [j for j in jobs if not j.queue.pools or pool in j.queue.pools]
            if parent in wanted or parent in busy or profile in have or not mine:
                continue
            proposed = _split(profile, _card_mib(instances[0].model, have))
            if not proposed:
                continue
            need -= len(proposed)
            wanted[parent] = {
                "gpu": instances[0],
                "node": node["name"],
                "pool": pool,
                "current": _layout(have),
                "proposed": _layout(proposed),
                "profile": profile,
                "jobs": mine,
            }
    report = {"opened": 0, "resolved": 0}
    with transaction.atomic():
        alerts_lock()
        open_alerts = {a.fingerprint: a for a in Alert.objects.filter(rule_name=RULE).exclude(state="resolved")}
        for parent, p in wanted.items():
            fingerprint = f"{RULE}:{parent}"
            summary = stored(
                "card %(card)s on %(node)s (pool %(pool)s): MIG layout %(current)s → proposed %(proposed)s; "
                "%(n)s job(s) wait for %(profile)s while this card's instances sit idle. An admin applies it on "
                "the node (nvidia-smi mig); Trainyard never changes MIG layouts.",
                card=parent, node=p["node"], pool=p["pool"], current=p["current"], proposed=p["proposed"],
                n=len(p["jobs"]), profile=p["profile"],
            )[:500]  # fmt: skip
            alert = open_alerts.pop(fingerprint, None)
            if alert is not None and alert.summary == summary:
                Alert.objects.filter(pk=alert.pk).update(last_seen_at=now, job_ids=[str(j.id) for j in p["jobs"]])
                continue
            if alert is not None:  # the proposal changed: the old one no longer holds
                alert_close(alert, by="auto", note="a different layout is proposed now", now=now)
                report["resolved"] += 1
            alert = Alert.objects.create(
                rule_name=RULE,
                level=AlertRule.Level.WARNING,
                fingerprint=fingerprint,
                subject=f"MIG card {parent} ({p['node']})",
                gpu=p["gpu"],
                queue_id=p["jobs"][0].queue_id,
                job_ids=[str(j.id) for j in p["jobs"]],
                summary=summary,
                started_at=now,
                last_seen_at=now,
            )
            Alert.objects.filter(pk=alert.pk).update(actions_taken=[notification_send(alert, owners=[])])
            report["opened"] += 1
            log.warning("mig_rebalance_proposed", card=parent, current=p["current"], proposed=p["proposed"])
        for alert in open_alerts.values():
            alert_close(alert, by="auto", note="no job waits for it any more, or the card is busy", now=now)
            report["resolved"] += 1
    return report
