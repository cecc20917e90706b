# Rewrites the two state constraints with their state lists sorted, so they no longer change between runs.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0003_tensorboardroute_and_more"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="attempt", name="attempt_finished_iff_ended"),
        migrations.RemoveConstraint(model_name="job", name="job_terminal_iff_finished"),
        migrations.AddConstraint(
            model_name="attempt",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("ended_at__isnull", False),
                             ("state__in", ["cancelled", "failed", "lost", "succeeded", "timed_out"])),
                    models.Q(models.Q(("state__in", ["cancelled", "failed", "lost", "succeeded", "timed_out"]),
                                      _negated=True), ("ended_at__isnull", True)),
                    _connector="OR",
                ),
                name="attempt_finished_iff_ended",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("finished_at__isnull", False),
                             ("state__in", ["cancelled", "failed", "succeeded", "timed_out"])),
                    models.Q(models.Q(("state__in", ["cancelled", "failed", "succeeded", "timed_out"]),
                                      _negated=True), ("finished_at__isnull", True)),
                    _connector="OR",
                ),
                name="job_terminal_iff_finished",
            ),
        ),
    ]
