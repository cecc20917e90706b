"""MIG rebalancing proposals: a job waiting for a profile that no idle card offers yields one proposal (an alert
for the admins, never a change of the card), not duplicated by the next run, resolved when the wait ends."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from cluster.inventory import emulated_node
from jobs import lifecycle, store
from jobs.models import Job
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from monitoring.mig import mig_proposals
from monitoring.models import Alert, Notification
from quotas.models import Queue, ResourceSpec
from scheduler.tests.test_dispatch import fresh_pool, open_up, submit

SMALL_ONLY = "1x80GiB:A100-SXM4-80GB[mig=" + "+".join(["1g.10gb"] * 7) + "]"


@pytest.mark.django_db(transaction=True)
def test_a_waiting_profile_and_an_idle_card_of_other_profiles_yield_one_proposal_until_the_wait_ends(platform):  # noqa: F811
    fresh_pool(emulated_node(SMALL_ONLY), backend="local")
    train = open_up("train")
    spec = ResourceSpec.objects.create(
        name="mig-3g", tier="guaranteed", gpu_milli=1000, gpu_memory_eighths=8, mig_profile="3g.40gb",
        cpu_milli_per_gpu=1000, memory_mib_per_gpu=4096,
    )  # fmt: skip
    Queue.objects.get(pk=train.pk).specs.add(spec)
    job = submit(platform, spec="mig-3g")
    store.dispatch()
    job.refresh_from_db()
    assert job.state == "pending" and job.reason == "no_capacity"

    assert mig_proposals() == {"opened": 1, "resolved": 0}
    alert = Alert.objects.get(rule_name="mig-rebalance")
    assert alert.state == "firing" and alert.level == "warning"
    assert alert.gpu is not None and alert.gpu.mig_profile == "1g.10gb"
    assert alert.job_ids == [str(job.id)]
    assert "1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb" in alert.summary
    assert "proposed 3g.40gb+3g.40gb" in alert.summary
    assert Notification.objects.filter(alert=alert, user__is_staff=True).exists()
    # A proposal only: the card still offers what it did.
    assert set(alert.gpu.node.gpus.values_list("mig_profile", flat=True)) == {"1g.10gb"}

    staff = get_user_model().objects.create_user("mig-admin", password="x-pass-word", is_staff=True)
    client = Client()
    client.force_login(staff)
    page = client.get("/gpus/").content.decode()
    assert 'id="mig-proposals"' in page and "proposed 3g.40gb+3g.40gb" in page
    client.force_login(platform)  # a user who is not staff sees no proposals
    assert 'id="mig-proposals"' not in client.get("/gpus/").content.decode()

    assert mig_proposals() == {"opened": 0, "resolved": 0}  # the next run: the same proposal, not a second one
    assert Alert.objects.filter(rule_name="mig-rebalance").count() == 1

    lifecycle.job_cancel(job_id=job.id, actor="demo")  # the wait ends
    assert mig_proposals() == {"opened": 0, "resolved": 1}
    alert.refresh_from_db()
    assert alert.state == "resolved" and alert.resolved_by == "auto"


@pytest.mark.django_db(transaction=True)
def test_no_proposal_while_the_card_is_busy_or_already_offers_the_profile(platform):  # noqa: F811
    fresh_pool(emulated_node("1x80GiB:A100-SXM4-80GB[mig=3g.40gb+1g.10gb+1g.10gb]"), backend="local")
    train = open_up("train")
    for name, profile in (("mig-1g", "1g.10gb"), ("mig-3g", "3g.40gb")):
        Queue.objects.get(pk=train.pk).specs.add(
            ResourceSpec.objects.create(
                name=name, tier="guaranteed", gpu_milli=1000, gpu_memory_eighths=8, mig_profile=profile,
                cpu_milli_per_gpu=1000, memory_mib_per_gpu=4096,
            )
        )  # fmt: skip
    small = [submit(platform, spec="mig-1g") for _ in range(3)]  # two run, the third waits
    store.dispatch()
    assert Job.objects.get(pk=small[2].pk).reason == "no_capacity"
    # The card already offers 1g.10gb (and is busy): nothing to propose.
    assert mig_proposals() == {"opened": 0, "resolved": 0}
    assert not Alert.objects.filter(rule_name="mig-rebalance").exists()
