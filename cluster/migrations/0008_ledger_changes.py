"""Which GPUs each move of the pool's ledger number (0004, row 2) touched, so a dispatcher whose ledger is behind
re-reads the slices of those GPUs instead of every live slice.

A release (a job ending, a cancel) moved the number, and every dispatcher then read all the live slices: ~7,000 rows
joined to their attempts at trace scale, 0.7-0.9 s of the slowest passes while jobs ended and arrived (docs/
scheduler.md). Now the slice triggers and the attempt-finished trigger move the number through
`trainyard_ledger_bump(gpus)`, which also writes a row of `trainyard_ledger_change`: the new number, the number it
replaced and the GPUs' ids. The number's row is locked from the read of the old number to the commit, so the rows
chain: each one's `previous` is the `version` of the one before it. A reader that finds the chain unbroken from its
own number to the current one knows every GPU that changed; a move made another way (an attempt deleted, a
TRUNCATE) leaves a gap, and the reader reads every live slice, as before. `cluster.services.reconcile_pool` deletes
rows older than 15 minutes (a reader further behind finds a gap too).
"""

from django.db import migrations

FINISHED = "('succeeded', 'failed', 'cancelled', 'timed_out', 'lost', 'preempted')"

FORWARD = [
    """
    CREATE TABLE trainyard_ledger_change (
        version bigint PRIMARY KEY,
        previous bigint NOT NULL,
        gpu_ids bigint[] NOT NULL,
        at timestamptz NOT NULL DEFAULT clock_timestamp()
    )
    """,
    # Nothing when no GPU was named: a statement that touched no rows, an attempt that held no slices (as 0007).
    """
    CREATE FUNCTION trainyard_ledger_bump(gpus bigint[]) RETURNS void LANGUAGE plpgsql AS $$
    DECLARE
        before bigint;
        after bigint;
    BEGIN
        IF gpus IS NULL THEN
            RETURN;
        END IF;
        SELECT n INTO before FROM trainyard_pool_version WHERE id = 2 FOR UPDATE;
        UPDATE trainyard_pool_version SET n = nextval('trainyard_pool_seq') WHERE id = 2 RETURNING n INTO after;
        INSERT INTO trainyard_ledger_change (version, previous, gpu_ids) VALUES (after, before, gpus);
    END $$
    """,
    # Per statement, with the statement's rows.
    """
    CREATE FUNCTION trainyard_ledger_slice_rows() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM trainyard_ledger_bump((SELECT array_agg(DISTINCT gpu_id) FROM changed_rows));
        RETURN NULL;
    END $$
    """,
    """
    CREATE FUNCTION trainyard_ledger_slice_update() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM trainyard_ledger_bump((
            SELECT array_agg(DISTINCT g)
            FROM (SELECT gpu_id AS g FROM old_rows UNION SELECT gpu_id FROM changed_rows) touched
        ));
        RETURN NULL;
    END $$
    """,
    # An attempt that finishes stops its held slices counting: their GPUs changed.
    """
    CREATE FUNCTION trainyard_ledger_attempt_finished() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM trainyard_ledger_bump((
            SELECT array_agg(DISTINCT gpu_id) FROM cluster_logicaldevice WHERE attempt_id = NEW.id AND released_at IS NULL
        ));
        RETURN NULL;
    END $$
    """,
    "DROP TRIGGER trainyard_pool_slice_rows_insert ON cluster_logicaldevice",
    "DROP TRIGGER trainyard_pool_slice_rows_update ON cluster_logicaldevice",
    "DROP TRIGGER trainyard_pool_slice_rows_delete ON cluster_logicaldevice",
    "CREATE TRIGGER trainyard_pool_slice_rows_insert AFTER INSERT ON cluster_logicaldevice "
    "REFERENCING NEW TABLE AS changed_rows FOR EACH STATEMENT EXECUTE FUNCTION trainyard_ledger_slice_rows()",
    "CREATE TRIGGER trainyard_pool_slice_rows_update AFTER UPDATE ON cluster_logicaldevice "
    "REFERENCING OLD TABLE AS old_rows NEW TABLE AS changed_rows "
    "FOR EACH STATEMENT EXECUTE FUNCTION trainyard_ledger_slice_update()",
    "CREATE TRIGGER trainyard_pool_slice_rows_delete AFTER DELETE ON cluster_logicaldevice "
    "REFERENCING OLD TABLE AS changed_rows FOR EACH STATEMENT EXECUTE FUNCTION trainyard_ledger_slice_rows()",
    "DROP TRIGGER trainyard_pool_attempt_finished ON jobs_attempt",
    f"""
    CREATE TRIGGER trainyard_pool_attempt_finished AFTER UPDATE ON jobs_attempt FOR EACH ROW
    WHEN (NEW.state IN {FINISHED} AND OLD.state NOT IN {FINISHED})
    EXECUTE FUNCTION trainyard_ledger_attempt_finished()
    """,
]

BACKWARD = [
    "DROP TRIGGER trainyard_pool_attempt_finished ON jobs_attempt",
    f"""
    CREATE TRIGGER trainyard_pool_attempt_finished AFTER UPDATE ON jobs_attempt FOR EACH ROW
    WHEN (NEW.state IN {FINISHED} AND OLD.state NOT IN {FINISHED})
    EXECUTE FUNCTION trainyard_pool_bump(2)
    """,
    *[f"DROP TRIGGER trainyard_pool_slice_rows_{event} ON cluster_logicaldevice" for event in ("insert", "update", "delete")],
    *[
        f"CREATE TRIGGER trainyard_pool_slice_rows_{event} AFTER {event.upper()} ON cluster_logicaldevice "
        f"REFERENCING {'OLD' if event == 'delete' else 'NEW'} TABLE AS changed_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION trainyard_pool_bump_if_rows(2)"
        for event in ("insert", "update", "delete")
    ],
    "DROP FUNCTION trainyard_ledger_attempt_finished()",
    "DROP FUNCTION trainyard_ledger_slice_update()",
    "DROP FUNCTION trainyard_ledger_slice_rows()",
    "DROP FUNCTION trainyard_ledger_bump(bigint[])",
    "DROP TABLE trainyard_ledger_change",
]


class Migration(migrations.Migration):
    dependencies = [
        ("cluster", "0007_pool_version_only_when_rows_change"),
        ("jobs", "0029_queue_position_computed"),
    ]

    operations = [migrations.RunSQL(FORWARD, reverse_sql=BACKWARD)]
