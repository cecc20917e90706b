"""The log store (caps, ring, search, paging) and live streaming over a real Channels communicator."""

import asyncio
import uuid

import pytest
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.db import connections
from rest_framework.test import APIClient

from jobs import logstore
from trainyard.routing import websocket_urlpatterns


def test_far_past_the_budget_keeps_exactly_the_last_5000_lines(tmp_path):
    writer = logstore.LogWriter(tmp_path, budget_bytes=10**9, budget_lines=1000)
    for i in range(1, 50_001):
        writer.write_line(f"line {i}")
    writer.close()
    lines, meta = logstore.read_lines(tmp_path, start=1, limit=10_000)
    assert len(lines) == 5000
    assert lines[0].number == 45_001 and lines[0].text == "line 45001"
    assert lines[-1].number == 50_000 and lines[-1].text == "line 50000"
    assert meta.dropped_lines == 45_000 and meta.lines_seen == 50_000 and meta.ring
    assert meta.dropped_bytes == sum(len(f"line {i}\n") for i in range(1, 45_001))


def test_stderr_is_kept_apart_numbered_as_in_the_merged_log_and_capped(tmp_path, monkeypatch):
    writer = logstore.LogWriter(tmp_path, budget_bytes=10**9, budget_lines=1000)
    for i in range(1, 3001):  # past the line budget: the merged log becomes a ring, stderr keeps its own file
        writer.write_line(f"out {i}")
        if i % 1000 == 0:
            writer.write_line(f"err {i}", stream="stderr")
    writer.close()
    assert [(x.number, x.text) for x in logstore.stderr_lines(tmp_path)] == [
        (1001, "err 1000"),
        (2002, "err 2000"),
        (3003, "err 3000"),
    ]
    assert [x.text for x in logstore.stderr_lines(tmp_path, tail=1)] == ["err 3000"]
    merged, meta = logstore.read_lines(tmp_path, start=2002, limit=1)
    assert merged[0].text == "err 2000" and meta.stderr_lines == 3 and meta.ring

    monkeypatch.setattr(logstore, "STDERR_MAX_BYTES", 40)
    capped = tmp_path / "capped"
    writer = logstore.LogWriter(capped)
    for i in range(10):
        writer.write_line(f"error number {i}", stream="stderr")
    writer.close()
    meta = logstore.LogMeta.read(capped)
    assert meta.stderr_lines == 2 and meta.stderr_dropped == 8 and meta.lines_seen == 10
    assert len(logstore.read_lines(capped)[0]) == 10  # the merged log still has every line


def test_byte_budget_and_cut_lines(tmp_path):
    writer = logstore.LogWriter(tmp_path, budget_bytes=1000, budget_lines=10**9)
    writer.write_line("x" * (logstore.MAX_LINE_BYTES + 100))
    for i in range(6000):
        writer.write_line(f"{i}")
    writer.close()
    lines, meta = logstore.read_lines(tmp_path, limit=10_000)
    assert len(lines) == 5000 and lines[-1].text == "5999"
    assert meta.dropped_lines == 6001 - 5000


def test_under_the_budget_everything_is_kept_and_searchable(tmp_path):
    writer = logstore.LogWriter(tmp_path, budget_bytes=10**9, budget_lines=10**9)
    for i in range(1, 101):
        writer.write_line(f"step {i} loss {1 / i:.3f}" + (" NCCL timeout" if i == 50 else ""))
    writer.close()
    hits = list(logstore.search(tmp_path, "nccl", context=2))
    assert len(hits) == 1
    assert hits[0]["line"]["number"] == 50
    assert [b["number"] for b in hits[0]["before"]] == [48, 49]
    assert [a["number"] for a in hits[0]["after"]] == [51, 52]
    tail, _ = logstore.tail_lines(tmp_path, 3)
    assert [ln.number for ln in tail] == [98, 99, 100]
    page, _ = logstore.read_lines(tmp_path, start=10, limit=5)
    assert [ln.number for ln in page] == [10, 11, 12, 13, 14]


def test_follower_survives_ring_rewrites(tmp_path):
    writer = logstore.LogWriter(tmp_path, budget_bytes=10**9, budget_lines=100)
    for i in range(1, 51):
        writer.write_line(f"l{i}")
    writer.flush()
    follower, first = logstore.Follower.at_tail(tmp_path, 10)
    assert [ln.number for ln in first] == list(range(41, 51))
    seen = []
    for i in range(51, 20_001):
        writer.write_line(f"l{i}")
        if i % 3000 == 0:
            writer.flush()
            seen.extend(follower.poll(100_000))
    writer.close()
    seen.extend(follower.poll(100_000))
    numbers = [ln.number for ln in seen]
    assert numbers == sorted(set(numbers))  # no duplicates, in order
    assert numbers[-1] == 20_000 and all(ln.text == f"l{ln.number}" for ln in seen)


