"""Daily-use pages in a real headless Chromium, against the live ASGI app with real jobs: "Run again with changes",
job templates (save, use, edit, delete), comparing runs (picked on the job list, and by label) and API tokens
(created and shown once, used, revoked), in English and in Chinese.

Screenshots go to `test-artifacts/screenshots/`, like the other browser tests'.
"""

from __future__ import annotations

import re

import httpx

from frontend.tests.browser import BROWSER_MARKS, log_in, press, shot
from jobs import services
from jobs.models import Job, JobTemplate
from jobs.tests.conftest import wait_for
from monitoring import services as monitoring
from quotas.models import ApiToken

pytestmark = BROWSER_MARKS

TRAIN = (
    "import json, os\n"
    "lr = float(os.environ['LR'])\n"
    "for step in range(1, 9):\n"
    "    print('TRAINYARD_METRIC ' + json.dumps({'step': step, 'loss': 1 / (1 + lr * step), 'acc': lr * step}),"
    " flush=True)\n"
)


def run(user, lr: str, name: str) -> Job:
    job, _ = services.job_submit(
        user=user,
        data={
            "team": "demo",
            "queue": "debug",
            "spec": "shared",
            "image": "python-3.11",
            "command": ["python3", "-c", TRAIN],
            "env": {"LR": lr, "EPOCHS": "8"},
            "labels": {"sweep": "lr"},
            "name": name,
        },
    )
    return job


