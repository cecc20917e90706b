"""Monitoring over REST (`/api/v1/monitoring/`): alerts (list, acknowledge, resolve), alert rules (admins
write), GPUs with health and telemetry (samples, probe, return to service), a job's three layers and the
business metrics it reports, scheduling samples, notifications, and the usage report (JSON or CSV)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, timedelta

from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, inline_serializer
from rest_framework import mixins, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from cluster.models import GPU
from jobs.selectors import job_parameters, jobs_to_compare, jobs_visible_to, parameter_rows
from kernel.api import ModelSerializer, RejectUnknownFieldsMixin, int_param
from kernel.errors import ValidationFailed
from monitoring import selectors, services
from monitoring.models import (
    RULE_EDITABLE_FIELDS,
    Alert,
    AlertRule,
    BusinessMetric,
    GpuHealthEvent,
    GpuSample,
    Notification,
    PushSettings,
)
from quotas.selectors import visible_teams
from quotas.tokens import ScopedActionsMixin

# --------------------------------------------------------------------------------------------- alerts


GPU_OVERVIEW_LIST = inline_serializer(
    "GpuOverviewItem",
    fields={"uuid": serializers.CharField(), "node": serializers.CharField(), "health": serializers.CharField()},
    many=True,
)
SCHEDULING_SAMPLE_LIST = inline_serializer(
    "SchedulingSample",
    fields={
        "at": serializers.DateTimeField(),
        "queue": serializers.CharField(allow_null=True),
        "pending": serializers.IntegerField(),
        "running": serializers.IntegerField(),
        "admissions": serializers.IntegerField(),
        "admissions_per_s": serializers.FloatField(allow_null=True),
        "wait_avg_s": serializers.FloatField(allow_null=True),
        "allocation_ratio": serializers.FloatField(allow_null=True),
        "memory_allocation_ratio": serializers.FloatField(allow_null=True),
        "fragmentation": serializers.FloatField(allow_null=True),
    },
    many=True,
)


class AlertSerializer(ModelSerializer):
    rule = serializers.CharField(source="rule_name")
    gpu = serializers.CharField(source="gpu.uuid", default=None, allow_null=True)
    node = serializers.CharField(source="gpu.node.name", default=None, allow_null=True)
    queue = serializers.CharField(source="queue.name", default=None, allow_null=True)
    job_ids = serializers.SerializerMethodField()
    actions_taken = serializers.SerializerMethodField()

    class Meta:
        model = Alert
        fields = [
            "id",
            "rule",
            "level",
            "state",
            "subject",
            "summary",
            "value",
            "gpu",
            "node",
            "queue",
            "job_ids",
            "started_at",
            "last_seen_at",
            "acknowledged_at",
            "acknowledged_by",
            "resolved_at",
            "resolved_by",
            "resolution",
            "actions_taken",
        ]
        read_only_fields = fields

    def get_job_ids(self, alert) -> list[str]:
        """Jobs of the reader's teams by id; other teams' jobs stay anonymous."""
        mine = self.context.get("job_ids")
        if mine is None:
            return alert.job_ids
        return [j if j in mine else "(another team)" for j in alert.job_ids]

    @extend_schema_field(serializers.ListField(child=serializers.DictField()))
    def get_actions_taken(self, alert) -> list[dict]:
        """What the rule did; job ids of other teams are replaced, like in `job_ids`."""
        return selectors.actions_visible(alert.actions_taken, self.context.get("job_ids"))


class AlertResolveSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    note = serializers.CharField(max_length=300, required=False, allow_blank=True)


class AlertFilter(filters.FilterSet):
    state = filters.MultipleChoiceFilter(choices=Alert.State.choices)
    level = filters.MultipleChoiceFilter(choices=AlertRule.Level.choices)
    rule = filters.CharFilter(field_name="rule_name")
    gpu = filters.CharFilter(field_name="gpu__uuid")
    open = filters.BooleanFilter(method="filter_open", help_text="true: firing or acknowledged")

    class Meta:
        model = Alert
        fields = []

    def filter_open(self, queryset, name, value):
        return queryset.exclude(state=Alert.State.RESOLVED) if value else queryset.filter(state=Alert.State.RESOLVED)


def _visible_job_ids(user, alerts) -> set[str] | None:
    if user.is_staff:
        return None
    wanted = {j for a in alerts for j in a.job_ids}
    return {str(pk) for pk in jobs_visible_to(user).filter(pk__in=wanted).values_list("pk", flat=True)}


class AlertViewSet(ScopedActionsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = AlertSerializer
    filterset_class = AlertFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Alert.objects.none()
        return selectors.alerts_visible_to(self.request.user)

    def list(self, request):
        alerts = list(self.filter_queryset(self.get_queryset())[:500])
        context = {**self.get_serializer_context(), "job_ids": _visible_job_ids(request.user, alerts)}
        return Response(AlertSerializer(alerts, many=True, context=context).data)

    def retrieve(self, request, pk=None):
        alert = self.get_object()
        context = {**self.get_serializer_context(), "job_ids": _visible_job_ids(request.user, [alert])}
        return Response(AlertSerializer(alert, context=context).data)

    @extend_schema(request=None, responses=AlertSerializer)
    @action(detail=True, methods=["post"])
    def acknowledge(self, request, pk=None):
        """Say someone is on it: the alert stays open but stops counting as firing (admins)."""
        alert = services.alert_acknowledge(alert_id=self.get_object().pk, user=request.user)
        return Response(AlertSerializer(alert).data)

    @extend_schema(request=AlertResolveSerializer, responses=AlertSerializer)
    @action(detail=True, methods=["post"])
    def resolve(self, request, pk=None):
        """Close the alert by hand (admins); 409 `condition_still_holds` while its rule still breaches."""
        payload = AlertResolveSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        alert = services.alert_resolve(
            alert_id=self.get_object().pk, user=request.user, note=payload.validated_data.get("note", "")
        )
        return Response(AlertSerializer(alert).data)


# ---------------------------------------------------------------------------------------------- rules


class AlertRuleSerializer(ModelSerializer):
    faults = serializers.ListField(child=serializers.CharField(max_length=20), required=False)
    webhook_url = serializers.URLField(required=False, allow_blank=True, max_length=200)

    class Meta:
        model = AlertRule
        fields = ["id", *RULE_EDITABLE_FIELDS, "updated_at"]
        read_only_fields = ["id", "updated_at"]


class AdminWritesOnly(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        return request.method in permissions.SAFE_METHODS or bool(request.user and request.user.is_staff)


class AlertRuleViewSet(
    ScopedActionsMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Alert rules as data: everyone reads them, admins write them."""

    serializer_class = AlertRuleSerializer
    permission_classes = [permissions.IsAuthenticated, AdminWritesOnly]
    queryset = AlertRule.objects.all()

    @extend_schema(request=AlertRuleSerializer, responses={201: AlertRuleSerializer})
    def create(self, request):
        payload = AlertRuleSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        rule = services.alert_rule_save(data=payload.validated_data)
        return Response(AlertRuleSerializer(rule).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=AlertRuleSerializer, responses=AlertRuleSerializer)
    def partial_update(self, request, pk=None):
        rule = self.get_object()
        payload = AlertRuleSerializer(rule, data=request.data, partial=True)
        payload.is_valid(raise_exception=True)
        rule = services.alert_rule_save(data=payload.validated_data, rule=rule)
        return Response(AlertRuleSerializer(rule).data)


