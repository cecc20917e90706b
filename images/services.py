"""Every change of the image catalog: defining bases and project images, building them (podman, chroot isolation)
and pushing to the platform registry, SBOM and scan, the stale cascade, scheduled rebuilds and retention; and the
two checks submission makes: pin a tag to its digest, and the queue's scan policy.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import structlog
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from kubernetes.client.exceptions import ApiException

from images import build_limits, build_proxy, host_rootfs, k8s_build, registry, scan
from images.builder import BuilderUnavailable, builder_for, context_dir, give, jailed, short_run_root
from images.models import (
    SEVERITY_RANK,
    Advisory,
    BaseImage,
    Finding,
    ImageBuild,
    ProjectImage,
    ScanException,
    ScanPolicy,
    TeamImageSettings,
)
from kernel.errors import DomainError, NotFound, ValidationFailed
from kernel.host import platform_scope
from kernel.sentences import stored

log = structlog.get_logger(__name__)
FROM_LINE = re.compile(r"^\s*FROM\s+(?P<flags>(?:--\S+\s+)*)(?P<image>\S+)(?P<rest>(?:\s+AS\s+\S+)?)\s*$", re.I | re.M)
ALIAS = re.compile(r"\s+AS\s+(\S+)", re.I)
BUILD_ARGS = ["--isolation", "chroot", "--tls-verify=false", "--layers", "--format", "oci"]


class RegistryUnavailableError(DomainError):
    """Submission could not pin its image because the registry did not answer: try again later (503)."""

    code = "registry_unavailable"
    http_status = 503


class RegistryWaiting(Exception):
    """A build found the registry down; it has said so in its log and wants to be retried later."""


# ----------------------------------------------------------------------------------------- submission


def image_pin(*, reference: str, endpoint: str | None = None) -> str:
    """The digest `reference` (host/repo:tag) points to now, asked of `endpoint` (a mirror) or the reference's own
    registry; 400 `invalid_image_reference` / `image_not_found`, 503 `registry_unavailable`."""
    if not registry.is_valid(reference):
        raise ValidationFailed(
            f"'{reference}' is not an image reference (host/repository:tag)", code="invalid_image_reference",
            field="image",
        )  # fmt: skip
    try:
        return registry.resolve(reference, endpoint=endpoint)
    except registry.ManifestUnknown:
        raise ValidationFailed(
            f"'{reference}' is not in its registry (no such repository or tag)", code="image_not_found", field="image"
        ) from None
    except registry.RegistryError as exc:
        raise RegistryUnavailableError(
            f"cannot pin '{reference}' to a digest now: {exc}", code="registry_unavailable", field="image"
        ) from None


def _blocking(policy: ScanPolicy, queue, findings: list[Finding], repository: str, now: datetime) -> list[Finding]:
    limit = SEVERITY_RANK[policy.max_severity]
    over = [f for f in findings if SEVERITY_RANK.get(f.severity, 0) > limit]
    if not over:
        return []
    excepted = set(
        ScanException.objects.filter(policy=policy, expires_at__gt=now)
        .filter(Q(image="") | Q(image=repository))
        .values_list("vuln_id", flat=True)
    )
    for finding in over:
        if finding.vuln_id in excepted:
            log.info("scan_exception_used", queue=queue.name, vuln_id=finding.vuln_id, image=repository)
    return [f for f in over if f.vuln_id not in excepted]


def image_user(*, reference: str, digest: str, endpoint: str | None = None) -> str:
    """The `USER` the config of `reference@digest` names, read from its registry (a build's record when the
    platform built that digest); 503 `registry_unavailable` when the registry does not answer."""
    known = (
        ImageBuild.objects.filter(digest=digest, config_user__isnull=False)
        .order_by("-finished_at")
        .values_list("config_user", flat=True)
        .first()
    )
    if known is not None:
        return known
    ref = registry.parse(reference)
    try:
        with registry.Client(endpoint) if endpoint else registry.Client.for_host(ref.host) as client:
            return scan.config_user(client.image_config(ref.repository, digest))
    except registry.ManifestUnknown:
        raise ValidationFailed(
            f"'{reference}@{digest}' is not in its registry (no such repository or digest)",
            code="image_not_found",
            field="image",
        ) from None
    except registry.RegistryError as exc:
        raise RegistryUnavailableError(
            f"cannot read the config of '{reference}' now: {exc}", code="registry_unavailable", field="image"
        ) from None


def _admit_user(*, policy: ScanPolicy, queue, reference: str, digest: str, endpoint: str | None) -> None:
    if not digest:
        raise ValidationFailed(
            stored(
                "queue '%(queue)s' refuses images that run as root, and '%(image)s' has no digest whose config "
                "could say otherwise: name it by a pinned reference",
                queue=queue.name,
                image=reference,
            ),
            code="image_runs_as_root",
            field="image",
        )
    user = image_user(reference=reference, digest=digest, endpoint=endpoint)
    if scan.runs_as_root(user):
        raise ValidationFailed(
            stored(
                "queue '%(queue)s' refuses images that run as root; the config of %(image)s says %(user)s: "
                "add USER <uid> (say 1000) to its Containerfile",
                queue=queue.name,
                image=f"{reference}@{digest}",
                user=f"USER {user}" if user else "no USER",
            ),
            code="image_runs_as_root",
            field="image",
            findings=["runs_as_root"],
        )


def image_admit(*, policy: ScanPolicy, queue, reference: str, digest: str, endpoint: str | None = None) -> None:
    """The queue's scan policy, for the image a submission pinned: 400 `image_vulnerable` naming the findings over
    the policy's severity that no unexpired exception covers; `image_not_scanned` where the policy wants a scan;
    `image_runs_as_root` where it refuses root and the image's config starts as root."""
    if policy.refuse_root:
        _admit_user(policy=policy, queue=queue, reference=reference, digest=digest, endpoint=endpoint)
    build = (
        ImageBuild.objects.filter(digest=digest, status=ImageBuild.Status.SUCCEEDED, scanned_at__isnull=False)
        .order_by("-finished_at")
        .first()
    )
    if build is None:
        if policy.require_scan:
            raise ValidationFailed(
                f"queue '{queue.name}' only runs images the platform has scanned; {reference}@{digest} was not",
                code="image_not_scanned",
                field="image",
            )
        return
    if policy.require_scan and feed_state()["stale"]:
        raise ValidationFailed(
            f"queue '{queue.name}' only runs scanned images, and the vulnerability feed is empty or older than "
            f"{settings.TRAINYARD_SCAN_FEED_MAX_AGE_S / 86400:g} days, so no scan proves anything: load a feed",
            code="image_not_scanned",
            field="image",
        )
    blocking = _blocking(policy, queue, list(build.findings.all()), registry.parse(reference).name, timezone.now())
    if blocking:
        named = ", ".join(f"{f.vuln_id} ({f.severity}) in {f.package} {f.version}" for f in blocking[:5])
        raise ValidationFailed(
            f"queue '{queue.name}' allows findings up to {policy.max_severity}; the image has {named}",
            code="image_vulnerable",
            field="image",
            findings=[f.vuln_id for f in blocking],
        )


# ------------------------------------------------------------------------------------------- catalog


