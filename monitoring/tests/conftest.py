"""Fixtures of the monitoring tests: a seeded platform, a node of (fake-NVML) real cards, loopback servers."""

from __future__ import annotations

import json
import sys
import uuid
from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from cluster import nvml as cluster_nvml
from cluster.models import GPU, Node
from jobs.backends import reset_backends
from jobs.tests.conftest import wait_for  # noqa: F401 - shared with the lifecycle tests
from monitoring import celery_metrics, collectors
from monitoring.defaults import seed_rules
from monitoring.models import AlertRule
from monitoring.tests.fakes import FakeCard, FakeNvml, PrometheusServer, WebhookReceiver

T0 = datetime(2030, 1, 6, 12, 0, tzinfo=UTC)
REAL_UUIDS = ["GPU-11111111-aaaa-bbbb-cccc-000000000001", "GPU-11111111-aaaa-bbbb-cccc-000000000002"]


@pytest.fixture
def platform_settings(settings, tmp_path):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests only
    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_LOCAL_GPUS = "4x24GiB"
    settings.TRAINYARD_WORK_ROOT = tmp_path / "work"
    settings.TRAINYARD_STATE_ROOT = tmp_path / "state"
    settings.TRAINYARD_LOG_ROOT = tmp_path / "logs"
    settings.TRAINYARD_EMULATED_FAULTS_FILE = str(tmp_path / "faults.json")
    settings.TRAINYARD_ALERT_WEBHOOK_URL = ""
    settings.TRAINYARD_TELEMETRY_SOURCE = "auto"
    settings.TRAINYARD_PROMETHEUS_URL = ""
    settings.TRAINYARD_CANCEL_GRACE_S = 2.0
    settings.TRAINYARD_TASK_METRICS_PREFIX = prefix = f"trainyard-test:{uuid.uuid4().hex}:task-metrics"
    reset_backends()
    yield settings
    reset_backends()
    client = celery_metrics.redis_client()
    for key in client.scan_iter(match=f"{prefix}:*"):
        client.delete(key)


@pytest.fixture
def seeded(platform_settings):
    """Queues, specs, the demo team and users, the emulated 4-card node, and the default alert rules."""
    from ops.seed import seed

    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    seed_rules(AlertRule)
    return get_user_model().objects.get(username="demo")


@pytest.fixture
def db_platform(db, seeded):
    return seeded


def plant_faults(settings, faults) -> None:
    with open(settings.TRAINYARD_EMULATED_FAULTS_FILE, "w") as f:
        json.dump(faults, f)


def emulated_gpus() -> list[GPU]:
    return list(GPU.objects.filter(node__emulated=True).order_by("index"))


@pytest.fixture
def outsider(db_platform):
    """A user of another team."""
    from quotas.tests.factories import MembershipFactory, TeamFactory, UserFactory

    user = UserFactory(username="outsider")
    MembershipFactory(team=TeamFactory(slug="other", name="Other team"), user=user)
    return user


def make_real_node() -> list[GPU]:
    """A node with two real-looking A100s (read through the fake NVML); the emulated cards are taken out of
    placement so jobs land here."""
    node = Node.objects.create(
        name="gpu-host-1",
        backend="local",
        emulated=False,
        driver_version="550.54.15",
        cuda_version="12.4",
        cpu_milli=64000,
        memory_mib=512 * 1024,
    )
    cards = [
        GPU.objects.create(node=node, uuid=card, index=i, model="NVIDIA A100-SXM4-80GB", memory_mib=81920)
        for i, card in enumerate(REAL_UUIDS)
    ]
    GPU.objects.filter(node__emulated=True).update(quarantined=True, quarantine_reason="kept out of this test")
    return cards


@pytest.fixture
def real_node(db_platform):
    return make_real_node()


@pytest.fixture
def fake_nvml(monkeypatch):
    """Replace the NVML library at its boundary: `import pynvml` yields this module-like fake."""
    nvml = FakeNvml([FakeCard(uuid=u) for u in REAL_UUIDS])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(collectors, "_nvml_collector", None)
    monkeypatch.setattr(cluster_nvml, "_initialised", None)
    return nvml


@pytest.fixture
def prometheus():
    server = PrometheusServer()
    yield server
    server.close()


@pytest.fixture
def webhook():
    server = WebhookReceiver()
    yield server
    server.close()


def api_as(username: str) -> APIClient:
    client = APIClient()
    client.force_authenticate(get_user_model().objects.get(username=username))
    return client


@pytest.fixture
def live_platform(transactional_db, platform_settings, celery_worker_thread, tmp_path):
    """A seeded platform whose jobs run as real processes, with a real Celery worker."""
    from ops.seed import seed

    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    seed_rules(AlertRule)
    yield get_user_model().objects.get(username="demo")
    _kill_leftovers(tmp_path / "state")


def _kill_leftovers(root) -> None:
    import os
    import signal

    for child in root.glob("*/attempt-*/child.json"):
        try:
            os.killpg(json.loads(child.read_text())["pid"], signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError, KeyError):
            pass
