"""`trainyard`: the command line for CI pipelines and terminals, a client of the REST API (`/api/v1/`).

    trainyard submit job.yaml [--wait] [--follow] [--idempotency-key K] [--resume-from JOB]
    trainyard submit --template NAME [overrides.yaml] [--team T]
    trainyard status JOB | list | logs JOB [-f] | cancel JOB | checkpoints JOB | queues [NAME] | quota [TEAM]
    trainyard templates | datasets | tokens | login
    trainyard experiment create exp.yaml | list | show ID | trials ID | pause/resume/cancel ID | rerun-best ID

JOB is a job id, or its first 8 (or more) characters as the portal shows them.

Human output goes to stdout, progress and errors to stderr (one line, never a traceback); `--json` prints
machine-readable output. Exit codes are in `cli_errors` and docs/cli.md. It imports nothing from Django.
"""

# What the rest of the platform reads of this package (each module is importable too).
from .commands import recommendation_line  # noqa: F401
from .parser import main  # noqa: F401
