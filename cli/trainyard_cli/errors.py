"""Exit codes of the `trainyard` CLI and the one error type its commands raise.

CI pipelines branch on the exit code, so the table is part of the CLI's interface (docs/cli.md).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CANCELLED = 2
EXIT_TIMED_OUT = 3
EXIT_USAGE = 4
EXIT_AUTH = 5
EXIT_UNAVAILABLE = 6
EXIT_INTERRUPTED = 130

# The CLI runs without Django, so it cannot import jobs.states; a test checks these agree with TERMINAL there.
EXIT_BY_FINAL_STATE: dict[str, int] = {
    "succeeded": EXIT_OK,
    "failed": EXIT_FAILED,
    "cancelled": EXIT_CANCELLED,
    "timed_out": EXIT_TIMED_OUT,
}
TERMINAL_STATES = frozenset(EXIT_BY_FINAL_STATE)


class CliError(Exception):
    """An error the user can act on: one line of message, optional detail lines, and the exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE, details: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.details = details or []
