"""Admin console: alert rules are edited here as data; alerts can be acknowledged and resolved in bulk."""

from django import forms
from django.contrib import admin, messages

from kernel.errors import DomainError
from monitoring import services
from monitoring.models import RULE_EDITABLE_FIELDS, Alert, AlertRule, GpuHealthEvent, GpuStatus, WebhookDelivery


class AlertRuleForm(forms.ModelForm):
    webhook_url = forms.URLField(required=False, assume_scheme="https", help_text="empty: TRAINYARD_ALERT_WEBHOOK_URL")

    class Meta:
        model = AlertRule
        fields = list(RULE_EDITABLE_FIELDS)

    def clean(self):
        data = super().clean()
        try:
            services.alert_rule_validate(data)
        except DomainError as exc:
            raise forms.ValidationError({exc.field: exc.detail} if exc.field else exc.detail, code=exc.code)
        return data


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    form = AlertRuleForm
    list_display = [
        "name",
        "level",
        "metric",
        "comparator",
        "threshold",
        "for_seconds",
        "enabled",
        "notify",
        "webhook",
        "quarantine_gpu",
        "restart_job",
    ]
    list_editable = ["enabled"]
    list_filter = ["level", "metric", "enabled"]
    fieldsets = [
        (None, {"fields": ["name", "description", "enabled", "level"]}),
        (
            "Condition",
            {"fields": ["metric", "comparator", "threshold", "for_seconds", "window_seconds", "min_samples", "faults"]},
        ),
        ("Actions", {"fields": ["notify", "webhook", "webhook_url", "quarantine_gpu", "restart_job"]}),
    ]


@admin.action(description="Acknowledge the selected alerts")
def acknowledge(modeladmin, request, queryset):
    for alert in queryset.exclude(state=Alert.State.RESOLVED):
        if alert.state == Alert.State.FIRING:
            services.alert_acknowledge(alert_id=alert.pk, user=request.user)


@admin.action(description="Resolve the selected alerts")
def resolve(modeladmin, request, queryset):
    for alert in queryset.exclude(state=Alert.State.RESOLVED):
        try:
            services.alert_resolve(alert_id=alert.pk, user=request.user, note="resolved in the admin console")
        except DomainError as exc:
            messages.warning(request, f"Alert {alert.pk}: {exc.detail}")


class RecordAdmin(admin.ModelAdmin):
    """Records the platform writes (health history, probe state, webhook deliveries, alerts): staff read them;
    nobody adds, edits or deletes them here, so the history stays what happened."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Alert)
class AlertAdmin(RecordAdmin):
    list_display = ["id", "rule_name", "level", "state", "subject", "started_at", "last_seen_at", "resolved_at"]
    list_filter = ["state", "level", "rule_name"]
    search_fields = ["summary", "subject"]
    actions = [acknowledge, resolve]
    readonly_fields = [f.name for f in Alert._meta.fields]


@admin.register(GpuHealthEvent)
class GpuHealthEventAdmin(RecordAdmin):
    list_display = ["at", "gpu", "from_health", "to_health", "quarantined", "fault", "actor", "reason"]
    list_filter = ["to_health", "fault"]
    readonly_fields = [f.name for f in GpuHealthEvent._meta.fields]


@admin.register(GpuStatus)
class GpuStatusAdmin(RecordAdmin):
    list_display = ["gpu", "last_probe_at", "last_probe_ok", "fault", "failures", "last_xid", "last_sample_at"]
    readonly_fields = [f.name for f in GpuStatus._meta.fields]


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(RecordAdmin):
    list_display = ["created_at", "alert", "event", "url", "status", "attempts", "response_code", "error"]
    list_filter = ["status", "event"]
    readonly_fields = [f.name for f in WebhookDelivery._meta.fields]
