"""The image catalog API: base images (with which nodes' drivers can run each), project images, builds with
their log, SBOM and findings, and the vulnerability feed. Reads: selectors; commands: images.services."""

from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from cluster.models import Node
from cluster.selectors import driver_satisfies
from images import selectors, services
from images.models import BaseImage, Finding, ImageBuild, ProjectImage, ScanException, ScanPolicy
from kernel.api import ModelSerializer, RejectUnknownFieldsMixin
from kernel.errors import Forbidden, ValidationFailed
from quotas.selectors import is_member
from quotas.tokens import ScopedActionsMixin


class FindingSerializer(ModelSerializer):
    class Meta:
        model = Finding
        fields = ["vuln_id", "severity", "ecosystem", "package", "version", "fixed_version", "source"]
        read_only_fields = fields


class BuildSummarySerializer(ModelSerializer):
    image = serializers.SerializerMethodField()
    findings = serializers.SerializerMethodField()

    class Meta:
        model = ImageBuild
        fields = [
            "id",
            "image",
            "status",
            "trigger",
            "created_at",
            "started_at",
            "finished_at",
            "reference",
            "digest",
            "base_digest",
            "size_bytes",
            "registry_waits",
            "scanned_at",
            "scan_feed",
            "warnings",
            "findings",
            "config_user",
            "runs_as_root",
        ]
        read_only_fields = fields

    runs_as_root = serializers.BooleanField(
        read_only=True, allow_null=True, help_text="its config starts it as root (null: config not read)"
    )

    scan_feed = serializers.SerializerMethodField(
        help_text="the vulnerability feed its last scan ran against: source, loaded_at, entries (null for an imported "
        "report), age_s and stale now; null: never scanned"
    )

    def get_image(self, build) -> str:
        return str(build.image)

    def get_scan_feed(self, build) -> dict | None:
        return services.scan_feed_reading(build)

    def get_findings(self, build) -> dict[str, int]:
        return selectors.severity_counts(build)


class BuildDetailSerializer(BuildSummarySerializer):
    finding_list = FindingSerializer(source="findings", many=True, read_only=True)

    class Meta(BuildSummarySerializer.Meta):
        fields = [*BuildSummarySerializer.Meta.fields, "containerfile", "layers", "sbom", "finding_list", "log"]
        read_only_fields = fields


class CompatibilityMixin(serializers.Serializer):
    compatible_nodes = serializers.SerializerMethodField()
    incompatible_nodes = serializers.SerializerMethodField()
    last_build = serializers.SerializerMethodField()
    scan_status = serializers.SerializerMethodField(
        help_text="unscanned, passed, failed, or stale (passed against a feed that has gone stale since)"
    )

    def _nodes(self):
        if "nodes" not in self.context:
            self.context["nodes"] = list(Node.objects.exclude(state="unhealthy").values_list("name", "driver_version"))
        return self.context["nodes"]

    def _min_driver(self, image) -> str:
        if isinstance(image, ProjectImage):
            return image.min_driver_version or image.base.min_driver_version
        return image.min_driver_version

    def get_compatible_nodes(self, image) -> list[str]:
        return [n for n, d in self._nodes() if driver_satisfies(d, self._min_driver(image))]

    def get_incompatible_nodes(self, image) -> list[dict]:
        return [
            {"node": n, "driver_version": d}
            for n, d in self._nodes()
            if not driver_satisfies(d, self._min_driver(image))
        ]

    def get_last_build(self, image) -> dict | None:
        build = selectors.last_build(image)
        return BuildSummarySerializer(build).data if build else None

    def get_scan_status(self, image) -> str:
        """As it reads now: `stale` for a stored `passed` whose scan's feed has gone stale since."""
        return services.scan_status_now(image, selectors.last_build(image))


class BaseImageSerializer(CompatibilityMixin, ModelSerializer):
    name = serializers.CharField(read_only=True)  # names carry versions (python-3.11): not a slug
    built_by_platform = serializers.SerializerMethodField()

    class Meta:
        model = BaseImage
        fields = [
            "name",
            "reference",
            "digest",
            "pinned_reference",
            "cuda_version",
            "framework",
            "framework_version",
            "min_driver_version",
            "maintainer",
            "scan_status",
            "last_rebuilt",
            "built_by_platform",
            "last_build",
            "compatible_nodes",
            "incompatible_nodes",
        ]
        read_only_fields = fields

    def get_built_by_platform(self, image) -> bool:
        return bool(image.containerfile)


class ProjectImageSerializer(CompatibilityMixin, ModelSerializer):
    team = serializers.CharField(source="team.slug", read_only=True)
    base = serializers.CharField(source="base.name", read_only=True)

    class Meta:
        model = ProjectImage
        fields = [
            "id",
            "team",
            "name",
            "base",
            "reference",
            "digest",
            "pinned_reference",
            "containerfile",
            "requirements",
            "stale",
            "scan_status",
            "last_rebuilt",
            "last_build",
            "compatible_nodes",
            "incompatible_nodes",
        ]
        read_only_fields = fields


class ProjectImageInputSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    team = serializers.CharField()
    name = serializers.CharField(max_length=80)
    base = serializers.CharField(max_length=80)
    containerfile = serializers.CharField(required=False, allow_blank=True, default="")
    requirements = serializers.CharField(required=False, allow_blank=True, default="")
    build = serializers.BooleanField(required=False, default=True, help_text="queue a build right away")


