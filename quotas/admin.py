"""Admin console for teams, queues, specs, API tokens and the quota audit trail.

Quota and capability edits never write the row directly: they go through `team_quota_update` /
`queue_update`, which audit each changed field into QuotaChange and re-dispatch the queues.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from kernel.errors import DomainError, ValidationFailed
from kernel.units import human_duration, human_resource, parse_duration
from kernel.watch import watch_validate
from quotas import runtimes
from quotas.models import ApiToken, Membership, Queue, QuotaChange, ResourceSpec, Team
from quotas.services import QUEUE_FIELDS, TEAM_QUOTA_FIELDS, queue_update, team_announce, team_quota_update
from quotas.tokens import token_revoke
from quotas.usage import queue_usage, team_usage

QUOTA_FIELDSET = ("gpu_milli", "gpu_memory_mib", "cpu_milli", "memory_mib")
# Stored in milli and MiB; shown and typed in GPUs, cores and GiB: (label, stored units per shown unit, step).
HUMAN_UNITS: dict[str, tuple[str, int, str]] = {
    "gpu_milli": ("GPUs", 1000, "0.25"),
    "gpu_memory_mib": ("GPU memory (GiB)", 1024, "1"),
    "cpu_milli": ("CPU cores", 1000, "0.5"),
    "memory_mib": ("memory (GiB)", 1024, "1"),
}


def _shown(name: str, value: int) -> str:
    return human_resource(name, value) if name in HUMAN_UNITS else str(value)


def usage_bar(name: str, used: int, limit: int) -> str:
    """`2 of 4 GPUs (50%)` with a bar: amber from 90 %, red when full."""
    pct = 0 if not limit else min(100, round(100 * used / limit))
    colour = "#b91c1c" if limit and used >= limit else ("#b45309" if pct >= 90 else "#2563eb")
    if name in HUMAN_UNITS:
        text = f"{_shown(name, used).split(' ', 1)[0]} of {_shown(name, limit)} ({pct}%)"
    else:
        text = f"{used} of {limit} {name} ({pct}%)"
    return format_html(
        '<div class="quota-usage" style="min-width:12rem"><div style="background:#e5e7eb;border-radius:3px;'
        'height:0.5rem;width:12rem"><div role="presentation" style="background:{};height:100%;width:{}%;'
        'border-radius:3px"></div></div><span>{}</span></div>',
        colour,
        pct,
        text,
    )


class ScaledField(forms.DecimalField):
    """A stored integer (milli, MiB) edited in a person's unit (GPUs, GiB); cleans back to the stored integer."""

    def __init__(self, *, scale: int, **kwargs: Any) -> None:
        self.scale = scale
        super().__init__(min_value=0, decimal_places=3, **kwargs)

    def clean(self, value: Any) -> int:
        shown = super().clean(value)
        return int((Decimal(shown) * self.scale).to_integral_value(rounding=ROUND_HALF_UP))


# Time limits, stored in seconds; shown and typed as `4h`, `30m`, `1h 30m` (or seconds).
DURATIONS = {"default_timeout_s": "default time limit", "max_timeout_s": "maximum time limit"}


class DurationInput(forms.TextInput):
    def format_value(self, value: Any) -> str | None:
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            return human_duration(int(value))
        return super().format_value(value)


class HumanDurationField(forms.CharField):
    """A time limit as people write one (the submit form and the API accept the same); cleans to seconds."""

    widget = DurationInput

    def clean(self, value: Any) -> int | None:
        text = super().clean(value)
        try:
            seconds = parse_duration(text, field=str(self.label))
        except ValidationFailed as exc:
            raise forms.ValidationError(exc.detail, code="invalid") from None
        if seconds is not None and seconds < 1:
            raise forms.ValidationError("a time limit must be positive", code="invalid")
        return seconds


