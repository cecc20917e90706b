"""Stand-ins for what lies outside the project: the NVML library (a module object shaped like `pynvml`, with
its real error classes) and tiny real HTTP servers on loopback (Prometheus' query API, a webhook receiver)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from urllib.parse import parse_qs, urlparse

import pynvml

MIB = 1024 * 1024


@dataclass
class FakeCard:
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    total_mib: int = 81920
    used_mib: int = 0
    util: int = 0
    temp_c: int = 40
    power_mw: int = 60000
    ecc_uncorrected: int = 0
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, used MiB)
    error: int | None = None  # an NVML error code every call on this card raises (e.g. GPU_IS_LOST)
    lost_handle: bool = False  # not even a handle by index: NVML says GPU_IS_LOST


class FakeNvml:
    """The subset of pynvml the platform calls, answering from `cards`; NVMLError is pynvml's own."""

    NVMLError = pynvml.NVMLError
    NVML_ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_RESET_REQUIRED = pynvml.NVML_ERROR_RESET_REQUIRED
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
    NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self, cards: list[FakeCard]):
        self.cards = cards
        self.pending_xids: list[tuple[FakeCard, int]] = []
        self.registered: set[str] = set()
        self.inits = 0

    def _check(self, card: FakeCard) -> FakeCard:
        if card.error is not None:
            raise pynvml.NVMLError(card.error)
        return card

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeCard:
        if self.cards[index].lost_handle:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self.cards[index]

    def nvmlDeviceGetHandleByUUID(self, uuid) -> FakeCard:
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for card in self.cards:
            if card.uuid == uuid:
                return self._check(card)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, card: FakeCard) -> str:
        return card.uuid

    def nvmlDeviceGetName(self, card: FakeCard) -> str:
        return card.name

    def nvmlDeviceGetMemoryInfo(self, card: FakeCard):
        self._check(card)
        return SimpleNamespace(
            total=card.total_mib * MIB, used=card.used_mib * MIB, free=(card.total_mib - card.used_mib) * MIB
        )

    def nvmlDeviceGetUtilizationRates(self, card: FakeCard):
        return SimpleNamespace(gpu=self._check(card).util, memory=0)

    def nvmlDeviceGetTemperature(self, card: FakeCard, sensor: int) -> int:
        return self._check(card).temp_c

    def nvmlDeviceGetPowerUsage(self, card: FakeCard) -> int:
        return self._check(card).power_mw

    def nvmlDeviceGetTotalEccErrors(self, card: FakeCard, error_type: int, counter_type: int) -> int:
        if self._check(card).ecc_uncorrected < 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return card.ecc_uncorrected

    def nvmlDeviceGetComputeRunningProcesses(self, card: FakeCard):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used * MIB) for pid, used in self._check(card).processes]

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, card: FakeCard, event_types: int, event_set: str) -> None:
        self.registered.add(card.uuid)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int):
        while self.pending_xids:
            card, xid = self.pending_xids.pop(0)
            if card.uuid in self.registered:
                return SimpleNamespace(device=card, eventType=self.nvmlEventTypeXidCriticalError, eventData=xid)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)


class _Server:
    def __init__(self, handler_cls):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler_cls)
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the stdlib's signature
        pass

    def _json(self, status: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class PrometheusServer(_Server):
    """Answers /api/v1/query with the series in `self.series` (each: labels dict incl. __name__, value)."""

    def __init__(self):
        self.series: list[tuple[dict, float]] = []
        self.queries: list[str] = []
        self.status = 200
        super().__init__(_PrometheusHandler)


class _PrometheusHandler(_QuietHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        server: PrometheusServer = self.server.owner  # type: ignore[attr-defined]
        url = urlparse(self.path)
        if url.path != "/api/v1/query":
            return self._json(404, {"status": "error", "error": "not found"})
        server.queries.append(parse_qs(url.query).get("query", [""])[0])
        if server.status != 200:
            return self._json(server.status, {"status": "error", "errorType": "internal", "error": "boom"})
        result = [{"metric": labels, "value": [1700000000.0, str(value)]} for labels, value in server.series]
        return self._json(200, {"status": "success", "data": {"resultType": "vector", "result": result}})


class WebhookReceiver(_Server):
    """Records every POST body; answers `self.status`."""

    def __init__(self):
        self.received: list[dict] = []
        self.status = 200
        self.event = threading.Event()
        super().__init__(_WebhookHandler)


class _WebhookHandler(_QuietHandler):
    def do_POST(self):  # noqa: N802 - the stdlib's name
        server: WebhookReceiver = self.server.owner  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        server.received.append(
            {
                "body": json.loads(raw := self.rfile.read(length) or b"{}"),
                "raw": raw,
                "headers": dict(self.headers.items()),
                "content_type": self.headers.get("Content-Type", ""),
            }
        )
        server.event.set()
        self._json(server.status, {"ok": server.status < 300})
