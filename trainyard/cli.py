"""`trainyard`: the command line for CI pipelines and terminals, a client of the REST API (`/api/v1/`).

    trainyard submit job.yaml [--wait] [--follow] [--idempotency-key K] [--resume-from JOB]
    trainyard submit --template NAME [overrides.yaml] [--team T]
    trainyard status JOB | list | logs JOB [-f] | cancel JOB | checkpoints JOB | queues [NAME] | quota [TEAM]
    trainyard templates | datasets | tokens | login

JOB is a job id, or its first 8 (or more) characters as the portal shows them.

Human output goes to stdout, progress and errors to stderr (one line, never a traceback); `--json` prints
machine-readable output. Exit codes are in `cli_errors` and docs/cli.md. It imports nothing from Django.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from .cli_client import ApiClient, ApiError, cli_version
from .cli_code import upload as upload_code
from .cli_config import Config, check_token, config_path, load_config, normalize_url, require_token
from .cli_config import save_config as write_config
from .cli_errors import (
    EXIT_BY_FINAL_STATE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    TERMINAL_STATES,
    CliError,
)
from .cli_jobfile import JobFile, load_jobfile

UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")
SHORT_ID_RE = re.compile(r"^[0-9a-fA-F][0-9a-fA-F-]{7,34}\Z")
ATTEMPT_ENDED = frozenset({"succeeded", "failed", "cancelled", "timed_out", "lost", "preempted"})
MAX_TRANSIENT_ERRORS = 8
LOG_PAGE = 1000
DRAIN_S = 5.0


def _err(text: str) -> None:
    print(f"trainyard: {text}", file=sys.stderr, flush=True)


def _out(text: str = "") -> None:
    print(text, flush=True)


def _print_json(data: Any) -> None:
    _out(json.dumps(data, indent=2, sort_keys=False))


def _job_id(api: ApiClient, raw: str) -> str:
    """A full job id, or the first 8+ characters the portal shows, resolved among the jobs the token can see."""
    text = raw.strip().lower()
    if UUID_RE.match(text):
        return text
    if not SHORT_ID_RE.match(text):
        raise CliError(
            f"{raw!r} is not a job id (a UUID like 3f2c6e1a-0b7d-4c52-9a51-1d0e5b7c9f20, or its first 8 characters "
            "as the portal shows them; see `trainyard list`)",
            EXIT_USAGE,
        )
    found = api.get("/jobs/", params={"id_prefix": text, "page_size": 5}).get("results", [])
    if not found:
        raise CliError(f"no job id starts with {text} (or it belongs to a team you are not in)", EXIT_USAGE)
    if len(found) > 1:
        names = ", ".join(f"{j['id']} ({j['name']})" for j in found)
        raise CliError(f"{text} is the start of several job ids: {names}; give more characters", EXIT_USAGE)
    return found[0]["id"]


def _when(value: str | None) -> str:
    if not value:
        return "-"
    try:
        return datetime.fromisoformat(value).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return value


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _elapsed(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    try:
        return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    except ValueError:
        return None


def _gpus(milli: int | None) -> str:
    return f"{(milli or 0) / 1000:g}"


def _gib(mib: int | None) -> str:
    return f"{(mib or 0) / 1024:g} GiB"


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if v is None or v == "" else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


# ---------------------------------------------------------------------------------------------- following


def _state_line(job: dict) -> str:
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
    ran = _elapsed(job.get("started_at"), job.get("finished_at"))
    if ran is not None:
        text += f" after {_duration(ran)}"
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
            _err(f"({lines[0]['n'] - self.cursor} log lines of attempt {self.attempt} were dropped by the log budget)")
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
            _err(f"--- attempt {self.attempt}{why} ---")
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
                _err(
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
            _err(f"{exc.message}; trying again in {pause:.0f} s ({failures}/{MAX_TRANSIENT_ERRORS})")
            time.sleep(pause)
            continue
        line = _state_line(job)
        if report and line != last and job["state"] not in TERMINAL_STATES:
            _err(f"{datetime.now().strftime('%H:%M:%S')} {job_id[:8]} {line}")
            last = line
        pinned_done = follower is not None and follower.pinned and follower.attempt_ended(attempts)
        if job["state"] in TERMINAL_STATES or pinned_done:
            if follower:
                follower.drain(interval=interval)
            return job
        time.sleep(interval)


def _interruptible(job_id: str, fn: Callable[[], int]) -> int:
    try:
        return fn()
    except KeyboardInterrupt:
        raise CliError(
            f"stopped waiting; job {job_id} keeps going (`trainyard cancel {job_id}` stops it)", EXIT_INTERRUPTED
        )


def _finish(job: dict, *, as_json: bool) -> int:
    if as_json:
        _print_json(job)
    _err(_final_line(job))
    if job.get("suggestion") and job["state"] != "succeeded" and job["suggestion"] not in job.get("message", ""):
        _err(f"suggestion: {job['suggestion']}")
    return EXIT_BY_FINAL_STATE.get(job["state"], EXIT_OK)


# ----------------------------------------------------------------------------------------------- commands


def _template(api: ApiClient, name: str, team: str | None) -> dict:
    params = {"name": name, **({"team": team} if team else {})}
    found = api.get("/templates/", params=params)
    if not found:
        known = api.get("/templates/", params={"team": team} if team else None)
        have = ", ".join(sorted(f"{t['team']}/{t['name']}" for t in known)) or "none"
        where = f" in team {team}" if team else " in your teams"
        raise CliError(f"no template named {name!r}{where} (templates: {have})", EXIT_USAGE)
    if len(found) > 1:
        teams = ", ".join(t["team"] for t in found)
        raise CliError(f"several teams have a template named {name!r} ({teams}): add --team", EXIT_USAGE)
    return found[0]


def recommendation_line(rec: dict | None) -> str:
    """The submission's right-sizing advice in one line (docs/rightsizing.md), or '' without evidence."""
    if not rec:
        return ""
    if rec.get("fits_request"):
        line = f"recommendation: the request fits earlier runs ({rec['evidence']})"
    else:
        spec = rec.get("spec") or "an explicit request"
        saves = rec.get("saves") or {}
        line = (
            f"recommendation: spec {spec} with {rec['gpu_count']} GPU(s) would do ({rec['evidence']}); "
            f"it frees {saves.get('gpu_milli', 0)} GPU milli and {saves.get('gpu_memory_mib', 0)} MiB of GPU memory"
        )
    if rec.get("batch_size"):
        line += f"; batch size {rec['batch_size']} would fill it"
    return line + " (your request is unchanged)"


