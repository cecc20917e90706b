"""The server-rendered pages: cluster, alerts (acknowledge/resolve), GPU actions, and the job charts fragment."""

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from cluster.models import GPU
from monitoring import services
from monitoring.models import Alert, BusinessMetric
from monitoring.tests.conftest import REAL_UUIDS, emulated_gpus, plant_faults
from monitoring.tests.test_collectors import admitted_job

pytestmark = pytest.mark.django_db


def browser(username: str) -> Client:
    client = Client()
    client.login(username=username, password="admin-pass-123" if username == "admin" else "demo-pass-123")
    return client


def test_pages_need_a_login(db_platform):
    for url in ("/monitoring/cluster/", "/monitoring/alerts/"):
        response = Client().get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]


def test_cluster_page_says_emulated_cards_have_no_telemetry(db_platform):
    services.scheduling_sample(now=timezone.now() - timedelta(minutes=2))
    services.scheduling_sample()
    html = browser("demo").get("/monitoring/cluster/").content.decode()
    assert html.count("emulated: no telemetry") == 4
    assert "<svg" in html and 'data-series="compute allocated"' in html
    assert "Return to service" not in html and "Probe now" not in html
    assert "Probe now" in browser("admin").get("/monitoring/cluster/").content.decode()


def test_cluster_page_shows_real_telemetry(real_node, fake_nvml):
    fake_nvml.cards[0].util, fake_nvml.cards[0].temp_c = 77, 66
    services.telemetry_collect(now=timezone.now() - timedelta(minutes=1))
    services.telemetry_collect()
    html = browser("demo").get("/monitoring/cluster/").content.decode()
    row = html[html.index(f'id="gpu-{REAL_UUIDS[0]}"') :]
    row = row[: row.index("</tr>")]
    assert "util 77%" in row and "66 °C" in row and 'data-series="utilization"' in row


def test_admin_acknowledges_and_returns_a_card_from_the_pages(db_platform, settings):
    bad = emulated_gpus()[0]
    plant_faults(settings, {bad.uuid: "gpu_lost"})
    services.gpu_probe_all()
    alert = Alert.objects.get()
    admin = browser("admin")

    page = admin.get("/monitoring/alerts/").content.decode()
    assert f'id="alert-{alert.id}"' in page and "GPU lost" in page and "Acknowledge" in page

    # A member may read but not handle alerts.
    browser("demo").post(f"/monitoring/alerts/{alert.id}/acknowledge/")
    assert Alert.objects.get().state == "firing"

    response = admin.post(f"/monitoring/alerts/{alert.id}/acknowledge/", follow=True)
    assert "acknowledged" in response.content.decode()
    assert Alert.objects.get().state == "acknowledged"

    refused = admin.post(f"/monitoring/gpus/{bad.uuid}/return/", follow=True).content.decode()
    assert "probe_failing" in refused
    plant_faults(settings, {})
    admin.post(f"/monitoring/gpus/{bad.uuid}/return/")
    bad.refresh_from_db()
    assert bad.health == GPU.Health.HEALTHY and not bad.quarantined
    assert Alert.objects.get().state == "resolved"


def test_job_charts_fragment_shows_the_three_layers(db_platform, outsider):
    job = admitted_job(db_platform)
    BusinessMetric.objects.bulk_create(
        [
            BusinessMetric(
                job=job,
                attempt_number=1,
                at=timezone.now(),
                step=s,
                values={"loss": 1 / s, "throughput": 90},
                source="log",
                line=s,
            )
            for s in range(1, 6)
        ]
    )

    response = browser("demo").get(f"/monitoring/jobs/{job.id}/charts/")

    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html  # a fragment for the job page
    assert "emulated: no telemetry" in html  # it holds an emulated card
    loss = re.search(r'<polyline data-series="loss"[^>]*points="([^"]+)"', html)
    assert loss and len(loss.group(1).split()) == 5
    assert "x axis: training step" in html and "5 report(s)" in html
    assert browser_outsider_status(job) == 404


def browser_outsider_status(job) -> int:
    client = Client()
    client.force_login(type(job.owner).objects.get(username="outsider"))
    return client.get(f"/monitoring/jobs/{job.id}/charts/").status_code


def test_the_job_page_can_embed_the_charts_with_a_tag(db_platform):
    from django.template import Context, Template

    job = admitted_job(db_platform)
    html = Template("{% load monitoring_charts %}{% job_charts job %}").render(Context({"job": job}))
    assert f'data-job="{job.id}"' in html and "emulated: no telemetry" in html


def test_admin_reads_health_records_but_cannot_edit_or_delete_them(db_platform, settings):
    from monitoring.models import GpuHealthEvent, GpuStatus

    bad = emulated_gpus()[0]
    plant_faults(settings, {bad.uuid: "gpu_lost"})
    services.gpu_probe_all()
    event, status, alert = (
        GpuHealthEvent.objects.filter(gpu=bad).first(),
        GpuStatus.objects.get(gpu=bad),
        Alert.objects.get(),
    )
    admin = browser("admin")
    for model, obj in (("gpuhealthevent", event), ("gpustatus", status), ("alert", alert)):
        page = admin.get(f"/admin/monitoring/{model}/{obj.pk}/change/")
        assert page.status_code == 200 and 'name="_save"' not in page.content.decode(), model
        assert admin.post(f"/admin/monitoring/{model}/{obj.pk}/delete/", {"post": "yes"}).status_code == 403, model
        assert admin.get(f"/admin/monitoring/{model}/add/").status_code == 403, model
    assert GpuHealthEvent.objects.filter(pk=event.pk).exists() and Alert.objects.filter(pk=alert.pk).exists()
    # Alerts are still handled in bulk from the list.
    admin.post("/admin/monitoring/alert/", {"action": "acknowledge", "_selected_action": [alert.pk], "index": 0})
    assert Alert.objects.get().state == "acknowledged"
