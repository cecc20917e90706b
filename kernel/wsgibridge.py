"""HTTP from the ASGI server to a WSGI application on a fixed pool of long-lived threads, with one hand-over each
way for an ordinary request.

A general bridge (a2wsgi) crosses between the event loop and the worker thread for every piece of a request: each
read of the body, the response's start, each body chunk and the end, every crossing a wake-up of the other side and
a trip of the interpreter lock. The platform's requests are nearly all small bodies answered by one non-streaming
response, so this bridge reads a body of up to `BUFFERED_BODY_BYTES` in the loop before handing the request over,
and the thread hands back status, headers and the whole body at once. A longer body is read from the thread as it
comes (the first part from memory); a streaming response (a file, a log download) goes out chunk by chunk as it is
produced. docs/benchmarks.md gives what it saved.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from a2wsgi.wsgi import build_environ

BUFFERED_BODY_BYTES = 1 << 20


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

    def __init__(self, app, *, workers: int) -> None:
        self.app = app
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="http")

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
        answer = await loop.run_in_executor(self.executor, run, self._respond, environ, exchange)
        if answer is not None:
            await send({"type": "http.response.start", "status": exchange.status, "headers": exchange.headers})
            await send({"type": "http.response.body", "body": answer, "more_body": False})

    def _respond(self, environ: dict[str, Any], exchange: _Exchange) -> bytes | None:
        """Run the app in this worker thread: the whole body of an ordinary response (the loop sends it), or None
        once a streaming response has been sent from here."""
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
