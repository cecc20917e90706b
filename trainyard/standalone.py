"""`make run`: the whole platform on this machine, in the foreground.

Uses the PostgreSQL and Redis named by DATABASE_URL / REDIS_URL, or embedded ones kept under var/;
migrates, seeds, then runs web (ASGI), a Celery worker and Celery beat as children with prefixed
output. Ctrl-C or SIGTERM stops every child and the embedded servers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

from trainyard import embedded, processes
from trainyard.paths import BASE_DIR, VAR_DIR

COLORS = {"web": "36", "worker": "33", "beat": "35", "setup": "32"}
_print_lock = threading.Lock()


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
    result = subprocess.run(
        [sys.executable, str(BASE_DIR / "manage.py"), *args], env=env, capture_output=True, text=True
    )
    for line in (result.stdout + result.stderr).splitlines():
        say("setup", line)
    if result.returncode != 0:
        raise embedded.ServiceError(f"'manage.py {' '.join(args)}' failed (output above)")


def main() -> int:
    port = processes.PORT
    host = processes.HOST
    if embedded.port_open(host if host != "0.0.0.0" else "127.0.0.1", port, timeout=0.3):
        print(
            f"trainyard: port {port} is in use: stop what uses it or set TRAINYARD_PORT to a free port", file=sys.stderr
        )
        return 1
    try:
        say("setup", "starting services (configured, else embedded under var/)")
        urls, services = embedded.ensure_services()
    except embedded.ServiceError as exc:
        print(f"trainyard: {exc}", file=sys.stderr)
        return 1
    env = {**os.environ, **urls, "PYTHONUNBUFFERED": "1"}
    children: list[tuple[str, subprocess.Popen]] = []
    stopping = threading.Event()

    def stop(*_args) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    code = 0
    try:
        _manage("migrate", "--noinput", env=env)
        _manage("collectstatic", "--noinput", "-v", "0", env=env)
        _manage("seed", env=env)
        for name in processes.NAMES:
            proc = subprocess.Popen(
                [sys.executable, "-m", *processes.command(name, host=host, port=port)],
                env={**env, **processes.environment(name, env)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=BASE_DIR,
            )
            children.append((name, proc))
            threading.Thread(target=_pump, args=(name, proc), daemon=True).start()
        url = f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}/"
        deadline = time.monotonic() + 60
        while not stopping.is_set() and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url + "readyz", timeout=3) as resp:
                    if resp.status == 200:
                        break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if any(p.poll() is not None for _, p in children):
                break
            time.sleep(0.5)
        if not stopping.is_set() and all(p.poll() is None for _, p in children):
            say("setup", f"Trainyard is ready at {url}  (API {url}api/docs/, admin {url}admin/)")
            say("setup", "login: admin (staff) and demo (demo team); passwords were printed when first created,")
            say("setup", "       or set TRAINYARD_ADMIN_PASSWORD / TRAINYARD_DEMO_PASSWORD")
            say("setup", f"data lives in {VAR_DIR} ({'embedded' if services.procs else 'configured'} services)")
            say("setup", "press Ctrl-C to stop")
        while not stopping.is_set():
            dead = [(n, p) for n, p in children if p.poll() is not None]
            if dead:
                name, proc = dead[0]
                say("setup", f"{name} exited with status {proc.returncode}; stopping everything")
                code = 1
                break
            stopping.wait(0.5)
    except embedded.ServiceError as exc:
        print(f"trainyard: {exc}", file=sys.stderr)
        code = 1
    finally:
        say("setup", "stopping")
        for _name, proc in children:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for _name, proc in children:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        services.stop()
        say("setup", "stopped")
    return code


if __name__ == "__main__":
    sys.exit(main())
