"""A version number for the waiting lines, so a dispatch pass can tell that nothing but new arrivals changed
(scheduler/dispatch.py, the fast pass).

It moves when a job leaves `pending` (admitted, cancelled, failed), comes back to it (a retry), or changes its
priority while waiting. New submissions do not move it: a pass finds them by their submission time and checks the
number of waiting jobs, so a late-committing one is never missed.
"""

from django.db import migrations

FORWARD = [
    "CREATE SEQUENCE trainyard_backlog_seq",
    "CREATE TABLE trainyard_backlog_version (id integer PRIMARY KEY CHECK (id = 1), n bigint NOT NULL)",
    "INSERT INTO trainyard_backlog_version (id, n) VALUES (1, nextval('trainyard_backlog_seq'))",
    """
    CREATE FUNCTION trainyard_backlog_bump() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE trainyard_backlog_version SET n = nextval('trainyard_backlog_seq') WHERE id = 1;
        RETURN NULL;
    END $$
    """,
    # One run per statement, over the statement's changed rows: a pass admitting thousands of jobs in one UPDATE
    # moves the number once.
    """
    CREATE FUNCTION trainyard_backlog_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF EXISTS (
            SELECT 1 FROM old_rows o JOIN new_rows n ON n.id = o.id
            WHERE (o.state = 'pending') <> (n.state = 'pending')
               OR (n.state = 'pending' AND (o.priority, o.queue_id) IS DISTINCT FROM (n.priority, n.queue_id))
        ) THEN
            UPDATE trainyard_backlog_version SET n = nextval('trainyard_backlog_seq') WHERE id = 1;
        END IF;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER trainyard_backlog_update AFTER UPDATE ON jobs_job
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION trainyard_backlog_changed()
    """,
    "CREATE TRIGGER trainyard_backlog_rows AFTER DELETE OR TRUNCATE ON jobs_job "
    "FOR EACH STATEMENT EXECUTE FUNCTION trainyard_backlog_bump()",
]

BACKWARD = [
    "DROP TRIGGER IF EXISTS trainyard_backlog_update ON jobs_job",
    "DROP TRIGGER IF EXISTS trainyard_backlog_rows ON jobs_job",
    "DROP FUNCTION IF EXISTS trainyard_backlog_changed()",
    "DROP FUNCTION IF EXISTS trainyard_backlog_bump()",
    "DROP TABLE IF EXISTS trainyard_backlog_version",
    "DROP SEQUENCE IF EXISTS trainyard_backlog_seq",
]


class Migration(migrations.Migration):
    dependencies = [("jobs", "0007_job_gpu_models")]

    operations = [migrations.RunSQL(sql=FORWARD, reverse_sql=BACKWARD)]
