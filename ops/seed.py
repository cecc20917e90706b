"""Seed data for a new platform: specs, the three queues, a demo team and users, base images, registries.

Idempotent: rows that exist are left as an admin may have edited them; only missing ones are created.
"""

import secrets
from dataclasses import dataclass, field

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from images.models import BaseImage, Registry
from quotas.models import Membership, Queue, ResourceSpec, Team

GIB = 1024

SPECS = [
    dict(
        name="guaranteed",
        tier="guaranteed",
        gpu_count=1,
        gpu_milli=1000,
        gpu_memory_eighths=8,
        cpu_milli_per_gpu=8000,
        memory_mib_per_gpu=64 * GIB,
        default_timeout_s=24 * 3600,
        description="Whole GPUs, exclusive: no other job shares the card.",
        expected_slowdown="none",
    ),
    dict(
        name="performance",
        tier="performance",
        gpu_count=1,
        gpu_milli=750,
        gpu_memory_eighths=6,
        cpu_milli_per_gpu=6000,
        memory_mib_per_gpu=48 * GIB,
        default_timeout_s=12 * 3600,
        description="3/4 of one card's compute and 6/8 of its memory.",
        expected_slowdown="about 1.3x vs a whole card",
    ),
    dict(
        name="shared",
        tier="shared",
        gpu_count=1,
        gpu_milli=250,
        gpu_memory_eighths=2,
        cpu_milli_per_gpu=2000,
        memory_mib_per_gpu=16 * GIB,
        default_timeout_s=2 * 3600,
        description="1/4 of one card's compute and 2/8 of its memory, for debugging and small models.",
        expected_slowdown="about 4x vs a whole card; neighbours may add jitter",
    ),
]

QUEUES = [
    dict(
        name="debug",
        description="Quick interactive runs on a quarter card.",
        priority=20,
        ordering="backfill",
        max_timeout_s=4 * 3600,
        default_timeout_s=3600,
        gang=False,
        specs=["shared"],
        gpu_milli=2000,
        gpu_memory_mib=48 * GIB,
        cpu_milli=32000,
        memory_mib=128 * GIB,
    ),
    dict(
        name="train",
        description="Single-node training on any tier.",
        priority=10,
        ordering="fifo",
        max_timeout_s=7 * 24 * 3600,
        default_timeout_s=24 * 3600,
        gang=False,
        specs=["guaranteed", "performance", "shared"],
        gpu_milli=4000,
        gpu_memory_mib=96 * GIB,
        cpu_milli=64000,
        memory_mib=256 * GIB,
    ),
    dict(
        name="distributed",
        description="Multi-replica jobs on whole cards, gang-scheduled.",
        priority=5,
        ordering="fifo",
        max_timeout_s=7 * 24 * 3600,
        default_timeout_s=48 * 3600,
        gang=True,
        specs=["guaranteed"],
        gpu_milli=4000,
        gpu_memory_mib=96 * GIB,
        cpu_milli=64000,
        memory_mib=256 * GIB,
    ),
]

# External bases: references only. Their digest is resolved from the registry when a job on Kubernetes names them
# (the local backend runs commands on the host and pulls nothing, so it records them as unresolved); nothing was
# scanned, so nothing says it passed.
BASE_IMAGES = [
    dict(
        name="pytorch-2.5-cuda12.4",
        reference="nvcr.io/nvidia/pytorch:24.10-py3",
        cuda_version="12.4",
        framework="pytorch",
        framework_version="2.5",
        min_driver_version="550.54",
        maintainer="platform-team",
    ),
    dict(
        name="pytorch-2.1-cuda11.8",
        reference="docker.io/pytorch/pytorch:2.1.0-cuda11.8-cudnn8-runtime",
        cuda_version="11.8",
        framework="pytorch",
        framework_version="2.1",
        min_driver_version="520.61",
        maintainer="platform-team",
    ),
    dict(
        name="tensorflow-2.16-cuda12.3",
        reference="nvcr.io/nvidia/tensorflow:24.03-tf2-py3",
        cuda_version="12.3",
        framework="tensorflow",
        framework_version="2.16",
        min_driver_version="545.23",
        maintainer="platform-team",
    ),
    dict(
        name="python-3.11",
        reference="docker.io/library/python:3.11-slim",
        cuda_version="",
        framework="none",
        framework_version="",
        min_driver_version="",
        maintainer="platform-team",
    ),
]

REGISTRIES = ["docker.io", "nvcr.io", "ghcr.io", "registry.local"]


@dataclass
class SeedReport:
    created: list[str] = field(default_factory=list)
    passwords: dict[str, str] = field(default_factory=dict)
    inventory: str = ""


def _user(username: str, *, staff: bool, password: str | None, report: SeedReport):
    User = get_user_model()
    user = User.objects.filter(username=username).first()
    if user is None:
        chosen = password or secrets.token_urlsafe(12)
        user = User.objects.create_user(username=username, password=chosen, is_staff=staff, is_superuser=staff)
        report.created.append(f"user {username}")
        if not password:
            report.passwords[username] = chosen
    elif password and not user.check_password(password):
        user.set_password(password)
        user.save(update_fields=["password"])
    return user