def base_image_define(*, name: str, containerfile: str, user=None, **facts: Any) -> BaseImage:
    """Create or update a platform-built base image; at most TRAINYARD_MAX_BASE_IMAGES of them."""
    if not containerfile.strip():
        raise ValidationFailed("a base image needs a Containerfile", code="empty_containerfile", field="containerfile")
    if not FROM_LINE.search(containerfile):
        raise ValidationFailed("the Containerfile has no FROM line", code="containerfile_without_from")
    check_build_hosts(containerfile)
    with transaction.atomic():
        existing = BaseImage.objects.select_for_update().filter(name=name).first()
        if existing is None and BaseImage.objects.count() >= settings.TRAINYARD_MAX_BASE_IMAGES:
            raise ValidationFailed(
                f"the catalog already has {settings.TRAINYARD_MAX_BASE_IMAGES} base images, the configured maximum",
                code="too_many_base_images",
                field="name",
            )
        image = existing or BaseImage(name=name)
        image.containerfile = containerfile
        for key, value in facts.items():
            setattr(image, key, value)
        image.full_clean(exclude=["reference", "digest"])
        image.save()
    return image


def _endpoint(host: str, default_port: int) -> str:
    """`host:port` as the allow-list writes it: lowercase, the port spelled out."""
    host = host.lower()
    if host.startswith("["):  # [v6]:port
        return host if "]:" in host else f"{host}:{default_port}"
    return host if ":" in host else f"{host}:{default_port}"


def build_host_allowed(endpoint: str) -> bool:
    """A build may reach the platform's own registry and what TRAINYARD_BUILD_ALLOWED_HOSTS names."""
    mine = registry.platform_registry()
    return endpoint in settings.TRAINYARD_BUILD_ALLOWED_HOSTS or bool(mine and endpoint == _endpoint(mine, 443))


def check_build_hosts(containerfile: str) -> None:
    """Every host a build would reach on its own, a FROM on another registry (`docker.io` when no host is written)
    and an ADD <url>, is the platform's registry or an admin-allowed `host:port` (TRAINYARD_BUILD_ALLOWED_HOSTS);
    400 `build_host_not_allowed` otherwise."""
    stages: set[str] = set()
    reached: list[tuple[str, str]] = []
    for match in FROM_LINE.finditer(containerfile):
        image = match.group("image")
        if image.lower() not in stages and image.lower() != "scratch" and _catalog_base(image) is None:
            host = registry.parse(image).host
            reached.append((f"FROM {image}", _endpoint("registry-1.docker.io" if host == "docker.io" else host, 443)))
        alias = ALIAS.search(match.group("rest") or "")
        if alias:
            stages.add(alias.group(1).lower())
    for match in ADD_LINE.finditer(containerfile):
        words = [w for w in match.group("args").split() if not w.startswith("--")]
        for word in words[:-1]:
            url = urlparse(word)
            if url.scheme in ("http", "https") and url.hostname:
                port = url.port or (443 if url.scheme == "https" else 80)
                host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
                reached.append((f"ADD {word}", f"{host.lower()}:{port}"))
            elif "://" in word or word.startswith("git@"):
                reached.append((f"ADD {word}", word))
    for what, endpoint in reached:
        if not build_host_allowed(endpoint):
            allowed = ", ".join(settings.TRAINYARD_BUILD_ALLOWED_HOSTS) or "none but the platform's registry"
            raise ValidationFailed(
                f"{what}: a build may reach only the hosts an admin allows (TRAINYARD_BUILD_ALLOWED_HOSTS: "
                f"{allowed}); {endpoint} is not one of them",
                code="build_host_not_allowed",
                field="containerfile",
            )


def _catalog_base(image: str) -> BaseImage | None:
    """A FROM argument that names a catalog base: by name, or by its registry reference (tag or digest)."""
    found = BaseImage.objects.filter(name=image).first()
    if found:
        return found
    without = image.split("@", 1)[0]
    for base in BaseImage.objects.exclude(reference=""):
        if without == base.reference or without == base.reference.rsplit(":", 1)[0]:
            return base
    return None


def check_from(containerfile: str) -> list[BaseImage]:
    """Every FROM names a catalog base (or an earlier stage); 400 `base_not_in_catalog` otherwise."""
    stages: set[str] = set()
    bases: list[BaseImage] = []
    matches = list(FROM_LINE.finditer(containerfile))
    if not matches:
        raise ValidationFailed(
            "the Containerfile has no FROM line", code="containerfile_without_from", field="containerfile"
        )
    for match in matches:
        image = match.group("image")
        if image.lower() not in stages:
            base = _catalog_base(image)
            if base is None:
                raise ValidationFailed(
                    f"FROM {image}: project images build on a catalog base image "
                    f"({', '.join(BaseImage.objects.values_list('name', flat=True)) or 'none defined'})",
                    code="base_not_in_catalog",
                    field="containerfile",
                )
            bases.append(base)
        alias = ALIAS.search(match.group("rest") or "")
        if alias:
            stages.add(alias.group(1).lower())
    check_sources(containerfile, stages=stages, count=len(matches))
    return bases


COPY_FROM = re.compile(r"^\s*(?:COPY|ADD)\b[^\n]*?--from=(?P<source>\S+)", re.I | re.M)
MOUNT_FROM = re.compile(r"--mount=\S*?\bfrom=(?P<source>[^,\s]+)", re.I)
ADD_LINE = re.compile(r"^\s*ADD\s+(?P<args>.+)$", re.I | re.M)


def check_sources(containerfile: str, *, stages: set[str], count: int) -> None:
    """What a project image's steps may copy from: its own earlier stages and its build context, nothing else —
    no other image (another team's, by registry path) and no URL (a platform service on loopback, say). 400s
    `copy_from_not_a_stage` and `add_url_not_allowed`."""
    sources = [m.group("source") for m in COPY_FROM.finditer(containerfile)]
    sources += [m.group("source") for m in MOUNT_FROM.finditer(containerfile)]
    for source in sources:
        if source.lower() in stages or (source.isdigit() and int(source) < count):
            continue
        raise ValidationFailed(
            f"--from={source}: a step may copy only from an earlier stage of this Containerfile "
            "(name a catalog base in a `FROM <base> AS <stage>` line first)",
            code="copy_from_not_a_stage",
            field="containerfile",
        )
    for match in ADD_LINE.finditer(containerfile):
        words = [w for w in match.group("args").split() if not w.startswith("--")]
        if any("://" in w or w.startswith("git@") for w in words[:-1]):
            try:
                check_build_hosts(match.group(0))
            except ValidationFailed:
                raise ValidationFailed(
                    "ADD <url>: a build fetches only from the hosts an admin allows (TRAINYARD_BUILD_ALLOWED_HOSTS); "
                    "put the file in the image's context instead",
                    code="add_url_not_allowed",
                    field="containerfile",
                ) from None


def project_image_define(
    *, team, name: str, base: str, containerfile: str = "", requirements: str = "", user=None
) -> ProjectImage:
    base_image = BaseImage.objects.filter(name=base).first()
    if base_image is None:
        raise ValidationFailed(f"'{base}' is not a catalog base image", code="base_not_in_catalog", field="base")
    if not containerfile.strip() and not requirements.strip():
        raise ValidationFailed(
            "give a Containerfile or a requirements file", code="empty_image_definition", field="containerfile"
        )
    if containerfile.strip():
        bases = check_from(containerfile)
        if any(b.pk != base_image.pk for b in bases):
            raise ValidationFailed(
                f"the Containerfile's FROM must be the chosen base '{base}'",
                code="base_mismatch",
                field="containerfile",
            )
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,79}", name):
        raise ValidationFailed(
            "an image name is lowercase letters, digits, '.', '_' and '-'", code="invalid_image_name", field="name"
        )
    with transaction.atomic():
        image, _ = ProjectImage.objects.select_for_update().get_or_create(
            team=team, name=name, defaults={"base": base_image, "created_by": user}
        )
        image.base = base_image
        image.containerfile = containerfile
        image.requirements = requirements
        image.save()
    return image


