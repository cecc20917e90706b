"""The portal in Chinese, page by page: no English sentence the platform knows is left on a page a Chinese reader
opens (job list, a waiting job, failed and retried jobs, the submit form with errors, queue and team pages,
monitoring pages with an alert), and the server's own sentences (wait reasons, timeline, exit descriptions,
validation messages) are said in Chinese at render time while the database keeps them in English."""

import html
import re

import pytest
from django.utils import timezone, translation

from cluster.models import GPU
from frontend import wording
from frontend.forms import CUSTOM_IMAGE
from frontend.tests.conftest import login, submit
from frontend.tests.english_left import KEPT, english_runs, known_english, visible_text
from jobs import lifecycle, services, store
from jobs.backends import Observation
from jobs.models import Job, JobEvent
from jobs.states import JobState, PendingReason
from monitoring import services as monitoring
from monitoring.defaults import seed_rules
from monitoring.models import Alert, AlertRule, GpuStatus
from quotas.models import Team

pytestmark = pytest.mark.django_db


def _finish(job, obs: Observation):
    services.job_transition(job_id=job.id, to=JobState.STARTING, actor="test")
    lifecycle.attempt_finish(attempt_id=job.attempts.filter(ended_at__isnull=True).get().id, obs=obs)
    return Job.objects.get(pk=job.pk)


@pytest.fixture
def scenario(portal):
    """A waiting job (the demo team's quota is smaller than the queue), a user failure, a platform failure that
    is retried, a cancelled job, an alert on a card, and the English they left in the database."""
    failed = submit(portal.demo, name="user-exit", queue="debug")
    store.dispatch(queue_ids=[failed.queue_id])
    failed = _finish(failed, Observation(phase="failed", exit_code=3, reason="Error"))
    assert failed.state == JobState.FAILED

    retried = submit(portal.demo, name="killed", queue="debug")
    store.dispatch(queue_ids=[retried.queue_id])
    retried = _finish(retried, Observation(phase="failed", signal=9, reason="Killed"))
    assert retried.retries_used == 1

    cancelled = submit(portal.demo, name="stopped", queue="debug")
    lifecycle.job_cancel(job_id=cancelled.id, actor="demo")

    Team.objects.filter(slug="demo").update(gpu_milli=2000)  # as `manage.py seed` makes it: smaller than the queue
    for i in range(2):
        submit(portal.demo, name=f"whole-{i}", spec="guaranteed")
    waiting = submit(portal.demo, name="whole-waiting", spec="guaranteed")
    store.dispatch(queue_ids=[waiting.queue_id])
    waiting = Job.objects.get(pk=waiting.pk)
    assert waiting.state == JobState.PENDING and waiting.reason == PendingReason.TEAM_QUOTA_EXHAUSTED, waiting.reason
    gpu = GPU.objects.order_by("-id").first()
    GPU.objects.filter(pk=gpu.pk).update(health=GPU.Health.UNHEALTHY)
    GpuStatus.objects.update_or_create(
        gpu=gpu, defaults={"fault": "xid", "fault_reason": "Xid 79", "failures": 3, "fault_since": timezone.now()}
    )
    seed_rules(AlertRule)  # a transactional test before this one emptied the table its migration filled
    monitoring.alerts_evaluate()
    assert Alert.objects.exists()
    return {"waiting": waiting, "failed": failed, "retried": retried, "cancelled": cancelled}


def stored_english(jobs) -> set[str]:
    """The sentences the platform stored for these jobs, in English (as the API returns them)."""
    texts = set()
    for job in Job.objects.filter(pk__in=[j.pk for j in jobs]):
        texts |= {job.message, job.suggestion}
    texts |= set(JobEvent.objects.filter(job__in=jobs).values_list("message", flat=True))
    texts |= set(Alert.objects.values_list("summary", flat=True))
    return {t for t in texts if len(re.findall(r"[A-Za-z]{2,}", KEPT.sub("", t or ""))) >= 3}


