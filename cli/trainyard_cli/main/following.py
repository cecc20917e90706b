"""Following: part of `trainyard_cli.main` (see its package docstring)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import datetime

from ..client import ApiClient
from ..errors import (
    EXIT_BY_FINAL_STATE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    TERMINAL_STATES,
    CliError,
)
from .common import (
    ATTEMPT_ENDED,
    DRAIN_S,
    LOG_PAGE,
    MAX_TRANSIENT_ERRORS,
    duration,
    elapsed,
    err,
    print_json,
)


def state_line(job: dict) -> str:
    state = job["state"]
    text = state.replace("_", " ")
    if state == "pending":
        extra = job.get("reason") or "queued"
        if job.get("queue_position"):
            extra += f", position {job['queue_position']} in {job.get('queue')}"
        text += f" ({extra})"
    message = job.get("message") or ""
    if message and message.lower() != state.replace("_", " "):
        text += f": {message}"
    return text


def _final_line(job: dict) -> str:
    state = job["state"]
    text = f"job {job['id']} {state.replace('_', ' ')}"
    ran = elapsed(job.get("started_at"), job.get("finished_at"))
    if ran is not None:
        text += f" after {duration(ran)}"
    if state != "succeeded" and job.get("message"):
        text += f": {job['message']}"
    if job.get("failure_class") and state == "failed":
        text += f" [{job['failure_class']} failure]"
    return text


class LogFollower:
    """Prints an attempt's new log lines to stdout as they arrive and moves on to the next attempt after a
    retry (unless an attempt was asked for). Keeps its own line cursor: the API's `next_start` is empty on an
    empty page."""

    def __init__(
        self, api: ApiClient, job_id: str, *, attempt: int | None = None, pinned: bool = False, start: int = 1
    ):
        self.api = api
        self.job_id = job_id
        self.pinned = pinned
        self.attempt = attempt
        self.cursor = start
        self.complete = False

    def _page(self) -> tuple[int, bool]:
        data = self.api.get(
            f"/jobs/{self.job_id}/logs/", params={"attempt": self.attempt, "start": self.cursor, "limit": LOG_PAGE}
        )
        lines = data.get("lines", [])
        if lines and lines[0]["n"] > self.cursor:
            err(f"({lines[0]['n'] - self.cursor} log lines of attempt {self.attempt} were dropped by the log budget)")
        if lines:
            sys.stdout.write("".join(f"{line['text']}\n" for line in lines))
            sys.stdout.flush()
            self.cursor = lines[-1]["n"] + 1
        self.complete = bool(data.get("complete"))
        return len(lines), self.complete

    def read_available(self) -> None:
        if self.attempt is None:
            return
        while True:
            count, _ = self._page()
            if count < LOG_PAGE:
                return

    def poll(self, attempts: list[dict]) -> None:
        numbers = [a["number"] for a in attempts]
        if not numbers:
            return
        latest = max(numbers)
        if self.attempt is None:
            self.attempt = min(numbers)
        while not self.pinned and self.attempt < latest:
            self.read_available()
            previous = next((a for a in attempts if a["number"] == self.attempt), None)
            self.attempt += 1
            self.cursor = 1
            why = ""
            if previous is not None and previous.get("failure_class"):
                why = (
                    f" (attempt {previous['number']}: {previous['failure_class']} failure, "
                    f"{(previous.get('reaction') or '').replace('_', ' ')})"
                )
            err(f"--- attempt {self.attempt}{why} ---")
        self.read_available()

    def drain(self, *, interval: float, timeout_s: float = DRAIN_S) -> None:
        """After the end: read until the log is closed, which may lag the job's last state by a moment."""
        if self.attempt is None:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            self.read_available()
            if self.complete:
                return
            if time.monotonic() >= deadline:
                err(
                    f"the log of attempt {self.attempt} is not closed yet; "
                    f"`trainyard logs {self.job_id} --attempt {self.attempt}` shows the rest later"
                )
                return
            time.sleep(min(interval, 0.5))

    def attempt_ended(self, attempts: list[dict]) -> bool:
        return any(a["number"] == self.attempt and a.get("state") in ATTEMPT_ENDED for a in attempts)


def wait_for_job(
    api: ApiClient, job_id: str, *, interval: float, follower: LogFollower | None = None, report: bool = True
) -> dict:
    """Poll until the job is terminal (or a pinned attempt ended), riding out brief server outages."""
    last = ""
    failures = 0
    while True:
        try:
            job = api.get(f"/jobs/{job_id}/", not_found=f"job {job_id} not found")
            attempts = api.get(f"/jobs/{job_id}/attempts/") if follower else []
            if follower:
                follower.poll(attempts)
            failures = 0
        except CliError as exc:
            if exc.exit_code != EXIT_UNAVAILABLE or failures >= MAX_TRANSIENT_ERRORS:
                raise
            failures += 1
            pause = min(interval * 2**failures, 30.0)
            err(f"{exc.message}; trying again in {pause:.0f} s ({failures}/{MAX_TRANSIENT_ERRORS})")
            time.sleep(pause)
            continue
        line = state_line(job)
        if report and line != last and job["state"] not in TERMINAL_STATES:
            err(f"{datetime.now().strftime('%H:%M:%S')} {job_id[:8]} {line}")
            last = line
        pinned_done = follower is not None and follower.pinned and follower.attempt_ended(attempts)
        if job["state"] in TERMINAL_STATES or pinned_done:
            if follower:
                follower.drain(interval=interval)
            return job
        time.sleep(interval)


def interruptible(job_id: str, fn: Callable[[], int]) -> int:
    try:
        return fn()
    except KeyboardInterrupt:
        raise CliError(
            f"stopped waiting; job {job_id} keeps going (`trainyard cancel {job_id}` stops it)", EXIT_INTERRUPTED
        )


def finish(job: dict, *, as_json: bool) -> int:
    if as_json:
        print_json(job)
    err(_final_line(job))
    if job.get("suggestion") and job["state"] != "succeeded" and job["suggestion"] not in job.get("message", ""):
        err(f"suggestion: {job['suggestion']}")
    return EXIT_BY_FINAL_STATE.get(job["state"], EXIT_OK)