# ----------------------------------------------------------------------------------------------- GPUs


class SampleSerializer(ModelSerializer):
    memory_pct = serializers.FloatField(read_only=True)

    class Meta:
        model = GpuSample
        fields = [
            "at",
            "source",
            "utilization_pct",
            "memory_used_mib",
            "memory_total_mib",
            "memory_pct",
            "temperature_c",
            "power_w",
            "ecc_uncorrected",
            "xid",
        ]
        read_only_fields = fields


class HealthEventSerializer(ModelSerializer):
    class Meta:
        model = GpuHealthEvent
        fields = ["at", "from_health", "to_health", "quarantined", "fault", "reason", "actor"]
        read_only_fields = fields


def gpu_overview_data(item: selectors.GpuOverview, *, teams_jobs: set[str] | None) -> dict:
    gpu, st = item.gpu, item.status
    return {
        "uuid": gpu.uuid,
        "node": gpu.node.name,
        "index": gpu.index,
        "model": gpu.model,
        "memory_mib": gpu.memory_mib,
        "emulated": gpu.node.emulated,
        "health": gpu.health,
        "quarantined": gpu.quarantined,
        "quarantine_reason": gpu.quarantine_reason,
        "probe": {
            "at": st.last_probe_at if st else None,
            "ok": st.last_probe_ok if st else None,
            "reason": st.last_probe_reason if st else "",
        },
        "fault": {"kind": st.fault, "reason": st.fault_reason, "since": st.fault_since, "failures": st.failures}
        if st and st.fault
        else None,
        "telemetry": {
            "note": item.note,
            "latest": SampleSerializer(item.latest).data if item.latest and not item.note else None,
        },
        "held_milli": item.held_milli,
        "jobs": [j if teams_jobs is None or j in teams_jobs else "(another team)" for j in item.jobs],
    }


class ReturnToServiceSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    force = serializers.BooleanField(
        required=False, default=False, help_text="skip the fresh probe (the card stays out if it fails again)"
    )


class MonitoredGpuViewSet(ScopedActionsMixin, viewsets.GenericViewSet):
    """GPUs with health, probe state and latest telemetry. Emulated cards say `emulated: no telemetry`."""

    lookup_field = "uuid"
    lookup_value_regex = "[^/]+"
    queryset = GPU.objects.select_related("node")
    serializer_class = SampleSerializer

    def _teams_jobs(self, items) -> set[str] | None:
        if self.request.user.is_staff:
            return None
        wanted = {j for i in items for j in i.jobs}
        return {str(pk) for pk in jobs_visible_to(self.request.user).filter(pk__in=wanted).values_list("pk", flat=True)}

    @extend_schema(operation_id="v1_monitoring_gpus_list", responses=GPU_OVERVIEW_LIST)
    def list(self, request):
        items = selectors.gpu_overview()
        teams_jobs = self._teams_jobs(items)
        return Response([gpu_overview_data(i, teams_jobs=teams_jobs) for i in items])

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def retrieve(self, request, uuid=None):
        gpu = self.get_object()
        item = next(i for i in selectors.gpu_overview() if i.gpu.pk == gpu.pk)
        data = gpu_overview_data(item, teams_jobs=self._teams_jobs([item]))
        data["health_events"] = HealthEventSerializer(gpu.health_events.all()[:50], many=True).data
        return Response(data)

    @extend_schema(
        parameters=[
            OpenApiParameter("since", OpenApiTypes.DATETIME),
            OpenApiParameter("until", OpenApiTypes.DATETIME),
            OpenApiParameter("limit", int),
        ],
        responses=OpenApiTypes.OBJECT,
    )
    @action(detail=True, methods=["get"])
    def samples(self, request, uuid=None):
        """Telemetry samples of one card, oldest first (the newest `limit`, at most 5000)."""
        gpu = self.get_object()
        if gpu.node.emulated:
            return Response(
                {"gpu": gpu.uuid, "emulated": True, "telemetry": selectors.NO_TELEMETRY_EMULATED, "samples": []}
            )
        since, until = _datetime_param(request, "since"), _datetime_param(request, "until")
        limit = min(int_param(request, "limit", default=2000, minimum=1), 5000)
        samples = selectors.gpu_samples(gpu, since=since, until=until, limit=limit)
        return Response(
            {
                "gpu": gpu.uuid,
                "emulated": False,
                "telemetry": "" if samples else "no samples",
                "samples": SampleSerializer(samples, many=True).data,
            }
        )

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["post"], permission_classes=[permissions.IsAdminUser])
    def probe(self, request, uuid=None):
        """Probe the card now (admins); a failure takes it out of service at once."""
        gpu = self.get_object()
        outcome = services.gpu_probe_one(gpu_uuid=gpu.uuid, actor=request.user.username)
        gpu.refresh_from_db()
        return Response(
            {
                "gpu": gpu.uuid,
                "probed": outcome is not None,
                "ok": outcome.ok if outcome else None,
                "fault": outcome.fault if outcome else "",
                "reason": outcome.reason
                if outcome
                else "this card is not reachable from here; its health comes from dcgm-exporter",
                "health": gpu.health,
                "quarantined": gpu.quarantined,
            }
        )

    @extend_schema(request=ReturnToServiceSerializer, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["post"], url_path="return-to-service", permission_classes=[permissions.IsAdminUser])
    def return_to_service(self, request, uuid=None):
        """Put a quarantined card back (admins): it must pass a fresh probe, else 409 `probe_failing`."""
        payload = ReturnToServiceSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        gpu = services.gpu_return_to_service(
            gpu_uuid=self.get_object().uuid, actor=request.user.username, force=payload.validated_data["force"]
        )
        return Response({"gpu": gpu.uuid, "health": gpu.health, "quarantined": gpu.quarantined})


