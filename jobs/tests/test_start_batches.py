"""A start message's attempts on a backend that starts several at once (Volcano: `concurrent_submits`): each of
them started once, by a few threads that live as long as the worker process, each logging in to PostgreSQL once
for all the batches it starts."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.db.backends.signals import connection_created

from jobs import lifecycle, tasks
from quotas.models import Team

pytestmark = pytest.mark.django_db(transaction=True)


class _Backend:
    concurrent_submits = 4


def test_a_batch_is_started_by_a_few_threads_with_one_connection_each(monkeypatch):
    started: list[int] = []
    threads: set[str] = set()
    lock = threading.Lock()

    def attempt_start(*, attempt_id: int) -> None:
        Team.objects.exists()  # a query on the thread's own connection, as a real start makes
        with lock:
            started.append(attempt_id)
            threads.add(threading.current_thread().name)

    logins: list[str] = []

    def created(sender, connection, **kwargs) -> None:
        logins.append(threading.current_thread().name)

    monkeypatch.setattr(lifecycle, "attempt_start", attempt_start)
    monkeypatch.setattr("jobs.backends.get_backend", lambda *a, **k: _Backend())
    tasks._STARTERS.clear()  # a worker process that has started nothing yet
    connection_created.connect(created)
    try:
        tasks.start_attempts(list(range(1, 21)))
        assert sorted(started) == list(range(1, 21))  # every attempt, once
        assert 1 < len(threads) <= 4, threads
        # One log-in per starting thread, not one per attempt (20 before).
        assert len(logins) == len(set(logins)) <= 4, logins
        first = len(logins)
        for batch in range(5):  # the next batches: the same threads, on the connections they already have
            tasks.start_attempts(list(range(100 * (batch + 1), 100 * (batch + 1) + 6)))
        assert len(started) == 50
        assert len(logins) == first, logins  # before, every batch logged in again (up to 4 a batch)
    finally:
        connection_created.disconnect(created)
        tasks.starters_stop()
    assert connection.connection is None or connection.is_usable()  # the worker's own connection is left alone


@pytest.mark.parametrize(
    ("admitted", "messages", "largest"),
    [(1, 1, 1), (20, 1, 20), (21, 2, 20), (640, 32, 20), (641, 31, 21), (6839, 32, 214)],
)
def test_a_pass_sends_batches_of_twenty_and_at_most_thirty_two_messages(admitted, messages, largest):
    from jobs.store import start_batches

    batches = start_batches(list(range(admitted)))
    assert len(batches) == messages and max(map(len, batches)) == largest
    assert [a for b in batches for a in b] == list(range(admitted))  # each attempt once, in order
