"""Alert rules firing and resolving on crafted metric series (the sources replaced at their boundary), their
actions taking effect, and the alert and rule APIs."""

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from cluster.models import GPU
from cluster.selectors import pool_cards
from jobs import services as jobs
from jobs.models import Job, JobEvent
from monitoring import services
from monitoring.models import Alert, AlertRule, GpuHealthEvent, Notification, WebhookDelivery
from monitoring.tests.conftest import REAL_UUIDS, T0, api_as
from monitoring.tests.test_collectors import admitted_job, card_series

pytestmark = pytest.mark.django_db
MINUTE = timedelta(minutes=1)


@pytest.fixture(params=["nvml", "dcgm"])
def source(request, real_node, settings):
    """Feed crafted readings through NVML (fake pynvml) or dcgm-exporter (Prometheus on loopback)."""
    if request.param == "nvml":
        nvml = request.getfixturevalue("fake_nvml")

        def feed(at, *, used_pct=10.0, temp=40):
            card = nvml.cards[0]
            card.used_mib, card.temp_c = int(card.total_mib * used_pct / 100), temp
            services.telemetry_collect(now=at)
    else:
        prometheus = request.getfixturevalue("prometheus")
        settings.TRAINYARD_PROMETHEUS_URL = prometheus.url

        def feed(at, *, used_pct=10.0, temp=40):
            used = 81920 * used_pct / 100
            prometheus.series = card_series(
                REAL_UUIDS[0], 0, util=50, used=used, free=81920 - used, temp=temp, power=200
            )
            services.telemetry_collect(now=at)

    return feed


def open_alerts(rule):
    return list(Alert.objects.filter(rule_name=rule).exclude(state=Alert.State.RESOLVED))


def test_gpu_memory_over_90_percent_fires_after_5_minutes_and_resolves(source):
    fired_at = None
    for minute in range(6):
        at = T0 + minute * MINUTE
        source(at, used_pct=95)
        report = services.alerts_evaluate(now=at)
        if report.opened:
            fired_at = minute
    assert fired_at == 5  # not at 0..4 minutes: the condition must hold for 5
    alert = Alert.objects.get(rule_name="gpu-memory-high")
    assert (alert.level, alert.state, alert.gpu.uuid, alert.value) == ("warning", "firing", REAL_UUIDS[0], 95.0)
    assert "memory used 95% for 5 min" in alert.summary

    source(T0 + 6 * MINUTE, used_pct=60)
    services.alerts_evaluate(now=T0 + 6 * MINUTE)

    alert.refresh_from_db()
    assert (alert.state, alert.resolved_by) == ("resolved", "auto")


def test_a_dip_restarts_the_5_minutes(source):
    for minute, pct in enumerate([95, 95, 95, 80, 95, 95, 95, 95, 95]):
        source(T0 + minute * MINUTE, used_pct=pct)
        services.alerts_evaluate(now=T0 + minute * MINUTE)
        assert bool(open_alerts("gpu-memory-high")) == (minute >= 9)
    source(T0 + 9 * MINUTE, used_pct=95)
    services.alerts_evaluate(now=T0 + 9 * MINUTE)
    assert open_alerts("gpu-memory-high")


def test_stale_telemetry_does_not_keep_an_alert_firing(source):
    for minute in range(6):
        source(T0 + minute * MINUTE, used_pct=99)
    services.alerts_evaluate(now=T0 + 5 * MINUTE)
    assert open_alerts("gpu-memory-high")
    services.alerts_evaluate(now=T0 + 30 * MINUTE)  # no sample for 25 minutes: nothing is known any more
    assert not open_alerts("gpu-memory-high")


