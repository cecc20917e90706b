"""Jobs over REST: submit (with Idempotency-Key), batch submit, list/filter, detail, cancel, retry,
reproduce, events, attempts, logs and log search; job templates (list, create, edit, delete, submit)."""

import functools
import re
import threading
import uuid

from django.contrib.auth import get_user_model
from django.db import models, transaction
from django.db.models import Subquery
from django.utils import timezone
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import BaseParser
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import lifecycle, logstore, selectors, services, signals
from jobs.models import Attempt, Checkpoint, Dataset, Job, JobEvent, JobTemplate
from jobs.states import JobState
from kernel.api import ModelSerializer, NewestFirstCursor, RejectUnknownFieldsMixin, int_param
from kernel.errors import (
    OUTAGE_RETRY_AFTER_S,
    NotFound,
    OutageAfterWrite,
    ValidationErrors,
    ValidationFailed,
    outage_code,
)
from kernel.units import parse_duration
from quotas import selectors as quota_selectors
from quotas.models import Queue, ResourceSpec, Team
from quotas.tokens import ScopedActionsMixin


@extend_schema_field(
    {
        "oneOf": [{"type": "integer"}, {"type": "string"}],
        "description": "seconds, or a duration such as 4h, 30m, 1h30m",
        "example": "4h",
    }
)
class DurationField(serializers.Field):
    """Seconds as a number, or a human duration (`4h`, `30m`, `1h30m`)."""

    def to_internal_value(self, data):
        try:
            return parse_duration(data, field=self.field_name, default=None)
        except ValidationFailed as exc:
            raise serializers.ValidationError(exc.detail, code="invalid") from None

    def to_representation(self, value):
        return value


SHORT_ID = re.compile(r"^[0-9a-f][0-9a-f-]{7,35}\Z")


class JobSubmitSerializer(serializers.Serializer):
    rejects_unknown_fields = True  # validate() answers an undeclared key with 400 unknown_field
    name = serializers.CharField(max_length=120, required=False)
    team = serializers.SlugField()
    queue = serializers.CharField(max_length=50)
    spec = serializers.CharField(max_length=50, required=False)
    gpus = serializers.IntegerField(required=False, min_value=1, max_value=16, help_text="guaranteed tier only")
    gpu_milli = serializers.IntegerField(required=False, help_text="explicit request, where the queue allows")
    gpu_memory_mib = serializers.IntegerField(required=False)
    cpu_milli = serializers.IntegerField(
        required=False, min_value=1, help_text="explicit request: host CPU per replica"
    )
    memory_mib = serializers.IntegerField(
        required=False, min_value=1, help_text="explicit request: host memory per replica"
    )
    replicas = serializers.IntegerField(required=False, min_value=1, max_value=64)
    image = serializers.CharField(max_length=300, help_text="a catalog image name or registry/repo:tag[@digest]")
    command = serializers.JSONField(help_text="argv list, or one shell-like string")
    args = serializers.ListField(child=serializers.CharField(), required=False)
    env = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)
    working_dir = serializers.CharField(max_length=500, required=False, allow_blank=True)
    priority = serializers.IntegerField(required=False, min_value=-100, max_value=100)
    preemptible = serializers.BooleanField(
        required=False,
        help_text="run on idle capacity beyond the queue's quota; the job is stopped (SIGTERM, "
        "TRAINYARD_PREEMPT_NOTICE seconds, a final checkpoint) and requeued when quota-holding work needs the cards",
    )
    timeout_s = DurationField(required=False, allow_null=True)
    max_retries = serializers.IntegerField(required=False)
    tensorboard = serializers.BooleanField(required=False)
    tensorboard_logdir = serializers.CharField(max_length=500, required=False, allow_blank=True)
    mounts = serializers.ListField(child=serializers.DictField(), required=False)
    datasets = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        help_text="registered datasets, mounted read-only: [{name, version (default: latest), path}]",
    )
    watch = serializers.ListField(
        required=False,
        help_text="log texts that raise an alert on the job when a line holds one (case folded), at most 8: "
        '[{"pattern": "nan loss", "level": "critical"}]',
    )
    code = serializers.CharField(
        max_length=71,
        required=False,
        allow_blank=True,
        help_text="a code snapshot of the team (sha256:…, uploaded with PUT /api/v1/code/{digest}/): the job's "
        "working directory starts as a copy of it",
    )
    labels = serializers.DictField(child=serializers.CharField(), required=False)
    gpu_models = serializers.ListField(
        child=serializers.CharField(max_length=100),
        required=False,
        max_length=16,
        help_text="GPU models or families the job may run on (e.g. A100-SXM4-80GB, H100); empty = any",
    )
    ci = serializers.DictField(required=False, help_text="whatever the pipeline passes, e.g. git commit")
    resume_from = serializers.UUIDField(
        required=False, help_text="a job of the same team: its latest checkpoint is restored before the command"
    )

    def validate(self, attrs):
        unknown = set(self.initial_data) - set(self.fields) if isinstance(self.initial_data, dict) else set()
        if unknown:
            raise serializers.ValidationError(
                {name: [serializers.ErrorDetail("unknown field", code="unknown_field")] for name in sorted(unknown)}
            )
        return attrs


