"""Jobs, their attempts and events, and the editable failure-classification rules."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import BigIntegerField, F, Func, Q, TextField
from django.db.models.functions import Cast

from jobs.states import ATTEMPT_FINISHED, TERMINAL, AttemptState, JobState

# Sorted: a frozenset's order changes between processes and would make migrations flap.
TERMINAL_VALUES = sorted(s.value for s in TERMINAL)
FINISHED_VALUES = sorted(s.value for s in ATTEMPT_FINISHED)
LIVE_VALUES = sorted(s.value for s in AttemptState if s not in ATTEMPT_FINISHED)


def written_fields(model) -> list:
    """The concrete fields a copy of a row writes: all but those the database sets itself (`db_default`, such as
    `Job.joined_xid`), which a copy must leave to it."""
    return [f for f in model._meta.concrete_fields if f.db_default is models.NOT_PROVIDED]


# The 64-bit id of the transaction that writes the row (PostgreSQL's own: it never wraps), as a plain bigint.
WRITING_XID = Cast(Cast(Func(function="pg_current_xact_id", output_field=TextField()), TextField()), BigIntegerField())


# The order of a queue's waiting line, the dispatcher's (scheduler.dispatch.Waiting.order): preemptible jobs last,
# then higher priority first, then first come; the id breaks ties. A waiting job's place is its rank in it.
LINE_ORDER = ("preemptible", "-priority", "submitted_at", "id")


class Job(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=120)
    # No index of their own: each leads a composite index below (job_owner_recent, job_team_recent,
    # job_dispatch_order), which answers the same lookups; every extra index is written by each submission and
    # each admission (a pass admitting 2,000 jobs updates 2,000 rows in every index of this table).
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs", db_index=False)
    team = models.ForeignKey("quotas.Team", on_delete=models.PROTECT, related_name="jobs", db_index=False)
    queue = models.ForeignKey("quotas.Queue", on_delete=models.PROTECT, related_name="jobs", db_index=False)
    spec = models.ForeignKey("quotas.ResourceSpec", null=True, blank=True, on_delete=models.PROTECT)
    # The request, per replica, resolved at submission (from the spec, or explicit where the queue allows).
    gpu_count = models.PositiveSmallIntegerField(default=1)
    gpu_milli = models.PositiveIntegerField(help_text="per card")
    gpu_memory_mib = models.PositiveBigIntegerField(help_text="per card, as accounted against quotas")
    gpu_memory_eighths = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="when set, each slice gets this share of the actual card's memory"
    )
    cpu_milli = models.PositiveIntegerField()
    memory_mib = models.PositiveBigIntegerField()
    exclusive = models.BooleanField(default=False)
    mig_profile = models.CharField(
        max_length=20, blank=True, help_text="each card is a MIG instance of this profile (from the spec)"
    )
    # The whole job's request (per-card request x cards x replicas), summed for quota usage.
    total_gpu_milli = models.PositiveIntegerField(default=0)
    total_gpu_memory_mib = models.PositiveBigIntegerField(default=0)
    total_cpu_milli = models.PositiveIntegerField(default=0)
    total_memory_mib = models.PositiveBigIntegerField(default=0)
    replicas = models.PositiveSmallIntegerField(default=1)
    image_reference = models.CharField(max_length=300)
    image_digest = models.CharField(max_length=71, blank=True)
    code_digest = models.CharField(max_length=71, blank=True, help_text="the code snapshot it runs in (jobs/code.py)")
    watch = models.JSONField(
        default=list,
        blank=True,
        help_text='log texts that raise an alert: [{"pattern": "nan loss", "level": "critical"}]',
    )
    base_image = models.ForeignKey("images.BaseImage", null=True, blank=True, on_delete=models.SET_NULL)
    project_image = models.ForeignKey("images.ProjectImage", null=True, blank=True, on_delete=models.SET_NULL)
    min_driver_version = models.CharField(max_length=30, blank=True)
    gpu_models = models.JSONField(
        default=list, blank=True, help_text="GPU models (or families, e.g. A100) the job may run on; empty = any"
    )
    command = models.JSONField(help_text="argv list")
    args = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    working_dir = models.CharField(max_length=500, blank=True)
    priority = models.IntegerField(default=0)
    preemptible = models.BooleanField(
        default=False, help_text="runs on idle capacity beyond the quota and yields it when quota-holding work waits"
    )
    timeout_s = models.PositiveIntegerField()
    max_retries = models.PositiveSmallIntegerField(default=2)
    tensorboard = models.BooleanField(default=False)
    tensorboard_logdir = models.CharField(max_length=500, blank=True)
    mounts = models.JSONField(default=list, blank=True, help_text="data and checkpoint mounts")
    datasets = models.JSONField(
        default=list, blank=True, help_text="registered datasets as resolved at submission, with their mount paths"
    )
    labels = models.JSONField(default=dict, blank=True)
    ci = models.JSONField(default=dict, blank=True, help_text="whatever the CI passes: git commit, pipeline")
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    request_fingerprint = models.CharField(max_length=64, blank=True)
    # Indexed only where set (job_reproduced_from, job_resume_from below): most jobs have neither.
    reproduced_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, db_index=False)
    resume_from = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        db_index=False,
        related_name="resumed_by",
        help_text="the job whose latest checkpoint this job's first attempt starts from",
    )
    state = models.CharField(max_length=12, choices=JobState.choices, default=JobState.PENDING)
    # The transaction that inserted the row, set by the database (never by the ORM, never copied: a copy is a new
    # row). A fast dispatch pass reads only the waiting jobs of transactions it may not have seen (JobStore.joined).
    # Null on rows older than the column: the first pass of every dispatcher reads every line.
    joined_xid = models.BigIntegerField(null=True, editable=False, db_default=WRITING_XID)
    reason = models.CharField(max_length=60, blank=True)
    message = models.TextField(blank=True)
    retries_used = models.PositiveSmallIntegerField(default=0)
    # A retry that waits out an object-store outage (its checkpoint could not be restored): not admitted before
    # `not_before`; `store_wait_since` starts the outage's total wait (TRAINYARD_STORE_OUTAGE_WAIT_S).
    not_before = models.DateTimeField(null=True, blank=True, help_text="not admitted again before this")
    store_wait_since = models.DateTimeField(
        null=True, blank=True, help_text="since when its retries wait for the object store (none: they do not)"
    )
    excluded_gpus = models.JSONField(default=list, blank=True, help_text="GPU UUIDs to avoid on retry")
    excluded_nodes = models.JSONField(default=list, blank=True)
    reserved = models.BooleanField(default=False, help_text="quota is held by this job")
    exit_code = models.IntegerField(null=True, blank=True)
    failure_class = models.CharField(max_length=12, blank=True)
    suggestion = models.CharField(max_length=300, blank=True)
    reproduce = models.JSONField(default=dict, blank=True)
    submitted_at = models.DateTimeField(auto_now_add=True)
    admitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=JobState.values), name="job_state_valid"),
            models.CheckConstraint(
                condition=Q(state__in=TERMINAL_VALUES, finished_at__isnull=False)
                | (~Q(state__in=TERMINAL_VALUES) & Q(finished_at__isnull=True)),
                name="job_terminal_iff_finished",
            ),
            models.UniqueConstraint(
                fields=["team", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="job_idempotency_key_unique_per_team",
            ),
            models.CheckConstraint(condition=Q(replicas__gte=1), name="job_replicas_positive"),
            models.CheckConstraint(condition=Q(gpu_count__gte=1), name="job_gpu_count_positive"),
        ]
        indexes = [
            models.Index(fields=["queue", "state", "priority", "submitted_at"], name="job_dispatch_order"),
            # Each waiting line in LINE_ORDER: ranking a page's waiting jobs (jobs.selectors.queue_positions) reads
            # it in order instead of sorting the line (a 12,000-job line: 18 ms -> 5 ms). Only waiting rows: an
            # admission writes nothing here.
            models.Index(
                fields=["queue", "preemptible", "-priority", "submitted_at", "id"],
                name="job_waiting_line",
                condition=Q(state="pending"),
            ),
            models.Index(fields=["team", "-submitted_at"], name="job_team_recent"),
            models.Index(fields=["owner", "-submitted_at"], name="job_owner_recent"),
            # The timeout sweep (jobs.lifecycle): only live jobs have a deadline that matters.
            models.Index(fields=["deadline"], condition=Q(state__in=["starting", "running"]), name="job_live_deadline"),
            models.Index(
                fields=["reproduced_from"], condition=Q(reproduced_from__isnull=False), name="job_reproduced_from"
            ),
            models.Index(fields=["resume_from"], condition=Q(resume_from__isnull=False), name="job_resume_from"),
            models.Index(fields=["-submitted_at", "-id"], name="job_recent"),
            models.Index(fields=["queue"], condition=Q(reserved=True), name="job_reserved_by_queue"),
            models.Index(fields=["team"], condition=Q(reserved=True), name="job_reserved_by_team"),
            # The waiting jobs by the transaction that wrote them: a fast dispatch pass reads those from the
            # transactions still running at its last read, or later, from here alone.
            models.Index(fields=["joined_xid"], condition=Q(state="pending"), name="job_joined_waiting"),
            # The estimated starts' history (jobs.eta.History.load): the newest finished runs, read newest first
            # until enough are found (without it, every estimate scanned the table and sorted a month of runs).
            models.Index(
                F("finished_at").desc(),
                condition=Q(state__in=["succeeded", "failed"], started_at__isnull=False),
                name="job_finished_runs",
            ),
            # Whether any preemptible job holds cards: read after every dispatch pass that leaves jobs waiting.
            models.Index(fields=["id"], condition=Q(preemptible=True, reserved=True), name="job_preemptible_holding"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def queue_position(self) -> int | None:
        """Where a waiting job stands in its queue's line (1: the next one the dispatcher decides), None for any
        other state. Computed when read from the line's order (`LINE_ORDER`), never stored: a release that admits
        the head moved every job behind it, and rewriting those thousands of rows was most of a busy pass
        (docs/scheduler.md). A page of jobs is given its places in one query (`jobs.selectors.with_positions`); a
        lone job asks for its own when first read."""
        if self.state != JobState.PENDING:
            return None
        if "_queue_position" not in self.__dict__:
            from jobs.selectors import queue_positions

            self._queue_position = queue_positions([self.id]).get(self.id)
        return self._queue_position

    @queue_position.setter
    def queue_position(self, value: int | None) -> None:
        self._queue_position = value

    def refresh_from_db(self, *args, **kwargs) -> None:
        self.__dict__.pop("_queue_position", None)  # the line may have moved too: ranked again when next read
        super().refresh_from_db(*args, **kwargs)

    def total_request(self) -> dict[str, int]:
        return {
            "gpu_milli": self.total_gpu_milli,
            "gpu_memory_mib": self.total_gpu_memory_mib,
            "cpu_milli": self.total_cpu_milli,
            "memory_mib": self.total_memory_mib,
        }


class SucceededRun(models.Model):
    """A succeeded job, by what right-sizing looks it up by (monitoring.selectors.similar_runs): its team, its owner,
    its image and the md5 of its command and of its labels, newest first. Written by the database when a job row
    becomes succeeded (migration jobs/0028), so no path that finishes a job can miss it. The lookup's indexes live
    here rather than on jobs_job, where every submission, admission and state change wrote four of them."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="+")
    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, related_name="+", db_index=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+", db_index=False)
    image_reference = models.CharField(max_length=300)
    # The team and the owner in one value (MEMBER_SHIFT): the user's runs in that team, found by one column. With the
    # two as separate equalities PostgreSQL took them for independent, found the team's index as good a match for
    # a user's lookup as the user's own, and walked the teammates' runs to filter them out.
    member_key = models.BigIntegerField()
    command_key = models.CharField(max_length=32, help_text="md5 of the command and args as JSON text")
    labels_key = models.CharField(max_length=32, help_text="md5 of the labels as JSON text")
    finished_at = models.DateTimeField()

    MEMBER_SHIFT = 32  # member_key = team id << 32 | owner id

    class Meta:
        indexes = [
            models.Index(
                F(scope), F("image_reference"), F(key), F("finished_at").desc(), name=f"succeeded_{kind}_{name}"
            )
            for scope, name in (("team", "team"), ("member_key", "user"))
            for kind, key in (("command", "command_key"), ("labels", "labels_key"))
        ]

    @classmethod
    def member(cls, team_id: int, owner_id: int) -> int:
        return (team_id << cls.MEMBER_SHIFT) | owner_id


