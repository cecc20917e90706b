"""Live log streaming over WebSockets (`/ws/jobs/<id>/logs/`).

On connect: the last `tail` lines (or the lines after `after`, when a client resumes), then new lines as
the attempt writes them, job state changes, and a note when a retry starts a new attempt. Only members
of the job's team (or staff) may subscribe; others are closed with 4403.
"""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from jobs import logstore
from jobs.realtime import job_group

POLL_S = 0.05
END_CHECK_S = 0.5
BATCH = 2000


class JobLogConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        self.job_id = str(self.scope["url_route"]["kwargs"]["job_id"])
        user = self.scope.get("user")
        info = await self._job_info(user)
        if info is None:
            await self.close(code=4403)
            return
        params = parse_qs(self.scope.get("query_string", b"").decode())
        latest = info["attempts"] or 1
        self.attempt = _int(params, "attempt", latest)
        self.tail = min(_int(params, "tail", 200), 5000)
        self.after = params.get("after", [None])[0]
        self.current_state = info["state"]
        self.ended = False
        await self.channel_layer.group_add(job_group(self.job_id), self.channel_name)
        # Read the state again once subscribed: a change between the first read and the join is not lost.
        info = await self._job_info(None, check=False) or info
        self.current_state = info["state"]
        await self.accept()
        await self._start_attempt(after=int(self.after) if self.after and self.after.isdigit() else None)
        self.pump = asyncio.create_task(self._follow())

    async def disconnect(self, code):
        pump = getattr(self, "pump", None)
        if pump:
            pump.cancel()
        if hasattr(self, "job_id"):
            await self.channel_layer.group_discard(job_group(self.job_id), self.channel_name)

    async def _start_attempt(self, *, after: int | None) -> None:
        folder = logstore.attempt_dir(self.job_id, self.attempt)
        if after is None:
            self.follower, lines = await asyncio.to_thread(logstore.Follower.at_tail, folder, self.tail)
        else:
            self.follower = await asyncio.to_thread(logstore.Follower.after, folder, after)
            lines = await asyncio.to_thread(self.follower.poll, BATCH)
        meta = await asyncio.to_thread(logstore.LogMeta.read, folder)
        await self.send_json({"type": "hello", "attempt": self.attempt, "first_kept_line": meta.first_line,
                              "dropped_lines": meta.dropped_lines, "state": self.current_state})
        if lines:
            await self._send_lines(lines)
        self.ended = False

    async def _send_lines(self, lines) -> None:
        await self.send_json({"type": "lines", "attempt": self.attempt,
                              "lines": [{"n": ln.number, "text": ln.text} for ln in lines]})

    async def _follow(self) -> None:
        # Reads run inline: a poll of a local file's new tail takes well under a millisecond, and handing it to
        # the default thread pool (a few threads shared by every socket) queued it behind the other streams.
        checked_end = 0.0
        loop = asyncio.get_running_loop()
        while True:
            lines = self.follower.poll(BATCH)
            if lines:
                await self._send_lines(lines)
                continue
            if not self.ended and loop.time() - checked_end >= END_CHECK_S:
                checked_end = loop.time()
                meta = logstore.LogMeta.read(logstore.attempt_dir(self.job_id, self.attempt))
                if meta.closed:
                    lines = self.follower.poll(BATCH)
                    if lines:
                        await self._send_lines(lines)
                        continue
                    self.ended = True
                    await self.send_json({"type": "end", "attempt": self.attempt})
            await asyncio.sleep(POLL_S)

    async def job_state(self, event):
        self.current_state = event["state"]
        await self.send_json({"type": "state", "state": event["state"]})
        info = await self._job_info(None, check=False)
        if info and info["attempts"] > self.attempt:
            await self.send_json({"type": "attempt", "attempt": info["attempts"]})

    @database_sync_to_async
    def _job_info(self, user, check: bool = True):
        from jobs.models import Job
        from jobs.selectors import jobs_visible_to

        if check:
            if user is None or not user.is_authenticated:
                return None
            qs = jobs_visible_to(user)
        else:
            qs = Job.objects.all()
        job = qs.filter(pk=self.job_id).first()
        if job is None:
            return None
        return {"state": job.state, "attempts": job.attempts.count()}

    async def receive_json(self, content, **kwargs):
        pass  # the stream is one-way; clients reconnect with ?after= to resume


def _int(params: dict, name: str, default: int) -> int:
    try:
        return max(0, int(params[name][0]))
    except (KeyError, ValueError, IndexError):
        return default
