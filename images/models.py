"""Base images and project images, with the CUDA/driver facts placement needs."""

from django.db import models
from django.db.models import Q

DIGEST_RE = r"^sha256:[0-9a-f]{64}$"


class Registry(models.Model):
    """A registry host images may come from; anything not listed (or not allowed) is refused."""

    host = models.CharField(max_length=253, unique=True)
    allowed = models.BooleanField(default=True)

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

    reference = models.CharField(max_length=300, help_text="registry/repository:tag")
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

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(digest="") | Q(digest__regex=DIGEST_RE), name="baseimage_digest_fmt")
        ]


class ProjectImage(ImageFacts):
    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, related_name="images")
    name = models.SlugField(max_length=80)
    base = models.ForeignKey(BaseImage, on_delete=models.PROTECT, related_name="derived")

    class Meta:
        ordering = ["team", "name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="projectimage_unique_per_team"),
            models.CheckConstraint(condition=Q(digest="") | Q(digest__regex=DIGEST_RE), name="projectimage_digest_fmt"),
        ]
