"""Startup checks (`manage.py check`, run by every management command and the web server): settings that
cannot work are reported before the first job is submitted, with the setting named."""

import ipaddress
from urllib.parse import urlsplit

from django.conf import settings
from django.core import checks

# Pods run on the cluster's nodes: an address that means "this machine" there means the node itself.
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
SILENCE = "a cluster whose nodes are this machine (kwok, a one-node lab) may silence it: TRAINYARD_SILENCED_CHECKS=%s"


def _loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback or ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _image_registry(image: str) -> str:
    """The registry host of an image reference, '' when the reference names none (Docker Hub is then implied)."""
    first = image.split("/", 1)[0] if "/" in image else ""
    return first if ("." in first or ":" in first or first == "localhost") else ""


@checks.register(checks.Tags.compatibility)
def volcano_backend_settings(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    if settings.TRAINYARD_BACKEND != "volcano":
        return []
    from jobs.backends.volcano import config_from_settings
    from jobs.backends.volcano_render import ManifestError

    try:
        config_from_settings()
    except ManifestError as exc:
        return [checks.Error(str(exc), id="jobs.E001")]
    return _endpoints_pods_reach()


def _endpoints_pods_reach() -> list[checks.CheckMessage]:
    """The addresses handed to pods must be reachable from the nodes: the object store (checkpoints, datasets,
    code), the image registry (project images) and the platform image (checkpoint and dataset sidecars)."""
    found = []
    for name, url in (
        ("TRAINYARD_S3_URL", settings.TRAINYARD_S3_URL),
        ("TRAINYARD_REGISTRY_URL", settings.TRAINYARD_REGISTRY_URL),
    ):
        host = urlsplit(url if "//" in url else f"//{url}").hostname or "" if url else ""
        if not url:
            found.append(
                checks.Error(
                    f"{name} is unset, so the embedded server on this machine's loopback would be handed to pods, "
                    "which run on the cluster's nodes and cannot reach it: set it to an address the nodes reach",
                    id="jobs.E002",
                )
            )
        elif _loopback(host):
            found.append(
                checks.Error(
                    f"{name}={url} is a loopback address; pods run on the cluster's nodes, where it means the node "
                    f"itself: set it to an address the nodes reach ({SILENCE % 'jobs.E002'})",
                    id="jobs.E002",
                )
            )
    image = settings.TRAINYARD_K8S_PLATFORM_IMAGE
    registry = _image_registry(image)
    if not registry:
        found.append(
            checks.Error(
                f"TRAINYARD_K8S_PLATFORM_IMAGE={image} names no registry, so nodes would look for it on Docker Hub: "
                "push the platform image to a registry the nodes pull from and name it, e.g. "
                f"registry.example.com/{image}",
                id="jobs.E003",
            )
        )
    elif _loopback(registry.rsplit(":", 1)[0]):
        found.append(
            checks.Error(
                f"TRAINYARD_K8S_PLATFORM_IMAGE={image} is pulled from a loopback registry, which the nodes cannot "
                f"reach: name a registry they pull from ({SILENCE % 'jobs.E003'})",
                id="jobs.E003",
            )
        )
    return found
