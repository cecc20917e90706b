"""What a local attempt's processes use, sampled by its supervisor (no Django here).

Every `interval_s` the supervisor appends one JSON line to `usage.jsonl` in the attempt's folder:
`{"t": unix time, "cpu_milli": CPU used since the previous sample (1000 = one core), "rss_mib": resident memory
of all the attempt's processes, "gpu_memory_mib": ..., "gpu_util_pct": ...}`. CPU and host memory are real (read
from /proc for every process of the attempt, sandboxed or not).

GPU numbers: an emulated card has no driver to ask, so on emulated cards (and only there) a job may state them
itself by printing `TRAINYARD_EMULATED_GPU {"memory_mib": 9100, "util_pct": 80}`; the latest values stand until
the next such line. On real cards the GPU fields stay empty here: NVML or dcgm give them to the telemetry loop.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

EMULATED_GPU_TAG = b"TRAINYARD_EMULATED_GPU "
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 1024 * 1024


def _cpu_ticks_and_rss(pid: int) -> tuple[int, int] | None:
    """(utime + stime in clock ticks, resident bytes) of a live process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        with open(f"/proc/{pid}/statm", "rb") as f:
            statm = f.read().split()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    return int(fields[11]) + int(fields[12]), int(statm[1]) * _PAGE


class UsageSampler:
    def __init__(self, path: Path, *, interval_s: float, emulated_gpu: bool):
        self.path = path
        self.interval = max(0.2, float(interval_s))
        self.emulated_gpu = emulated_gpu
        self.gpu_memory_mib: float | None = None
        self.gpu_util_pct: float | None = None
        self._ticks: dict[int, int] = {}
        self._last: float | None = None
        self._next = 0.0

    def line(self, data: bytes) -> None:
        """One line of the job's output: an emulated-GPU statement updates the GPU numbers."""
        if not self.emulated_gpu or not data.startswith(EMULATED_GPU_TAG):
            return
        try:
            body = json.loads(data[len(EMULATED_GPU_TAG) :])
            memory = body.get("memory_mib")
            util = body.get("util_pct")
            if memory is not None:
                self.gpu_memory_mib = max(0.0, float(memory))
            if util is not None:
                self.gpu_util_pct = min(100.0, max(0.0, float(util)))
        except (ValueError, TypeError, AttributeError):
            return  # a malformed statement changes nothing

    def due(self) -> bool:
        return time.monotonic() >= self._next

    def sample(self, pids: set[int]) -> dict | None:
        self._next = time.monotonic() + self.interval
        now = time.time()
        ticks: dict[int, int] = {}
        rss = 0
        for pid in pids:
            read = _cpu_ticks_and_rss(pid)
            if read is not None:
                ticks[pid], resident = read
                rss += resident
        cpu_milli = None
        if self._last is not None and now > self._last:
            used = sum(max(0, t - self._ticks.get(pid, 0)) for pid, t in ticks.items())
            cpu_milli = round(1000 * used / _TICKS / (now - self._last))
        self._ticks, self._last = ticks, now
        row = {
            "t": round(now, 3),
            "cpu_milli": cpu_milli,
            "rss_mib": round(rss / MIB, 2),
            "gpu_memory_mib": self.gpu_memory_mib,
            "gpu_util_pct": self.gpu_util_pct,
        }
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")
        except OSError:
            return None  # a full disk costs samples, never the job
        return row
