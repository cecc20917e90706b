"""Celery tasks of the image catalog: each takes ids, loads, and calls one service."""

import structlog
from celery import shared_task
from django.conf import settings

from images import services
from images.models import ImageBuild

log = structlog.get_logger(__name__)


@shared_task(name="images.run_build", bind=True, acks_late=True, max_retries=None, time_limit=2 * 3600)
def run_build(self, build_id: int) -> str:
    """One build; while the registry is down it waits (retries later), its log saying so, up to the configured
    number of waits."""
    try:
        return services.build_run(build_id=build_id).status
    except services.RegistryWaiting as exc:
        if ImageBuild.objects.filter(pk=build_id, status=ImageBuild.Status.FAILED).exists():
            return ImageBuild.Status.FAILED
        raise self.retry(countdown=settings.TRAINYARD_BUILD_REGISTRY_RETRY_S, exc=exc) from None


@shared_task(name="images.rebuild_due", acks_late=True)
def rebuild_due() -> int:
    """The beat's pass: bases whose last build is older than TRAINYARD_IMAGE_REBUILD_S (weekly) are rebuilt;
    unused project images past their retention are dropped."""
    builds = services.images_rebuild_due()
    services.project_images_expire()
    return len(builds)
