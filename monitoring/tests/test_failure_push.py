"""Pushed failures, end to end on the local backend with a real Celery worker: a job that fails for the user's
reason has its stderr kept apart from stdout; its owner gets a portal notification with the last stderr lines, a
signed POST to the webhook they set (a real loopback server that checks the HMAC signature, and fails the first
delivery so the task's retry is what delivers it), and an email (Django's locmem backend). The settings' API
refuses what cannot work with a code; team default watches and the watch alert's rate limit."""

import hashlib
import hmac
import json
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.tests.conftest import platform, wait_for  # noqa: F401 - the seeded platform fixture
from jobs.tests.test_lifecycle_e2e import finished, submit
from monitoring import services
from monitoring.models import Alert, Notification, PushSettings, WebhookDelivery
from monitoring.services import push
from monitoring.services.business import _log_watch_alerts
from quotas.models import Team

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "a-long-shared-secret-for-tests"


class VerifyingReceiver:
    """A webhook endpoint as a user would write one: it recomputes the signature over the timestamp and the raw
    body with the shared secret and answers 401 when they differ; it answers 503 to the first `fail_first`."""

    def __init__(self, secret: str, *, fail_first: int = 0):
        self.secret = secret
        self.fail_first = fail_first
        self.calls: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                stamp = self.headers.get("X-Trainyard-Timestamp", "")
                given = self.headers.get("X-Trainyard-Signature", "")
                expected = "sha256=" + hmac.new(owner.secret.encode(), f"{stamp}.".encode() + body,
                                                hashlib.sha256).hexdigest()  # fmt: skip
                verified = hmac.compare_digest(given, expected) and abs(time.time() - int(stamp or 0)) < 300
                owner.calls.append({"verified": verified, "body": json.loads(body), "at": time.monotonic()})
                status = 503 if len(owner.calls) <= owner.fail_first else (200 if verified else 401)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver():
    server = VerifyingReceiver(SECRET, fail_first=1)
    yield server
    server.close()


FAILING = (
    "echo 'epoch 1 starting'; echo 'Traceback (most recent call last):' >&2; echo 'epoch 1 step 5'; "
    "echo 'ValueError: learning rate must be positive' >&2; exit 1"
)


