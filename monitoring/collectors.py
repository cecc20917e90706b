"""Telemetry sources, read-only: NVML on a machine with NVIDIA GPUs, dcgm-exporter series through Prometheus'
HTTP API on Kubernetes. Each returns plain `GpuReading`s; `monitoring.services` stores them and maps them to
jobs. Where neither source exists (the emulated inventory) there is no reading at all: nothing is invented.

Boundaries, replaceable in tests: the `pynvml` module object (`NvmlCollector(nvml=...)`, or whatever
`import pynvml` yields), the pid -> job resolver, and the HTTP GET function of `PrometheusCollector`.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from django.conf import settings

from cluster.nvml import fault_of_nvml_error, load_nvml

log = structlog.get_logger(__name__)
MIB = 1024 * 1024


@dataclass
class ProcessUsage:
    pid: int
    memory_used_mib: float
    job_id: str | None = None
    attempt_number: int | None = None


@dataclass
class GpuReading:
    uuid: str
    hostname: str = ""
    index: int | None = None
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    ecc_uncorrected: int | None = None
    xid: int | None = None
    xid_is_event: bool = False  # True: a fresh NVML event; False: dcgm's "last Xid" gauge (news only on change)
    processes: list[ProcessUsage] = field(default_factory=list)
    fault: str = ""  # gpu_lost / driver_reset when the device itself answered so
    fault_reason: str = ""


class CollectorUnavailable(Exception):
    """The source cannot be read right now (no driver, Prometheus down)."""


# ------------------------------------------------------------------------------------------------ NVML


def pid_job_from_environ(pid: int) -> tuple[str | None, int | None]:
    """The job a local process belongs to, from the environment the local backend gave it."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None, None
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    job = env.get(b"TRAINYARD_JOB_ID")
    attempt = env.get(b"TRAINYARD_ATTEMPT")
    return (job.decode() if job else None), (int(attempt) if attempt and attempt.isdigit() else None)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlCollector:
    """Reads every local card through NVML; keeps one Xid event set for its lifetime so no event is missed."""

    def __init__(self, nvml, *, pid_resolver: Callable[[int], tuple[str | None, int | None]] = pid_job_from_environ):
        self.nvml = nvml
        self.pid_resolver = pid_resolver
        self._events = None

    def _optional(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except self.nvml.NVMLError as exc:
            fault, _ = fault_of_nvml_error(self.nvml, exc)
            if fault:
                raise
            return None  # NOT_SUPPORTED and friends: this card does not report that field

    def _event_set(self, handles: list) -> Any:
        if self._events is not None:
            return self._events
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
            for handle in handles:
                try:
                    nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
                except nvml.NVMLError:
                    continue  # a card without event support still reports everything else
        except nvml.NVMLError:
            return None
        self._events = events
        return events

    def _pending_xids(self, handles: list) -> dict[str, list[int]]:
        nvml = self.nvml
        events = self._event_set(handles)
        found: dict[str, list[int]] = {}
        if events is None:
            return found
        for _ in range(1000):  # drain what queued since the last read, never block
            try:
                data = nvml.nvmlEventSetWait_v2(events, 0)
            except nvml.NVMLError:
                break  # NVML_ERROR_TIMEOUT: the queue is empty
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
            except nvml.NVMLError:
                continue
            found.setdefault(uuid, []).append(int(data.eventData))
        return found

    def collect(self) -> list[GpuReading]:
        nvml = self.nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            raise CollectorUnavailable(f"NVML: {exc}")
        readings: list[GpuReading] = []
        handles = []
        host = socket.gethostname()  # the node name the NVML inventory uses (cluster.inventory.read_nvml)
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            except nvml.NVMLError as exc:
                fault, reason = fault_of_nvml_error(nvml, exc)
                log.warning("nvml_device_unreadable", index=index, error=str(exc))
                if fault:  # a lost card has no UUID to give; the node and index still name it
                    readings.append(GpuReading(uuid="", hostname=host, index=index, fault=fault, fault_reason=reason))
                continue
            handles.append(handle)
            reading = self._read(handle, uuid, index)
            reading.hostname = host
            readings.append(reading)
        xids = self._pending_xids(handles)
        for reading in readings:
            events = xids.get(reading.uuid)
            if events:
                reading.xid = events[-1]
                reading.xid_is_event = True
        return readings

    def _read(self, handle, uuid: str, index: int) -> GpuReading:
        nvml = self.nvml
        reading = GpuReading(uuid=uuid, index=index)
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            reading.memory_used_mib = memory.used / MIB
            reading.memory_total_mib = memory.total / MIB
            rates = self._optional(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
            reading.utilization_pct = None if rates is None else float(rates.gpu)
            temp = self._optional(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
            reading.temperature_c = None if temp is None else float(temp)
            power = self._optional(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
            reading.power_w = None if power is None else power / 1000.0
            reading.ecc_uncorrected = self._optional(
                lambda: nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                )
            )
            procs = self._optional(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle)) or []
        except nvml.NVMLError as exc:
            reading.fault, reading.fault_reason = fault_of_nvml_error(nvml, exc)
            if not reading.fault:
                reading.fault, reading.fault_reason = "probe_failed", f"NVML: reading the card failed ({exc})"
            return reading
        for proc in procs:
            used = getattr(proc, "usedGpuMemory", None)
            job_id, attempt = self.pid_resolver(int(proc.pid))
            reading.processes.append(
                ProcessUsage(
                    pid=int(proc.pid), memory_used_mib=(used or 0) / MIB, job_id=job_id, attempt_number=attempt
                )
            )
        return reading


_nvml_collector: NvmlCollector | None = None


def nvml_collector() -> NvmlCollector | None:
    """The process-wide NVML collector (its Xid event set must live between reads), or None without NVML."""
    global _nvml_collector
    nvml = load_nvml()
    if nvml is None:
        _nvml_collector = None
        return None
    if _nvml_collector is None or _nvml_collector.nvml is not nvml:
        _nvml_collector = NvmlCollector(nvml)
    return _nvml_collector


# ------------------------------------------------------------------------------------- Prometheus / dcgm

DCGM_FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": "utilization_pct",
    "DCGM_FI_DEV_FB_USED": "memory_used_mib",
    "DCGM_FI_DEV_FB_FREE": "_fb_free",
    "DCGM_FI_DEV_FB_RESERVED": "_fb_reserved",
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_XID_ERRORS": "xid",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_uncorrected",
}
DCGM_QUERY = '{__name__=~"' + "|".join(DCGM_FIELDS) + '"}'

HttpGet = Callable[[str, dict[str, str]], dict]


def httpx_get(url: str, params: dict[str, str], *, timeout_s: float = 10.0) -> dict:
    import httpx

    try:
        response = httpx.get(url, params=params, timeout=timeout_s)
        response.raise_for_status()
        return response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise CollectorUnavailable(f"Prometheus at {url}: {exc}")


def _label(labels: dict[str, str], *names: str) -> str:
    for name in names:
        if labels.get(name):
            return labels[name]
    return ""


class PrometheusCollector:
    """Reads the latest dcgm-exporter series with one instant query. Hosts come from `Hostname` (releases up
    to 4.8) or `hostname` (later), the card from `UUID` (or `uuid` with --use-old-namespace)."""

    def __init__(self, base_url: str, *, http_get: HttpGet = httpx_get):
        self.base_url = base_url.rstrip("/")
        self.http_get = http_get

    def collect(self, query: str = DCGM_QUERY) -> list[GpuReading]:
        body = self.http_get(f"{self.base_url}/api/v1/query", {"query": query})
        if body.get("status") != "success":
            raise CollectorUnavailable(f"Prometheus answered {body.get('status')}: {body.get('error', '')}")
        data = body.get("data") or {}
        if data.get("resultType") != "vector":
            raise CollectorUnavailable(f"Prometheus returned a {data.get('resultType')}, expected a vector")
        by_gpu: dict[str, GpuReading] = {}
        extra: dict[str, dict[str, float]] = {}
        for series in data.get("result", []):
            labels = series.get("metric", {})
            field_name = DCGM_FIELDS.get(labels.get("__name__", ""))
            uuid = _label(labels, "UUID", "uuid")
            if field_name is None or not uuid:
                continue
            try:
                value = float(series["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if math.isnan(value):
                continue
            reading = by_gpu.get(uuid)
            if reading is None:
                gpu_index = _label(labels, "gpu")
                reading = by_gpu[uuid] = GpuReading(
                    uuid=uuid,
                    hostname=_label(labels, "Hostname", "hostname"),
                    index=int(gpu_index) if gpu_index.isdigit() else None,
                )
            if field_name.startswith("_"):
                extra.setdefault(uuid, {})[field_name] = value
            elif field_name in {"xid", "ecc_uncorrected"}:
                setattr(reading, field_name, int(value))
            else:
                setattr(reading, field_name, value)
        for uuid, reading in by_gpu.items():
            parts = extra.get(uuid, {})
            if reading.memory_used_mib is not None and "_fb_free" in parts:
                reading.memory_total_mib = reading.memory_used_mib + parts["_fb_free"] + parts.get("_fb_reserved", 0)
        return list(by_gpu.values())


def active_source() -> str:
    """Which source the telemetry task reads: prometheus, nvml or none (see TRAINYARD_TELEMETRY_SOURCE)."""
    chosen = settings.TRAINYARD_TELEMETRY_SOURCE
    if chosen != "auto":
        return chosen
    if settings.TRAINYARD_PROMETHEUS_URL:
        return "prometheus"
    return "nvml" if load_nvml() is not None else "none"
