"""Admin console for the GPU pool: nodes (cordon/uncordon), GPUs (quarantine/return), slices and repairs.

Inventory facts (driver, CUDA, GPUs, memory) come from the inventory sync and are read-only here; what an
admin decides is a node's schedulability and a GPU's quarantine. Slices and repairs are the pool's ledger
and are never edited by hand.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Count, Prefetch, Q, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html_join
from django.utils.safestring import SafeString

from cluster.models import GPU, LogicalDevice, Node, PoolRepair
from cluster.selectors import slice_filter_live
from cluster.services import (
    gpu_mark_unhealthy,
    gpu_return_to_service,
    node_cordon,
    node_uncordon,
)
from kernel.errors import DomainError

NODE_INVENTORY_FIELDS = (
    "name",
    "backend",
    "emulated",
    "driver_version",
    "cuda_version",
    "rack",
    "nvlink_domain",
    "labels",
    "cpu_milli",
    "memory_mib",
    "last_seen",
)
GPU_FIELDS = (
    "node",
    "index",
    "uuid",
    "model",
    "memory_mib",
    "health",
    "quarantined",
    "quarantine_reason",
    "health_changed_at",
)


def _redispatch_on_commit() -> None:
    """Capacity came back: let waiting jobs in now rather than at the next dispatch beat."""

    def send() -> None:
        from kernel.wake import dispatch_soon

        dispatch_soon()

    transaction.on_commit(send)


def _holder(device: LogicalDevice) -> str:
    share = f"{device.compute_milli}m / {device.memory_mib} MiB{' exclusive' if device.exclusive else ''}"
    attempt = device.attempt
    if attempt is None:
        return f"{share}: no attempt (leaked; the reconcile pass frees it)"
    job = attempt.job
    return f"{share}: {job.name} ({job.id}) attempt #{attempt.number}, team {job.team.slug}, {job.owner.username}"


def _live_slices_prefetch() -> Prefetch:
    return Prefetch(
        "slices",
        queryset=LogicalDevice.objects.filter(slice_filter_live())
        .select_related("attempt__job__team", "attempt__job__owner")
        .order_by("created_at"),
        to_attr="live_slices",
    )


class ReadOnlyMixin:
    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


# ---------------------------------------------------------------------------------------------- nodes


class GPUInline(ReadOnlyMixin, admin.TabularInline):
    model = GPU
    fields = ("index", "uuid", "model", "memory_mib", "health", "quarantined", "quarantine_reason")
    readonly_fields = fields
    show_change_link = True
    extra = 0


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "state",
        "backend",
        "emulated",
        "driver_version",
        "cuda_version",
        "rack",
        "nvlink_domain",
        "gpu_total",
        "gpus_in_service",
        "last_seen",
    )
    list_filter = ("state", "backend", "emulated", "rack")
    search_fields = ("name", "rack", "nvlink_domain", "driver_version")
    fields = ("state", *NODE_INVENTORY_FIELDS)
    readonly_fields = ("state", *NODE_INVENTORY_FIELDS)
    inlines = (GPUInline,)
    actions = ("cordon_nodes", "uncordon_nodes")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Node]:
        in_service = Q(gpus__health=GPU.Health.HEALTHY, gpus__quarantined=False)
        return (
            super()
            .get_queryset(request)
            .annotate(
                gpu_count=Count("gpus", distinct=True), in_service_count=Count("gpus", filter=in_service, distinct=True)
            )
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # nodes come from the inventory sync

    def has_delete_permission(self, request: HttpRequest, obj: Node | None = None) -> bool:
        return False  # deleting would drop the slice ledger of jobs running there; cordon instead

    @admin.display(description="GPUs", ordering="gpu_count")
    def gpu_total(self, obj: Node) -> int:
        return obj.gpu_count

    @admin.display(description="GPUs in service", ordering="in_service_count")
    def gpus_in_service(self, obj: Node) -> int:
        return obj.in_service_count

    def _move(self, request: HttpRequest, queryset: QuerySet[Node], *, move) -> list[str]:
        """Apply a node service to each selected node; returns the names it changed (others are reported)."""
        moved = []
        for node_id in queryset.values_list("pk", flat=True):
            try:
                node, changed = move(node_id=node_id, actor=request.user.username)
            except DomainError:
                continue
            if changed:
                moved.append(node.name)
        return moved

    def _report(self, request: HttpRequest, queryset: QuerySet[Node], moved: list[str], verb: str, source: str) -> None:
        if moved:
            self.message_user(request, f"{verb} {len(moved)} node(s): {', '.join(moved)}.", messages.SUCCESS)
        skipped = sorted(set(queryset.values_list("name", flat=True)) - set(moved))
        if skipped:
            self.message_user(request, f"Left unchanged (not {source}): {', '.join(skipped)}.", messages.WARNING)

    @admin.action(
        description="Cordon selected nodes (no new placements; running jobs continue)", permissions=["change"]
    )
    def cordon_nodes(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        moved = self._move(request, queryset, move=node_cordon)
        self._report(request, queryset, moved, "Cordoned", Node.State.READY)

    @admin.action(description="Uncordon selected nodes", permissions=["change"])
    def uncordon_nodes(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        moved = self._move(request, queryset, move=node_uncordon)
        self._report(request, queryset, moved, "Uncordoned", Node.State.CORDONED)


# ---------------------------------------------------------------------------------------------- GPUs


class SliceInline(ReadOnlyMixin, admin.TabularInline):
    model = LogicalDevice
    fields = ("compute_milli", "memory_mib", "exclusive", "attempt", "created_at", "released_at", "release_reason")
    readonly_fields = fields
    ordering = ("-created_at",)
    extra = 0
    verbose_name = "slice"
    verbose_name_plural = "slices (held and released)"


@admin.register(GPU)
class GPUAdmin(admin.ModelAdmin):
    list_display = (
        "__str__",
        "model",
        "memory_mib",
        "health",
        "quarantined",
        "quarantine_reason",
        "health_changed_at",
        "compute_held",
        "held_by",
    )
    list_filter = ("health", "quarantined", "model", "node")
    search_fields = ("uuid", "node__name", "model", "quarantine_reason")
    fields = (*GPU_FIELDS, "held_by")
    readonly_fields = (*GPU_FIELDS, "held_by")
    inlines = (SliceInline,)
    actions = ("quarantine_gpus", "return_gpus_to_service")

    def get_queryset(self, request: HttpRequest) -> QuerySet[GPU]:
        return super().get_queryset(request).select_related("node").prefetch_related(_live_slices_prefetch())

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: GPU | None = None) -> bool:
        return False

    @admin.display(description="held now (compute; memory)")
    def compute_held(self, obj: GPU) -> str:
        milli = sum(d.compute_milli for d in obj.live_slices)
        memory = sum(d.memory_mib for d in obj.live_slices)
        return f"{milli} / 1000m; {memory} / {obj.memory_mib} MiB"

    @admin.display(description="held by")
    def held_by(self, obj: GPU) -> SafeString | str:
        if not obj.live_slices:
            return "free"
        return format_html_join("", "<div>{}</div>", ((_holder(d),) for d in obj.live_slices))

    @admin.action(description="Quarantine selected GPUs (no new placements)", permissions=["change"])
    def quarantine_gpus(self, request: HttpRequest, queryset: QuerySet[GPU]) -> None:
        done = []
        for gpu in queryset.filter(quarantined=False):
            with transaction.atomic():
                gpu_mark_unhealthy(gpu=gpu, reason=f"quarantined by {request.user.get_username()} in the admin console")
            done.append(str(gpu))
        already = queryset.count() - len(done)
        if done:
            self.message_user(
                request,
                f"Quarantined {len(done)} GPU(s): {', '.join(done)}. Jobs already on them "
                "keep running; new work goes elsewhere.",
                messages.SUCCESS,
            )
        if already:
            self.message_user(request, f"{already} selected GPU(s) were already quarantined.", messages.INFO)

    @admin.action(description="Return selected GPUs to service", permissions=["change"])
    def return_gpus_to_service(self, request: HttpRequest, queryset: QuerySet[GPU]) -> None:
        done = []
        with transaction.atomic():
            for gpu in queryset.filter(Q(quarantined=True) | ~Q(health=GPU.Health.HEALTHY)):
                gpu_return_to_service(gpu=gpu)
                done.append(str(gpu))
            if done:
                _redispatch_on_commit()
        if done:
            self.message_user(request, f"Returned {len(done)} GPU(s) to service: {', '.join(done)}.", messages.SUCCESS)
        else:
            self.message_user(request, "Every selected GPU was already healthy and in service.", messages.INFO)


# ---------------------------------------------------------------------------------------------- ledger


@admin.register(LogicalDevice)
class LogicalDeviceAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "gpu",
        "compute_milli",
        "memory_mib",
        "exclusive",
        "holder",
        "created_at",
        "released_at",
        "release_reason",
    )
    list_filter = (("released_at", admin.EmptyFieldListFilter), "exclusive", "release_reason")
    search_fields = ("gpu__uuid", "gpu__node__name", "attempt__job__name", "release_reason")
    list_select_related = ("gpu__node", "attempt__job__team", "attempt__job__owner")
    date_hierarchy = "created_at"

    @admin.display(description="holder")
    def holder(self, obj: LogicalDevice) -> str:
        if obj.released_at is None:
            return _holder(obj)
        was = f"{obj.attempt.job.name} attempt #{obj.attempt.number}" if obj.attempt else "no attempt"
        return f"released ({obj.release_reason or 'no reason'}); was held by {was}"


@admin.register(PoolRepair)
class PoolRepairAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ("at", "kind", "gpu", "detail")
    list_filter = ("kind",)
    search_fields = ("detail", "gpu__uuid", "gpu__node__name")
    list_select_related = ("gpu__node",)
    date_hierarchy = "at"
