"""The pool's version numbers (0004) move only when a statement changed rows.

The statement-level triggers moved them on every INSERT, UPDATE or DELETE, also one that matched nothing: the
pool reconcile's UPDATE that freed no slice moved the ledger's number every run, so every dispatcher re-read the
ledger and its next pass read every waiting line again (a second at trace scale, every reconcile). Now each event
has its own trigger that sees the statement's rows (a transition table) and moves the number only when there are
some. TRUNCATE, which has no rows to show, still always moves it.
"""

from django.db import migrations

# (trigger, table, version row) of the statement-level triggers 0004 made.
STATEMENT_TRIGGERS = [
    ("trainyard_pool_node_rows", "cluster_node", 1, ("INSERT", "DELETE")),
    ("trainyard_pool_gpu_rows", "cluster_gpu", 1, ("INSERT", "DELETE")),
    ("trainyard_pool_slice_rows", "cluster_logicaldevice", 2, ("INSERT", "UPDATE", "DELETE")),
    ("trainyard_pool_attempt_rows", "jobs_attempt", 2, ("DELETE",)),
]

FUNCTION = """
CREATE FUNCTION trainyard_pool_bump_if_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM changed_rows) THEN
        UPDATE trainyard_pool_version SET n = nextval('trainyard_pool_seq') WHERE id = TG_ARGV[0]::integer;
    END IF;
    RETURN NULL;
END $$
"""


def _forward() -> list[str]:
    sql = [FUNCTION]
    for name, table, row, events in STATEMENT_TRIGGERS:
        sql.append(f"DROP TRIGGER {name} ON {table}")
        for event in events:
            side = "OLD" if event == "DELETE" else "NEW"
            sql.append(
                f"CREATE TRIGGER {name}_{event.lower()} AFTER {event} ON {table} "
                f"REFERENCING {side} TABLE AS changed_rows "
                f"FOR EACH STATEMENT EXECUTE FUNCTION trainyard_pool_bump_if_rows({row})"
            )
        sql.append(
            f"CREATE TRIGGER {name}_truncate AFTER TRUNCATE ON {table} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION trainyard_pool_bump({row})"
        )
    return sql


def _backward() -> list[str]:
    sql = []
    for name, table, row, events in STATEMENT_TRIGGERS:
        for event in (*events, "TRUNCATE"):
            sql.append(f"DROP TRIGGER IF EXISTS {name}_{event.lower()} ON {table}")
        sql.append(
            f"CREATE TRIGGER {name} AFTER {' OR '.join((*events, 'TRUNCATE'))} ON {table} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION trainyard_pool_bump({row})"
        )
    sql.append("DROP FUNCTION IF EXISTS trainyard_pool_bump_if_rows()")
    return sql


class Migration(migrations.Migration):
    dependencies = [
        ("cluster", "0006_pool_state"),
        ("jobs", "0007_job_gpu_models"),
    ]

    operations = [migrations.RunSQL(_forward(), reverse_sql=_backward())]
