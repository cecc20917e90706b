"""Connections opened before a request needs them: each HTTP thread of a web process opens its database and Redis
connections, and has PostgreSQL read the catalog entries of the platform's tables, once the process has answered
its first request (kernel/wsgibridge.py, `ThreadedWSGI(warm=...)`).

A thread's first request otherwise paid for all of it: 8-12 ms to connect (the password exchange costs both sides
CPU), then 21-28 ms for a submission that takes 8-11 ms on a connection that has served a few, partly because a new
server process reads each table's and index's description from the catalogs on first use (measured in one process on
bench-submit's 100,000-job database). A web process starts its threads only as requests overlap, so when the load
rose, several threads paid this inside requests at once. Planning a statement on every table moves the log-in and
the catalog reads out of the requests, not the preparing of the statements themselves: the first submission on a
warmed connection still took 23-26 ms against 11-14 for the next (docs/operations.md, "Warm connections").
"""

from __future__ import annotations

import functools

import structlog

log = structlog.get_logger(__name__)


@functools.cache
def _catalog_statements() -> tuple[str, ...]:
    """One `EXPLAIN` per table of the database (the models' and those the migrations make by hand, such as the
    quota-use log): planning reads the table's description and its indexes'."""
    from django.db import connection

    qn = connection.ops.quote_name
    return tuple(f"EXPLAIN SELECT 1 FROM {qn(table)}" for table in connection.introspection.table_names())


def http_thread() -> None:
    """Open this thread's database connection (kept as a request's would be: CONN_MAX_AGE applies) and a Redis
    connection, and plan a statement on every table. A failure (the database is down) is logged and left to the
    first request, which reconnects as it always does."""
    from django.core.cache import cache
    from django.db import connection

    try:
        connection.ensure_connection()
        with connection.cursor() as cursor:
            for sql in _catalog_statements():
                cursor.execute(sql)
        cache.get("warmup:none")
    except Exception as exc:  # noqa: BLE001 - the first request meets the same error and answers it
        log.warning("http_thread_warmup_failed", error=str(exc))
        try:
            connection.close()  # the first request opens a fresh one
        except Exception:  # noqa: BLE001 - already broken: nothing more to close
            pass
