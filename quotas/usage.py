"""What teams and queues hold against their quotas, and who waits in a queue, asked of the app that holds it.

Quota is held by jobs, an app above this one in the layering (README, "Where things live"): at start-up
`jobs.apps.JobsConfig.ready` registers `jobs.usage` as the source, so quotas reads usage without importing jobs.
"""

from __future__ import annotations

from typing import Any, Protocol


class UsageSource(Protocol):
    def queue_usage(self, queue) -> dict[str, int]: ...
    def team_usage(self, team) -> dict[str, int]: ...
    def team_usage_by_spec(self, team) -> list[dict]: ...
    def team_storage_used(self, team_ids=None) -> dict[int, int]: ...
    def line_places(self, queue) -> list: ...
    def line_rows(self, queue, line, *, first: int) -> tuple[dict, list]: ...


_source: Any = None


def register(source: UsageSource) -> None:
    global _source
    _source = source


def _usage() -> UsageSource:
    if _source is None:
        raise RuntimeError("no usage source is registered: the jobs app registers one when Django starts")
    return _source


def queue_usage(queue) -> dict[str, int]:
    return _usage().queue_usage(queue)


def team_usage(team) -> dict[str, int]:
    return _usage().team_usage(team)


def team_usage_by_spec(team) -> list[dict]:
    return _usage().team_usage_by_spec(team)


def team_storage_used(team_ids=None) -> dict[int, int]:
    return _usage().team_storage_used(team_ids)


def line_places(queue) -> list:
    """The queue's waiting jobs (id, owner_id) in the order the dispatcher would take them
    (jobs.selectors.line_places)."""
    return _usage().line_places(queue)


def line_rows(queue, line, *, first: int):
    return _usage().line_rows(queue, line, first=first)
