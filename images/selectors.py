"""Reads of the image catalog: what a user may see, the last build of an image, findings by severity."""

from __future__ import annotations

from django.db.models import Count, Prefetch, QuerySet

from images.models import SEVERITY_RANK, BaseImage, Finding, ImageBuild, ProjectImage
from kernel.errors import NotFound
from quotas.models import Membership, Team


def _team_ids(user) -> list[int]:
    return list(Membership.objects.filter(user=user).values_list("team_id", flat=True))


def project_images_visible_to(user) -> QuerySet[ProjectImage]:
    qs = ProjectImage.objects.select_related("team", "base").order_by("team__slug", "name")
    return qs if user.is_staff else qs.filter(team_id__in=_team_ids(user))


def builds_visible_to(user) -> QuerySet[ImageBuild]:
    qs = ImageBuild.objects.select_related("base_image", "project_image__team")
    if user.is_staff:
        return qs
    from django.db.models import Q

    return qs.filter(Q(base_image__isnull=False) | Q(project_image__team_id__in=_team_ids(user)))


def team_for(user, slug: str) -> Team:
    team = Team.objects.filter(slug=slug).first()
    if team is None or not (user.is_staff or Membership.objects.filter(user=user, team=team).exists()):
        raise NotFound("team not found (or you are not a member)", code="unknown_team", field="team")
    return team


RECENT_BUILDS = Prefetch("builds", queryset=ImageBuild.objects.order_by("-created_at", "-id"), to_attr="recent_builds")


def last_build(image: BaseImage | ProjectImage) -> ImageBuild | None:
    """The newest build (prefetched as `recent_builds` on list pages, else one query)."""
    cached = getattr(image, "recent_builds", None)
    if cached is not None:
        return cached[0] if cached else None
    return image.builds.order_by("-created_at", "-id").first()


def load_severity_counts(builds: list[ImageBuild]) -> None:
    """Findings per severity of many builds in one query (for catalog pages)."""
    counts: dict[int, dict[str, int]] = {b.pk: {} for b in builds}
    rows = Finding.objects.filter(build__in=builds).values_list("build_id", "severity").annotate(n=Count("id"))
    for build_id, severity, n in rows:
        counts[build_id][severity] = n
    for build in builds:
        build._severity_counts = counts[build.pk]


def severity_counts(build: ImageBuild) -> dict[str, int]:
    cached = getattr(build, "_severity_counts", None)
    if cached is None:
        cached = dict(build.findings.values_list("severity").annotate(n=Count("id")).values_list("severity", "n"))
        build._severity_counts = cached
    return {s: cached.get(s, 0) for s in sorted(SEVERITY_RANK, key=SEVERITY_RANK.get, reverse=True)}
