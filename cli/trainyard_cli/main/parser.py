"""Parser: part of `trainyard_cli.main` (see its package docstring)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ..client import ApiClient, cli_version
from ..config import Config, load_config, require_token
from ..errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
)
from .commands import (
    cmd_cancel,
    cmd_checkpoints,
    cmd_datasets,
    cmd_image,
    cmd_images,
    cmd_list,
    cmd_login,
    cmd_logs,
    cmd_queues,
    cmd_quota,
    cmd_run,
    cmd_status,
    cmd_submit,
    cmd_templates,
    cmd_tokens,
)
from .common import err
from .experiments import add_parser as add_experiment_parser


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

    add_experiment_parser(sub, _positive_int)

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
        err(f"warning: {warning}")
    with ApiClient(config.url, require_token(config)) as api:
        return args.handler(args, api)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (the console script passes it to sys.exit)."""
    try:
        return _run(argv, dict(os.environ))
    except CliError as exc:
        err(f"error: {exc.message}")
        for line in exc.details:
            print(f"  {line}", file=sys.stderr)
        return exc.exit_code
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except KeyboardInterrupt:
        err("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader (`| head`) went away: stop quietly, and keep Python from complaining at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
