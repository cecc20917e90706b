"""Monitoring: GPU health memory and history, telemetry samples (host layer), scheduling samples, business
metrics reported by jobs, alert rules (admin-editable data), alerts with their notifications and deliveries."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from cluster import probes


class Fault(models.TextChoices):
    """Why a GPU left service. `unhealthy` stands for any other cause (e.g. it vanished from the inventory)."""

    XID = probes.XID
    GPU_LOST = probes.GPU_LOST
    DRIVER_RESET = probes.DRIVER_RESET
    PROBE_FAILED = probes.PROBE_FAILED
    UNHEALTHY = "unhealthy"


class GpuStatus(models.Model):
    """What the health loop remembers about one GPU between probes."""

    gpu = models.OneToOneField("cluster.GPU", on_delete=models.CASCADE, primary_key=True, related_name="monitor")
    last_probe_at = models.DateTimeField(null=True, blank=True)
    last_probe_ok = models.BooleanField(null=True, blank=True)
    last_probe_reason = models.CharField(max_length=300, blank=True)
    fault = models.CharField(max_length=20, choices=Fault.choices, blank=True)
    fault_reason = models.CharField(max_length=300, blank=True)
    fault_since = models.DateTimeField(null=True, blank=True)
    failures = models.PositiveIntegerField(default=0, help_text="failed probes and fault reports in this incident")
    last_xid = models.IntegerField(null=True, blank=True, help_text="last Xid seen (a repeated value is no news)")
    last_sample_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "GPU status"
        verbose_name_plural = "GPU statuses"


class GpuHealthEvent(models.Model):
    """One change of a GPU's health or quarantine, with who or what caused it."""

    gpu = models.ForeignKey("cluster.GPU", on_delete=models.CASCADE, related_name="health_events")
    at = models.DateTimeField()
    from_health = models.CharField(max_length=10)
    to_health = models.CharField(max_length=10)
    quarantined = models.BooleanField()
    fault = models.CharField(max_length=20, blank=True)
    reason = models.CharField(max_length=300, blank=True)
    actor = models.CharField(max_length=150)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["gpu", "-at"], name="gpu_health_event_recent")]


class GpuSample(models.Model):
    """One telemetry reading of one card (host layer); a field the source does not report stays empty."""

    class Source(models.TextChoices):
        NVML = "nvml"
        DCGM = "dcgm"

    gpu = models.ForeignKey("cluster.GPU", on_delete=models.CASCADE, related_name="samples")
    at = models.DateTimeField()
    source = models.CharField(max_length=8, choices=Source.choices)
    utilization_pct = models.FloatField(null=True, blank=True)
    memory_used_mib = models.FloatField(null=True, blank=True)
    memory_total_mib = models.FloatField(null=True, blank=True)
    temperature_c = models.FloatField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)
    ecc_uncorrected = models.BigIntegerField(null=True, blank=True)
    xid = models.IntegerField(null=True, blank=True)

    class Meta:
        ordering = ["gpu", "at"]
        indexes = [
            models.Index(fields=["gpu", "at"], name="gpu_sample_by_time"),
            models.Index(fields=["at"], name="gpu_sample_time"),
        ]

    @property
    def memory_pct(self) -> float | None:
        if self.memory_used_mib is None or not self.memory_total_mib:
            return None
        return 100.0 * self.memory_used_mib / self.memory_total_mib