@pytest.fixture
def job_with_log(settings, tmp_path, db):
    from jobs.services import job_submit
    from ops.seed import seed

    settings.TRAINYARD_LOG_ROOT = tmp_path / "logs"
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    from django.contrib.auth import get_user_model

    demo = get_user_model().objects.get(username="demo")
    job, _ = job_submit(
        user=demo,
        data={"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": ["echo"]},
    )
    from jobs.models import Attempt

    Attempt.objects.create(job=job, number=1, backend="local")
    writer = logstore.LogWriter(logstore.attempt_dir(str(job.id), 1), budget_bytes=10**9, budget_lines=10**9)
    for i in range(1, 301):
        writer.write_line(f"epoch {i}")
    writer.flush()
    yield job, demo, writer
    writer.close()


def test_logs_api_pages_tails_and_searches(job_with_log):
    job, demo, _writer = job_with_log
    client = APIClient()
    client.force_authenticate(demo)
    page = client.get(f"/api/v1/jobs/{job.id}/logs/?start=10&limit=5").json()
    assert [ln["n"] for ln in page["lines"]] == [10, 11, 12, 13, 14] and page["next_start"] == 15
    tail = client.get(f"/api/v1/jobs/{job.id}/logs/?tail=2").json()
    assert [ln["text"] for ln in tail["lines"]] == ["epoch 299", "epoch 300"]
    found = client.get(f"/api/v1/jobs/{job.id}/logs/search/?q=EPOCH 25&context=1").json()
    assert [h["line"]["number"] for h in found["hits"]] == [25, 250, 251, 252, 253, 254, 255, 256, 257, 258, 259]
    assert client.get(f"/api/v1/jobs/{job.id}/logs/search/?q=").status_code == 400
    assert client.get(f"/api/v1/jobs/{job.id}/logs/?start=x").json()["code"] == "invalid_parameter"


async def _receive_until(communicator, kind, timeout=5):
    while True:
        message = await communicator.receive_json_from(timeout=timeout)
        if message["type"] == kind:
            return message


def _communicator(job_id, user, query=""):
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/jobs/{job_id}/logs/?{query}")
    communicator.scope["user"] = user
    return communicator


@pytest.mark.django_db(transaction=True)
def test_stream_sends_tail_then_live_lines_and_resumes_without_gaps(job_with_log):
    job, demo, writer = job_with_log

    async def scenario():
        live = _communicator(job.id, demo, "tail=5")
        connected, _ = await live.connect()
        assert connected
        hello = await _receive_until(live, "hello")
        assert hello["attempt"] == 1
        first = await _receive_until(live, "lines")
        assert [ln["n"] for ln in first["lines"]] == [296, 297, 298, 299, 300]
        await asyncio.to_thread(lambda: (writer.write_line("epoch 301"), writer.flush()))
        more = await _receive_until(live, "lines")
        assert more["lines"] == [{"n": 301, "text": "epoch 301"}]
        from jobs.realtime import job_changed

        await asyncio.to_thread(job_changed, job_id=str(job.id), state="running")
        assert (await _receive_until(live, "state"))["state"] == "running"
        await live.disconnect()
        await asyncio.to_thread(
            lambda: (writer.write_line("epoch 302"), writer.write_line("epoch 303"), writer.flush())
        )
        resumed = _communicator(job.id, demo, "after=301")
        await resumed.connect()
        got = await _receive_until(resumed, "lines")
        assert [ln["n"] for ln in got["lines"]] == [302, 303]
        await asyncio.to_thread(writer.close)
        assert (await _receive_until(resumed, "end"))["attempt"] == 1
        await resumed.disconnect()
        await database_sync_to_async(connections.close_all)()

    asyncio.run(scenario())


@pytest.mark.django_db(transaction=True)
def test_stream_refuses_non_members_and_anonymous(job_with_log):
    job, _demo, _ = job_with_log
    from django.contrib.auth.models import AnonymousUser

    from quotas.tests.factories import UserFactory

    stranger = UserFactory(username=f"stranger-{uuid.uuid4().hex[:6]}")

    async def scenario():
        for user in (stranger, AnonymousUser()):
            communicator = _communicator(job.id, user)
            connected, code = await communicator.connect()
            assert not connected and code == 4403
            await communicator.disconnect()  # end the consumer instance, or the loop waits on its layer read
        await database_sync_to_async(connections.close_all)()

    asyncio.run(scenario())


