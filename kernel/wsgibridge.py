"""HTTP from the ASGI server to a WSGI application on a fixed pool of long-lived threads, with one hand-over each
way for an ordinary request.

A general bridge (a2wsgi) crosses between the event loop and the worker thread for every piece of a request: each
read of the body, the response's start, each body chunk and the end, every crossing a wake-up of the other side and
a trip of the interpreter lock. The platform's requests are nearly all small bodies answered by one non-streaming
response, so this bridge reads a body of up to `BUFFERED_BODY_BYTES` in the loop before handing the request over,
and the thread hands back status, headers and the whole body at once. A longer body is read from the thread as it
comes (the first part from memory); a streaming response (a file, a log download) goes out chunk by chunk as it is
produced. docs/benchmarks.md gives what it saved.

Work that may wait until the answer has gone out (`after_answer`) runs on a worker thread once the loop has sent the
response: a submission's wake-up of the dispatcher, whose pass would otherwise take a core while the submitting
request still serialises its answer.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
from a2wsgi.wsgi import build_environ

log = structlog.get_logger(__name__)

BUFFERED_BODY_BYTES = 1 << 20
# How long the threads warming up wait for each other (each must be a thread of its own) before going on alone:
# starting a thread takes a millisecond, and requests that come meanwhile wait behind them.
WARM_GATHER_S = 0.5

# The calls to make once this request's answer has been sent: a list inside a bridged request, None elsewhere.
_after_answer: contextvars.ContextVar[list | None] = contextvars.ContextVar("after_answer", default=None)


def after_answer(call) -> bool:
    """Run `call()` once the current request's answer has been sent, on one of the bridge's threads. True when it
    was put off; False outside a request served by ThreadedWSGI (a test client, a worker, a shell): the caller then
    makes the call itself. A call put off twice in one request runs once."""
    later = _after_answer.get()
    if later is None:
        return False
    if call not in later:
        later.append(call)
    return True


def _run_later(later: list) -> None:
    _after_answer.set(None)  # the answer is out: a call made from here on is made at once
    for call in later:
        try:
            call()
        except Exception:  # noqa: BLE001 - the answer is out; one failed call must not stop the next
            log.exception("after_answer_failed", call=getattr(call, "__qualname__", repr(call)))


class _StreamedBody(io.RawIOBase):
    """The request body past what the loop read first: the rest is received from the loop as the app reads."""

    def __init__(self, first: bytes, loop: asyncio.AbstractEventLoop, receive) -> None:
        super().__init__()
        self._buffer = bytearray(first)
        self._loop = loop
        self._receive = receive
        self._more = True

    def readable(self) -> bool:
        return True

    def _fill(self) -> bool:
        if not self._more:
            return False
        message = asyncio.run_coroutine_threadsafe(self._receive(), self._loop).result()
        if message["type"] == "http.disconnect":
            self._more = False
            return False
        self._buffer.extend(message.get("body", b""))
        self._more = message.get("more_body", False)
        return True

    def readinto(self, target) -> int:
        while not self._buffer and self._fill():
            pass
        n = min(len(target), len(self._buffer))
        target[:n] = self._buffer[:n]
        del self._buffer[:n]
        return n

    def readall(self) -> bytes:
        while self._fill():
            pass
        data = bytes(self._buffer)
        self._buffer.clear()
        return data


class _Exchange:
    """One request's response as the WSGI app gives it: held until the app returns, or sent on as it streams."""

    def __init__(self, loop: asyncio.AbstractEventLoop, send) -> None:
        self.loop = loop
        self.send = send
        self.status = 500
        self.headers: list[tuple[bytes, bytes]] = []
        self.written: list[bytes] = []  # the legacy write() callable's output, before the body
        self.started = False  # the response's start has gone out (a streaming response)

    def start_response(self, status: str, headers, exc_info=None):
        if exc_info is not None and self.started:
            raise exc_info[1].with_traceback(exc_info[2])
        self.status = int(status.split(" ", 1)[0])
        self.headers = [
            (name.strip().lower().encode("latin1"), value.strip().encode("latin1")) for name, value in headers
        ]
        return self.written.append

    def _to_loop(self, message: dict[str, Any]) -> None:
        asyncio.run_coroutine_threadsafe(self.send(message), self.loop).result()

    def stream(self, iterable) -> None:
        """A streaming response: the start and what was written, then each chunk as the app makes it."""
        self.started = True
        self._to_loop({"type": "http.response.start", "status": self.status, "headers": self.headers})
        for chunk in self.written:
            self._to_loop({"type": "http.response.body", "body": chunk, "more_body": True})
        for chunk in iterable:
            if chunk:
                self._to_loop({"type": "http.response.body", "body": chunk, "more_body": True})
        self._to_loop({"type": "http.response.body", "body": b"", "more_body": False})


