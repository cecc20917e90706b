"""Admin console for jobs (read-only, with a cancel action) and the editable failure-classification rules.

A job's state only moves through `jobs.services` (DESIGN.md §3), so the job pages are view-only: the one
thing an admin can do to a job here is cancel it, which calls `job_cancel` like the portal and the API do.
"""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest

from jobs import selectors
from jobs.lifecycle import job_cancel
from jobs.models import Attempt, Dataset, FailureRule, Job, JobEvent
from jobs.states import JobState
from kernel.errors import DomainError

JOB_FIELDSETS = (
    (
        None,
        {
            "fields": (
                "id",
                "name",
                "owner",
                "team",
                "queue",
                "spec",
                "state",
                "reason",
                "message",
                "queue_position",
                "reserved",
            )
        },
    ),
    (
        "Request (per replica)",
        {
            "fields": (
                "gpu_count",
                "gpu_milli",
                "gpu_memory_mib",
                "gpu_memory_eighths",
                "cpu_milli",
                "memory_mib",
                "exclusive",
                "replicas",
            )
        },
    ),
    (
        "Quota held while admitted (whole job)",
        {"fields": ("total_gpu_milli", "total_gpu_memory_mib", "total_cpu_milli", "total_memory_mib")},
    ),
    ("Image", {"fields": ("image_reference", "image_digest", "base_image", "project_image", "min_driver_version")}),
    (
        "Run",
        {
            "fields": (
                "command",
                "args",
                "env",
                "working_dir",
                "priority",
                "timeout_s",
                "deadline",
                "max_retries",
                "retries_used",
                "excluded_gpus",
                "excluded_nodes",
                "tensorboard",
                "tensorboard_logdir",
                "mounts",
                "labels",
            )
        },
    ),
    ("Outcome", {"fields": ("exit_code", "failure_class", "suggestion")}),
    ("Provenance", {"fields": ("idempotency_key", "ci", "reproduced_from", "reproduce")}),
    ("Times", {"fields": ("submitted_at", "admitted_at", "started_at", "finished_at")}),
)


class ViewOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


class AttemptInline(ViewOnlyInline):
    model = Attempt
    fields = (
        "number",
        "state",
        "backend",
        "backend_ref",
        "node",
        "started_at",
        "ended_at",
        "exit_code",
        "signal",
        "failure_class",
        "reaction",
        "rule",
        "reason",
    )
    readonly_fields = fields


class JobEventInline(ViewOnlyInline):
    model = JobEvent
    fields = ("at", "kind", "from_state", "to_state", "level", "actor", "message")
    readonly_fields = fields
    verbose_name_plural = "events (timeline)"