def test_temperature_over_85_is_critical_at_once_and_resolves(source):
    source(T0, temp=84)
    assert not services.alerts_evaluate(now=T0).opened
    source(T0 + MINUTE, temp=91)
    services.alerts_evaluate(now=T0 + MINUTE)
    alert = Alert.objects.get(rule_name="gpu-temperature")
    assert alert.level == "critical" and "temperature 91 °C" in alert.summary

    source(T0 + 2 * MINUTE, temp=92)
    services.alerts_evaluate(now=T0 + 2 * MINUTE)
    alert.refresh_from_db()
    assert alert.value == 92 and Alert.objects.filter(rule_name="gpu-temperature").count() == 1

    source(T0 + 3 * MINUTE, temp=70)
    services.alerts_evaluate(now=T0 + 3 * MINUTE)
    alert.refresh_from_db()
    assert alert.state == "resolved"


def finished_jobs(user, outcomes: dict[str, int], *, at):
    """Crafted history: `n` jobs of each terminal state, finished at `at`."""
    template, _ = jobs.job_submit(
        user=user,
        data={
            "team": "demo",
            "queue": "train",
            "spec": "shared",
            "image": "python-3.11",
            "command": ["python", "t.py"],
        },
    )
    Job.objects.filter(pk=template.pk).delete()
    rows = []
    for state, n in outcomes.items():
        for _ in range(n):
            template.pk, template.id = None, uuid.uuid4()
            template.state, template.finished_at, template.reason = state, at, state
            rows.append(Job(**{f.attname: getattr(template, f.attname) for f in Job._meta.concrete_fields}))
    Job.objects.bulk_create(rows)


@pytest.mark.parametrize(
    ("outcomes", "fires"),
    [
        ({"succeeded": 19, "failed": 1}, False),  # exactly 5%: not over it
        ({"succeeded": 18, "failed": 2}, True),
        ({"succeeded": 16, "timed_out": 2, "failed": 2}, True),
        ({"failed": 3}, False),  # fewer than the rule's 10 finished jobs say nothing yet
        ({"succeeded": 30, "cancelled": 10, "failed": 1}, False),  # cancelled jobs are not outcomes
    ],
)
def test_job_failure_rate_over_5_percent(db_platform, outcomes, fires):
    finished_jobs(db_platform, outcomes, at=T0 - 10 * MINUTE)
    services.alerts_evaluate(now=T0)
    alerts = open_alerts("job-failure-rate")
    assert bool(alerts) == fires
    if fires:
        assert alerts[0].level == "critical" and alerts[0].subject == "cluster"
        failed, total = outcomes["failed"], sum(v for k, v in outcomes.items() if k != "cancelled")
        assert f"{failed} of {total} jobs" in alerts[0].summary
        services.alerts_evaluate(now=T0 + 2 * timedelta(hours=1))  # the window has moved past them
        assert not open_alerts("job-failure-rate")


def test_queue_depth_rule(db_platform):
    AlertRule.objects.create(name="train-backlog", level="warning", metric="queue_depth", comparator="ge", threshold=2)
    for _ in range(2):
        jobs.job_submit(
            user=db_platform,
            data={"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": ["true"]},
        )
    services.alerts_evaluate(now=T0)
    assert [a.subject for a in open_alerts("train-backlog")] == ["queue:train"]


# ------------------------------------------------------------------------------------------------ actions


@pytest.fixture
def hot_job(db_platform, real_node, fake_nvml):
    """A job admitted onto the first real card, which then runs hot."""
    GPU.objects.filter(uuid=REAL_UUIDS[1]).update(quarantined=True)
    job = admitted_job(db_platform)
    GPU.objects.filter(uuid=REAL_UUIDS[1]).update(quarantined=False)
    fake_nvml.cards[0].temp_c = 95
    return job


def test_notify_reaches_admins_and_the_owners_of_jobs_on_the_card(hot_job):
    services.telemetry_collect(now=T0)
    services.alerts_evaluate(now=T0)

    alert = Alert.objects.get(rule_name="gpu-temperature")
    assert alert.job_ids == [str(hot_job.id)]
    assert set(Notification.objects.filter(alert=alert).values_list("user__username", flat=True)) == {"admin", "demo"}
    event = JobEvent.objects.get(job=hot_job, kind="alert")
    assert event.level == "warning" and "gpu-temperature" in event.message
    mine = api_as("demo").get("/api/v1/monitoring/notifications/?unread=true").json()
    assert [n["alert"] for n in mine] == [alert.id]
    read = api_as("demo").post(f"/api/v1/monitoring/notifications/{mine[0]['id']}/read/")
    assert read.status_code == 200 and read.json()["read_at"]
    assert api_as("demo").get("/api/v1/monitoring/notifications/?unread=true").json() == []


