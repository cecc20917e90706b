"""What the jobs holding quota add up to per (queue, team, owner), kept by the database as the job rows change, so a
submission's first reason and a dispatch pass read a few summary rows instead of summing every holding job
(jobs.store.quota_use; ~9 ms of a submission's ~18 with the trace's cluster full, 6,839 holders).

`trainyard_quota_use` is a log of signed amounts: each statement that inserts, updates or deletes job rows adds one
row per (queue, team, owner) whose holding changed (a job holds quota while `reserved` and not `preemptible`).
Writers never update a shared row, so concurrent admissions and releases take no lock on the summary; a reader sums
the rows of its keys in its own snapshot, which always agrees with the job rows it sees. `quota_use_compact` folds
the log into one row per key (the dispatcher's full pass calls it when the log has grown).
"""

from django.db import migrations

AMOUNTS = "gpu_milli, gpu_memory_mib, cpu_milli, memory_mib, jobs"

# The holding amounts of a set of job rows, one line per job, signed.
HELD = (
    "SELECT queue_id, team_id, owner_id, {sign} total_gpu_milli, {sign} total_gpu_memory_mib, "
    "{sign} total_cpu_milli, {sign} total_memory_mib, {sign} 1 FROM {rows} WHERE reserved AND NOT preemptible"
)

FOLD = (
    "INSERT INTO trainyard_quota_use (queue_id, team_id, owner_id, " + AMOUNTS + ") "
    "SELECT queue_id, team_id, owner_id, sum(g), sum(gm), sum(c), sum(m), sum(n) "
    "FROM ({lines}) AS d(queue_id, team_id, owner_id, g, gm, c, m, n) "
    "GROUP BY queue_id, team_id, owner_id "
    "HAVING sum(g) <> 0 OR sum(gm) <> 0 OR sum(c) <> 0 OR sum(m) <> 0 OR sum(n) <> 0"
)

# One trigger per kind of write: (trigger suffix, event, transition tables, function suffix, what it appends).
TRIGGERS = [
    ("insert", "INSERT", "NEW TABLE AS new_rows", "inserted", FOLD.format(lines=HELD.format(sign="", rows="new_rows"))),
    (
        "update",
        "UPDATE",
        "OLD TABLE AS old_rows NEW TABLE AS new_rows",
        "updated",
        FOLD.format(
            lines=HELD.format(sign="", rows="new_rows") + " UNION ALL " + HELD.format(sign="-", rows="old_rows")
        ),
    ),
    ("delete", "DELETE", "OLD TABLE AS old_rows", "deleted", FOLD.format(lines=HELD.format(sign="-", rows="old_rows"))),
    ("truncate", "TRUNCATE", "", "truncated", "DELETE FROM trainyard_quota_use"),
]

FORWARD = [
    """
    CREATE TABLE trainyard_quota_use (
        id bigserial PRIMARY KEY,
        queue_id bigint NOT NULL,
        team_id bigint NOT NULL,
        owner_id bigint NOT NULL,
        gpu_milli bigint NOT NULL,
        gpu_memory_mib bigint NOT NULL,
        cpu_milli bigint NOT NULL,
        memory_mib bigint NOT NULL,
        jobs bigint NOT NULL
    )
    """,
    "CREATE INDEX trainyard_quota_use_queue ON trainyard_quota_use (queue_id)",
    "CREATE INDEX trainyard_quota_use_team ON trainyard_quota_use (team_id)",
]
for suffix, event, tables, function, body in TRIGGERS:
    FORWARD += [
        f"CREATE FUNCTION trainyard_quota_use_{function}() RETURNS trigger LANGUAGE plpgsql AS $$ "
        f"BEGIN {body}; RETURN NULL; END $$",
        f"CREATE TRIGGER trainyard_quota_use_{suffix} AFTER {event} ON jobs_job "
        f"{'REFERENCING ' + tables if tables else ''} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION trainyard_quota_use_{function}()",
    ]
FORWARD.append(FOLD.format(lines=HELD.format(sign="", rows="jobs_job")))  # what the jobs already there hold

BACKWARD = [
    stmt
    for suffix, _event, _tables, function, _body in TRIGGERS
    for stmt in (
        f"DROP TRIGGER IF EXISTS trainyard_quota_use_{suffix} ON jobs_job",
        f"DROP FUNCTION IF EXISTS trainyard_quota_use_{function}()",
    )
] + ["DROP TABLE IF EXISTS trainyard_quota_use"]


class Migration(migrations.Migration):
    dependencies = [("jobs", "0026_joined_xid")]

    operations = [migrations.RunSQL(sql=FORWARD, reverse_sql=BACKWARD)]