# --------------------------------------------------------------------------------------------- builds


def build_request(*, image: BaseImage | ProjectImage, user=None, trigger: str = ImageBuild.Trigger.MANUAL):
    """Queue a build (the task runs it after commit); a build already queued or running for the image is reused."""
    is_base = isinstance(image, BaseImage)
    if is_base and not image.containerfile:
        raise ValidationFailed(
            f"base image '{image.name}' is external (no Containerfile); the platform does not build it",
            code="image_not_buildable",
        )
    if is_base and image.rootfs and settings.TRAINYARD_IMAGE_BUILDER != "podman":
        raise ValidationFailed(
            f"base image '{image.name}' is assembled from the platform machine's own files; only the podman builder "
            "makes it (TRAINYARD_IMAGE_BUILDER=podman)",
            code="image_not_buildable",
        )
    key = {"base_image": image} if is_base else {"project_image": image}
    active = [ImageBuild.Status.QUEUED, ImageBuild.Status.WAITING_REGISTRY, ImageBuild.Status.RUNNING]
    with transaction.atomic():
        existing = ImageBuild.objects.select_for_update().filter(status__in=active, **key).first()
        if existing is not None:
            return existing
        build = ImageBuild.objects.create(trigger=trigger, requested_by=user, **key)
        build_id = build.pk
        transaction.on_commit(lambda: _enqueue(build_id), robust=True)
    log.info("image_build_requested", build_id=build.pk, image=str(image), trigger=trigger)
    return build


def _enqueue(build_id: int) -> None:
    from images.tasks import run_build

    run_build.delay(build_id)


SHARED_NAMESPACE = "base"  # trainyard/base/…: the catalog bases, everyone's


def check_team_repository(reference: str, *, team_slug: str) -> None:
    """A platform repository `trainyard/<team>/…` belongs to that team: a job or build of another team naming it
    is refused by its path alone, whether or not it exists (no oracle), on any registry host (an alias of the
    platform's registry is still the platform's). `trainyard/base/…` is the shared catalog. 400
    `image_of_another_team`."""
    parts = registry.parse(reference.strip()).repository.lower().split("/")
    if len(parts) >= 3 and parts[0] == "trainyard" and parts[1] not in {SHARED_NAMESPACE, team_slug.lower()}:
        raise ValidationFailed(
            stored(
                "'%(reference)s' is a project image of another team: a job runs its own team's project images "
                "(trainyard/%(team)s/…) and the shared bases (trainyard/base/…)",
                reference=reference,
                team=team_slug,
            ),
            code="image_of_another_team",
            field="image",
        )


def repository_of(image: BaseImage | ProjectImage) -> str:
    if isinstance(image, BaseImage):
        return f"trainyard/{SHARED_NAMESPACE}/{image.name}"
    return f"trainyard/{image.team.slug}/{image.name}"


def podman_command(root: Path, *args: str) -> list[str]:
    """podman with storage of its own under `root`. Its run root (locks, sockets) must be a short path (podman
    refuses one over 50 characters), so a deep `root` gets its run root in the system's temporary folder instead,
    named after `root` so that every build of one platform shares it."""
    run = root / "run"
    if len(str(run)) > 50:
        run = short_run_root(root)
    return ["podman", "--root", str(root / "storage"), "--runroot", str(run), *args]


def _podman(*args: str) -> list[str]:
    return podman_command(Path(settings.TRAINYARD_BUILD_ROOT), *args)


def render_build(build: ImageBuild) -> tuple[str, dict[str, str], str]:
    """What to build: the Containerfile with every catalog FROM pinned to its base's digest, extra context files,
    and the base digest it builds on ("" for a base image)."""
    image = build.image
    if isinstance(image, BaseImage):
        return image.containerfile, {}, ""
    base = image.base
    if not base.digest or not base.reference:
        raise ValidationFailed(f"base image '{base.name}' has not been built yet", code="base_not_built")
    pinned = registry.parse(base.reference).pinned(base.digest)
    files: dict[str, str] = {}
    text = image.containerfile
    if not text.strip():
        files["requirements.txt"] = image.requirements
        text = (
            f"FROM {base.name}\nCOPY requirements.txt /tmp/trainyard-requirements.txt\n"
            "RUN python3 -m pip install --no-cache-dir -r /tmp/trainyard-requirements.txt\n"
        )
    elif image.requirements.strip():
        files["requirements.txt"] = image.requirements
    check_from(text)

    def pin(match: re.Match) -> str:
        named = _catalog_base(match.group("image"))
        target = registry.parse(named.reference).pinned(named.digest) if named and named.digest else pinned
        return f"FROM {match.group('flags')}{target}{match.group('rest')}" if named else match.group(0)

    return FROM_LINE.sub(pin, text), files, base.digest


def _append(build: ImageBuild, text: str) -> None:
    build.log = (build.log + text)[-1_000_000:]  # the tail is what explains a failure


BUILD_LOCK_CLASS = 0x7479  # pg advisory lock (class, build id): held by the process running a local build


def _build_claim(build_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [BUILD_LOCK_CLASS, build_id])
        return bool(cursor.fetchone()[0])


def _build_release(build_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [BUILD_LOCK_CLASS, build_id])


def build_run(*, build_id: int) -> ImageBuild:
    """Build, push, inspect, scan. Raises RegistryWaiting (after saying so in the log) when the registry is down;
    a failed build keeps its log and pushes nothing. A local build runs only while its process holds the build's
    session lock: a second delivery of the same build returns at once, and when the process dies the lock goes
    with its connection, which is how `builds_reap` knows."""
    if settings.TRAINYARD_IMAGE_BUILDER == "kubernetes":
        return _build_run(build_id=build_id)
    if not _build_claim(build_id):
        return ImageBuild.objects.get(pk=build_id)
    try:
        return _build_run(build_id=build_id)
    finally:
        _build_release(build_id)


def builds_reap(*, now: datetime | None = None) -> dict[str, int]:
    """Level-triggered care of local builds: a `running` build whose process is gone (nobody holds its lock) has
    its podman processes killed and ends `failed`, saying why, so a rebuild starts a new build; a `queued` build
    older than TRAINYARD_BUILD_REQUEUE_S whose message was lost is sent again."""
    if settings.TRAINYARD_IMAGE_BUILDER == "kubernetes":
        return {"reaped": 0, "requeued": 0}
    now = now or timezone.now()
    reaped = requeued = 0
    for build in ImageBuild.objects.filter(status=ImageBuild.Status.RUNNING).order_by("pk"):
        if not _build_claim(build.pk):
            continue  # its process is alive and holds it
        try:
            killed = _kill_build_processes(build.pk)
            build.refresh_from_db()
            if build.status == ImageBuild.Status.RUNNING:
                _finish(
                    build,
                    ok=False,
                    message=f"the worker running this build stopped before it ended ({killed} leftover process(es) "
                    "killed); nothing was pushed: request a rebuild\n",
                )
                reaped += 1
        finally:
            _build_release(build.pk)
    stale = now - timedelta(seconds=settings.TRAINYARD_BUILD_REQUEUE_S)
    for build_id in ImageBuild.objects.filter(status=ImageBuild.Status.QUEUED, created_at__lt=stale).values_list(
        "pk", flat=True
    ):
        _enqueue(build_id)
        requeued += 1
    if reaped or requeued:
        log.warning("image_builds_reaped", reaped=reaped, requeued=requeued)
    return {"reaped": reaped, "requeued": requeued}


