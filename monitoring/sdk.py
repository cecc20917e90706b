"""A tiny, dependency-free helper a training script can copy or import to report business metrics.

    from monitoring.sdk import report
    report(step=100, loss=0.42, throughput=812.5, progress=0.1)

It prints one `TRAINYARD_METRIC {...}` line to standard output; the platform reads it from the job's log
(with the local backend and on Kubernetes alike). Printing the line yourself works just as well.
"""

from __future__ import annotations

import json
import math
import sys
from typing import TextIO

TAG = "TRAINYARD_METRIC"


def format_report(step: int | None = None, **values: float) -> str:
    data: dict[str, float | int] = {} if step is None else {"step": int(step)}
    for key, value in values.items():
        number = float(value)
        if math.isfinite(number):
            data[key] = number
    return f"{TAG} {json.dumps(data, separators=(',', ':'))}"


def report(step: int | None = None, *, stream: TextIO | None = None, **values: float) -> None:
    out = stream or sys.stdout
    out.write(format_report(step, **values) + "\n")
    out.flush()
