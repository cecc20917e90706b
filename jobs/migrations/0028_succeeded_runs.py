"""Right-sizing's lookup moves off the job table: a narrow table of succeeded runs (jobs.models.SucceededRun) keyed
as the lookup asks, filled by the database when a job row becomes succeeded (on insert or on update of its state),
and backfilled from the jobs that already succeeded. The four md5 expression indexes on jobs_job go: every
submission, every admission and every state change wrote all four (an md5 of the command's JSON text each), for a
lookup that only ever wants succeeded runs."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# The keys are the expressions the lookup compares (monitoring.selectors._SIMILAR_SQL): the md5 of the JSON text.
ROW = """
    INSERT INTO jobs_succeededrun (job_id, team_id, owner_id, member_key, image_reference, command_key, labels_key, finished_at)
    VALUES (NEW.id, NEW.team_id, NEW.owner_id, (NEW.team_id::bigint << 32) | NEW.owner_id, NEW.image_reference,
            md5(COALESCE(NEW.command::text, '') || COALESCE(NEW.args::text, '')), md5(NEW.labels::text),
            NEW.finished_at)
    ON CONFLICT (job_id) DO NOTHING;
"""

FORWARD = [
    f"""
    CREATE FUNCTION trainyard_job_succeeded() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        {ROW}
        RETURN NULL;
    END $$
    """,
    # Row triggers with a WHEN: the admission UPDATE of thousands of rows evaluates the condition only.
    "CREATE TRIGGER trainyard_job_succeeded_insert AFTER INSERT ON jobs_job FOR EACH ROW "
    "WHEN (NEW.state = 'succeeded') EXECUTE FUNCTION trainyard_job_succeeded()",
    "CREATE TRIGGER trainyard_job_succeeded_update AFTER UPDATE OF state ON jobs_job FOR EACH ROW "
    "WHEN (NEW.state = 'succeeded' AND OLD.state <> 'succeeded') EXECUTE FUNCTION trainyard_job_succeeded()",
    """
    INSERT INTO jobs_succeededrun (job_id, team_id, owner_id, member_key, image_reference, command_key, labels_key, finished_at)
    SELECT id, team_id, owner_id, (team_id::bigint << 32) | owner_id, image_reference, md5(COALESCE(command::text, '') || COALESCE(args::text, '')),
           md5(labels::text), finished_at
    FROM jobs_job WHERE state = 'succeeded'
    """,
]

BACKWARD = [
    "DROP TRIGGER IF EXISTS trainyard_job_succeeded_insert ON jobs_job",
    "DROP TRIGGER IF EXISTS trainyard_job_succeeded_update ON jobs_job",
    "DROP FUNCTION IF EXISTS trainyard_job_succeeded()",
]


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0027_quota_use'),
        ('quotas', '0012_team_slug_reserved'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='SucceededRun',
            fields=[
                ('job', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='+', serialize=False, to='jobs.job')),
                ('image_reference', models.CharField(max_length=300)),
                ('member_key', models.BigIntegerField()),
                ('command_key', models.CharField(help_text='md5 of the command and args as JSON text', max_length=32)),
                ('labels_key', models.CharField(help_text='md5 of the labels as JSON text', max_length=32)),
                ('finished_at', models.DateTimeField()),
            ],
        ),
        migrations.RemoveIndex(
            model_name='job',
            name='job_similar_command_team',
        ),
        migrations.RemoveIndex(
            model_name='job',
            name='job_similar_labels_team',
        ),
        migrations.RemoveIndex(
            model_name='job',
            name='job_similar_command_user',
        ),
        migrations.RemoveIndex(
            model_name='job',
            name='job_similar_labels_user',
        ),
        migrations.AddField(
            model_name='succeededrun',
            name='owner',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='succeededrun',
            name='team',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='quotas.team'),
        ),
        migrations.AddIndex(
            model_name='succeededrun',
            index=models.Index(models.F('team'), models.F('image_reference'), models.F('command_key'), models.OrderBy(models.F('finished_at'), descending=True), name='succeeded_command_team'),
        ),
        migrations.AddIndex(
            model_name='succeededrun',
            index=models.Index(models.F('team'), models.F('image_reference'), models.F('labels_key'), models.OrderBy(models.F('finished_at'), descending=True), name='succeeded_labels_team'),
        ),
        migrations.AddIndex(
            model_name='succeededrun',
            index=models.Index(models.F('member_key'), models.F('image_reference'), models.F('command_key'), models.OrderBy(models.F('finished_at'), descending=True), name='succeeded_command_user'),
        ),
        migrations.AddIndex(
            model_name='succeededrun',
            index=models.Index(models.F('member_key'), models.F('image_reference'), models.F('labels_key'), models.OrderBy(models.F('finished_at'), descending=True), name='succeeded_labels_user'),
        ),
        migrations.RunSQL(sql=FORWARD, reverse_sql=BACKWARD),
    ]