def cmd_submit(args: argparse.Namespace, api: ApiClient) -> int:
    if args.file is None and not args.template:
        raise CliError("give a job file, or --template NAME (see `trainyard submit --help`)", EXIT_USAGE)
    jobfile = load_jobfile(args.file) if args.file is not None else JobFile("(template)", {}, {})
    if args.resume_from:
        jobfile.data["resume_from"] = _job_id(api, args.resume_from)
    _attach_code(api, jobfile, args)
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    try:
        if args.template:
            template = _template(api, args.template, args.team)
            status, job = api.post(f"/templates/{template['id']}/submit/", json=jobfile.data, headers=headers)
        else:
            status, job = api.post("/jobs/", json=jobfile.data, headers=headers)
    except ApiError as exc:
        raise _located(exc, jobfile)
    if status == 200:
        _err(f"job {job['id']} was already submitted with this Idempotency-Key (it is {job['state']})")
    else:
        _err(f"submitted job {job['id']} ({job['name']}) to {job['team']}/{job['queue']}: {_state_line(job)}")
        advice = recommendation_line(job.get("recommendation"))
        if advice:
            _err(advice)
    if not (args.wait or args.follow):
        if args.json:
            _print_json(job)
        else:
            _out(job["id"])
        return EXIT_OK
    if not args.json and not args.follow:
        _out(job["id"])
    follower = LogFollower(api, job["id"]) if args.follow else None

    def wait() -> int:
        final = wait_for_job(api, job["id"], interval=args.interval, follower=follower)
        return _finish(final, as_json=args.json)

    return _interruptible(job["id"], wait)


def _attach_code(api: ApiClient, jobfile: JobFile, args: argparse.Namespace) -> None:
    """A job file's `code:` naming a folder (relative to the file), or --code DIR: pack and upload it, and submit
    its digest. A `code: sha256:…` is passed on as it is."""
    folder = getattr(args, "code", None)
    value = jobfile.data.get("code")
    if folder is None and isinstance(value, str) and value and not value.startswith("sha256:"):
        base = Path(args.file).parent if args.file not in (None, "-") else Path.cwd()
        folder = str(base / value)
    if folder is None:
        return
    team = jobfile.data.get("team")
    if not isinstance(team, str) or not team:
        raise CliError("the job file names no team, and a code snapshot belongs to one", EXIT_USAGE)
    jobfile.data["code"] = upload_code(api, Path(folder), team=team)


def cmd_run(args: argparse.Namespace, api: ApiClient) -> int:
    """Run a command on the platform in a copy of the current folder: pack and upload it, submit, follow."""
    if args.cmd and args.cmd[0] == "--":
        args.cmd = args.cmd[1:]
    if not args.cmd:
        raise CliError("give the command after --, e.g. `trainyard run --team T -- python train.py`", EXIT_USAGE)
    data: dict[str, Any] = {"team": args.team, "queue": args.queue, "spec": args.spec, "image": args.image,
                            "command": list(args.cmd)}  # fmt: skip
    if args.gpus:
        data["gpus"] = args.gpus
    data["code"] = upload_code(api, Path(args.dir), team=args.team)
    jobfile = JobFile("(trainyard run)", data, {})
    try:
        status, job = api.post("/jobs/", json=jobfile.data)
    except ApiError as exc:
        raise _located(exc, jobfile)
    _err(f"submitted job {job['id']} ({job['name']}) to {job['team']}/{job['queue']}: {_state_line(job)}")
    if args.detach:
        _out(job["id"])
        return EXIT_OK
    follower = LogFollower(api, job["id"])

    def wait() -> int:
        final = wait_for_job(api, job["id"], interval=args.interval, follower=follower)
        return _finish(final, as_json=False)

    return _interruptible(job["id"], wait)