class JobGpuSample(models.Model):
    """GPU memory a job's own processes held on one card (NVML per-process accounting)."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="gpu_samples")
    attempt_number = models.PositiveSmallIntegerField(null=True, blank=True)
    gpu = models.ForeignKey("cluster.GPU", on_delete=models.CASCADE, related_name="job_samples")
    at = models.DateTimeField()
    memory_used_mib = models.FloatField()
    processes = models.PositiveSmallIntegerField(default=1)

    class Meta:
        ordering = ["job", "at"]
        indexes = [models.Index(fields=["job", "at"], name="job_gpu_sample_by_time")]


class BusinessMetric(models.Model):
    """One report from a job about itself: step, loss, throughput, progress, peak memory, or any number."""

    class Source(models.TextChoices):
        LOG = "log"
        API = "api"

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="business_metrics")
    attempt_number = models.PositiveSmallIntegerField(null=True, blank=True)
    at = models.DateTimeField()
    step = models.BigIntegerField(null=True, blank=True)
    values = models.JSONField(default=dict)
    source = models.CharField(max_length=4, choices=Source.choices)
    line = models.PositiveBigIntegerField(null=True, blank=True, help_text="log line number (source=log)")

    class Meta:
        ordering = ["job", "at", "id"]
        indexes = [models.Index(fields=["job", "at"], name="business_metric_by_time")]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt_number", "line"],
                condition=Q(source="log"),
                name="business_metric_log_line_once",
            ),
        ]


class LogScanCursor(models.Model):
    """How far the metric scanner has read one attempt's log: it resumes there and never re-reads."""

    attempt = models.OneToOneField(
        "jobs.Attempt", on_delete=models.CASCADE, primary_key=True, related_name="metric_cursor"
    )
    next_line = models.PositiveBigIntegerField(default=1)
    byte_offset = models.PositiveBigIntegerField(default=0)
    inode = models.PositiveBigIntegerField(null=True, blank=True)
    malformed = models.PositiveIntegerField(default=0, help_text="tagged lines that were not a JSON object")
    done = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)


class SchedulingSample(models.Model):
    """The scheduling layer at one moment, per queue (queue set) or for the whole pool (queue empty)."""

    at = models.DateTimeField()
    queue = models.ForeignKey(
        "quotas.Queue", null=True, blank=True, on_delete=models.CASCADE, related_name="scheduling_samples"
    )
    pending = models.PositiveIntegerField(default=0)
    running = models.PositiveIntegerField(default=0)
    admissions = models.PositiveIntegerField(default=0, help_text="admissions since the previous sample")
    interval_s = models.FloatField(default=0)
    wait_avg_s = models.FloatField(null=True, blank=True, help_text="mean wait of those admissions")
    allocation_ratio = models.FloatField(null=True, blank=True, help_text="pool only: compute held / schedulable")
    memory_allocation_ratio = models.FloatField(null=True, blank=True)
    fragmentation = models.FloatField(null=True, blank=True, help_text="pool only: share of free compute stranded")

    class Meta:
        ordering = ["at"]
        indexes = [models.Index(fields=["queue", "at"], name="scheduling_sample_by_time")]


class QueueWaitStats(models.Model):
    """Cumulative histogram of admission waits per queue (feeds /metrics; only ever grows)."""

    queue = models.OneToOneField("quotas.Queue", on_delete=models.CASCADE, primary_key=True, related_name="+")
    buckets = models.JSONField(default=dict, help_text="upper bound in seconds -> admissions that waited <= it")
    count = models.PositiveBigIntegerField(default=0)
    sum_s = models.FloatField(default=0)


class MonitorCursor(models.Model):
    """A named position in an append-only table (e.g. the last job event the wait-time sampler saw)."""

    name = models.CharField(max_length=50, primary_key=True)
    position = models.BigIntegerField(default=0)


# What an admin edits on a rule, in the order forms and the API show it.
RULE_EDITABLE_FIELDS = (
    "name",
    "description",
    "enabled",
    "level",
    "metric",
    "comparator",
    "threshold",
    "for_seconds",
    "window_seconds",
    "min_samples",
    "faults",
    "notify",
    "webhook",
    "webhook_url",
    "quarantine_gpu",
    "restart_job",
)


