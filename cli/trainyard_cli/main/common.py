"""Shared pieces: part of `trainyard_cli.main` (see its package docstring)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from ..client import ApiClient
from ..errors import (
    EXIT_USAGE,
    CliError,
)

UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")

SHORT_ID_RE = re.compile(r"^[0-9a-fA-F][0-9a-fA-F-]{7,34}\Z")

ATTEMPT_ENDED = frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost", "preempted"})

MAX_TRANSIENT_ERRORS = 8

LOG_PAGE = 1000

DRAIN_S = 5.0


def err(text: str) -> None:
    print(f"trainyard: {text}", file=sys.stderr, flush=True)


def say(text: str = "") -> None:
    print(text, flush=True)


def print_json(data: Any) -> None:
    say(json.dumps(data, indent=2, sort_keys=False))


def resolve_job_id(api: ApiClient, raw: str) -> str:
    """A full job id, or the first 8+ characters the portal shows, resolved among the jobs the token can see."""
    text = raw.strip().lower()
    if UUID_RE.match(text):
        return text
    if not SHORT_ID_RE.match(text):
        raise CliError(
            f"{raw!r} is not a job id (a UUID like 3f2c6e1a-0b7d-4c52-9a51-1d0e5b7c9f20, or its first 8 characters "
            "as the portal shows them; see `trainyard list`)",
            EXIT_USAGE,
        )
    found = api.get("/jobs/", params={"id_prefix": text, "page_size": 5}).get("results", [])
    if not found:
        raise CliError(f"no job id starts with {text} (or it belongs to a team you are not in)", EXIT_USAGE)
    if len(found) > 1:
        names = ", ".join(f"{j['id']} ({j['name']})" for j in found)
        raise CliError(f"{text} is the start of several job ids: {names}; give more characters", EXIT_USAGE)
    return found[0]["id"]


def when_text(value: str | None) -> str:
    if not value:
        return "-"
    try:
        return datetime.fromisoformat(value).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return value


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def elapsed(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    try:
        return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    except ValueError:
        return None


def gpus_text(milli: int | None) -> str:
    return f"{(milli or 0) / 1000:g}"


def gib(mib: int | None) -> str:
    return f"{(mib or 0) / 1024:g} GiB"


def table_text(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if v is None or v == "" else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)