def build_tag(build_id: int) -> str:
    """The build's local image name (`localhost/<this>`), also how its leftover processes are found: the platform's
    scope in it, as another platform on this host has a build of the same number."""
    return f"trainyard-build-{platform_scope()}-{build_id}"


def _kill_build_processes(build_id: int) -> int:
    """Kill every process whose command line names this build's local tag (podman and what it started)."""
    import signal

    tag = build_tag(build_id).encode()
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if any(part == tag or part.endswith(b"/" + tag) for part in cmdline.split(b"\0")):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def _build_run(*, build_id: int) -> ImageBuild:
    with transaction.atomic():
        build = (
            ImageBuild.objects.select_for_update(of=("self",))
            .select_related("base_image", "project_image__base", "project_image__team")
            .get(pk=build_id)
        )
        if build.status in (ImageBuild.Status.SUCCEEDED, ImageBuild.Status.FAILED):
            return build
        build.status = ImageBuild.Status.RUNNING
        build.started_at = build.started_at or timezone.now()
        build.save(update_fields=["status", "started_at"])
    image = build.image
    try:
        containerfile, files, base_digest = render_build(build)
    except ValidationFailed as exc:
        return _finish(build, ok=False, message=f"{exc.detail}\n")
    if not settings.TRAINYARD_REGISTRY_URL:
        _wait(build, "no image registry is configured (TRAINYARD_REGISTRY_URL)")
    try:
        with registry.Client(settings.TRAINYARD_REGISTRY_URL) as client:
            client.ping()
    except registry.RegistryError as exc:
        _wait(build, str(exc))
    if isinstance(image, BaseImage) and not build.containerfile:  # not started yet (a cluster build's Job: not made)
        try:
            check_build_hosts(image.containerfile)  # the allow-list may have shrunk since the image was defined
        except ValidationFailed as exc:
            return _finish(build, ok=False, message=f"{exc.detail}\n")
    host = registry.platform_registry()
    repository = repository_of(image)
    target = f"{host}/{repository}"
    if settings.TRAINYARD_IMAGE_BUILDER == "kubernetes":
        return _build_on_cluster(build, containerfile, files, base_digest, repository, target)
    local = f"localhost/{build_tag(build.pk)}"
    layout = None
    if isinstance(image, BaseImage) and image.rootfs == "host":
        try:
            layout = host_rootfs.plan()
        except (host_rootfs.RootfsUnavailable, OSError, subprocess.SubprocessError) as exc:
            return _finish(build, ok=False, message=f"the rootfs could not be assembled: {exc}\n")
        containerfile += f"LABEL {INPUTS_LABEL}={inputs_key(image, layout)}\n"
    try:
        who = builder_for("base" if isinstance(image, BaseImage) else str(image.team_id))
    except (BuilderUnavailable, OSError, subprocess.CalledProcessError) as exc:
        return _finish(build, ok=False, message=f"the build could not be isolated: {exc}\n")
    context = context_dir(who, build.pk)
    try:
        (context / "Containerfile").write_text(containerfile)
        for name, body in files.items():
            (context / name).write_text(body)
        if layout is not None:
            host_rootfs.assemble(layout, context / "rootfs")
            _append(build, f"assembled rootfs/ from this machine's files: {len(layout.files)} files, "
                           f"{layout.size_bytes / 2**20:.1f} MiB (Python {layout.python_version}, "
                           f"numpy {layout.numpy_version or 'not included'})\n")  # fmt: skip
        give(who, context)
        # The bases are pulled first, as the build's user with the network; the build then runs with none.
        for source in _pull_sources(containerfile):
            _append(build, f"$ podman pull --tls-verify=false {source}\n")
            with _registry_auth(who, context, host, build) as auth:
                result = _run(who.podman("pull", "--tls-verify=false", *auth, "--quiet", source))
            _append(build, result.stdout)
            if result.returncode != 0:
                _registry_check(build)
                return _finish(build, ok=False, message=f"pull failed (exit {result.returncode}); nothing was pushed\n")
        user = f" (as {who.name}, network {settings.TRAINYARD_BUILD_NETWORK})" if who.isolated else ""
        proxied = settings.TRAINYARD_BUILD_NETWORK == "allowlist"
        network_args = ["--http-proxy=true"] if proxied else []  # RUN steps get podman's http_proxy & co.
        _append(build, f"$ podman build {' '.join([*BUILD_ARGS, *network_args])} --pull=never -t {local}{user}\n")
        if proxied:
            allowed = ", ".join(settings.TRAINYARD_BUILD_ALLOWED_HOSTS) or "nothing (an empty allow-list)"
            _append(build, f"[trainyard] network: RUN steps reach only {allowed}, through the platform's proxy at "
                           f"{build_proxy.relay_env()['http_proxy']}\n")  # fmt: skip
        argv = who.podman(
            "build", *BUILD_ARGS, *network_args, "--pull=never", "-t", local, "-f", "Containerfile", str(context),
            env=build_proxy.relay_env() if proxied else None,
        )  # fmt: skip
        step = _run_build(who, argv, context, build_id=build.pk)
        _append(build, step.output)
        if step.held:
            _append(build, f"[trainyard] build step {step.held}\n")
        if step.stopped_by:
            _run(who.podman("rmi", "--ignore", local))
            return _finish(build, ok=False, message=f"{step.reason}; nothing was pushed\n")
        if step.returncode != 0:
            return _finish(build, ok=False, message=f"build failed (exit {step.returncode}); nothing was pushed\n")
        tag = f"b{build.pk}"
        digestfile = context / "digest"
        destinations = [f"{target}:{tag}", f"{target}:latest"]
        if layout is not None:  # what a later start with the same inputs finds (offline_base_ensure)
            destinations.append(f"{target}:inputs-{inputs_key(image, layout)}")
        for destination in destinations:
            _append(build, f"$ podman push --tls-verify=false {destination}\n")
            with _registry_auth(who, context, host, build) as auth:
                result = _run(
                    who.podman("push", "--tls-verify=false", *auth, "--digestfile", str(digestfile), local, destination)
                )
            _append(build, result.stdout)
            if result.returncode != 0:
                _registry_check(build)
                return _finish(build, ok=False, message=f"push failed (exit {result.returncode})\n")
        digest = digestfile.read_text().strip()
        _run(who.podman("rmi", "--ignore", local))  # the registry holds it now; layers stay cached for the next build
    finally:
        shutil.rmtree(context, ignore_errors=True)
    build.containerfile = containerfile
    return _pushed(
        build,
        repository=repository,
        target=target,
        tag=tag,
        digest=digest,
        base_digest=base_digest,
        latest=f"{target}:latest",
    )


def build_manifest(build: ImageBuild, *, namespace: str | None = None) -> list[dict]:
    """The build as a ConfigMap and a rootless BuildKit Job that push `<registry>/<repository>:b<id>`."""
    containerfile, files, _ = render_build(build)
    # Only a credential scoped to this build's repository goes into the pod (its RUN steps can likely reach it):
    # without the token service there is only the platform's shared one, and that stays out.
    credential = _build_credential(build) if settings.TRAINYARD_REGISTRY_TOKEN_KEY else None
    return k8s_build.render_build_job(
        build_id=build.pk,
        containerfile=containerfile,
        files=files,
        destination=f"{registry.platform_registry()}/{repository_of(build.image)}:b{build.pk}",
        namespace=namespace or settings.TRAINYARD_K8S_BUILD_NAMESPACE,
        insecure_registry=settings.TRAINYARD_REGISTRY_URL.startswith("http://"),
        timeout_s=settings.TRAINYARD_BUILD_TIMEOUT_S,
        push_auth=registry.docker_config(registry.platform_registry(), credential) if credential else "",
        network=settings.TRAINYARD_BUILD_NETWORK,
        proxy_url=settings.TRAINYARD_K8S_BUILD_PROXY_URL,
    )


