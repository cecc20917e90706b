"""The broker crashes under the running platform: the embedded Redis (as `make run` starts it: append-only file,
password, kept port) is killed with SIGKILL while `make run`'s worker and dispatcher hold delivered, unacknowledged
messages (PostgreSQL frozen, so their tasks hang mid-way), and started again on the same port; then once more,
briefly, while jobs start. The worker and the dispatcher must reconnect by themselves (the same processes, no
restart by the launcher) and go on consuming; whatever the crash lost must be re-driven by beat's level-triggered
passes, each job run once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kernel import proctree
from ops import embedded
from tests.faults.harness import EmbeddedRedis, Launcher, PrivatePostgres, http
from tests.faults.test_outages import TERMINAL, job_body, make_token, platform_env

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def servers(tmp_path):
    pg, redis = PrivatePostgres(tmp_path / "pg"), EmbeddedRedis(tmp_path / "redis-var")
    pg.start()
    redis.start()
    yield pg, redis
    redis.stop()
    pg.stop()


def _wait_terminal(pg, ids, seconds: float) -> dict[str, str]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rows = dict(pg.query("SELECT id::text, state FROM jobs_job WHERE id::text = ANY(%s)", (list(ids),)) or [])
        if len(rows) == len(ids) and all(state in TERMINAL for state in rows.values()):
            return rows
        time.sleep(1)
    return dict(pg.query("SELECT id::text, state FROM jobs_job WHERE id::text = ANY(%s)", (list(ids),)))


def _send(broker_url: str, task: str, args: list, queue: str) -> None:
    """A task message to the platform's broker, as its own processes send them."""
    from celery import Celery

    app = Celery("faults-sender", broker=broker_url, set_as_current=False)
    try:
        app.send_task(task, args=args, queue=queue)
    finally:
        app.close()


def test_worker_and_dispatcher_survive_a_broker_crash(servers, tmp_path):
    pg, redis = servers
    port = embedded.free_port()
    env = platform_env(tmp_path, pg, redis, port)
    base = f"http://127.0.0.1:{port}"
    launcher = Launcher(env)
    job_ids: list[str] = []
    try:
        launcher.wait_for("Trainyard is ready", seconds=300)
        token = make_token(env)
        worker, dispatcher = launcher.child("worker"), launcher.child("dispatcher")

        def submit(i: int) -> str:
            status, _, body = http(
                f"{base}/api/v1/jobs/", method="POST", token=token, body=job_body(tmp_path / f"marks-{i}"),
                headers={"Idempotency-Key": f"broker-{i}"},
            )  # fmt: skip
            assert status == 201, body
            job_ids.append(body["id"])
            return body["id"]

        # Jobs in flight, PostgreSQL frozen: their dispatch and start messages are delivered and held unacked by
        # tasks hanging on the database when the broker dies. The platform's own messages may all be done by the
        # time the database freezes (a pass and a start take milliseconds on a kept connection), so two more are
        # sent while it is frozen: beat's pass to the dispatcher and the jobs' starts again to the worker (both
        # acknowledged only when done; a start is idempotent, so each job still runs once).
        mark = len(launcher.lines)
        for i in range(3):
            submit(i)
        attempts = [row[0] for row in pg.query(
            "SELECT id FROM jobs_attempt WHERE job_id::text = ANY(%s)", (list(job_ids),)
        )]  # fmt: skip
        pg.freeze(True)
        try:
            _send(redis.url, "jobs.dispatch_all", [], "trainyard.dispatch")
            if attempts:
                _send(redis.url, "jobs.start_attempts", [attempts], "trainyard")
            time.sleep(3)
            redis.crash()  # SIGKILL: no goodbye to its clients
            time.sleep(4)
            redis.start()  # the same port, with what its append-only file kept
            time.sleep(2)
        finally:
            pg.freeze(False)
        submit(3)
        redis.crash()  # again, briefly, while that job is dispatched and started
        time.sleep(0.5)
        redis.start()

        rows = _wait_terminal(pg, job_ids, 150)
        assert rows == dict.fromkeys(job_ids, "succeeded"), rows

        # The same processes consume again: a job submitted after the crash goes through them.
        after = submit(4)
        rows = _wait_terminal(pg, [after], 120)
        assert rows == {after: "succeeded"}, rows
        restarts = [line for line in launcher.lines[mark:] if "exited with status" in line]
        assert not restarts, restarts
        # The premise: the crash met messages delivered and not yet acknowledged.
        assert any("unacknowledged message" in line for line in launcher.lines[mark:]), launcher.lines[mark:][-60:]
        assert launcher.child("worker") == worker and launcher.child("dispatcher") == dispatcher
        assert proctree._stat(worker) is not None and proctree._stat(dispatcher) is not None

        for i, job_id in enumerate(job_ids):
            assert (tmp_path / f"marks-{i}").read_text() == "run 1\n", job_id  # one attempt, run once
        assert pg.query("SELECT count(*) FROM cluster_logicaldevice WHERE released_at IS NULL") == [(0,)]
        assert pg.query("SELECT count(*) FROM jobs_job WHERE reserved") == [(0,)]
    finally:
        if launcher.proc.poll() is None:
            os.killpg(launcher.proc.pid, signal.SIGKILL)
        for job_id in job_ids:
            proctree.signal_all(proctree.tagged(job_id, 1), signal.SIGKILL)


@pytest.mark.parametrize("name", ["worker", "dispatcher"])
def test_a_worker_never_stops_trying_a_broker_that_stays_down(tmp_path, name):
    """Celery's default gives a broker 100 tries (about 45 minutes) and then ends the process ("Unrecoverable
    error"), leaving a bare service down for good; the platform's workers keep trying for as long as it takes."""
    from ops import processes

    dead = f"redis://127.0.0.1:{embedded.free_port()}/0"  # nothing listens there
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_", "CELERY_", "PYTEST"))}
    env.update(REDIS_URL=dead, CELERY_BROKER_URL=dead, TRAINYARD_VAR_DIR=str(tmp_path / "var"))
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", *processes.command(name)], env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and log.read_text(errors="replace").count("Trying again") < 2:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        text = log.read_text(errors="replace")
        tries = [line for line in text.splitlines() if "Trying again" in line]
        assert len(tries) >= 2, text[-3000:]
        assert all(line.rstrip().endswith("/None)") for line in tries), tries  # no retry budget to run out of
        assert proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
