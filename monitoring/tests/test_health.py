"""The health state machine: probes, faults, quarantine at once, one alert per incident, return to service."""

import pytest

from cluster.models import GPU
from cluster.selectors import pool_cards
from jobs import services as jobs
from jobs import store
from jobs.states import JobState
from kernel.errors import Conflict
from monitoring import services
from monitoring.models import Alert, GpuHealthEvent, GpuStatus, Notification
from monitoring.tests.conftest import REAL_UUIDS, T0, api_as, emulated_gpus, plant_faults

pytestmark = pytest.mark.django_db


def test_a_failing_probe_takes_the_gpu_out_of_placement_at_once(db_platform, settings):
    bad = emulated_gpus()[0]
    assert bad.uuid in {c.gpu.uuid for c in pool_cards()[0]}
    plant_faults(settings, [bad.uuid])

    report = services.gpu_probe_all(now=T0)

    bad.refresh_from_db()
    assert report.left_service == [bad.uuid] and report.failed == 1
    assert bad.health == GPU.Health.UNHEALTHY and bad.quarantined
    assert "emulated fault planted" in bad.quarantine_reason
    assert bad.uuid not in {c.gpu.uuid for c in pool_cards()[0]}
    event = GpuHealthEvent.objects.get(gpu=bad)
    assert (event.from_health, event.to_health, event.fault, event.actor) == (
        "healthy",
        "unhealthy",
        "probe_failed",
        "health-probe",
    )
    # A job submitted now is admitted onto another card, never the failed one.
    job, _ = jobs.job_submit(
        user=db_platform,
        data={"team": "demo", "queue": "train", "spec": "guaranteed", "image": "python-3.11", "command": ["true"]},
    )
    store.dispatch(queue_ids=[job.queue_id])
    job.refresh_from_db()
    assert job.state == JobState.ADMITTED
    assert bad.uuid not in [d["gpu_uuid"] for d in job.attempts.get().placement["devices"]]


@pytest.mark.parametrize(
    ("planted", "rule", "fault"),
    [
        ("gpu_lost", "gpu-lost", "gpu_lost"),
        ("driver_reset", "driver-reset", "driver_reset"),
        ("xid:79", "gpu-lost", "gpu_lost"),
        ("xid:48", "device-unhealthy", "xid"),
        ("probe_failed", "device-unhealthy", "probe_failed"),
    ],
)
def test_each_fault_opens_its_fatal_alert(db_platform, settings, planted, rule, fault):
    bad = emulated_gpus()[1]
    plant_faults(settings, {bad.uuid: planted})

    services.gpu_probe_all(now=T0)

    alert = Alert.objects.get()
    assert (alert.rule_name, alert.level, alert.state) == (rule, "fatal", "firing")
    assert alert.gpu == bad and "quarantined" in alert.summary
    assert GpuStatus.objects.get(gpu=bad).fault == fault
    admin_note = Notification.objects.get(user__username="admin", alert=alert)
    assert rule in admin_note.message


def test_repeated_failing_probes_make_one_alert_per_incident(db_platform, settings):
    bad = emulated_gpus()[0]
    plant_faults(settings, {bad.uuid: "gpu_lost"})
    for second in range(0, 60, 10):
        services.gpu_probe_all(now=T0.replace(second=second))

    alert = Alert.objects.get()
    assert alert.value == 6  # six failed probes, one incident
    assert "6 failed check(s)" in alert.summary
    assert Notification.objects.filter(alert=alert).count() == 1
    assert GpuHealthEvent.objects.filter(gpu=bad).count() == 1


def test_a_passing_probe_heals_a_suspect_card_but_never_an_unhealthy_one(db_platform, settings):
    suspect, unhealthy = emulated_gpus()[:2]
    GPU.objects.filter(pk=suspect.pk).update(health=GPU.Health.SUSPECT)
    plant_faults(settings, [unhealthy.uuid])
    services.gpu_probe_all(now=T0)
    plant_faults(settings, [])

    services.gpu_probe_all(now=T0.replace(second=10))

    suspect.refresh_from_db()
    unhealthy.refresh_from_db()
    assert suspect.health == GPU.Health.HEALTHY
    assert unhealthy.health == GPU.Health.UNHEALTHY and unhealthy.quarantined
    assert Alert.objects.get().state == Alert.State.FIRING


def test_an_admin_returns_a_card_to_service_only_once_it_passes(db_platform, settings):
    bad = emulated_gpus()[0]
    plant_faults(settings, {bad.uuid: "driver_reset"})
    services.gpu_probe_all(now=T0)
    admin = api_as("admin")

    refused = admin.post(f"/api/v1/monitoring/gpus/{bad.uuid}/return-to-service/", {}, format="json")
    assert refused.status_code == 409 and refused.json()["code"] == "probe_failing"
    assert api_as("demo").post(f"/api/v1/monitoring/gpus/{bad.uuid}/return-to-service/").status_code == 403

    plant_faults(settings, {})
    response = admin.post(f"/api/v1/monitoring/gpus/{bad.uuid}/return-to-service/", {}, format="json")

    assert response.status_code == 200, response.json()
    assert response.json() == {"gpu": bad.uuid, "health": "healthy", "quarantined": False}
    assert bad.uuid in {c.gpu.uuid for c in pool_cards()[0]}
    alert = Alert.objects.get()
    assert alert.state == Alert.State.RESOLVED and alert.resolved_by == "auto"
    assert GpuStatus.objects.get(gpu=bad).fault == ""
    assert list(GpuHealthEvent.objects.filter(gpu=bad).order_by("id").values_list("to_health", "actor")) == [
        ("unhealthy", "health-probe"),
        ("healthy", "admin"),
    ]


def test_forced_return_skips_the_probe(db_platform, settings):
    bad = emulated_gpus()[0]
    plant_faults(settings, [bad.uuid])
    services.gpu_probe_all(now=T0)
    with pytest.raises(Conflict):
        services.gpu_return_to_service(gpu_uuid=bad.uuid, actor="admin")
    gpu = services.gpu_return_to_service(gpu_uuid=bad.uuid, actor="admin", force=True)
    assert gpu.health == GPU.Health.HEALTHY and not gpu.quarantined
    assert "forced" in GpuHealthEvent.objects.filter(gpu=bad).latest("id").reason


@pytest.mark.parametrize(
    ("error", "rule"), [("NVML_ERROR_GPU_IS_LOST", "gpu-lost"), ("NVML_ERROR_RESET_REQUIRED", "driver-reset")]
)
def test_nvml_probe_names_the_fault(real_node, fake_nvml, error, rule):
    fake_nvml.cards[1].error = getattr(fake_nvml, error)

    services.gpu_probe_all(now=T0)

    lost = GPU.objects.get(uuid=REAL_UUIDS[1])
    assert lost.health == GPU.Health.UNHEALTHY and lost.quarantined
    assert GPU.objects.get(uuid=REAL_UUIDS[0]).health == GPU.Health.HEALTHY
    assert Alert.objects.get().rule_name == rule


def test_probe_now_through_the_api(db_platform, settings):
    bad = emulated_gpus()[2]
    plant_faults(settings, {bad.uuid: "gpu_lost"})
    response = api_as("admin").post(f"/api/v1/monitoring/gpus/{bad.uuid}/probe/")
    assert response.status_code == 200
    body = response.json()
    assert body["ok"] is False and body["fault"] == "gpu_lost" and body["quarantined"] is True
    assert api_as("demo").post(f"/api/v1/monitoring/gpus/{bad.uuid}/probe/").status_code == 403
