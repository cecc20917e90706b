"""The image catalog with which nodes' drivers can run each image."""

from rest_framework import mixins, serializers, viewsets

from cluster.models import Node
from cluster.services import driver_satisfies
from images.models import BaseImage
from trainyard.api import ScopedActionsMixin


class BaseImageSerializer(serializers.ModelSerializer):
    name = serializers.CharField(read_only=True)  # names carry versions (python-3.11): not a slug
    compatible_nodes = serializers.SerializerMethodField()
    incompatible_nodes = serializers.SerializerMethodField()

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
            "compatible_nodes",
            "incompatible_nodes",
        ]
        read_only_fields = fields

    def _nodes(self):
        if "nodes" not in self.context:
            self.context["nodes"] = list(Node.objects.exclude(state="unhealthy").values_list("name", "driver_version"))
        return self.context["nodes"]

    def get_compatible_nodes(self, image) -> list[str]:
        return [n for n, d in self._nodes() if driver_satisfies(d, image.min_driver_version)]

    def get_incompatible_nodes(self, image) -> list[dict]:
        return [
            {"node": n, "driver_version": d}
            for n, d in self._nodes()
            if not driver_satisfies(d, image.min_driver_version)
        ]


class ImageViewSet(ScopedActionsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = BaseImageSerializer
    queryset = BaseImage.objects.all()
    lookup_field = "name"
    lookup_value_regex = "[^/]+"  # image names carry versions: python-3.11, pytorch-2.5-cuda12.4
