"""REST API v1: one router for every app's viewsets."""

from django.urls import include, path
from rest_framework.routers import DefaultRouter

from cluster.api import GPUViewSet, NodeViewSet
from experiments.api import ExperimentViewSet
from images.api import FeedViewSet, ImageBuildViewSet, ImageViewSet, ProjectImageViewSet, ScanPolicyViewSet
from jobs.api import CodeSnapshotView, DatasetViewSet, JobTemplateViewSet, JobViewSet
from quotas.api import QueueViewSet, SpecViewSet, TeamViewSet, TokenViewSet

router = DefaultRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("templates", JobTemplateViewSet, basename="job-template")
router.register("queues", QueueViewSet, basename="queue")
router.register("teams", TeamViewSet, basename="team")
router.register("specs", SpecViewSet, basename="spec")
router.register("images", ImageViewSet, basename="image")
router.register("project-images", ProjectImageViewSet, basename="project-image")
router.register("image-builds", ImageBuildViewSet, basename="image-build")
router.register("vulnerability-feed", FeedViewSet, basename="vulnerability-feed")
router.register("scan-policies", ScanPolicyViewSet, basename="scan-policy")
router.register("nodes", NodeViewSet, basename="node")
router.register("gpus", GPUViewSet, basename="gpu")
router.register("tokens", TokenViewSet, basename="token")
router.register("datasets", DatasetViewSet, basename="dataset")
router.register("experiments", ExperimentViewSet, basename="experiment")
urlpatterns = router.urls
urlpatterns += [
    path("monitoring/", include("monitoring.api_urls")),
    path("code/<str:digest>/", CodeSnapshotView.as_view(), name="code-snapshot"),
]