class Attempt(models.Model):
    class FailureClass(models.TextChoices):
        USER = "user"
        PLATFORM = "platform"
        RESOURCE = "resource"

    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="attempts", db_index=False
    )  # attempt_unique_number
    number = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=10, choices=AttemptState.choices, default=AttemptState.PLACED)
    backend = models.CharField(max_length=20)
    backend_ref = models.CharField(max_length=300, blank=True)
    node = models.ForeignKey("cluster.Node", null=True, blank=True, on_delete=models.SET_NULL)
    placement = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True, help_text="when its main process ended")
    stop_requested_at = models.DateTimeField(null=True, blank=True, help_text="the last time a stop was asked")
    observe_failing_since = models.DateTimeField(
        null=True, blank=True, help_text="since when the backend cannot read the attempt's state (none: it can)"
    )
    preempt_requested_at = models.DateTimeField(
        null=True, blank=True, help_text="when the platform asked it to yield its cards (the notice was sent)"
    )
    exit_code = models.IntegerField(null=True, blank=True)
    signal = models.IntegerField(null=True, blank=True)
    failure_class = models.CharField(max_length=10, choices=FailureClass.choices, blank=True)
    reaction = models.CharField(max_length=20, blank=True)
    reason = models.CharField(max_length=200, blank=True)
    rule = models.CharField(max_length=100, blank=True, help_text="the classification rule that matched")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job", "number"]
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="attempt_unique_number"),
            models.CheckConstraint(
                condition=Q(state__in=FINISHED_VALUES, ended_at__isnull=False)
                | (~Q(state__in=FINISHED_VALUES) & Q(ended_at__isnull=True)),
                name="attempt_finished_iff_ended",
            ),
            # Fencing: a job never has two attempts placed, starting or running at once.
            models.UniqueConstraint(
                fields=["job"], condition=Q(state__in=LIVE_VALUES), name="attempt_one_live_per_job"
            ),
        ]
        indexes = [models.Index(fields=["state", "backend"], name="attempt_live_by_backend")]

    def __str__(self) -> str:
        return f"{self.job_id}#{self.number}"

    @property
    def is_finished(self) -> bool:
        return self.state in ATTEMPT_FINISHED


