"""Notices to browsers go out through one kept event loop per process, over the real Redis channel layer."""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid

import redis
import redis.asyncio.connection
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

from jobs import realtime


def _listen(job_id: str) -> str:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(realtime.job_group(job_id), channel)
    return channel


def _received(channel: str, count: int) -> list[dict]:
    layer = get_channel_layer()

    async def collect() -> list[dict]:
        return [await layer.receive(channel) for _ in range(count)]

    return async_to_sync(collect)()


def test_notices_arrive_in_order_whether_or_not_the_sender_waits():
    job_id = str(uuid.uuid4())
    channel = _listen(job_id)
    realtime.job_changed(job_id=job_id, state="running")
    realtime.send(
        [(realtime.job_group(job_id), {"type": "job.state", "job_id": job_id, "state": "succeeded"})], wait=False
    )
    realtime.job_metrics_changed(job_id=job_id)
    got = _received(channel, 3)
    assert [m.get("state", m["type"]) for m in got] == ["running", "succeeded", "job.metrics"]


def test_many_notices_share_the_processs_connections(monkeypatch):
    """A new event loop per notice (async_to_sync) opened a Redis connection for each: 40 notices, 40 logins.
    Counted in this process (the server's own count also holds the other test processes' connections)."""
    realtime.job_changed(job_id=str(uuid.uuid4()), state="running")  # the loop and its pool exist from here on
    opened = []
    real = redis.asyncio.connection.Connection._connect

    async def counting(self):
        opened.append(self)
        return await real(self)

    monkeypatch.setattr(redis.asyncio.connection.Connection, "_connect", counting)

    async def ping() -> None:
        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        await client.ping()
        await client.aclose()

    asyncio.run(ping())
    assert len(opened) == 1  # a connection to this Redis is counted
    opened.clear()
    for _ in range(40):
        realtime.job_changed(job_id=str(uuid.uuid4()), state="running")
    assert len(opened) <= 2


def _send_in_child() -> None:
    realtime.job_changed(job_id=str(uuid.uuid4()), state="running")


def test_a_forked_child_sends_on_a_loop_of_its_own():
    realtime.job_changed(
        job_id=str(uuid.uuid4()), state="running"
    )  # the parent's loop runs in a thread the child lacks
    child = multiprocessing.get_context("fork").Process(target=_send_in_child)
    child.start()
    child.join(30)
    assert child.exitcode == 0


def test_many_notices_go_only_to_pages_someone_has_open(monkeypatch):
    """A pass that admits thousands notifies each job's page; only the groups with a member get a group send, and
    the open page still receives its notice, in order with the others sent to it."""
    layer = get_channel_layer()
    watched = str(uuid.uuid4())
    channel = _listen(watched)
    sent: list[str] = []
    real = type(layer).group_send

    async def counting(self, group, message):
        sent.append(group)
        await real(self, group, message)

    monkeypatch.setattr(type(layer), "group_send", counting)
    others = [str(uuid.uuid4()) for _ in range(60)]
    notices = (realtime.state_notice(j, "admitted") for j in others[:30] + [watched] + others[30:])
    realtime.send(notices, wait=True)
    realtime.send([realtime.state_notice(watched, "running")], wait=True)  # one notice: sent without asking
    realtime.send([realtime.state_notice(others[0], "running")], wait=True)
    assert sent == [realtime.job_group(watched), realtime.job_group(watched), realtime.job_group(others[0])]
    assert [m["state"] for m in _received(channel, 2)] == ["admitted", "running"]
