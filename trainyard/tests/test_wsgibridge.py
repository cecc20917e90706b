"""kernel/wsgibridge.py: HTTP from the ASGI server to the WSGI app on worker threads, one hand-over each way for an
ordinary request; long bodies and streaming responses still flow piece by piece."""

import asyncio
import threading

import pytest
from django.http import HttpResponse, StreamingHttpResponse

from kernel import wsgibridge
from kernel.wsgibridge import ThreadedWSGI


def _scope(method="POST", headers=()):
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": "/echo",
        "raw_path": b"/echo",
        "query_string": b"a=1",
        "root_path": "",
        "headers": list(headers),
        "client": ("10.1.2.3", 5000),
        "server": ("testserver", 80),
    }


def _exchange(app, messages, *, scope=None):
    """Call the ASGI app with these request messages; returns what it sent and the receive calls it made."""
    sent, received = [], []
    pending = list(messages)

    async def receive():
        received.append(threading.current_thread().name)
        if pending:
            return pending.pop(0)
        await asyncio.sleep(3600)  # a real server blocks until the client sends more

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope or _scope(), receive, send))
    return sent, received


def _body(messages):
    return b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")


def _echo(environ, start_response):
    body = environ["wsgi.input"].read()
    seen = f"{environ['REQUEST_METHOD']} {environ['PATH_INFO']}?{environ['QUERY_STRING']} {environ['REMOTE_ADDR']}"
    start_response("201 Created", [("Content-Type", "text/plain"), ("X-Thread", threading.current_thread().name)])
    return [seen.encode() + b" " + body]


def test_an_ordinary_request_is_answered_in_one_start_and_one_body():
    app = ThreadedWSGI(_echo, workers=2)
    sent, _ = _exchange(app, [{"type": "http.request", "body": b"hello", "more_body": False}])
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 201
    headers = dict(sent[0]["headers"])
    assert headers[b"content-type"] == b"text/plain"
    assert headers[b"x-thread"].startswith(b"http")  # the app ran on one of the bridge's threads
    assert sent[1] == {"type": "http.response.body", "body": b"POST /echo?a=1 10.1.2.3 hello", "more_body": False}


def test_a_body_in_several_messages_is_read_whole_before_the_app_runs():
    app = ThreadedWSGI(_echo, workers=1)
    parts = [{"type": "http.request", "body": b"ab", "more_body": True}, {"type": "http.request", "body": b"cd"}]
    sent, received = _exchange(app, parts)
    assert _body(sent).endswith(b" abcd")
    assert all(not name.startswith("http") for name in received)  # every part read on the event loop


def test_a_body_longer_than_the_buffer_is_read_from_the_thread_as_it_comes(monkeypatch):
    monkeypatch.setattr(wsgibridge, "BUFFERED_BODY_BYTES", 4)
    app = ThreadedWSGI(_echo, workers=1)
    chunks = [b"0123", b"4567", b"89", b"abc", b""]
    parts = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent, received = _exchange(app, parts)
    assert _body(sent).endswith(b" 0123456789abc")
    # The loop read until it held more than the buffer (two parts); the rest was received for the app's reads.
    assert len(received) == len(chunks)


def test_a_streaming_response_goes_out_chunk_by_chunk_and_is_closed():
    closed = []

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])

        def chunks():
            try:
                yield b"one "
                yield b""
                yield b"two"
            finally:
                closed.append(True)

        return chunks()

    sent, _ = _exchange(ThreadedWSGI(app, workers=1), [{"type": "http.request", "body": b""}])
    assert [m.get("body") for m in sent] == [None, b"one ", b"two", b""]
    assert sent[-1]["more_body"] is False
    assert closed == [True]


@pytest.mark.parametrize("streaming", [False, True])
def test_django_responses_stream_only_when_they_say_so(streaming):
    def app(environ, start_response):
        if streaming:
            response = StreamingHttpResponse(iter([b"a", b"b"]), content_type="text/plain")
        else:
            response = HttpResponse(b"ab", content_type="text/plain")
        start_response(f"{response.status_code} OK", list(response.items()))
        return response

    sent, _ = _exchange(ThreadedWSGI(app, workers=1), [{"type": "http.request", "body": b""}], scope=_scope("GET"))
    assert _body(sent) == b"ab"
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert len(bodies) == (3 if streaming else 1)


def test_the_legacy_write_callable_comes_before_the_body():
    def app(environ, start_response):
        write = start_response("200 OK", [])
        write(b"written ")
        return [b"returned"]

    sent, _ = _exchange(ThreadedWSGI(app, workers=1), [{"type": "http.request", "body": b""}])
    assert _body(sent) == b"written returned"


def test_a_client_gone_before_its_body_arrived_gets_nothing_and_the_app_never_runs():
    ran = []

    def app(environ, start_response):
        ran.append(True)
        start_response("200 OK", [])
        return [b""]

    messages = [{"type": "http.request", "body": b"par", "more_body": True}, {"type": "http.disconnect"}]
    sent, _ = _exchange(ThreadedWSGI(app, workers=1), messages)
    assert sent == [] and ran == []


