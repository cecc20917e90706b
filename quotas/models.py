"""Teams, memberships, queues, resource specs, API tokens and the quota audit trail."""

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q


class ResourceVector(models.Model):
    """The four quantities every quota, capability and request is measured in."""

    gpu_milli = models.PositiveIntegerField(default=0, help_text="GPU compute, 1000 = one whole card")
    gpu_memory_mib = models.PositiveBigIntegerField(default=0)
    cpu_milli = models.PositiveIntegerField(default=0)
    memory_mib = models.PositiveBigIntegerField(default=0)

    class Meta:
        abstract = True

    def vector(self) -> dict[str, int]:
        return {
            "gpu_milli": self.gpu_milli,
            "gpu_memory_mib": self.gpu_memory_mib,
            "cpu_milli": self.cpu_milli,
            "memory_mib": self.memory_mib,
        }


# Team slugs that name something else: `trainyard/base/` in the platform's registry holds the shared catalog bases
# (images.services.SHARED_NAMESPACE), which every team pulls and no team's build may push to.
RESERVED_TEAM_SLUGS = frozenset({"base"})


def slug_not_reserved(value: str) -> None:
    if value.lower() in RESERVED_TEAM_SLUGS:
        raise ValidationError(
            "'%(slug)s' is reserved: trainyard/%(slug)s/ in the registry holds the shared catalog bases",
            code="reserved_slug",
            params={"slug": value},
        )