def test_a_users_failure_pushes_its_stderr_to_the_portal_a_signed_webhook_and_email(
    platform,  # noqa: F811
    celery_worker_thread,
    receiver,
    settings,
):
    settings.TRAINYARD_PUSH_WEBHOOK_ALLOW_PRIVATE = True  # the test's receiver listens on loopback
    owner = APIClient()
    owner.force_authenticate(platform)
    saved = owner.put(
        "/api/v1/monitoring/push-settings/",
        {"webhook_url": receiver.url, "webhook_secret": SECRET, "email": "demo@example.org"},
        format="json",
    )
    assert saved.status_code == 200, saved.json()
    assert saved.json()["has_secret"] is True and "webhook_secret" not in saved.json()

    job = submit(platform, command=["sh", "-c", FAILING])
    job = wait_for(lambda: finished(job), timeout=60)
    attempt = job.attempts.get()
    assert job.state == "failed" and attempt.failure_class == "user" and attempt.exit_code == 1

    # stderr is kept apart: the merged log still has all four lines (each stream in its order), stderr its two.
    merged = owner.get(f"/api/v1/jobs/{job.id}/logs/").json()["lines"]
    texts = [x["text"] for x in merged if not x["text"].startswith("[trainyard]")]
    assert sorted(texts) == sorted(["epoch 1 starting", "Traceback (most recent call last):", "epoch 1 step 5",
                                    "ValueError: learning rate must be positive"])  # fmt: skip
    assert texts.index("epoch 1 starting") < texts.index("epoch 1 step 5")
    alone = owner.get(f"/api/v1/jobs/{job.id}/logs/", {"stream": "stderr"}).json()
    assert [x["text"] for x in alone["lines"]] == [
        "Traceback (most recent call last):",
        "ValueError: learning rate must be positive",
    ]
    by_number = {x["n"]: x["text"] for x in merged}
    assert all(by_number[x["n"]] == x["text"] for x in alone["lines"])  # numbered as in the merged log
    assert alone["stderr_lines"] == 2
    assert owner.get(f"/api/v1/jobs/{job.id}/logs/", {"stream": "stdout2"}).json()["code"] == "invalid_stream"

    assert services.failures_push() == 1
    assert services.failures_push() == 0  # pushed once, whatever the number of passes
    alert = Alert.objects.get(rule_name="job-failed")
    note = Notification.objects.get(alert=alert)
    assert note.user == platform and "ValueError: learning rate must be positive" in note.message
    assert f"/jobs/{job.id}/" in note.message and "exit 1" in note.message
    listed = owner.get("/api/v1/monitoring/notifications/").json()
    assert any("learning rate" in n["message"] for n in listed)

    delivery = WebhookDelivery.objects.get(alert=alert)
    wait_for(lambda: WebhookDelivery.objects.get(pk=delivery.pk).status == "delivered", timeout=40, observe=False)
    delivery.refresh_from_db()
    assert delivery.attempts == 2 and delivery.response_code == 200  # the 503 was retried by the task
    assert [c["verified"] for c in receiver.calls] == [True, True]
    assert receiver.calls[1]["at"] - receiver.calls[0]["at"] >= 3.5  # a backed-off retry, not a tight loop
    body = receiver.calls[-1]["body"]
    assert body["event"] == "job_failed" and body["job"]["id"] == str(job.id) and body["lines_from"] == "stderr"
    assert body["last_lines"][-1] == "ValueError: learning rate must be positive"
    assert "epoch 1 step 5" not in body["last_lines"]

    sent = wait_for(lambda: list(mail.outbox), timeout=20, observe=False)
    assert sent[0].to == ["demo@example.org"] and job.name in sent[0].subject
    assert "ValueError: learning rate must be positive" in sent[0].body and "stderr" in sent[0].body

    portal = Client()
    portal.force_login(platform)
    assert "stream=stderr" in portal.get(f"/jobs/{job.id}/").content.decode()
    shown = portal.get(f"/jobs/{job.id}/logs/download/", {"attempt": 1, "stream": "stderr"}).content.decode()
    numbers = {x["text"]: x["n"] for x in alone["lines"]}
    assert shown == "".join(f"{numbers[t]}\t{t}\n" for t in numbers)
    page = portal.get("/settings/notifications/").content.decode()
    assert "learning rate must be positive" in page and receiver.url in page


def test_the_portal_sets_the_push_settings_and_says_what_is_wrong(platform):  # noqa: F811
    portal = Client()
    portal.force_login(platform)
    url = "/settings/notifications/"
    bad = portal.post(url, {"webhook_url": "https://example.org/hook", "webhook_secret": "short", "email": ""})
    assert bad.status_code == 400 and 'id="err-webhook_secret"' in bad.content.decode()
    bad = portal.post(url, {"webhook_url": "", "email": "not-an-address"})
    assert bad.status_code == 400 and 'id="err-email"' in bad.content.decode()
    good = portal.post(url, {"webhook_url": "https://example.org/hook", "webhook_secret": SECRET, "email": "a@b.org"})
    assert good.status_code == 302
    kept = portal.post(url, {"webhook_url": "https://example.org/other", "webhook_secret": "", "email": "a@b.org"})
    assert kept.status_code == 302  # an empty secret box keeps the secret already set
    row = PushSettings.objects.get(user=platform)
    assert (row.webhook_url, row.webhook_secret, row.email) == ("https://example.org/other", SECRET, "a@b.org")


def test_the_signature_covers_the_timestamp_and_every_byte_of_the_body():
    body = b'{"event": "job_failed"}'
    headers = push.signed_headers(SECRET, body)
    stamp, sig = headers["X-Trainyard-Timestamp"], headers["X-Trainyard-Signature"]
    assert sig == "sha256=" + push.signature(SECRET, stamp, body)
    assert sig != "sha256=" + push.signature(SECRET, stamp, body + b" ")
    assert sig != "sha256=" + push.signature(SECRET, str(int(stamp) + 1), body)
    assert sig != "sha256=" + push.signature(SECRET + "x", stamp, body)