def _located(exc: ApiError, jobfile: JobFile) -> CliError:
    """The server's field errors as `job.yaml:LINE: field: message (code)` lines."""
    head = f"{jobfile.name}: the server rejected the job"
    if not exc.fields:
        return CliError(f"{head}: {exc.detail} ({exc.code})", exc.exit_code) if exc.status in (400, 404, 409) else exc
    located = sorted(((jobfile.line_of(f.path), f) for f in exc.fields), key=lambda pair: pair[0] or 0)
    details = [f"{jobfile.name}:{line}: {f.line()}" if line else f"{jobfile.name}: {f.line()}" for line, f in located]
    return CliError(f"{head} ({len(details)} error{'s' if len(details) != 1 else ''}):", exc.exit_code, details)


def _estimate(est: dict | None) -> str:
    """An estimated start from the API (low_s/mid_s/high_s/known) in words; never 0 for a waiting job."""
    if not est:
        return "-"
    low, high = est.get("low_s"), est.get("high_s")
    if not est.get("known") or low is None or high is None:
        return f"unknown (at the latest in {_duration(max(60, high))})" if high is not None else "unknown"
    low, high = _duration(max(60, low)), _duration(max(60, high))
    return f"in about {high}" if low == high else f"between {low} and {high}"


def _queue_wait(api: ApiClient, job: dict) -> dict | None:
    if job["state"] != "pending":
        return None
    if "estimated_start" in job:  # the job's own estimate (servers since the queue API lists only a line's head)
        return job["estimated_start"]
    queue = api.get(f"/queues/{job['queue']}/")
    for row in queue.get("jobs", []):
        if row.get("id") == job["id"]:
            return row.get("estimated_start")
    return None


def cmd_status(args: argparse.Namespace, api: ApiClient) -> int:
    job_id = _job_id(api, args.job)
    job = api.get(f"/jobs/{job_id}/", not_found=f"job {job_id} not found (or it belongs to a team you are not in)")
    attempts = api.get(f"/jobs/{job_id}/attempts/")
    wait = _queue_wait(api, job)
    if args.json:
        _print_json({**job, "attempts": attempts, "estimated_start": wait})
        return EXIT_OK
    state = _state_line(job)
    if wait is not None:
        state += f" — estimated start {_estimate(wait)}"
    spec = job.get("spec") or "explicit request"
    resources = f"{job['gpu_count']} x {job['gpu_milli']} milli GPU, {_gib(job['gpu_memory_mib'])} GPU memory"
    rows = [
        ("Job", f"{job['id']}  {job['name']}"),
        ("State", state),
        ("Owner", f"{job['owner']} (team {job['team']})"),
        ("Queue", f"{job['queue']}, spec {spec}: {resources}, {job['replicas']} replica(s)"),
        ("Image", job["image_reference"] + (f" @ {job['image_digest']}" if job.get("image_digest") else "")),
        ("Command", shlex.join([*(job.get("command") or []), *(job.get("args") or [])])),
        ("Submitted", _when(job.get("submitted_at"))),
        ("Started", _when(job.get("started_at"))),
        ("Finished", _when(job.get("finished_at"))),
        ("Retries", f"{job['retries_used']} of {job['max_retries']}"),
    ]
    if job.get("exit_code") is not None:
        rows.append(("Exit code", str(job["exit_code"])))
    if job.get("failure_class"):
        rows.append(("Failure", f"{job['failure_class']} failure"))
    if job.get("suggestion"):
        rows.append(("Suggestion", job["suggestion"]))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        _out(f"{key.ljust(width)}  {value}")
    if attempts:
        _out("")
        _out(
            _table(
                ["ATTEMPT", "STATE", "NODE", "STARTED", "RAN", "EXIT", "FAILURE CLASS", "REACTION", "REASON"],
                [
                    (
                        a["number"],
                        a["state"],
                        a.get("node"),
                        _when(a.get("started_at")),
                        _duration(_elapsed(a.get("started_at"), a.get("ended_at"))),
                        a["exit_code"]
                        if a.get("exit_code") is not None
                        else (f"signal {a['signal']}" if a.get("signal") else None),
                        a.get("failure_class"),
                        a.get("reaction"),
                        a.get("reason"),
                    )
                    for a in attempts
                ],
            )
        )
    return EXIT_OK


def cmd_list(args: argparse.Namespace, api: ApiClient) -> int:
    params: list[tuple[str, Any]] = [("page_size", min(args.limit, 500))]
    for raw in args.state or []:
        params += [("state", s.strip()) for s in raw.split(",") if s.strip()]
    if args.team:
        params.append(("team", args.team))
    if args.queue:
        params.append(("queue", args.queue))
    jobs: list[dict] = []
    page = api.get("/jobs/", params=params)
    while True:
        jobs += page.get("results", [])
        if len(jobs) >= args.limit or not page.get("next"):
            break
        page = api.get(page["next"])
    jobs = jobs[: args.limit]
    if args.json:
        _print_json(jobs)
        return EXIT_OK
    if not jobs:
        _err("no jobs match")
        return EXIT_OK
    _out(
        _table(
            ["ID", "NAME", "STATE", "REASON", "TEAM", "QUEUE", "SPEC", "OWNER", "SUBMITTED"],
            [
                (
                    j["id"],
                    j["name"],
                    j["state"],
                    j.get("reason") if j["state"] == "pending" else None,
                    j["team"],
                    j["queue"],
                    j.get("spec"),
                    j["owner"],
                    _when(j.get("submitted_at")),
                )
                for j in jobs
            ],
        )
    )
    return EXIT_OK


