"""Failure rules for what a real cluster reports: Volcano records preemption as `Evict`, a graceful node shutdown
ends pods as `Terminated`, and a pod past its active deadline as `DeadlineExceeded`.

The seeded `evicted-or-lost` rule is widened only where an admin left its pattern as seeded; the new
`deadline-exceeded` rule is added where no rule of that name exists."""

from django.db import migrations

OLD_PATTERN = r"^(Evicted|NodeLost|Preempt\w*|NodeShutdown|Lost)$"
NEW_PATTERN = r"^(Evicted|Evict|NodeLost|Preempt\w*|NodeShutdown|Shutdown|Terminated|Lost)$"
DEADLINE = dict(
    order=55,
    reason_pattern=r"^DeadlineExceeded$",
    failure_class="user",
    reaction="no_retry",
    suggestion="The job ran past its time limit (the pod's active deadline): raise the job's timeout.",
)


def forwards(apps, schema_editor):
    rule = apps.get_model("jobs", "FailureRule")
    if not rule.objects.exists():
        return  # a fresh database: the seed writes the current defaults
    rule.objects.filter(name="evicted-or-lost", reason_pattern=OLD_PATTERN).update(reason_pattern=NEW_PATTERN)
    rule.objects.get_or_create(name="deadline-exceeded", defaults=DEADLINE)


def backwards(apps, schema_editor):
    rule = apps.get_model("jobs", "FailureRule")
    rule.objects.filter(name="evicted-or-lost", reason_pattern=NEW_PATTERN).update(reason_pattern=OLD_PATTERN)
    rule.objects.filter(name="deadline-exceeded", **DEADLINE).delete()


class Migration(migrations.Migration):
    dependencies = [("jobs", "0010_job_waiting_index")]

    operations = [migrations.RunPython(forwards, backwards)]