def test_an_app_that_raises_sends_nothing_and_the_server_sees_the_error():
    def app(environ, start_response):
        raise RuntimeError("broken view")

    with pytest.raises(RuntimeError, match="broken view"):
        _exchange(ThreadedWSGI(app, workers=1), [{"type": "http.request", "body": b""}])


def test_only_http_is_served():
    with pytest.raises(ValueError, match="http only"):
        _exchange(ThreadedWSGI(_echo, workers=1), [], scope={"type": "websocket"})


def _deferring(order, *calls):
    """A WSGI app that puts `calls` off until its answer has gone out, recording in `order` what ran when."""

    def app(environ, start_response):
        for call in calls:
            assert wsgibridge.after_answer(call) is True
        order.append("app returned")
        start_response("200 OK", [])
        return [b"answer"]

    return app


async def _empty_request():
    return {"type": "http.request", "body": b""}


def _serve_recording(app, order, *, workers=1):
    """Serve one empty request; each message sent is recorded in `order` as it goes. Returns the messages."""
    sent: list[dict] = []

    async def send(message):
        sent.append(message)
        order.append(f"sent {message['type']}")

    asyncio.run(ThreadedWSGI(app, workers=workers)(_scope(), _empty_request, send))
    return sent


def test_a_call_put_off_runs_once_the_answer_has_been_sent_and_only_once():
    order: list[str] = []

    def wake():
        order.append(f"wake on {threading.current_thread().name}")

    sent = _serve_recording(_deferring(order, wake, wake), order)
    assert order[:3] == ["app returned", "sent http.response.start", "sent http.response.body"]
    assert len(order) == 4 and order[3].startswith("wake on http")
    assert _body(sent) == b"answer"


def test_put_off_calls_run_even_when_sending_fails_and_one_failure_does_not_stop_the_next():
    ran: list[str] = []

    def broken():
        raise RuntimeError("broker down")

    async def send(message):
        raise OSError("client gone")

    app = ThreadedWSGI(_deferring([], broken, lambda: ran.append("second")), workers=1)
    with pytest.raises(OSError, match="client gone"):
        asyncio.run(app(_scope(), _empty_request, send))
    assert ran == ["second"]


def test_outside_the_bridge_nothing_is_put_off():
    assert wsgibridge.after_answer(lambda: None) is False


def test_a_submission_through_the_bridge_wakes_the_dispatcher_after_its_answer(monkeypatch):
    """kernel.wake.dispatch_soon called inside a bridged request sends its message after the answer; outside one
    (a worker, the test client) at once, as before."""
    from kernel import wake

    order: list[str] = []
    monkeypatch.setattr(wake, "_send_wake", lambda: order.append("wake sent"))
    wake.dispatch_soon()
    assert order == ["wake sent"]
    order.clear()

    def app(environ, start_response):
        wake.dispatch_soon()
        order.append("app returned")
        start_response("201 Created", [])
        return [b"{}"]

    _serve_recording(app, order, workers=2)
    assert order == ["app returned", "sent http.response.start", "sent http.response.body", "wake sent"]


def test_after_the_first_answer_every_thread_warms_up_once_and_later_requests_warm_nothing():
    """kernel/warmup.py's call runs once on each of the bridge's threads, each a thread of its own, after the first
    request's answer has gone out; the second request starts no more."""
    order: list[str] = []
    warmed: list[str] = []
    lock = threading.Lock()

    def warm():
        with lock:
            warmed.append(threading.current_thread().name)

    def app(environ, start_response):
        order.append("app returned")
        start_response("200 OK", [])
        return [b"answer"]

    async def send(message):
        order.append(f"sent {message['type']}")
        if len(order) <= 3:  # the first request's answer
            with lock:
                assert warmed == [], "a thread warmed up before the answer was sent"

    bridge = ThreadedWSGI(app, workers=4, warm=warm)

    async def two_requests():
        await bridge(_scope(), _empty_request, send)
        # The warm-up calls were queued before this request's: it waits behind them, then is served as usual.
        await bridge(_scope(), _empty_request, send)

    asyncio.run(two_requests())
    bridge.executor.shutdown(wait=True)
    assert order == ["app returned", "sent http.response.start", "sent http.response.body"] * 2
    assert len(warmed) == 4 and len(set(warmed)) == 4 and all(name.startswith("http") for name in warmed)


def test_a_failing_warm_up_leaves_the_requests_served():
    def warm():
        raise RuntimeError("database down")

    bridge = ThreadedWSGI(_echo, workers=2, warm=warm)
    first = _exchange(bridge, [{"type": "http.request", "body": b"one"}])[0]
    second = _exchange(bridge, [{"type": "http.request", "body": b"two"}])[0]
    bridge.executor.shutdown(wait=True)
    assert _body(first).endswith(b"one") and _body(second).endswith(b"two")
