"""`trainyard experiment` against a live server: create from a YAML file (its template's code folder uploaded),
list, show, trials (table and CSV), pause/resume/cancel, and errors pointing at the file's lines."""

import pytest

from experiments import services
from experiments.models import Experiment
from jobs.tests.conftest import platform  # noqa: F401 - fixtures used by name
from trainyard.tests.test_cli import cli  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

EXPERIMENT_YAML = """\
name: lr-sweep
team: demo
template:
  queue: train
  spec: shared
  image: python-3.11
  code: src
  command: python train.py --lr {{lr}} --batch {{batch}} --steps {{max_steps}}
space:
  lr: {type: log_uniform, min: 0.001, max: 0.3}
  batch: [4, 16]
searcher: {name: adaptive, max_steps: 30, min_steps: 5, seed: 1}
metric: loss
direction: minimize
max_trials: 6
max_concurrent: 2
"""


def test_create_list_show_trials_and_commands(cli, tmp_path):  # noqa: F811
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    path = tmp_path / "exp.yaml"
    path.write_text(EXPERIMENT_YAML)
    result = cli("experiment", "create", str(path))
    assert result.code == 0, result.err
    experiment = Experiment.objects.get()
    assert result.out.strip() == str(experiment.id)
    assert "uploaded code sha256:" in result.err and "adaptive search of loss (minimize)" in result.err
    assert experiment.code_digest.startswith("sha256:") and experiment.template["code"] == experiment.code_digest
    services.experiment_advance(experiment_id=experiment.id)  # the beat's pass: two trials submitted (pending)
    listed = cli("experiment", "list")
    assert listed.code == 0 and str(experiment.id)[:8] in listed.out and "2/6" in listed.out
    shown = cli("experiment", "show", str(experiment.id)[:8])
    assert shown.code == 0 and "running: 2/6 trials (2 active)" in shown.out
    trials = cli("experiment", "trials", str(experiment.id), "--sort=-lr")
    assert trials.code == 0 and "TRIAL" in trials.out and "BATCH" in trials.out
    csv = cli("experiment", "trials", str(experiment.id), "--csv")
    assert csv.code == 0 and csv.out.splitlines()[0].startswith("trial,state,job,lr,batch,best_loss")
    assert cli("experiment", "pause", str(experiment.id)).err.strip().endswith("is paused")
    assert cli("experiment", "resume", str(experiment.id)).err.strip().endswith("is running")
    assert cli("experiment", "cancel", str(experiment.id)).err.strip().endswith("is cancelled")
    again = cli("experiment", "resume", str(experiment.id))
    assert again.code == 4 and "experiment_not_live" in again.err
    best = cli("experiment", "rerun-best", str(experiment.id), "--steps", "60")
    assert best.code == 4 and "no_best_trial" in best.err


def test_a_bad_file_points_at_its_lines_and_creates_nothing(cli, tmp_path):  # noqa: F811
    path = tmp_path / "exp.yaml"
    path.write_text(EXPERIMENT_YAML.replace("  code: src\n", "").replace("queue: train", "queue: nope")
                    .replace("{type: log_uniform, min: 0.001", "{type: log_uniform, min: 0"))  # fmt: skip
    result = cli("experiment", "create", str(path))
    assert result.code == 4
    assert "rejected the experiment" in result.err
    assert f"{path}:9:" in result.err and "space.lr.min" in result.err  # the space's line
    assert not Experiment.objects.exists()
    path.write_text(EXPERIMENT_YAML.replace("  code: src\n", "").replace("queue: train", "queue: nope"))
    result = cli("experiment", "create", str(path))
    assert result.code == 4 and f"{path}:4:" in result.err and "unknown_queue" in result.err
    assert cli("experiment", "show", "abc").code == 4
