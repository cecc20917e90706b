"""Commands: part of `trainyard_cli.main` (see its package docstring)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from ..client import ApiClient, ApiError
from ..code import upload as upload_code
from ..config import check_token, config_path, normalize_url
from ..config import save_config as write_config
from ..errors import (
    EXIT_BY_FINAL_STATE,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    TERMINAL_STATES,
    CliError,
)
from ..jobfile import JobFile, load_jobfile
from .common import (
    duration,
    elapsed,
    err,
    gib,
    gpus_text,
    print_json,
    resolve_job_id,
    say,
    table_text,
    when_text,
)
from .following import LogFollower, finish, interruptible, state_line, wait_for_job


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
        jobfile.data["resume_from"] = resolve_job_id(api, args.resume_from)
    _attach_code(api, jobfile, args)
    try:
        if args.template:
            template = _template(api, args.template, args.team)
            path = f"/templates/{template['id']}/submit/"
        else:
            path = "/jobs/"
        status, job = post_submission(api, path, jobfile.data, key=args.idempotency_key)
    except ApiError as exc:
        raise _located(exc, jobfile)
    if status == 200:
        err(f"job {job['id']} was already submitted with this Idempotency-Key (it is {job['state']})")
    else:
        err(f"submitted job {job['id']} ({job['name']}) to {job['team']}/{job['queue']}: {state_line(job)}")
        advice = recommendation_line(job.get("recommendation"))
        if advice:
            err(advice)
    if not (args.wait or args.follow):
        if args.json:
            print_json(job)
        else:
            say(job["id"])
        return EXIT_OK
    if not args.json and not args.follow:
        say(job["id"])
    follower = LogFollower(api, job["id"]) if args.follow else None

    def wait() -> int:
        final = wait_for_job(api, job["id"], interval=args.interval, follower=follower)
        return finish(final, as_json=args.json)

    return interruptible(job["id"], wait)


SUBMIT_RETRIES = 5  # sends of one submission while the platform's database or broker is down (a 503) or unreachable


def post_submission(api: ApiClient, path: str, data: dict, *, key: str | None) -> tuple[int, dict]:
    """POST a submission with an Idempotency-Key (the user's, else one made here), sent again with the same key
    while the server answers 503 or cannot be reached: the server keeps one job per key, so however often it was
    sent, at most one job is made. (status, job): 201 when this command made it, 200 when the user's own key had
    been used before."""
    sent_key = key or f"cli-{uuid.uuid4()}"
    headers = {"Idempotency-Key": sent_key}
    for attempt in range(SUBMIT_RETRIES + 1):
        try:
            status, job = api.post(path, json=data, headers=headers)
            return (201 if status == 200 and key is None else status), job
        except ApiError as exc:
            if exc.status != 503:
                raise
            failure: CliError = exc
            wait = float(exc.body.get("retry_after") or 5)
            why = f"the server answered 503 ({exc.code})"
        except CliError as exc:
            if exc.exit_code != EXIT_UNAVAILABLE:
                raise
            failure, wait, why = exc, 2.0, exc.message
        if attempt == SUBMIT_RETRIES:
            raise _unsure_submission(failure, sent_key, mine=key is None)
        err(f"trainyard: {why}; sending it again with the same Idempotency-Key in {wait:g} s "
            f"({attempt + 1}/{SUBMIT_RETRIES})")  # fmt: skip
        api._sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def _unsure_submission(exc: CliError, key: str, *, mine: bool) -> CliError:
    """The last failure of a submission, saying what is known of the job and how to send it again safely."""
    body = exc.body if isinstance(exc, ApiError) else {}
    job_id = body.get("job_id") or ", ".join(body.get("job_ids") or [])
    again = f"run the same command with --idempotency-key {key}: that never makes a second job"
    if job_id and body.get("job_exists"):
        text = (
            f"job {job_id} was submitted, but the server could not answer ({exc.message}); do not submit it "
            f"again: `trainyard status {job_id}` once the platform is back"
        )
    elif job_id:
        text = f"it is not known whether job {job_id} was kept ({exc.message}); {again}"
    elif mine:
        text = f"the job may or may not have been submitted ({exc.message}); {again}"
    else:
        text = f"{exc.message}; {again}"
    return CliError(text, EXIT_UNAVAILABLE)


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
        status, job = post_submission(api, "/jobs/", jobfile.data, key=None)
    except ApiError as exc:
        raise _located(exc, jobfile)
    err(f"submitted job {job['id']} ({job['name']}) to {job['team']}/{job['queue']}: {state_line(job)}")
    if args.detach:
        say(job["id"])
        return EXIT_OK
    follower = LogFollower(api, job["id"])

    def wait() -> int:
        final = wait_for_job(api, job["id"], interval=args.interval, follower=follower)
        return finish(final, as_json=False)

    return interruptible(job["id"], wait)


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
        return f"unknown (at the latest in {duration(max(60, high))})" if high is not None else "unknown"
    low, high = duration(max(60, low)), duration(max(60, high))
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
    job_id = resolve_job_id(api, args.job)
    job = api.get(f"/jobs/{job_id}/", not_found=f"job {job_id} not found (or it belongs to a team you are not in)")
    attempts = api.get(f"/jobs/{job_id}/attempts/")
    wait = _queue_wait(api, job)
    if args.json:
        print_json({**job, "attempts": attempts, "estimated_start": wait})
        return EXIT_OK
    state = state_line(job)
    if wait is not None:
        state += f" — estimated start {_estimate(wait)}"
    spec = job.get("spec") or "explicit request"
    resources = f"{job['gpu_count']} x {job['gpu_milli']} milli GPU, {gib(job['gpu_memory_mib'])} GPU memory"
    rows = [
        ("Job", f"{job['id']}  {job['name']}"),
        ("State", state),
        ("Owner", f"{job['owner']} (team {job['team']})"),
        ("Queue", f"{job['queue']}, spec {spec}: {resources}, {job['replicas']} replica(s)"),
        ("Image", job["image_reference"] + (f" @ {job['image_digest']}" if job.get("image_digest") else "")),
        ("Command", shlex.join([*(job.get("command") or []), *(job.get("args") or [])])),
        ("Submitted", when_text(job.get("submitted_at"))),
        ("Started", when_text(job.get("started_at"))),
        ("Finished", when_text(job.get("finished_at"))),
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
        say(f"{key.ljust(width)}  {value}")
    if attempts:
        say("")
        say(
            table_text(
                ["ATTEMPT", "STATE", "NODE", "STARTED", "RAN", "EXIT", "FAILURE CLASS", "REACTION", "REASON"],
                [
                    (
                        a["number"],
                        a["state"],
                        a.get("node"),
                        when_text(a.get("started_at")),
                        duration(elapsed(a.get("started_at"), a.get("ended_at"))),
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
        print_json(jobs)
        return EXIT_OK
    if not jobs:
        err("no jobs match")
        return EXIT_OK
    say(
        table_text(
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
                    when_text(j.get("submitted_at")),
                )
                for j in jobs
            ],
        )
    )
    return EXIT_OK


def cmd_logs(args: argparse.Namespace, api: ApiClient) -> int:
    job_id = resolve_job_id(api, args.job)
    attempts = api.get(
        f"/jobs/{job_id}/attempts/", not_found=f"job {job_id} not found (or it belongs to a team you are not in)"
    )
    numbers = [a["number"] for a in attempts]
    if args.attempt is not None and args.attempt not in numbers:
        have = ", ".join(map(str, numbers)) if numbers else "none yet"
        raise CliError(f"job {job_id} has no attempt {args.attempt} (attempts: {have})", EXIT_USAGE)
    if not numbers and not args.follow:
        err(f"job {job_id} has not started yet: no log lines")
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

    return interruptible(job_id, follow)


def cmd_cancel(args: argparse.Namespace, api: ApiClient) -> int:
    job_id = resolve_job_id(api, args.job)
    try:
        _, job = api.post(f"/jobs/{job_id}/cancel/", not_found=f"job {job_id} not found")
    except ApiError as exc:
        if exc.status == 409:
            raise CliError(f"cannot cancel job {job_id}: {exc.detail} ({exc.code})", EXIT_USAGE)
        raise
    if job["state"] == "cancelled":
        err(f"job {job_id} cancelled")
    else:
        err(f"job {job_id} {job['state']}: the backend is stopping it")
    if not args.wait:
        return EXIT_OK
    return interruptible(job_id, lambda: finish(wait_for_job(api, job_id, interval=args.interval), as_json=False))


def _bytes(n: int | None) -> str:
    value = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value} B"  # pragma: no cover


def cmd_checkpoints(args: argparse.Namespace, api: ApiClient) -> int:
    job_id = resolve_job_id(api, args.job)
    rows = api.get(f"/jobs/{job_id}/checkpoints/", not_found=f"job {job_id} not found (or not your team's)")
    if args.download is None:
        if args.json:
            print_json(rows)
        elif not rows:
            err(f"job {job_id} has no checkpoint saved yet")
        else:
            table = [
                (r["id"], r["name"], r["step"], _bytes(r["size_bytes"]), r["attempt"], when_text(r["saved_at"]),
                 len(r["files"]))
                for r in rows
            ]  # fmt: skip
            say(table_text(["ID", "NAME", "STEP", "SIZE", "ATTEMPT", "SAVED", "FILES"], table))
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
        err(f"saved {f['path']} ({_bytes(size)}) to {target}")
    return EXIT_OK


def cmd_queues(args: argparse.Namespace, api: ApiClient) -> int:
    if args.name:
        queue = api.get(f"/queues/{args.name}/", not_found=f"no queue named {args.name!r} (see `trainyard queues`)")
        if args.json:
            print_json(queue)
            return EXIT_OK
        say(f"{queue['name']} ({queue['state']}): {queue['description']}")
        say(
            f"capability {gpus_text(queue['capability']['gpu_milli'])} GPUs, in use "
            f"{gpus_text(queue['usage']['gpu_milli'])}; specs {', '.join(queue['specs'])}"
        )
        if not queue["jobs"]:
            say("nobody is waiting")
            return EXIT_OK
        say(
            table_text(
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
        print_json(queues)
        return EXIT_OK
    say(
        table_text(
            ["QUEUE", "STATE", "PRIORITY", "SPECS", "WAITING", "RUNNING", "GPUS USED/CAP", "MAX TIMEOUT"],
            [
                (
                    q["name"],
                    q["state"],
                    q["priority"],
                    ",".join(q["specs"]),
                    q["waiting"],
                    q["usage"].get("jobs"),
                    f"{gpus_text(q['usage']['gpu_milli'])}/{gpus_text(q['capability']['gpu_milli'])}",
                    duration(q.get("max_timeout_s")),
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
        when_text(image.get("last_rebuilt")),
        _findings(build),
        f"{nodes}/{total}",
    )


def cmd_images(args: argparse.Namespace, api: ApiClient) -> int:
    bases = api.get("/images/")
    projects = api.get("/project-images/")
    if args.team:
        projects = [p for p in projects if p["team"] == args.team]
    if args.json:
        print_json({"base_images": bases, "project_images": projects})
        return EXIT_OK
    rows = [_image_row(b, team="(base)", base=b.get("framework") or "-") for b in ([] if args.team else bases)]
    rows += [_image_row(p, team=p["team"], base=p["base"]) for p in projects]
    say(table_text(["IMAGE", "TEAM", "BASE", "DIGEST", "SIZE", "BUILT", "FINDINGS", "NODES"], rows))
    return EXIT_OK


TERMINAL_BUILD = {"succeeded", "failed"}


def _wait_build(api: ApiClient, build: dict, *, interval: float) -> dict:
    said = ""
    while build["status"] not in TERMINAL_BUILD:
        if build["status"] == "waiting_registry" and said != "waiting_registry":
            err("the registry is unreachable; the build waits and retries (see its log)")
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
        err(f"building {args.team}/{args.name} on {args.base}: build {build['id']} is {build['status']}")
    else:
        _, build = api.post(f"/images/{args.name}/build/", not_found=f"no base image {args.name!r}")
        err(f"rebuilding base image {args.name}: build {build['id']} is {build['status']}")
    if args.wait and build["status"] not in TERMINAL_BUILD:
        build = _wait_build(api, build, interval=args.interval)
    if args.json:
        print_json(build)
    else:
        say(f"build {build['id']} of {build['image']}: {build['status']}")
        if build.get("digest"):
            say(f"  {build['reference'].rsplit(':', 1)[0]}@{build['digest']}")
        if build.get("size_bytes"):
            say(f"  size {_bytes(build['size_bytes'])}, findings: {_findings(build)}")
        for warning in build.get("warnings") or []:
            say(f"  warning ({warning['code']}): {warning['detail']}")
        if build["status"] == "failed" or args.log:
            say((build.get("log") or "").rstrip()[-4000:])
    return EXIT_FAILED if build["status"] == "failed" else EXIT_OK


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", EXIT_USAGE) from None


def _print_team(team: dict) -> None:
    quota, usage = team["quota"], team["usage"]
    say(f"team {team['slug']} ({team['name']})")
    rows = [
        (
            "GPUs",
            gpus_text(usage["gpu_milli"]),
            gpus_text(quota["gpu_milli"]),
            gpus_text(quota["gpu_milli"] - usage["gpu_milli"]),
        ),
        (
            "GPU memory",
            gib(usage["gpu_memory_mib"]),
            gib(quota["gpu_memory_mib"]),
            gib(quota["gpu_memory_mib"] - usage["gpu_memory_mib"]),
        ),
        (
            "CPU cores",
            gpus_text(usage["cpu_milli"]),
            gpus_text(quota["cpu_milli"]),
            gpus_text(quota["cpu_milli"] - usage["cpu_milli"]),
        ),
        (
            "Memory",
            gib(usage["memory_mib"]),
            gib(quota["memory_mib"]),
            gib(quota["memory_mib"] - usage["memory_mib"]),
        ),
        (
            "Running jobs",
            usage.get("jobs", 0),
            team["max_running_jobs"],
            team["max_running_jobs"] - usage.get("jobs", 0),
        ),
    ]
    say(table_text(["RESOURCE", "IN USE", "QUOTA", "FREE"], rows))
    by_spec = team.get("usage_by_spec") or []
    if by_spec:
        say(
            "in use by spec: "
            + "; ".join(f"{row['spec']}: {row['jobs']} job(s), {gpus_text(row['gpu_milli'])} GPUs" for row in by_spec)
        )


def cmd_quota(args: argparse.Namespace, api: ApiClient) -> int:
    if args.team:
        team = api.get(f"/teams/{args.team}/", not_found=f"no team {args.team!r} that you are a member of")
        teams = [team]
    else:
        teams = api.get("/teams/")
    if args.json:
        print_json(team if args.team else teams)
        return EXIT_OK
    if not teams:
        err("you are not a member of any team")
        return EXIT_OK
    for i, team in enumerate(teams):
        if i:
            say("")
        _print_team(team)
    return EXIT_OK


def cmd_templates(args: argparse.Namespace, api: ApiClient) -> int:
    templates = api.get("/templates/", params={"team": args.team} if args.team else None)
    if args.json:
        print_json(templates)
        return EXIT_OK
    if not templates:
        err("no templates (save one from the portal's submit form, or POST /api/v1/templates/)")
        return EXIT_OK

    def command(body: dict) -> str:
        cmd = body.get("command") or []
        return shlex.join(map(str, cmd)) if isinstance(cmd, list) else str(cmd)

    say(
        table_text(
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
        print_json(datasets)
        return EXIT_OK
    if not datasets:
        err("no datasets your teams may read (a maintainer registers one: POST /api/v1/datasets/)")
        return EXIT_OK
    rows = [
        (d["team"], d["name"], d["version"], d["kind"], d["s3_prefix"] or d["claim"],
         _bytes(d["size_bytes"]) if d["kind"] == "s3" else "-", d["file_count"] if d["kind"] == "s3" else "-",
         ",".join(d["shared_with"]))
        for d in datasets
    ]  # fmt: skip
    say(table_text(["TEAM", "NAME", "VERSION", "KIND", "SOURCE", "SIZE", "FILES", "SHARED WITH"], rows))
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
        err(
            f"created token {token['name']} (id {token['prefix']}, scopes {', '.join(token['scopes'])}); "
            "it is printed once, below"
        )
        say(token["token"])
        return EXIT_OK
    if args.action == "revoke":
        if not args.name:
            raise CliError("give the id of the token to revoke (the 8 characters `trainyard tokens` shows)", EXIT_USAGE)
        api.request("DELETE", f"/tokens/{args.name.strip()}/", not_found=f"no token of yours has the id {args.name!r}")
        err(f"revoked token {args.name}")
        return EXIT_OK
    rows = api.get("/tokens/")
    rows = rows.get("results", rows) if isinstance(rows, dict) else rows
    if args.json:
        print_json(rows)
        return EXIT_OK

    def status(t: dict) -> str:
        if t.get("revoked_at"):
            return "revoked"
        if t.get("expires_at") and datetime.fromisoformat(t["expires_at"]) <= datetime.now().astimezone():
            return "expired"
        return "active"

    say(
        table_text(
            ["ID", "NAME", "SCOPES", "CREATED", "EXPIRES", "LAST USED", "STATUS"],
            [
                (
                    t["prefix"],
                    t["name"],
                    ",".join(t["scopes"]),
                    when_text(t["created_at"]),
                    when_text(t.get("expires_at")),
                    when_text(t.get("last_used_at")),
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
        err(f"the token works on {url} (teams: {names})")
    write_config(path, url=url, token=token)
    err(f"saved the server address and token to {path} (readable by you only)")
    if env.get("TRAINYARD_TOKEN") or env.get("TRAINYARD_URL"):
        err("note: TRAINYARD_URL / TRAINYARD_TOKEN are set in the environment and take precedence over the file")
    return EXIT_OK