def cmd_logs(args: argparse.Namespace, api: ApiClient) -> int:
    job_id = _job_id(api, args.job)
    attempts = api.get(
        f"/jobs/{job_id}/attempts/", not_found=f"job {job_id} not found (or it belongs to a team you are not in)"
    )
    numbers = [a["number"] for a in attempts]
    if args.attempt is not None and args.attempt not in numbers:
        have = ", ".join(map(str, numbers)) if numbers else "none yet"
        raise CliError(f"job {job_id} has no attempt {args.attempt} (attempts: {have})", EXIT_USAGE)
    if not numbers and not args.follow:
        _err(f"job {job_id} has not started yet: no log lines")
        return EXIT_OK
    number = args.attempt or (max(numbers) if numbers else None)
    cursor = 1
    if number is not None and args.tail is not None:
        data = api.get(f"/jobs/{job_id}/logs/", params={"attempt": number, "tail": args.tail})
        lines = data.get("lines", [])
        sys.stdout.write("".join(f"{line['text']}\n" for line in lines))
        sys.stdout.flush()
        cursor = lines[-1]["n"] + 1 if lines else 1
    follower = LogFollower(api, job_id, attempt=number, pinned=args.attempt is not None, start=cursor)
    if not args.follow:
        if args.tail is None:
            follower.read_available()
        return EXIT_OK

    def follow() -> int:
        final = wait_for_job(api, job_id, interval=args.interval, follower=follower, report=False)
        if follower.pinned and final["state"] not in TERMINAL_STATES:
            return EXIT_OK
        return EXIT_BY_FINAL_STATE.get(final["state"], EXIT_OK)

    return _interruptible(job_id, follow)


def cmd_cancel(args: argparse.Namespace, api: ApiClient) -> int:
    job_id = _job_id(api, args.job)
    try:
        _, job = api.post(f"/jobs/{job_id}/cancel/", not_found=f"job {job_id} not found")
    except ApiError as exc:
        if exc.status == 409:
            raise CliError(f"cannot cancel job {job_id}: {exc.detail} ({exc.code})", EXIT_USAGE)
        raise
    if job["state"] == "cancelled":
        _err(f"job {job_id} cancelled")
    else:
        _err(f"job {job_id} {job['state']}: the backend is stopping it")
    if not args.wait:
        return EXIT_OK
    return _interruptible(job_id, lambda: _finish(wait_for_job(api, job_id, interval=args.interval), as_json=False))


def _bytes(n: int | None) -> str:
    value = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value} B"  # pragma: no cover


def cmd_checkpoints(args: argparse.Namespace, api: ApiClient) -> int:
    job_id = _job_id(api, args.job)
    rows = api.get(f"/jobs/{job_id}/checkpoints/", not_found=f"job {job_id} not found (or not your team's)")
    if args.download is None:
        if args.json:
            _print_json(rows)
        elif not rows:
            _err(f"job {job_id} has no checkpoint saved yet")
        else:
            table = [
                (r["id"], r["name"], r["step"], _bytes(r["size_bytes"]), r["attempt"], _when(r["saved_at"]),
                 len(r["files"]))
                for r in rows
            ]  # fmt: skip
            _out(_table(["ID", "NAME", "STEP", "SIZE", "ATTEMPT", "SAVED", "FILES"], table))
        return EXIT_OK
    chosen = next((r for r in rows if r["id"] == args.download), None)
    if chosen is None:
        raise CliError(
            f"job {job_id} has no checkpoint {args.download} (see `trainyard checkpoints {job_id}`)", EXIT_USAGE
        )
    files = chosen["files"] if args.path is None else [f for f in chosen["files"] if f["path"] == args.path]
    if not files:
        raise CliError(f"checkpoint {chosen['name']} has no file {args.path!r}", EXIT_USAGE)
    if len(files) > 1 and args.output is not None:
        raise CliError("--output names one file: choose it with --path, or give --dir for all of them", EXIT_USAGE)
    for f in files:
        target = args.output or os.path.join(args.dir, f["path"])
        if args.output is None and not os.path.abspath(target).startswith(os.path.abspath(args.dir) + os.sep):
            raise CliError(f"refusing to write {f['path']!r} outside {args.dir}", EXIT_USAGE)
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        with open(target, "wb") as dest:
            size = api.download(
                f"/jobs/{job_id}/checkpoints/{chosen['id']}/download/", params={"path": f["path"]}, dest=dest
            )
        _err(f"saved {f['path']} ({_bytes(size)}) to {target}")
    return EXIT_OK


