"""Beat's observe task as it is deployed: messages every TRAINYARD_OBSERVE_EVERY_S to a worker with several
processes. Passes never overlap, and a long pass is followed by a rest in proportion to its length."""

from __future__ import annotations

import threading
import time

import pytest
from django.core.cache import cache

from jobs import lifecycle, tasks


@pytest.fixture
def passes(monkeypatch, settings):
    """Each pass takes `passes.length` seconds; `passes.count` counts the passes that ran."""

    class Passes:
        count = 0
        length = 0.0

    def observe(**_kwargs) -> int:
        Passes.count += 1
        time.sleep(Passes.length)
        return 1

    monkeypatch.setattr(lifecycle, "attempts_observe", observe)
    monkeypatch.setattr(lifecycle, "nodes_reachability_check", lambda **_kwargs: 0)
    cache.delete_many([tasks.OBSERVE_LOCK, tasks.OBSERVE_REST])
    yield Passes
    cache.delete_many([tasks.OBSERVE_LOCK, tasks.OBSERVE_REST])


def test_a_pass_that_finds_another_running_is_skipped(passes):
    passes.length = 0.5
    first = threading.Thread(target=tasks.observe_pass)
    first.start()
    time.sleep(0.2)
    assert tasks.observe_pass() is None  # the first one still runs
    first.join()
    assert passes.count == 1


def test_a_long_pass_is_followed_by_a_rest_in_proportion(passes, settings):
    settings.TRAINYARD_OBSERVE_REST_FACTOR = 2.0
    passes.length = 0.3
    began = time.time()
    assert tasks.observe_pass() == 1
    ended = time.time()
    # The rest is twice the pass as the pass measured it: at least 0.6 s (a loaded machine makes the pass longer).
    rest_until = float(cache.get(tasks.OBSERVE_REST))
    assert began + 0.9 <= rest_until <= ended + 2 * (ended - began) + 0.05
    passes.length = 0.0
    assert tasks.observe_pass() is None  # resting
    assert tasks.observe_attempts() == 0  # beat's task says nothing changed
    while time.time() < rest_until:
        time.sleep(0.05)
    assert tasks.observe_pass() == 1
    assert passes.count == 2


def test_short_passes_rest_not_at_all_and_a_factor_of_zero_never(passes, settings):
    assert [tasks.observe_pass() for _ in range(3)] == [1, 1, 1]  # a quick pass: the next one may follow at once
    settings.TRAINYARD_OBSERVE_REST_FACTOR = 0.0
    passes.length = 0.2
    assert [tasks.observe_pass() for _ in range(2)] == [1, 1]
