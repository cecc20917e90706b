"""The supervisor of one local attempt: `python -m jobs.backends.local_runner ATTEMPT_FOLDER`.

Started detached by the local backend, so it outlives a Celery worker that dies. It runs the command as
its own process group, copies its output into the log store, and when the command ends writes
`status.json` (exit code or signal). SIGTERM asks it to stop the job: SIGTERM to the whole group, then
SIGKILL after the grace period. A restarted worker finds the attempt again through `runner.pid` and
`status.json`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from jobs.backends import sandbox


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _stop_group(child: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the command's whole group now, SIGKILL after the grace period."""
    try:
        os.killpg(child.pid, signal.SIGTERM)
    except ProcessLookupError:
        return

    def escalate() -> None:
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if child.poll() is not None:
                break
            time.sleep(0.05)
        try:
            os.killpg(child.pid, signal.SIGKILL)  # also whatever the command left behind in its group
        except ProcessLookupError:
            pass

    threading.Thread(target=escalate, daemon=True).start()


def main(folder: Path) -> int:
    spec = json.loads((folder / "spec.json").read_text())
    from jobs.logstore import LogWriter  # imported late: the logstore needs no Django settings when given budgets

    writer = LogWriter(Path(spec["log_dir"]), budget_bytes=spec["budget_bytes"], budget_lines=spec["budget_lines"])
    cwd = Path(spec["cwd"])
    cwd.mkdir(parents=True, exist_ok=True)
    stop_requested = threading.Event()
    child: subprocess.Popen | None = None
    grace = float(spec.get("grace_s", 10))

    def on_term(_signum, _frame) -> None:
        if stop_requested.is_set():
            return
        stop_requested.set()
        if child is not None:
            _stop_group(child, grace)

    # Installed before the command starts: a stop that arrives early must still stop the job, not the supervisor.
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if (folder / "cancel").exists():
        stop_requested.set()  # cancelled before this supervisor could take signals
    try:
        child = subprocess.Popen(
            sandbox.wrap(spec.get("sandbox"), spec["argv"]),
            cwd=cwd,
            env=spec["env"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        writer.write_line(f"[trainyard] could not start the command: {exc}")
        writer.close()
        _write_json(
            folder / "status.json",
            {"exit_code": 127, "signal": None, "cancelled": False, "reason": "StartError", "ended_at": time.time()},
        )
        return 0
    _write_json(folder / "child.json", {"pid": child.pid, "pgid": child.pid, "started_at": time.time()})
    if stop_requested.is_set():
        _stop_group(child, grace)
    assert child.stdout is not None
    fd = child.stdout.fileno()
    partial = b""
    while True:
        # os.read returns whatever the pipe holds: busy jobs are written in big batches, and a quiet job's
        # last line is flushed at once instead of waiting in a buffer for the next one.
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        lines = (partial + chunk).split(b"\n")
        partial = lines.pop()
        for line in lines:
            writer.write_line(line)
        writer.flush(lazy=True)
    if partial:
        writer.write_line(partial)
    code = child.wait()
    try:
        os.killpg(child.pid, signal.SIGKILL)  # orphans of the command must not hold the GPU
    except (ProcessLookupError, PermissionError):
        pass
    writer.close()
    reason = ""
    if stop_requested.is_set():
        try:  # the platform may say why it stopped the command (e.g. GpuShareExceeded)
            reason = (folder / "cancel").read_text().strip()[:100]
        except OSError:
            pass
    _write_json(
        folder / "status.json",
        {
            "exit_code": code if code >= 0 else None,
            "signal": -code if code < 0 else None,
            "cancelled": stop_requested.is_set(),
            "reason": reason,
            "ended_at": time.time(),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
