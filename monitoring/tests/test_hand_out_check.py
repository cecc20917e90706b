# ruff: noqa: F811 - the k8s_node fixture is imported from test_collectors and used as an argument
"""On Kubernetes the dispatcher cannot probe a card itself: right before it hands cards out it reads their current
dcgm-exporter series through Prometheus (a real HTTP server on loopback answering crafted series; dcgm-exporter and
a GPU cannot run here). A card reporting a fatal Xid the telemetry loop has not acted on is marked suspect and the
job goes to the next card; an Xid already acted on, or a Prometheus that does not answer, holds nothing up."""

import pytest

from cluster.models import GPU, PoolRepair
from jobs import services as jobs
from jobs import store
from jobs.models import Job
from monitoring.models import GpuStatus
from monitoring.tests.conftest import REAL_UUIDS
from monitoring.tests.test_collectors import card_series, k8s_node  # noqa: F401 - fixture
from scheduler.tests.test_dispatch import open_up

pytestmark = pytest.mark.django_db


def two_guaranteed_jobs(user) -> list[Job]:
    open_up("train")  # quotas out of the way: only the cards decide
    data = {"team": "demo", "queue": "train", "spec": "guaranteed", "image": "python-3.11", "command": ["true"]}
    made = [jobs.job_submit(user=user, data=dict(data))[0] for _ in range(2)]
    store.dispatch(queue_ids=[made[0].queue_id])
    return [Job.objects.get(pk=j.pk) for j in made]


def series(xid_of_first: int):
    return card_series(REAL_UUIDS[0], 0, util=0, used=0, free=81920, temp=30, power=50, xid=xid_of_first) + (
        card_series(REAL_UUIDS[1], 1, util=0, used=0, free=81920, temp=30, power=50)
    )


def test_a_card_reporting_a_new_fatal_xid_is_not_handed_out(db_platform, k8s_node, prometheus):
    prometheus.series = series(79)
    first, second = two_guaranteed_jobs(db_platform)
    assert sorted([first.state, second.state]) == ["admitted", "pending"]  # the other card reported Xid 79 just now
    assert Job.objects.get(state="pending").reason == "no_capacity"
    admitted = first if first.state == "admitted" else second
    assert admitted.attempts.get().placement["devices"][0]["gpu_uuid"] == REAL_UUIDS[1]
    bad = GPU.objects.get(uuid=REAL_UUIDS[0])
    assert bad.health == GPU.Health.SUSPECT
    assert "Xid 79 reported by dcgm-exporter" in PoolRepair.objects.get(kind="probe_failed", gpu=bad).detail
    assert any(REAL_UUIDS[0] in q for q in prometheus.queries)  # asked about the placed cards by UUID


def test_an_xid_already_acted_on_or_an_unanswering_prometheus_holds_nothing_up(
    db_platform,
    k8s_node,
    prometheus,
):
    prometheus.series = series(79)
    GpuStatus.objects.create(gpu=GPU.objects.get(uuid=REAL_UUIDS[0]), last_xid=79)  # the telemetry loop saw it
    made = two_guaranteed_jobs(db_platform)
    assert [j.state for j in made] == ["admitted", "admitted"], [(j.reason, j.message) for j in made]
    Job.objects.all().delete()
    GPU.objects.filter(uuid__in=REAL_UUIDS).update(health=GPU.Health.HEALTHY)
    from cluster.models import LogicalDevice

    LogicalDevice.objects.all().delete()
    GpuStatus.objects.all().delete()
    prometheus.status = 500
    assert [j.state for j in two_guaranteed_jobs(db_platform)] == ["admitted", "admitted"]
    assert not PoolRepair.objects.filter(kind="probe_failed").exists()


def test_a_pass_handing_out_many_cards_reads_every_cards_health_once(db_platform, k8s_node, prometheus, monkeypatch):
    # A pass asks card by card only for its first few hand-outs (REMOTE_ASKS), then reads every card's series in one
    # query for the rest: thousands of admissions made thousands of Prometheus queries (seconds each unanswered).
    from scheduler import dispatch

    monkeypatch.setattr(dispatch, "REMOTE_ASKS", 1)
    prometheus.series = series(79)
    open_up("train")
    data = {"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": ["true"]}
    made = [jobs.job_submit(user=db_platform, data=dict(data))[0] for _ in range(6)]
    before = len(prometheus.queries)
    store.dispatch(queue_ids=[made[0].queue_id])

    states = [Job.objects.get(pk=j.pk).state for j in made]
    assert states.count("admitted") == 4  # four shares of the one healthy card; the card with Xid 79 gave none
    for job in Job.objects.filter(state="admitted"):
        assert job.attempts.get().placement["devices"][0]["gpu_uuid"] == REAL_UUIDS[1]
    asked = prometheus.queries[before:]
    assert asked[-1] == "DCGM_FI_DEV_XID_ERRORS"  # every card's, once
    assert len(asked) <= 3, asked  # at most one card-by-card ask and the retry's, then the one read
    assert GPU.objects.get(uuid=REAL_UUIDS[0]).health == GPU.Health.SUSPECT


def test_a_pass_waits_for_an_unanswering_prometheus_twice_at_most(db_platform, k8s_node, prometheus):
    # One card-by-card ask that learns nothing, then one read of every card, also unanswered: nothing more this pass.
    prometheus.status = 500
    open_up("train")
    data = {"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": ["true"]}
    made = [jobs.job_submit(user=db_platform, data=dict(data))[0] for _ in range(8)]
    before = len(prometheus.queries)
    store.dispatch(queue_ids=[made[0].queue_id])
    assert [Job.objects.get(pk=j.pk).state for j in made] == ["admitted"] * 8  # handed out on what the loop saw
    assert len(prometheus.queries) - before == 2, prometheus.queries[before:]
    assert prometheus.queries[-1] == "DCGM_FI_DEV_XID_ERRORS"
