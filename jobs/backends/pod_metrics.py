"""What a Kubernetes attempt's pods use, from the resource metrics API (`metrics.k8s.io/v1beta1`, served by
metrics-server): Kubernetes quantities, and one attempt's PodMetrics folded into one usage sample (no Django, no
API calls; `VolcanoBackend.usage_sample` lists the PodMetrics).

A sample has the fields of the local supervisor's samples (jobs/backends/usage_sampler.py): `t` (unix time of the
measurement), `cpu_milli` (1000 = one core) and `rss_mib` (working-set memory). What is counted:

- per pod, the trainer container only: the job's command runs there. The platform's sidecars (TensorBoard,
  checkpoint sync), dataset fetchers and anything a cluster injects (a service mesh proxy) are left out, so the
  profile describes the job, as the local sampler counts the job's processes and not the supervisor's;
- per attempt, the busiest pod: the request (`cpu_milli`, `memory_mib`) is per replica, and one local attempt is
  one replica, so the profile keeps what one replica needed (CPU and memory each from its busiest pod), as GPU
  memory keeps the busiest card.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, DecimalException
from typing import Any

METRICS_API = ("metrics.k8s.io", "v1beta1", "pods")
MIB = Decimal(1024 * 1024)

# The Kubernetes quantity grammar: a signed decimal number, then a binary suffix (Ki..Ei), a decimal suffix
# (n, u, m, "", k, M, G, T, P, E) or a decimal exponent (e3, E-2). "1E" is one exa; "1E3" is a thousand.
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>[KMGTPE]i)|(?P<exponent>[eE][+-]?[0-9]+)|(?P<decimal>[numkMGTPE]))?"
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def quantity(text: Any) -> Decimal:
    """A Kubernetes quantity (`250m`, `1500000n`, `512Mi`, `1e3`, `12345`) as an exact number; ValueError on
    anything else (spaces, an unknown suffix, `ki`, a bare exponent)."""
    if not isinstance(text, str):
        raise ValueError(f"a quantity is a string, not {type(text).__name__}")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    number = Decimal(match["number"])
    try:
        if match["binary"]:
            return number * (2 ** _BINARY[match["binary"]])
        if match["exponent"]:
            return number.scaleb(int(match["exponent"][1:]))
        if match["decimal"]:
            return number.scaleb(_DECIMAL[match["decimal"]])
    except DecimalException:
        raise ValueError(f"{text!r} is out of range") from None
    return number


def cpu_milli(text: Any) -> float:
    """CPU in millicores (1000 = one core)."""
    return float(quantity(text) * 1000)


def memory_mib(text: Any) -> float:
    return float(quantity(text) / MIB)


@dataclass(frozen=True)
class PodUsage:
    pod: str
    at: float  # unix time of the measurement (the end of its window)
    cpu_milli: float
    memory_mib: float


def _timestamp(text: Any) -> float:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ValueError(f"{text!r} is not an RFC 3339 time") from None


def pod_usage(item: dict, *, container: str) -> PodUsage | None:
    """The named container's CPU and memory in one PodMetrics item (summed, should a pod list it twice); None when
    the item has no such container (its metrics are not in yet). ValueError on a malformed item."""
    name = str((item.get("metadata") or {}).get("name") or "")
    cpu = memory = Decimal(0)
    found = False
    for entry in item.get("containers") or []:
        if entry.get("name") != container:
            continue
        usage = entry.get("usage") or {}
        if "cpu" not in usage or "memory" not in usage:
            raise ValueError(f"pod {name}: container {container} has no cpu or memory usage")
        cpu += quantity(usage["cpu"])
        memory += quantity(usage["memory"])
        found = True
    if not found:
        return None
    return PodUsage(
        pod=name, at=_timestamp(item.get("timestamp")), cpu_milli=float(cpu * 1000), memory_mib=float(memory / MIB)
    )


@dataclass
class UsageSampling:
    """One pass over the metrics API: a sample per attempt reference that had pod metrics, and why there were
    none at all when the API could not be read (`unavailable`, empty when it answered)."""

    samples: dict[str, dict] = field(default_factory=dict)
    unavailable: str = ""
    namespaces: int = 0  # list calls made
    skipped_pods: list[str] = field(default_factory=list)  # pods whose metrics could not be read


def attempt_sample(pods: list[PodUsage]) -> dict:
    """One usage sample for an attempt from its pods: the busiest pod's CPU and memory, at the newest measurement."""
    return {
        "t": max(p.at for p in pods),
        "cpu_milli": round(max(p.cpu_milli for p in pods), 1),
        "rss_mib": round(max(p.memory_mib for p in pods), 2),
        "pods": len(pods),
    }