class JobEvent(models.Model):
    class Level(models.TextChoices):
        INFO = "info"
        WARNING = "warning"
        ERROR = "error"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events", db_index=False)  # event_job_time
    attempt = models.ForeignKey(Attempt, null=True, blank=True, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=40)
    from_state = models.CharField(max_length=12, blank=True)
    to_state = models.CharField(max_length=12, blank=True)
    level = models.CharField(max_length=8, choices=Level.choices, default=Level.INFO)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    actor = models.CharField(max_length=150, help_text="user name, or the platform component")
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["job", "at"], name="event_job_time")]


class FailureRule(models.Model):
    """One row of the failure-classification table; the lowest `order` that matches wins."""

    class Reaction(models.TextChoices):
        RETRY = "retry"
        NO_RETRY = "no_retry"
        RETRY_ELSEWHERE = "retry_elsewhere"

    name = models.SlugField(max_length=100, unique=True)
    order = models.PositiveIntegerField(default=100)
    enabled = models.BooleanField(default=True)
    exit_codes = models.JSONField(default=list, blank=True, help_text="match any of these exit codes")
    signals = models.JSONField(default=list, blank=True, help_text="match any of these signals")
    reason_pattern = models.CharField(max_length=200, blank=True, help_text="regex on the container/pod reason")
    log_pattern = models.CharField(max_length=300, blank=True, help_text="regex on the attempt's log")
    node_unhealthy = models.BooleanField(default=False, help_text="match when the node/GPU turned unhealthy")
    failure_class = models.CharField(max_length=10, choices=Attempt.FailureClass.choices)
    reaction = models.CharField(max_length=20, choices=Reaction.choices)
    suggestion = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["order", "name"]

    def __str__(self) -> str:
        return self.name


