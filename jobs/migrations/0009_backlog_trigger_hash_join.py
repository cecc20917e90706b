"""Cheaper writes of waiting jobs' reasons and places (a dispatch pass may write thousands).

- The waiting-lines trigger (0008) joins a statement's old and new rows by id. Transition tables carry no
  statistics, so the planner picked a nested loop: an UPDATE of 5,000 waiting jobs' places spent about 3 s in the
  trigger. With nested loops off for that function alone it hashes the join (milliseconds).
- `jobs_job` has 16 indexes and its pages were filled to the brim, so every such update rewrote all of them.
  Pages left 30% free let an update that changes no indexed column (reason, message, place) stay on its page
  without touching an index (a heap-only update): 5,000 rows in about 0.15 s instead of 0.8 s.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("jobs", "0008_backlog_version")]

    operations = [
        migrations.RunSQL(
            sql=[
                "ALTER FUNCTION trainyard_backlog_changed() SET enable_nestloop = off",
                "ALTER TABLE jobs_job SET (fillfactor = 70)",
            ],
            reverse_sql=[
                "ALTER FUNCTION trainyard_backlog_changed() RESET enable_nestloop",
                "ALTER TABLE jobs_job RESET (fillfactor)",
            ],
        )
    ]