class AlertRule(models.Model):
    """One alert rule: a condition on a metric, a level, and the actions taken when an incident opens."""

    class Level(models.TextChoices):
        WARNING = "warning"
        CRITICAL = "critical"
        FATAL = "fatal"

    class Metric(models.TextChoices):
        GPU_MEMORY_PCT = "gpu_memory_pct", "GPU memory used, % of the card"
        GPU_TEMPERATURE_C = "gpu_temperature_c", "GPU temperature, °C"
        GPU_POWER_W = "gpu_power_w", "GPU power draw, W"
        GPU_UTILIZATION_PCT = "gpu_utilization_pct", "GPU utilization, %"
        JOB_FAILURE_RATE = "job_failure_rate", "failed jobs, % of jobs finished in the window"
        QUEUE_DEPTH = "queue_depth", "pending jobs in a queue"
        GPU_FAULT = "gpu_fault", "GPU out of service for one of the listed faults"

    class Comparator(models.TextChoices):
        GT = "gt", ">"
        GE = "ge", "≥"
        LT = "lt", "<"
        LE = "le", "≤"

    name = models.SlugField(max_length=100, unique=True)
    description = models.CharField(max_length=300, blank=True)
    enabled = models.BooleanField(default=True)
    level = models.CharField(max_length=8, choices=Level.choices)
    metric = models.CharField(max_length=24, choices=Metric.choices)
    comparator = models.CharField(max_length=2, choices=Comparator.choices, default=Comparator.GT)
    threshold = models.FloatField(default=0)
    for_seconds = models.PositiveIntegerField(default=0, help_text="the condition must hold this long")
    window_seconds = models.PositiveIntegerField(default=3600, help_text="job_failure_rate: look-back window")
    min_samples = models.PositiveIntegerField(default=1, help_text="job_failure_rate: finished jobs needed")
    faults = models.JSONField(default=list, blank=True, help_text="gpu_fault: the faults this rule matches")
    notify = models.BooleanField(default=True, help_text="in-app notification to admins and affected owners")
    webhook = models.BooleanField(default=True, help_text="POST the alert to the webhook (firing and resolved)")
    webhook_url = models.URLField(blank=True, help_text="empty: TRAINYARD_ALERT_WEBHOOK_URL")
    quarantine_gpu = models.BooleanField(default=False, help_text="take the GPU out of placement")
    restart_job = models.BooleanField(default=False, help_text="stop the affected attempts so they are retried")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(level__in=["warning", "critical", "fatal"]), name="alert_rule_level"),
        ]

    def __str__(self) -> str:
        return self.name


class Alert(models.Model):
    """One incident of one rule on one subject: opened once, updated while it lasts, resolved once."""

    class State(models.TextChoices):
        FIRING = "firing"
        ACKNOWLEDGED = "acknowledged"
        RESOLVED = "resolved"

    rule = models.ForeignKey(AlertRule, null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts")
    rule_name = models.CharField(max_length=100)
    level = models.CharField(max_length=8, choices=AlertRule.Level.choices)
    fingerprint = models.CharField(max_length=200, help_text="rule + subject: one open alert each")
    subject = models.CharField(max_length=200)
    gpu = models.ForeignKey("cluster.GPU", null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts")
    queue = models.ForeignKey("quotas.Queue", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    job_ids = models.JSONField(default=list, blank=True, help_text="jobs on the subject when it opened")
    state = models.CharField(max_length=12, choices=State.choices, default=State.FIRING)
    summary = models.CharField(max_length=500)
    value = models.FloatField(null=True, blank=True)
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=150, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=150, blank=True, help_text="a user name, or 'auto'")
    resolution = models.CharField(max_length=300, blank=True)
    actions_taken = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["fingerprint"], condition=~Q(state="resolved"), name="alert_one_open_per_fingerprint"
            ),
            models.CheckConstraint(
                condition=Q(state__in=["firing", "acknowledged", "resolved"]), name="alert_state_valid"
            ),
            models.CheckConstraint(
                condition=Q(state="resolved", resolved_at__isnull=False)
                | (~Q(state="resolved") & Q(resolved_at__isnull=True)),
                name="alert_resolved_iff_resolved_at",
            ),
        ]
        indexes = [models.Index(fields=["state", "level"], name="alert_by_state")]

    def __str__(self) -> str:
        return f"{self.rule_name}: {self.subject} ({self.state})"

    @property
    def is_open(self) -> bool:
        return self.state != self.State.RESOLVED


