"""Human units, read and written the same way everywhere (API, CLI job files, the portal).

Durations: a whole number of seconds, or numbers with units `d`, `h`, `m`, `s` (`4h`, `30m`, `1h30m`,
`1d 12h`); written back in the largest units that are exact (`4h`, `1h 30m`, `90s`).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from kernel.errors import ValidationFailed
from kernel.sentences import stored

UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
DURATION = re.compile(r"^\s*(?:(\d+)\s*d)?\s*(?:(\d+)\s*h)?\s*(?:(\d+)\s*m)?\s*(?:(\d+)\s*s)?\s*$", re.IGNORECASE)


def parse_duration(value: Any, *, field: str, default: int | None = None) -> int | None:
    """Seconds from `14400`, `"14400"`, `"4h"`, `"30m"`, `"1h30m"`; `default` when empty; 400 otherwise."""
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        raise ValidationFailed(
            stored("%(field)s must be a duration such as 4h, 30m or 3600", field=field), code="invalid", field=field
        )
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    match = DURATION.match(text)
    if not text or match is None or not any(match.groups()):
        raise ValidationFailed(
            stored(
                "%(field)s '%(text)s' is not a duration: write it like 4h, 30m, 1h30m or a number of seconds",
                field=field,
                text=text[:40],
            ),
            code="invalid",
            field=field,
        )
    return sum(int(n) * UNITS[unit] for n, unit in zip(match.groups(), "dhms", strict=True) if n)


def human_duration(seconds: int | float | None) -> str:
    """`4h`, `1h 30m`, `2d`, `45s`: the largest exact units, at most two of them (then rounded)."""
    if seconds is None:
        return ""
    total = int(round(seconds))
    if total <= 0:
        return "0s"
    parts = []
    for unit, size in UNITS.items():
        if total >= size:
            parts.append((total // size, unit))
            total %= size
    if len(parts) > 2:
        parts = parts[:2]
    return " ".join(f"{n}{unit}" for n, unit in parts)


def _number(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.2f}".rstrip("0").rstrip(".")


@lru_cache(maxsize=4096)
def human_resource(name: str, amount: int) -> str:
    """One entry of a resource vector in a person's units: `8 GPUs`, `48 GiB of GPU memory`, `16 CPU cores`.
    Remembered: a pass that holds back thousands of jobs says the same few amounts for each."""
    if name == "gpu_milli":
        cards = amount / 1000
        return stored("%(n)s GPU" if cards == 1 else "%(n)s GPUs", n=_number(cards))
    if name in ("gpu_memory_mib", "memory_mib"):
        if name == "gpu_memory_mib":
            return stored("%(n)s GiB of GPU memory", n=_number(amount / 1024))
        return stored("%(n)s GiB of memory", n=_number(amount / 1024))
    if name == "cpu_milli":
        cores = amount / 1000
        return stored("%(n)s CPU core" if cores == 1 else "%(n)s CPU cores", n=_number(cores))
    return f"{amount} {name}"
