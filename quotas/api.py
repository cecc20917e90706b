"""Teams (usage against quota, members), queues (waiting jobs, positions, waits), specs, API tokens."""

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from kernel.api import ModelSerializer, RejectUnknownFieldsMixin, int_param
from kernel.errors import Forbidden, NotFound, ValidationFailed
from quotas import selectors, services, tokens, usage
from quotas.models import TOKEN_SCOPES, ApiToken, Membership, Queue, ResourceSpec, Team
from quotas.tokens import ScopedActionsMixin

VECTOR = ["gpu_milli", "gpu_memory_mib", "cpu_milli", "memory_mib"]


class SpecSerializer(ModelSerializer):
    class Meta:
        model = ResourceSpec
        fields = [
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
            "exclusive",
        ]
        read_only_fields = fields


class SpecViewSet(ScopedActionsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = SpecSerializer
    queryset = ResourceSpec.objects.filter(enabled=True)
    lookup_field = "name"


class MemberSerializer(ModelSerializer):
    username = serializers.CharField(source="user.username")

    class Meta:
        model = Membership
        fields = ["username", "role"]


class TeamSerializer(ModelSerializer):
    quota = serializers.SerializerMethodField()
    usage = serializers.SerializerMethodField()
    storage = serializers.SerializerMethodField()

    class Meta:
        model = Team
        fields = ["slug", "name", "namespace", "quota", "usage", "max_running_jobs", "max_jobs_per_user", "storage"]

    def get_quota(self, team) -> dict:
        return team.vector()

    def get_usage(self, team) -> dict:
        return usage.team_usage(team)

    def get_storage(self, team) -> dict:
        """Checkpoint bytes in the object store against the team's storage quota, and its retention."""
        return {
            "used_bytes": usage.team_storage_used([team.id]).get(team.id, 0),
            "quota_bytes": team.storage_quota_bytes,
            "keep_last": team.checkpoint_keep_last,
            "retention_days": team.checkpoint_retention_days,
        }


class TeamDetailSerializer(TeamSerializer):
    members = MemberSerializer(source="memberships", many=True, read_only=True)
    usage_by_spec = serializers.SerializerMethodField()
    watch = serializers.JSONField(read_only=True, help_text="log texts watched in every job of the team")

    class Meta(TeamSerializer.Meta):
        fields = [*TeamSerializer.Meta.fields, "members", "usage_by_spec", "watch"]

    def get_usage_by_spec(self, team) -> list:
        return usage.team_usage_by_spec(team)


INT_MAX = 2**31 - 1  # the columns' ranges: a larger number is a 400, never a database error
BIGINT_MAX = 2**63 - 1


class QuotaUpdateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    gpu_milli = serializers.IntegerField(min_value=0, max_value=INT_MAX, required=False)
    gpu_memory_mib = serializers.IntegerField(min_value=0, max_value=BIGINT_MAX, required=False)
    cpu_milli = serializers.IntegerField(min_value=0, max_value=INT_MAX, required=False)
    memory_mib = serializers.IntegerField(min_value=0, max_value=BIGINT_MAX, required=False)
    max_running_jobs = serializers.IntegerField(min_value=0, max_value=INT_MAX, required=False)
    max_jobs_per_user = serializers.IntegerField(min_value=0, max_value=INT_MAX, required=False)
    storage_quota_bytes = serializers.IntegerField(
        min_value=0, max_value=BIGINT_MAX, required=False, help_text="0 = no limit"
    )
    checkpoint_keep_last = serializers.IntegerField(min_value=0, max_value=1000, required=False)
    checkpoint_retention_days = serializers.IntegerField(min_value=0, max_value=36500, required=False)


class TeamWatchSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    watch = serializers.JSONField(
        help_text='up to 8 {"pattern": text, "level": "warning" or "critical"}; [] watches nothing'
    )


class MembershipInputSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    username = serializers.CharField()
    role = serializers.ChoiceField(choices=Membership.Role.choices, default="member")


class TeamViewSet(ScopedActionsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    lookup_field = "slug"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Team.objects.none()
        return selectors.visible_teams(self.request.user).prefetch_related("memberships__user")

    def get_serializer_class(self):
        return TeamSerializer if self.action == "list" else TeamDetailSerializer

    @extend_schema(request=QuotaUpdateSerializer, responses=TeamDetailSerializer)
    @action(detail=True, methods=["patch"])
    def quota(self, request, slug=None):
        """Change the team's quota (staff only); takes effect at the next dispatch, audited."""
        team = self.get_object()
        if not request.user.is_staff:
            raise Forbidden("only staff change quotas")
        payload = QuotaUpdateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        with transaction.atomic(durable=True):
            team = services.team_quota_update(team=team, changes=payload.validated_data, actor=request.user)
        return Response(TeamDetailSerializer(team).data)

    @extend_schema(request=TeamWatchSerializer, responses=TeamDetailSerializer)
    @action(detail=True, methods=["put"])
    def watch(self, request, slug=None):
        """Set the log texts watched in every job of the team (maintainers or staff); audited."""
        team = self.get_object()
        if not selectors.is_maintainer(request.user, team):
            raise Forbidden("only the team's maintainers set the team's log watches")
        payload = TeamWatchSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        with transaction.atomic(durable=True):
            team = services.team_watch_set(team=team, watch=payload.validated_data["watch"], actor=request.user)
        return Response(TeamDetailSerializer(team).data)

    @extend_schema(request=MembershipInputSerializer, responses=MemberSerializer)
    @action(detail=True, methods=["post"])
    def members(self, request, slug=None):
        """Add a member or change a role (maintainers of the team, or staff)."""
        team = self.get_object()
        if not selectors.is_maintainer(request.user, team):
            raise Forbidden("only the team's maintainers manage members")
        payload = MembershipInputSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        with transaction.atomic(durable=True):
            membership = services.membership_set(team=team, **payload.validated_data)
        return Response(MemberSerializer(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={204: None})
    @action(detail=True, methods=["delete"], url_path=r"members/(?P<username>[\w.@+-]+)")
    def remove_member(self, request, slug=None, username=None):
        team = self.get_object()
        if not selectors.is_maintainer(request.user, team):
            raise Forbidden("only the team's maintainers manage members")
        with transaction.atomic(durable=True):
            services.membership_remove(team=team, username=username)
        return Response(status=status.HTTP_204_NO_CONTENT)


class EstimatedStartSerializer(serializers.Serializer):
    """When a waiting job may start, in seconds from now (jobs/eta.py): `low_s`..`high_s`, `mid_s` the middle
    figure; `known` is false when no finished job like the ones involved gives evidence (then `high_s` is at
    most the latest moment the time limits allow, or null)."""

    low_s = serializers.IntegerField(allow_null=True)
    mid_s = serializers.IntegerField(allow_null=True)
    high_s = serializers.IntegerField(allow_null=True)
    known = serializers.BooleanField()
    holders = serializers.IntegerField(
        help_text="jobs holding what it waits for: its team's (team quota), its queue's (queue quota), else all"
    )
    outlived = serializers.IntegerField(
        help_text="of those, how many have run longer than every finished job like them (they may end any moment)"
    )


class WaitingJobSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    owner = serializers.CharField(source="owner.username")
    team = serializers.CharField(source="team.slug")
    spec = serializers.CharField(source="spec.name", default=None)
    priority = serializers.IntegerField()
    position = serializers.IntegerField(source="queue_position")
    reason = serializers.CharField()
    message = serializers.CharField()
    submitted_at = serializers.DateTimeField()
    estimated_wait_s = serializers.IntegerField(
        allow_null=True, help_text="the middle estimate (estimated_start.mid_s)"
    )
    estimated_start = EstimatedStartSerializer(allow_null=True)


class QueueSerializer(ModelSerializer):
    capability = serializers.SerializerMethodField()
    usage = serializers.SerializerMethodField()
    specs = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)
    waiting = serializers.SerializerMethodField()

    class Meta:
        model = Queue
        fields = [
            "name",
            "description",
            "state",
            "priority",
            "priority_class",
            "pools",
            "allow_preemptible",
            "max_member_priority",
            "weight",
            "ordering",
            "gang",
            "max_timeout_s",
            "default_timeout_s",
            "specs",
            "capability",
            "usage",
            "waiting",
        ]

    def get_capability(self, queue) -> dict:
        return queue.vector()

    def get_usage(self, queue) -> dict:
        return usage.queue_usage(queue)

    def get_waiting(self, queue) -> int:
        return queue.jobs.filter(state="pending").count()


LINE_LIMIT = 100  # waiting jobs a queue's detail lists by default (`?limit=`, up to LINE_LIMIT_MAX)
LINE_LIMIT_MAX = 10000


class QueueDetailSerializer(QueueSerializer):
    jobs = serializers.SerializerMethodField(help_text="the first `limit` jobs of the waiting line, in order")
    jobs_total = serializers.SerializerMethodField(help_text="how many jobs wait in all")

    class Meta(QueueSerializer.Meta):
        fields = [*QueueSerializer.Meta.fields, "jobs", "jobs_total"]

    def get_jobs_total(self, queue) -> int:
        return len(self._line(queue))

    def _line(self, queue) -> list:
        if getattr(self, "_line_of", None) is None or self._line_of[0] != queue.pk:
            self._line_of = (queue.pk, usage.line_places(queue))
        return self._line_of[1]

    def get_jobs(self, queue) -> list:
        request = self.context["request"]
        user = request.user
        limit = int_param(request, "limit", default=LINE_LIMIT, minimum=1)
        if limit > LINE_LIMIT_MAX:
            raise ValidationFailed(f"limit must be at most {LINE_LIMIT_MAX}", code="invalid_parameter", field="limit")
        line = self._line(queue)
        waits, shown = usage.line_rows(queue, line, first=limit)
        position = {entry.id: i for i, entry in enumerate(line, start=1)}
        visible = set(selectors.visible_teams(user).values_list("id", flat=True))
        for job in shown:
            job.queue_position = position[job.id]  # its rank in the line just read: no query per job
            estimate = waits.get(job.id)
            job.estimated_start = estimate.as_dict() if estimate else None
            job.estimated_wait_s = job.estimated_start["mid_s"] if estimate else None
        # One serializer for the whole page: a serializer per row copies its fields per row (most of a 100-row
        # page's time).
        rows = WaitingJobSerializer(shown, many=True).data
        for k, job in enumerate(shown):
            if job.team_id not in visible:  # others' jobs show as anonymous places in the line
                data = rows[k]
                rows[k] = {
                    "position": data["position"],
                    "estimated_wait_s": data["estimated_wait_s"],
                    "estimated_start": data["estimated_start"],
                    "priority": data["priority"],
                    "submitted_at": data["submitted_at"],
                    "team": None,
                }
        return list(rows)


class QueueViewSet(ScopedActionsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    lookup_field = "name"
    queryset = Queue.objects.prefetch_related("specs")

    def get_serializer_class(self):
        return QueueSerializer if self.action == "list" else QueueDetailSerializer


class TokenSerializer(ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "scopes", "created_at", "expires_at", "revoked_at", "last_used_at"]
        read_only_fields = fields


class TokenCreateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    name = serializers.CharField(max_length=100)
    expires_in_days = serializers.IntegerField(min_value=1, max_value=3650, required=False)
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=TOKEN_SCOPES),
        required=False,
        allow_empty=False,
        help_text="default: read and submit (a token making a token: its own scopes)",
    )


class TokenViewSet(ScopedActionsMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    """Token management: from a browser session, or with a token that has the admin scope."""

    serializer_class = TokenSerializer
    token_scope_all = "admin"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        return ApiToken.objects.filter(user=self.request.user)

    @extend_schema(request=TokenCreateSerializer, responses={201: TokenSerializer})
    def create(self, request):
        """Create a token; the secret is in the response once and never again."""
        payload = TokenCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        with transaction.atomic(durable=True):
            parent = request.auth if isinstance(request.auth, ApiToken) else None
            token, raw = tokens.token_create(user=request.user, parent=parent, **payload.validated_data)
        return Response({**TokenSerializer(token).data, "token": raw}, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request, pk=None):
        """Revoke a token by its number or by the 8-character id the portal shows (the `prefix`)."""
        key = str(pk).strip().lower()
        token = None
        if len(key) == 8 and all(c in "0123456789abcdef" for c in key):
            found = list(ApiToken.objects.filter(user=request.user, prefix=key)[:2])
            token = found[0] if len(found) == 1 else None
        if token is None and key.isdigit() and len(key) < 12:
            token = ApiToken.objects.filter(user=request.user, pk=int(key)).first()
        if token is None:
            raise NotFound("token not found")
        with transaction.atomic(durable=True):
            tokens.token_revoke(token=token)
        return Response(status=status.HTTP_204_NO_CONTENT)