def _note(build: ImageBuild, line: str) -> None:
    """Add a progress line to the log unless it is the last one already (each look at the Job would repeat it)."""
    if not build.log.endswith(line + "\n"):
        _append(build, line + "\n")
        build.save(update_fields=["log", "containerfile"])


def _build_on_cluster(
    build: ImageBuild, containerfile: str, files: dict[str, str], base_digest: str, repository: str, target: str
) -> ImageBuild:
    """One look at the build's Job, level-triggered: create it (or adopt the one a previous try created), report
    where it stands, and once it has finished record its log, read the pushed tag's digest back from the registry
    and delete the Job. Returns the build still RUNNING while the Job runs; the task looks again later."""
    tag = f"b{build.pk}"
    name = f"{settings.TRAINYARD_K8S_BUILD_NAMESPACE}/{k8s_build.build_name(build.pk)}"
    jobs = k8s_build.BuildJobs.from_settings()
    try:
        try:
            observed = jobs.observe(build.pk)
        except k8s_build.BuildJobConflict as exc:
            return _finish(build, ok=False, message=f"{exc}\n")
        if observed.state != "missing" and not build.containerfile:  # made by a try whose answer was lost
            build.containerfile = containerfile
            _note(build, f"adopted the existing build Job {name}")
        if observed.state == "missing":
            if build.containerfile:  # created by an earlier look, gone before it finished
                return _finish(build, ok=False, message=f"the build Job {name} disappeared before it finished\n")
            try:
                created = jobs.create(build.pk, build_manifest(build))
            except k8s_build.BuildJobConflict as exc:
                return _finish(build, ok=False, message=f"{exc}\n")
            except ApiException as exc:
                return _finish(build, ok=False, message=f"Kubernetes refused the build Job {name}: {exc.reason}\n")
            build.containerfile = containerfile
            _note(build, f"{'created' if created else 'adopted the existing'} build Job {name} (BuildKit, rootless)")
            log.info("image_build_job_created", build_id=build.pk, job=name, adopted=not created)
            return build
        build.containerfile = containerfile
        if observed.state == "pending":
            deadline = (build.started_at or timezone.now()) + timedelta(seconds=settings.TRAINYARD_BUILD_TIMEOUT_S)
            if timezone.now() > deadline:
                jobs.delete(build.pk)
                return _finish(
                    build, ok=False, message=f"the build Job never started ({observed.detail}); deleted it\n"
                )
            _note(build, f"build Job {name}: pending ({observed.detail})")
            return build
        if observed.state == "running":
            _note(build, f"build Job {name}: running")
            return build
        before = build.log
        _append(build, observed.log if observed.log.endswith("\n") or not observed.log else observed.log + "\n")
        if observed.state == "failed":
            jobs.delete(build.pk)
            return _finish(build, ok=False, message=f"build Job {name} failed ({observed.detail})\n")
        try:
            with registry.Client(settings.TRAINYARD_REGISTRY_URL) as client:
                digest = client.resolve(repository, tag)
        except registry.ManifestUnknown:
            jobs.delete(build.pk)
            return _finish(
                build, ok=False, message=f"build Job {name} succeeded but {target}:{tag} is not in the registry\n"
            )
        except registry.RegistryError as exc:
            build.log = before  # the pod's log is recorded by the pass that finishes the build
            build.save(update_fields=["log", "containerfile"])
            _wait(build, str(exc))  # the Job stays until the registry answers
            raise AssertionError("unreachable") from None
        jobs.delete(build.pk)
    finally:
        jobs.close()
    # BuildKit pushes the build's own tag only: the catalog points at it (a digest-pinned reference either way).
    return _pushed(
        build,
        repository=repository,
        target=target,
        tag=tag,
        digest=digest,
        base_digest=base_digest,
        latest=f"{target}:{tag}",
    )


def _pushed(
    build: ImageBuild, *, repository: str, target: str, tag: str, digest: str, base_digest: str, latest: str
) -> ImageBuild:
    """Record a pushed build: its digest and reference, then what the registry holds of it (SBOM, layers, size)."""
    build.digest = digest
    build.base_digest = base_digest
    build.reference = f"{target}:{tag}"
    try:
        _inspect(build, repository)
    except registry.RegistryError as exc:
        _append(build, f"could not read the pushed image back for its SBOM: {exc}\n")
    return _finish(build, ok=True, message=f"pushed {target}@{digest}\n", latest=latest)


def _registry_check(build: ImageBuild) -> None:
    """After a failed pull or push: a registry that stopped answering makes the build wait (RegistryWaiting)."""
    try:
        with registry.Client(settings.TRAINYARD_REGISTRY_URL) as client:
            client.ping()
    except registry.RegistryError as exc:
        _wait(build, str(exc))


@contextlib.contextmanager
def _registry_auth(who, context: Path, host: str, build: ImageBuild):
    """`--authfile FILE` for one pull or push at the platform's registry: the file (0600, the build's user's) holds
    the build's own credential (push to its repository alone, pull what its team may; registry.build_credential)
    only while that step runs, beside the context, so the build step itself never has it."""
    path = context.parent / f"{context.name}.auth.json"
    try:
        if not registry.write_authfile(path, host, _build_credential(build)):
            yield []
            return
        if who.isolated:
            os.chown(path, who.uid, who.gid)
        yield ["--authfile", str(path)]
    finally:
        path.unlink(missing_ok=True)


def _build_credential(build: ImageBuild) -> tuple[str, str] | None:
    image = build.image
    team = None if isinstance(image, BaseImage) else image.team.slug
    return registry.build_credential(build_id=build.pk, repository=repository_of(image), team=team)


def _pull_sources(containerfile: str) -> list[str]:
    """The images a rendered Containerfile builds on (its FROM lines less earlier stages and `scratch`)."""
    stages: set[str] = set()
    out: list[str] = []
    for match in FROM_LINE.finditer(containerfile):
        image = match.group("image")
        if image.lower() not in stages and image.lower() != "scratch" and image not in out:
            out.append(image)
        alias = ALIAS.search(match.group("rest") or "")
        if alias:
            stages.add(alias.group(1).lower())
    return out


