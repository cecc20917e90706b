"""Catalog: part of `frontend.views` (see its package docstring)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Prefetch
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from cluster.inventory import node_pool
from cluster.models import GPU, LogicalDevice, Node
from cluster.selectors import driver_satisfies
from images import selectors as image_selectors
from images import services as image_services
from images.models import BaseImage, ProjectImage
from kernel.errors import DomainError
from monitoring.models import Alert
from quotas import selectors as quota
from quotas.models import Queue


@login_required
def image_list(request: HttpRequest) -> HttpResponse:
    nodes = list(Node.objects.order_by("name"))
    team_ids = list(quota.visible_teams(request.user).values_list("id", flat=True))
    from images.services import feed_state, scan_status_now

    catalog: list[BaseImage | ProjectImage] = [
        *BaseImage.objects.prefetch_related(image_selectors.RECENT_BUILDS),
        *ProjectImage.objects.filter(team_id__in=team_ids)
        .select_related("base", "team")
        .prefetch_related(image_selectors.RECENT_BUILDS),
    ]
    builds = [b for image in catalog if (b := image_selectors.last_build(image)) is not None]
    image_selectors.load_severity_counts(builds)
    now = timezone.now()
    rows = []
    for image in catalog:
        project = isinstance(image, ProjectImage)
        minimum = image.min_driver_version or (image.base.min_driver_version if project else "")
        cells = [
            {
                "node": node,
                "runs": node.state != Node.State.UNHEALTHY and driver_satisfies(node.driver_version, minimum),
            }
            for node in nodes
        ]
        build = image_selectors.last_build(image)
        rows.append(
            {
                "image": image,
                "project": project,
                "min_driver": minimum,
                "cells": cells,
                "usable": any(c["runs"] for c in cells) or not nodes,
                "build": build,
                "scan_status": scan_status_now(image, build),
                "findings": [(s, n) for s, n in image_selectors.severity_counts(build).items() if n] if build else [],
                "age_days": (now - image.last_rebuilt).days if image.last_rebuilt else None,
                "can_build": project or (request.user.is_staff and bool(image.containerfile)),
            }
        )
    feed = feed_state()
    return render(request, "frontend/image_list.html", {"nav": "images", "rows": rows, "nodes": nodes, "feed": feed})


@login_required
@require_POST
def image_build(request: HttpRequest, kind: str, pk: int) -> HttpResponse:
    """Rebuild a project image (a member of its team) or a platform base (staff)."""
    if kind not in ("base", "project"):
        raise Http404
    if kind == "project":
        image = get_object_or_404(ProjectImage.objects.select_related("team"), pk=pk)
        allowed = quota.is_member(request.user, image.team)
    else:
        image = get_object_or_404(BaseImage, pk=pk)
        allowed = request.user.is_staff
    if not allowed:
        raise Http404
    try:
        build = image_services.build_request(image=image, user=request.user)
    except DomainError as exc:
        messages.error(request, exc.detail)
        return redirect("frontend:image-list")
    messages.success(request, _("Build %(id)s of %(image)s is queued.") % {"id": build.pk, "image": image})
    return redirect("frontend:image-build-detail", pk=build.pk)


@login_required
def image_build_detail(request: HttpRequest, pk: int) -> HttpResponse:
    from images.services import scan_feed_reading

    build = get_object_or_404(image_selectors.builds_visible_to(request.user).prefetch_related("findings"), pk=pk)
    return render(
        request,
        "frontend/image_build.html",
        {
            "nav": "images",
            "build": build,
            "findings": list(build.findings.all()),
            "scan_feed": scan_feed_reading(build),
        },
    )


@login_required
def dataset_list(request: HttpRequest) -> HttpResponse:
    """The registered datasets the user's teams may read, with their size and file count."""
    from jobs.datasets import visible_to

    datasets = list(visible_to(request.user).order_by("team__slug", "name", "-version"))
    return render(request, "frontend/dataset_list.html", {"nav": "datasets", "datasets": datasets})


@login_required
def gpu_list(request: HttpRequest) -> HttpResponse:
    visible = set(quota.visible_teams(request.user).values_list("id", flat=True))
    live = (
        LogicalDevice.objects.filter(released_at__isnull=True)
        .select_related("attempt__job__team", "attempt__job__owner")
        .order_by("created_at")
    )
    nodes = list(
        Node.objects.prefetch_related(
            Prefetch(
                "gpus",
                queryset=GPU.objects.order_by("index").prefetch_related(
                    Prefetch("slices", queryset=live, to_attr="live_slices")
                ),
            )
        ).order_by("name")
    )
    pools: dict[str, dict] = {}
    for node in nodes:
        node.pool = node_pool(node.labels)
        row = pools.setdefault(node.pool, {"name": node.pool, "nodes": 0, "gpus": 0, "used_milli": 0, "queues": []})
        row["nodes"] += 1
        for gpu in node.gpus.all():
            gpu.free_milli = 1000 - sum(s.compute_milli for s in gpu.live_slices)
            gpu.used_milli = 1000 - gpu.free_milli
            row["gpus"] += 1
            row["used_milli"] += gpu.used_milli
    for name, bound in Queue.objects.order_by("name").values_list("name", "pools"):
        for row in pools.values():
            if not bound or row["name"] in bound:
                row["queues"].append(name)
    for row in pools.values():
        row["use_percent"] = round(100 * row["used_milli"] / (1000 * row["gpus"])) if row["gpus"] else 0
    return render(
        request,
        "frontend/gpu_list.html",
        {
            "nav": "gpus",
            "nodes": nodes,
            "pools": sorted(pools.values(), key=lambda r: r["name"]),
            "visible": visible,
            "any_emulated": any(n.emulated for n in nodes),
            "mig_proposals": list(Alert.objects.filter(rule_name="mig-rebalance").exclude(state=Alert.State.RESOLVED))
            if request.user.is_staff
            else [],
        },
    )
