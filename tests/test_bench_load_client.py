"""bench._load's own HTTP client against a real uvicorn server: answers with a length, chunked, or closing the
connection are read whole, connections are reused, each submit gets its own Idempotency-Key, and a slow answer, a
refused connection or a broken one is status 0 with its kind (never a hang, never a reused broken connection)."""

import asyncio
import json
import socket
import threading
import time

import pytest
import uvicorn

from bench._load import HttpClient, Sender, run_plan

seen: dict = {"connections": set(), "keys": [], "bodies": []}


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    seen["connections"].add(scope["client"])
    headers = dict(scope["headers"])
    path = scope["path"]
    if path == "/slow":
        await asyncio.sleep(2)
    if path == "/echo":
        seen["keys"].append(headers.get(b"idempotency-key", b"").decode())
        seen["bodies"].append(json.loads(body))
    extra = [(b"connection", b"close")] if path == "/close" else []
    if path == "/chunked":  # no length: uvicorn sends it chunked
        await send({"type": "http.response.start", "status": 201, "headers": extra})
        await send({"type": "http.response.body", "body": b"x" * 70000, "more_body": True})
        await send({"type": "http.response.body", "body": b"end"})
        return
    answer = b'{"ok": true}' * 100
    await send(
        {
            "type": "http.response.start",
            "status": 404 if path == "/missing" else 200,
            "headers": [(b"content-length", str(len(answer)).encode()), *extra],
        }
    )
    await send({"type": "http.response.body", "body": answer})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def base_url():
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def _run(coro):
    return asyncio.run(coro)


def test_answers_are_read_whole_and_connections_reused(base_url):
    async def go():
        client = HttpClient(base_url, max_connections=2, timeout_s=5)
        seen["connections"].clear()
        got = [await client.request("GET", path, {}, b"") for path in ("/len", "/chunked", "/missing", "/len") * 3]
        assert len(seen["connections"]) == 1  # one connection carried all twelve, one after another
        answers = await asyncio.gather(*(client.request("GET", "/chunked", {}, b"") for _ in range(6)))
        assert len(client.idle) == 2  # six at once over at most two connections
        client.close()
        return got, answers

    got, answers = _run(go())
    assert got == [(200, ""), (201, ""), (404, ""), (200, "")] * 3
    assert answers == [(201, "")] * 6


def test_a_closing_answer_is_not_reused(base_url):
    async def go():
        client = HttpClient(base_url, max_connections=1, timeout_s=5)
        first = await client.request("GET", "/close", {}, b"")
        idle_after_close = len(client.idle)
        second = await client.request("GET", "/len", {}, b"")
        client.close()
        return first, idle_after_close, second

    assert _run(go()) == ((200, ""), 0, (200, ""))


def test_a_submit_phase_sends_its_body_and_a_key_of_its_own_each_time(base_url):
    seen["keys"].clear()
    seen["bodies"].clear()
    plan = {
        "base_url": base_url,
        "max_connections": 4,
        "phases": [
            {
                "name": "post",
                "mode": "open",
                "rate": 200,
                "duration_s": 0.25,
                "drain_s": 5,
                "method": "POST",
                "urls": ["/echo"],
                "body": {"name": "x", "command": ["python", "train.py"]},
                "headers": {"Authorization": "Bearer t"},
                "idempotency_key": True,
            }
        ],
    }
    (result,) = _run(run_plan(plan))
    assert [s.status for s in result.samples] == [200] * 50
    assert len(set(seen["keys"])) == 50 and all(len(k) == 32 for k in seen["keys"])
    assert seen["bodies"] == [{"name": "x", "command": ["python", "train.py"]}] * 50


def test_slow_refused_and_malformed_answers_are_errors_with_their_kind(base_url):
    async def go():
        client = HttpClient(base_url, max_connections=1, timeout_s=0.5)
        slow = await client.request("GET", "/slow", {}, b"")
        assert client.idle == []  # the timed-out connection is closed, not handed to the next request
        after = await client.request("GET", "/len", {}, b"")
        refused = await HttpClient(f"http://127.0.0.1:{_free_port()}", max_connections=1, timeout_s=2).request(
            "GET", "/", {}, b""
        )

        async def not_http(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(not_http, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        malformed = await HttpClient(f"http://127.0.0.1:{port}", max_connections=1, timeout_s=2).request(
            "GET", "/", {}, b""
        )
        server.close()
        return slow, after, refused, malformed

    assert _run(go()) == ((0, "timeout"), (200, ""), (0, "connect"), (0, "protocol"))


def test_only_plain_http_is_spoken():
    with pytest.raises(ValueError, match="plain http"):
        HttpClient("https://example.org", max_connections=1, timeout_s=1)


def test_a_sender_without_a_body_sends_no_length():
    sender = Sender(HttpClient("http://127.0.0.1:1", max_connections=1, timeout_s=1), {"urls": ["/a"]})
    assert sender.body == b"" and "Content-Type" not in sender.headers


def test_a_connection_the_server_closed_while_idle_is_not_reused():
    async def go():
        async def answer_once(reader, writer):  # answers one request with keep-alive, then hangs up a moment later
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
            await asyncio.sleep(0.1)
            writer.close()

        server = await asyncio.start_server(answer_once, "127.0.0.1", 0)
        client = HttpClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", max_connections=1, timeout_s=2)
        first = await client.request("GET", "/", {}, b"")
        await asyncio.sleep(0.3)  # the server closed the idle connection meanwhile
        second = await client.request("GET", "/", {}, b"")
        client.close()
        server.close()
        return first, second

    assert _run(go()) == ((200, ""), (200, ""))


def test_a_pause_after_a_phase_sends_nothing_until_it_is_over(base_url):
    """bench.submit's paired windows: `pause_after_s` keeps the next phase's first request back by that long."""
    window = {"mode": "open", "rate": 100, "duration_s": 0.1, "drain_s": 5, "method": "GET", "urls": ["/ok"]}
    plan = {
        "base_url": base_url,
        "max_connections": 2,
        "phases": [{**window, "name": "first", "pause_after_s": 0.6}, {**window, "name": "second"}],
    }
    t0 = time.perf_counter()
    first, second = _run(run_plan(plan))
    took = time.perf_counter() - t0
    assert [s.status for s in first.samples + second.samples] == [200] * 20
    assert took >= 0.6 + first.wall_s + second.wall_s - 0.01
