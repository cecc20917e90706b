"""Watched log texts: the shape a job's `watch` and its team's default share, checked in one place."""

from __future__ import annotations

from typing import Any

from kernel.errors import ValidationFailed
from kernel.sentences import stored

MAX_WATCHES = 8


def watch_validate(value: Any, *, field: str = "watch") -> list[dict]:
    """Up to 8 texts to look for in a job's log, each raising an alert at its level when a line holds it (case
    folded): [{"pattern": "nan loss", "level": "critical"}] (level warning by default); 400 `invalid_watch`."""
    if value in (None, []):
        return []
    problem = stored(
        'watch is a list of up to %(n)s {"pattern": text, "level": "warning" or "critical"}', n=MAX_WATCHES
    )
    if not isinstance(value, list) or len(value) > MAX_WATCHES:
        raise ValidationFailed(problem, code="invalid_watch", field=field)
    out = []
    for item in value:
        if isinstance(item, str):
            item = {"pattern": item}
        if not isinstance(item, dict) or set(item) - {"pattern", "level"}:
            raise ValidationFailed(problem, code="invalid_watch", field=field)
        pattern, level = item.get("pattern"), item.get("level", "warning")
        if not isinstance(pattern, str) or not 2 <= len(pattern.strip()) <= 200 or "\x00" in pattern:
            raise ValidationFailed(problem, code="invalid_watch", field=field)
        if level not in ("warning", "critical"):
            raise ValidationFailed(problem, code="invalid_watch", field=field)
        out.append({"pattern": pattern.strip(), "level": level})
    return out


def watches_of(job_watch: list[dict] | None, team_watch: list[dict] | None) -> list[dict]:
    """What a job's log is watched for: its own texts, then its team's defaults it does not already name."""
    own = list(job_watch or ())
    named = {w["pattern"].casefold() for w in own}
    return own + [w for w in team_watch or () if w["pattern"].casefold() not in named]