def _flatten(field: str, errors) -> list[ValidationFailed]:
    """A serializer's errors for one field (lists, or a dict for a mapping's items) as domain errors."""
    if isinstance(errors, dict):
        return [e for key, sub in errors.items() for e in _flatten(field, sub)]
    if isinstance(errors, list):
        return [e for sub in errors for e in _flatten(field, sub)]
    return [ValidationFailed(str(errors), code=getattr(errors, "code", "invalid") or "invalid", field=field)]


_checkers = threading.local()


def _submit_checker(data) -> JobSubmitSerializer:
    """A JobSubmitSerializer for `data`, made once per thread and given each submission's data afresh.

    DRF deep-copies a serializer's declared fields for every instance: 36 fields made anew, ~0.5 ms of the web
    process's CPU per submission (a twentieth of it, bench/submit.py). This one only checks input: its fields keep
    no state between validations, and what one validation leaves (its data, errors) is dropped before the next."""
    payload = getattr(_checkers, "submit", None)
    if payload is None:
        payload = _checkers.submit = JobSubmitSerializer(data=data)
        return payload
    payload.initial_data = data
    for name in ("_validated_data", "_errors", "_data"):
        payload.__dict__.pop(name, None)
    return payload


def submission_check(*, user, data: dict) -> None:
    """Every problem of a submission at once, in the form's order: the input serializer's (types, sizes) and
    the service's (queue, spec, quota, image, env...) for the fields the serializer passed. Raises
    ValidationErrors / ValidationFailed (400) or NotFound (the team); returns when the serializer is content
    (the service then checks the rest as it submits)."""
    payload = _submit_checker(data)
    if payload.is_valid():
        return
    problems = [e for field, errs in payload.errors.items() for e in _flatten(field, errs)]
    if not isinstance(data, dict):
        raise ValidationErrors(problems) if len(problems) > 1 else problems[0]
    rest = {k: v for k, v in data.items() if k not in payload.errors}
    try:
        services.job_validate(user=user, data=rest)
    except NotFound:
        if "team" not in payload.errors:
            raise
    except ValidationFailed as exc:
        problems += [e for e in getattr(exc, "errors", None) or [exc] if e.field not in payload.errors]
    problems.sort(key=lambda e: services.field_rank(e.field))
    raise ValidationErrors(problems) if len(problems) > 1 else problems[0]


