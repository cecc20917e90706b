"""Base images and project images, with the CUDA/driver facts placement needs; their builds, SBOMs and
findings; the vulnerability feed; per-queue scan policies and their explicit, expiring exceptions."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from images import scan

DIGEST_RE = r"^sha256:[0-9a-f]{64}$"


class Registry(models.Model):
    """A registry host images may come from; anything not listed (or not allowed) is refused."""

    host = models.CharField(max_length=253, unique=True)
    allowed = models.BooleanField(default=True)
    endpoint = models.URLField(
        blank=True, help_text="where tags are resolved to digests (a mirror); blank: https://<host>"
    )

    class Meta:
        verbose_name_plural = "registries"
        ordering = ["host"]

    def __str__(self) -> str:
        return self.host


class ImageFacts(models.Model):
    class Scan(models.TextChoices):
        UNSCANNED = "unscanned"
        PASSED = "passed"
        FAILED = "failed"

    reference = models.CharField(
        max_length=300, blank=True, help_text="registry/repository:tag (set by the platform for images it builds)"
    )
    digest = models.CharField(max_length=71, blank=True, help_text="sha256:…, pinned at submission")
    cuda_version = models.CharField(max_length=20, blank=True)
    framework = models.CharField(max_length=50, blank=True)
    framework_version = models.CharField(max_length=30, blank=True)
    min_driver_version = models.CharField(max_length=30, blank=True)
    scan_status = models.CharField(max_length=10, choices=Scan.choices, default=Scan.UNSCANNED)
    last_rebuilt = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return self.reference

    @property
    def pinned_reference(self) -> str:
        base = self.reference.split("@", 1)[0]
        return f"{base}@{self.digest}" if self.digest else self.reference


class BaseImage(ImageFacts):
    name = models.SlugField(max_length=80, unique=True)
    maintainer = models.CharField(max_length=100, blank=True)
    containerfile = models.TextField(blank=True, help_text="built by the platform when set; else an external image")
    rootfs = models.CharField(
        max_length=10,
        blank=True,
        choices=[("", "none"), ("host", "assembled from this machine's files")],
        help_text="'host': the build's context gets a rootfs of this machine's Python, numpy and shell "
        "(images/host_rootfs.py), so the image is made without network",
    )
    owners = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="owned_base_images")

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(digest="") | Q(digest__regex=DIGEST_RE), name="baseimage_digest_fmt")
        ]

    def __str__(self) -> str:
        return self.name


class ProjectImage(ImageFacts):
    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, related_name="images")
    name = models.SlugField(max_length=80)
    base = models.ForeignKey(BaseImage, on_delete=models.PROTECT, related_name="derived")
    containerfile = models.TextField(blank=True, help_text="FROM must name a catalog base image")
    requirements = models.TextField(blank=True, help_text="requirements.txt installed with pip on the base")
    stale = models.BooleanField(default=False, help_text="its base was rebuilt since its last build")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)

    class Meta:
        ordering = ["team", "name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="projectimage_unique_per_team"),
            models.CheckConstraint(condition=Q(digest="") | Q(digest__regex=DIGEST_RE), name="projectimage_digest_fmt"),
        ]

    def __str__(self) -> str:
        return f"{self.team.slug}/{self.name}"


class TeamImageSettings(models.Model):
    team = models.OneToOneField("quotas.Team", on_delete=models.CASCADE, related_name="image_settings")
    rebuild_on_base_change = models.BooleanField(
        default=False, help_text="rebuild the team's project images when their base is rebuilt (else: mark stale)"
    )

    class Meta:
        verbose_name_plural = "team image settings"

    def __str__(self) -> str:
        return f"{self.team}"


class Severity(models.TextChoices):
    UNKNOWN = "unknown"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


SEVERITY_RANK = {"unknown": 0, "low": 1, "medium": 2, "high": 3, "critical": 4}


class ImageBuild(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        WAITING_REGISTRY = "waiting_registry"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    class Trigger(models.TextChoices):
        MANUAL = "manual"
        SCHEDULE = "schedule"
        BASE_REBUILT = "base_rebuilt"
        SETUP = "setup"  # the platform's first start (the offline base)

    base_image = models.ForeignKey(BaseImage, null=True, blank=True, on_delete=models.CASCADE, related_name="builds")
    project_image = models.ForeignKey(
        ProjectImage, null=True, blank=True, on_delete=models.CASCADE, related_name="builds"
    )
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED)
    trigger = models.CharField(max_length=20, choices=Trigger.choices, default=Trigger.MANUAL)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    containerfile = models.TextField(blank=True, help_text="what was built, FROM pinned to the base's digest")
    log = models.TextField(blank=True)
    reference = models.CharField(max_length=300, blank=True)
    digest = models.CharField(max_length=71, blank=True)
    base_digest = models.CharField(max_length=71, blank=True)
    size_bytes = models.BigIntegerField(null=True, blank=True)
    layers = models.JSONField(default=list, blank=True)
    sbom = models.JSONField(default=list, blank=True, help_text="[{type: deb|pypi, name, version}]")
    warnings = models.JSONField(default=list, blank=True)
    registry_waits = models.PositiveIntegerField(default=0)
    config_user = models.CharField(
        max_length=100,
        null=True,
        blank=True,
        help_text='the USER its image config names ("": none, so root); null: not read',
    )
    scanned_at = models.DateTimeField(null=True, blank=True)
    scan_feed = models.JSONField(
        default=dict,
        blank=True,
        help_text="the feed its last scan ran against: {source, loaded_at, entries} ({}: not scanned; entries 0: none)",
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["digest"])]
        constraints = [
            models.CheckConstraint(
                condition=Q(base_image__isnull=False, project_image__isnull=True)
                | Q(base_image__isnull=True, project_image__isnull=False),
                name="imagebuild_one_image",
            )
        ]

    def __str__(self) -> str:
        return f"build {self.pk} of {self.image}"

    @property
    def runs_as_root(self) -> bool | None:
        return None if self.config_user is None else scan.runs_as_root(self.config_user)

    @property
    def image(self) -> BaseImage | ProjectImage:
        return self.base_image or self.project_image


class Advisory(models.Model):
    """One affected package of one vulnerability from the feed (OSV format), or of an imported Trivy report."""

    vuln_id = models.CharField(max_length=100)
    ecosystem = models.CharField(max_length=50, help_text="PyPI or Debian")
    package = models.CharField(max_length=200)
    severity = models.CharField(max_length=10, choices=Severity.choices, default=Severity.UNKNOWN)
    ranges = models.JSONField(
        default=list, blank=True, help_text="[[introduced, fixed, last_affected], …] (blank: open)"
    )
    versions = models.JSONField(default=list, blank=True, help_text="versions listed as affected")
    summary = models.TextField(blank=True)
    source = models.CharField(max_length=200, blank=True)
    loaded_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["vuln_id", "package"]
        constraints = [
            models.UniqueConstraint(fields=["vuln_id", "ecosystem", "package"], name="advisory_unique_package")
        ]
        indexes = [models.Index(fields=["ecosystem", "package"])]

    def __str__(self) -> str:
        return f"{self.vuln_id} ({self.package})"


class Finding(models.Model):
    build = models.ForeignKey(ImageBuild, on_delete=models.CASCADE, related_name="findings")
    vuln_id = models.CharField(max_length=100)
    ecosystem = models.CharField(max_length=50)
    package = models.CharField(max_length=200)
    version = models.CharField(max_length=100)
    fixed_version = models.CharField(max_length=100, blank=True)
    severity = models.CharField(max_length=10, choices=Severity.choices, default=Severity.UNKNOWN)
    source = models.CharField(max_length=20, default="feed", help_text="feed or trivy")

    class Meta:
        ordering = ["build", "vuln_id", "package"]

    def __str__(self) -> str:
        return f"{self.vuln_id} in {self.package} {self.version}"


class ScanPolicy(models.Model):
    """What a queue accepts: no finding above `max_severity` (unless excepted), and optionally only scanned images."""

    queue = models.OneToOneField("quotas.Queue", on_delete=models.CASCADE, related_name="scan_policy")
    max_severity = models.CharField(
        max_length=10, choices=Severity.choices, default=Severity.HIGH, help_text="highest severity allowed"
    )
    require_scan = models.BooleanField(default=False, help_text="refuse images the platform has not scanned")
    refuse_root = models.BooleanField(
        default=False, help_text="refuse images whose config runs as root (USER unset, root or 0)"
    )

    class Meta:
        verbose_name_plural = "scan policies"

    def __str__(self) -> str:
        return f"{self.queue}: up to {self.max_severity}"


class ScanException(models.Model):
    """An explicit, expiring permission to run despite one finding (for one image repository, or any)."""

    policy = models.ForeignKey(ScanPolicy, on_delete=models.CASCADE, related_name="exceptions")
    vuln_id = models.CharField(max_length=100)
    image = models.CharField(max_length=300, blank=True, help_text="registry/repository it applies to (blank: any)")
    reason = models.TextField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.vuln_id} until {self.expires_at:%Y-%m-%d}"