@pytest.fixture
def eager_tasks():
    from trainyard.celery import app

    saved = app.conf.task_always_eager, app.conf.task_eager_propagates
    app.conf.task_always_eager = app.conf.task_eager_propagates = True
    yield
    app.conf.task_always_eager, app.conf.task_eager_propagates = saved


def test_webhook_receives_firing_then_resolved(
    hot_job, fake_nvml, webhook, eager_tasks, django_capture_on_commit_callbacks
):
    AlertRule.objects.filter(name="gpu-temperature").update(webhook_url=webhook.url)
    with django_capture_on_commit_callbacks(execute=True):
        services.telemetry_collect(now=T0)
        services.alerts_evaluate(now=T0)
    fake_nvml.cards[0].temp_c = 60
    with django_capture_on_commit_callbacks(execute=True):
        services.telemetry_collect(now=T0 + MINUTE)
        services.alerts_evaluate(now=T0 + MINUTE)

    assert [r["body"]["event"] for r in webhook.received] == ["firing", "resolved"]
    firing = webhook.received[0]["body"]["alert"]
    assert firing["rule"] == "gpu-temperature" and firing["level"] == "critical"
    assert firing["gpu"] == REAL_UUIDS[0] and firing["node"] == "gpu-host-1"
    assert firing["job_ids"] == [str(hot_job.id)] and firing["value"] == 95
    assert webhook.received[0]["content_type"] == "application/json"
    assert webhook.received[1]["body"]["alert"]["state"] == "resolved"
    assert set(WebhookDelivery.objects.values_list("status", "response_code")) == {("delivered", 200)}


def test_a_failed_webhook_is_recorded_for_retry(hot_job, webhook, settings):
    settings.TRAINYARD_ALERT_WEBHOOK_URL = webhook.url  # the platform-wide default, no per-rule URL
    webhook.status = 500
    services.telemetry_collect(now=T0)
    services.alerts_evaluate(now=T0)
    delivery = WebhookDelivery.objects.get()
    assert delivery.url == webhook.url

    assert services.webhook_deliver(delivery_id=delivery.id) is False

    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.error) == ("failed", 1, "HTTP 500")
    webhook.status = 200
    assert services.webhook_deliver(delivery_id=delivery.id) is True
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("delivered", 2)


def test_an_alert_rules_webhook_is_signed_with_the_platforms_secret_when_one_is_set(hot_job, webhook, settings):
    import hashlib
    import hmac

    settings.TRAINYARD_ALERT_WEBHOOK_URL = webhook.url
    services.telemetry_collect(now=T0)
    services.alerts_evaluate(now=T0)
    delivery = WebhookDelivery.objects.get()
    assert services.webhook_deliver(delivery_id=delivery.id) is True
    assert "X-Trainyard-Signature" not in webhook.received[0]["headers"]  # no secret set: unsigned, as documented

    settings.TRAINYARD_ALERT_WEBHOOK_SECRET = "alert-secret"
    WebhookDelivery.objects.filter(pk=delivery.pk).update(status="pending")
    assert services.webhook_deliver(delivery_id=delivery.id) is True
    got = webhook.received[1]
    stamp = got["headers"]["X-Trainyard-Timestamp"]
    wanted = hmac.new(b"alert-secret", stamp.encode() + b"." + got["raw"], hashlib.sha256).hexdigest()
    assert got["headers"]["X-Trainyard-Signature"] == f"sha256={wanted}"
    assert got["body"]["event"] == "firing"