class TensorBoardRoute(models.Model):
    """The `/tb/<job-id>/` route of a job: issued when it starts, revoked after it ends plus a grace period.

    Locally a `tensorboard` process on a port of its own; on Kubernetes a Service and an Ingress host.
    """

    class State(models.TextChoices):
        ACTIVE = "active"
        REVOKED = "revoked"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="tensorboard_routes")
    state = models.CharField(max_length=8, choices=State.choices, default=State.ACTIVE)
    backend = models.CharField(max_length=20)
    logdir = models.CharField(max_length=500)
    port = models.PositiveIntegerField(null=True, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    host = models.CharField(max_length=253, blank=True, help_text="virtual domain on Kubernetes")
    issued_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="set when the job ends: end + grace")
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job"], condition=Q(state="active"), name="tb_one_active_per_job"),
            models.UniqueConstraint(fields=["port"], condition=Q(state="active"), name="tb_port_unique_active"),
            models.UniqueConstraint(
                fields=["host"], condition=Q(state="active") & ~Q(host=""), name="tb_host_unique_active"
            ),
        ]


class JobTemplate(models.Model):
    """A team's saved submission: the body of `POST /api/v1/jobs/` without the team, ready to submit again.

    Any member of the team may use it; its author and the team's maintainers may edit or delete it."""

    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, related_name="job_templates")
    name = models.SlugField(max_length=80, help_text="unique within the team; `trainyard submit --template NAME`")
    description = models.CharField(max_length=300, blank=True)
    body = models.JSONField(help_text="submission fields (queue, spec, image, command, env, …) without the team")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="job_templates"
    )
    updated_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["team", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="job_template_name_unique_per_team")]

    def __str__(self) -> str:
        return f"{self.team_id}/{self.name}"