# ----------------------------------------------------------------------------------------------- jobs


class BusinessMetricSerializer(ModelSerializer):
    class Meta:
        model = BusinessMetric
        fields = ["at", "attempt_number", "step", "values", "source", "line"]
        read_only_fields = fields


class JobMonitoringViewSet(ScopedActionsMixin, viewsets.GenericViewSet):
    """A job's three layers; the job reports its own progress, loss, throughput or peak memory here."""

    lookup_value_regex = "[0-9a-f-]{36}"
    serializer_class = BusinessMetricSerializer
    token_scope = "submit"  # a job's CI token reports its metrics

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return BusinessMetric.objects.none()
        return jobs_visible_to(self.request.user)

    @extend_schema(responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["get"])
    def telemetry(self, request, pk=None):
        """Host layer (the cards the job held, through the pool's ledger, with their samples in the holding
        window; its own processes' memory), scheduling facts, and business metrics."""
        job = self.get_object()
        data = selectors.job_telemetry(job)
        return Response(
            {
                "job": str(job.id),
                "devices": [
                    {
                        "gpu": d.device.gpu.uuid,
                        "node": d.device.gpu.node.name,
                        "attempt": d.attempt_number,
                        "compute_milli": d.device.compute_milli,
                        "memory_mib": d.device.memory_mib,
                        "held_from": d.device.created_at,
                        "held_until": d.device.released_at,
                        "emulated": d.emulated,
                        "telemetry": d.note,
                        "samples": SampleSerializer(d.samples, many=True).data,
                    }
                    for d in data["devices"]
                ],
                "processes": [
                    {
                        "at": p.at,
                        "gpu": p.gpu.uuid,
                        "attempt": p.attempt_number,
                        "memory_used_mib": p.memory_used_mib,
                        "processes": p.processes,
                    }
                    for p in data["processes"]
                ],
                "peak_memory_mib": data["peak_memory_mib"],
                "scheduling": data["scheduling"],
                "business": BusinessMetricSerializer(data["business"], many=True).data,
            }
        )

    @extend_schema(methods=["GET"], responses=BusinessMetricSerializer(many=True))
    @extend_schema(
        methods=["POST"],
        request=OpenApiTypes.OBJECT,
        responses={201: BusinessMetricSerializer(many=True)},
        description='One report or a list: {"step": 10, "loss": 0.5, "throughput": 800}. Numbers only; '
        "400 with a code (invalid_metric_value, empty_metric_report, ...) otherwise.",
    )
    @action(detail=True, methods=["get", "post"])
    def metrics(self, request, pk=None):
        """Business metrics of the job: what it reported (printed tagged lines, or POSTs like this one)."""
        job = self.get_object()
        if request.method == "POST":
            rows = services.business_metrics_report(job=job, data=request.data)
            return Response(BusinessMetricSerializer(rows, many=True).data, status=status.HTTP_201_CREATED)
        rows = BusinessMetric.objects.filter(job=job).order_by("at", "id")[:10000]
        return Response(BusinessMetricSerializer(rows, many=True).data)


