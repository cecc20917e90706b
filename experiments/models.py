"""Experiments (a hyperparameter search) and their trials; each trial runs as an ordinary job (docs/experiments.md)."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q


class Experiment(models.Model):
    class State(models.TextChoices):
        RUNNING = "running"  # trials are submitted and followed
        PAUSED = "paused"  # its trials were stopped (checkpoints kept); resume starts them again from there
        COMPLETED = "completed"  # every trial ended, and the searcher has no more (or max_trials reached)
        CANCELLED = "cancelled"
        FAILED = "failed"  # a trial could not be submitted (the template stopped validating); message says why

    class Searcher(models.TextChoices):
        GRID = "grid"
        RANDOM = "random"
        ADAPTIVE = "adaptive"

    class Direction(models.TextChoices):
        MINIMIZE = "minimize"
        MAXIMIZE = "maximize"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=120)
    team = models.ForeignKey("quotas.Team", on_delete=models.PROTECT, related_name="experiments")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="experiments")
    template = models.JSONField(help_text="the trial's job body, with {{name}} placeholders for parameters")
    space = models.JSONField(help_text="parameter name -> {type, min, max} or {type: categorical, values}")
    searcher = models.CharField(max_length=10, choices=Searcher.choices)
    searcher_config = models.JSONField(default=dict, blank=True, help_text="adaptive: max_steps, min_steps, reduction")
    seed = models.PositiveIntegerField(default=0)
    metric = models.CharField(max_length=64, help_text="the reported metric the search optimizes")
    direction = models.CharField(max_length=8, choices=Direction.choices)
    max_trials = models.PositiveIntegerField()
    max_concurrent = models.PositiveIntegerField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.RUNNING)
    message = models.TextField(blank=True)
    code_digest = models.CharField(max_length=71, blank=True, help_text="the code snapshot every trial runs in")
    rightsize = models.CharField(
        max_length=6,
        default="advise",
        help_text="advise: show what the first trials' usage recommends; apply: later trials request it",
    )
    recommendation = models.JSONField(
        default=dict, blank=True, help_text="right-sizing from the first trials' usage (advice for the next ones)"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(max_trials__gte=1), name="experiment_max_trials_positive"),
            models.CheckConstraint(condition=Q(max_concurrent__gte=1), name="experiment_max_concurrent_positive"),
        ]
        indexes = [models.Index(fields=["state"], name="experiment_by_state")]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"

    @property
    def is_live(self) -> bool:
        return self.state in (self.State.RUNNING, self.State.PAUSED)


class Trial(models.Model):
    class State(models.TextChoices):
        ACTIVE = "active"  # its job is pending, starting or running
        COMPLETED = "completed"  # the job succeeded
        STOPPED_EARLY = "stopped_early"  # the searcher stopped it (its job: cancelled, reason stopped_early)
        PAUSED = "paused"  # stopped by a pause; resumes from its latest checkpoint
        FAILED = "failed"
        CANCELLED = "cancelled"
        TIMED_OUT = "timed_out"

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="trials")
    number = models.PositiveIntegerField(help_text="1-based; trial n has the searcher's n-th suggestion")
    params = models.JSONField()
    job = models.OneToOneField("jobs.Job", on_delete=models.PROTECT, related_name="trial")
    earlier_jobs = models.JSONField(default=list, blank=True, help_text="the jobs it ran in before a resume")
    state = models.CharField(max_length=14, choices=State.choices, default=State.ACTIVE)
    stop_reason = models.CharField(max_length=40, blank=True, help_text="why the platform asked its job to stop")
    metric_cursor = models.BigIntegerField(default=0, help_text="the last business metric row folded in")
    curve = models.JSONField(default=list, blank=True, help_text="[[step, value], ...] of the searched metric")
    last_value = models.FloatField(null=True, blank=True)
    last_step = models.BigIntegerField(null=True, blank=True)
    best_value = models.FloatField(null=True, blank=True)
    best_step = models.BigIntegerField(null=True, blank=True)
    rungs = models.JSONField(default=dict, blank=True, help_text="adaptive: rung step -> the value it had there")
    gpu_seconds = models.FloatField(default=0, help_text="card-seconds (milli/1000 x cards x run time), all jobs")
    created_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["experiment", "number"]
        constraints = [models.UniqueConstraint(fields=["experiment", "number"], name="trial_unique_number")]

    def __str__(self) -> str:
        return f"{self.experiment_id}#{self.number}"