@pytest.mark.django_db(transaction=True)
def test_many_sockets_share_one_tailer_that_stops_when_the_last_leaves(job_with_log):
    job, demo, writer = job_with_log
    from jobs.consumers import _Tailer

    async def scenario():
        sockets = [_communicator(job.id, demo, "tail=0") for _ in range(3)]
        for socket in sockets:
            assert (await socket.connect())[0]
            await _receive_until(socket, "hello")
        tailer = _Tailer.for_running_loop()
        assert len(tailer.watched) == 3 and not tailer.task.done()
        await asyncio.to_thread(lambda: (writer.write_line("epoch 301"), writer.flush(lazy=True)))
        for socket in sockets:
            got = await _receive_until(socket, "lines")
            assert got["lines"] == [{"n": 301, "text": "epoch 301"}]
        for socket in sockets:
            await socket.disconnect()
        await asyncio.wait_for(tailer.task, 2)  # nothing left to watch: the loop ends and forgets this tailer
        assert not tailer.watched and asyncio.get_running_loop() not in _Tailer._by_loop
        await database_sync_to_async(connections.close_all)()

    asyncio.run(scenario())


def test_lazy_flush_writes_lines_at_once_and_counts_at_most_every_half_second(tmp_path):
    writer = logstore.LogWriter(tmp_path, budget_bytes=10**9, budget_lines=10**9)
    writer.write_line("one")
    writer.flush(lazy=True)  # the first lazy flush after opening is within RING_FLUSH_S: counts wait
    assert (tmp_path / "log").read_bytes() == b"one\n"
    assert logstore.LogMeta.read(tmp_path).lines_seen == 0
    writer._last_meta -= logstore.RING_FLUSH_S
    writer.write_line("two")
    writer.flush(lazy=True)
    assert logstore.LogMeta.read(tmp_path).lines_seen == 2
    writer.write_line("three")
    writer.close()
    meta = logstore.LogMeta.read(tmp_path)
    assert meta.lines_seen == 3 and meta.closed


def test_the_daily_budget_is_the_jobs_across_its_attempts(tmp_path):
    first = logstore.attempt_dir("job-1", 1, root=tmp_path)
    writer = logstore.LogWriter(first, budget_bytes=10**9, budget_lines=8)
    for i in range(6):
        writer.write_line(f"first {i}")
    writer.close()
    # A retry the same day starts from the 6 lines its job already used, not from a fresh budget.
    second = logstore.attempt_dir("job-1", 2, root=tmp_path)
    writer = logstore.LogWriter(second, budget_bytes=10**9, budget_lines=8)
    for i in range(RING := logstore.RING_LINES + 10):
        writer.write_line(f"second {i}")
    writer.close()
    lines, meta = logstore.read_lines(second, limit=10**6)
    assert meta.ring and meta.day_lines == 6 + RING
    assert meta.dropped_lines == RING - logstore.RING_LINES and len(lines) == logstore.RING_LINES
    # Another job has a budget of its own.
    other = logstore.LogWriter(logstore.attempt_dir("job-2", 1, root=tmp_path), budget_bytes=10**9, budget_lines=8)
    other.write_line("hello")
    other.close()
    assert not other.meta.ring and other.meta.day_lines == 1


@pytest.mark.django_db(transaction=True)
def test_metrics_charts_redraw_live_over_the_log_socket(job_with_log, settings):
    """A metric line the job prints reaches the page's chart over the same socket as the log, in its language."""
    job, demo, writer = job_with_log
    from jobs.models import Attempt
    from monitoring import services as monitoring_services

    Attempt.objects.filter(job=job).update(state="running")

    async def scenario():
        page = _communicator(job.id, demo, "tail=1&metrics=0&lang=zh-hans")
        plain = _communicator(job.id, demo, "tail=1")  # a client that did not ask (the CLI) gets no charts
        assert (await page.connect())[0] and (await plain.connect())[0]
        await _receive_until(page, "lines")
        await _receive_until(plain, "lines")
        await asyncio.to_thread(
            lambda: (
                writer.write_line('TRAINYARD_METRIC {"step": 1, "loss": 0.9}'),
                writer.write_line('TRAINYARD_METRIC {"step": 2, "loss": 0.4}'),
                writer.flush(),
            )
        )
        await _receive_until(page, "lines")
        await asyncio.to_thread(monitoring_services.business_metrics_scan)  # what the woken worker runs
        charts = await _receive_until(page, "metrics")
        assert charts["version"] > 0 and 'data-series="loss"' in charts["html"] and "<polyline" in charts["html"]
        assert "x 轴：训练步数" in charts["html"]  # rendered in the page's language
        await asyncio.to_thread(
            monitoring_services.business_metrics_report, job=job, data={"step": 3, "loss": 0.2, "accuracy": 0.8}
        )
        again = await _receive_until(page, "metrics")
        assert again["version"] > charts["version"] and 'data-series="accuracy"' in again["html"]
        while not plain.output_queue.empty():
            assert (await plain.receive_json_from())["type"] != "metrics"
        await page.disconnect()
        await plain.disconnect()
        await database_sync_to_async(connections.close_all)()

    asyncio.run(scenario())