# ----------------------------------------------------------------------------------- scheduling, usage


class CompareView(ScopedActionsMixin, APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("job", str, many=True, description="job ids (or their first 8+ characters); repeat"),
            OpenApiParameter("label", str, description="key=value: also the newest jobs with this label"),
        ],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request):
        """Compare runs: up to 20 jobs' parameters (with which differ), every TRAINYARD_METRIC series on common
        axes (the step when all reports have one, else seconds since each job's first report), final values."""
        jobs = jobs_to_compare(
            request.user, ids=request.query_params.getlist("job"), label=request.query_params.get("label", "")
        )
        if not jobs:
            raise ValidationFailed("name jobs with ?job=ID (repeat) or ?label=key=value", code="no_jobs", field="job")
        metrics = selectors.compare_metrics(jobs)
        rows = parameter_rows(jobs)
        return Response(
            {
                "jobs": [
                    {
                        "id": str(j.id),
                        "name": j.name,
                        "state": j.state,
                        "owner": j.owner.username,
                        "submitted_at": j.submitted_at,
                        "started_at": j.started_at,
                        "finished_at": j.finished_at,
                        "parameters": job_parameters(j),
                        "final_metrics": metrics.final[str(j.id)],
                        "reports": metrics.reports[str(j.id)],
                    }
                    for j in jobs
                ],
                "different_parameters": [r["name"] for r in rows if r["differs"]],
                "x_axis": "step" if metrics.step_axis else "seconds",
                "series": {
                    name: {job_id: [[x, y] for x, y in points] for job_id, points in by_job.items()}
                    for name, by_job in metrics.series.items()
                },
            }
        )


class SchedulingView(ScopedActionsMixin, APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("since", OpenApiTypes.DATETIME),
            OpenApiParameter("queue", str, description="a queue name; omit for the pool"),
        ],
        responses=SCHEDULING_SAMPLE_LIST,
    )
    def get(self, request):
        """Scheduling samples: pending and running jobs, admissions and mean wait per interval, and for the pool
        (queue null) the allocation ratio and fragmentation."""
        since = _datetime_param(request, "since") or timezone.now() - timedelta(hours=24)
        samples = selectors.scheduling_series(since=since, queue_name=request.query_params.get("queue") or None)
        return Response(
            [
                {
                    "at": s.at,
                    "queue": s.queue.name if s.queue else None,
                    "pending": s.pending,
                    "running": s.running,
                    "admissions": s.admissions,
                    "admissions_per_s": s.admissions / s.interval_s if s.interval_s else None,
                    "wait_avg_s": s.wait_avg_s,
                    "allocation_ratio": s.allocation_ratio,
                    "memory_allocation_ratio": s.memory_allocation_ratio,
                    "fragmentation": s.fragmentation,
                }
                for s in samples
            ]
        )


class UsageCSVRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"
    COLUMNS = [
        "day",
        "team",
        "user",
        "spec",
        "gpu_model",
        "gpu_hours",
        "gpu_hours_used",
        "gpu_hours_unmeasured",
        "jobs",
    ]

    def render(self, data, accepted_media_type=None, renderer_context=None):
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        if isinstance(data, dict) and "rows" in data:
            writer.writerow(self.COLUMNS)
            for row in data["rows"]:
                writer.writerow([row[c] for c in self.COLUMNS])
        else:
            writer.writerow(["code", "detail"])
            writer.writerow(
                [data.get("code", "error"), data.get("detail", "")] if isinstance(data, dict) else ["error", str(data)]
            )
        return out.getvalue().encode()


class UsageView(ScopedActionsMixin, APIView):
    renderer_classes = [JSONRenderer, UsageCSVRenderer]

    @extend_schema(
        parameters=[
            OpenApiParameter("from", OpenApiTypes.DATE, description="first day (UTC), default: the 1st of this month"),
            OpenApiParameter("to", OpenApiTypes.DATE, description="last day, inclusive; default: today"),
            OpenApiParameter("team", str),
            OpenApiParameter("user", str),
            OpenApiParameter("format", str, enum=["json", "csv"]),
        ],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request):
        """GPU-hours per day, team, user, spec and card model, for chargeback (admins see every team, members
        their own teams). A slice counts compute_milli/1000 GPUs for as long as the pool's ledger says it was held
        (`gpu_hours`, the request); `gpu_hours_used` is what its cards' measured utilization says was used, and
        `gpu_hours_unmeasured` the held hours nothing measured (docs/rightsizing.md)."""
        today = timezone.now().date()
        start = _date_param(request, "from") or today.replace(day=1)
        end = _date_param(request, "to") or today
        rows = selectors.usage_report(
            user=request.user,
            start=start,
            end=end,
            team=request.query_params.get("team") or None,
            username=request.query_params.get("user") or None,
        )
        data = [
            {
                "day": r.day.isoformat(),
                "team": r.team,
                "user": r.user,
                "spec": r.spec,
                "gpu_model": r.gpu_model,
                "gpu_hours": round(r.gpu_hours, 4),
                "gpu_hours_used": round(r.gpu_hours_used, 4),
                "gpu_hours_unmeasured": round(r.gpu_hours_unmeasured, 4),
                "jobs": r.jobs,
            }
            for r in rows
        ]
        by_team: dict[str, float] = {}
        by_spec: dict[str, float] = {}
        for r in rows:
            by_team[r.team] = by_team.get(r.team, 0.0) + r.gpu_hours
            by_spec[r.spec] = by_spec.get(r.spec, 0.0) + r.gpu_hours
        body = {
            "from": start.isoformat(),
            "to": end.isoformat(),
            "rows": data,
            "totals": {
                "gpu_hours": round(sum(r.gpu_hours for r in rows), 4),
                "gpu_hours_used": round(sum(r.gpu_hours_used for r in rows), 4),
                "gpu_hours_unmeasured": round(sum(r.gpu_hours_unmeasured for r in rows), 4),
                "by_team": {k: round(v, 4) for k, v in sorted(by_team.items())},
                "by_spec": {k: round(v, 4) for k, v in sorted(by_spec.items())},
            },
            "teams": None
            if request.user.is_staff
            else sorted(visible_teams(request.user).values_list("slug", flat=True)),
        }
        response = Response(body)
        if getattr(request.accepted_renderer, "format", "") == "csv":
            response["Content-Disposition"] = f'attachment; filename="trainyard-usage-{start}-{end}.csv"'
        return response


# ------------------------------------------------------------------------------------- notifications


class NotificationSerializer(ModelSerializer):
    level = serializers.CharField(source="alert.level")
    alert_state = serializers.CharField(source="alert.state")

    class Meta:
        model = Notification
        fields = ["id", "alert", "level", "alert_state", "message", "created_at", "read_at"]
        read_only_fields = fields