def cmd_queues(args: argparse.Namespace, api: ApiClient) -> int:
    if args.name:
        queue = api.get(f"/queues/{args.name}/", not_found=f"no queue named {args.name!r} (see `trainyard queues`)")
        if args.json:
            _print_json(queue)
            return EXIT_OK
        _out(f"{queue['name']} ({queue['state']}): {queue['description']}")
        _out(
            f"capability {_gpus(queue['capability']['gpu_milli'])} GPUs, in use "
            f"{_gpus(queue['usage']['gpu_milli'])}; specs {', '.join(queue['specs'])}"
        )
        if not queue["jobs"]:
            _out("nobody is waiting")
            return EXIT_OK
        _out(
            _table(
                ["POSITION", "JOB", "NAME", "TEAM", "SPEC", "PRIORITY", "REASON", "EST. WAIT"],
                [
                    (
                        j["position"],
                        j.get("id", "(another team's job)"),
                        j.get("name"),
                        j.get("team"),
                        j.get("spec"),
                        j["priority"],
                        j.get("reason"),
                        _estimate(j.get("estimated_start")),
                    )
                    for j in queue["jobs"]
                ],
            )
        )
        return EXIT_OK
    queues = api.get("/queues/")
    if args.json:
        _print_json(queues)
        return EXIT_OK
    _out(
        _table(
            ["QUEUE", "STATE", "PRIORITY", "SPECS", "WAITING", "RUNNING", "GPUS USED/CAP", "MAX TIMEOUT"],
            [
                (
                    q["name"],
                    q["state"],
                    q["priority"],
                    ",".join(q["specs"]),
                    q["waiting"],
                    q["usage"].get("jobs"),
                    f"{_gpus(q['usage']['gpu_milli'])}/{_gpus(q['capability']['gpu_milli'])}",
                    _duration(q.get("max_timeout_s")),
                )
                for q in queues
            ],
        )
    )
    return EXIT_OK


def _findings(build: dict | None) -> str:
    if not build or not build.get("scanned_at"):
        return "not scanned"
    counts = build.get("findings") or {}
    found = [f"{counts[s]} {s}" for s in ("critical", "high", "medium", "low", "unknown") if counts.get(s)]
    return ", ".join(found) or "none"


def _short(digest: str) -> str:
    return digest[7:19] if digest.startswith("sha256:") else (digest or "-")


def _image_row(image: dict, *, team: str, base: str) -> tuple:
    build = image.get("last_build")
    nodes = len(image.get("compatible_nodes") or [])
    total = nodes + len(image.get("incompatible_nodes") or [])
    stale = " (stale)" if image.get("stale") else ""
    return (
        image["name"] + stale,
        team,
        base,
        _short(image.get("digest", "")),
        _bytes(build.get("size_bytes")) if build and build.get("size_bytes") else "-",
        _when(image.get("last_rebuilt")),
        _findings(build),
        f"{nodes}/{total}",
    )


def cmd_images(args: argparse.Namespace, api: ApiClient) -> int:
    bases = api.get("/images/")
    projects = api.get("/project-images/")
    if args.team:
        projects = [p for p in projects if p["team"] == args.team]
    if args.json:
        _print_json({"base_images": bases, "project_images": projects})
        return EXIT_OK
    rows = [_image_row(b, team="(base)", base=b.get("framework") or "-") for b in ([] if args.team else bases)]
    rows += [_image_row(p, team=p["team"], base=p["base"]) for p in projects]
    _out(_table(["IMAGE", "TEAM", "BASE", "DIGEST", "SIZE", "BUILT", "FINDINGS", "NODES"], rows))
    return EXIT_OK


TERMINAL_BUILD = {"succeeded", "failed"}


def _wait_build(api: ApiClient, build: dict, *, interval: float) -> dict:
    said = ""
    while build["status"] not in TERMINAL_BUILD:
        if build["status"] == "waiting_registry" and said != "waiting_registry":
            _err("the registry is unreachable; the build waits and retries (see its log)")
        said = build["status"]
        time.sleep(interval)
        build = api.get(f"/image-builds/{build['id']}/")
    return api.get(f"/image-builds/{build['id']}/")


def cmd_image(args: argparse.Namespace, api: ApiClient) -> int:
    if args.action == "status":
        build = api.get(f"/image-builds/{args.name}/", not_found=f"no image build {args.name}")
    elif args.team:
        body: dict[str, Any] = {"team": args.team, "name": args.name, "base": args.base or ""}
        if args.file:
            body["containerfile"] = _read_text(args.file)
        if args.requirements:
            body["requirements"] = _read_text(args.requirements)
        if not args.base:
            raise CliError("a project image needs --base (a catalog base image; see `trainyard images`)", EXIT_USAGE)
        _, image = api.post("/project-images/", json=body)
        build = image["last_build"]
        _err(f"building {args.team}/{args.name} on {args.base}: build {build['id']} is {build['status']}")
    else:
        _, build = api.post(f"/images/{args.name}/build/", not_found=f"no base image {args.name!r}")
        _err(f"rebuilding base image {args.name}: build {build['id']} is {build['status']}")
    if args.wait and build["status"] not in TERMINAL_BUILD:
        build = _wait_build(api, build, interval=args.interval)
    if args.json:
        _print_json(build)
    else:
        _out(f"build {build['id']} of {build['image']}: {build['status']}")
        if build.get("digest"):
            _out(f"  {build['reference'].rsplit(':', 1)[0]}@{build['digest']}")
        if build.get("size_bytes"):
            _out(f"  size {_bytes(build['size_bytes'])}, findings: {_findings(build)}")
        for warning in build.get("warnings") or []:
            _out(f"  warning ({warning['code']}): {warning['detail']}")
        if build["status"] == "failed" or args.log:
            _out((build.get("log") or "").rstrip()[-4000:])
    return EXIT_FAILED if build["status"] == "failed" else EXIT_OK


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", EXIT_USAGE) from None