class JobSerializer(ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    team = serializers.CharField(source="team.slug")
    queue = serializers.CharField(source="queue.name")
    spec = serializers.CharField(source="spec.name", default=None)
    queue_position = serializers.IntegerField(
        allow_null=True, help_text="a waiting job's place in its queue's line (1: next), computed when read"
    )
    links = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = [
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
            "gpu_count",
            "gpu_milli",
            "gpu_memory_mib",
            "cpu_milli",
            "memory_mib",
            "exclusive",
            "replicas",
            "gpu_models",
            "image_reference",
            "image_digest",
            "command",
            "args",
            "env",
            "working_dir",
            "priority",
            "preemptible",
            "timeout_s",
            "max_retries",
            "retries_used",
            "tensorboard",
            "labels",
            "ci",
            "exit_code",
            "failure_class",
            "suggestion",
            "idempotency_key",
            "reproduced_from",
            "submitted_at",
            "admitted_at",
            "started_at",
            "finished_at",
            "deadline",
            "links",
        ]
        read_only_fields = fields

    def get_links(self, job) -> dict:
        return _links(job)

    def to_representation(self, job):
        # The same output as DRF's field-by-field path (a test compares the two for jobs in every shape), built
        # from a per-class plan: DRF copies every declared field per serializer and walks them per row, which cost
        # ~0.3 ms a job, most of a 50-job list page's time (bench/api.py).
        return {name: get(job) for name, get in _plan(type(self))}


def _links(job) -> dict:
    base = f"/api/v1/jobs/{job.id}/"
    return {
        "self": base,
        "events": base + "events/",
        "attempts": base + "attempts/",
        "logs": base + "logs/",
        "page": f"/jobs/{job.id}/",
    }


def _estimated_start(job):
    if job.state != JobState.PENDING:
        return None
    estimate = selectors.estimated_start(job)
    return estimate.as_dict() if estimate is not None else None


def _store_wait(job):
    wait = selectors.store_wait(job)
    return {k: _iso(v) if k != "total_wait_s" else v for k, v in wait.items()} if wait is not None else None


def _iso(value):
    if value is None:
        return None
    text = timezone.localtime(value).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _getter(name: str, convert=None):
    if convert is None:
        return lambda job: getattr(job, name)
    return lambda job: convert(getattr(job, name))


@functools.cache
def _plan(serializer_class) -> tuple:
    model_fields = {f.name: f for f in Job._meta.concrete_fields}
    special = {
        "owner": lambda job: job.owner.username,
        "team": lambda job: job.team.slug,
        "queue": lambda job: job.queue.name,
        "spec": lambda job: job.spec.name if job.spec_id is not None else None,
        "links": _links,
        "queue_position": lambda job: job.queue_position,
        "recommendation": lambda job: getattr(job, "recommendation", None),
        "estimated_start": _estimated_start,
        "store_wait": _store_wait,
    }
    plan = []
    for name in serializer_class.Meta.fields:
        if name in special:
            plan.append((name, special[name]))
            continue
        field = model_fields[name]
        if isinstance(field, models.DateTimeField):
            plan.append((name, _getter(name, _iso)))
        elif isinstance(field, models.ForeignKey):
            plan.append((name, _getter(field.attname, lambda v: None if v is None else str(v))))
        elif isinstance(field, models.UUIDField):
            plan.append((name, _getter(name, str)))
        else:
            plan.append((name, _getter(name)))
    return tuple(plan)


class JobDetailSerializer(JobSerializer):
    class Meta(JobSerializer.Meta):
        fields = [
            *JobSerializer.Meta.fields,
            "reproduce",
            "excluded_gpus",
            "mounts",
            "datasets",
            "code_digest",
            "watch",
            "tensorboard_logdir",
        ]
        read_only_fields = fields


class JobShownSerializer(JobDetailSerializer):
    """`GET jobs/{id}/`: the job, and for a waiting one when it may start (the estimate its page shows)."""

    estimated_start = serializers.SerializerMethodField()

    store_wait = serializers.SerializerMethodField()

    class Meta(JobDetailSerializer.Meta):
        fields = [*JobDetailSerializer.Meta.fields, "estimated_start", "store_wait"]
        read_only_fields = fields

    @extend_schema_field(
        {
            "type": "object",
            "nullable": True,
            "description": "since, next_try_at, gives_up_at (times) and total_wait_s: its retries wait for the object "
            "store without using max_retries until gives_up_at; null unless it waits",
        }
    )
    def get_store_wait(self, job):
        return _store_wait(job)

    @extend_schema_field(
        {
            "type": "object",
            "nullable": True,
            "description": "low_s, mid_s, high_s (seconds from now) and known, as on GET queues/{name}/; null "
            "unless the job waits",
        }
    )
    def get_estimated_start(self, job):
        return _estimated_start(job)


class JobSubmittedSerializer(JobDetailSerializer):
    """A submitted job, with what earlier runs like it suggest (advice only; the request stands as asked)."""

    recommendation = serializers.SerializerMethodField()

    class Meta(JobDetailSerializer.Meta):
        fields = [*JobDetailSerializer.Meta.fields, "recommendation"]
        read_only_fields = fields

    @extend_schema_field(
        {"type": "object", "nullable": True, "description": "docs/rightsizing.md; null without evidence"}
    )
    def get_recommendation(self, job):
        return getattr(job, "recommendation", None)


class AttemptSerializer(ModelSerializer):
    node = serializers.CharField(source="node.name", default=None)

    class Meta:
        model = Attempt
        fields = [
            "number",
            "state",
            "backend",
            "backend_ref",
            "node",
            "placement",
            "started_at",
            "ended_at",
            "exit_code",
            "signal",
            "failure_class",
            "reaction",
            "reason",
            "rule",
        ]
        read_only_fields = fields


class EventSerializer(ModelSerializer):
    attempt = serializers.IntegerField(source="attempt.number", default=None, allow_null=True)

    class Meta:
        model = JobEvent
        fields = ["id", "at", "kind", "from_state", "to_state", "level", "message", "data", "actor", "attempt"]
        read_only_fields = fields


def _id_of(model, **unique) -> Subquery:
    """The id of the one row with this unique value, as a scalar subquery (NULL, so nothing matches, if none):
    filtering a foreign key by it lets the planner walk the key's newest-first index, where a join on the name
    made it collect and sort every matching job (bench/api.py measures this)."""
    return Subquery(model.objects.filter(**unique).order_by().values("pk")[:1])


class ResumeSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    resume = serializers.BooleanField(required=False, help_text="restore the original job's latest checkpoint")


def _resume_flag(request, *, default: bool) -> bool:
    payload = ResumeSerializer(data=request.data if isinstance(request.data, dict) else {})
    payload.is_valid(raise_exception=True)
    return payload.validated_data.get("resume", default)


class CheckpointSerializer(ModelSerializer):
    attempt = serializers.IntegerField(source="attempt.number")
    download_url = serializers.SerializerMethodField()

    class Meta:
        model = Checkpoint
        fields = ["id", "name", "step", "size_bytes", "saved_at", "attempt", "sha256", "bucket", "key", "files",
                  "download_url"]  # fmt: skip

    def get_download_url(self, checkpoint) -> str:
        return f"/api/v1/jobs/{checkpoint.job_id}/checkpoints/{checkpoint.id}/download/"


class JobFilter(filters.FilterSet):
    team = filters.CharFilter(method="filter_team", help_text="team slug")
    owner = filters.CharFilter(method="filter_owner", help_text="user name")
    # distinct=False: a job's own column cannot repeat rows, and SELECT DISTINCT over every column made the database
    # collect and compare all matching jobs instead of stopping at the page (bench/api.py measures this).
    state = filters.MultipleChoiceFilter(choices=JobState.choices, distinct=False)
    queue = filters.CharFilter(method="filter_queue", help_text="queue name")
    spec = filters.CharFilter(method="filter_spec", help_text="spec name")
    label = filters.CharFilter(method="filter_label", help_text="key=value")
    id_prefix = filters.CharFilter(
        method="filter_id_prefix", help_text="the first 8 or more characters of a job id, as the portal shows them"
    )
    submitted_after = filters.IsoDateTimeFilter(field_name="submitted_at", lookup_expr="gte")
    submitted_before = filters.IsoDateTimeFilter(field_name="submitted_at", lookup_expr="lt")

    class Meta:
        model = Job
        fields = []

    def filter_team(self, queryset, name, value):
        return queryset.filter(team_id=_id_of(Team, slug=value))

    def filter_owner(self, queryset, name, value):
        return queryset.filter(owner_id=_id_of(get_user_model(), username=value))

    def filter_queue(self, queryset, name, value):
        return queryset.filter(queue_id=_id_of(Queue, name=value))

    def filter_spec(self, queryset, name, value):
        return queryset.filter(spec_id=_id_of(ResourceSpec, name=value))

    def filter_label(self, queryset, name, value):
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise ValidationFailed("label filter must be key=value", code="invalid_label_filter", field="label")
        return queryset.filter(labels__contains={key: val})

    def filter_id_prefix(self, queryset, name, value):
        prefix = value.strip().lower()
        if not SHORT_ID.match(prefix):
            raise ValidationFailed(
                "id_prefix must be 8 to 36 characters of a job id (hex digits and dashes)",
                code="invalid_id_prefix",
                field="id_prefix",
            )
        # A prefix of the canonical text is a range of ids: the primary key's index answers it, whatever the rows.
        template = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
        if any((c == "-") != (t == "-") for c, t in zip(prefix, template, strict=False)):
            return queryset.none()  # dashes where no job id has them: nothing starts so
        rest = template[len(prefix) :]
        low = uuid.UUID(prefix + rest.replace("x", "0"))
        high = uuid.UUID(prefix + rest.replace("x", "f"))
        return queryset.filter(id__gte=low, id__lte=high)


class BatchSubmitSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    jobs = serializers.ListField(child=serializers.DictField(), min_length=1, max_length=200)


class JobViewSet(ScopedActionsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = JobSerializer
    filterset_class = JobFilter
    pagination_class = NewestFirstCursor
    lookup_value_regex = "[0-9a-f-]{36}"
    token_scope = "submit"  # submit, batch, cancel, retry, reproduce

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Job.objects.none()
        return selectors.jobs_visible_to(self.request.user)

    def get_serializer_class(self):
        return JobShownSerializer if self.action == "retrieve" else JobSerializer

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        # The waiting jobs' places (computed when read) for the whole page in one query, not one per job.
        return selectors.with_positions(page) if page is not None else None

    @extend_schema(
        request=JobSubmitSerializer,
        responses={201: JobSubmittedSerializer, 200: JobSubmittedSerializer},
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                required=False,
                description="same key + same body returns the first job; a different body 409",
            )
        ],
    )
    def create(self, request):
        """Submit a job."""
        submission_check(user=request.user, data=request.data)
        key = _idempotency_key(request)
        data = _plain(request.data)
        return _submit_naming_jobs(
            lambda ids: services.job_submit(user=request.user, data=data, idempotency_key=key, job_id=ids[0]),
            _submitted_answer,
        )

    @extend_schema(
        request=BatchSubmitSerializer,
        responses={201: JobSerializer(many=True), 200: JobSerializer(many=True)},
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                str,
                OpenApiParameter.HEADER,
                required=False,
                description="yours: the same key + the same body returns the batch's jobs (200); a different body 409",
            )
        ],
    )
    @action(detail=False, methods=["post"])
    def batch(self, request):
        """Submit up to 200 jobs at once: all are validated first; if any is invalid, none is created."""
        payload = BatchSubmitSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        key = _idempotency_key(request)
        items = request.data["jobs"]
        errors = {}
        for i, item in enumerate(items):
            try:
                submission_check(user=request.user, data=item)
                services.job_validate(user=request.user, data=_plain(item))
            except (ValidationFailed, NotFound) as exc:
                # An unknown team is this item's problem like any other (the same words whether the team is missing
                # or not the user's: never a hint which), not a 404 for the whole batch.
                fields: dict[str, list[dict[str, str]]] = {}
                for one in getattr(exc, "errors", None) or [exc]:
                    fields.setdefault(one.field or "non_field_errors", []).append(
                        {"message": one.detail, "code": one.code}
                    )
                errors[str(i)] = fields
        if errors:
            first = next(iter(errors.values()))
            code = _first_code(first)
            return Response(
                {"code": code, "detail": "some jobs are invalid; none was submitted", "jobs": errors},
                status=status.HTTP_400_BAD_REQUEST,
            )
        plain = [_plain(item) for item in items]
        return _submit_naming_jobs(
            lambda ids: services.job_batch_submit(user=request.user, items=plain, idempotency_key=key, job_ids=ids),
            lambda jobs, created: Response(
                JobSerializer(_unranked(jobs), many=True).data,
                status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
            ),
            count=len(plain),
        )

    @extend_schema(request=None, responses=JobDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel a pending or running job (409 when it already finished)."""
        job = self.get_object()
        with transaction.atomic(durable=True):
            job = lifecycle.job_cancel(job_id=job.id, actor=request.user.username)
        return Response(JobDetailSerializer(job).data)

    @extend_schema(request=ResumeSerializer, responses={201: JobDetailSerializer})
    @action(detail=True, methods=["post"])
    def retry(self, request, pk=None):
        """Resubmit a finished job as a new job with the same request, resuming from its latest checkpoint
        (`{"resume": false}` starts from scratch)."""
        job = self.get_object()
        resume = _resume_flag(request, default=True)
        with transaction.atomic(durable=True):
            new = services.job_resubmit(job_id=job.id, user=request.user, resume=resume)
        return Response(JobDetailSerializer(new).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ResumeSerializer, responses={201: JobDetailSerializer})
    @action(detail=True, methods=["post"])
    def reproduce(self, request, pk=None):
        """A new job with the same pinned image digest, spec, command and env (`{"resume": true}`: starting from
        the original's latest checkpoint)."""
        job = self.get_object()
        resume = _resume_flag(request, default=False)
        with transaction.atomic(durable=True):
            new = services.job_reproduce(job_id=job.id, user=request.user, resume=resume)
        return Response(JobDetailSerializer(new).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses=CheckpointSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)
    def checkpoints(self, request, pk=None):
        """The job's checkpoints in the object store (step, size, time, attempt), newest step first."""
        from jobs.checkpoints import RESUME_ORDER

        job = self.get_object()
        rows = job.checkpoints.filter(deleted_at__isnull=True).select_related("attempt").order_by(*RESUME_ORDER)
        return Response(CheckpointSerializer(rows, many=True, context={"request": request}).data)

    @extend_schema(
        parameters=[OpenApiParameter("path", str, description="the file, for a checkpoint of several files")],
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY},
    )
    @action(detail=True, methods=["get"], url_path=r"checkpoints/(?P<checkpoint_id>\d+)/download")
    def checkpoint_download(self, request, pk=None, checkpoint_id=None):
        """Download one file of a checkpoint (streamed from the object store)."""
        from django.http import StreamingHttpResponse

        from jobs import checkpoints
        from kernel.errors import NotFound
        from kernel.objectstore import StoreError

        job = self.get_object()
        checkpoint = job.checkpoints.filter(pk=checkpoint_id, deleted_at__isnull=True).first()
        if checkpoint is None:
            raise NotFound("no such checkpoint for this job", code="unknown_checkpoint")
        try:
            entry, body = checkpoints.open_file(checkpoint, request.query_params.get("path"))
        except KeyError as exc:
            raise ValidationFailed(str(exc.args[0]), code="invalid_checkpoint_path", field="path") from None
        except StoreError as exc:
            return Response(
                {"code": "object_store_unavailable", "detail": str(exc), "retry_after": OUTAGE_RETRY_AFTER_S},
                status=503,
                headers={"Retry-After": str(OUTAGE_RETRY_AFTER_S)},
            )
        response = StreamingHttpResponse(body.iter_chunks(1024 * 1024), content_type="application/octet-stream")
        response["Content-Length"] = str(entry["size"])
        response["Content-Disposition"] = f'attachment; filename="{entry["path"].rsplit("/", 1)[-1]}"'
        response["X-Checksum-SHA256"] = entry["sha256"]
        return response

    @extend_schema(responses=EventSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)
    def events(self, request, pk=None):
        job = self.get_object()
        return Response(EventSerializer(job.events.select_related("attempt").order_by("at", "id"), many=True).data)

    @extend_schema(responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["get"], pagination_class=None)
    def usage(self, request, pk=None):
        """What each attempt used (GPU memory and utilization, CPU, host memory) next to the request, whether it
        is idle, and what earlier runs like it recommend (docs/rightsizing.md)."""
        return Response(signals.answer(signals.usage_wanted, job=self.get_object()) or {})

    @extend_schema(responses=AttemptSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)
    def attempts(self, request, pk=None):
        job = self.get_object()
        return Response(AttemptSerializer(job.attempts.select_related("node").order_by("number"), many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("attempt", int),
            OpenApiParameter("start", int, description="first line number"),
            OpenApiParameter("limit", int),
            OpenApiParameter("tail", int, description="last N lines instead"),
            OpenApiParameter(
                "stream", str, enum=["all", "stderr"], description="all (stdout and stderr merged, default) or stderr"
            ),
        ],
        responses=OpenApiTypes.OBJECT,
    )
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        """A page of an attempt's kept log lines (never the whole log at once); `stream=stderr`: its stderr alone,
        each line with its number in the merged log."""
        job = self.get_object()
        number = int_param(request, "attempt", default=job.attempts.count() or 1)
        folder = logstore.attempt_dir(str(job.id), number)
        logstore.mark_watched(str(job.id))  # `trainyard logs -f` polls here: copy this job's pod logs every pass
        tail = request.query_params.get("tail")
        stream = request.query_params.get("stream", "all")
        if stream not in ("all", "stderr"):
            raise ValidationFailed("stream is all or stderr", code="invalid_stream", field="stream")
        if stream == "stderr":
            meta = logstore.LogMeta.read(folder)
            if tail is not None:
                lines = logstore.stderr_lines(folder, tail=min(int_param(request, "tail", default=200), 5000))
            else:
                lines = logstore.stderr_lines(
                    folder,
                    start=int_param(request, "start", default=1),
                    limit=min(int_param(request, "limit", default=1000), 5000),
                )
            return Response(
                {
                    "attempt": number,
                    "stream": "stderr",
                    "lines": [{"n": ln.number, "text": ln.text} for ln in lines],
                    "next_start": lines[-1].number + 1 if lines else None,
                    "stderr_lines": meta.stderr_lines,
                    "stderr_dropped": meta.stderr_dropped,
                    "complete": meta.closed,
                }
            )
        if tail is not None:
            lines, meta = logstore.tail_lines(folder, min(int_param(request, "tail", default=200), 5000))
        else:
            lines, meta = logstore.read_lines(
                folder,
                start=int_param(request, "start", default=1),
                limit=min(int_param(request, "limit", default=1000), 5000),
            )
        return Response(
            {
                "attempt": number,
                "lines": [{"n": ln.number, "text": ln.text} for ln in lines],
                "next_start": lines[-1].number + 1 if lines else None,
                "first_kept_line": meta.first_line,
                "dropped_lines": meta.dropped_lines,
                "dropped_bytes": meta.dropped_bytes,
                "complete": meta.closed,
            }
        )

    @extend_schema(responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["get"])
    def tensorboard(self, request, pk=None):
        """The job's TensorBoard route, and a short-lived signed link to share it."""
        from jobs import tensorboard

        job = self.get_object()
        route = job.tensorboard_routes.filter(state="active").first()
        return Response(
            {
                "enabled": job.tensorboard,
                "active": route is not None,
                "url": tensorboard.route_path(job.id),
                "host": route.host if route else None,
                "signed_url": tensorboard.signed_link(job.id, route=route) if route else None,
                "expires_at": route.expires_at if route else None,
            }
        )

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    @action(detail=True, methods=["post"], url_path="tensorboard/revoke-links")
    def tensorboard_revoke_links(self, request, pk=None):
        """End every shared link to the job's TensorBoard, and the cookies they left: its route is replaced by a
        fresh one (members keep access); the answer holds a new link. 404 `tensorboard_not_running` without one."""
        from jobs import tensorboard

        job = self.get_object()
        route = tensorboard.links_revoke(job_id=job.id)
        if route is None:
            raise NotFound("TensorBoard is not running for this job", code="tensorboard_not_running")
        return Response(
            {
                "enabled": job.tensorboard,
                "active": True,
                "url": tensorboard.route_path(job.id),
                "host": route.host or None,
                "signed_url": tensorboard.signed_link(job.id, route=route),
                "expires_at": route.expires_at,
            }
        )

    @extend_schema(
        parameters=[
            OpenApiParameter("q", str, required=True),
            OpenApiParameter("attempt", int),
            OpenApiParameter("context", int),
        ],
        responses=OpenApiTypes.OBJECT,
    )
    @action(detail=True, methods=["get"], url_path="logs/search")
    def log_search(self, request, pk=None):
        """Keyword search over an attempt's log, with line numbers and context."""
        job = self.get_object()
        query = request.query_params.get("q", "").strip()
        if not query:
            raise ValidationFailed("give a keyword with ?q=", code="empty_query", field="q")
        number = int_param(request, "attempt", default=job.attempts.count() or 1)
        context = min(int_param(request, "context", default=2), 10)
        hits = list(logstore.search(logstore.attempt_dir(str(job.id), number), query, context=context))
        return Response({"attempt": number, "query": query, "hits": hits, "count": len(hits)})


# ------------------------------------------------------------------------------------------- templates


class JobTemplateSerializer(ModelSerializer):
    team = serializers.CharField(source="team.slug")
    created_by = serializers.CharField(source="created_by.username", default=None)
    job = serializers.JSONField(source="body")

    class Meta:
        model = JobTemplate
        fields = ["id", "team", "name", "description", "job", "created_by", "updated_by", "created_at", "updated_at"]
        read_only_fields = fields


class JobTemplateCreateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    team = serializers.SlugField()
    name = serializers.CharField(max_length=80)
    description = serializers.CharField(max_length=300, required=False, allow_blank=True)
    job = serializers.DictField(help_text="submission fields as in POST /api/v1/jobs/, without team")


class JobTemplateUpdateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    name = serializers.CharField(max_length=80, required=False)
    description = serializers.CharField(max_length=300, required=False, allow_blank=True)
    job = serializers.DictField(required=False, help_text="replaces the template's whole job")


class JobTemplateFilter(filters.FilterSet):
    team = filters.CharFilter(field_name="team__slug", help_text="team slug")
    name = filters.CharFilter(field_name="name", help_text="template name")

    class Meta:
        model = JobTemplate
        fields = []


class JobTemplateViewSet(ScopedActionsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """A team's saved submissions: any member may list and submit them; their author and the team's
    maintainers may edit or delete them."""

    serializer_class = JobTemplateSerializer
    filterset_class = JobTemplateFilter
    pagination_class = None
    lookup_value_regex = "[0-9]{1,9}"  # wider would overflow the integer key (a 500, not a 404)
    token_scope = "submit"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return JobTemplate.objects.none()
        teams = quota_selectors.visible_teams(self.request.user)
        return JobTemplate.objects.filter(team__in=teams).select_related("team", "created_by").order_by("team", "name")

    @extend_schema(request=JobTemplateCreateSerializer, responses={201: JobTemplateSerializer})
    def create(self, request):
        """Save a template; its job is checked like a submission (400 with the submission's codes)."""
        payload = JobTemplateCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        with transaction.atomic(durable=True):
            template = services.template_create(
                user=request.user,
                team_slug=data["team"],
                name=data["name"],
                body=request.data.get("job"),
                description=data.get("description", ""),
            )
        return Response(JobTemplateSerializer(template).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=JobTemplateUpdateSerializer, responses=JobTemplateSerializer)
    def partial_update(self, request, pk=None):
        """Rename, describe or replace the job of a template (its author or a maintainer of the team)."""
        self.get_object()
        payload = JobTemplateUpdateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        with transaction.atomic(durable=True):
            template = services.template_update(
                user=request.user,
                template_id=int(pk),
                name=data.get("name"),
                body=request.data.get("job") if "job" in data else None,
                description=data.get("description"),
            )
        return Response(JobTemplateSerializer(template).data)

    @extend_schema(responses={204: None})
    def destroy(self, request, pk=None):
        self.get_object()
        with transaction.atomic(durable=True):
            services.template_delete(user=request.user, template_id=int(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request=OpenApiTypes.OBJECT,
        responses={201: JobSubmittedSerializer, 200: JobSubmittedSerializer},
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, required=False)],
    )
    @action(detail=True, methods=["post"])
    def submit(self, request, pk=None):
        """Submit a job from the template; the body may override its fields (env and labels merge)."""
        self.get_object()
        if request.data in (None, "") or request.data == {}:
            overrides = {}
        elif isinstance(request.data, dict):
            overrides = _plain(request.data)
        else:
            raise ValidationFailed("send an object of submission fields to override (or nothing)", code="invalid")
        key = _idempotency_key(request)
        return _submit_naming_jobs(
            lambda ids: services.template_submit(
                user=request.user, template_id=int(pk), overrides=overrides, idempotency_key=key, job_id=ids[0]
            ),
            _submitted_answer,
        )

    submit_actions = frozenset({"create", "submit"})


def _unranked(jobs: list[Job]) -> list[Job]:
    """A submission's answer gives no place in the line: counting the jobs ahead in a 5,000-job line cost the
    database 4-6 ms, more than the rest of the submission's statements together (bench/submit.py), and a batch's
    answer reads nothing after the commit (tests/faults/test_submit_outage.py). GET /api/v1/jobs/{id}/ ranks it."""
    for job in jobs:
        job.queue_position = None
    return jobs


def _submitted_answer(job: Job, created: bool) -> Response:
    job.recommendation = signals.answer(signals.recommendation_wanted, job=job)
    _unranked([job])
    code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return Response(JobSubmittedSerializer(job).data, status=code)


def _submit_naming_jobs(write, answer, *, count: int = 1) -> Response:
    """`write(ids)` (a submission, given the ids its new jobs take) in one durable transaction, then
    `answer(made, created)`. An outage before the commit began made nothing: the plain 503. One while the commit
    ran, or after it (the answer reads the database too), is a 503 that names the job(s), `job_id` (`job_ids` for
    a batch), with `job_exists`: true once the commit went through, null when the database went away during it."""
    ids = [uuid.uuid4() for _ in range(count)]
    stage, made, created = "writing", None, True
    try:
        with transaction.atomic(durable=True):
            made, created = write(ids)
            stage = "committing"
        stage = "committed"
        return answer(made, created)
    except Exception as exc:
        code = outage_code(exc)
        if code is None or stage == "writing":
            raise
        jobs = made if isinstance(made, list) else [made]
        raise _outage_naming(code, jobs, exists=stage == "committed" or not created) from exc


def _outage_naming(code: str, jobs: list[Job], *, exists: bool) -> OutageAfterWrite:
    what = "the database" if code == "database_unavailable" else "the message broker (Redis)"
    named = ", ".join(str(job.id) for job in jobs[:3]) + (f" and {len(jobs) - 3} more" if len(jobs) > 3 else "")
    subject = f"job {named}" if len(jobs) == 1 else f"jobs {named}"
    if exists:
        detail = (
            f"{subject} {'was' if len(jobs) == 1 else 'were'} submitted, but {what} went away before the answer was "
            "ready: do not submit again; GET /api/v1/jobs/<id>/ once it is back"
        )
    else:
        detail = (
            f"{what} went away while {subject} {'was' if len(jobs) == 1 else 'were'} being saved, so it is not known "
            "whether the submission was kept: GET /api/v1/jobs/<id>/ once it is back (404: it was not), or send it "
            "again with the same Idempotency-Key, which never makes a second"
        )
    ids = {"job_id": str(jobs[0].id)} if len(jobs) == 1 else {"job_ids": [str(job.id) for job in jobs]}
    return OutageAfterWrite(code, detail, **ids, job_exists=True if exists else None)


def _idempotency_key(request) -> str | None:
    key = request.headers.get("Idempotency-Key") or None
    if key is not None and len(key) > 200:
        raise ValidationFailed("Idempotency-Key is longer than 200 characters", code="invalid_idempotency_key")
    return key


def _plain(data) -> dict:
    return {k: v for k, v in dict(data).items()}


def _first_code(errors) -> str:
    if isinstance(errors, dict):
        for value in errors.values():
            return _first_code(value)
    if isinstance(errors, list) and errors:
        item = errors[0]
        if isinstance(item, dict) and "code" in item:
            return item["code"]
        return getattr(item, "code", None) or _first_code(item)
    return getattr(errors, "code", "invalid")


class DatasetSerializer(ModelSerializer):
    team = serializers.CharField(source="team.slug")
    kind = serializers.CharField(read_only=True)
    shared_with = serializers.SerializerMethodField()

    class Meta:
        model = Dataset
        fields = [
            "id",
            "team",
            "name",
            "version",
            "kind",
            "description",
            "s3_prefix",
            "claim",
            "size_bytes",
            "file_count",
            "shared_with",
            "registered_by",
            "created_at",
        ]
        read_only_fields = fields

    def get_shared_with(self, obj) -> list[str]:
        return sorted(t.slug for t in obj.shared_with.all())


class DatasetCreateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    team = serializers.SlugField()
    name = serializers.CharField(max_length=100)
    version = serializers.IntegerField(min_value=1, default=1)
    description = serializers.CharField(max_length=300, required=False, allow_blank=True)
    s3_prefix = serializers.CharField(max_length=1024, required=False, allow_blank=True)
    claim = serializers.CharField(max_length=253, required=False, allow_blank=True)
    shared_with = serializers.ListField(child=serializers.SlugField(), required=False)


class DatasetFilter(filters.FilterSet):
    team = filters.CharFilter(field_name="team__slug", help_text="owning team's slug")
    name = filters.CharFilter(field_name="name")

    class Meta:
        model = Dataset
        fields = []


class DatasetViewSet(ScopedActionsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Registered datasets a user's teams may read; a team's maintainers register and delete its own."""

    serializer_class = DatasetSerializer
    filterset_class = DatasetFilter
    pagination_class = None
    lookup_value_regex = "[0-9]{1,9}"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Dataset.objects.none()
        from jobs.datasets import visible_to

        return visible_to(self.request.user).order_by("team__slug", "name", "-version")

    @extend_schema(request=DatasetCreateSerializer, responses={201: DatasetSerializer})
    def create(self, request):
        """Register a dataset version: its size and file count are read from the object store (400
        `empty_dataset` when nothing is there)."""
        from jobs.datasets import dataset_register

        payload = DatasetCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        team = quota_selectors.visible_teams(request.user).filter(slug=data["team"]).first()
        if team is None:
            raise NotFound("team not found (or you are not a member)", code="unknown_team", field="team")
        dataset = dataset_register(
            user=request.user,
            team=team,
            name=data["name"],
            version=data["version"],
            s3_prefix=data.get("s3_prefix", ""),
            claim=data.get("claim", ""),
            description=data.get("description", ""),
            shared_with=data.get("shared_with", []),
        )
        return Response(DatasetSerializer(dataset).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request, pk=None):
        """Unregister a dataset; jobs that use it keep their copy."""
        from jobs.datasets import dataset_delete

        self.get_object()
        dataset_delete(user=request.user, dataset_id=int(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class CodeSnapshotSerializer(serializers.Serializer):
    digest = serializers.CharField()
    team = serializers.CharField(source="team.slug")
    size_bytes = serializers.IntegerField()
    unpacked_bytes = serializers.IntegerField()
    file_count = serializers.IntegerField()
    uploaded_by = serializers.CharField()
    created_at = serializers.DateTimeField()


class _RawBody(BaseParser):
    """The request body as it comes (a gzip'd tar), read by the view as a stream."""

    media_type = "*/*"

    def parse(self, stream, media_type=None, parser_context=None):
        return stream


class CodeSnapshotView(ScopedActionsMixin, APIView):
    """A team's code snapshot by digest: `PUT` uploads it (the body: a gzip'd tar; idempotent), `GET`/`HEAD` say
    whether the team has it (jobs/code.py)."""

    token_scope = "submit"
    parser_classes = [_RawBody]

    def _team(self, request) -> Team:
        slug = request.query_params.get("team", "")
        team = quota_selectors.visible_teams(request.user).filter(slug=slug).first() if slug else None
        if team is None:
            raise NotFound("team not found (or you are not a member): give ?team=<slug>", code="unknown_team",
                           field="team")  # fmt: skip
        return team

    @extend_schema(parameters=[OpenApiParameter("team", str, required=True)], responses={200: CodeSnapshotSerializer})
    def get(self, request, digest: str):
        from jobs.code import snapshot_get

        snapshot = snapshot_get(team=self._team(request), digest=digest)
        if snapshot is None:
            raise NotFound(f"the team has no code snapshot {digest}", code="unknown_code")
        return Response(CodeSnapshotSerializer(snapshot).data)

    @extend_schema(
        parameters=[OpenApiParameter("team", str, required=True)],
        request={"application/gzip": OpenApiTypes.BINARY},
        responses={200: CodeSnapshotSerializer, 201: CodeSnapshotSerializer},
    )
    def put(self, request, digest: str):
        from jobs.code import snapshot_store

        team = self._team(request)
        snapshot, created = snapshot_store(team=team, digest=digest, body=request.stream, user=request.user)
        return Response(CodeSnapshotSerializer(snapshot).data, status=201 if created else 200)