class JobBatch(models.Model):
    """A batch submitted with an `Idempotency-Key`: the same key and body sent again return these jobs.

    The key belongs to the user who sent the batch (a batch may span teams, so it cannot be a team's key like a
    single submission's); it lives apart from single submissions' keys."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="job_batches")
    idempotency_key = models.CharField(max_length=200)
    request_fingerprint = models.CharField(max_length=64)
    job_ids = models.JSONField(default=list, help_text="the batch's jobs, in the order they were submitted")
    submitted_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "idempotency_key"], name="job_batch_idempotency_key_unique")
        ]

    def __str__(self) -> str:
        return f"{self.owner_id}/{self.idempotency_key}"


class Checkpoint(models.Model):
    """One checkpoint an attempt saved to the object store: a top-level file or folder of its checkpoint folder.

    Recorded only once every file of it was uploaded and verified (size, MD5/ETag, SHA-256). `files` lists each
    file's path (relative to the checkpoint folder), object key, size and SHA-256; `sha256` is the file's own for
    a single file, else the SHA-256 of the sorted "path sha256" lines.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoints")
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="checkpoints")
    name = models.CharField(max_length=500)
    step = models.BigIntegerField(null=True, blank=True, help_text="the last number in the name, when it has one")
    size_bytes = models.PositiveBigIntegerField(default=0)
    sha256 = models.CharField(max_length=64)
    bucket = models.CharField(max_length=63)
    key = models.CharField(max_length=1024, help_text="object key of the file, or the prefix of the folder")
    files = models.JSONField(default=list)
    saved_at = models.DateTimeField(help_text="when its last file was uploaded")
    deleted_at = models.DateTimeField(null=True, blank=True, help_text="removed from the store by retention")

    class Meta:
        ordering = ["job", "-saved_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["attempt", "name"], name="checkpoint_unique_per_attempt")]
        indexes = [models.Index(fields=["job", "deleted_at"], name="checkpoint_job_live")]

    def __str__(self) -> str:
        return f"{self.job_id}#{self.attempt_id}:{self.name}"


class CodeSnapshot(models.Model):
    """A team's uploaded working directory, by content digest (jobs/code.py); the archive lives on disk."""

    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, related_name="code_snapshots")
    digest = models.CharField(max_length=71)
    size_bytes = models.PositiveBigIntegerField(default=0)
    unpacked_bytes = models.PositiveBigIntegerField(default=0)
    file_count = models.PositiveIntegerField(default=0)
    uploaded_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["team", "digest"], name="code_snapshot_unique_per_team")]

    def __str__(self) -> str:
        return f"{self.team_id}:{self.digest[:19]}"


class Dataset(models.Model):
    """A registered, read-only dataset: a prefix in the object store or a PersistentVolumeClaim, by version.

    Jobs name it (`datasets: [{name, version, path}]`); the team that owns it and the teams it is shared with
    may read it. Size and file count are read from the store when it is registered (claims: left at 0)."""

    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, related_name="datasets")
    name = models.SlugField(max_length=100)
    version = models.PositiveIntegerField(default=1)
    description = models.CharField(max_length=300, blank=True)
    s3_prefix = models.CharField(
        max_length=1024, blank=True, help_text="key prefix in the platform's bucket, e.g. datasets/imagenet/v3/"
    )
    claim = models.CharField(
        max_length=253, blank=True, help_text="a PersistentVolumeClaim in the team's namespace (Kubernetes only)"
    )
    shared_with = models.ManyToManyField(
        "quotas.Team", blank=True, related_name="datasets_shared", help_text="other teams that may read it"
    )
    size_bytes = models.PositiveBigIntegerField(default=0)
    file_count = models.PositiveIntegerField(default=0)
    registered_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team", "name", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name", "version"], name="dataset_unique_version"),
            models.CheckConstraint(
                condition=(Q(s3_prefix="") & ~Q(claim="")) | (~Q(s3_prefix="") & Q(claim="")),
                name="dataset_prefix_xor_claim",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.team_id}/{self.name} v{self.version}"

    @property
    def kind(self) -> str:
        return "s3" if self.s3_prefix else "pvc"
