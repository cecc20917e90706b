"""One walk through the portal in a real headless Chromium, in English and then in Chinese, with real jobs: a job
that waits on its team's quota, one that fails by its own exit code, one killed by a signal and retried, the
submit form with errors, queue, team and monitoring pages with an alert open; cancel asks in a dialog (bulk
cancel too), and without JavaScript on a page of its own. Every page is saved under
`test-artifacts/screenshots/walk-*.png`; in Chinese no English the portal knows is left on any of them.
"""

from __future__ import annotations

import re

from django.utils import timezone

from cluster.models import GPU
from frontend.tests.browser import BROWSER_MARKS, log_in, press, shot
from frontend.tests.english_left import english_runs, known_english, visible_text
from jobs import services
from jobs.models import Job, JobEvent
from jobs.states import JobState, PendingReason
from jobs.tests.conftest import wait_for
from monitoring import services as monitoring
from monitoring.defaults import seed_rules
from monitoring.models import Alert, AlertRule, GpuStatus
from quotas.models import Team

pytestmark = BROWSER_MARKS


def _submit(user, name: str, command: str, **extra) -> Job:
    data = {"team": "demo", "queue": "debug", "spec": "shared", "image": "python-3.11", "command": command}
    job, _ = services.job_submit(user=user, data={**data, **extra, "name": name})
    return job


def _scenario(demo) -> dict[str, Job]:
    failed = _submit(demo, "exits-3", "sh -c 'echo reading data; exit 3'")
    retried = _submit(demo, "killed", "sh -c 'kill -9 $$'", max_retries=1)
    wait_for(
        lambda: Job.objects.filter(pk__in=[failed.pk, retried.pk], state=JobState.FAILED).count() == 2,
        timeout=60,
        observe=False,
    )
    Team.objects.filter(slug="demo").update(gpu_milli=1000)  # the demo team is smaller than the queue
    holder = _submit(demo, "holds-quota", "sleep 600", queue="train", spec="guaranteed")
    wait_for(lambda: Job.objects.get(pk=holder.pk).state == JobState.RUNNING, timeout=60, observe=False)
    waiting = _submit(demo, "waits-for-quota", "sleep 1", queue="train", spec="guaranteed")
    wait_for(
        lambda: Job.objects.get(pk=waiting.pk).reason == PendingReason.TEAM_QUOTA_EXHAUSTED, timeout=30, observe=False
    )
    # A card nobody uses reports a fatal Xid: the default rule opens an alert and quarantines it.
    busy = {d["gpu_uuid"] for a in holder.attempts.all() for d in a.placement.get("devices", [])}
    gpu = GPU.objects.exclude(uuid__in=busy).order_by("-index").first()
    GPU.objects.filter(pk=gpu.pk).update(health=GPU.Health.UNHEALTHY)
    GpuStatus.objects.update_or_create(
        gpu=gpu, defaults={"fault": "xid", "fault_reason": "Xid 79", "failures": 3, "fault_since": timezone.now()}
    )
    seed_rules(AlertRule)  # a transactional test before this one emptied the table its migration filled
    monitoring.alerts_evaluate()
    assert Alert.objects.exists()
    return {"failed": failed, "retried": retried, "holder": holder, "waiting": waiting}


def _walk(tab, jobs: dict[str, Job], lang: str) -> dict[str, str]:
    """Every page of the walk, screenshot taken; returns each page's HTML."""
    pages = {}
    for path, name in [
        ("/jobs/", "jobs"),
        (f"/jobs/{jobs['waiting'].id}/", "job-waiting"),
        (f"/jobs/{jobs['failed'].id}/", "job-failed"),
        (f"/jobs/{jobs['retried'].id}/", "job-retried"),
        ("/queues/", "queues"),
        ("/queues/train/", "queue-train"),
        ("/teams/demo/", "team"),
        ("/monitoring/cluster/", "monitoring-cluster"),
        ("/monitoring/alerts/", "monitoring-alerts"),
    ]:
        response = tab.goto(path)
        assert response.status == 200, path
        if name.startswith("job-"):
            tab.wait_for_selector("section.job-charts")  # the monitoring fragment is part of the job page
        shot(tab, f"walk-{lang}-{name}")
        pages[path] = tab.content()

    # The submit form with several errors at once, each next to its field, in the form's order.
    tab.goto("/jobs/new/")
    tab.check("#queue-debug")
    tab.check("#spec-shared")
    tab.check("#image-custom")
    tab.fill("#id_image_reference", "evil.example.com/x:1")
    tab.fill("#id_command", "")
    tab.fill("#id_env", "1BAD=x\nTRAINYARD_X=1")
    tab.fill("#id_timeout_s", "99h")
    press(tab, "form.submit-form button[type=submit]")
    tab.wait_for_selector("#error-summary")
    assert tab.locator(".field-error").count() >= 3
    shot(tab, f"walk-{lang}-submit-errors")
    pages["/jobs/new/ (errors)"] = tab.content()
    return pages


