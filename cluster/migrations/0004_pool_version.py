"""Version numbers for the GPU pool, so the dispatcher can keep the pool in memory and notice a change with one
small query (scheduler/pool.py).

Row 1 (structure) moves when nodes or GPUs appear, vanish or change what placement reads of them (state, health,
quarantine, driver, capacity, model, labels); heartbeats (`last_seen`) and other columns leave it alone. Row 2
(ledger) moves when a slice is handed out or released, or when an attempt finishes (its slices stop counting).
Each number is a fresh sequence value written in the same transaction as the change, so a reader sees a new
number exactly when the change commits.
"""

from django.db import migrations

FINISHED = "('succeeded', 'failed', 'cancelled', 'timed_out', 'lost')"

FORWARD = [
    "CREATE SEQUENCE trainyard_pool_seq",
    "CREATE TABLE trainyard_pool_version (id integer PRIMARY KEY CHECK (id IN (1, 2)), n bigint NOT NULL)",
    "INSERT INTO trainyard_pool_version (id, n) VALUES (1, nextval('trainyard_pool_seq')), "
    "(2, nextval('trainyard_pool_seq'))",
    """
    CREATE FUNCTION trainyard_pool_bump() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        UPDATE trainyard_pool_version SET n = nextval('trainyard_pool_seq') WHERE id = TG_ARGV[0]::integer;
        RETURN NULL;
    END $$
    """,
    # Structure: any insert or delete of a node or GPU; updates only when a column placement reads changes.
    "CREATE TRIGGER trainyard_pool_node_rows AFTER INSERT OR DELETE OR TRUNCATE ON cluster_node "
    "FOR EACH STATEMENT EXECUTE FUNCTION trainyard_pool_bump(1)",
    "CREATE TRIGGER trainyard_pool_gpu_rows AFTER INSERT OR DELETE OR TRUNCATE ON cluster_gpu "
    "FOR EACH STATEMENT EXECUTE FUNCTION trainyard_pool_bump(1)",
    """
    CREATE TRIGGER trainyard_pool_node_update AFTER UPDATE ON cluster_node FOR EACH ROW
    WHEN ((OLD.name, OLD.backend, OLD.emulated, OLD.driver_version, OLD.rack, OLD.labels::text, OLD.cpu_milli,
           OLD.memory_mib, OLD.state)
          IS DISTINCT FROM
          (NEW.name, NEW.backend, NEW.emulated, NEW.driver_version, NEW.rack, NEW.labels::text, NEW.cpu_milli,
           NEW.memory_mib, NEW.state))
    EXECUTE FUNCTION trainyard_pool_bump(1)
    """,
    """
    CREATE TRIGGER trainyard_pool_gpu_update AFTER UPDATE ON cluster_gpu FOR EACH ROW
    WHEN ((OLD.node_id, OLD.uuid, OLD.index, OLD.model, OLD.memory_mib, OLD.health, OLD.quarantined)
          IS DISTINCT FROM
          (NEW.node_id, NEW.uuid, NEW.index, NEW.model, NEW.memory_mib, NEW.health, NEW.quarantined))
    EXECUTE FUNCTION trainyard_pool_bump(1)
    """,
    # Ledger: slices handed out, released or deleted; attempts that finish.
    "CREATE TRIGGER trainyard_pool_slice_rows AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE "
    "ON cluster_logicaldevice FOR EACH STATEMENT EXECUTE FUNCTION trainyard_pool_bump(2)",
    f"""
    CREATE TRIGGER trainyard_pool_attempt_finished AFTER UPDATE ON jobs_attempt FOR EACH ROW
    WHEN (NEW.state IN {FINISHED} AND OLD.state NOT IN {FINISHED})
    EXECUTE FUNCTION trainyard_pool_bump(2)
    """,
    "CREATE TRIGGER trainyard_pool_attempt_rows AFTER DELETE OR TRUNCATE ON jobs_attempt "
    "FOR EACH STATEMENT EXECUTE FUNCTION trainyard_pool_bump(2)",
]

BACKWARD = [
    "DROP TRIGGER IF EXISTS trainyard_pool_node_rows ON cluster_node",
    "DROP TRIGGER IF EXISTS trainyard_pool_gpu_rows ON cluster_gpu",
    "DROP TRIGGER IF EXISTS trainyard_pool_node_update ON cluster_node",
    "DROP TRIGGER IF EXISTS trainyard_pool_gpu_update ON cluster_gpu",
    "DROP TRIGGER IF EXISTS trainyard_pool_slice_rows ON cluster_logicaldevice",
    "DROP TRIGGER IF EXISTS trainyard_pool_attempt_finished ON jobs_attempt",
    "DROP TRIGGER IF EXISTS trainyard_pool_attempt_rows ON jobs_attempt",
    "DROP FUNCTION IF EXISTS trainyard_pool_bump()",
    "DROP TABLE IF EXISTS trainyard_pool_version",
    "DROP SEQUENCE IF EXISTS trainyard_pool_seq",
]


class Migration(migrations.Migration):
    dependencies = [
        ("cluster", "0003_logicaldevice_cpu_milli_and_more"),
        ("jobs", "0007_job_gpu_models"),
    ]

    operations = [migrations.RunSQL(sql=FORWARD, reverse_sql=BACKWARD)]
