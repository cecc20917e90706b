"""Experiments end to end: a real local backend (sandboxed processes), a real Celery worker, the real metric path
(TRAINYARD_METRIC lines read from the job's log), a real S3 store for checkpoints, and the periodic passes."""

import io
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from experiments import search, services
from experiments.models import Experiment, Trial
from jobs import checkpoints, code, lifecycle
from jobs.models import Checkpoint, Job
from jobs.states import JobState
from monitoring import services as monitoring_services
from quotas.models import Team

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SPACE = {"lr": {"type": "log_uniform", "min": 0.002, "max": 0.3}, "batch": [4, 16]}


def upload_examples(user) -> str:
    """The examples folder as the team's code snapshot, packed as the CLI packs a folder."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(EXAMPLES / "train.py", arcname="train.py")
    body = buffer.getvalue()
    import hashlib

    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    code.snapshot_store(team=Team.objects.get(slug="demo"), digest=digest, body=io.BytesIO(body), user=user)
    return digest


def experiment_data(digest: str, **overrides) -> dict:
    data = {
        "name": "lr-sweep",
        "team": "demo",
        "template": {
            "queue": "train",
            "spec": "shared",
            "image": "python-3.11",
            "code": digest,
            "command": "python train.py --lr {{lr}} --batch {{batch}} --steps {{max_steps}} --step-seconds 0.1 "
            "--checkpoint-every 2",
            "max_retries": 0,
        },
        "space": SPACE,
        "searcher": {"name": "adaptive", "max_steps": 30, "min_steps": 5, "reduction": 3, "seed": 1},
        "metric": "loss",
        "direction": "minimize",
        "max_trials": 6,
        "max_concurrent": 1,
    }
    data.update(overrides)
    return data


def passes_until(predicate, *, timeout: float):
    """Run what beat would run (observe attempts, scan metrics, advance experiments) until predicate() holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lifecycle.attempts_observe()
        monitoring_services.business_metrics_scan()
        monitoring_services.usage_collect()
        services.experiments_advance()
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def replay(params_list, *, steps=30):
    """What ASHA must decide for these trials run one after another: the same script run here, directly."""
    at: dict[int, list[float]] = {}
    states = []
    for p in params_list:
        out = subprocess.run(
            [sys.executable, str(EXAMPLES / "train.py"), "--lr", str(p["lr"]), "--batch", str(p["batch"]),
             "--steps", str(steps)], capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        points = [(d["step"], d["loss"]) for d in (json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
                                                   if line.startswith("TRAINYARD_METRIC"))]  # fmt: skip
        state = "completed"
        for rung in (5, 15):
            value = search.value_at_rung(points, rung)
            at.setdefault(rung, []).append(value)
            if not search.asha_keep(value, at[rung], direction="minimize", reduction=3):
                state = "stopped_early"
                break
        states.append(state)
    return states


def test_an_adaptive_experiment_stops_trials_early_and_reports_the_best(
    platform, celery_worker_thread, checkpoint_store, settings
):
    settings.TRAINYARD_USAGE_INTERVAL_S = 0.2  # trials of a few seconds: sample their use often enough to see it
    digest = upload_examples(platform)
    experiment = services.experiment_create(user=platform, data=experiment_data(digest))
    assert experiment.code_digest == digest
    experiment = passes_until(
        lambda: (e := Experiment.objects.get(pk=experiment.pk)).state == Experiment.State.COMPLETED and e,
        timeout=240,
    )
    trials = list(experiment.trials.select_related("job").order_by("number"))
    assert len(trials) == 6
    expected = replay([t.params for t in trials])
    assert [t.state for t in trials] == expected
    assert expected.count("stopped_early") >= 2  # seed 1 stops trials 3, 4 and 6 at the first rung
    for trial in trials:
        job = trial.job
        assert job.labels["experiment"] == str(experiment.id) and job.labels["trial"] == str(trial.number)
        assert job.code_digest == digest  # every trial runs in the experiment's snapshot
        assert job.env["HP_LR"] == str(trial.params["lr"])
        assert f"--lr {trial.params['lr']} " in " ".join(job.command) + " "
        if trial.state == "stopped_early":
            # Not a failure: the job was cancelled by the searcher, and says so; its checkpoints are kept.
            assert job.state == JobState.CANCELLED and job.reason == "stopped_early"
            assert job.events.filter(to_state="cancelling", message__contains="stopped early").exists()
            assert Checkpoint.objects.filter(job=job, deleted_at=None).exists()
            assert trial.last_step < 30 and "5" in trial.rungs
        else:
            assert job.state == JobState.SUCCEEDED and trial.last_step == 30
        assert trial.curve and trial.gpu_seconds > 0
    best = min((t for t in trials if t.best_value is not None), key=lambda t: t.best_value)
    client = APIClient()
    client.force_login(platform)
    detail = client.get(f"/api/v1/experiments/{experiment.id}/").json()
    assert detail["state"] == "completed"
    assert detail["summary"]["best_trial"] == best.number
    assert detail["summary"]["best_value"] == pytest.approx(best.best_value)
    assert detail["summary"]["by_state"]["stopped_early"] == expected.count("stopped_early")
    rows = client.get(f"/api/v1/experiments/{experiment.id}/trials/?sort=best_value").json()
    assert rows[0]["number"] == best.number
    csv_text = client.get(f"/api/v1/experiments/{experiment.id}/trials/csv/").content.decode()
    assert csv_text.splitlines()[0].startswith("trial,state,job,lr,batch,best_loss")
    assert len(csv_text.splitlines()) == 7
    # Right-sizing: the ended trials' usage (their emulated GPU statements) made a recommendation.
    rec = experiment.recommendation
    assert rec and rec["scope"] == "experiment" and len(rec["based_on"]) >= 3, rec
    assert {str(t.job_id) for t in trials} >= set(rec["based_on"])
    # The trials state 900 + 40 x batch MiB (at most 1540): a shared slice (6 GiB) covers it.
    assert rec["peak_gpu_memory_mib"] <= 1540 and rec["fits_request"], rec
    # Run the best again with more steps: a new job, same parameters, {{max_steps}} = 40.
    response = client.post(f"/api/v1/experiments/{experiment.id}/rerun-best/", {"max_steps": 40}, format="json")
    assert response.status_code == 201, response.content
    rerun = Job.objects.get(pk=response.json()["id"])
    assert "--steps 40 " in " ".join(rerun.command) + " " and f"--lr {best.params['lr']} " in " ".join(rerun.command)
    assert rerun.labels == {"experiment": str(experiment.id), "rerun-of-trial": str(best.number)}
    assert not hasattr(rerun, "trial") or Trial.objects.filter(job=rerun).count() == 0


def test_pause_stops_trials_and_resume_continues_them_from_their_checkpoints(
    platform, celery_worker_thread, checkpoint_store
):
    digest = upload_examples(platform)
    data = experiment_data(digest, searcher={"name": "random", "max_steps": 60, "seed": 1}, max_trials=2,
                           max_concurrent=2)  # fmt: skip
    experiment = services.experiment_create(user=platform, data=data)
    passes_until(lambda: Checkpoint.objects.filter(job__trial__experiment=experiment).count() >= 2, timeout=120)
    services.experiment_pause(experiment_id=experiment.id, actor="demo")
    trials = passes_until(
        lambda: (
            (ts := list(Trial.objects.filter(experiment=experiment))) and all(t.state == "paused" for t in ts) and ts
        ),
        timeout=60,
    )
    first_jobs = {t.number: t.job_id for t in trials}
    assert all(Job.objects.get(pk=j).reason == "experiment_paused" for j in first_jobs.values())
    time.sleep(0.5)
    services.experiment_advance(experiment_id=experiment.id)  # paused: nothing is submitted
    assert Job.objects.filter(labels__experiment=str(experiment.id)).count() == 2
    services.experiment_resume(experiment_id=experiment.id, actor="demo")
    passes_until(lambda: Trial.objects.filter(experiment=experiment, state="active").count() == 2, timeout=30)
    for trial in Trial.objects.filter(experiment=experiment).select_related("job"):
        assert trial.earlier_jobs == [str(first_jobs[trial.number])]
        assert trial.job.resume_from_id == first_jobs[trial.number]  # from its latest checkpoint
    passes_until(lambda: "resumed from step" in _log(Trial.objects.filter(experiment=experiment).first().job),
                 timeout=60)  # fmt: skip
    services.experiment_cancel(experiment_id=experiment.id, actor="demo")
    passes_until(lambda: not Trial.objects.filter(experiment=experiment, state="active").exists(), timeout=60)
    assert set(Trial.objects.filter(experiment=experiment).values_list("state", flat=True)) == {"cancelled"}
    assert Experiment.objects.get(pk=experiment.pk).state == "cancelled"
    with pytest.raises(Exception) as info:
        services.experiment_resume(experiment_id=experiment.id, actor="demo")
    assert getattr(info.value, "code", "") == "experiment_not_live"
    assert checkpoints.latest(first_jobs[1]) is not None


def _log(job) -> str:
    from jobs import logstore

    lines, _ = logstore.read_lines(logstore.attempt_dir(str(job.id), 1))
    return "\n".join(line.text for line in lines)