def _print_team(team: dict) -> None:
    quota, usage = team["quota"], team["usage"]
    _out(f"team {team['slug']} ({team['name']})")
    rows = [
        ("GPUs", _gpus(usage["gpu_milli"]), _gpus(quota["gpu_milli"]), _gpus(quota["gpu_milli"] - usage["gpu_milli"])),
        (
            "GPU memory",
            _gib(usage["gpu_memory_mib"]),
            _gib(quota["gpu_memory_mib"]),
            _gib(quota["gpu_memory_mib"] - usage["gpu_memory_mib"]),
        ),
        (
            "CPU cores",
            _gpus(usage["cpu_milli"]),
            _gpus(quota["cpu_milli"]),
            _gpus(quota["cpu_milli"] - usage["cpu_milli"]),
        ),
        (
            "Memory",
            _gib(usage["memory_mib"]),
            _gib(quota["memory_mib"]),
            _gib(quota["memory_mib"] - usage["memory_mib"]),
        ),
        (
            "Running jobs",
            usage.get("jobs", 0),
            team["max_running_jobs"],
            team["max_running_jobs"] - usage.get("jobs", 0),
        ),
    ]
    _out(_table(["RESOURCE", "IN USE", "QUOTA", "FREE"], rows))
    by_spec = team.get("usage_by_spec") or []
    if by_spec:
        _out(
            "in use by spec: "
            + "; ".join(f"{row['spec']}: {row['jobs']} job(s), {_gpus(row['gpu_milli'])} GPUs" for row in by_spec)
        )


def cmd_quota(args: argparse.Namespace, api: ApiClient) -> int:
    if args.team:
        team = api.get(f"/teams/{args.team}/", not_found=f"no team {args.team!r} that you are a member of")
        teams = [team]
    else:
        teams = api.get("/teams/")
    if args.json:
        _print_json(team if args.team else teams)
        return EXIT_OK
    if not teams:
        _err("you are not a member of any team")
        return EXIT_OK
    for i, team in enumerate(teams):
        if i:
            _out("")
        _print_team(team)
    return EXIT_OK


def cmd_templates(args: argparse.Namespace, api: ApiClient) -> int:
    templates = api.get("/templates/", params={"team": args.team} if args.team else None)
    if args.json:
        _print_json(templates)
        return EXIT_OK
    if not templates:
        _err("no templates (save one from the portal's submit form, or POST /api/v1/templates/)")
        return EXIT_OK

    def command(body: dict) -> str:
        cmd = body.get("command") or []
        return shlex.join(map(str, cmd)) if isinstance(cmd, list) else str(cmd)

    _out(
        _table(
            ["TEAM", "NAME", "QUEUE", "SPEC", "IMAGE", "COMMAND", "DESCRIPTION"],
            [
                (
                    t["team"],
                    t["name"],
                    t["job"].get("queue"),
                    t["job"].get("spec"),
                    t["job"].get("image"),
                    command(t["job"]),
                    t["description"],
                )
                for t in templates
            ],
        )
    )
    return EXIT_OK


def cmd_datasets(args: argparse.Namespace, api: ApiClient) -> int:
    params = {k: v for k, v in (("team", args.team), ("name", args.name)) if v}
    datasets = api.get("/datasets/", params=params or None)
    if args.json:
        _print_json(datasets)
        return EXIT_OK
    if not datasets:
        _err("no datasets your teams may read (a maintainer registers one: POST /api/v1/datasets/)")
        return EXIT_OK
    rows = [
        (d["team"], d["name"], d["version"], d["kind"], d["s3_prefix"] or d["claim"],
         _bytes(d["size_bytes"]) if d["kind"] == "s3" else "-", d["file_count"] if d["kind"] == "s3" else "-",
         ",".join(d["shared_with"]))
        for d in datasets
    ]  # fmt: skip
    _out(_table(["TEAM", "NAME", "VERSION", "KIND", "SOURCE", "SIZE", "FILES", "SHARED WITH"], rows))
    return EXIT_OK


