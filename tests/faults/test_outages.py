"""An operator's afternoon against the whole platform as `make run` starts it, on a PostgreSQL and a Redis of the
test's own: PostgreSQL stopped while jobs are being admitted and started, the worker killed with SIGKILL, Redis
restarted (its queued messages lost), the worker's process group stopped while jobs start, then the launcher
itself killed with SIGKILL. Every job must end exactly
once with nothing held, the API must answer JSON 503s during the outages, and nothing may outlive the launcher.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kernel import proctree
from kernel.paths import BASE_DIR
from ops import embedded
from tests.faults.harness import Launcher, PrivatePostgres, PrivateRedis, http

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(600)]
TERMINAL = ("succeeded", "failed", "cancelled", "timed_out")


@pytest.fixture
def servers(tmp_path):
    pg, redis = PrivatePostgres(tmp_path / "pg"), PrivateRedis(tmp_path / "redis")
    pg.start()
    redis.start()
    yield pg, redis
    redis.stop()
    pg.stop()


def platform_env(tmp_path, pg, redis, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_", "CELERY_"))}
    env.update(
        DATABASE_URL=pg.url,
        REDIS_URL=redis.url,
        TRAINYARD_VAR_DIR=str(tmp_path / "var"),
        TRAINYARD_PORT=str(port),
        TRAINYARD_WEB_PROCESSES="1",
        TRAINYARD_WORKER_CONCURRENCY="2",
        TRAINYARD_ADMIN_PASSWORD="admin-pass-123",
        TRAINYARD_DEMO_PASSWORD="demo-pass-123",
        TRAINYARD_LOCAL_GPUS="4x24GiB",
        TRAINYARD_TELEMETRY_SOURCE="none",
        TRAINYARD_OBSERVE_EVERY_S="1",
        TRAINYARD_LIFECYCLE_RECONCILE_S="2",
        TRAINYARD_START_OVERDUE_S="5",
        TRAINYARD_HEARTBEAT_S="2",
        TRAINYARD_BEAT_STALE_S="20",
        TRAINYARD_CANCEL_GRACE_S="2",
        TRAINYARD_LOG_FORMAT="console",
        # The jobs record each run in a marker file outside their own folders, which the sandbox (rightly)
        # forbids; the sandbox has its own suite (jobs/tests/test_sandbox.py).
        TRAINYARD_SANDBOX="off",
        TRAINYARD_OFFLINE_BASE="off",  # outages, not images: each fresh var/ would build python-local (~30 s)
    )
    return env


def make_token(env: dict[str, str]) -> str:
    script = (
        "from django.contrib.auth import get_user_model\n"
        "from quotas.tokens import token_create\n"
        "print('TOKEN', token_create(user=get_user_model().objects.get(username='demo'), name='faults')[1])\n"
    )
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script], env=env, cwd=BASE_DIR, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("TOKEN "))


def job_body(marks) -> dict:
    return {
        "team": "demo",
        "queue": "train",
        "spec": "shared",
        "image": "python-3.11",
        "command": ["sh", "-c", 'echo "run $TRAINYARD_ATTEMPT" >> "$MARKS"; sleep 2'],
        "env": {"MARKS": str(marks)},
    }


def alive(pids) -> set[int]:
    return {pid for pid in pids if (st := proctree._stat(pid)) is not None and st[1] != "Z"}


def kill_everything(launcher: Launcher, descendants: set[int]) -> None:
    """After a test: the launcher and every process below it. Its children run in sessions of their own, so a failure
    before the test collected them must not leave one behind (a worker hung in its shutdown outlived a failed run,
    its parent-death SIGTERM already spent)."""
    if launcher.proc.poll() is None:
        descendants = descendants | proctree.descendants(launcher.proc.pid)
        os.killpg(launcher.proc.pid, signal.SIGKILL)
    proctree.signal_all(alive(descendants), signal.SIGKILL)


def test_outages_and_kills_strand_nothing(servers, tmp_path):
    pg, redis = servers
    port = embedded.free_port()
    env = platform_env(tmp_path, pg, redis, port)
    base = f"http://127.0.0.1:{port}"
    launcher = Launcher(env)
    descendants: set[int] = set()
    try:
        launcher.wait_for("Trainyard is ready", seconds=300)
        token = make_token(env)
        jobs = {}
        for i in range(3):
            status, _, body = http(
                f"{base}/api/v1/jobs/", method="POST", token=token, body=job_body(tmp_path / f"marks-{i}"),
                headers={"Idempotency-Key": f"outage-{i}"},
            )  # fmt: skip
            assert status == 201, body
            jobs[body["id"]] = tmp_path / f"marks-{i}"

        # PostgreSQL goes away while those jobs are admitted and started, and the worker is killed meanwhile.
        pg.stop()
        status, head, body = http(f"{base}/api/v1/jobs/", token=token)
        assert (status, body["code"]) == (503, "database_unavailable") and int(head["Retry-After"]) > 0
        status, _, body = http(f"{base}/api/v1/jobs/", method="POST", token=token, body=job_body(tmp_path / "x"))
        assert (status, body["code"]) == (503, "database_unavailable")  # refused, so nothing to keep
        mark = len(launcher.lines)
        os.kill(launcher.child("worker"), signal.SIGKILL)
        launcher.wait_for("worker exited with status -9; restarting it", seconds=30, after=mark)
        time.sleep(12)
        pg.start()

        # Redis restarts: every queued wake-up is lost; the API says so in JSON meanwhile.
        redis.stop()
        status, head, body = http(f"{base}/api/v1/jobs/", token=token)
        assert (status, body["code"]) == (503, "broker_unavailable") and int(head["Retry-After"]) > 0
        status, _, body = http(f"{base}/readyz")
        assert status == 503 and "redis" in body["failed"]
        time.sleep(3)
        redis.start()

        # Two more jobs, and the worker gets SIGTERM (what a stop sends its main process) while they start.
        for i in (3, 4):
            status, _, body = http(
                f"{base}/api/v1/jobs/", method="POST", token=token, body=job_body(tmp_path / f"marks-{i}"),
                headers={"Idempotency-Key": f"outage-{i}"},
            )  # fmt: skip
            assert status == 201, body
            jobs[body["id"]] = tmp_path / f"marks-{i}"
        mark = len(launcher.lines)
        os.kill(launcher.child("worker"), signal.SIGTERM)
        launcher.wait_for("restarting worker", seconds=60, after=mark)

        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            rows = pg.query("SELECT id::text, state FROM jobs_job", quiet=True) or []
            if len(rows) == len(jobs) and all(state in TERMINAL for _, state in rows):
                break
            time.sleep(1)
        rows = dict(pg.query("SELECT id::text, state FROM jobs_job"))
        assert rows == dict.fromkeys(jobs, "succeeded"), rows
        for job_id, marks in jobs.items():
            finals = pg.query(
                "SELECT to_state FROM jobs_jobevent WHERE job_id = %s AND kind = 'state' AND to_state = ANY(%s)",
                (job_id, list(TERMINAL)),
            )
            assert finals == [("succeeded",)], (job_id, finals)
            assert marks.read_text() == "run 1\n", (job_id, marks.read_text())  # one attempt, run once
            numbers = [n for (n,) in pg.query("SELECT number FROM jobs_attempt WHERE job_id = %s", (job_id,))]
            assert all(not proctree.tagged(job_id, n) for n in numbers)
        assert pg.query("SELECT count(*) FROM cluster_logicaldevice WHERE released_at IS NULL") == [(0,)]
        assert pg.query("SELECT count(*) FROM jobs_job WHERE reserved") == [(0,)]

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status, _, body = http(f"{base}/readyz")
            if status == 200:
                break
            time.sleep(1)
        assert status == 200, body
        assert body["loops"]["jobs.reconcile_lifecycle"]["overdue"] is False

        # The launcher killed with SIGKILL: every child (web, worker, beat and theirs) follows it.
        descendants = proctree.descendants(launcher.proc.pid)
        assert len(descendants) >= 3
        os.kill(launcher.proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while alive(descendants) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(descendants), "children outlived the launcher"
        assert not embedded.port_open("127.0.0.1", port, 0.5)
    finally:
        kill_everything(launcher, descendants)


def test_sigterm_stops_the_launcher_and_every_child(tmp_path):
    """On an empty database (the other launcher tests start from a migrated copy): `make run`'s first start on a new
    machine, its migrations and seed included, comes up, and SIGTERM then stops it and every child."""
    pg, redis = PrivatePostgres(tmp_path / "pg", empty=True), PrivateRedis(tmp_path / "redis")
    pg.start()
    redis.start()
    port = embedded.free_port()
    launcher = Launcher(platform_env(tmp_path, pg, redis, port))
    descendants: set[int] = set()
    try:
        launcher.wait_for("Trainyard is ready", seconds=300)
        assert launcher.wait_for("Applying jobs.0001_initial", seconds=1) >= 0  # the migrations ran here
        descendants = proctree.descendants(launcher.proc.pid)
        launcher.proc.send_signal(signal.SIGTERM)
        assert launcher.proc.wait(timeout=40) == 0
        launcher.wait_for("stopped", seconds=5)
        deadline = time.monotonic() + 10
        while alive(descendants) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(descendants)
    finally:
        kill_everything(launcher, descendants)
        redis.stop()
        pg.stop()


def test_a_running_job_outlives_a_stop_and_is_adopted_by_the_next_start(servers, tmp_path):
    """What the README promises: `make run` stopped (SIGTERM) while a job runs leaves the job running; the next start
    adopts it (observes it to its end, its checkpoints saved through the embedded SeaweedFS that came back), and it
    runs once."""
    pg, redis = servers
    port = embedded.free_port()
    env = {**platform_env(tmp_path, pg, redis, port), "TRAINYARD_CHECKPOINT_SYNC_S": "1"}
    base = f"http://127.0.0.1:{port}"
    go = tmp_path / "go"
    launchers = [Launcher(env)]
    job_id = ""
    try:
        launchers[0].wait_for("Trainyard is ready", seconds=300)
        token = make_token(env)
        body = job_body(tmp_path / "marks")
        body["command"] = [
            "sh", "-c",
            'echo "run $TRAINYARD_ATTEMPT" >> "$MARKS"; printf one > "$TRAINYARD_CHECKPOINT_DIR/ckpt-1.pt"; '
            f'while [ ! -e "{go}" ]; do sleep 0.2; done; printf two > "$TRAINYARD_CHECKPOINT_DIR/ckpt-2.pt"; sleep 2',
        ]  # fmt: skip
        status, _, created = http(f"{base}/api/v1/jobs/", method="POST", token=token, body=body)
        assert status == 201, created
        job_id = created["id"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and pg.query("SELECT name FROM jobs_checkpoint", quiet=True) != [
            ("ckpt-1.pt",)
        ]:
            time.sleep(0.5)
        assert pg.query("SELECT state FROM jobs_job WHERE id = %s", (job_id,)) == [("running",)]
        launchers[0].proc.send_signal(signal.SIGTERM)
        assert launchers[0].proc.wait(timeout=60) == 0
        assert proctree.tagged(job_id, 1), "the job did not outlive the stop of make run"
        launchers.append(Launcher(env))
        launchers[1].wait_for("Trainyard is ready", seconds=300)
        go.touch()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if pg.query("SELECT state FROM jobs_job WHERE id = %s", (job_id,))[0][0] in TERMINAL:
                break
            time.sleep(1)
        assert pg.query("SELECT state FROM jobs_job WHERE id = %s", (job_id,)) == [("succeeded",)]
        assert (tmp_path / "marks").read_text() == "run 1\n"
        names = {n for (n,) in pg.query("SELECT name FROM jobs_checkpoint WHERE job_id = %s", (job_id,))}
        assert names == {"ckpt-1.pt", "ckpt-2.pt"}, names
        assert not proctree.tagged(job_id, 1)
    finally:
        for launcher in launchers:
            if launcher.proc.poll() is None:
                os.killpg(launcher.proc.pid, signal.SIGKILL)
        if job_id:
            proctree.signal_all(proctree.tagged(job_id, 1), signal.SIGKILL)