class Notification(models.Model):
    """The in-app side of an alert's notify action: one row per recipient."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="notifications")
    message = models.CharField(max_length=500)
    created_at = models.DateTimeField(auto_now_add=True)
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["user", "alert"], name="notification_once_per_alert")]


class WebhookDelivery(models.Model):
    """One POST of an alert event to a webhook, with its outcome."""

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=12, help_text="firing, resolved, or job_failed")
    url = models.URLField()
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        help_text="a user's own webhook: the body is signed with that user's secret",
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    response_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]


class PushSettings(models.Model):
    """Where a user wants their failed attempts pushed, besides the portal: a signed webhook and/or an email."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="push_settings")
    webhook_url = models.URLField(blank=True, max_length=500)
    webhook_secret = models.CharField(max_length=200, blank=True, help_text="HMAC-SHA256 key of the signature")
    email = models.EmailField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "push settings"

    def __str__(self) -> str:
        return f"push settings of {self.user}"


class UsageProfile(models.Model):
    """What one attempt used: GPU memory and utilization, CPU and host memory, sampled while it ran and kept
    after it ended (docs/rightsizing.md). GPU memory is per card (the busiest card); `gpu_source` says where the
    GPU numbers came from: `nvml` (per process), `dcgm` (per card), `emulated` (stated by the job on an emulated
    card), or empty when nothing measured them. `host_source` says the same of CPU and host memory: `proc` (the
    local supervisor read /proc), `metrics` (the Kubernetes resource metrics API, per replica), or empty."""

    attempt = models.OneToOneField("jobs.Attempt", on_delete=models.CASCADE, primary_key=True, related_name="usage")
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="usage_profiles")
    gpu_source = models.CharField(max_length=10, blank=True)
    host_source = models.CharField(max_length=10, blank=True, help_text="where CPU and host memory came from")
    samples = models.PositiveIntegerField(default=0)
    gpu_samples = models.PositiveIntegerField(default=0, help_text="samples with a GPU utilization reading")
    first_at = models.DateTimeField(null=True, blank=True)
    last_at = models.DateTimeField(null=True, blank=True)
    gpu_memory_peak_mib = models.FloatField(null=True, blank=True)
    gpu_memory_p95_mib = models.FloatField(null=True, blank=True)
    gpu_util_mean_pct = models.FloatField(null=True, blank=True)
    gpu_util_p95_pct = models.FloatField(null=True, blank=True)
    gpu_util_sum = models.FloatField(default=0, help_text="sum of every utilization sample (for an exact mean)")
    cpu_peak_milli = models.FloatField(null=True, blank=True)
    host_memory_peak_mib = models.FloatField(null=True, blank=True)
    series = models.JSONField(
        default=list, blank=True, help_text="[t, gpu_mem_mib, gpu_util_pct, cpu_milli, rss_mib], thinned"
    )
    cursor = models.PositiveBigIntegerField(default=0, help_text="bytes of the sample file read so far")
    telemetry_at = models.DateTimeField(null=True, blank=True, help_text="the last telemetry sample folded in")
    metrics_at = models.DateTimeField(
        null=True, blank=True, help_text="the last pod metrics measurement folded in (Kubernetes)"
    )
    final = models.BooleanField(default=False, help_text="the attempt ended and every sample was read")
    idle_since = models.DateTimeField(null=True, blank=True, help_text="start of the current run of idle samples")
    idle_flagged_at = models.DateTimeField(null=True, blank=True)
    leak_flagged_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["job"], name="usage_profile_by_job")]