@pytest.mark.parametrize(
    "data, code",
    [
        ({"webhook_url": "ftp://example.org/x", "webhook_secret": SECRET}, "invalid_webhook_url"),
        ({"webhook_url": "not a url", "webhook_secret": SECRET}, "invalid_webhook_url"),
        ({"webhook_url": "https://example.org/hook"}, "invalid_webhook_secret"),
        ({"webhook_url": "https://example.org/hook", "webhook_secret": "short"}, "invalid_webhook_secret"),
        ({"email": "nobody-at-example"}, "invalid_email"),
        ({"webhook_url": "http://127.0.0.1:6379/", "webhook_secret": SECRET}, "webhook_url_not_public"),
        ({"webhook_url": "http://localhost:8000/admin/", "webhook_secret": SECRET}, "webhook_url_not_public"),
        ({"webhook_url": "http://10.0.0.7/hook", "webhook_secret": SECRET}, "webhook_url_not_public"),
        ({"webhook_url": "http://[::1]/hook", "webhook_secret": SECRET}, "webhook_url_not_public"),
        ({"webhook": "https://example.org/hook"}, None),  # an unknown field
    ],
)
def test_push_settings_that_cannot_work_are_a_400_with_a_code(platform, data, code):  # noqa: F811
    client = APIClient()
    client.force_authenticate(platform)
    answer = client.put("/api/v1/monitoring/push-settings/", data, format="json")
    assert answer.status_code == 400, answer.json()
    if code:
        assert answer.json()["code"] == code
    assert not PushSettings.objects.exists()


def test_push_settings_read_back_without_the_secret_and_an_empty_url_turns_the_webhook_off(platform):  # noqa: F811
    client = APIClient()
    client.force_authenticate(platform)
    url = "/api/v1/monitoring/push-settings/"
    assert client.get(url).json() == {"webhook_url": "", "has_secret": False, "email": "", "updated_at": None}
    client.put(url, {"webhook_url": "https://example.org/hook", "webhook_secret": SECRET}, format="json")
    client.patch(url, {"email": "demo@example.org"}, format="json")  # the webhook is kept
    shown = client.get(url).json()
    assert shown["webhook_url"] == "https://example.org/hook" and shown["has_secret"] and shown["email"]
    client.patch(url, {"webhook_url": ""}, format="json")
    row = PushSettings.objects.get(user=platform)
    assert row.webhook_url == "" and row.webhook_secret == "" and row.email == "demo@example.org"
    other = APIClient()
    other.force_authenticate(get_user_model().objects.get(username="admin"))
    assert other.get(url).json()["webhook_url"] == ""  # each user sees their own


def test_a_teams_default_watch_raises_an_alert_with_the_line_and_a_link_and_reopens_only_after_the_limit(
    platform,  # noqa: F811
    celery_worker_thread,
    settings,
):
    Team.objects.filter(slug="demo").update(watch=[{"pattern": "nan loss", "level": "critical"}])
    job = submit(platform, command=["sh", "-c", "echo 'step 1 ok'; echo 'step 2 NaN loss'; echo done"])
    assert job.watch == []  # the job names nothing itself
    job = wait_for(lambda: finished(job), timeout=60)
    services.business_metrics_scan()
    alert = Alert.objects.get(rule_name="log-watch: nan loss")
    assert alert.level == "critical" and alert.job_ids == [str(job.id)]
    assert (
        "line 2): step 2 NaN loss" in alert.summary
        and f"/api/v1/jobs/{job.id}/logs/?attempt=1&start=2" in alert.summary
    )
    portal = APIClient()
    portal.force_authenticate(platform)
    at_line = portal.get(f"/api/v1/jobs/{job.id}/logs/", {"attempt": 1, "start": 2}).json()["lines"]
    assert at_line[0] == {"n": 2, "text": "step 2 NaN loss"}  # the link lands on the line
    assert Notification.objects.filter(user=platform, alert=alert).exists()

    services.alert_close(alert, by="demo", note="looked at it", now=alert.started_at)
    attempt = job.attempts.get()
    watches = [{"pattern": "nan loss", "level": "critical"}]
    soon = alert.started_at + timedelta(seconds=settings.TRAINYARD_LOG_WATCH_REOPEN_S / 2)
    _log_watch_alerts(attempt, [(7, "again nan loss", 0)], watches, now=soon)
    assert Alert.objects.filter(rule_name="log-watch: nan loss").count() == 1  # within the limit: counted only
    assert Alert.objects.get(pk=alert.pk).value == 2
    later = alert.started_at + timedelta(seconds=settings.TRAINYARD_LOG_WATCH_REOPEN_S + 1)
    _log_watch_alerts(attempt, [(9, "still nan loss", 0)], watches, now=later)
    reopened = Alert.objects.filter(rule_name="log-watch: nan loss").exclude(pk=alert.pk).get()
    assert reopened.is_open and "line 9" in reopened.summary


