"""Experiments: part of `trainyard_cli.main` (see its package docstring).

trainyard experiment create exp.yaml      # fields as in POST /api/v1/experiments/; template.code: DIR uploads DIR
trainyard experiment list | show ID | trials ID [--sort K] [--csv] | pause ID | resume ID | cancel ID
trainyard experiment rerun-best ID [--steps N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..client import ApiClient, ApiError
from ..code import upload as upload_code
from ..errors import EXIT_OK, EXIT_USAGE, CliError
from ..jobfile import load_jobfile
from .common import err, print_json, say, table_text, when_text

ACTIONS = ("create", "list", "show", "trials", "pause", "resume", "cancel", "rerun-best")


def _value(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def resolve_experiment_id(api: ApiClient, raw: str | None) -> str:
    """A full experiment id, or the first 8+ characters of one the token can see."""
    if not raw:
        raise CliError("give the experiment's id (see `trainyard experiment list`)", EXIT_USAGE)
    text = raw.strip().lower()
    if len(text) == 36:
        return text
    if len(text) < 8:
        raise CliError(f"{raw!r} is too short for an experiment id: give at least 8 characters", EXIT_USAGE)
    found = [e for e in api.get("/experiments/") if e["id"].startswith(text)]
    if not found:
        raise CliError(f"no experiment id starts with {text} (or it belongs to a team you are not in)", EXIT_USAGE)
    if len(found) > 1:
        raise CliError(f"{text} is the start of several experiment ids; give more characters", EXIT_USAGE)
    return found[0]["id"]


def _line(e: dict) -> str:
    s = e["summary"]
    best = (
        f"best {e['metric']} {_value(s['best_value'])} (trial {s['best_trial']})"
        if s["best_trial"]
        else "no result yet"
    )
    counts = ", ".join(f"{n} {state}" for state, n in sorted(s["by_state"].items())) or "no trials yet"
    return f"{e['state']}: {s['trials']}/{e['max_trials']} trials ({counts}); {best}"


def _create(args: argparse.Namespace, api: ApiClient) -> int:
    if not args.target:
        raise CliError("give the experiment file: `trainyard experiment create exp.yaml`", EXIT_USAGE)
    expfile = load_jobfile(args.target)
    template = expfile.data.get("template")
    if isinstance(template, dict):
        value = template.get("code")
        if isinstance(value, str) and value and not value.startswith("sha256:"):
            team = expfile.data.get("team")
            if not isinstance(team, str) or not team:
                raise CliError(f"{expfile.name}: the experiment names no team, and a code snapshot belongs to one",
                               EXIT_USAGE)  # fmt: skip
            base = Path(args.target).parent if args.target != "-" else Path.cwd()
            template["code"] = upload_code(api, base / value, team=team)
    try:
        _, experiment = api.post("/experiments/", json=expfile.data)
    except ApiError as exc:
        from .commands import _located

        located = _located(exc, expfile)
        located.message = located.message.replace("rejected the job", "rejected the experiment")
        raise located
    err(f"created experiment {experiment['id']} ({experiment['name']}): {experiment['searcher']} search of "
        f"{experiment['metric']} ({experiment['direction']}), up to {experiment['max_trials']} trials, "
        f"{experiment['max_concurrent']} at once")  # fmt: skip
    if args.json:
        print_json(experiment)
    else:
        say(experiment["id"])
    return EXIT_OK


def cmd_experiment(args: argparse.Namespace, api: ApiClient) -> int:
    if args.action == "create":
        return _create(args, api)
    if args.action == "list":
        found = api.get("/experiments/", params={"team": args.team} if args.team else None)
        if args.json:
            print_json(found)
            return EXIT_OK
        if not found:
            err("no experiments (create one with `trainyard experiment create exp.yaml`)")
            return EXIT_OK
        say(table_text(
            ["ID", "TEAM", "NAME", "SEARCHER", "STATE", "TRIALS", "BEST", "CREATED"],
            [(e["id"][:8], e["team"], e["name"], e["searcher"], e["state"],
              f"{e['summary']['trials']}/{e['max_trials']}", _value(e["summary"]["best_value"]),
              when_text(e["created_at"])) for e in found],
        ))  # fmt: skip
        return EXIT_OK
    experiment_id = resolve_experiment_id(api, args.target)
    base = f"/experiments/{experiment_id}/"
    if args.action == "show":
        experiment = api.get(base, not_found="no such experiment (or it belongs to a team you are not in)")
        if args.json:
            print_json(experiment)
            return EXIT_OK
        say(f"{experiment['name']} ({experiment['id']}), team {experiment['team']}")
        say(_line(experiment))
        if experiment["summary"]["best_params"]:
            say(
                "best parameters: "
                + ", ".join(f"{k}={_value(v)}" for k, v in experiment["summary"]["best_params"].items())
            )
        if experiment["message"]:
            say(experiment["message"])
        rec = experiment.get("recommendation") or {}
        if rec:
            say(f"right-sizing from its trials: spec {rec.get('spec') or 'as asked'} ({rec.get('evidence')})")
        return EXIT_OK
    if args.action == "trials":
        params = {"sort": args.sort} if args.sort else None
        if args.csv:
            sys.stdout.flush()
            api.download(base + "trials/csv/", params=params, dest=sys.stdout.buffer, not_found="no such experiment")
            sys.stdout.buffer.flush()
            return EXIT_OK
        trials = api.get(base + "trials/", params=params)
        if args.json:
            print_json(trials)
            return EXIT_OK
        names = sorted({k for t in trials for k in t["params"]})
        say(table_text(
            ["TRIAL", "STATE", "JOB", *[n.upper() for n in names], "BEST", "STEP"],
            [(t["number"], t["state"], t["job"][:8], *[_value(t["params"].get(n)) for n in names],
              _value(t["best_value"]), _value(t["last_step"])) for t in trials],
        ))  # fmt: skip
        return EXIT_OK
    if args.action in ("pause", "resume", "cancel"):
        _, experiment = api.post(base + f"{args.action}/", not_found="no such experiment")
        err(f"experiment {experiment['id'][:8]} is {experiment['state']}")
        if args.json:
            print_json(experiment)
        return EXIT_OK
    body = {"max_steps": args.steps} if args.steps else {}
    _, job = api.post(base + "rerun-best/", json=body, not_found="no such experiment")
    err(f"submitted job {job['id']} ({job['name']}) with the best trial's parameters")
    if args.json:
        print_json(job)
    else:
        say(job["id"])
    return EXIT_OK


def add_parser(sub, positive_int) -> None:
    p = sub.add_parser(
        "experiment", help="hyperparameter searches: create FILE, list, show ID, trials ID, pause/resume/cancel ID, "
        "rerun-best ID",
    )  # fmt: skip
    p.add_argument("action", choices=ACTIONS)
    p.add_argument("target", nargs="?", metavar="FILE|ID", help="create: the experiment file; else its id")
    p.add_argument("--team", metavar="T", help="list: only this team's")
    p.add_argument("--sort", metavar="K", help="trials: by a parameter or column (-K descending; metric = best)")
    p.add_argument("--csv", action="store_true", help="trials: print CSV")
    p.add_argument("--steps", type=positive_int, metavar="N", help="rerun-best: set {{max_steps}} to N")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_experiment)