class ImageViewSet(ScopedActionsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Base images; `POST …/build/` rebuilds one now (platform staff or one of its owners)."""

    serializer_class = BaseImageSerializer
    queryset = BaseImage.objects.prefetch_related(selectors.RECENT_BUILDS)
    lookup_field = "name"
    lookup_value_regex = "[^/]+"  # image names carry versions: python-3.11, pytorch-2.5-cuda12.4

    @extend_schema(request=None, responses={202: BuildSummarySerializer})
    @action(detail=True, methods=["post"])
    def build(self, request, name=None):
        image = self.get_object()
        if not (request.user.is_staff or image.owners.filter(pk=request.user.pk).exists()):
            raise Forbidden("only the platform team or the image's owners rebuild a base image")
        build = services.build_request(image=image, user=request.user)
        return Response(BuildSummarySerializer(build).data, status=status.HTTP_202_ACCEPTED)


class ProjectImageViewSet(
    ScopedActionsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """A team's images on a catalog base: create or update (and build), rebuild on demand."""

    serializer_class = ProjectImageSerializer
    token_scope = "submit"  # building a team's image is like submitting a job

    queryset = ProjectImage.objects.none()  # for the schema; requests see get_queryset's

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ProjectImage.objects.none()
        return selectors.project_images_visible_to(self.request.user).prefetch_related(selectors.RECENT_BUILDS)

    @extend_schema(request=ProjectImageInputSerializer, responses={201: ProjectImageSerializer})
    def create(self, request):
        data = ProjectImageInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        team = selectors.team_for(request.user, data.validated_data["team"])
        image = services.project_image_define(
            team=team,
            name=data.validated_data["name"],
            base=data.validated_data["base"],
            containerfile=data.validated_data["containerfile"],
            requirements=data.validated_data["requirements"],
            user=request.user,
        )
        if data.validated_data["build"]:
            services.build_request(image=image, user=request.user)
        return Response(ProjectImageSerializer(image).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: BuildSummarySerializer})
    @action(detail=True, methods=["post"])
    def build(self, request, pk=None):
        image = self.get_object()
        if not is_member(request.user, image.team):
            raise Forbidden("only the team's members build its images")
        build = services.build_request(image=image, user=request.user)
        return Response(BuildSummarySerializer(build).data, status=status.HTTP_202_ACCEPTED)


class ImageBuildViewSet(ScopedActionsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Builds with their status; one build with its log, layers, SBOM and findings."""

    def get_serializer_class(self):
        return BuildDetailSerializer if self.action == "retrieve" else BuildSummarySerializer

    queryset = ImageBuild.objects.none()  # for the schema; requests see get_queryset's

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ImageBuild.objects.none()
        qs = selectors.builds_visible_to(self.request.user)
        if self.action == "retrieve":
            qs = qs.prefetch_related(Prefetch("findings"))
        return qs

    @extend_schema(request=None, responses={200: BuildSummarySerializer})
    @action(detail=True, methods=["post"], url_path="trivy", permission_classes=[permissions.IsAdminUser])
    def trivy(self, request, pk=None):
        """Import a Trivy JSON report (`trivy image -f json`) made elsewhere as this build's findings."""
        build = self.get_object()
        try:
            services.trivy_import(build=build, document=request.data)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValidationFailed(f"not a Trivy JSON report: {exc}", code="invalid_trivy_report") from None
        return Response(BuildSummarySerializer(build).data)


class FeedSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    loaded = serializers.IntegerField()


class FeedViewSet(ScopedActionsMixin, viewsets.GenericViewSet):
    """Load OSV entries (a list, one entry, or an OSV query answer) into the vulnerability feed (staff)."""

    permission_classes = [permissions.IsAdminUser]
    serializer_class = FeedSerializer

    @extend_schema(request=None, responses={201: FeedSerializer})
    def create(self, request):
        try:
            loaded = services.feed_load(document=request.data, source=request.query_params.get("source", "api"))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValidationFailed(f"not an OSV feed: {exc}", code="invalid_feed") from None
        return Response({"loaded": loaded}, status=status.HTTP_201_CREATED)


class ScanExceptionSerializer(ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None)

    class Meta:
        model = ScanException
        fields = ["id", "vuln_id", "image", "reason", "created_by", "created_at", "expires_at"]
        read_only_fields = ["id", "created_by", "created_at"]


class ScanPolicySerializer(ModelSerializer):
    queue = serializers.CharField(source="queue.name", read_only=True)
    exceptions = ScanExceptionSerializer(many=True, read_only=True)

    class Meta:
        model = ScanPolicy
        fields = ["queue", "max_severity", "require_scan", "refuse_root", "exceptions"]
        read_only_fields = fields


class ScanPolicyViewSet(ScopedActionsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Each queue's scan policy with its exceptions; staff grant an exception (a reason and an expiry required)."""

    serializer_class = ScanPolicySerializer
    queryset = ScanPolicy.objects.select_related("queue").prefetch_related("exceptions__created_by")
    lookup_field = "queue__name"
    lookup_url_kwarg = "queue"

    @extend_schema(request=ScanExceptionSerializer, responses={201: ScanExceptionSerializer})
    @action(detail=True, methods=["post"], permission_classes=[permissions.IsAdminUser])
    def exceptions(self, request, queue=None):
        policy = self.get_object()
        data = ScanExceptionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        granted = services.scan_exception_grant(policy=policy, user=request.user, **data.validated_data)
        return Response(ScanExceptionSerializer(granted).data, status=status.HTTP_201_CREATED)