def test_a_team_watch_that_cannot_work_is_refused_by_the_admin_console(platform, client):  # noqa: F811
    from quotas.admin import TeamForm

    team = Team.objects.get(slug="demo")
    for bad in ('"nan"', '[{"pattern": "x"}]', '[{"pattern": "nan loss", "level": "fatal"}]'):
        form = TeamForm(instance=team, data={**_team_form_data(team), "watch": bad})
        assert not form.is_valid() and "watch" in form.errors, bad
    form = TeamForm(instance=team, data={**_team_form_data(team), "watch": '["nan loss"]'})
    assert form.is_valid(), form.errors
    assert form.cleaned_data["watch"] == [{"pattern": "nan loss", "level": "warning"}]


def test_a_teams_maintainer_sets_its_watches_over_the_api_and_a_member_cannot(platform):  # noqa: F811
    from quotas.models import Membership, QuotaChange
    from quotas.tests.factories import UserFactory

    maintainer = APIClient()
    maintainer.force_authenticate(platform)  # demo maintains the demo team
    url = "/api/v1/teams/demo/watch/"
    answer = maintainer.put(url, {"watch": ["nan loss", {"pattern": "CUDA error", "level": "critical"}]}, format="json")
    assert answer.status_code == 200, answer.content
    expected = [{"pattern": "nan loss", "level": "warning"}, {"pattern": "CUDA error", "level": "critical"}]
    assert answer.json()["watch"] == expected
    assert Team.objects.get(slug="demo").watch == expected
    assert maintainer.get("/api/v1/teams/demo/").json()["watch"] == expected
    assert QuotaChange.objects.filter(field="watch", team__slug="demo", actor=platform).count() == 1

    for bad in ("nan", [{"pattern": "x"}], [{"pattern": "nan loss", "level": "fatal"}], ["ab"] * 9):
        refused = maintainer.put(url, {"watch": bad}, format="json")
        assert refused.status_code == 400 and refused.json()["code"] == "invalid_watch", bad
    assert maintainer.put(url, {"watch": [], "extra": 1}, format="json").json()["code"] == "unknown_field"
    assert Team.objects.get(slug="demo").watch == expected  # nothing refused changed anything

    member = UserFactory(username="member-only")
    Membership.objects.create(team=Team.objects.get(slug="demo"), user=member, role=Membership.Role.MEMBER)
    plain = APIClient()
    plain.force_authenticate(member)
    assert plain.put(url, {"watch": []}, format="json").status_code == 403
    stranger = APIClient()
    stranger.force_authenticate(UserFactory(username="elsewhere"))
    assert stranger.put(url, {"watch": []}, format="json").status_code == 404
    assert maintainer.put(url, {"watch": []}, format="json").json()["watch"] == []


def _team_form_data(team):
    from django.forms.models import model_to_dict

    from quotas.admin import TeamForm

    form = TeamForm(instance=team)
    data = {}
    for name, field in form.fields.items():
        value = form.initial.get(name, model_to_dict(team).get(name))
        data[name] = field.prepare_value(value) if value is not None else ""
    return data


def test_a_webhook_that_points_inside_the_platform_when_it_is_sent_is_refused_not_posted(platform, receiver):  # noqa: F811
    """Saved while allowed (or while its name pointed elsewhere), a loopback webhook is looked up again when sent."""
    from django.test import override_settings

    with override_settings(TRAINYARD_PUSH_WEBHOOK_ALLOW_PRIVATE=True):
        push.push_settings_save(user=platform, data={"webhook_url": receiver.url, "webhook_secret": SECRET})
    now = timezone.now()
    alert = Alert.objects.create(
        rule_name="job-failed", level="warning", fingerprint="job-failed:x:1", subject="job x", summary="x",
        started_at=now, last_seen_at=now, state="resolved", resolved_at=now,
    )  # fmt: skip
    delivery = WebhookDelivery.objects.create(alert=alert, event="job_failed", url=receiver.url, user=platform)
    assert services.webhook_deliver(delivery_id=delivery.pk) is True  # done: nothing to retry
    delivery.refresh_from_db()
    assert delivery.status == "failed" and "127.0.0.1" in delivery.error and receiver.calls == []
