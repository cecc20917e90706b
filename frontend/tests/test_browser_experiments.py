"""In a real headless Chromium against the live portal (uvicorn, a real Celery worker, the local backend): an
experiment made on the New experiment form with its code uploaded as an archive, its trials run as real jobs of
`experiments/examples/train.py` (the passes beat would run driven here), then read on the list and on its page:
the best trial, the charts, the trials table sorted by a parameter both ways, and the CSV download.

Screenshots go to `test-artifacts/screenshots/experiments-*.png`, like the other browser tests'.
"""

from __future__ import annotations

import csv
import io
import re
import time
import zipfile
from pathlib import Path

from experiments import services
from experiments.models import Experiment
from frontend.tests.browser import BROWSER_MARKS, log_in, press, shot
from jobs import lifecycle
from monitoring import services as monitoring_services

pytestmark = BROWSER_MARKS

TRAIN = Path(__file__).resolve().parents[2] / "experiments" / "examples" / "train.py"
TRIALS = 4
DEFINITION = f"""name: browser-sweep
team: demo
template:
  queue: train
  spec: shared
  image: python-3.11
  code: .
  command: python train.py --lr {{{{lr}}}} --batch {{{{batch}}}} --steps {{{{max_steps}}}} --step-seconds 0.05
  max_retries: 0
space:
  lr: {{type: log_uniform, min: 0.003, max: 0.3}}
  batch: [4, 16]
searcher: {{name: random, max_steps: 12, seed: 3}}
metric: loss
direction: minimize
max_trials: {TRIALS}
max_concurrent: 2
"""


def _passes_until(predicate, *, timeout: float):
    """What beat runs for an experiment (observe, the metric scan, the experiments' pass) until predicate()."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lifecycle.attempts_observe()
        monitoring_services.business_metrics_scan()
        services.experiments_advance()
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError("the experiment did not complete in time")


def _rows(tab) -> list[int]:
    return [int(n) for n in tab.eval_on_selector_all("tr[data-trial]", "rows => rows.map(r => r.dataset.trial)")]


def test_create_an_experiment_on_the_form_and_read_its_page(live_portal, page, tmp_path):
    tab = page
    log_in(tab)
    archive = tmp_path / "sweep.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(TRAIN, "sweep/train.py")

    tab.goto("/experiments/")
    tab.click('a[href="/experiments/new/"]')
    tab.wait_for_url(re.compile(r"/experiments/new/$"))
    tab.fill("#id_definition", DEFINITION)
    tab.set_input_files("#id_code_archive", str(archive))
    shot(tab, "experiments-01-form")
    press(tab, "#experiment-form button.primary")
    tab.wait_for_url(re.compile(r"/experiments/[0-9a-f-]{36}/$"))
    experiment = Experiment.objects.get(name="browser-sweep")
    assert tab.url.endswith(f"/experiments/{experiment.id}/")
    assert experiment.code_digest and experiment.template["code"] == experiment.code_digest

    _passes_until(lambda: not Experiment.objects.get(pk=experiment.pk).is_live, timeout=180)
    experiment = Experiment.objects.get(pk=experiment.pk)
    trials = list(experiment.trials.order_by("number"))
    assert experiment.state == "completed" and [t.state for t in trials] == ["completed"] * TRIALS, [
        (t.number, t.state, t.job.state, t.job.message) for t in trials
    ]
    assert all(len(t.curve) == 12 for t in trials)

    # The list: the experiment with its state and trial count, a link to its page.
    tab.goto("/experiments/")
    row = tab.locator(f'tr[data-experiment="{experiment.id}"]')
    assert "browser-sweep" in row.inner_text() and "completed" in row.inner_text().lower()
    assert f"{TRIALS} / {TRIALS}" in row.inner_text()
    shot(tab, "experiments-02-list")
    row.locator("a", has_text="browser-sweep").first.click()
    tab.wait_for_url(re.compile(rf"/experiments/{experiment.id}/$"))

    # The page: the best trial (the lowest loss of any trial), a curve per trial, the table in trial order.
    best = min(trials, key=lambda t: (t.best_value, t.number))
    assert f"#{best.number}" in tab.inner_text("#best-trial")
    assert tab.locator("polyline[data-series]").count() == TRIALS
    pairs = "ls => ls.map(l => [l.dataset.series, l.getAttribute('stroke')])"
    strokes = dict(tab.eval_on_selector_all("polyline[data-series]", pairs))
    assert strokes[f"#{best.number}"] == "#dc2626" and list(strokes.values()).count("#dc2626") == 1, strokes
    assert "max_steps=12" in tab.inner_text("main")  # the searcher's settings, as the file wrote them
    assert tab.locator("#scatters [data-param]").count() == 2 and tab.locator("#parallel polyline").count() == TRIALS
    assert _rows(tab) == list(range(1, TRIALS + 1))
    shot(tab, "experiments-03-page")

    # Sort by a parameter: ascending, then (the same heading again) descending, as the data says.
    by_lr = [t.number for t in sorted(trials, key=lambda t: (t.params["lr"], t.number))]
    tab.click('th[data-param="lr"] a')
    tab.wait_for_url(re.compile(r"\?sort=lr$"))
    assert _rows(tab) == by_lr
    assert tab.get_attribute('th[data-param="lr"]', "aria-sort") == "ascending"
    tab.click('th[data-param="lr"] a')
    tab.wait_for_url(re.compile(r"\?sort=-lr$"))
    assert _rows(tab) == list(reversed(by_lr))
    assert tab.get_attribute('th[data-param="lr"]', "aria-sort") == "descending"
    shot(tab, "experiments-04-sorted")

    # The CSV link downloads the same table, in the same order, one column per parameter.
    with tab.expect_download() as download:
        tab.click("#trials-csv")
    saved = tmp_path / download.value.suggested_filename
    download.value.save_as(saved)
    assert saved.name == f"experiment-{str(experiment.id)[:8]}-trials.csv"
    table = list(csv.DictReader(io.StringIO(saved.read_text())))
    assert [int(r["trial"]) for r in table] == list(reversed(by_lr))
    assert {"lr", "batch", "best_loss", "state"} <= set(table[0])
    assert all(r["state"] == "completed" for r in table)
    assert min(float(r["best_loss"]) for r in table) == best.best_value