class ThreadedWSGI:
    """ASGI HTTP in front of a WSGI app run on `workers` long-lived threads (each keeps its database connection)."""

    def __init__(self, app, *, workers: int, warm=None) -> None:
        self.app = app
        self.workers = workers
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="http")
        self._warm = warm  # run once on every thread after the first answer (kernel/warmup.py), then dropped

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"ThreadedWSGI serves http only, not {scope['type']!r}")
        loop = asyncio.get_running_loop()
        parts: list[bytes] = []
        size, more = 0, True
        while more and size <= BUFFERED_BODY_BYTES:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before its request was whole: nothing to answer
            body = message.get("body", b"")
            parts.append(body)
            size += len(body)
            more = message.get("more_body", False)
        first = b"".join(parts)
        body = io.BufferedReader(_StreamedBody(first, loop, receive)) if more else io.BytesIO(first)
        environ = build_environ(scope, body)
        environ["wsgi.errors"] = sys.stderr
        exchange = _Exchange(loop, send)
        run = contextvars.copy_context().run
        later: list = []
        try:
            answer = await loop.run_in_executor(self.executor, run, self._respond, environ, exchange, later)
            if answer is not None:
                await send({"type": "http.response.start", "status": exchange.status, "headers": exchange.headers})
                await send({"type": "http.response.body", "body": answer, "more_body": False})
        finally:
            if later:  # also when the app or the send failed: what was committed still wants its wake-up
                await loop.run_in_executor(self.executor, run, _run_later, later)
            if self._warm is not None:
                self._warm_every_thread()

    def _warm_every_thread(self) -> None:
        """Start every worker thread now and run `warm` once on each, instead of starting them one by one as
        requests overlap, each paying for its first connections inside a request (kernel/warmup.py). The calls
        wait for each other so that no thread takes two; requests that come meanwhile queue behind them."""
        warm, self._warm = self._warm, None
        gathered = threading.Barrier(self.workers)

        def on_its_own_thread() -> None:
            try:
                gathered.wait(timeout=WARM_GATHER_S)
            except threading.BrokenBarrierError:  # a thread was busy with a long answer: warm the others anyway
                pass
            try:
                warm()
            except Exception:  # noqa: BLE001 - a warm-up is an optimisation; the first request does it anyway
                log.exception("http_thread_warmup_failed")

        for _ in range(self.workers):
            self.executor.submit(on_its_own_thread)

    def _respond(self, environ: dict[str, Any], exchange: _Exchange, later: list) -> bytes | None:
        """Run the app in this worker thread: the whole body of an ordinary response (the loop sends it), or None
        once a streaming response has been sent from here. What the app puts off with `after_answer` goes into
        `later`."""
        _after_answer.set(later)
        iterable = self.app(environ, exchange.start_response)
        try:
            streaming = getattr(iterable, "streaming", None)  # a Django response says; a plain list never streams
            if streaming or (streaming is None and not isinstance(iterable, list | tuple)):
                exchange.stream(iterable)
                return None
            return b"".join([*exchange.written, *iterable])
        finally:
            close = getattr(iterable, "close", None)
            if close is not None:
                close()
