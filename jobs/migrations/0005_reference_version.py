"""A version number for the reference rows submission validation reads (teams, memberships, queues and their
teams and specs, specs, images, registries), so each web process can keep them in memory and notice a change
with one tiny query (jobs/reference.py).

Any write to those tables, committed or not, moves the number to a fresh value of a sequence: sequence values
are never handed out twice, so a rolled-back change can never leave a number that a later change reuses. The
number lives in a row, so readers see a change exactly when it commits.
"""

from django.db import migrations

TABLES = (
    "quotas_team",
    "quotas_membership",
    "quotas_queue",
    "quotas_queue_teams",
    "quotas_queue_specs",
    "quotas_resourcespec",
    "images_baseimage",
    "images_projectimage",
    "images_registry",
)

FORWARD = [
    "CREATE SEQUENCE trainyard_reference_seq",
    "CREATE TABLE trainyard_reference_version (id integer PRIMARY KEY CHECK (id = 1), n bigint NOT NULL)",
    "INSERT INTO trainyard_reference_version (id, n) VALUES (1, nextval('trainyard_reference_seq'))",
    """
    CREATE FUNCTION trainyard_reference_bump() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO trainyard_reference_version (id, n) VALUES (1, nextval('trainyard_reference_seq'))
        ON CONFLICT (id) DO UPDATE SET n = EXCLUDED.n;
        RETURN NULL;
    END $$
    """,
    *(
        f"CREATE TRIGGER trainyard_reference_bump AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION trainyard_reference_bump()"
        for table in TABLES
    ),
]

BACKWARD = [
    *(f"DROP TRIGGER IF EXISTS trainyard_reference_bump ON {table}" for table in TABLES),
    "DROP FUNCTION IF EXISTS trainyard_reference_bump()",
    "DROP TABLE IF EXISTS trainyard_reference_version",
    "DROP SEQUENCE IF EXISTS trainyard_reference_seq",
]


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0004_remove_attempt_attempt_finished_iff_ended_and_more"),
        ("quotas", "0001_initial"),
        ("images", "0001_initial"),
    ]

    operations = [migrations.RunSQL(sql=FORWARD, reverse_sql=BACKWARD)]
