"""The GPU pool: nodes, physical GPUs and the logical devices (slices) the platform hands out."""

from django.db import models
from django.db.models import Q


class Node(models.Model):
    class State(models.TextChoices):
        READY = "ready"
        CORDONED = "cordoned"
        UNHEALTHY = "unhealthy"

    name = models.CharField(max_length=253, unique=True)
    backend = models.CharField(max_length=20, default="local")
    emulated = models.BooleanField(default=False, help_text="inventory configured, not read from hardware")
    driver_version = models.CharField(max_length=30, blank=True)
    cuda_version = models.CharField(max_length=20, blank=True)
    rack = models.CharField(max_length=100, blank=True)
    nvlink_domain = models.CharField(max_length=100, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    cpu_milli = models.PositiveIntegerField(default=0)
    memory_mib = models.PositiveBigIntegerField(default=0)
    state = models.CharField(max_length=10, choices=State.choices, default=State.READY)
    last_seen = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class GPU(models.Model):
    class Health(models.TextChoices):
        HEALTHY = "healthy"
        SUSPECT = "suspect"
        UNHEALTHY = "unhealthy"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    uuid = models.CharField(max_length=64, unique=True)
    index = models.PositiveSmallIntegerField()
    model = models.CharField(max_length=100)
    memory_mib = models.PositiveBigIntegerField()
    health = models.CharField(max_length=10, choices=Health.choices, default=Health.HEALTHY)
    quarantined = models.BooleanField(default=False)
    quarantine_reason = models.CharField(max_length=300, blank=True)
    health_changed_at = models.DateTimeField(null=True, blank=True)
    # A MIG instance is a device of its own (exclusive); the card it is carved from is not one.
    mig_profile = models.CharField(max_length=20, blank=True, help_text="MIG instance profile, e.g. 3g.40gb")
    mig_parent = models.CharField(max_length=64, blank=True, help_text="the UUID of the card in MIG mode")

    class Meta:
        ordering = ["node__name", "index"]
        verbose_name = "GPU"
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node")]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index}"


class LogicalDevice(models.Model):
    """A slice of one GPU (or the whole card, exclusively) held by one attempt until released."""

    gpu = models.ForeignKey(GPU, on_delete=models.CASCADE, related_name="slices")
    attempt = models.ForeignKey("jobs.Attempt", null=True, blank=True, on_delete=models.SET_NULL, related_name="slices")
    compute_milli = models.PositiveIntegerField()
    memory_mib = models.PositiveBigIntegerField()
    exclusive = models.BooleanField(default=False)
    # The share of the node's host CPU and memory that comes with this device (a replica's request split over
    # its devices), so the ledger alone says what each node has left.
    cpu_milli = models.PositiveIntegerField(default=0)
    host_memory_mib = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)
    release_reason = models.CharField(max_length=100, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["gpu"], condition=Q(released_at__isnull=True), name="slice_active_by_gpu"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(compute_milli__gte=1, compute_milli__lte=1000), name="slice_compute_range"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu} {self.compute_milli}m/{self.memory_mib}MiB"


class PoolRepair(models.Model):
    """What the reconcile pass found and fixed (a leaked slice freed, an over-commit flagged)."""

    kind = models.CharField(max_length=40)
    gpu = models.ForeignKey(GPU, null=True, blank=True, on_delete=models.SET_NULL)
    detail = models.TextField()
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-at"]


class PoolState(models.Model):
    """What the idle-lending rule remembers of a lending pool between its runs (jobs/lending.py)."""

    name = models.CharField(max_length=50, unique=True)
    below_since = models.DateTimeField(null=True, blank=True, help_text="its use has been under the threshold since")

    def __str__(self) -> str:
        return self.name