def test_run_again_templates_compare_and_tokens_in_a_real_browser(live_portal, page):
    demo = live_portal.demo
    tab = page
    log_in(tab)

    first, second = run(demo, "0.1", "lr-0.1"), run(demo, "0.5", "lr-0.5")
    wait_for(
        lambda: set(Job.objects.filter(pk__in=[first.pk, second.pk]).values_list("state", flat=True)) == {"succeeded"},
        timeout=60,
        observe=False,
    )
    assert monitoring.business_metrics_scan().metrics == 16  # what the beat's scan does

    # Run again with changes: the form comes filled from the job; change LR only.
    tab.goto(f"/jobs/{first.id}/")
    tab.click("#run-again")
    tab.wait_for_url(re.compile(rf"/jobs/new/\?from={first.id}$"))
    assert "lr-0.1" in tab.inner_text("#prefill-source")
    assert tab.input_value("#id_env") == "EPOCHS=8\nLR=0.1"
    assert tab.is_checked("#queue-debug") and tab.is_checked("#spec-shared")
    assert "TRAINYARD_METRIC" in tab.input_value("#id_command")
    tab.fill("#id_name", "lr-0.9")
    tab.fill("#id_env", "EPOCHS=8\nLR=0.9")
    shot(tab, "runs-01-run-again-form")
    press(tab, "form.submit-form button.primary")
    tab.wait_for_url(re.compile(r"/jobs/[0-9a-f-]{36}/$"))
    again = Job.objects.get(name="lr-0.9")
    assert again.env == {"EPOCHS": "8", "LR": "0.9"} and again.command == first.command
    assert again.labels == {"sweep": "lr"}

    # Save the same form as a team template instead of submitting it.
    tab.goto(f"/jobs/new/?from={first.id}")
    tab.click("details.template-save summary")
    tab.fill("#id_template_name", "lr-baseline")
    tab.fill("#id_template_description", "the LR sweep's baseline")
    press(tab, "details.template-save button[name=save_template]")
    tab.wait_for_url(re.compile(r"/templates/"))
    template = JobTemplate.objects.get(name="lr-baseline")
    assert "lr-baseline" in tab.inner_text(f"#template-{template.pk}")
    shot(tab, "runs-02-templates")
    # Use it: a job with the template's fields and the template label.
    tab.click(f"#template-{template.pk} a.primary")
    assert "lr-baseline" in tab.inner_text("#prefill-source")
    press(tab, "form.submit-form button.primary")
    tab.wait_for_url(re.compile(r"/jobs/[0-9a-f-]{36}/$"))
    used = Job.objects.get(pk=tab.url.rstrip("/").rsplit("/", 1)[1])
    assert used.labels == {"sweep": "lr", "template": "lr-baseline"} and used.env["LR"] == "0.1"
    # Edit it: a new description and a longer time limit.
    tab.goto("/templates/")
    tab.click(f"#template-{template.pk} >> text=Edit")
    assert tab.input_value("#id_template_name") == "lr-baseline"
    tab.fill("#id_template_description", "baseline, 10 minutes")
    tab.fill("#id_timeout_s", "600")
    shot(tab, "runs-03-template-edit")
    press(tab, "form.submit-form button[name=save_template]")
    tab.wait_for_url(re.compile(r"/templates/"))
    template.refresh_from_db()
    assert template.description == "baseline, 10 minutes" and str(template.body["timeout_s"]) == "600"

    # Compare: tick the two runs on the job list.
    tab.goto("/jobs/")
    tab.check(f"tr[data-job='{first.id}'] input[name=job]")
    tab.check(f"tr[data-job='{second.id}'] input[name=job]")
    tab.click("#compare-selected")
    tab.wait_for_url(re.compile(r"/jobs/compare/\?"))
    loss = tab.locator("figure.chart", has_text="loss")
    assert loss.locator("polyline").count() == 2
    assert tab.locator("tr[data-param='env.LR'].differs mark").inner_text() == "0.5"
    assert tab.locator("tr[data-param='env.EPOCHS'].differs").count() == 0
    # Sort the final metrics by loss, both ways.
    tab.click("#final-metrics th[data-metric=loss] button")
    order = tab.eval_on_selector_all("#final-metrics tbody tr", "rows => rows.map(r => r.dataset.job)")
    assert order == [str(second.id), str(first.id)]  # the larger LR ends with the lower loss
    tab.click("#final-metrics th[data-metric=loss] button")
    order = tab.eval_on_selector_all("#final-metrics tbody tr", "rows => rows.map(r => r.dataset.job)")
    assert order == [str(first.id), str(second.id)]
    assert tab.get_attribute("#final-metrics th[data-metric=loss]", "aria-sort") == "descending"
    shot(tab, "runs-04-compare")
    # Every job with a label: the two runs, the changed one and the template's.
    tab.goto("/jobs/compare/?label=sweep%3Dlr")
    assert tab.locator("#final-metrics tbody tr").count() == 4
    tab.click("#only-diff")
    params = tab.eval_on_selector_all("#parameters tbody tr", "rows => rows.map(r => r.dataset.param)")
    assert "env.LR" in params and "env.EPOCHS" not in params
    shot(tab, "runs-05-compare-by-label-differences")

    # Tokens: create one (shown once), use it, revoke it.
    tab.click("header >> text=API tokens")
    tab.fill("#id_name", "browser-ci")
    tab.uncheck("#scope-submit")
    press(tab, "form.token-form button.primary")
    secret = tab.input_value("#new-token")
    token = ApiToken.objects.get(name="browser-ci")
    assert secret.startswith(f"ty_{token.prefix}_") and token.scopes == ["read"]
    shot(tab, "runs-06-token-created")
    api = httpx.get(f"{live_portal.url}/api/v1/jobs/", headers={"Authorization": f"Bearer {secret}"})
    assert api.status_code == 200
    tab.goto("/tokens/")
    assert secret not in tab.content() and tab.locator("#new-token").count() == 0
    tab.click(f"tr[data-prefix='{token.prefix}'] >> text=Revoke")
    assert token.prefix in tab.inner_text("h1")
    tab.click("form button.danger")
    tab.wait_for_url(re.compile(r"/tokens/$"))
    assert tab.locator(f"tr[data-prefix='{token.prefix}'][data-status=revoked]").count() == 1
    shot(tab, "runs-07-token-revoked")
    api = httpx.get(f"{live_portal.url}/api/v1/jobs/", headers={"Authorization": f"Bearer {secret}"})
    assert api.status_code == 401

    # Delete the template, after a confirmation.
    tab.goto("/templates/")
    tab.click(f"#template-{template.pk} >> text=Delete")
    tab.click("form button.danger")
    tab.wait_for_url(re.compile(r"/templates/$"))
    assert not JobTemplate.objects.exists()

    # Chinese.
    tab.goto(f"/jobs/compare/?job={first.id}&job={second.id}")
    tab.click("button[value='zh-hans']")
    tab.wait_for_load_state("load")
    assert tab.get_attribute("html", "lang") == "zh-Hans"
    assert "对比运行" in tab.inner_text("h1") and "最终指标" in tab.inner_text("main")
    shot(tab, "runs-08-compare-zh")
    tab.goto("/tokens/")
    assert "API 令牌" in tab.inner_text("h1") and "已吊销" in tab.inner_text("#tokens")
    shot(tab, "runs-09-tokens-zh")
    tab.goto(f"/jobs/new/?from={first.id}")
    assert "修改后再次运行" not in tab.inner_text("h1") and "已按作业" in tab.inner_text("#prefill-source")
    shot(tab, "runs-10-run-again-zh")
    tab.goto("/templates/")
    assert "作业模板" in tab.inner_text("h1")
    shot(tab, "runs-11-templates-zh")
