"""A process that runs dispatch passes freezes what they leave alive, and collects everything now and then."""

from __future__ import annotations

import gc
import weakref

import pytest

from kernel import gctune


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def freezing():
    gctune.freeze_passes()
    yield
    gctune.stop_freezing_passes()


def _tracked(obj) -> bool:
    """Whether the collector still walks `obj` (a frozen object is in none of its generations)."""
    return any(o is obj for o in gc.get_objects())


@pytest.mark.django_db
def test_a_pass_in_a_freezing_process_leaves_what_is_alive_frozen(freezing):
    from jobs.store import dispatch

    built = Node()  # stands for what a pass keeps: the pool, the carried lines
    assert _tracked(built)
    dispatch()
    assert not _tracked(built)
    assert gc.get_freeze_count() > 0


def test_garbage_frozen_while_alive_is_collected_at_the_next_full_refreeze(freezing, monkeypatch):
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: reference counting alone never frees it
    gone = weakref.ref(a)
    gctune.after_pass()
    del a, b
    gc.collect()
    assert gone() is not None  # frozen: the collector does not see it

    gctune.after_pass()  # within FULL_EVERY_S: only freezes
    assert gone() is not None
    monkeypatch.setattr(gctune._Passes, "full_at", gctune._Passes.full_at - gctune.FULL_EVERY_S - 1)
    gctune.after_pass()
    assert gone() is None


def test_a_pass_that_kept_nothing_new_freezes_nothing(freezing):
    obj = Node()
    gctune.after_pass(kept=False)
    assert _tracked(obj)
    gctune.after_pass(kept=True)
    assert not _tracked(obj)


@pytest.mark.django_db
def test_a_fast_pass_admitting_a_newcomer_keeps_the_collector_as_it_is(freezing, monkeypatch):
    from jobs import store

    seen = []
    monkeypatch.setattr(store.gctune, "after_pass", lambda *, kept: seen.append(kept))
    monkeypatch.setattr(store.scheduler, "run_pass", lambda **_: store.scheduler.PassReport(fast=True, admitted=1))
    store.dispatch()
    monkeypatch.setattr(
        store.scheduler, "run_pass", lambda **_: store.scheduler.PassReport(fast=True, admitted=store.KEEPS_STATE)
    )
    store.dispatch()
    monkeypatch.setattr(store.scheduler, "run_pass", lambda **_: store.scheduler.PassReport(redecided=True))
    store.dispatch()
    assert seen == [False, True, True]


def test_a_process_that_did_not_ask_freezes_nothing():
    gctune.stop_freezing_passes()
    obj = Node()
    gctune.after_pass()
    assert gc.get_freeze_count() == 0
    assert _tracked(obj)


def test_the_worker_start_signal_freezes_only_when_the_setting_allows(settings):
    from jobs.tasks import _freeze_loaded

    try:
        settings.TRAINYARD_GC_FREEZE = False
        _freeze_loaded()
        assert not gctune._Passes.enabled
        settings.TRAINYARD_GC_FREEZE = True
        _freeze_loaded()
        assert gctune._Passes.enabled
        assert gc.get_freeze_count() > 0
    finally:
        gctune.stop_freezing_passes()


def _collector_during_passes(monkeypatch) -> list[bool]:
    """Whether automatic collection was on during each pass `jobs.store.dispatch` runs from now on."""
    from jobs import store

    during: list[bool] = []

    def run_pass(**_):
        during.append(gc.isenabled())
        return store.scheduler.PassReport(fast=True, admitted=1)

    monkeypatch.setattr(store.scheduler, "run_pass", run_pass)
    return during


@pytest.mark.django_db
def test_no_automatic_collection_runs_during_a_pass_of_a_freezing_process(freezing, monkeypatch):
    from jobs import store

    during = _collector_during_passes(monkeypatch)
    store.dispatch()
    assert during == [False]
    assert gc.isenabled()


@pytest.mark.django_db
def test_a_failing_pass_turns_the_collector_back_on(freezing, monkeypatch):
    from jobs import store

    def run_pass(**_):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(store.scheduler, "run_pass", run_pass)
    with pytest.raises(RuntimeError):
        store.dispatch()
    assert gc.isenabled()


@pytest.mark.django_db
def test_a_process_that_does_not_freeze_collects_during_its_passes(monkeypatch):
    from jobs import store

    gctune.stop_freezing_passes()
    during = _collector_during_passes(monkeypatch)
    store.dispatch()
    assert during == [True]