class HumanQuotaForm(forms.ModelForm):
    """Quota and capability fields in GPUs, cores and GiB instead of milli and MiB; time limits in hours and
    minutes instead of seconds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, label in DURATIONS.items():
            if name in self.fields:
                self.fields[name] = HumanDurationField(
                    label=label,
                    required=self.fields[name].required,
                    help_text="like 4h, 30m, 1h30m or 2d (a plain number is seconds)",
                )
        for name, (label, scale, step) in HUMAN_UNITS.items():
            if name not in self.fields:
                continue
            stored = self.fields[name]
            self.fields[name] = ScaledField(
                scale=scale,
                label=label,
                required=stored.required,
                help_text=f"stored as {name}",
                widget=forms.NumberInput(attrs={"step": step}),
            )
            raw = self.initial.get(name)
            if raw is not None:
                self.initial[name] = (Decimal(int(raw)) / scale).normalize()


def _save_audited(
    request: HttpRequest,
    obj: Team | Queue,
    form: forms.ModelForm,
    change: bool,
    audited: tuple[str, ...],
    update: Callable[..., object],
) -> None:
    """Save the plain fields directly and hand the audited ones to the service (a new row is saved whole)."""
    if not change:
        obj.save()
        return
    plain = [
        name
        for name in form.changed_data
        if name not in audited
        and name in form.cleaned_data
        and not isinstance(form.fields[name], forms.ModelMultipleChoiceField)
    ]
    if plain:
        obj.save(update_fields=plain)
    changes = {name: form.cleaned_data[name] for name in form.changed_data if name in audited}
    if changes:
        update(changes=changes, actor=request.user)


class ReadOnlyAdminMixin:
    """Visible to staff, never added, edited or deleted from the console."""

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


# ---------------------------------------------------------------------------------------------- audit trail


class QuotaChangeInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = QuotaChange
    fields = ("at", "actor", "field", "old_value", "new_value")
    readonly_fields = fields
    ordering = ("-at",)
    extra = 0
    verbose_name = "quota change"
    verbose_name_plural = "quota changes (audit trail)"


class TeamQuotaChangeInline(QuotaChangeInline):
    fk_name = "team"


class QueueQuotaChangeInline(QuotaChangeInline):
    fk_name = "queue"


@admin.register(QuotaChange)
class QuotaChangeAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("at", "actor", "subject", "field", "old_value", "new_value")
    list_filter = ("field", "team", "queue")
    search_fields = ("actor__username", "team__name", "queue__name", "field")
    list_select_related = ("actor", "team", "queue")
    date_hierarchy = "at"
    fields = ("at", "actor", "team", "queue", "field", "old_value", "new_value")
    readonly_fields = fields

    @admin.display(description="team / queue")
    def subject(self, obj: QuotaChange) -> str:
        if obj.team_id:
            return f"team {obj.team}"
        return f"queue {obj.queue}" if obj.queue_id else "-"


# ---------------------------------------------------------------------------------------------- teams


class MembershipInline(admin.TabularInline):
    model = Membership
    fields = ("user", "role")
    autocomplete_fields = ("user",)
    extra = 0


class TeamForm(HumanQuotaForm):
    class Meta:
        model = Team
        fields = ("name", "slug", "namespace", *QUOTA_FIELDSET, "max_running_jobs", "max_jobs_per_user", "watch")

    def clean_watch(self):
        try:
            return watch_validate(self.cleaned_data.get("watch"))
        except ValidationFailed as exc:
            raise forms.ValidationError(exc.detail, code=exc.code) from None


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    form = TeamForm
    list_display = (
        "name",
        "slug",
        "namespace",
        "gpu_milli_usage",
        "gpu_memory_usage",
        "running_jobs",
        "max_jobs_per_user",
        "member_count",
    )
    search_fields = ("name", "slug", "namespace")
    prepopulated_fields = {"slug": ("name",)}
    inlines = (MembershipInline, TeamQuotaChangeInline)
    fieldsets = (
        (None, {"fields": ("name", "slug", "namespace")}),
        (
            "Quota (hard; changes are audited and take effect at the next dispatch)",
            {
                "fields": (*QUOTA_FIELDSET, "max_running_jobs", "max_jobs_per_user"),
            },
        ),
        (
            "Checkpoint storage (docs/storage.md)",
            {"fields": ("storage_quota_bytes", "checkpoint_keep_last", "checkpoint_retention_days")},
        ),
        (
            "Code snapshots (docs/cli.md, Your code)",
            {"fields": ("code_quota_bytes", "code_retention_days")},
        ),
        ("Log alerts: texts watched in every job of the team (docs/monitoring.md)", {"fields": ("watch",)}),
        ("Live usage", {"fields": ("usage_now",)}),
    )
    readonly_fields = ("usage_now",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Team]:
        return super().get_queryset(request).annotate(member_total=Count("memberships", distinct=True))

    def _usage(self, obj: Team) -> dict[str, int]:
        # One selector call per row, memoised on the row so the columns share it.
        if not hasattr(obj, "_usage_cache"):
            obj._usage_cache = team_usage(obj)
        return obj._usage_cache

    @admin.display(description="GPUs used of quota")
    def gpu_milli_usage(self, obj: Team) -> str:
        return usage_bar("gpu_milli", self._usage(obj)["gpu_milli"], obj.gpu_milli)

    @admin.display(description="GPU memory used of quota")
    def gpu_memory_usage(self, obj: Team) -> str:
        return usage_bar("gpu_memory_mib", self._usage(obj)["gpu_memory_mib"], obj.gpu_memory_mib)

    @admin.display(description="jobs running of max")
    def running_jobs(self, obj: Team) -> str:
        return usage_bar("jobs", self._usage(obj)["jobs"], obj.max_running_jobs)

    @admin.display(description="members", ordering="member_total")
    def member_count(self, obj: Team) -> int:
        return obj.member_total

    @admin.display(description="used now / quota")
    def usage_now(self, obj: Team) -> str:
        if obj.pk is None:
            return "-"
        used = self._usage(obj)
        rows = [(HUMAN_UNITS[name][0], usage_bar(name, used[name], getattr(obj, name))) for name in QUOTA_FIELDSET]
        rows.append(("jobs holding quota", usage_bar("jobs", used["jobs"], obj.max_running_jobs)))
        return format_html_join("", "<div><strong>{}</strong> {}</div>", rows)

    def save_model(self, request: HttpRequest, obj: Team, form: forms.ModelForm, change: bool) -> None:
        _save_audited(request, obj, form, change, TEAM_QUOTA_FIELDS, lambda **kw: team_quota_update(team=obj, **kw))
        if not change or {"namespace", "slug"} & set(form.changed_data):
            team_announce(team=obj)  # its Kubernetes namespace is made (or moved) on commit; quota edits announce


# ---------------------------------------------------------------------------------------------- queues


class QueueForm(HumanQuotaForm):
    class Meta:
        model = Queue
        fields = (
            "name",
            "description",
            "state",
            "ordering",
            "priority",
            "priority_class",
            "allow_preemptible",
            "pools",
            "max_member_priority",
            "weight",
            *QUOTA_FIELDSET,
            "teams",
            "specs",
            "allow_explicit_request",
            "default_timeout_s",
            "max_timeout_s",
            "gang",
            "secondary_network",
            "runtime_class",
            "outbound_network",
            "idle_threshold_pct",
            "idle_after_s",
            "idle_action",
            "idle_stop_after_s",
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        default, maximum = data.get("default_timeout_s"), data.get("max_timeout_s")
        if default is not None and maximum is not None and default > maximum:
            self.add_error(
                "default_timeout_s",
                f"the default time limit ({human_duration(default)}) exceeds the maximum ({human_duration(maximum)})",
            )
        problem = runtimes.runtime_class_problem(data.get("runtime_class") or "")
        if problem:
            self.add_error("runtime_class", problem)
        threshold = data.get("idle_threshold_pct")
        if threshold is not None and not 0 <= threshold <= 100:
            self.add_error("idle_threshold_pct", "a utilization threshold is between 0 and 100 (0 turns it off)")
        return data


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin):
    form = QueueForm
    list_display = (
        "name",
        "state",
        "ordering",
        "priority",
        "priority_class",
        "allow_preemptible",
        "weight",
        "gpu_milli_usage",
        "gpu_memory_usage",
        "running_jobs",
        "waiting_jobs",
        "time_limits",
        "gang",
    )
    list_filter = ("state", "ordering", "gang", "priority_class", "allow_preemptible")
    search_fields = ("name", "description")
    filter_horizontal = ("teams", "specs")
    inlines = (QueueQuotaChangeInline,)
    actions = ("open_queues", "close_queues")
    fieldsets = (
        (None, {"fields": ("name", "description", "state", "ordering", "priority", "priority_class", "weight")}),
        (
            "Capability (hard; changes are audited and take effect at the next dispatch)",
            {
                "fields": QUOTA_FIELDSET,
            },
        ),
        ("Who and what", {"fields": ("teams", "specs", "allow_explicit_request", "allow_preemptible", "pools")}),
        (
            "Timeouts and scheduling",
            {
                "fields": (
                    "default_timeout_s",
                    "max_timeout_s",
                    "gang",
                    "secondary_network",
                    "runtime_class",
                    "outbound_network",
                ),
            },
        ),
        (
            "Idle GPUs (docs/rightsizing.md)",
            {"fields": ("idle_threshold_pct", "idle_after_s", "idle_action", "idle_stop_after_s")},
        ),
        ("Live usage", {"fields": ("usage_now",)}),
    )
    readonly_fields = ("usage_now",)

    @admin.display(description="time limit: default / maximum")
    def time_limits(self, obj: Queue) -> str:
        return f"{human_duration(obj.default_timeout_s)} / {human_duration(obj.max_timeout_s)}"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Queue]:
        return super().get_queryset(request).annotate(waiting_total=Count("jobs", filter=Q(jobs__state="pending")))

    def _usage(self, obj: Queue) -> dict[str, int]:
        if not hasattr(obj, "_usage_cache"):
            obj._usage_cache = queue_usage(obj)
        return obj._usage_cache

    @admin.display(description="GPUs used of capability")
    def gpu_milli_usage(self, obj: Queue) -> str:
        return usage_bar("gpu_milli", self._usage(obj)["gpu_milli"], obj.gpu_milli)

    @admin.display(description="GPU memory used of capability")
    def gpu_memory_usage(self, obj: Queue) -> str:
        return usage_bar("gpu_memory_mib", self._usage(obj)["gpu_memory_mib"], obj.gpu_memory_mib)

    @admin.display(description="jobs holding quota")
    def running_jobs(self, obj: Queue) -> int:
        return self._usage(obj)["jobs"]

    @admin.display(description="jobs waiting", ordering="waiting_total")
    def waiting_jobs(self, obj: Queue) -> int:
        return obj.waiting_total

    @admin.display(description="used now / capability")
    def usage_now(self, obj: Queue) -> str:
        if obj.pk is None:
            return "-"
        used = self._usage(obj)
        rows = [(HUMAN_UNITS[name][0], usage_bar(name, used[name], getattr(obj, name))) for name in QUOTA_FIELDSET]
        rows.append(("jobs", f"{used['jobs']} holding quota; {getattr(obj, 'waiting_total', 0)} waiting"))
        return format_html_join("", "<div><strong>{}</strong> {}</div>", rows)

    def save_model(self, request: HttpRequest, obj: Queue, form: forms.ModelForm, change: bool) -> None:
        _save_audited(request, obj, form, change, QUEUE_FIELDS, lambda **kw: queue_update(queue=obj, **kw))

    def _set_state(self, request: HttpRequest, queryset: QuerySet[Queue], state: str, verb: str) -> None:
        changed = []
        for queue in queryset:
            if queue.state == state:
                continue
            try:
                with transaction.atomic():
                    queue_update(queue=queue, changes={"state": state}, actor=request.user)
            except DomainError as exc:
                self.message_user(request, f"{queue.name}: {exc.detail}", messages.ERROR)
                continue
            changed.append(queue.name)
        if changed:
            self.message_user(request, f"{verb} {len(changed)} queue(s): {', '.join(changed)}.", messages.SUCCESS)
        else:
            self.message_user(request, f"Every selected queue was already {state}.", messages.INFO)

    @admin.action(description="Open selected queues", permissions=["change"])
    def open_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        self._set_state(request, queryset, Queue.State.OPEN, "Opened")

    @admin.action(description="Close selected queues (waiting jobs stay pending)", permissions=["change"])
    def close_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        self._set_state(request, queryset, Queue.State.CLOSED, "Closed")


# ---------------------------------------------------------------------------------------------- specs


class ResourceSpecForm(HumanQuotaForm):
    class Meta:
        model = ResourceSpec
        fields = (
            "name",
            "tier",
            "gpu_count",
            "gpu_milli",
            "gpu_memory_eighths",
            "cpu_milli_per_gpu",
            "memory_mib_per_gpu",
            "default_timeout_s",
            "description",
            "expected_slowdown",
            "enabled",
        )


@admin.register(ResourceSpec)
class ResourceSpecAdmin(admin.ModelAdmin):
    form = ResourceSpecForm
    list_display = (
        "name",
        "tier",
        "gpu_count",
        "gpu_share",
        "gpu_memory_eighths",
        "mig_profile",
        "cpu_milli_per_gpu",
        "memory_mib_per_gpu",
        "time_limit",
        "enabled",
        "queue_names",
    )
    list_filter = ("tier", "enabled")
    list_editable = ("enabled",)
    search_fields = ("name", "description")

    def get_queryset(self, request: HttpRequest) -> QuerySet[ResourceSpec]:
        return super().get_queryset(request).prefetch_related("queues")

    @admin.display(description="GPU per card", ordering="gpu_milli")
    def gpu_share(self, obj: ResourceSpec) -> str:
        return human_resource("gpu_milli", obj.gpu_milli)

    @admin.display(description="default time limit", ordering="default_timeout_s")
    def time_limit(self, obj: ResourceSpec) -> str:
        return human_duration(obj.default_timeout_s)

    @admin.display(description="queues")
    def queue_names(self, obj: ResourceSpec) -> str:
        return ", ".join(q.name for q in obj.queues.all()) or "-"


# ---------------------------------------------------------------------------------------------- API tokens


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "name", "user", "created_at", "expires_at", "last_used_at", "revoked_at", "status")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter), "created_at")
    search_fields = ("prefix", "name", "user__username")
    list_select_related = ("user",)
    fields = ("prefix", "name", "user", "created_at", "expires_at", "last_used_at", "revoked_at", "status")
    readonly_fields = fields
    actions = ("revoke_tokens",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("quotas.change_apitoken")

    @admin.display(description="status")
    def status(self, obj: ApiToken) -> str:
        if obj.revoked_at is not None:
            return "revoked"
        if obj.expires_at is not None and obj.expires_at <= timezone.now():
            return "expired"
        return "active"

    @admin.action(description="Revoke selected tokens", permissions=["revoke"])
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        revoked = 0
        for token in queryset:
            if token.revoked_at is None:
                token_revoke(token=token)
                revoked += 1
        skipped = queryset.count() - revoked
        text = f"Revoked {revoked} token(s)."
        if skipped:
            text += f" {skipped} were already revoked."
        self.message_user(request, text, messages.SUCCESS if revoked else messages.INFO)
