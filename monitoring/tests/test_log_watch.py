"""Watched log texts: a job names what it fears ("nan loss"); a line that holds it raises one alert on that job at
the level asked for, tells its owner, and later lines only count."""

import pytest
from rest_framework.test import APIClient

from jobs.tests.conftest import platform, wait_for  # noqa: F401 - the seeded platform fixture
from jobs.tests.test_lifecycle_e2e import finished, submit
from monitoring import services
from monitoring.models import Alert, Notification

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_watched_text_in_the_log_raises_one_alert_at_its_level(platform, celery_worker_thread):  # noqa: F811
    script = "echo 'step 1 loss 0.50'; echo 'step 2 loss is NaN loss!'; echo 'step 3 nan loss again'; echo done"
    job = submit(
        platform,
        command=["sh", "-c", script],
        watch=[{"pattern": "nan loss", "level": "critical"}, "out of memory"],
    )
    assert job.watch == [{"pattern": "nan loss", "level": "critical"}, {"pattern": "out of memory", "level": "warning"}]
    job = wait_for(lambda: finished(job), timeout=60)
    report = services.business_metrics_scan()
    assert report.watched == 2
    alert = Alert.objects.get()
    assert alert.level == "critical" and alert.job_ids == [str(job.id)] and alert.value == 2
    assert "logged 'nan loss' (attempt 1, line 2): step 2 loss is NaN loss!" in alert.summary
    assert Notification.objects.filter(user=platform, alert=alert).exists()
    services.business_metrics_scan()  # nothing new: nothing more
    assert Alert.objects.count() == 1 and Alert.objects.get().value == 2


@pytest.mark.parametrize(
    "watch", ["nan", [{"pattern": "x"}], [{"pattern": "nan loss", "level": "fatal"}], [{"p": "nan"}], ["ab"] * 9]
)
def test_a_watch_that_cannot_work_is_a_400(platform, watch):  # noqa: F811
    client = APIClient()
    client.force_login(platform)
    body = {"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": ["true"]}
    answer = client.post("/api/v1/jobs/", {**body, "watch": watch}, format="json")
    assert answer.status_code == 400 and answer.json()["code"] in {"invalid_watch", "not_a_list"}, answer.json()


def test_a_failure_rate_rule_that_would_restart_or_quarantine_is_refused(platform):  # noqa: F811
    from kernel.errors import ValidationFailed

    for action in ("restart_job", "quarantine_gpu"):
        with pytest.raises(ValidationFailed) as err:
            services.alert_rule_validate({"metric": "job_failure_rate", "threshold": 5, action: True})
        assert err.value.code == "action_not_applicable" and err.value.field == action
    services.alert_rule_validate({"metric": "job_failure_rate", "threshold": 5, "notify": True})
