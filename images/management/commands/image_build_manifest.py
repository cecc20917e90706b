"""Print a build as Kubernetes objects (ConfigMap + rootless BuildKit Job) for `kubectl apply -f -`."""

import yaml
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from images import services
from images.models import ImageBuild
from kernel.errors import DomainError


class Command(BaseCommand):
    help = "Print an image build as a ConfigMap and a rootless BuildKit Job (YAML) that build and push it."

    def add_arguments(self, parser):
        parser.add_argument("build_id", type=int)
        parser.add_argument("--namespace", default=settings.TRAINYARD_K8S_BUILD_NAMESPACE)

    def handle(self, *args, build_id: int, namespace: str, **options):
        build = (
            ImageBuild.objects.select_related("base_image", "project_image__base", "project_image__team")
            .filter(pk=build_id)
            .first()
        )
        if build is None:
            raise CommandError(f"no image build {build_id}")
        if not settings.TRAINYARD_REGISTRY_URL:
            raise CommandError("TRAINYARD_REGISTRY_URL is not set: the Job needs a registry it can push to")
        try:
            objects = services.build_manifest(build, namespace=namespace)
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(yaml.safe_dump_all(objects, sort_keys=False))
