"""Statements PostgreSQL plans once per connection instead of on every run.

Django binds parameters on the client by default (the values are written into the SQL text), so the server parses
and plans every statement each time it comes, and Django also turns off psycopg's automatic preparation to keep
connection poolers working. For the few statements every request runs, the plan costs more than the run: the
lookup of a submission's earlier runs took 0.37 ms to plan and 0.09 ms to execute on a 100,000-job database
(bench/submit.py). `prepared_cursor()` runs them as server-side prepared statements on the request's own
connection, through Django's cursor wrapper all the same (query capture, execute wrappers, error translation).

Only statements written here for it go this way: the text must be fixed (no values formatted into it), and the
parameters are typed by PostgreSQL, so a value needs a cast where its type is not clear from where it is used.
A prepared statement lives as long as its connection (psycopg keeps the last 100 per connection); behind a
transaction-pooling proxy such as PgBouncer in transaction mode, leave it off with TRAINYARD_DB_PREPARE=false.
"""

from __future__ import annotations

import functools
import weakref

from django.conf import settings
from django.db import connection
from psycopg.pq import TransactionStatus


@functools.cache
def _classes():
    from django.db.backends.postgresql.base import CursorDebugWrapper, ServerBindingCursor

    class PreparingCursor(ServerBindingCursor):
        """Server-side binding, and every statement prepared (psycopg prepares it on its first run on the
        connection, then sends only the name and the values)."""

        def execute(self, query, params=None, *, prepare=None, binary=None):
            return super().execute(query, params, prepare=True if prepare is None else prepare, binary=binary)

    class PreparedDebugWrapper(CursorDebugWrapper):
        """Where queries are logged (DEBUG, tests capturing them): each statement with its values written in, as
        Django logs its own; Django would read it back from the cursor, which holds no text for a prepared run."""

        def debug_sql(self, sql=None, params=None, use_last_executed_query=False, many=False):
            if use_last_executed_query and not many:
                try:
                    sql = self.db.ops.compose_sql(sql, params)
                except Exception:  # noqa: BLE001 - a value the client cannot write in: log the text as sent
                    pass
            return super().debug_sql(sql, params, False, many)

    return PreparingCursor, PreparedDebugWrapper


# What psycopg's connection-wide count of runs before preparing is set to where Django left it off (None: never,
# not even when asked): a statement is then prepared only when asked, as this module's cursors do. Django's own
# cursors bind on the client, and psycopg never prepares for those, whatever the count.
_ONLY_WHEN_ASKED = 2**31 - 1
# Connections told to plan a prepared statement once for all values (PostgreSQL's `plan_cache_mode`). In its
# default mode PostgreSQL kept planning the lookup of a submission's earlier runs for each set of values (0.7 ms
# to plan, 0.15 ms to run; 0.32 ms in all with the one plan). The statements here look rows up by key, where one
# plan suits every value. It holds for the connection's session: the only other statements PostgreSQL caches plans
# for there are the trigger functions' (small updates and inserts by key), as Django prepares nothing of its own.
_generic = weakref.WeakSet()


def prepared_cursor():
    """A cursor of the default connection (a context manager, as `connection.cursor()`) that prepares what it runs;
    a plain cursor where preparing is turned off or the database is not PostgreSQL."""
    if connection.vendor != "postgresql" or not settings.TRAINYARD_DB_PREPARE:
        return connection.cursor()
    cursor_class, debug_wrapper = _classes()
    # As BaseDatabaseWrapper._cursor does for its own cursors.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw_connection = connection.connection
        if raw_connection.prepare_threshold is None:
            raw_connection.prepare_threshold = _ONLY_WHEN_ASKED
        idle = raw_connection.autocommit and raw_connection.info.transaction_status == TransactionStatus.IDLE
        if idle and raw_connection not in _generic:
            # Outside a transaction, so that no rollback takes it back (inside one, the next use outside does it).
            raw_connection.execute("SET plan_cache_mode = force_generic_plan")
            _generic.add(raw_connection)
        raw = cursor_class(connection.connection)
        _follow_timezone(raw)
        connection.validate_thread_sharing()
        return debug_wrapper(raw, connection) if connection.queries_logged else connection.make_cursor(raw)


def _follow_timezone(cursor) -> None:
    """The connection's time zone for timestamps read by `cursor`, as Django's own cursors get it."""
    from django.db.backends.postgresql.base import TIMESTAMPTZ_OID
    from django.db.backends.postgresql.psycopg_any import register_tzloader
    from psycopg.pq import Format

    loader = connection.connection.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)
    if connection.timezone != loader.timezone:
        register_tzloader(connection.timezone, cursor)
