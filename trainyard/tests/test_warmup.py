"""kernel/warmup.py: an HTTP thread's connections opened, and the catalogs of the platform's tables read, before its
first request."""

import pytest
from django.db import connection

from kernel import warmup


@pytest.mark.django_db(transaction=True)
def test_a_thread_warmed_up_has_its_connection_open_and_every_table_planned():
    connection.close()
    assert connection.connection is None
    warmup.http_thread()
    assert connection.connection is not None and connection.is_usable()
    planned = " ".join(warmup._catalog_statements())
    for table in ("jobs_job", "jobs_jobevent", "quotas_apitoken", "auth_user", "trainyard_quota_use"):
        assert f'"{table}"' in planned, table


@pytest.mark.django_db(transaction=True)
def test_a_warm_up_that_cannot_reach_the_database_says_so_and_raises_nothing(monkeypatch):
    logged = []
    monkeypatch.setattr(warmup.log, "warning", lambda event, **kw: logged.append((event, kw)))

    def refuse():
        raise OSError("connection refused")

    monkeypatch.setattr(connection, "ensure_connection", refuse)
    warmup.http_thread()
    assert logged == [("http_thread_warmup_failed", {"error": "connection refused"})]
