"""What the jobs app asks of the apps above it, by name: it never imports monitoring (the layering contract in
pyproject.toml). Each signal is sent with ``sender=None`` and keyword ``job``; a receiver returns its answer, and
:func:`answer` takes the first that is not None. `monitoring.receivers` answers all three.
"""

from __future__ import annotations

from typing import Any

from django.dispatch import Signal

# What earlier runs like the job recommend for its request (docs/rightsizing.md): a dict, or None without evidence.
recommendation_wanted = Signal()
# The job's usage next to its request, one profile per attempt (the `usage` API action): a dict.
usage_wanted = Signal()
# (version, HTML) of the job's business-metric charts, which its page's socket redraws live.
charts_html_wanted = Signal()


def answer(signal: Signal, **kwargs: Any) -> Any:
    for _receiver, response in signal.send(sender=None, **kwargs):
        if response is not None:
            return response
    return None
