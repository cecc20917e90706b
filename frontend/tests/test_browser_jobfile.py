"""In a real headless Chromium against the live portal (uvicorn, a real Celery worker, the local backend): a job
exported as job.yaml from its page and imported on the submit page runs again with the same request; a bad file is
an error on the same page; and a waiting job's page tells the truth from its first second and follows a change of
reason (pushed by the dispatcher's pass) without a reload.

Screenshots go to `test-artifacts/screenshots/`, like the other browser tests'.
"""

from __future__ import annotations

import re

import yaml

from frontend.tests.browser import BROWSER_MARKS, log_in, press, shot
from jobs import lifecycle, services
from jobs.models import Job
from jobs.states import JobState
from jobs.tests.conftest import wait_for
from quotas.models import Queue, Team
from quotas.services import queue_update, team_quota_update

pytestmark = BROWSER_MARKS


def test_export_a_job_yaml_and_import_it_on_the_submit_page(live_portal, page, tmp_path):
    demo = live_portal.demo
    tab = page
    log_in(tab)
    job, _ = services.job_submit(
        user=demo,
        data={
            "name": "exported",
            "team": "demo",
            "queue": "debug",
            "spec": "shared",
            "image": "python-3.11",
            "command": ["python3", "-c", "import os; print('lr', os.environ['LR'])"],
            "env": {"LR": "0.3"},
            "labels": {"exp": "yaml"},
            "timeout_s": 300,
        },
    )
    tab.goto(f"/jobs/{job.id}/")
    with tab.expect_download() as download:
        tab.click("#download-yaml")
    saved = tmp_path / download.value.suggested_filename
    download.value.save_as(saved)
    assert saved.name == "exported.job.yaml"
    body = yaml.safe_load(saved.read_text())
    assert body["env"] == {"LR": "0.3"} and body["labels"] == {"exp": "yaml"} and body["queue"] == "debug"

    tab.goto("/jobs/new/")
    tab.set_input_files("#id_jobfile", str(saved))
    press(tab, "#import-button")
    tab.wait_for_selector("#prefill-source")
    assert "exported.job.yaml" in tab.inner_text("#prefill-source")
    assert tab.input_value("#id_env") == "LR=0.3" and tab.input_value("#id_labels") == "exp=yaml"
    assert tab.input_value("#id_command").startswith("python3 -c ") and "os.environ" in tab.input_value("#id_command")
    assert tab.is_checked("#queue-debug") and tab.is_checked("#spec-shared")
    shot(tab, "jobfile-01-imported")
    tab.fill("#id_name", "imported")
    press(tab, "form.submit-form button.primary")
    tab.wait_for_url(re.compile(r"/jobs/[0-9a-f-]{36}/$"))
    again = Job.objects.get(name="imported")
    assert again.command == job.command and again.env == job.env and again.labels == job.labels
    assert again.timeout_s == 300 and again.queue_id == job.queue_id and again.spec_id == job.spec_id

    # A file that is not a job: the error is on the submit page, which stays usable.
    broken = tmp_path / "broken.yaml"
    broken.write_text("team: demo\ncommand: [python\n")
    tab.goto("/jobs/new/")
    tab.set_input_files("#id_jobfile", str(broken))
    press(tab, "#import-button")
    tab.wait_for_selector("#jobfile-errors")
    assert "jobfile_invalid_yaml" in tab.inner_text("#jobfile-errors")
    assert tab.is_visible("form.submit-form button.primary")
    shot(tab, "jobfile-02-bad-file")


def test_a_waiting_jobs_page_says_why_from_the_first_second_and_follows_a_new_reason(live_portal, page):
    demo = live_portal.demo
    tab = page
    log_in(tab)
    Team.objects.filter(slug="demo").update(gpu_milli=1000, max_running_jobs=10, max_jobs_per_user=10)
    spec = {"team": "demo", "queue": "train", "spec": "guaranteed", "image": "python-3.11", "timeout_s": 600}
    holder, _ = services.job_submit(
        user=demo, data={**spec, "command": ["python3", "-c", "import time; time.sleep(300)"]}
    )
    wait_for(lambda: Job.objects.get(pk=holder.pk).state == JobState.RUNNING, timeout=60)
    waiting, _ = services.job_submit(user=demo, data={**spec, "command": ["python3", "-c", "print(1)"]})
    tab.goto(f"/jobs/{waiting.id}/")
    reason = tab.locator("#job-header p.reason")
    assert "Your team's quota is taken" in reason.inner_text(), reason.inner_text()
    shot(tab, "waiting-01-team-quota")
    # The queue's capacity shrinks below what runs: the next pass gives the job a new reason, with no new state.
    queue_update(queue=Queue.objects.get(name="train"), changes={"gpu_milli": 1000}, actor=demo)
    team_quota_update(team=Team.objects.get(slug="demo"), changes={"gpu_milli": 4000}, actor=demo)
    wait_for(lambda: Job.objects.get(pk=waiting.pk).reason == "queue_quota_exhausted", timeout=30, observe=False)
    tab.wait_for_function(
        "() => document.querySelector('#job-header p.reason').textContent.includes(\"The queue's capacity is taken\")",
        timeout=15_000,
    )
    assert Job.objects.get(pk=waiting.pk).state == JobState.PENDING
    shot(tab, "waiting-02-queue-quota-pushed")
    lifecycle.job_cancel(job_id=holder.id, actor="test")
