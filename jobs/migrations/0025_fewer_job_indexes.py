"""Fewer indexes on the job tables: each is written by every submission and every admission (a pass admitting
2,000 jobs puts 2,000 new row versions into every index of jobs_job).

- owner, team and queue lose their own index: each leads a composite one (job_owner_recent, job_team_recent,
  job_dispatch_order) that answers the same lookups; so do an attempt's and an event's job (attempt_unique_number,
  event_job_time).
- reproduced_from and resume_from are indexed only where set.
- the timeout sweep's index holds only live jobs (job_live_deadline replaces job_state_deadline).

Only the indexes change: the foreign-key constraints stay as they are (no re-validation of the tables).
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# The single-column indexes Django made for these foreign keys (their names are derived from table and column).
DROPPED = [
    ("jobs_attempt_job_id_b587cf59", "jobs_attempt", "job_id"),
    ("jobs_job_owner_id_4c884775", "jobs_job", "owner_id"),
    ("jobs_job_queue_id_f324e67a", "jobs_job", "queue_id"),
    ("jobs_job_reproduced_from_id_b10def86", "jobs_job", "reproduced_from_id"),
    ("jobs_job_resume_from_id_cb8e5a75", "jobs_job", "resume_from_id"),
    ("jobs_job_team_id_c38d3640", "jobs_job", "team_id"),
    ("jobs_jobevent_job_id_79067df7", "jobs_jobevent", "job_id"),
]


class Migration(migrations.Migration):
    dependencies = [
        ("images", "0006_imagebuild_scan_feed"),
        ("jobs", "0024_finished_runs_index"),
        ("quotas", "0012_team_slug_reserved"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="job",
            name="job_state_deadline",
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="attempt",
                    name="job",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="attempts",
                        to="jobs.job",
                    ),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="owner",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="jobs",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="queue",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="jobs",
                        to="quotas.queue",
                    ),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="reproduced_from",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        to="jobs.job",
                    ),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="resume_from",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        help_text="the job whose latest checkpoint this job's first attempt starts from",
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="resumed_by",
                        to="jobs.job",
                    ),
                ),
                migrations.AlterField(
                    model_name="job",
                    name="team",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="jobs",
                        to="quotas.team",
                    ),
                ),
                migrations.AlterField(
                    model_name="jobevent",
                    name="job",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="events",
                        to="jobs.job",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    sql=[f'DROP INDEX IF EXISTS "{name}"' for name, _table, _column in DROPPED],
                    reverse_sql=[f'CREATE INDEX "{name}" ON "{table}" ("{column}")' for name, table, column in DROPPED],
                )
            ],
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("state__in", ["starting", "running"])),
                fields=["deadline"],
                name="job_live_deadline",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("reproduced_from__isnull", False)),
                fields=["reproduced_from"],
                name="job_reproduced_from",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("resume_from__isnull", False)), fields=["resume_from"], name="job_resume_from"
            ),
        ),
    ]