def cmd_tokens(args: argparse.Namespace, api: ApiClient) -> int:
    if args.action == "create":
        if not args.name:
            raise CliError("give the new token a name: trainyard tokens create NAME", EXIT_USAGE)
        body: dict[str, Any] = {"name": args.name}
        if args.scope:
            body["scopes"] = sorted({s.strip() for raw in args.scope for s in raw.split(",") if s.strip()})
        if args.expires_days:
            body["expires_in_days"] = args.expires_days
        _, token = api.post("/tokens/", json=body)
        _err(
            f"created token {token['name']} (id {token['prefix']}, scopes {', '.join(token['scopes'])}); "
            "it is printed once, below"
        )
        _out(token["token"])
        return EXIT_OK
    if args.action == "revoke":
        if not args.name:
            raise CliError("give the id of the token to revoke (the 8 characters `trainyard tokens` shows)", EXIT_USAGE)
        api.request("DELETE", f"/tokens/{args.name.strip()}/", not_found=f"no token of yours has the id {args.name!r}")
        _err(f"revoked token {args.name}")
        return EXIT_OK
    rows = api.get("/tokens/")
    rows = rows.get("results", rows) if isinstance(rows, dict) else rows
    if args.json:
        _print_json(rows)
        return EXIT_OK

    def status(t: dict) -> str:
        if t.get("revoked_at"):
            return "revoked"
        if t.get("expires_at") and datetime.fromisoformat(t["expires_at"]) <= datetime.now().astimezone():
            return "expired"
        return "active"

    _out(
        _table(
            ["ID", "NAME", "SCOPES", "CREATED", "EXPIRES", "LAST USED", "STATUS"],
            [
                (
                    t["prefix"],
                    t["name"],
                    ",".join(t["scopes"]),
                    _when(t["created_at"]),
                    _when(t.get("expires_at")),
                    _when(t.get("last_used_at")),
                    status(t),
                )
                for t in rows
            ],
        )
    )
    return EXIT_OK


def cmd_login(args: argparse.Namespace, env: dict[str, str]) -> int:
    url = normalize_url(args.url, origin="--url")
    raw = sys.stdin.readline() if args.token == "-" else args.token
    token = check_token(raw, origin="--token")
    path = config_path(env)
    if not args.no_verify:
        with ApiClient(url, token) as api:
            teams = api.get("/teams/")
        names = ", ".join(t["slug"] for t in teams) or "none"
        _err(f"the token works on {url} (teams: {names})")
    write_config(path, url=url, token=token)
    _err(f"saved the server address and token to {path} (readable by you only)")
    if env.get("TRAINYARD_TOKEN") or env.get("TRAINYARD_URL"):
        _err("note: TRAINYARD_URL / TRAINYARD_TOKEN are set in the environment and take precedence over the file")
    return EXIT_OK


# ------------------------------------------------------------------------------------------------- parser


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        # argparse exits 2 on bad usage, which here would read as "job cancelled".
        raise CliError(f"{message} (see `{self.prog} --help`)", EXIT_USAGE)