def test_every_page_reads_in_chinese(portal, scenario):
    client = login(portal.demo)
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/jobs/"})
    jobs = list(scenario.values())
    pages = {
        url: client.get(url)
        for url in [
            "/jobs/",
            "/queues/",
            "/queues/train/",
            "/queues/debug/",
            "/teams/demo/",
            "/gpus/",
            "/images/",
            "/templates/",
            "/tokens/",
            "/settings/notifications/",
            "/monitoring/cluster/",
            "/monitoring/alerts/",
            *(f"/jobs/{j.id}/" for j in jobs),
            *(f"/jobs/{j.id}/live/" for j in jobs),
            *(f"/monitoring/jobs/{j.id}/charts/" for j in jobs),
            f"/jobs/{scenario['waiting'].id}/cancel/",
        ]
    }
    form = client.get("/jobs/new/").content.decode()
    key = re.search(r'name="idempotency_key" value="([0-9a-f]+)"', form).group(1)
    errors = client.post(
        "/jobs/new/",
        {
            "idempotency_key": key,
            "team": "demo",
            "queue": "debug",
            "spec": "guaranteed",
            "image": CUSTOM_IMAGE,
            "image_reference": "evil.example.com/x:1",
            "command": "",
            "env": "1BAD=x\nTRAINYARD_X=1",
            "timeout_s": "99h",
            "max_retries": "11",
        },
    )
    assert errors.status_code == 400
    pages["/jobs/new/ (errors)"] = errors
    assert all(r.status_code in (200, 400) for r in pages.values()), {u: r.status_code for u, r in pages.items()}
    shown_errors = re.findall(r'class="error-message">([^<]*)<', errors.content.decode())
    assert len(shown_errors) >= 4, shown_errors  # the service's own messages are on the page, in Chinese
    assert all(re.search(r"[\u4e00-\u9fff]", e) for e in shown_errors), shown_errors

    known = known_english() | stored_english(jobs)
    assert len(known) > 300
    left = {}
    for url, response in pages.items():
        text = visible_text(response.content.decode())
        found = sorted(k for k in known if k in text)
        runs = english_runs(text)
        if found or runs:
            left[url] = found + runs
    assert not left, left


def test_the_database_keeps_english_and_each_language_reads_its_own(portal, scenario):
    failed = scenario["failed"]
    assert failed.message.startswith("exited with code 3.")  # stored in English, for the API and the CLI
    english = login(portal.demo).get(f"/jobs/{failed.id}/").content.decode()
    client = login(portal.demo)
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/jobs/"})
    chinese = html.unescape(client.get(f"/jobs/{failed.id}/").content.decode())
    assert "exited with code 3" in english and "以退出码 3 退出" in chinese
    # The timeline says for each change when, what changed, why, and who or what made it.
    timeline = html.unescape(english[english.index('<ol class="events"') :])
    assert "pending → admitted" in timeline and "by the dispatcher" in timeline
    assert "running → failed" in timeline or "starting → failed" in timeline
    assert "Why:</strong> The job itself failed (its code, input or request)" in timeline
    assert "by the failure classifier" in timeline and "由 失败分类器" in chinese
    assert "第 1 次尝试以退出码 3 退出：用户失败（user-exit）；不重试" in chinese
    waiting = html.unescape(client.get(f"/jobs/{scenario['waiting'].id}/").content.decode())
    assert "团队 demo 还剩" in waiting and "该作业需要 1 块 GPU" in waiting
    with translation.override("zh-hans"):
        quota_why = str(wording.PENDING_REASONS[PendingReason.TEAM_QUOTA_EXHAUSTED])
    assert waiting.count(quota_why) == 2  # the header says why it waits, and so does the timeline entry
    retried = html.unescape(client.get(f"/jobs/{scenario['retried'].id}/").content.decode())
    assert "被信号 9 终止；第 1 次重试，共 2 次" in retried and "已排队，将在其他 GPU 上再次尝试" in retried
    assert not Job.objects.filter(message__regex=r"[\u4e00-\u9fff]").exists()
    assert not JobEvent.objects.filter(message__regex=r"[\u4e00-\u9fff]").exists()
