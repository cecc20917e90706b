"""Experiments over REST: create, list, detail (best trial, recommendation), pause/resume/cancel, the trials table
(sortable, CSV), the learning curves, and "run the best again"."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpResponse
from django.urls import reverse
from django.utils.http import urlencode
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from experiments import selectors, services
from experiments.models import Experiment, Trial
from jobs.api import JobDetailSerializer
from kernel.api import ModelSerializer, RejectUnknownFieldsMixin
from kernel.errors import ValidationFailed
from quotas.tokens import ScopedActionsMixin

MAX_COMPARED = 20


class ExperimentCreateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    name = serializers.CharField(max_length=120)
    team = serializers.SlugField()
    template = serializers.JSONField(
        help_text="the trial's job, as POST /api/v1/jobs/ takes it (without team); {{name}} in its command, args, "
        "env values or name is replaced by the trial's value of parameter `name` ({{max_steps}}: the searcher's)"
    )
    space = serializers.JSONField(
        help_text='parameter -> {"type": "log_uniform"|"float"|"int", "min", "max"} or '
        '{"type": "categorical", "values": [...]} (a bare list is a categorical)'
    )
    searcher = serializers.JSONField(
        required=False,
        help_text='"grid", "random" (default) or {"name": "adaptive", "max_steps", "min_steps", "reduction", "seed"}',
    )
    metric = serializers.CharField(max_length=64, help_text="the reported metric to optimize (TRAINYARD_METRIC key)")
    direction = serializers.ChoiceField(choices=Experiment.Direction.choices, required=False)
    max_trials = serializers.IntegerField(required=False, min_value=1, max_value=services.MAX_TRIALS)
    max_concurrent = serializers.IntegerField(required=False, min_value=1, max_value=services.MAX_TRIALS)
    rightsize = serializers.ChoiceField(choices=[("advise", "advise"), ("apply", "apply")], required=False)


class ExperimentSerializer(ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    owner = serializers.SlugRelatedField(slug_field="username", read_only=True)
    summary = serializers.SerializerMethodField()

    class Meta:
        model = Experiment
        fields = [
            "id", "name", "team", "owner", "state", "message", "searcher", "searcher_config", "seed", "metric",
            "direction", "max_trials", "max_concurrent", "space", "template", "code_digest", "rightsize",
            "recommendation", "created_at", "finished_at", "summary",
        ]  # fmt: skip
        read_only_fields = fields

    def get_summary(self, experiment) -> dict:
        trials = self.context.get("trials")
        if trials is None:
            trials = list(experiment.trials.all())
        return selectors.summary(experiment, trials)


class TrialSerializer(serializers.Serializer):
    number = serializers.IntegerField()
    state = serializers.ChoiceField(choices=Trial.State.choices)
    job = serializers.UUIDField()
    job_state = serializers.CharField()
    job_reason = serializers.CharField()
    params = serializers.DictField()
    best_value = serializers.FloatField(allow_null=True)
    best_step = serializers.IntegerField(allow_null=True)
    last_value = serializers.FloatField(allow_null=True)
    last_step = serializers.IntegerField(allow_null=True)
    rungs = serializers.DictField(child=serializers.FloatField())
    gpu_seconds = serializers.FloatField()
    earlier_jobs = serializers.ListField(child=serializers.UUIDField())


class CurveSerializer(serializers.Serializer):
    number = serializers.IntegerField()
    state = serializers.CharField()
    points = serializers.ListField(child=serializers.ListField(child=serializers.FloatField()))


class RerunSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    max_steps = serializers.IntegerField(
        required=False, min_value=1, help_text="replaces {{max_steps}} in the template"
    )


class ExperimentFilter(filters.FilterSet):
    team = filters.CharFilter(field_name="team__slug")
    state = filters.MultipleChoiceFilter(choices=Experiment.State.choices)

    class Meta:
        model = Experiment
        fields = ["team", "state"]


SORT = OpenApiParameter(
    "sort", str, required=False, description="a column (number, state, best_value, last_value, last_step, "
    "gpu_seconds; `metric` = best_value) or a parameter name; `-` first for descending",
)  # fmt: skip


class ExperimentViewSet(ScopedActionsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = ExperimentSerializer
    filterset_class = ExperimentFilter
    pagination_class = None
    lookup_value_regex = "[0-9a-f-]{36}"
    token_scope = "submit"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Experiment.objects.none()
        return selectors.experiments_visible_to(self.request.user)

    @extend_schema(request=ExperimentCreateSerializer, responses={201: ExperimentSerializer})
    def create(self, request):
        """Start an experiment: trials are submitted as jobs by the periodic pass, at most max_concurrent at once."""
        payload = ExperimentCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        with transaction.atomic(durable=True):
            experiment = services.experiment_create(user=request.user, data=dict(request.data))
        return Response(ExperimentSerializer(experiment).data, status=status.HTTP_201_CREATED)

    def _command(self, fn):
        experiment = self.get_object()
        with transaction.atomic(durable=True):
            experiment = fn(experiment_id=experiment.id, actor=self.request.user.username)
        return Response(ExperimentSerializer(experiment).data)

    @extend_schema(request=None, responses=ExperimentSerializer)
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        """Stop the active trials (checkpoints kept) and submit no new ones (409 once it ended)."""
        return self._command(services.experiment_pause)

    @extend_schema(request=None, responses=ExperimentSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        """Resubmit the paused trials from their latest checkpoints and go on searching."""
        return self._command(services.experiment_resume)

    @extend_schema(request=None, responses=ExperimentSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel the active trials and end the experiment; results so far stay."""
        return self._command(services.experiment_cancel)

    @extend_schema(parameters=[SORT], responses=TrialSerializer(many=True))
    @action(detail=True, methods=["get"])
    def trials(self, request, pk=None):
        """The trials with their parameters and metric, sorted by `sort`."""
        experiment = self.get_object()
        trials = _sorted(experiment, request)
        return Response([selectors.trial_row(experiment, t) for t in trials])

    @extend_schema(parameters=[SORT], responses={(200, "text/csv"): OpenApiTypes.STR})
    @action(detail=True, methods=["get"], url_path="trials/csv")
    def trials_csv(self, request, pk=None):
        """The trials table as CSV (one row per trial, one column per parameter)."""
        experiment = self.get_object()
        response = HttpResponse(selectors.trials_csv(experiment, _sorted(experiment, request)),
                                content_type="text/csv; charset=utf-8")  # fmt: skip
        response["Content-Disposition"] = f'attachment; filename="experiment-{str(experiment.id)[:8]}-trials.csv"'
        return response

    @extend_schema(responses=CurveSerializer(many=True))
    @action(detail=True, methods=["get"])
    def curves(self, request, pk=None):
        """Each trial's learning curve of the searched metric: [[step, value], ...]."""
        experiment = self.get_object()
        return Response(
            [{"number": t.number, "state": t.state, "points": t.curve} for t in selectors.trials_of(experiment)]
        )

    @extend_schema(
        parameters=[OpenApiParameter("best", int, required=False, description="how many (default 5, at most 20)")],
        responses={200: OpenApiTypes.OBJECT},
    )
    @action(detail=True, methods=["get"])
    def compare(self, request, pk=None):
        """The best N trials' jobs and the address of the compare page showing them side by side."""
        experiment = self.get_object()
        n = _best_n(request.query_params.get("best"))
        best = _best(experiment, n)
        jobs = [str(t.job_id) for t in best]
        url = reverse("frontend:job-compare") + "?" + urlencode([("job", j) for j in jobs])
        return Response({"trials": [t.number for t in best], "jobs": jobs, "compare_url": url})

    @extend_schema(request=RerunSerializer, responses={201: JobDetailSerializer})
    @action(detail=True, methods=["post"], url_path="rerun-best")
    def rerun_best(self, request, pk=None):
        """Submit the best trial's parameters again as a new job, optionally with more steps."""
        experiment = self.get_object()
        payload = RerunSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        with transaction.atomic(durable=True):
            job = services.experiment_rerun_best(
                experiment_id=experiment.id, user=request.user, max_steps=payload.validated_data.get("max_steps")
            )
        return Response(JobDetailSerializer(job).data, status=status.HTTP_201_CREATED)


def _sorted(experiment: Experiment, request) -> list[Trial]:
    key = request.query_params.get("sort", "number")
    if key.lstrip("-") not in (*selectors.sort_keys(experiment), "metric"):
        raise ValidationFailed(
            f"sort by one of {', '.join(selectors.sort_keys(experiment))} (or metric)", code="invalid_sort",
            field="sort",
        )  # fmt: skip
    return selectors.sort_trials(experiment, selectors.trials_of(experiment), key)


def _best_n(raw) -> int:
    if raw in (None, ""):
        return 5
    try:
        n = int(raw)
    except (TypeError, ValueError):
        n = 0
    if not 1 <= n <= MAX_COMPARED:
        raise ValidationFailed(f"best is 1..{MAX_COMPARED}", code="invalid_best", field="best")
    return n


def _best(experiment: Experiment, n: int) -> list[Trial]:
    trials = [t for t in selectors.trials_of(experiment) if t.best_value is not None]
    key = "best_value" if experiment.direction == "minimize" else "-best_value"
    return selectors.sort_trials(experiment, trials, key)[:n]