def _positive_int(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {raw!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {raw!r}")
    if not 0.05 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 0.05 and 3600 seconds, got {raw}")
    return value


EPILOG = """exit codes: 0 ok / job succeeded, 1 job failed, 2 job cancelled, 3 job timed out,
4 usage or input error (bad arguments, job file, rejected request, not found),
5 no/invalid token or permission denied, 6 server unreachable, erroring or rate limiting, 130 interrupted.
Server and token: TRAINYARD_URL / TRAINYARD_TOKEN, else the file `trainyard login` writes."""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="trainyard",
        description="Submit and follow Trainyard training jobs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"trainyard {cli_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def interval(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--interval",
            type=_seconds,
            default=2.0,
            metavar="S",
            help="seconds between polls of the server (default 2)",
        )

    p = sub.add_parser("submit", help="submit a job from a YAML file (fields as in POST /api/v1/jobs/) or a template")
    p.add_argument(
        "file", nargs="?", help="the job file, or - for standard input; with --template, fields that override it"
    )
    p.add_argument("--template", metavar="NAME", help="submit from the team's saved template NAME")
    p.add_argument("--team", metavar="T", help="the template's team, when several of your teams have one so named")
    p.add_argument("--wait", action="store_true", help="wait until the job ends; the exit code tells how")
    p.add_argument("--follow", "-f", action="store_true", help="print the job's log lines while waiting")
    p.add_argument("--idempotency-key", metavar="K", help="submitting again with the same key returns the same job")
    p.add_argument("--json", action="store_true", help="print the job as JSON instead of its id")
    p.add_argument("--resume-from", metavar="JOB", help="start from the latest checkpoint of this job (same team)")
    p.add_argument("--code", metavar="DIR", help="run in a copy of DIR (packed and uploaded; see docs/cli.md)")
    interval(p)
    p.set_defaults(handler=cmd_submit)

    p = sub.add_parser(
        "run", help="run a command in a copy of this folder on the platform, and follow its log until it ends"
    )
    p.add_argument("--team", required=True, metavar="T")
    p.add_argument("--queue", default="debug", metavar="Q", help="default debug")
    p.add_argument("--spec", default="shared", metavar="S", help="default shared")
    p.add_argument("--gpus", type=int, metavar="N", help="whole cards (guaranteed spec)")
    p.add_argument("--image", default="python-3.11", metavar="I", help="default python-3.11")
    p.add_argument("--dir", default=".", metavar="DIR", help="the folder to send (default: the current one)")
    p.add_argument("--detach", action="store_true", help="print the job id and return instead of following")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command and its arguments")
    interval(p)
    p.set_defaults(handler=cmd_run)

    p = sub.add_parser("status", help="a job's state, reason, queue position and attempts")
    p.add_argument("job", help="job id (or its first 8 characters)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_status)

    p = sub.add_parser("list", help="your teams' jobs, newest first")
    p.add_argument("--state", action="append", metavar="S", help="only jobs in this state (repeat, or a,b)")
    p.add_argument("--team", metavar="T")
    p.add_argument("--queue", metavar="Q")
    p.add_argument("--limit", type=_positive_int, default=20, metavar="N", help="at most N jobs (default 20)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_list)

    p = sub.add_parser("logs", help="a job's log lines (the latest attempt unless --attempt)")
    p.add_argument("job", help="job id (or its first 8 characters)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the job ends")
    p.add_argument("--attempt", type=_positive_int, metavar="N")
    p.add_argument("--tail", type=_positive_int, metavar="N", help="only the last N lines (at most 5000)")
    interval(p)
    p.set_defaults(handler=cmd_logs)

    p = sub.add_parser("cancel", help="cancel a pending or running job")
    p.add_argument("job", help="job id (or its first 8 characters)")
    p.add_argument("--wait", action="store_true", help="wait until the job has stopped")
    interval(p)
    p.set_defaults(handler=cmd_cancel)

    p = sub.add_parser("checkpoints", help="a job's checkpoints in the object store; --download ID fetches one")
    p.add_argument("job", help="job id")
    p.add_argument("--download", type=_positive_int, metavar="ID", help="download this checkpoint's files")
    p.add_argument("--path", metavar="P", help="only this file of the checkpoint")
    p.add_argument("--output", "-o", metavar="FILE", help="write the (one) file here")
    p.add_argument("--dir", default=".", metavar="D", help="write the files under D, by their paths (default .)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_checkpoints)

    p = sub.add_parser("queues", help="queues, their usage and who waits (give a NAME for the line)")
    p.add_argument("name", nargs="?", help="one queue: the waiting jobs with positions and estimated waits")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_queues)

    p = sub.add_parser("quota", help="a team's quota and what is in use")
    p.add_argument("team", nargs="?", help="team slug (default: all your teams)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_quota)

    p = sub.add_parser("templates", help="your teams' saved job templates (submit one with submit --template)")
    p.add_argument("--team", metavar="T")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_templates)

    p = sub.add_parser("datasets", help="registered datasets your teams may read (name them in a job's datasets:)")
    p.add_argument("--team", metavar="T", help="only this team's own datasets")
    p.add_argument("--name", metavar="N", help="only this dataset's versions")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_datasets)

    p = sub.add_parser(
        "tokens", help="your API tokens: list, create NAME, revoke ID (needs a token with the admin scope)"
    )
    p.add_argument("action", nargs="?", choices=["list", "create", "revoke"], default="list")
    p.add_argument("name", nargs="?", help="create: the new token's name; revoke: its 8-character id")
    p.add_argument("--scope", action="append", metavar="S", help="create: read, submit, admin (repeat, or a,b)")
    p.add_argument("--expires-days", type=_positive_int, metavar="N", help="create: expire after N days")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_tokens)

    p = sub.add_parser("images", help="the image catalog: bases and your teams' images, scans, sizes, nodes")
    p.add_argument("--team", metavar="T", help="only this team's project images")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_images)

    p = sub.add_parser("image", help="build NAME: (re)build a project image (--team, --base) or a base; status ID")
    p.add_argument("action", choices=["build", "status"])
    p.add_argument("name", help="build: the image's name; status: a build id")
    p.add_argument("--team", metavar="T", help="build a project image of this team (else: rebuild the base NAME)")
    p.add_argument("--base", metavar="B", help="the catalog base image it builds on")
    p.add_argument("-f", "--file", metavar="CONTAINERFILE", help="its Containerfile (FROM must name the base)")
    p.add_argument("-r", "--requirements", metavar="FILE", help="a requirements.txt installed on the base")
    p.add_argument("--wait", action="store_true", help="wait for the build; exit 1 when it fails")
    p.add_argument("--log", action="store_true", help="print the build's log")
    interval(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_image)

    p = sub.add_parser("login", help="save the server address and an API token to the config file")
    p.add_argument("--url", required=True, help="the platform's address, e.g. https://trainyard.example.com")
    p.add_argument("--token", required=True, help="an API token (ty_...), or - to read it from standard input")
    p.add_argument("--no-verify", action="store_true", help="save without checking the token with the server")
    p.set_defaults(handler=None)
    return parser


def _run(argv: Sequence[str] | None, env: dict[str, str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.command == "login":
        return cmd_login(args, env)
    config: Config = load_config(env)
    for warning in config.warnings:
        _err(f"warning: {warning}")
    with ApiClient(config.url, require_token(config)) as api:
        return args.handler(args, api)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (the console script passes it to sys.exit)."""
    try:
        return _run(argv, dict(os.environ))
    except CliError as exc:
        _err(f"error: {exc.message}")
        for line in exc.details:
            print(f"  {line}", file=sys.stderr)
        return exc.exit_code
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except KeyboardInterrupt:
        _err("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader (`| head`) went away: stop quietly, and keep Python from complaining at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
