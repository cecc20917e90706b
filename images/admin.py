"""Admin console for the image catalog: registries allow-list, base and project images with driver compatibility.

The compatibility column answers "which nodes can run this image": a node can when its driver satisfies the
image's minimum driver (`cluster.services.driver_satisfies`, the same check placement makes).
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from cluster.models import Node
from cluster.services import driver_satisfies
from images.models import BaseImage, ProjectImage, Registry


def _nodes() -> list[Node]:
    return list(Node.objects.only("name", "driver_version", "state").order_by("name"))


def _min_driver(image: BaseImage | ProjectImage) -> str:
    if isinstance(image, ProjectImage):
        return image.min_driver_version or image.base.min_driver_version
    return image.min_driver_version


def _split(image: BaseImage | ProjectImage, nodes: list[Node]) -> tuple[list[Node], list[Node]]:
    minimum = _min_driver(image)
    ok = [n for n in nodes if driver_satisfies(n.driver_version, minimum)]
    too_old = [n for n in nodes if not driver_satisfies(n.driver_version, minimum)]
    return ok, too_old


def _node_label(node: Node) -> str:
    state = "" if node.state == Node.State.READY else f", {node.state}"
    return f"{node.name} (driver {node.driver_version or 'unknown'}{state})"


def _summary(image: BaseImage | ProjectImage, nodes: list[Node]) -> SafeString:
    if not nodes:
        return format_html("<span>no nodes in the pool</span>")
    ok, too_old = _split(image, nodes)
    compatible = ", ".join(_node_label(n) for n in ok) or "none"
    incompatible = ", ".join(_node_label(n) for n in too_old) or "none"
    return format_html(
        "{} of {} nodes. Compatible: {}. Incompatible: {}.", len(ok), len(nodes), compatible, incompatible
    )


def _matrix(image: BaseImage | ProjectImage) -> SafeString:
    nodes = _nodes()
    if not nodes:
        return format_html("<p>No nodes in the pool yet.</p>")
    minimum = _min_driver(image) or "none"
    rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (
                n.name,
                n.driver_version or "unknown",
                n.state,
                "yes" if driver_satisfies(n.driver_version, _min_driver(image)) else f"no: needs driver ≥ {minimum}",
            )
            for n in nodes
        ),
    )
    return format_html(
        "<p>Minimum driver: {}</p><table><thead><tr><th>node</th><th>driver</th><th>state</th>"
        "<th>can run this image</th></tr></thead><tbody>{}</tbody></table>",
        minimum,
        rows,
    )


class CompatibilityAdmin(admin.ModelAdmin):
    """Adds the per-node compatibility column (nodes loaded once per page) and the matrix on the change page."""

    def get_list_display(self, request: HttpRequest) -> tuple[str | Callable, ...]:
        nodes: list[Node] | None = None

        @admin.display(description="driver compatibility")
        def compatibility(obj: BaseImage | ProjectImage) -> SafeString:
            nonlocal nodes
            if nodes is None:
                nodes = _nodes()
            return _summary(obj, nodes)

        return (*super().get_list_display(request), compatibility)

    @admin.display(description="compatibility matrix")
    def compatibility_matrix(self, obj: BaseImage | ProjectImage) -> SafeString:
        if obj.pk is None:
            return format_html("<p>Shown once the image is saved.</p>")
        return _matrix(obj)


@admin.register(Registry)
class RegistryAdmin(admin.ModelAdmin):
    list_display = ("host", "allowed")
    list_editable = ("allowed",)
    list_filter = ("allowed",)
    search_fields = ("host",)


IMAGE_FACTS = (
    "reference",
    "digest",
    "cuda_version",
    "framework",
    "framework_version",
    "min_driver_version",
    "scan_status",
    "last_rebuilt",
)


@admin.register(BaseImage)
class BaseImageAdmin(CompatibilityAdmin):
    list_display = (
        "name",
        "reference",
        "cuda_version",
        "framework",
        "framework_version",
        "min_driver_version",
        "scan_status",
        "maintainer",
        "last_rebuilt",
    )
    list_filter = ("framework", "scan_status", "cuda_version")
    search_fields = ("name", "reference", "framework", "maintainer")
    fieldsets = (
        (None, {"fields": ("name", "maintainer", *IMAGE_FACTS)}),
        ("Compatibility", {"fields": ("compatibility_matrix",)}),
    )
    readonly_fields = ("compatibility_matrix",)


@admin.register(ProjectImage)
class ProjectImageAdmin(CompatibilityAdmin):
    list_display = (
        "name",
        "team",
        "base",
        "reference",
        "cuda_version",
        "effective_min_driver",
        "scan_status",
        "last_rebuilt",
    )
    list_filter = ("team", "scan_status", "base")
    search_fields = ("name", "reference", "team__name", "base__name")
    list_select_related = ("team", "base")
    autocomplete_fields = ("team", "base")
    fieldsets = (
        (None, {"fields": ("name", "team", "base", *IMAGE_FACTS)}),
        ("Compatibility", {"fields": ("compatibility_matrix",)}),
    )
    readonly_fields = ("compatibility_matrix",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[ProjectImage]:
        return super().get_queryset(request).select_related("team", "base")

    @admin.display(description="min driver (own or base's)")
    def effective_min_driver(self, obj: ProjectImage) -> str:
        return _min_driver(obj) or "-"