class NotificationViewSet(ScopedActionsMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    """The signed-in user's in-app notifications (what alert rules with `notify` sent them)."""

    token_scope = "submit"

    serializer_class = NotificationSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Notification.objects.none()
        qs = Notification.objects.filter(user=self.request.user).select_related("alert")
        if self.request.query_params.get("unread") in {"1", "true"}:
            qs = qs.filter(read_at__isnull=True)
        return qs[:200]

    @extend_schema(request=None, responses=NotificationSerializer)
    @action(detail=True, methods=["post"])
    def read(self, request, pk=None):
        note = services.notification_mark_read(notification_id=_pk(pk), user=request.user)
        return Response(NotificationSerializer(note).data)


class PushSettingsSerializer(serializers.Serializer):
    webhook_url = serializers.CharField(allow_blank=True, required=False)
    webhook_secret = serializers.CharField(
        allow_blank=True, required=False, write_only=True, help_text="HMAC-SHA256 key; never shown again"
    )
    has_secret = serializers.SerializerMethodField()
    email = serializers.CharField(allow_blank=True, required=False)
    updated_at = serializers.DateTimeField(read_only=True, allow_null=True)

    def get_has_secret(self, row) -> bool:
        return bool(getattr(row, "webhook_secret", ""))


class PushSettingsInput(RejectUnknownFieldsMixin, serializers.Serializer):
    webhook_url = serializers.CharField(allow_blank=True, required=False, max_length=600)
    webhook_secret = serializers.CharField(allow_blank=True, required=False, max_length=600, trim_whitespace=False)
    email = serializers.CharField(allow_blank=True, required=False, max_length=300)


class PushSettingsView(ScopedActionsMixin, APIView):
    """Where the signed-in user's failed attempts are pushed besides the portal: a webhook (its body signed with
    HMAC-SHA256, `X-Trainyard-Signature: sha256=<hex of HMAC(secret, "<timestamp>.<body>")>` and
    `X-Trainyard-Timestamp`) and/or an email address. PUT or PATCH any of the fields; an empty URL turns the webhook
    off. 400 `invalid_webhook_url`, `invalid_webhook_secret`, `invalid_email`."""

    token_scope = "submit"
    serializer_class = PushSettingsSerializer

    def _current(self, request):
        return PushSettings.objects.filter(user=request.user).first() or PushSettings(user=request.user)

    @extend_schema(responses=PushSettingsSerializer)
    def get(self, request):
        return Response(PushSettingsSerializer(self._current(request)).data)

    @extend_schema(request=PushSettingsInput, responses=PushSettingsSerializer)
    def put(self, request):
        data = PushSettingsInput(data=request.data)
        data.is_valid(raise_exception=True)
        saved = services.push_settings_save(user=request.user, data=data.validated_data)
        return Response(PushSettingsSerializer(saved).data)

    @extend_schema(request=PushSettingsInput, responses=PushSettingsSerializer)
    def patch(self, request):
        return self.put(request)


# ----------------------------------------------------------------------------------------- helpers


def _pk(raw) -> int:
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise ValidationFailed("not an id", code="invalid_parameter")


def _datetime_param(request, name: str) -> datetime | None:
    raw = request.query_params.get(name)
    if not raw:
        return None
    try:  # a well-formed but impossible date (2025-02-30, 0000-00-00) raises instead of returning None
        value = parse_datetime(raw)
        day = parse_date(raw) if value is None else None
    except ValueError:
        value = day = None
    if value is None:
        if day is None:
            raise ValidationFailed(f"{name} must be an ISO 8601 date or time", code="invalid_datetime", field=name)
        value = datetime(day.year, day.month, day.day)
    return value if timezone.is_aware(value) else value.replace(tzinfo=UTC)


def _date_param(request, name: str) -> date | None:
    raw = request.query_params.get(name)
    if not raw:
        return None
    try:
        value = parse_date(raw)
    except ValueError:
        value = None
    if value is None:
        raise ValidationFailed(f"{name} must be a date like 2025-01-31", code="invalid_date", field=name)
    return value
