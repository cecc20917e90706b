"""The platform's long-running processes, named once: used by `make run`, the Makefile targets and
docker-compose (a test checks they agree).

`python -m trainyard.processes NAME` runs one of them in the foreground.
"""

import os
import sys

HOST = os.environ.get("TRAINYARD_HOST", "127.0.0.1")
PORT = int(os.environ.get("TRAINYARD_PORT", "8000"))


def command(name: str, *, host: str | None = None, port: int | None = None) -> list[str]:
    """argv (after the interpreter's `-m`) for one process."""
    commands = {
        "web": ["uvicorn", "trainyard.asgi:application", "--host", host or HOST, "--port", str(port or PORT),
                "--lifespan", "off", "--no-access-log", "--ws", "websockets",
                # Open log streams would otherwise hold a stop (SIGTERM) forever.
                "--timeout-graceful-shutdown", "10"],
        "worker": ["celery", "-A", "trainyard", "worker", "-l", "INFO", "-n", "worker@%h",
                   "--concurrency", os.environ.get("TRAINYARD_WORKER_CONCURRENCY", "4")],
        "beat": ["celery", "-A", "trainyard", "beat", "-l", "INFO"],
    }
    return commands[name]


NAMES = ("web", "worker", "beat")

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in NAMES:
        print(f"usage: python -m trainyard.processes {{{'|'.join(NAMES)}}}", file=sys.stderr)
        sys.exit(2)
    os.execv(sys.executable, [sys.executable, "-m", *command(sys.argv[1])])
