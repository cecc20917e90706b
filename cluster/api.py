"""Nodes and GPUs with health, and who holds each slice (jobs of other teams stay anonymous)."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from cluster import services
from cluster.inventory import node_pool
from cluster.models import GPU, LogicalDevice, Node
from kernel.api import ModelSerializer, RejectUnknownFieldsMixin
from quotas.selectors import visible_teams
from quotas.tokens import ScopedActionsMixin


class SliceSerializer(ModelSerializer):
    job = serializers.SerializerMethodField()

    class Meta:
        model = LogicalDevice
        fields = ["compute_milli", "memory_mib", "exclusive", "created_at", "job"]

    def get_job(self, device) -> str | None:
        attempt = device.attempt
        if attempt is None:
            return None
        return str(attempt.job_id) if attempt.job.team_id in self.context.get("teams", set()) else "(another team)"


class GPUSerializer(ModelSerializer):
    node = serializers.CharField(source="node.name")
    emulated = serializers.BooleanField(source="node.emulated")
    slices = serializers.SerializerMethodField()
    free_milli = serializers.SerializerMethodField()

    class Meta:
        model = GPU
        fields = [
            "uuid",
            "node",
            "index",
            "model",
            "memory_mib",
            "health",
            "quarantined",
            "quarantine_reason",
            "emulated",
            "free_milli",
            "slices",
        ]

    def _live(self, gpu):
        return [d for d in gpu.slices.all() if d.released_at is None]

    def get_slices(self, gpu) -> list:
        return SliceSerializer(self._live(gpu), many=True, context=self.context).data

    def get_free_milli(self, gpu) -> int:
        return 1000 - sum(d.compute_milli for d in self._live(gpu))


class NodeSerializer(ModelSerializer):
    gpus = serializers.IntegerField(source="gpus.count")
    pool = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = [
            "name",
            "backend",
            "emulated",
            "driver_version",
            "cuda_version",
            "rack",
            "labels",
            "cpu_milli",
            "memory_mib",
            "state",
            "last_seen",
            "gpus",
            "pool",
        ]

    def get_pool(self, node) -> str:
        return node_pool(node.labels)


class NodeMoveSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    pool = serializers.CharField(max_length=50, help_text="the node pool to move the node to")


class NodeViewSet(ScopedActionsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = NodeSerializer
    queryset = Node.objects.all()
    lookup_field = "name"
    lookup_value_regex = "[^/]+"

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"], permission_classes=[permissions.IsAdminUser])
    def cordon(self, request, name=None):
        """Staff: no new placements on this node; running jobs continue (409 `node_not_ready` when unhealthy)."""
        node, _ = services.node_cordon(node_id=self.get_object().pk, actor=request.user.username)
        return Response(NodeSerializer(node).data)

    @extend_schema(request=NodeMoveSerializer, responses=NodeSerializer)
    @action(detail=True, methods=["post"], permission_classes=[permissions.IsAdminUser])
    def move(self, request, name=None):
        """Staff: move the node to another pool (409 `node_work_cannot_stay` while it runs jobs of queues not bound
        to that pool; 400 `invalid_pool`). Jobs waiting for that pool are dispatched at once."""
        payload = NodeMoveSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        node, _ = services.node_move(
            node_id=self.get_object().pk, pool=payload.validated_data["pool"], actor=request.user.username
        )
        return Response(NodeSerializer(node).data)

    @extend_schema(request=None, responses=NodeSerializer)
    @action(detail=True, methods=["post"], permission_classes=[permissions.IsAdminUser])
    def uncordon(self, request, name=None):
        """Staff: the node takes placements again; waiting jobs are dispatched at once."""
        node, _ = services.node_uncordon(node_id=self.get_object().pk, actor=request.user.username)
        return Response(NodeSerializer(node).data)


class GPUViewSet(ScopedActionsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = GPUSerializer
    lookup_field = "uuid"
    lookup_value_regex = "[^/]+"

    def get_queryset(self):
        return GPU.objects.select_related("node").prefetch_related("slices__attempt__job")

    def get_serializer_context(self):
        context = super().get_serializer_context()
        context["teams"] = set(visible_teams(self.request.user).values_list("id", flat=True))
        return context
