"""The platform's long-running processes, named once: used by `make run`, the Makefile targets and
docker-compose (a test checks they agree).

`python -m ops.processes NAME` runs one of them in the foreground.
"""

import os
import sys

from kernel.wake import dispatch_queue_name

HOST = os.environ.get("TRAINYARD_HOST", "127.0.0.1")
PORT = int(os.environ.get("TRAINYARD_PORT", "8000"))


def _proxy_args() -> list[str]:
    trusted = os.environ.get("TRAINYARD_TRUSTED_PROXIES", "").strip()
    if not trusted:
        return ["--no-proxy-headers"]
    return ["--proxy-headers", "--forwarded-allow-ips", trusted]


def command(name: str, *, host: str | None = None, port: int | None = None, environ=os.environ) -> list[str]:
    """argv (after the interpreter's `-m`) for one process, with the variables of `environ`."""
    commands = {
        "web": [
            "uvicorn",
            "trainyard.asgi:application",
            "--host",
            host or HOST,
            "--port",
            str(port or PORT),
            "--lifespan",
            "off",
            "--no-access-log",
            "--ws",
            "websockets",
            # Open log streams would otherwise hold a stop (SIGTERM) forever.
            "--timeout-graceful-shutdown",
            "10",
            # The client's address (login lockout, rate limits) comes from X-Forwarded-For only when the connection
            # is from a proxy named in TRAINYARD_TRUSTED_PROXIES; none by default, not even loopback, where any
            # local user could otherwise claim any address.
            *_proxy_args(),
        ],
        "worker": _celery_worker("worker", "--concurrency", environ.get("TRAINYARD_WORKER_CONCURRENCY", "4")),
        # Dispatch passes alone, in one process (solo pool: no children), so the pool and the lines it carries stay
        # in memory from pass to pass; with them on the prefork worker, each child kept a view of its own and most
        # passes began by re-reading the ledger (docs/scheduler.md, "One dispatcher").
        "dispatcher": _celery_worker("dispatcher", "--pool", "solo", "-Q", dispatch_queue(environ)),
        "beat": ["celery", "-A", "trainyard", "beat", "-l", "INFO"],
    }
    return commands[name]


def _celery_worker(node: str, *options: str) -> list[str]:
    return ["celery", "-A", "trainyard", "worker", "-l", "INFO", "-n", f"{node}@%h", *options]


def dispatch_queue(environ=os.environ) -> str:
    """The dispatcher's queue, from the same variables the settings read (no Django set up here)."""
    return dispatch_queue_name(
        environ.get("TRAINYARD_CELERY_QUEUE", "trainyard"), environ.get("TRAINYARD_DISPATCH_QUEUE", "")
    )


def web_processes(environ=os.environ) -> int:
    """How many web processes share the port: `TRAINYARD_WEB_PROCESSES`, else one per CPU core, at most 4.

    One Python process runs one request's Python code at a time, so a second process is what lets the web
    tier use a second core (bench/api.py measures the difference).
    """
    raw = environ.get("TRAINYARD_WEB_PROCESSES", "").strip()
    if not raw:
        return max(1, min(4, os.cpu_count() or 1))
    try:
        value = int(raw)
    except ValueError:
        raise SystemExit(f"TRAINYARD_WEB_PROCESSES must be a whole number, not {raw!r}")
    if value < 1:
        raise SystemExit("TRAINYARD_WEB_PROCESSES must be 1 or more")
    return value


def environment(name: str, environ=os.environ) -> dict[str, str]:
    """Variables one process needs on top of the platform's own (uvicorn reads its worker count from
    WEB_CONCURRENCY, so the command line stays the same everywhere)."""
    if name == "web":
        return {"WEB_CONCURRENCY": str(web_processes(environ))}
    return {}


DEFAULT_NICENESS = 5


def niceness(name: str, environ=os.environ) -> int:
    """How much lower than its launcher a process runs: `TRAINYARD_NICENESS` (default 5, 0 for none) for every
    process but the dispatcher, which keeps the launcher's priority.

    The dispatcher is the one process every admission waits for, and a pass after a release decides every waiting
    line (~40 ms of CPU with 5,000 waiting). On a machine whose cores the web processes and the database keep busy,
    the kernel gave it a fifth of a core in such a pass: 180-440 ms of wall clock for 33-48 ms of CPU, measured in
    `make bench-scheduler`'s run with releases (decide_ms against decide_cpu_ms in its dispatch_pass lines). The
    dispatcher uses 1.5-4 ms of CPU per submission against the web's 10, so putting it first costs the other
    processes little. On Kubernetes its pod's CPU request does this instead (k8s/worker.yaml)."""
    if name == "dispatcher":
        return 0
    raw = environ.get("TRAINYARD_NICENESS", "").strip()
    if not raw:
        return DEFAULT_NICENESS
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 19:
        raise SystemExit(f"TRAINYARD_NICENESS must be a whole number from 0 to 19, not {raw!r}")
    return value


def lower_priority(name: str, environ=os.environ):
    """A `preexec_fn` for `subprocess.Popen` that applies `niceness(name)` in the child before it runs; None when
    there is nothing to lower. Its children (uvicorn's and Celery's worker processes) inherit it."""
    n = niceness(name, environ)
    if not n:
        return None

    def apply() -> None:
        os.nice(n)

    return apply


NAMES = ("web", "worker", "dispatcher", "beat")

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in NAMES:
        print(f"usage: python -m ops.processes {{{'|'.join(NAMES)}}}", file=sys.stderr)
        sys.exit(2)
    os.environ.update(environment(sys.argv[1]))
    if lowered := niceness(sys.argv[1]):
        os.nice(lowered)
    os.execv(sys.executable, [sys.executable, "-m", *command(sys.argv[1])])
