"""Celery tasks of the image catalog: each takes ids, loads, and calls one service."""

import structlog
from celery import shared_task
from django.conf import settings

from images import k8s_build, services
from images.models import ImageBuild

log = structlog.get_logger(__name__)


@shared_task(name="images.run_build", bind=True, acks_late=True, max_retries=None, time_limit=2 * 3600)
def run_build(self, build_id: int) -> str:
    """One build; while the registry is down it waits (retries later), its log saying so, up to the configured
    number of waits. On Kubernetes each run is one look at the build's Job, repeated until it has finished."""
    try:
        build = services.build_run(build_id=build_id)
    except k8s_build.ClusterUnavailable as exc:
        log.warning("image_build_cluster_unavailable", build_id=build_id, why=str(exc))
        raise self.retry(countdown=settings.TRAINYARD_BUILD_POLL_S, exc=exc) from None
    except services.RegistryWaiting as exc:
        if ImageBuild.objects.filter(pk=build_id, status=ImageBuild.Status.FAILED).exists():
            return ImageBuild.Status.FAILED
        raise self.retry(countdown=settings.TRAINYARD_BUILD_REGISTRY_RETRY_S, exc=exc) from None
    if build.status == ImageBuild.Status.RUNNING and settings.TRAINYARD_IMAGE_BUILDER == "kubernetes":
        # The build runs as a Job on the cluster: look at it again later (each look is one bounded pass).
        raise self.retry(countdown=settings.TRAINYARD_BUILD_POLL_S)
    return build.status


@shared_task(name="images.rebuild_due", acks_late=True)
def rebuild_due() -> int:
    """The beat's pass: bases whose last build is older than TRAINYARD_IMAGE_REBUILD_S (weekly) are rebuilt;
    unused project images past their retention are dropped."""
    builds = services.images_rebuild_due()
    services.project_images_expire()
    return len(builds)


@shared_task(name="images.reap_builds", soft_time_limit=60, time_limit=90)
def reap_builds() -> dict:
    """The beat's pass: builds whose worker died end, lost build messages are sent again."""
    return services.builds_reap()
