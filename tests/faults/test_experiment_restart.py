"""An experiment outlives the platform's processes: `make run`'s launcher runs a small grid search (5 trials of a
script on the platform's interpreter that reports a loss, at most 2 at once); mid-way, with trials running and
more to submit, the worker and beat are killed with SIGKILL and the launcher starts them again. Nothing of the
experiment lives in those processes' memory (docs/experiments.md, "The periodic pass"): the experiment must go
on from the database and complete with every trial ended, each trial's script run once, as many trials as
max_trials, never more than 2 running at once, and the best trial recorded.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from kernel import proctree
from ops import embedded
from tests.faults.harness import Launcher, http
from tests.faults.test_outages import make_token, platform_env, servers  # noqa: F401 - the fixture

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(420)]

TRIALS = 5
STEPS = 6
# Each run appends a line to its trial's marker file (one file per grid point), then reports a loss per step that
# is lower the larger x is: trial 5 (x = 5) is the best.
SCRIPT = (
    'echo "run $TRAINYARD_ATTEMPT" >> "$MARKS/x-{{x}}"; python -c \''
    "import json, time\n"
    "for step in range(1, {{max_steps}} + 1):\n"
    "    time.sleep(1)\n"
    '    print("TRAINYARD_METRIC", json.dumps(dict(step=step, loss=round(1.0 / ({{x}} * step), 6))), flush=True)\n'
    "'"
)


def _experiment(pg, experiment_id: str) -> tuple[str, list[tuple]]:
    state = pg.query("SELECT state FROM experiments_experiment WHERE id = %s", (experiment_id,))[0][0]
    trials = pg.query(
        "SELECT t.number, t.state, j.state, j.started_at, j.finished_at FROM experiments_trial t "
        "JOIN jobs_job j ON j.id = t.job_id WHERE t.experiment_id = %s ORDER BY t.number",
        (experiment_id,),
    )
    return state, trials


def test_an_experiment_completes_across_killed_worker_and_beat(servers, tmp_path):  # noqa: F811
    pg, redis = servers
    port = embedded.free_port()
    env = {
        **platform_env(tmp_path, pg, redis, port),
        "TRAINYARD_EXPERIMENT_ADVANCE_S": "1",
        "TRAINYARD_METRIC_SCAN_INTERVAL_S": "1",
    }
    base = f"http://127.0.0.1:{port}"
    marks = tmp_path / "marks"
    marks.mkdir()
    launcher = Launcher(env)
    try:
        launcher.wait_for("Trainyard is ready", seconds=300)
        token = make_token(env)
        definition = {
            "name": "restart-sweep",
            "team": "demo",
            "template": {
                "queue": "train",
                "spec": "shared",
                "image": "python-3.11",
                "command": ["sh", "-c", SCRIPT],
                "env": {"MARKS": str(marks)},
                "max_retries": 0,
            },
            "space": {"x": {"type": "int", "min": 1, "max": TRIALS}},
            "searcher": {"name": "grid", "max_steps": STEPS},
            "metric": "loss",
            "direction": "minimize",
            "max_trials": TRIALS,
            "max_concurrent": 2,
        }
        status, _, created = http(f"{base}/api/v1/experiments/", method="POST", token=token, body=definition)
        assert status == 201, created
        experiment_id = created["id"]

        # Mid-way: the first trials have ended and their successors run, more are still to be submitted.
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            state, trials = _experiment(pg, experiment_id)
            if len(trials) >= 3 and any(row[2] == "running" for row in trials[2:]):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the experiment did not get under way: {_experiment(pg, experiment_id)}")
        assert state == "running" and len(trials) < TRIALS, (state, trials)
        mark = len(launcher.lines)
        os.kill(launcher.child("worker"), signal.SIGKILL)
        os.kill(launcher.child("beat"), signal.SIGKILL)
        launcher.wait_for("worker exited with status -9; restarting it", seconds=30, after=mark)
        launcher.wait_for("beat exited with status -9; restarting it", seconds=30, after=mark)

        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            state, trials = _experiment(pg, experiment_id)
            if state != "running":
                break
            time.sleep(1)
        assert launcher.wait_for("restarting worker", seconds=1, after=mark) >= mark
        assert launcher.wait_for("restarting beat", seconds=1, after=mark) >= mark
        state, trials = _experiment(pg, experiment_id)
        assert state == "completed", (state, trials)
        assert [row[0] for row in trials] == list(range(1, TRIALS + 1)), trials
        assert [(row[1], row[2]) for row in trials] == [("completed", "succeeded")] * TRIALS, trials
        # No trial submitted twice: one job per trial, each labelled with its experiment.
        labelled = pg.query("SELECT count(*) FROM jobs_job WHERE labels->>'experiment' = %s", (experiment_id,))
        assert labelled == [(TRIALS,)], labelled
        for x in range(1, TRIALS + 1):  # each grid point's script ran once
            assert (marks / f"x-{x}").read_text() == "run 1\n", x
        # Never more than max_concurrent running at once, across the restart.
        edges = sorted([(row[3], 1) for row in trials] + [(row[4], -1) for row in trials], key=lambda e: (e[0], e[1]))
        running, peak = 0, 0
        for _, delta in edges:
            running += delta
            peak = max(peak, running)
        assert peak <= 2, trials

        status, _, body = http(f"{base}/api/v1/experiments/{experiment_id}/", token=token)
        assert status == 200, body
        summary = body["summary"]
        assert (summary["trials"], summary["by_state"]) == (TRIALS, {"completed": TRIALS}), summary
        assert summary["best_trial"] == TRIALS and summary["best_params"] == {"x": TRIALS}, summary
        assert summary["best_value"] == pytest.approx(1.0 / (TRIALS * STEPS), abs=1e-6), summary
        assert pg.query("SELECT count(*) FROM cluster_logicaldevice WHERE released_at IS NULL") == [(0,)]
        assert pg.query("SELECT count(*) FROM jobs_job WHERE reserved") == [(0,)]
    finally:
        if launcher.proc.poll() is None:
            os.killpg(launcher.proc.pid, signal.SIGKILL)
        for (job_id,) in pg.query("SELECT id::text FROM jobs_job", quiet=True) or []:
            proctree.signal_all(proctree.tagged(job_id, 1), signal.SIGKILL)