def test_quarantine_action_takes_the_card_out_of_placement(hot_job):
    AlertRule.objects.filter(name="gpu-temperature").update(quarantine_gpu=True)
    services.telemetry_collect(now=T0)
    services.alerts_evaluate(now=T0)

    gpu = GPU.objects.get(uuid=REAL_UUIDS[0])
    assert gpu.quarantined and gpu.health == GPU.Health.HEALTHY
    assert "gpu-temperature" in gpu.quarantine_reason
    assert gpu.uuid not in {c.gpu.uuid for c in pool_cards()[0]}
    assert GpuHealthEvent.objects.get(gpu=gpu).actor == "alert:gpu-temperature"
    actions = Alert.objects.get(rule_name="gpu-temperature").actions_taken
    assert [a["action"] for a in actions] == ["quarantine_gpu", "notify"]


def test_restart_action_with_nothing_running_says_so(hot_job):
    AlertRule.objects.filter(name="gpu-temperature").update(restart_job=True)
    services.telemetry_collect(now=T0)
    services.alerts_evaluate(now=T0)
    restart = next(a for a in Alert.objects.get().actions_taken if a["action"] == "restart_job")
    assert restart["detail"] == "no running attempt to stop"  # the attempt is only placed, not started


# ------------------------------------------------------------------------------------------------- the API


def test_acknowledge_and_resolve_through_the_api(hot_job, fake_nvml):
    services.telemetry_collect(now=timezone.now())
    services.alerts_evaluate()
    alert = Alert.objects.get(rule_name="gpu-temperature")
    admin, demo = api_as("admin"), api_as("demo")

    listed = demo.get("/api/v1/monitoring/alerts/?open=true&level=critical").json()
    assert [a["id"] for a in listed] == [alert.id] and listed[0]["job_ids"] == [str(hot_job.id)]
    assert demo.post(f"/api/v1/monitoring/alerts/{alert.id}/acknowledge/").status_code == 403

    acked = admin.post(f"/api/v1/monitoring/alerts/{alert.id}/acknowledge/")
    assert acked.status_code == 200 and acked.json()["state"] == "acknowledged"
    assert acked.json()["acknowledged_by"] == "admin"

    refused = admin.post(f"/api/v1/monitoring/alerts/{alert.id}/resolve/", {"note": "fans fixed"}, format="json")
    assert refused.status_code == 409 and refused.json()["code"] == "condition_still_holds"

    fake_nvml.cards[0].temp_c = 50
    services.telemetry_collect(now=timezone.now())
    resolved = admin.post(f"/api/v1/monitoring/alerts/{alert.id}/resolve/", {"note": "fans fixed"}, format="json")
    assert resolved.status_code == 200
    assert (resolved.json()["state"], resolved.json()["resolved_by"], resolved.json()["resolution"]) == (
        "resolved",
        "admin",
        "fans fixed",
    )
    again = admin.post(f"/api/v1/monitoring/alerts/{alert.id}/acknowledge/")
    assert again.status_code == 409 and again.json()["code"] == "alert_resolved"
    assert demo.get("/api/v1/monitoring/alerts/?open=true").json() == []