def test_walk_in_english_and_chinese(live_portal, page):
    demo = live_portal.demo
    tab = page
    jobs = _scenario(demo)
    log_in(tab)

    english = _walk(tab, jobs, "en")
    waiting_page = visible_text(english[f"/jobs/{jobs['waiting'].id}/"])
    assert "team demo has 0 GPUs left; the job needs 1 GPU" in waiting_page
    assert "by the dispatcher" in waiting_page
    failed_page = visible_text(english[f"/jobs/{jobs['failed'].id}/"])
    assert "exited with code 3" in failed_page and "by the failure classifier" in failed_page
    retried_page = visible_text(english[f"/jobs/{jobs['retried'].id}/"])
    assert "was killed by signal 9; retry 1 of 1" in retried_page

    # Cancel asks in a dialog: "no" keeps the job; the dialog's own words are the portal's.
    tab.goto(f"/jobs/{jobs['holder'].id}/")
    tab.click("form[action$='/cancel/'] button")
    dialog = tab.locator("#confirm-dialog")
    dialog.wait_for(state="visible")
    assert dialog.locator("#confirm-question").inner_text().startswith("Cancel job holds-quota?")
    shot(tab, "walk-en-cancel-dialog")
    tab.click("#confirm-no")
    dialog.wait_for(state="hidden")
    assert Job.objects.get(pk=jobs["holder"].pk).state == JobState.RUNNING

    # Chinese: the same walk, and nothing English that the portal knows is left on any page.
    tab.click("button[value='zh-hans']")
    tab.wait_for_load_state("load")
    assert tab.get_attribute("html", "lang") == "zh-Hans"
    chinese = _walk(tab, jobs, "zh")
    stored = {
        t
        for t in [
            *Job.objects.filter(pk__in=[j.pk for j in jobs.values()]).values_list("message", flat=True),
            *JobEvent.objects.filter(job__in=list(jobs.values())).values_list("message", flat=True),
            *Alert.objects.values_list("summary", flat=True),
        ]
        if t and len(re.findall(r"[A-Za-z]{2,}", t)) >= 3
    }
    known = known_english() | stored
    left = {}
    for path, body in chinese.items():
        text = visible_text(body)
        found = sorted(k for k in known if k in text) + english_runs(text)
        if found:
            left[path] = found
    assert not left, left
    assert "团队 demo 还剩 0 块 GPU；该作业需要 1 块 GPU" in visible_text(chinese[f"/jobs/{jobs['waiting'].id}/"])

    # Bulk cancel from the job list asks in a dialog too; "yes" cancels the ticked jobs.
    tab.goto("/jobs/")
    tab.check(f"#pick-{jobs['waiting'].id}")
    tab.check(f"#pick-{jobs['holder'].id}")
    tab.click("#bulk-cancel button.danger")
    dialog.wait_for(state="visible")
    assert "2" in dialog.locator("#confirm-question").inner_text()
    shot(tab, "walk-zh-bulk-cancel-dialog")
    tab.click("#confirm-yes")
    tab.wait_for_url(re.compile(r"/jobs/$"))
    wait_for(
        lambda: {Job.objects.get(pk=jobs[k].pk).state for k in ("waiting", "holder")} <= {"cancelled", "cancelling"},
        timeout=30,
        observe=False,
    )
    shot(tab, "walk-zh-after-bulk-cancel")


def test_cancel_without_javascript_asks_on_a_page(live_portal, page):
    job = _submit(live_portal.demo, "no-script", "sleep 600")
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, timeout=60, observe=False)
    context = page.context.browser.new_context(base_url=live_portal.url, java_script_enabled=False)
    tab = context.new_page()
    try:
        log_in(tab)
        tab.goto(f"/jobs/{job.id}/")
        tab.click("form[action$='/cancel/'] button")
        tab.wait_for_url(re.compile(rf"/jobs/{job.id}/cancel/$"))
        assert "Cancel job no-script?" in tab.inner_text("h1")
        assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
        shot(tab, "walk-en-cancel-page-no-js")
        tab.click("#confirm-cancel")
        tab.wait_for_url(re.compile(rf"/jobs/{job.id}/$"))
        wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.CANCELLED, timeout=30, observe=False)
    finally:
        context.close()