class JobChangeList(ChangeList):
    def get_results(self, request):
        super().get_results(request)
        # The waiting jobs' places (computed, not stored) for the whole page in one query instead of one per row.
        selectors.with_positions(list(self.result_list))


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "id",
        "state",
        "reason",
        "team",
        "queue",
        "spec",
        "owner",
        "queue_position",
        "submitted_at",
        "finished_at",
    )
    list_filter = ("state", "queue", "team", "spec", "failure_class")
    search_fields = ("name", "id", "owner__username")
    list_select_related = ("team", "queue", "spec", "owner")
    date_hierarchy = "submitted_at"
    fieldsets = JOB_FIELDSETS
    readonly_fields = tuple(name for _, opts in JOB_FIELDSETS for name in opts["fields"])
    inlines = (AttemptInline, JobEventInline)
    actions = ("cancel_jobs",)

    def get_changelist(self, request: HttpRequest, **kwargs) -> type[ChangeList]:
        return JobChangeList

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("jobs.change_job")

    @admin.action(description="Cancel selected jobs", permissions=["cancel"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        actor = request.user.get_username()
        cancelled: list[str] = []
        stopping: list[str] = []
        already: list[str] = []
        refused: list[str] = []
        for job in queryset.select_related(None).only("id", "name", "state").order_by("submitted_at"):
            label = f"{job.name} ({job.pk})"
            try:
                with transaction.atomic():
                    after = job_cancel(job_id=job.pk, actor=actor)
            except DomainError as exc:
                refused.append(f"{label}: {exc.detail}")
                continue
            except Job.DoesNotExist:
                refused.append(f"{label}: the job no longer exists")
                continue
            if job.state in (JobState.CANCELLED, JobState.CANCELLING):
                already.append(label)
            elif after.state == JobState.CANCELLING:
                stopping.append(label)
            else:
                cancelled.append(label)
        if cancelled:
            self.message_user(request, f"Cancelled {len(cancelled)} job(s): {', '.join(cancelled)}.", messages.SUCCESS)
        if stopping:
            self.message_user(
                request,
                f"Stopping {len(stopping)} running job(s); they turn cancelled once the "
                f"backend confirms: {', '.join(stopping)}.",
                messages.SUCCESS,
            )
        if already:
            self.message_user(request, f"Already cancelled or being cancelled: {', '.join(already)}.", messages.INFO)
        if refused:
            self.message_user(request, f"Could not cancel {len(refused)} job(s): {'; '.join(refused)}.", messages.ERROR)


# ---------------------------------------------------------------------------------------------- failure rules


def _int_list(value: Any, *, what: str, low: int, high: int) -> list[int]:
    if value in (None, ""):
        return []
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise forms.ValidationError(f"Enter a list of whole numbers, for example [1, 2] (got {value!r}).")
    out_of_range = [v for v in value if not low <= v <= high]
    if out_of_range:
        raise forms.ValidationError(f"{what} must be between {low} and {high}; got {out_of_range}.")
    return value


def _regex(value: str) -> str:
    if value:
        try:
            re.compile(value)
        except re.error as exc:
            raise forms.ValidationError(f"Not a valid regular expression: {exc}.")
    return value


class FailureRuleForm(forms.ModelForm):
    class Meta:
        model = FailureRule
        fields = (
            "name",
            "order",
            "enabled",
            "exit_codes",
            "signals",
            "reason_pattern",
            "log_pattern",
            "node_unhealthy",
            "failure_class",
            "reaction",
            "suggestion",
        )

    def clean_reason_pattern(self) -> str:
        return _regex(self.cleaned_data.get("reason_pattern", ""))

    def clean_log_pattern(self) -> str:
        return _regex(self.cleaned_data.get("log_pattern", ""))

    def clean_exit_codes(self) -> list[int]:
        return _int_list(self.cleaned_data.get("exit_codes"), what="Exit codes", low=0, high=255)

    def clean_signals(self) -> list[int]:
        return _int_list(self.cleaned_data.get("signals"), what="Signals", low=1, high=64)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        conditions = ("exit_codes", "signals", "reason_pattern", "log_pattern", "node_unhealthy")
        if not self.errors and not any(data.get(name) for name in conditions):
            raise forms.ValidationError(
                "A rule needs at least one condition (exit codes, signals, a reason or log pattern, or node "
                "unhealthy); a rule without one never matches."
            )
        return data


@admin.register(FailureRule)
class FailureRuleAdmin(admin.ModelAdmin):
    form = FailureRuleForm
    list_display = ("name", "order", "enabled", "conditions", "failure_class", "reaction", "suggestion")
    list_display_links = ("name",)
    list_editable = ("order", "enabled")
    list_filter = ("enabled", "failure_class", "reaction")
    search_fields = ("name", "reason_pattern", "log_pattern", "suggestion")
    ordering = ("order", "name")
    fieldsets = (
        (None, {"fields": ("name", "order", "enabled")}),
        (
            "Matches when every condition given holds",
            {
                "fields": ("exit_codes", "signals", "reason_pattern", "log_pattern", "node_unhealthy"),
            },
        ),
        ("Verdict", {"fields": ("failure_class", "reaction", "suggestion")}),
    )

    @admin.display(description="matches")
    def conditions(self, obj: FailureRule) -> str:
        parts = []
        if obj.exit_codes:
            parts.append(f"exit code in {obj.exit_codes}")
        if obj.signals:
            parts.append(f"signal in {obj.signals}")
        if obj.reason_pattern:
            parts.append(f"reason ~ /{obj.reason_pattern}/")
        if obj.log_pattern:
            parts.append(f"log ~ /{obj.log_pattern}/")
        if obj.node_unhealthy:
            parts.append("node or GPU unhealthy")
        return " and ".join(parts) or "nothing (never matches)"


class DatasetForm(forms.ModelForm):
    class Meta:
        model = Dataset
        fields = ["team", "name", "version", "description", "s3_prefix", "claim", "shared_with"]

    def clean(self):
        from jobs.datasets import _measure, check_prefix

        data = super().clean()
        prefix, claim = (data.get("s3_prefix") or "").strip(), (data.get("claim") or "").strip()
        if bool(prefix) == bool(claim):
            raise forms.ValidationError("Give either an S3 prefix or a claim.", code="invalid_dataset_source")
        if prefix and self.instance.pk is None:
            data["s3_prefix"] = prefix.rstrip("/") + "/"
            try:
                if data.get("team") is not None:
                    check_prefix(data["s3_prefix"], team=data["team"], staff=True)
                self.measured = _measure(data["s3_prefix"])
            except DomainError as exc:
                raise forms.ValidationError(exc.detail, code=exc.code) from None
        return data


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    """Register datasets: an S3 prefix's size and file count are read from the store when it is added."""

    form = DatasetForm
    list_display = ("name", "version", "team", "kind", "s3_prefix", "claim", "size_bytes", "file_count", "created_at")
    list_filter = ("team",)
    search_fields = ("name", "s3_prefix", "claim")
    readonly_fields = ("size_bytes", "file_count", "registered_by", "created_at")
    filter_horizontal = ("shared_with",)

    def get_readonly_fields(self, request, obj=None):
        # A version's source never changes once jobs may have used it: register a new version instead.
        fixed = ("team", "name", "version", "s3_prefix", "claim") if obj is not None else ()
        return (*fixed, *self.readonly_fields)

    def save_model(self, request, obj, form, change):
        if not change:
            obj.registered_by = request.user.get_username()
            obj.size_bytes, obj.file_count = getattr(form, "measured", (0, 0))
        super().save_model(request, obj, form, change)