def test_other_teams_jobs_stay_anonymous_in_alerts(hot_job, outsider):
    services.telemetry_collect(now=T0)
    services.alerts_evaluate(now=T0)
    listed = api_as("outsider").get("/api/v1/monitoring/alerts/").json()
    assert listed[0]["job_ids"] == ["(another team)"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"metric": "gpu_fault"}, "faults_required"),
        ({"metric": "gpu_fault", "faults": ["melted"]}, "unknown_fault"),
        ({"metric": "gpu_memory_pct", "threshold": 150}, "invalid_threshold"),
        ({"metric": "gpu_temperature_c", "faults": ["gpu_lost"]}, "faults_not_applicable"),
        ({"metric": "gpu_temperature_c", "webhook_url": "ftp://example.com/x"}, "invalid_webhook_url"),
        ({"metric": "gpu_temperature_c", "webhook_url": "not a url"}, "invalid"),
        ({"metric": "no_such_metric"}, "invalid_choice"),
    ],
)
def test_rule_validation_errors_have_codes(db_platform, body, code):
    data = {"name": "my-rule", "level": "critical", "threshold": 80, **body}
    response = api_as("admin").post("/api/v1/monitoring/rules/", data, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == code
    assert not AlertRule.objects.filter(name="my-rule").exists()


def test_admins_edit_rules_and_a_disabled_rule_resolves_its_alerts(hot_job):
    demo, admin = api_as("demo"), api_as("admin")
    names = {r["name"] for r in demo.get("/api/v1/monitoring/rules/").json()}
    assert {
        "gpu-memory-high",
        "job-failure-rate",
        "gpu-temperature",
        "gpu-lost",
        "driver-reset",
        "device-unhealthy",
    } <= names
    assert (
        demo.post(
            "/api/v1/monitoring/rules/", {"name": "x", "level": "warning", "metric": "gpu_power_w"}, format="json"
        ).status_code
        == 403
    )

    created = admin.post(
        "/api/v1/monitoring/rules/",
        {"name": "power-draw", "level": "warning", "metric": "gpu_power_w", "threshold": 50},
        format="json",
    )
    assert created.status_code == 201, created.json()
    services.telemetry_collect(now=T0)
    services.alerts_evaluate(now=T0)
    assert len(open_alerts("power-draw")) == 2  # both fake cards draw 60 W

    rule_id = created.json()["id"]
    patched = admin.patch(f"/api/v1/monitoring/rules/{rule_id}/", {"enabled": False}, format="json")
    assert patched.status_code == 200 and patched.json()["enabled"] is False
    services.alerts_evaluate(now=T0)
    assert set(Alert.objects.filter(rule_name="power-draw").values_list("state", "resolution")) == {
        ("resolved", "the rule was disabled")
    }


def test_the_admin_console_refuses_an_inconsistent_rule(db_platform):
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.get(username="admin"))
    form = {
        "name": "console-rule",
        "level": "fatal",
        "metric": "gpu_fault",
        "comparator": "gt",
        "threshold": "0",
        "for_seconds": "0",
        "window_seconds": "3600",
        "min_samples": "1",
        "faults": "[]",
        "enabled": "on",
    }
    refused = client.post("/admin/monitoring/alertrule/add/", form)
    assert refused.status_code == 200 and "lists the faults it matches" in refused.content.decode()
    assert not AlertRule.objects.filter(name="console-rule").exists()
    saved = client.post("/admin/monitoring/alertrule/add/", {**form, "faults": '["gpu_lost"]'})
    assert saved.status_code == 302 and AlertRule.objects.get(name="console-rule").faults == ["gpu_lost"]


def test_other_teams_job_ids_are_hidden_in_actions_taken(hot_job, outsider, client):
    services.telemetry_collect(now=T0)
    services.alerts_evaluate(now=T0)
    alert = Alert.objects.get(rule_name="gpu-temperature")
    # What a restart of the job on the card records (monitoring.services._restart).
    restart = {
        "action": "restart_job",
        "detail": f"stopped {hot_job.id}#1 for a retry",
        "attempts": [f"{hot_job.id}#1"],
    }
    Alert.objects.filter(pk=alert.pk).update(actions_taken=[restart])

    theirs = api_as("outsider").get("/api/v1/monitoring/alerts/").json()[0]["actions_taken"]
    assert str(hot_job.id) not in str(theirs)
    assert theirs == [
        {"action": "restart_job", "detail": "stopped (another team)#1 for a retry", "attempts": ["(another team)#1"]}
    ]
    for member in ["demo", "admin"]:
        assert api_as(member).get("/api/v1/monitoring/alerts/").json()[0]["actions_taken"] == [restart], member
        assert api_as(member).get(f"/api/v1/monitoring/alerts/{alert.id}/").json()["actions_taken"] == [restart]
    assert str(hot_job.id) not in str(api_as("outsider").get(f"/api/v1/monitoring/alerts/{alert.id}/").json())

    client.force_login(outsider)
    page = client.get("/monitoring/alerts/").content.decode()
    assert "stopped (another team)#1 for a retry" in page and str(hot_job.id) not in page
