"""Which Kubernetes RuntimeClasses a queue may name (`Queue.runtime_class`): the cluster's own, asked of the backend.

The backend lives in an app above this one: at start-up `jobs.apps.JobsConfig.ready` registers the lookup, which
answers None where there is no cluster to ask (the local backend)."""

from __future__ import annotations

import re
from collections.abc import Callable

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")
_lookup: Callable[[], set[str] | None] | None = None


def register(lookup: Callable[[], set[str] | None]) -> None:
    global _lookup
    _lookup = lookup


def runtime_class_problem(name: str) -> str | None:
    """Why a queue cannot name this RuntimeClass, or None when it may (or when no cluster can be asked)."""
    if not name:
        return None
    if not _NAME.match(name):
        return f"'{name}' is not a RuntimeClass name (lower-case letters, digits, '-' and '.')"
    if _lookup is None:
        return None
    try:
        known = _lookup()
    except Exception as exc:  # noqa: BLE001 - an unreadable cluster is said, not raised into the admin page
        return f"the cluster's RuntimeClasses could not be read ({exc}); try again, or leave it empty"
    if known is None or name in known:
        return None
    listed = ", ".join(sorted(known)) or "none"
    return f"the cluster has no RuntimeClass '{name}' (it has: {listed})"