def _run_build(who, argv: list[str], context: Path, *, build_id: int) -> build_limits.Bounded:
    """The build step in its jail (images/builder.py), bounded in memory, CPU, processes and time
    (images/build_limits.py); with TRAINYARD_BUILD_NETWORK=outbound, slirp4netns gives the jail's network namespace
    a way out that never reaches the host's loopback; with `allowlist`, the platform's filtering proxy is its only
    way out."""
    if settings.TRAINYARD_BUILD_NETWORK == "allowlist":
        return _run_build_behind_proxy(who, argv, context, build_id=build_id)
    jail = jailed(who, argv, context=context, resolv_conf=_build_resolver(context))
    timeout_s = settings.TRAINYARD_BUILD_TIMEOUT_S
    if jail is argv or settings.TRAINYARD_BUILD_NETWORK != "outbound":
        try:
            return build_limits.run(jail, build_id=build_id, timeout_s=timeout_s)
        except FileNotFoundError:
            return build_limits.Bounded(127, f"{jail[0]} is not installed\n", "", "", "")
    slirp_tool = shutil.which("slirp4netns")
    if slirp_tool is None:
        return build_limits.Bounded(127, "TRAINYARD_BUILD_NETWORK=outbound needs slirp4netns\n", "", "", "")
    step = build_limits.BuildStep(jail, build_id=build_id)
    proc = step.start()
    own = os.readlink("/proc/self/ns/net")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # attach only once the jail has its own namespace, never to ours
        try:
            if os.readlink(f"/proc/{proc.pid}/ns/net") != own:
                break
        except OSError:
            pass
        time.sleep(0.01)
    else:
        step.wait(0.001)
        return build_limits.Bounded(125, "the build's network namespace was not made\n", "", "", step.held())
    slirp = subprocess.Popen(
        [slirp_tool, "--configure", "--mtu=65520", "--disable-host-loopback", str(proc.pid), "tap0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        return step.wait(timeout_s)
    finally:
        slirp.terminate()
        slirp.wait(timeout=10)


def _run_build_behind_proxy(who, argv: list[str], context: Path, *, build_id: int) -> build_limits.Bounded:
    """TRAINYARD_BUILD_NETWORK=allowlist: the jail's loopback relays 127.0.0.1:RELAY_PORT to a proxy this process runs
    for the step (images/build_proxy.py) on a unix socket beside the context; its refusals end the step's output."""
    if not who.isolated:
        return build_limits.Bounded(
            126, "TRAINYARD_BUILD_NETWORK=allowlist needs the build jail, and the jail needs the platform to run as "
            "root; the build did not run\n", "", "", "",
        )  # fmt: skip
    folder = context.parent / f"{context.name}.net"
    proxy = build_proxy.BuildProxy(proxy_policy(), folder, owner=(who.uid, who.gid))
    relay = {"folder": str(folder), "socket": build_proxy.SOCKET_NAME, "port": build_proxy.RELAY_PORT}
    try:
        with proxy:
            jail = jailed(who, argv, context=context, relay=relay)
            try:
                step = build_limits.run(jail, build_id=build_id, timeout_s=settings.TRAINYARD_BUILD_TIMEOUT_S)
            except FileNotFoundError:
                return build_limits.Bounded(127, f"{jail[0]} is not installed\n", "", "", "")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    step.output += proxy.log()
    return step


def proxy_policy() -> build_proxy.Policy:
    """What a build's RUN steps may reach through the proxy: TRAINYARD_BUILD_ALLOWED_HOSTS, less the platform's own
    services (database, Redis, object store, registry, web) wherever a name points."""
    db = settings.DATABASES["default"]
    web = (os.environ.get("TRAINYARD_HOST", "127.0.0.1"), int(os.environ.get("TRAINYARD_PORT", "8000")))
    urls = [
        settings.REDIS_URL,
        settings.CELERY_BROKER_URL,
        settings.TRAINYARD_S3_URL or os.environ.get("TRAINYARD_S3_URL", ""),
        settings.TRAINYARD_REGISTRY_URL,
    ]
    ports = [(str(db.get("HOST") or ""), int(db.get("PORT") or 5432)), web]
    return build_proxy.Policy(
        allowed=frozenset(settings.TRAINYARD_BUILD_ALLOWED_HOSTS),
        guarded=build_proxy.platform_endpoints([u for u in urls if u], ports),
    )


def _build_resolver(context: Path) -> str | None:
    if settings.TRAINYARD_BUILD_NETWORK != "outbound":
        return None
    from kernel.netns import slirp_resolv_conf

    return slirp_resolv_conf(context)


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=settings.TRAINYARD_BUILD_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return subprocess.CompletedProcess(argv, 124, out + f"\ntimed out after {exc.timeout:g} s\n")
    except FileNotFoundError:
        return subprocess.CompletedProcess(argv, 127, f"{argv[0]} is not installed\n")


def _wait(build: ImageBuild, why: str) -> None:
    with transaction.atomic():
        build.registry_waits += 1
        if build.registry_waits > settings.TRAINYARD_BUILD_REGISTRY_RETRIES:
            build.save(update_fields=["registry_waits"])
            _finish(build, ok=False, message=f"registry still unreachable after {build.registry_waits - 1} waits\n")
            raise RegistryWaiting("gave up")
        _append(
            build,
            f"registry unreachable ({why}); waiting {settings.TRAINYARD_BUILD_REGISTRY_RETRY_S:g} s before retrying "
            f"(wait {build.registry_waits} of {settings.TRAINYARD_BUILD_REGISTRY_RETRIES})\n",
        )
        build.status = ImageBuild.Status.WAITING_REGISTRY
        build.save(update_fields=["registry_waits", "log", "status"])
    log.warning("image_build_waiting_registry", build_id=build.pk, why=why)
    raise RegistryWaiting(why)


def _inspect(build: ImageBuild, repository: str) -> None:
    """Layers, size, SBOM and hygiene warnings from what the registry now holds."""
    with registry.Client(settings.TRAINYARD_REGISTRY_URL) as client:
        manifest = client.image_manifest(repository, build.digest)
        layers = [{"digest": x["digest"], "size": x.get("size", 0)} for x in manifest.get("layers", [])]
        walk = scan.walk_layers(client.blob(repository, x["digest"]) for x in layers)
        build.config_user = scan.config_user(client.image_config(repository, build.digest))
    build.layers = layers
    build.size_bytes = sum(x["size"] for x in layers) + (manifest.get("config") or {}).get("size", 0)
    build.sbom = walk.packages
    warnings = []
    if build.size_bytes > settings.TRAINYARD_IMAGE_SIZE_WARN_MIB * 1024 * 1024:
        warnings.append(
            {
                "code": "image_too_large",
                "detail": f"compressed size {build.size_bytes / 2**20:.0f} MiB is over the "
                f"{settings.TRAINYARD_IMAGE_SIZE_WARN_MIB} MiB limit",
            }
        )
    data_bytes = sum(size for _, size in walk.data_files)
    if data_bytes > settings.TRAINYARD_IMAGE_DATA_WARN_MIB * 1024 * 1024:
        biggest = sorted(walk.data_files, key=lambda x: -x[1])[:3]
        warnings.append(
            {
                "code": "data_in_image",
                "detail": f"{data_bytes / 2**20:.0f} MiB of data or weight files (e.g. "
                + ", ".join(f"/{p}" for p, _ in biggest)
                + "): keep datasets and weights in storage",
            }
        )
    if scan.runs_as_root(build.config_user):
        warnings.append({"code": "runs_as_root", "detail": _root_detail(build.config_user)})
    build.warnings = warnings


def _root_detail(user: str) -> str:
    named = f"USER {user}" if user else "no USER"
    return f"the image's config says {named}, so it starts as root: add USER <uid> (say 1000) to its Containerfile"


def _finish(build: ImageBuild, *, ok: bool, message: str, latest: str = "") -> ImageBuild:
    with transaction.atomic():
        _append(build, message)
        build.status = ImageBuild.Status.SUCCEEDED if ok else ImageBuild.Status.FAILED
        build.finished_at = timezone.now()
        build.save()
        if ok:
            build_scan(build=build)
            image = build.image
            image.reference = latest
            image.digest = build.digest
            image.last_rebuilt = build.finished_at
            image.scan_status = scan_verdict(build)
            fields = ["reference", "digest", "last_rebuilt", "scan_status"]
            if isinstance(image, ProjectImage):
                image.stale = False
                fields.append("stale")
            image.save(update_fields=fields)
            if isinstance(image, BaseImage):
                _cascade(image)
    log.info("image_build_finished", build_id=build.pk, status=build.status, digest=build.digest)
    return build


def _cascade(base: BaseImage) -> None:
    """A rebuilt base makes its project images stale; teams that asked for it get them rebuilt."""
    derived = list(ProjectImage.objects.filter(base=base).select_related("team"))
    ProjectImage.objects.filter(base=base).update(stale=True)
    auto = set(
        TeamImageSettings.objects.filter(
            rebuild_on_base_change=True, team__in={p.team_id for p in derived}
        ).values_list("team_id", flat=True)
    )
    for image in derived:
        if image.team_id in auto:
            build_request(image=image, trigger=ImageBuild.Trigger.BASE_REBUILT)


# ------------------------------------------------------------------------------------- the offline base

OFFLINE_BASE = "python-local"
INPUTS_LABEL = "io.trainyard.inputs"


def inputs_key(image: BaseImage, layout: host_rootfs.Plan) -> str:
    """What an offline base is made of: this machine's files (their key) and the base's Containerfile."""
    return hashlib.sha256(f"{layout.key}\n{image.containerfile}".encode()).hexdigest()[:32]


def offline_base_ensure() -> tuple[str, str]:
    """The catalog's offline base (`python-local`), built with podman from this machine's files when the registry
    does not hold one made of the same inputs yet: `(outcome, sentence)`, outcome one of `reused` (the catalog
    already names that digest), `adopted` (the registry had it, the catalog did not: read back and scanned, not
    built), `built`, `failed`, `skipped` (no podman builder, no registry, nothing to assemble it from)."""
    if not settings.TRAINYARD_OFFLINE_BASE:
        return "skipped", "TRAINYARD_OFFLINE_BASE is off"
    if settings.TRAINYARD_IMAGE_BUILDER != "podman":
        return "skipped", "the offline base is built by the podman builder only (TRAINYARD_IMAGE_BUILDER)"
    if not settings.TRAINYARD_REGISTRY_URL:
        return "skipped", "no image registry (TRAINYARD_REGISTRY_URL), so no offline base"
    if shutil.which("podman") is None:
        return "skipped", "podman is not installed (apt-get install podman), so no offline base"
    try:
        layout = host_rootfs.plan()
    except (host_rootfs.RootfsUnavailable, OSError, subprocess.SubprocessError) as exc:
        return "skipped", f"no offline base: {exc}"
    facts = {"framework": "numpy" if layout.numpy_version else "none", "framework_version": layout.numpy_version}
    with transaction.atomic():
        base = BaseImage.objects.select_for_update().filter(name=OFFLINE_BASE).first()
        if base is None:
            if BaseImage.objects.count() >= settings.TRAINYARD_MAX_BASE_IMAGES:
                return "skipped", f"the catalog is full ({settings.TRAINYARD_MAX_BASE_IMAGES} bases): no offline base"
            base = BaseImage.objects.create(
                name=OFFLINE_BASE,
                containerfile=host_rootfs.CONTAINERFILE,
                rootfs="host",
                maintainer="platform",
                **facts,
            )
        elif base.rootfs != "host":
            return "skipped", f"base image '{OFFLINE_BASE}' exists and is not assembled from this machine: left alone"
    repository = repository_of(base)
    target = f"{registry.platform_registry()}/{repository}"
    tag = f"inputs-{inputs_key(base, layout)}"
    try:
        with registry.Client(settings.TRAINYARD_REGISTRY_URL) as client:
            try:
                held = client.resolve(repository, tag)
            except registry.ManifestUnknown:
                held = ""
    except registry.RegistryError as exc:
        return "skipped", f"the registry does not answer ({exc}): the offline base is looked at on the next start"
    if held and held == base.digest:
        return "reused", f"{OFFLINE_BASE} is {target}@{held} (same inputs, {tag})"
    BaseImage.objects.filter(pk=base.pk).update(**facts)
    if held:
        build = ImageBuild.objects.create(
            base_image=base,
            trigger=ImageBuild.Trigger.SETUP,
            status=ImageBuild.Status.RUNNING,
            started_at=timezone.now(),
            containerfile=f"{base.containerfile}LABEL {INPUTS_LABEL}={tag.removeprefix('inputs-')}\n",
            log=f"the registry already holds {target}:{tag}, built from the same inputs: read back, not built\n",
        )
        build = _pushed(build, repository=repository, target=target, tag=tag, digest=held, base_digest="",
                        latest=f"{target}:{tag}")  # fmt: skip
        return "adopted", f"{OFFLINE_BASE} is {target}@{build.digest} (found in the registry)"
    builds_reap()  # a build a stopped start left `running` ends `failed` here, not a minute after the worker starts
    build = base.builds.filter(status__in=[ImageBuild.Status.QUEUED, ImageBuild.Status.WAITING_REGISTRY]).first()
    if base.builds.filter(status=ImageBuild.Status.RUNNING).exists():
        return "skipped", f"a build of {OFFLINE_BASE} is running elsewhere (a worker): its result is the catalog's"
    build = build or ImageBuild.objects.create(base_image=base, trigger=ImageBuild.Trigger.SETUP)
    try:
        build = build_run(build_id=build.pk)
    except RegistryWaiting as exc:
        return "failed", f"the registry stopped answering during the offline base's build ({exc})"
    if build.status != ImageBuild.Status.SUCCEEDED:
        last = (build.log.strip().splitlines() or ["no log"])[-1]
        return "failed", f"the offline base's build {build.pk} failed ({last}); its log: /images/builds/{build.pk}/"
    return "built", f"{OFFLINE_BASE} is {build.reference.rsplit(':', 1)[0]}@{build.digest} (build {build.pk})"


# ------------------------------------------------------------------------------------------- scanning


def feed_state() -> dict[str, Any]:
    """What the vulnerability feed is now: how many entries, from where, how old (shown beside every verdict)."""
    newest = Advisory.objects.order_by("-loaded_at").values("loaded_at", "source").first()
    count = Advisory.objects.count()
    age = (timezone.now() - newest["loaded_at"]).total_seconds() if newest else None
    return {
        "entries": count,
        "source": newest["source"] if newest else "",
        "loaded_at": newest["loaded_at"] if newest else None,
        "age_s": age,
        "stale": age is None or age > settings.TRAINYARD_SCAN_FEED_MAX_AGE_S,
    }


def scan_verdict(build: ImageBuild) -> str:
    """`failed` when the scan found something; `passed` only when it ran against a loaded, fresh feed (an empty or
    stale feed matches nothing and proves nothing: `unscanned`)."""
    if build.findings.exists():
        return "failed"
    return "unscanned" if feed_state()["stale"] else "passed"


def build_scan(*, build: ImageBuild) -> list[Finding]:
    """Match the build's SBOM against the feed; feed findings are replaced, imported Trivy findings are kept."""
    build.findings.filter(source="feed").delete()
    by_package: dict[tuple[str, str], list[Advisory]] = {}
    wanted = {(p["type"], scan.canonical(p["name"])) for p in build.sbom}
    # As the SBOM spells them too: the variants below never give back a '.' that folding took (python3.11).
    names = {n for _, n in wanted} | {p["name"] for p in build.sbom}
    for advisory in (
        Advisory.objects.all() if len(names) > 500 else Advisory.objects.filter(package__in=_variants(names))
    ):
        by_package.setdefault((advisory.ecosystem, scan.canonical(advisory.package)), []).append(advisory)
    findings = []
    for package in build.sbom:
        for advisory in by_package.get((package["type"], scan.canonical(package["name"])), []):
            if scan.affected(package["type"], package["version"], advisory.ranges, advisory.versions):
                fixed = next((r[1] for r in advisory.ranges if len(r) > 1 and r[1]), "")
                findings.append(
                    Finding(
                        build=build,
                        vuln_id=advisory.vuln_id,
                        ecosystem=package["type"],
                        package=package["name"],
                        version=package["version"],
                        fixed_version=fixed,
                        severity=advisory.severity,
                        source="feed",
                    )
                )
    Finding.objects.bulk_create(findings)
    feed = feed_state()
    build.scanned_at = timezone.now()
    build.scan_feed = {
        "source": feed["source"],
        "loaded_at": feed["loaded_at"].isoformat() if feed["loaded_at"] else None,
        "entries": feed["entries"],
    }
    build.save(update_fields=["scanned_at", "scan_feed"])
    return findings


def scan_feed_reading(build: ImageBuild | None) -> dict[str, Any] | None:
    """The feed a build's last scan ran against, as shown beside its result: source, when it was loaded, entries,
    its age now and whether it is stale now (none loaded, or older than TRAINYARD_SCAN_FEED_MAX_AGE_S). None when
    the build was never scanned (or was scanned before the platform recorded the feed)."""
    if build is None or not build.scan_feed:
        return None
    recorded = build.scan_feed
    loaded_at = parse_datetime(recorded["loaded_at"]) if recorded.get("loaded_at") else None
    age = (timezone.now() - loaded_at).total_seconds() if loaded_at else None
    return {
        "source": recorded.get("source", ""),
        "loaded_at": loaded_at,
        "entries": recorded.get("entries", 0),
        "age_s": age,
        # entries None: an imported report (its own database); 0: the feed was empty, which proves nothing.
        "stale": recorded.get("entries") == 0 or age is None or age > settings.TRAINYARD_SCAN_FEED_MAX_AGE_S,
    }


def scan_status_now(image, build: ImageBuild | None) -> str:
    """An image's scan status as it reads now: a stored `passed` whose scan ran against a feed that has gone stale
    since (or whose feed was never recorded) reads `stale`; every other status as stored."""
    if image.scan_status != "passed":
        return image.scan_status
    if build is None or build.digest != image.digest:  # the newest build failed or is running: the one that made it
        build = image.builds.filter(digest=image.digest).exclude(scanned_at=None).order_by("-id").first()
    reading = scan_feed_reading(build)
    return "stale" if reading is None or reading["stale"] else "passed"


def _variants(names: set[str]) -> set[str]:
    """Package names as a feed may spell them (PyPI names differ in case, '-', '_' and '.')."""
    out = set(names)
    for name in names:
        out |= {name.replace("-", "_"), name.replace("-", "."), name.title()}
    return out


def feed_load(*, document: Any, source: str = "") -> int:
    """Load OSV entries (one, a list, or an OSV query answer) into the feed; returns the number of rows written."""
    rows = list(scan.parse_osv(document))
    with transaction.atomic():
        for row in rows:
            Advisory.objects.update_or_create(
                vuln_id=row["vuln_id"],
                ecosystem=row["ecosystem"],
                package=row["package"],
                defaults={**{k: row[k] for k in ("severity", "ranges", "versions", "summary")}, "source": source},
            )
    log.info("vulnerability_feed_loaded", rows=len(rows), source=source)
    return len(rows)


def trivy_import(*, build: ImageBuild, document: Any) -> int:
    rows = list(scan.parse_trivy(document))
    with transaction.atomic():
        build.findings.filter(source="trivy").delete()
        Finding.objects.bulk_create([Finding(build=build, source="trivy", **row) for row in rows])
        build.scanned_at = build.scanned_at or timezone.now()
        # An imported report is a scan against the importer's own database, as of now.
        build.scan_feed = {"source": "imported Trivy report", "loaded_at": timezone.now().isoformat(), "entries": None}
        build.save(update_fields=["scanned_at", "scan_feed"])
        image = build.image
        if image.digest == build.digest:
            image.scan_status = "failed" if build.findings.exists() else "passed"  # an imported Trivy report is a scan
            image.save(update_fields=["scan_status"])
    return len(rows)


def scan_exception_grant(
    *, policy: ScanPolicy, vuln_id: str, reason: str, expires_at: datetime, user, image: str = ""
) -> ScanException:
    if not reason.strip():
        raise ValidationFailed("an exception needs a reason", code="exception_without_reason", field="reason")
    if expires_at <= timezone.now():
        raise ValidationFailed("an exception must expire in the future", code="exception_expired", field="expires_at")
    if expires_at > timezone.now() + timedelta(days=365):
        raise ValidationFailed("an exception lasts at most a year", code="exception_too_long", field="expires_at")
    exception = ScanException.objects.create(
        policy=policy, vuln_id=vuln_id, reason=reason, expires_at=expires_at, created_by=user, image=image
    )
    log.info("scan_exception_granted", queue=policy.queue.name, vuln_id=vuln_id, by=getattr(user, "username", None))
    return exception


# ------------------------------------------------------------------------------------ schedule, retention


def images_rebuild_due(*, now: datetime | None = None) -> list[ImageBuild]:
    """Request a rebuild of every platform-built base whose last successful build is older than the period."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.TRAINYARD_IMAGE_REBUILD_S)
    # A base whose build failed is asked again a day later (or a period, if shorter), not every hour.
    retry_after = now - timedelta(seconds=min(settings.TRAINYARD_IMAGE_REBUILD_S, 24 * 3600))
    builds = []
    bases = BaseImage.objects.exclude(containerfile="")
    if settings.TRAINYARD_IMAGE_BUILDER != "podman":
        bases = bases.filter(rootfs="")  # made of the platform machine's files: only a local build can
    for base in bases.annotate(last_request=Max("builds__created_at")):
        if base.last_rebuilt is not None and base.last_rebuilt >= cutoff:
            continue
        if base.last_request is not None and base.last_request >= retry_after:
            active = base.builds.filter(status__in=["queued", "waiting_registry", "running"]).first()
            if active is not None:
                builds.append(active)
            continue
        builds.append(build_request(image=base, trigger=ImageBuild.Trigger.SCHEDULE))
    return builds


def project_images_expire(*, now: datetime | None = None) -> list[str]:
    """Drop project images nobody ran (or built) within the retention period, from the catalog and the registry."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.TRAINYARD_PROJECT_IMAGE_RETENTION_DAYS)
    gone = []
    # The newest job naming the image, through the reverse relation (the images app imports nothing of jobs).
    for image in ProjectImage.objects.select_related("team").annotate(last_job=Max("job__submitted_at")):
        seen = max(filter(None, [image.last_job, image.last_rebuilt]), default=None)
        if seen is not None and seen >= cutoff:
            continue
        if image.digest and settings.TRAINYARD_REGISTRY_URL:
            try:
                with registry.Client(settings.TRAINYARD_REGISTRY_URL) as client:
                    client.delete(repository_of(image), image.digest)
            except registry.RegistryError:
                continue  # try again next pass rather than forget what the registry holds
        gone.append(f"{image.team.slug}/{image.name}")
        image.delete()
    return gone


def project_image_get(*, team, name: str) -> ProjectImage:
    image = ProjectImage.objects.filter(team=team, name=name).select_related("base", "team").first()
    if image is None:
        raise NotFound(f"no project image '{name}' in team {team.slug}", code="unknown_image")
    return image
