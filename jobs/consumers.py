"""Live log streaming over WebSockets (`/ws/jobs/<id>/logs/`).

On connect: the last `tail` lines (or the lines after `after`, when a client resumes), then new lines as
the attempt writes them, job state changes, and a note when a retry starts a new attempt. Only members
of the job's team (or staff) may subscribe; others are closed with 4403.

A client that sends `metrics=<version>` (the job page) also gets the job's metrics charts, redrawn whenever
the job reports something new (`{"type": "metrics", "version": n, "html": ...}`, in the language `lang`).
A streamed line that carries a metric wakes the metric scan at once, instead of at its next beat.
"""

from __future__ import annotations

import asyncio
import os
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.utils import translation

from jobs import logstore
from jobs.realtime import job_group

POLL_S = 0.05
END_CHECK_S = 0.5
BATCH = 2000
METRICS_MIN_INTERVAL_S = 0.5  # at most two chart redraws a second per socket, however fast the job reports
METRIC_TAG = "TRAINYARD_METRIC"
WATCH_MARK_S = 15.0  # how often an open socket renews the job's "watched" mark (it counts for LOG_WATCH_S)


class _Tailer:
    """One per event loop: every POLL_S it stats each followed log once and wakes the sockets whose file changed.

    A socket whose log is quiet costs one stat per tick and no wake-up; only a change reads the file. So the
    web process does the same small amount of work per tick whether 1 or 500 browsers are watching.
    """

    _by_loop: dict[asyncio.AbstractEventLoop, _Tailer] = {}

    def __init__(self) -> None:
        self.watched: dict[JobLogConsumer, tuple[int, int] | None] = {}
        self.task: asyncio.Task | None = None

    @classmethod
    def for_running_loop(cls) -> _Tailer:
        loop = asyncio.get_running_loop()
        tailer = cls._by_loop.get(loop)
        if tailer is None:
            tailer = cls._by_loop[loop] = cls()
        return tailer

    def add(self, consumer: JobLogConsumer) -> None:
        self.watched[consumer] = None
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())

    def remove(self, consumer: JobLogConsumer) -> None:
        self.watched.pop(consumer, None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.watched:
                for consumer, seen in list(self.watched.items()):
                    try:
                        st = os.stat(consumer.follower.folder / "log")
                        now = (st.st_ino, st.st_size)
                    except OSError:
                        now = None
                    if now != seen and consumer in self.watched:
                        self.watched[consumer] = now
                        consumer.wake.set()
                await asyncio.sleep(POLL_S)
        finally:
            # Done (nobody left) or cancelled with its loop: forget it; a later socket starts a fresh one.
            if self._by_loop.get(loop) is self:
                del self._by_loop[loop]


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
        self.metrics_version = _int(params, "metrics", -1) if "metrics" in params else None
        languages = {code for code, _name in settings.LANGUAGES}
        lang = params.get("lang", [""])[0].lower()
        self.lang = lang if lang in languages else settings.LANGUAGE_CODE
        self.metrics_task: asyncio.Task | None = None
        self.metrics_dirty = False
        self.scan_woken_at = 0.0
        self.current_state = info["state"]
        self.ended = False
        await self.channel_layer.group_add(job_group(self.job_id), self.channel_name)
        # Read the state again once subscribed: a change between the first read and the join is not lost.
        info = await self._job_info(None, check=False) or info
        self.current_state = info["state"]
        await self.accept()
        await self._start_attempt(after=int(self.after) if self.after and self.after.isdigit() else None)
        self.wake = asyncio.Event()
        self.tailer = _Tailer.for_running_loop()
        self.tailer.add(self)
        self.pump = asyncio.create_task(self._follow())
        if self.metrics_version is not None:
            await self.job_metrics({})  # charts the page missed between its render and this socket

    async def disconnect(self, code):
        pump = getattr(self, "pump", None)
        if pump:
            pump.cancel()
            self.tailer.remove(self)
        if getattr(self, "metrics_task", None):
            self.metrics_task.cancel()
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
        await self.send_json(
            {
                "type": "hello",
                "attempt": self.attempt,
                "first_kept_line": meta.first_line,
                "dropped_lines": meta.dropped_lines,
                "state": self.current_state,
            }
        )
        if lines:
            await self._send_lines(lines)
        self.ended = False

    async def _send_lines(self, lines) -> None:
        await self.send_json(
            {"type": "lines", "attempt": self.attempt, "lines": [{"n": ln.number, "text": ln.text} for ln in lines]}
        )
        if self.metrics_version is not None and any(METRIC_TAG in ln.text for ln in lines):
            self._wake_metric_scan()

    def _wake_metric_scan(self) -> None:
        now = asyncio.get_running_loop().time()
        if now - self.scan_woken_at < METRICS_MIN_INTERVAL_S:
            return
        self.scan_woken_at = now
        asyncio.get_running_loop().run_in_executor(None, _wake_metric_scan)

    async def job_metrics(self, event):
        """New metrics were stored: redraw, coalescing a burst into one redraw per interval."""
        if self.metrics_version is None:
            return
        if self.metrics_task is not None and not self.metrics_task.done():
            self.metrics_dirty = True
            return
        self.metrics_task = asyncio.create_task(self._send_metrics())

    async def _send_metrics(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self.metrics_dirty = False
            started = loop.time()
            version, html = await self._metrics_html()
            if version != self.metrics_version:
                self.metrics_version = version
                await self.send_json({"type": "metrics", "version": version, "html": html})
            await asyncio.sleep(max(0.0, METRICS_MIN_INTERVAL_S - (loop.time() - started)))
            if not self.metrics_dirty:
                return

    @database_sync_to_async
    def _metrics_html(self) -> tuple[int, str]:
        from jobs import signals
        from jobs.models import Job

        with translation.override(self.lang):
            return signals.answer(signals.charts_html_wanted, job=Job.objects.get(pk=self.job_id)) or (0, "")

    async def _follow(self) -> None:
        # The shared tailer wakes this socket when its file changed (or at least every END_CHECK_S, to notice
        # the end). Reads run inline: reading a local file's new tail takes well under a millisecond, and
        # handing it to the default thread pool (a few threads shared by every socket) queued it behind others.
        checked_end = 0.0
        loop = asyncio.get_running_loop()
        marked = -WATCH_MARK_S
        try:
            while True:
                if loop.time() - marked >= WATCH_MARK_S:
                    marked = loop.time()  # tells a slow-schedule collector (Kubernetes) someone is watching
                    await asyncio.to_thread(logstore.mark_watched, self.job_id)
                self.wake.clear()  # before reading: a change from here on wakes the wait below
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
                try:
                    await asyncio.wait_for(self.wake.wait(), END_CHECK_S)
                except TimeoutError:
                    pass
        finally:
            self.tailer.remove(self)

    async def job_state(self, event):
        self.current_state = event["state"]
        await self.send_json({"type": "state", "state": event["state"], "reason": event.get("reason")})
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


def _wake_metric_scan() -> None:
    """Ask a worker for a metric scan now; one request a second for the whole platform is plenty."""
    from celery import current_app as app  # sent by name: monitoring's task, which jobs does not import
    from django.core.cache import cache

    try:
        if cache.add("trainyard:metric-scan-woken", 1, timeout=1):
            app.send_task("monitoring.scan_job_metrics")
    except Exception:  # noqa: BLE001 - the beat's own scan comes soon anyway
        pass


def _int(params: dict, name: str, default: int) -> int:
    try:
        return max(0, int(params[name][0]))
    except (KeyError, ValueError, IndexError):
        return default
