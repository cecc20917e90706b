"""`make run`: the whole platform on this machine, in the foreground.

Uses the PostgreSQL and Redis named by DATABASE_URL / REDIS_URL, or embedded ones kept under var/; migrates, seeds,
builds (or finds by its inputs) the offline base image, then runs web (ASGI), a Celery worker and Celery beat as
children with prefixed output. A child that dies is started again after a backoff (1 s, doubling to 30 s; back to
1 s once it has run for a minute), with a log line. Ctrl-C or SIGTERM stops every child, the jobs' TensorBoards and
the embedded servers; the signal handler only sets a flag (no lock can deadlock it). Every child, embedded servers
included, gets a parent-death signal, so even a launcher killed with SIGKILL leaves nothing behind holding the port.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from kernel.paths import BASE_DIR, VAR_DIR
from ops import embedded, processes

COLORS = {"web": "36", "worker": "33", "dispatcher": "34", "beat": "35", "setup": "32"}
_print_lock = threading.Lock()
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
HEALTHY_AFTER_S = 60.0  # a child that ran this long starts again from the first backoff step


def _die_with_launcher() -> None:
    # SIGTERM: each child shuts down its own workers (uvicorn's, Celery's pool) when the launcher is gone.
    # `die_with_parent` is imported in the launcher (below): importing between fork and exec can fail.
    _die_with_parent(signal.SIGTERM)


from kernel.proctree import die_with_parent as _die_with_parent  # noqa: E402


class Child:
    """One supervised process: started, watched, and started again after a backoff when it dies."""

    def __init__(self, name: str, argv: list[str], env: dict):
        self.name, self.argv, self.env = name, argv, env
        self.lower = processes.lower_priority(name, env)
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.failures = 0
        self.restart_at: float | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=BASE_DIR,
            preexec_fn=self._prepare,
        )
        self.started_at = time.monotonic()
        self.restart_at = None
        threading.Thread(target=_pump, args=(self.name, self.proc), daemon=True).start()

    def _prepare(self) -> None:
        """In the child before it runs: die with the launcher, and run below the dispatcher (ops/processes.py)."""
        _die_with_launcher()
        if self.lower is not None:
            self.lower()

    def tend(self) -> None:
        """Start the child again when it died and its backoff is over."""
        now = time.monotonic()
        if self.proc is not None and self.proc.poll() is not None and self.restart_at is None:
            if now - self.started_at >= HEALTHY_AFTER_S:
                self.failures = 0
            delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2**self.failures)
            self.failures += 1
            self.restart_at = now + delay
            say("setup", f"{self.name} exited with status {self.proc.returncode}; restarting it in {delay:g} s")
        if self.restart_at is not None and now >= self.restart_at:
            say("setup", f"restarting {self.name}")
            self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def say(who: str, line: str) -> None:
    color = COLORS.get(who, "0") if sys.stdout.isatty() else None
    prefix = f"\033[{color}m{who:>6} |\033[0m " if color else f"{who:>6} | "
    with _print_lock:
        sys.stdout.write(prefix + line.rstrip("\n") + "\n")
        sys.stdout.flush()


def _pump(name: str, proc: subprocess.Popen) -> None:
    assert proc.stdout is not None
    for raw in proc.stdout:
        say(name, raw.decode("utf-8", "replace"))


def _manage(*args: str, env: dict) -> None:
    """`manage.py <args>` in a process of its own, its output shown line by line as it comes (a first start's
    migrations and image build take minutes: the terminal says what is going on meanwhile)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", *args],
        env={"DJANGO_SETTINGS_MODULE": "trainyard.settings", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    for raw in proc.stdout:
        say("setup", raw.decode("utf-8", "replace"))
    if proc.wait() != 0:
        raise embedded.ServiceError(f"'manage.py {' '.join(args)}' failed (output above)")


# Whether a local TensorBoard may still run: an active local route. Read with one connection instead of a Django
# process (2-3 s of start-up on every stop, nearly always to find none).
ACTIVE_LOCAL_TENSORBOARD_SQL = (
    "SELECT EXISTS (SELECT 1 FROM jobs_tensorboardroute WHERE state = 'active' AND backend = 'local')"
)


def _tensorboards_may_run(database_url: str) -> bool:
    """False only when the database answers that no local TensorBoard route is active; any doubt (no answer, a
    schema that differs) is True, and the caller runs the full clean-up."""
    import psycopg

    try:
        url = database_url.replace("postgres://", "postgresql://", 1)
        with psycopg.connect(url, connect_timeout=5) as conn:
            return bool(conn.execute(ACTIVE_LOCAL_TENSORBOARD_SQL).fetchone()[0])
    except (psycopg.Error, ValueError):
        return True


def _missing_tools() -> list[tuple[str, str]]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trainyard.settings")
    from ops.health import missing_tools

    return missing_tools()


READY_WAIT_S = 60  # after this long without /readyz, say so (and keep probing, less often)


def _probe(url: str, why: str) -> tuple[bool, str]:
    """(ready, why not): one GET of /readyz; `why` is kept when the answer says nothing new."""
    try:
        with urllib.request.urlopen(url + "readyz", timeout=3) as resp:
            if resp.status == 200:
                return True, ""
    except urllib.error.HTTPError as exc:  # 503: say which checks fail if it stays so
        try:
            why = "failing: " + ", ".join(json.loads(exc.read()).get("failed", []))
        except ValueError:
            pass
    except Exception:  # noqa: BLE001 - not up yet
        pass
    return False, why


def _announce(url: str, *, embedded_services: bool) -> None:
    say("setup", f"Trainyard is ready at {url}  (API {url}api/docs/, admin {url}admin/)")
    say("setup", "login: admin (staff) and demo (demo team); passwords were printed when first created,")
    say("setup", "       or set TRAINYARD_ADMIN_PASSWORD / TRAINYARD_DEMO_PASSWORD")
    say("setup", f"data lives in {VAR_DIR} ({'embedded' if embedded_services else 'configured'} services)")
    say("setup", "press Ctrl-C to stop")


def main() -> int:
    port = processes.PORT
    host = processes.HOST
    if embedded.port_open(host if host != "0.0.0.0" else "127.0.0.1", port, timeout=0.3):
        print(
            f"trainyard: port {port} is in use: stop what uses it or set TRAINYARD_PORT to a free port", file=sys.stderr
        )
        return 1
    for name in processes.NAMES:  # a process variable that does not parse stops the start now, not after the set-up
        processes.environment(name)
        processes.niceness(name)
    missing = _missing_tools()
    if missing:
        packages = " ".join(sorted({p for _, p in missing}))
        print(
            f"trainyard: {', '.join(t for t, _ in missing)} missing: jobs and image builds need them; run "
            f"'sudo apt-get install -y {packages}' (make run installs them itself when run as root)",
            file=sys.stderr,
        )
        return 1
    try:
        say("setup", "starting services (configured, else embedded under var/)")
        urls, services = embedded.ensure_services()
    except embedded.ServiceError as exc:
        print(f"trainyard: {exc}", file=sys.stderr)
        return 1
    env = {**os.environ, **urls, "PYTHONUNBUFFERED": "1"}
    children: list[Child] = []
    stop_signals: list[int] = []

    def stop(signum, _frame) -> None:
        stop_signals.append(signum)  # only a flag: a handler that takes a lock can deadlock the loop it interrupts

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    code = 0
    try:
        _manage("prepare", env=env)  # migrate, collectstatic, seed (with the offline base) in one process
        for name in processes.NAMES if not stop_signals else ():
            child = Child(
                name,
                [sys.executable, "-m", *processes.command(name, host=host, port=port)],
                {**env, **processes.environment(name, env)},
            )
            child.start()
            children.append(child)
        url = f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}/"
        started = time.monotonic()
        ready, warned, why, next_probe = False, False, "no answer from /readyz", started
        while not stop_signals:
            for child in children:
                child.tend()
            now = time.monotonic()
            if not ready and now >= next_probe:  # every 0.5 s for a minute, then every 2 s (a slow, busy start)
                ready, why = _probe(url, why)
                if ready:
                    _announce(url, embedded_services=bool(services.procs))
                elif not warned and now - started >= READY_WAIT_S:
                    warned = True
                    say("setup", f"Trainyard is NOT ready after 60 s ({why}); see {url}readyz — still starting up")
                    say("setup", "it says so here once /readyz answers")
                next_probe = now + (0.5 if now - started < READY_WAIT_S else 2)
            time.sleep(0.2)
    except embedded.ServiceError as exc:
        print(f"trainyard: {exc}", file=sys.stderr)
        code = 1
    finally:
        say("setup", "stopping")
        for child in children:
            if child.alive():
                # The child's main process only, as Kubernetes signals a container's first process: it stops its own
                # workers (uvicorn's, Celery's pool) after they finish what they run. SIGTERM to the whole group also
                # hit Celery's pool processes mid-task, and a prefork worker whose pool died under its shutdown could
                # hang there (seen once in the fault suite: no exit within 60 s).
                os.kill(child.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for child in children:
            if child.proc is None:
                continue
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
        if children and _tensorboards_may_run(env.get("DATABASE_URL", "")):
            try:  # the jobs' TensorBoards run in sessions of their own: stop them before the database goes
                _manage("tensorboard_stop", env=env)
            except embedded.ServiceError as exc:
                say("setup", str(exc))
        services.stop()
        say("setup", "stopped")
    return code


if __name__ == "__main__":
    sys.exit(main())