class Team(ResourceVector):
    """A team owns jobs; its quota is hard (the four resources plus job counts)."""

    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=50, unique=True, validators=[slug_not_reserved])
    namespace = models.CharField(max_length=63, unique=True, help_text="Kubernetes namespace of its jobs")
    max_running_jobs = models.PositiveIntegerField(default=20)
    max_jobs_per_user = models.PositiveIntegerField(default=10, help_text="running jobs per member")
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="teams")
    # Checkpoints in the object store (jobs/checkpoints.py, docs/storage.md).
    storage_quota_bytes = models.PositiveBigIntegerField(
        default=0, help_text="object-store bytes the team's checkpoints may use; 0 = no limit"
    )
    checkpoint_keep_last = models.PositiveSmallIntegerField(
        default=5, help_text="checkpoints kept per job (the newest steps); 0 = all"
    )
    checkpoint_retention_days = models.PositiveIntegerField(
        default=30, help_text="checkpoints older than this are deleted; 0 = never"
    )
    # Code snapshots under TRAINYARD_CODE_ROOT (jobs/code.py, docs/cli.md "Your code").
    code_quota_bytes = models.PositiveBigIntegerField(
        default=2 * 2**30, help_text="bytes (compressed) the team's code snapshots may use; 0 = no limit"
    )
    code_retention_days = models.PositiveIntegerField(
        default=30,
        help_text="a snapshot no live job uses is removed this many days after its last use; 0 = never",
    )
    watch = models.JSONField(
        default=list,
        blank=True,
        help_text="log texts watched in every job of the team (besides the job's own): "
        '[{"pattern": "nan loss", "level": "critical"}]',
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        MEMBER = "member"
        MAINTAINER = "maintainer"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="membership_unique_team_user"),
            models.CheckConstraint(condition=Q(role__in=["member", "maintainer"]), name="membership_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class ResourceSpec(models.Model):
    """What a job asks for per replica: whole cards, or a fixed share of one card."""

    class Tier(models.TextChoices):
        GUARANTEED = "guaranteed"
        PERFORMANCE = "performance"
        SHARED = "shared"

    name = models.SlugField(max_length=50, unique=True)
    tier = models.CharField(max_length=16, choices=Tier.choices)
    gpu_count = models.PositiveSmallIntegerField(default=1, help_text="whole cards (guaranteed tier)")
    mig_profile = models.CharField(
        max_length=20,
        blank=True,
        help_text="guaranteed tier: each card is a MIG instance of this profile (e.g. 3g.40gb) instead of a card",
    )
    gpu_milli = models.PositiveIntegerField(help_text="compute per card, 1000 = whole")
    gpu_memory_eighths = models.PositiveSmallIntegerField(help_text="card memory share, 8 = whole card")
    cpu_milli_per_gpu = models.PositiveIntegerField(default=4000)
    memory_mib_per_gpu = models.PositiveBigIntegerField(default=32768)
    default_timeout_s = models.PositiveIntegerField(default=24 * 3600)
    description = models.TextField(blank=True)
    expected_slowdown = models.CharField(max_length=100, blank=True)
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["-gpu_milli", "name"]
        constraints = [
            models.CheckConstraint(condition=Q(gpu_milli__gte=1, gpu_milli__lte=1000), name="spec_gpu_milli_range"),
            models.CheckConstraint(
                condition=Q(gpu_memory_eighths__gte=1, gpu_memory_eighths__lte=8), name="spec_memory_eighths_range"
            ),
            models.CheckConstraint(condition=Q(gpu_count__gte=1), name="spec_gpu_count_positive"),
            models.CheckConstraint(
                condition=~Q(tier="guaranteed") | Q(gpu_milli=1000, gpu_memory_eighths=8),
                name="spec_guaranteed_is_whole",
            ),
            models.CheckConstraint(condition=Q(tier="guaranteed") | Q(gpu_count=1), name="spec_shares_are_one_card"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def exclusive(self) -> bool:
        return self.tier == self.Tier.GUARANTEED


class Queue(ResourceVector):
    """A platform queue: a hard capability (the ResourceVector fields), mapped to one Volcano Queue."""

    class State(models.TextChoices):
        OPEN = "open"
        CLOSED = "closed"

    class Ordering(models.TextChoices):
        FIFO = "fifo"
        BACKFILL = "backfill"

    class PriorityClass(models.TextChoices):
        # Admission order across queues: inference first, then training; preemptible jobs of any queue come last.
        INFERENCE = "inference"
        TRAINING = "training"

    name = models.SlugField(max_length=50, unique=True)
    description = models.TextField(blank=True)
    teams = models.ManyToManyField(Team, related_name="queues", blank=True)
    specs = models.ManyToManyField(ResourceSpec, related_name="queues", blank=True)
    priority = models.IntegerField(default=0, help_text="higher is dispatched first")
    max_member_priority = models.IntegerField(
        default=0,
        help_text="the highest job priority a team member may ask for here; maintainers and staff may go up to 100 "
        "(each such job records a priority_elevated event)",
    )
    weight = models.PositiveIntegerField(default=1)
    state = models.CharField(max_length=8, choices=State.choices, default=State.OPEN)
    ordering = models.CharField(max_length=10, choices=Ordering.choices, default=Ordering.FIFO)
    max_timeout_s = models.PositiveIntegerField(default=7 * 24 * 3600)
    default_timeout_s = models.PositiveIntegerField(default=24 * 3600)
    gang = models.BooleanField(default=False, help_text="multi-replica jobs start all-or-nothing")
    allow_explicit_request = models.BooleanField(
        default=False, help_text="accept gpu_milli/gpu_memory_mib instead of a spec"
    )
    secondary_network = models.CharField(
        max_length=200, blank=True, help_text="k8s.v1.cni.cncf.io/networks value for collective traffic"
    )
    outbound_network = models.BooleanField(
        default=False,
        help_text="local jobs may open connections to other machines (downloads, pip); they never reach the "
        "platform's own services. Off: local jobs have no network at all",
    )
    priority_class = models.CharField(
        max_length=10,
        choices=PriorityClass.choices,
        default=PriorityClass.TRAINING,
        help_text="inference queues are admitted before training queues; preemptible jobs come after both",
    )
    pools = ArrayField(
        models.SlugField(max_length=50),
        default=list,
        blank=True,
        help_text="node pools (the nodes' trainyard.io/pool label) its jobs are placed in; empty = every pool",
    )
    runtime_class = models.CharField(
        max_length=63,
        blank=True,
        help_text="Kubernetes RuntimeClass its jobs' pods run under (a sandboxed runtime such as kata or gvisor, for "
        "sensitive work); checked against the cluster's RuntimeClasses when saved. Empty: the cluster's default",
    )
    allow_preemptible = models.BooleanField(
        default=False,
        help_text="jobs may opt in to run preemptible: on idle capacity beyond the hard quota, stopped (with a "
        "notice and a final checkpoint) when quota-holding work needs the cards back",
    )

    class IdleAction(models.TextChoices):
        NOTIFY = "notify"
        STOP = "stop"

    idle_threshold_pct = models.FloatField(
        default=5.0,
        help_text="a running job whose GPUs stay below this utilization is idle (0 = never)",
    )
    idle_after_s = models.PositiveIntegerField(default=1800, help_text="…for this long: flagged and its owner told")
    idle_action = models.CharField(
        max_length=8,
        choices=IdleAction.choices,
        default=IdleAction.NOTIFY,
        help_text="notify: flag and tell only; stop: also cancel the job if it is still idle after the notice period",
    )
    idle_stop_after_s = models.PositiveIntegerField(
        default=3600, help_text="stop action: how long after the notice an idle job is cancelled"
    )

    class Meta:
        ordering = ["-priority", "name"]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=["open", "closed"]), name="queue_state_valid"),
            models.CheckConstraint(
                condition=Q(default_timeout_s__lte=models.F("max_timeout_s")), name="queue_default_within_max"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def volcano_name(self) -> str:
        return f"trainyard-{self.name}"


TOKEN_SCOPES = ("read", "submit", "admin")


def default_token_scopes() -> list[str]:
    return ["read", "submit"]


class ApiToken(models.Model):
    """A per-user token for CI; only its SHA-256 is stored, the secret is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, db_index=True)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    scopes = ArrayField(
        models.CharField(max_length=10),
        default=default_token_scopes,
        help_text="read: GET only; submit: also submit, cancel, retry jobs and report metrics; admin: everything the "
        "user may do, including managing tokens",
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class QuotaChange(models.Model):
    """Audit row: who changed which quota or capability field, from what to what, and when."""

    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="quota_changes")
    queue = models.ForeignKey(Queue, null=True, blank=True, on_delete=models.CASCADE, related_name="quota_changes")
    field = models.CharField(max_length=50)
    old_value = models.CharField(max_length=100)
    new_value = models.CharField(max_length=100)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-at"]