def _sized_to(info, data: dict, *, share: float = 1.0, specs: list[dict] = SPECS) -> dict:
    """A queue's or team's first capability: the defaults, or the largest node's cards where they hold more (an
    8-GPU or an H200 node would otherwise start with queues too small for one whole card), and never less than
    one whole card of the largest kind, whatever the share. Host CPU and memory follow the GPU capability: enough
    for jobs of the most demanding of `specs` filling it (a 256 GiB default refused a two-replica gang of four
    guaranteed cards, 64 GiB each, on an 8-card node)."""
    if info is None or not info.gpus:
        return data
    cards = len(info.gpus)
    largest = max(g.memory_mib for g in info.gpus)
    gpu_milli = max(data["gpu_milli"], int(1000 * cards * share), 1000)
    cpu_per_milli = max(s["cpu_milli_per_gpu"] / s["gpu_milli"] for s in specs)
    memory_per_milli = max(s["memory_mib_per_gpu"] / s["gpu_milli"] for s in specs)
    return {
        **data,
        "gpu_milli": gpu_milli,
        "gpu_memory_mib": max(data["gpu_memory_mib"], int(sum(g.memory_mib for g in info.gpus) * share), largest),
        "cpu_milli": max(data["cpu_milli"], int(gpu_milli * cpu_per_milli)),
        "memory_mib": max(data["memory_mib"], int(gpu_milli * memory_per_milli)),
    }


def _largest_node(report: SeedReport):
    """The node quotas are first sized to: this machine's (local backend), or the cluster's node with the most GPU
    memory (Volcano backend, read through the backend; the defaults when the cluster cannot be read now)."""
    if settings.TRAINYARD_BACKEND == "local":
        from cluster.inventory import local_inventory

        return local_inventory()
    try:
        from jobs.backends import get_backend

        nodes = [n for n in get_backend().inventory() if n.gpus]
    except Exception as exc:  # noqa: BLE001 - seeding must not need the cluster; the defaults then stand
        report.inventory = f"quotas left at their defaults: the cluster's inventory could not be read ({exc})"
        return None
    node = max(nodes, key=lambda n: sum(g.memory_mib for g in n.gpus), default=None)
    if node is not None:
        report.inventory = f"quotas sized to the cluster's largest node {node.name}: {len(node.gpus)} GPU(s)"
    return node


def seed(
    *, admin_password: str | None = None, demo_password: str | None = None, demo_team_share: float = 1.0
) -> SeedReport:
    """`demo_team_share`: the demo team's GPU quota as a share of the train queue's. `manage.py seed` (what
    `make run`, docker-compose and k8s run) gives it half, so a new user sees a wait on the team's quota while
    the queue still has room; the test suite's worlds keep the team as large as the queue."""
    report = SeedReport()
    info = _largest_node(report)
    with transaction.atomic():
        specs = {}
        for data in SPECS:
            spec, created = ResourceSpec.objects.get_or_create(name=data["name"], defaults=data)
            specs[spec.name] = spec
            if created:
                report.created.append(f"spec {spec.name}")
        team, created = Team.objects.get_or_create(
            slug="demo",
            defaults=_sized_to(
                info,
                dict(
                    name="Demo team",
                    namespace="trainyard-demo",
                    gpu_milli=int(4000 * demo_team_share),
                    gpu_memory_mib=int(96 * GIB * demo_team_share),
                    cpu_milli=64000,
                    memory_mib=256 * GIB,
                    max_running_jobs=20,
                    max_jobs_per_user=10,
                ),
                share=demo_team_share,
            ),
        )
        if created:
            report.created.append("team demo")
        for data in QUEUES:
            data = dict(data)
            spec_names = data.pop("specs")
            data = _sized_to(
                info,
                data,
                share=0.5 if data["name"] == "debug" else 1.0,
                specs=[s for s in SPECS if s["name"] in spec_names],
            )
            queue, created = Queue.objects.get_or_create(name=data["name"], defaults=data)
            if created:
                queue.specs.set([specs[n] for n in spec_names])
                queue.teams.add(team)
                report.created.append(f"queue {queue.name}")
        for host in REGISTRIES:
            Registry.objects.get_or_create(host=host)
        for data in BASE_IMAGES:
            _, created = BaseImage.objects.get_or_create(name=data["name"], defaults=data)
            if created:
                report.created.append(f"image {data['name']}")
        _user("admin", staff=True, password=admin_password, report=report)
        demo = _user("demo", staff=False, password=demo_password, report=report)
        Membership.objects.get_or_create(team=team, user=demo, defaults={"role": Membership.Role.MAINTAINER})
        from jobs.classifier import seed_default_rules

        seed_default_rules()
    if info is not None and settings.TRAINYARD_BACKEND == "local":
        from cluster.services import inventory_sync

        node = inventory_sync(info=info)
        kind = "emulated" if node.emulated else "NVML"
        report.inventory = f"inventory {node.name}: {node.gpus.count()} GPU(s) ({kind})"
    return report
