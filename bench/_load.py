"""Load generator for the API benchmark, run as its own process: ``python -m bench._load PLAN.json OUT.json``.

It imports nothing from Django, so its CPU use stays small and apart from the server's. A plan is a list of
phases; each phase sends requests to one URL list (round-robin), either open-loop (a fixed arrival rate that
never waits for answers, so a slow server builds a queue instead of slowing the generator) or closed-loop
(N clients, each sending its next request when the last one is answered: the most the server can do). At most
`max_connections` requests (32 by default) are in flight; requests due beyond that wait in the generator.

Open-loop latency is measured from the moment a request was *due*, not from when it was sent, so a late
generator never hides server delay (no coordinated omission); the generator's own lag is reported apart.
Also holds the summary statistics that ``bench.api`` shares for its direct (floor) measurements.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import resource
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Sample:
    """One request: when it was due (s from phase start), its latency from then, how long sending lagged."""

    due_s: float
    latency_s: float
    lag_s: float
    status: int  # HTTP status, or 0 for a transport error
    error: str = ""


@dataclass
class PhaseResult:
    name: str
    mode: str
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    generator_cpu_s: float = 0.0


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of an ascending list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summarize(
    latencies_s: list[float],
    *,
    wall_s: float,
    errors: int = 0,
    ok_statuses: dict | None = None,
    error_kinds: dict | None = None,
    max_lag_s: float | None = None,
) -> dict[str, Any]:
    """The figures every row of the report carries: throughput achieved and the latency distribution (ms)."""
    ordered = sorted(latencies_s)
    done = len(ordered)
    out: dict[str, Any] = {
        "requests": done + errors,
        "ok": done,
        "errors": errors,
        "wall_s": round(wall_s, 3),
        "rps": round(done / wall_s, 1) if wall_s > 0 else 0.0,
        "p50_ms": round(percentile(ordered, 50) * 1000, 2),
        "p90_ms": round(percentile(ordered, 90) * 1000, 2),
        "p99_ms": round(percentile(ordered, 99) * 1000, 2),
        "max_ms": round((ordered[-1] if ordered else 0.0) * 1000, 2),
        "mean_ms": round(sum(ordered) / done * 1000, 2) if done else 0.0,
    }
    if ok_statuses:
        out["statuses"] = ok_statuses
    if error_kinds:
        out["error_kinds"] = error_kinds
    if max_lag_s is not None:
        out["generator_max_lag_ms"] = round(max_lag_s * 1000, 2)
    return out


def summarize_phase(result: PhaseResult, *, expect_status: int) -> dict[str, Any]:
    ok = [s for s in result.samples if s.status == expect_status]
    bad = [s for s in result.samples if s.status != expect_status]
    statuses: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for s in result.samples:
        statuses[str(s.status)] = statuses.get(str(s.status), 0) + 1
    for s in bad:
        key = s.error or f"http {s.status}"
        kinds[key] = kinds.get(key, 0) + 1
    summary = summarize(
        [s.latency_s for s in ok],
        wall_s=result.wall_s,
        errors=len(bad),
        ok_statuses=statuses,
        error_kinds=kinds or None,
        max_lag_s=max((s.lag_s for s in result.samples), default=0.0),
    )
    summary["generator_cpu_s"] = round(result.generator_cpu_s, 3)
    return summary


# ------------------------------------------------------------------------------------------- sending


class HttpClient:
    """A small HTTP/1.1 client over keep-alive connections, at most `max_connections` open, each carrying one
    request at a time.

    The generator shares the machine with the server it measures, so its own CPU is taken from the server's:
    httpx cost ~1.9 ms of CPU a request here (bench/results/submit.json, `generator_cpu_s`), a sixth of a
    submission's whole cost on the machine; this client writes each request as one buffer and reads the answer's
    status line, headers and body (Content-Length, chunked, or up to the connection's close), a few hundred
    microseconds. An answer that does not come within `timeout_s`, a refused or broken connection or a malformed
    answer is status 0 with the error's kind (`timeout`, `connect`, `closed`, `protocol`); that connection is
    closed, never reused."""

    def __init__(self, base_url: str, *, max_connections: int, timeout_s: float) -> None:
        parsed = urlsplit(base_url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"the load generator speaks plain http only, not {base_url!r}")
        self.host = parsed.hostname
        self.port = parsed.port or 80
        self.authority = parsed.netloc.encode("latin-1")
        self.timeout_s = timeout_s
        self.slots = asyncio.Semaphore(max_connections)
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def request(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, str]:
        lines = [f"{method} {path} HTTP/1.1".encode("latin-1"), b"Host: " + self.authority]
        lines += [f"{k}: {v}".encode("latin-1") for k, v in headers.items()]
        if body or method not in ("GET", "HEAD"):
            lines.append(b"Content-Length: %d" % len(body))
        message = b"\r\n".join(lines) + b"\r\n\r\n" + body
        async with self.slots:
            conn = self._reusable()
            stage = "connect" if conn is None else "closed"
            try:
                async with asyncio.timeout(self.timeout_s):
                    if conn is None:
                        conn = await asyncio.open_connection(self.host, self.port)
                        stage = "closed"
                    conn[1].write(message)
                    status, reusable = await _read_answer(conn[0], method)
            except TimeoutError:
                return self._broken(conn, "timeout")
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                return self._broken(conn, stage)
            except ValueError:
                return self._broken(conn, "protocol")
            except BaseException:  # cancelled mid-request: the connection's state is unknown
                self._broken(conn, "")
                raise
            if reusable:
                self.idle.append(conn)
            else:
                conn[1].close()
            return status, ""

    def _reusable(self):
        """An idle connection the server has not closed meanwhile (uvicorn closes one idle for 5 s), or None."""
        while self.idle:
            conn = self.idle.pop()
            if not conn[0].at_eof() and not conn[1].is_closing():
                return conn
            conn[1].close()
        return None

    @staticmethod
    def _broken(conn, kind: str) -> tuple[int, str]:
        if conn is not None:
            conn[1].close()
        return 0, kind

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


async def _read_answer(reader: asyncio.StreamReader, method: str) -> tuple[int, bool]:
    """(status, whether the connection can carry another request) after reading one whole answer."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ValueError("not an HTTP/1.x status line")
    status = int(parts[1])
    fields: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise ValueError("a header line without a colon")
        fields[name.strip().lower()] = value.strip()
    reusable = fields.get(b"connection", b"").lower() != b"close" and parts[0] == b"HTTP/1.1"
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return status, reusable
    if b"chunked" in fields.get(b"transfer-encoding", b"").lower():
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields, if any
                    pass
                return status, reusable
            await reader.readexactly(size + 2)
    if b"content-length" in fields:
        await reader.readexactly(int(fields[b"content-length"]))
        return status, reusable
    await reader.read()  # no length given: the body runs to the connection's end
    return status, False


class Sender:
    """Builds and sends the requests of one phase; a submit phase gives every request its own Idempotency-Key."""

    def __init__(self, client: HttpClient, phase: dict[str, Any]) -> None:
        self.client = client
        self.method: str = phase.get("method", "GET")
        self.urls: list[str] = phase["urls"]
        body = phase.get("body")
        self.body = b"" if body is None else json.dumps(body).encode()
        self.headers: dict[str, str] = dict(phase.get("headers", {}))
        if body is not None:
            self.headers["Content-Type"] = "application/json"
        self.idempotency: bool = bool(phase.get("idempotency_key"))
        self.counter = 0

    async def send(self) -> tuple[int, str]:
        i = self.counter
        self.counter += 1
        headers = self.headers
        if self.idempotency:
            headers = {**headers, "Idempotency-Key": uuid.uuid4().hex}
        return await self.client.request(self.method, self.urls[i % len(self.urls)], headers, self.body)


async def _open_loop(
    sender: Sender, *, rate: float, duration_s: float, drain_s: float, workers: int
) -> tuple[list[Sample], float]:
    """Make `rate` x `duration_s` requests due on schedule; `workers` senders (the in-flight cap) take them in order.

    A request waiting for a free sender still counts its latency from when it was due. The phase waits at most
    `drain_s` after the last one was due; whatever is unanswered then is cancelled and recorded as an error, so an
    overloaded server ends the phase in bounded time instead of working off an ever longer backlog.
    """
    loop = asyncio.get_running_loop()
    count = max(1, int(round(rate * duration_s)))
    start = loop.time() + 0.02
    samples: list[Sample] = []
    due_queue: asyncio.Queue[float] = asyncio.Queue()
    in_flight: dict[int, float] = {}

    async def send_due(worker: int) -> None:
        while True:
            due = await due_queue.get()
            in_flight[worker] = due
            sent = loop.time()
            status, error = await sender.send()
            done = loop.time()
            del in_flight[worker]
            samples.append(
                Sample(due_s=due - start, latency_s=done - due, lag_s=max(0.0, sent - due), status=status, error=error)
            )
            due_queue.task_done()

    senders = [asyncio.create_task(send_due(w)) for w in range(workers)]
    for i in range(count):
        due = start + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        due_queue.put_nowait(due)
    last_due = start + (count - 1) / rate
    try:
        await asyncio.wait_for(due_queue.join(), timeout=max(0.0, last_due + drain_s - loop.time()))
    except TimeoutError:
        pass
    ended = loop.time()
    for task in senders:
        task.cancel()
    await asyncio.gather(*senders, return_exceptions=True)
    unanswered = list(in_flight.values())
    while not due_queue.empty():
        unanswered.append(due_queue.get_nowait())
    for due in unanswered:
        samples.append(Sample(due_s=due - start, latency_s=ended - due, lag_s=0.0, status=0, error="unanswered"))
    return samples, ended - start


async def _closed_loop(sender: Sender, *, concurrency: int, duration_s: float) -> tuple[list[Sample], float]:
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + duration_s
    samples: list[Sample] = []

    async def client_loop() -> None:
        while loop.time() < deadline:
            sent = loop.time()
            status, error = await sender.send()
            samples.append(
                Sample(due_s=sent - start, latency_s=loop.time() - sent, lag_s=0.0, status=status, error=error)
            )

    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    return samples, loop.time() - start


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_plan(plan: dict[str, Any]) -> list[PhaseResult]:
    # A cap on requests in flight: past it, due requests wait in the client (their latency still counts from when
    # they were due), so an overloaded server cannot be driven into holding an unbounded number of DB connections.
    max_in_flight = int(plan.get("max_connections", 32))
    client = HttpClient(plan["base_url"], max_connections=max_in_flight, timeout_s=float(plan.get("timeout_s", 30.0)))
    results: list[PhaseResult] = []
    try:
        for phase in plan["phases"]:
            sender = Sender(client, phase)
            cpu0 = _cpu_s()
            if phase["mode"] == "open":
                samples, wall = await _open_loop(
                    sender,
                    rate=float(phase["rate"]),
                    duration_s=float(phase["duration_s"]),
                    drain_s=float(phase.get("drain_s", 10.0)),
                    workers=max_in_flight,
                )
            else:
                samples, wall = await _closed_loop(
                    sender, concurrency=int(phase["concurrency"]), duration_s=float(phase["duration_s"])
                )
            results.append(
                PhaseResult(
                    name=phase["name"],
                    mode=phase["mode"],
                    samples=samples,
                    wall_s=wall,
                    generator_cpu_s=_cpu_s() - cpu0,
                )
            )
            # Nothing sent for a while after the phase: what its requests set going in the server settles first.
            await asyncio.sleep(float(phase.get("pause_after_s", 0.0)))
    finally:
        client.close()
    return results


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m bench._load PLAN.json OUT.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        plan = json.load(f)
    started = time.time()
    try:
        import uvloop  # the server runs on uvloop too; it keeps the generator's own CPU cost low

        results = uvloop.run(run_plan(plan))
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        results = asyncio.run(run_plan(plan))
    with open(argv[1] + ".part", "w") as f:
        json.dump({"started": started, "phases": [asdict(r) for r in results]}, f)
    os.replace(argv[1] + ".part", argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
