"""`trainyard`: the command line for CI pipelines and terminals, a client of the REST API (`/api/v1/`).

    trainyard submit job.yaml [--wait] [--follow] [--idempotency-key K] [--resume-from JOB]
    trainyard submit --template NAME [overrides.yaml] [--team T]
    trainyard status JOB | list | logs JOB [-f] | cancel JOB | checkpoints JOB | queues [NAME] | quota [TEAM]
    trainyard templates | datasets | tokens | login

JOB is a job id, or its first 8 (or more) characters as the portal shows them.

Human output goes to stdout, progress and errors to stderr (one line, never a traceback); `--json` prints
machine-readable output. Exit codes are in `cli_errors` and docs/cli.md. It imports nothing from Django.
"""

# ruff: noqa: F401 - the package re-exports its modules' names
from trainyard_cli.main.commands import (
    TERMINAL_BUILD,
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
    recommendation_line,
)
from trainyard_cli.main.common import (
    ATTEMPT_ENDED,
    DRAIN_S,
    LOG_PAGE,
    MAX_TRANSIENT_ERRORS,
    SHORT_ID_RE,
    UUID_RE,
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
from trainyard_cli.main.following import LogFollower, finish, interruptible, state_line, wait_for_job
from trainyard_cli.main.parser import EPILOG, _run, build_parser, main
