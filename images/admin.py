"""Admin console for the image catalog: registries allow-list, base and project images with driver compatibility,
builds (log, SBOM, findings), the vulnerability feed (load an OSV file), scan policies with their exceptions.

The compatibility column answers "which nodes can run this image": a node can when its driver satisfies the
image's minimum driver (`cluster.selectors.driver_satisfies`, the same check placement makes).
"""

from __future__ import annotations

from collections.abc import Callable

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from cluster.models import Node
from cluster.selectors import driver_satisfies
from images import scan, services
from images.models import (
    Advisory,
    BaseImage,
    Finding,
    ImageBuild,
    ProjectImage,
    Registry,
    ScanException,
    ScanPolicy,
    TeamImageSettings,
)
from kernel.errors import DomainError


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
    list_display = ("host", "allowed", "endpoint")
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
        (None, {"fields": ("name", "maintainer", "owners", *IMAGE_FACTS)}),
        ("Build", {"fields": ("containerfile",), "description": "Built and pushed by the platform when set."}),
        ("Compatibility", {"fields": ("compatibility_matrix",)}),
    )
    readonly_fields = ("compatibility_matrix",)
    filter_horizontal = ("owners",)
    actions = ["rebuild"]

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        adding = obj is None

        class LimitedForm(form):
            def clean(self):
                data = super().clean()
                from django.conf import settings

                if adding and BaseImage.objects.count() >= settings.TRAINYARD_MAX_BASE_IMAGES:
                    raise forms.ValidationError(
                        f"the catalog already has {settings.TRAINYARD_MAX_BASE_IMAGES} base images, the maximum"
                    )
                if data.get("containerfile") and not services.FROM_LINE.search(data["containerfile"]):
                    raise forms.ValidationError("the Containerfile has no FROM line")
                return data

        return LimitedForm

    @admin.action(description="Rebuild now (platform-built bases)")
    def rebuild(self, request: HttpRequest, queryset: QuerySet[BaseImage]) -> None:
        for image in queryset:
            try:
                build = services.build_request(image=image, user=request.user)
                self.message_user(request, f"build {build.pk} of {image.name} queued")
            except DomainError as exc:
                self.message_user(request, f"{image.name}: {exc.detail}", level=messages.WARNING)


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
        "stale",
        "last_rebuilt",
    )
    list_filter = ("team", "scan_status", "stale", "base")
    search_fields = ("name", "reference", "team__name", "base__name")
    list_select_related = ("team", "base")
    autocomplete_fields = ("team", "base")
    fieldsets = (
        (None, {"fields": ("name", "team", "base", "stale", *IMAGE_FACTS)}),
        ("Build", {"fields": ("containerfile", "requirements")}),
        ("Compatibility", {"fields": ("compatibility_matrix",)}),
    )
    readonly_fields = ("compatibility_matrix",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[ProjectImage]:
        return super().get_queryset(request).select_related("team", "base")

    @admin.display(description="min driver (own or base's)")
    def effective_min_driver(self, obj: ProjectImage) -> str:
        return _min_driver(obj) or "-"


class FindingInline(admin.TabularInline):
    model = Finding
    extra = 0
    can_delete = False
    fields = ("vuln_id", "severity", "ecosystem", "package", "version", "fixed_version", "source")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class TrivyForm(forms.Form):
    report = forms.FileField(help_text="a Trivy JSON report (trivy image -f json) of this build's image")


@admin.register(ImageBuild)
class ImageBuildAdmin(admin.ModelAdmin):
    list_display = ("id", "image", "status", "trigger", "created_at", "finished_at", "size_bytes", "digest")
    list_filter = ("status", "trigger")
    search_fields = ("digest", "base_image__name", "project_image__name")
    list_select_related = ("base_image", "project_image__team")
    readonly_fields = ["trivy_import", *(f.name for f in ImageBuild._meta.fields)]
    inlines = [FindingInline]

    @admin.display(description="Trivy report")
    def trivy_import(self, obj: ImageBuild) -> SafeString:
        return format_html('<a href="{}">Import a Trivy JSON report made elsewhere</a>', f"../../{obj.pk}/trivy/")

    def has_add_permission(self, request) -> bool:
        return False

    def get_urls(self):
        return [
            path("<int:pk>/trivy/", self.admin_site.admin_view(self.trivy_view), name="images_imagebuild_trivy"),
            *super().get_urls(),
        ]

    def trivy_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        build = ImageBuild.objects.get(pk=pk)
        form = TrivyForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            try:
                count = services.trivy_import(build=build, document=scan.load_json(form.cleaned_data["report"].read()))
            except (ValueError, KeyError, TypeError) as exc:
                form.add_error("report", f"not a Trivy JSON report: {exc}")
            else:
                self.message_user(request, f"imported {count} findings into build {build.pk}")
                return redirect("admin:images_imagebuild_change", build.pk)
        context = {**self.admin_site.each_context(request), "form": form, "title": f"Import a Trivy report: {build}"}
        return render(request, "admin/images/upload.html", context)


class FeedForm(forms.Form):
    feed = forms.FileField(help_text="OSV JSON: one entry, a list of entries, or an OSV query answer ({vulns: [...]})")


@admin.register(Advisory)
class AdvisoryAdmin(admin.ModelAdmin):
    list_display = ("vuln_id", "ecosystem", "package", "severity", "source", "loaded_at")
    change_list_template = "admin/images/advisory_changelist.html"
    list_filter = ("ecosystem", "severity", "source")
    search_fields = ("vuln_id", "package")

    def get_urls(self):
        return [
            path("load/", self.admin_site.admin_view(self.load_view), name="images_advisory_load"),
            *super().get_urls(),
        ]

    def load_view(self, request: HttpRequest) -> HttpResponse:
        form = FeedForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            upload = form.cleaned_data["feed"]
            try:
                count = services.feed_load(document=scan.load_json(upload.read()), source=upload.name)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                form.add_error("feed", f"not an OSV feed: {exc}")
            else:
                self.message_user(request, f"loaded {count} advisories from {upload.name}")
                return redirect("admin:images_advisory_changelist")
        context = {**self.admin_site.each_context(request), "form": form, "title": "Load a vulnerability feed"}
        return render(request, "admin/images/upload.html", context)


class ScanExceptionInline(admin.TabularInline):
    """Exceptions are explicit (a reason), audited (who, when) and expire; they are added, never edited."""

    model = ScanException
    extra = 0
    fields = ("vuln_id", "image", "reason", "expires_at", "created_by", "created_at")
    readonly_fields = ("created_by", "created_at")

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ScanPolicy)
class ScanPolicyAdmin(admin.ModelAdmin):
    list_display = ("queue", "max_severity", "require_scan", "refuse_root")
    inlines = [ScanExceptionInline]

    def save_formset(self, request, form, formset, change) -> None:
        for obj in formset.save(commit=False):
            if isinstance(obj, ScanException) and obj.pk is None:
                services.scan_exception_grant(
                    policy=form.instance,
                    vuln_id=obj.vuln_id,
                    reason=obj.reason,
                    expires_at=obj.expires_at,
                    user=request.user,
                    image=obj.image,
                )
        for obj in formset.deleted_objects:
            obj.delete()


@admin.register(ScanException)
class ScanExceptionAdmin(admin.ModelAdmin):
    list_display = ("vuln_id", "policy", "image", "created_by", "created_at", "expires_at")
    list_filter = ("policy",)
    readonly_fields = ("policy", "vuln_id", "image", "reason", "created_by", "created_at", "expires_at")

    def has_add_permission(self, request) -> bool:
        return False  # granted on the policy's page, with a reason and an expiry


@admin.register(TeamImageSettings)
class TeamImageSettingsAdmin(admin.ModelAdmin):
    list_display = ("team", "rebuild_on_base_change")
    list_editable = ("rebuild_on_base_change",)
