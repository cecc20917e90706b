"""The in-memory reference snapshot that submission validation reads: reused while nothing changed, reloaded by
the very next request after any write to the tables it covers (signals or not, from any connection)."""

import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from jobs import reference, services
from kernel.errors import NotFound, ValidationFailed
from ops.seed import seed
from quotas.models import Queue, ResourceSpec, Team

SUBMISSION = {"team": "demo", "queue": "train", "spec": "shared", "image": "python-3.11", "command": ["true"]}


@pytest.fixture
def demo(settings):
    settings.TRAINYARD_BACKEND = "local"
    settings.TRAINYARD_LOCAL_GPUS = "2x24GiB"
    seed(admin_password="admin-pass-123", demo_password="demo-pass-123")
    return get_user_model().objects.get(username="demo")


@pytest.mark.django_db
def test_an_unchanged_snapshot_costs_one_query_and_is_the_same_object(demo):
    first = reference.current()
    with CaptureQueriesContext(connection) as queries:
        again = reference.current()
    assert again is first and len(queries) == 1
    services.job_validate(user=demo, data=SUBMISSION)
    with CaptureQueriesContext(connection) as queries:
        services.job_validate(user=demo, data=SUBMISSION)
    assert len(queries) == 1  # the version and the pool's number, in one statement (the cluster facts stand)


@pytest.mark.django_db
def test_writes_that_send_no_signals_are_seen_by_the_next_validation(demo):
    services.job_validate(user=demo, data=SUBMISSION)
    ResourceSpec.objects.filter(name="shared").update(enabled=False)  # queryset update: no post_save
    with pytest.raises(ValidationFailed) as err:
        services.job_validate(user=demo, data=SUBMISSION)
    assert err.value.code == "unknown_spec"
    ResourceSpec.objects.filter(name="shared").update(enabled=True)
    Queue.teams.through.objects.filter(queue__name="train", team__slug="demo").delete()
    with pytest.raises(ValidationFailed) as err:
        services.job_validate(user=demo, data=SUBMISSION)
    assert err.value.code == "queue_not_allowed"
    with connection.cursor() as cursor:  # raw SQL too
        cursor.execute("DELETE FROM quotas_membership WHERE user_id = %s", [demo.pk])
    Queue.objects.get(name="train").teams.add(Team.objects.get(slug="demo"))
    with pytest.raises(NotFound):
        services.job_validate(user=demo, data=SUBMISSION)


@pytest.mark.django_db(transaction=True)
def test_a_change_committed_by_another_connection_is_seen_at_once(demo):
    assert services.job_validate(user=demo, data=SUBMISSION).fields["spec"].name == "shared"
    loaded = reference.current()

    def admin_edits():
        try:
            ResourceSpec.objects.filter(name="shared").update(gpu_milli=300)
        finally:
            connections.close_all()

    thread = threading.Thread(target=admin_edits)
    thread.start()
    thread.join()
    fresh = reference.current()
    assert fresh is not loaded and fresh.version != loaded.version
    assert services.job_validate(user=demo, data=SUBMISSION).fields["gpu_milli"] == 300


@pytest.mark.django_db
def test_a_rolled_back_change_never_leaves_a_reusable_version(demo):
    from django.db import transaction

    before = reference.current()
    with pytest.raises(RuntimeError), transaction.atomic():
        ResourceSpec.objects.filter(name="shared").update(gpu_milli=999)
        inside = reference.current()
        assert inside.specs["shared"].gpu_milli == 999
        raise RuntimeError("roll back")
    after = reference.current()
    assert after.version == before.version != inside.version
    assert after.specs["shared"].gpu_milli != 999


@pytest.mark.django_db
def test_the_cluster_facts_are_read_again_only_when_the_pool_changed(demo):
    """Largest healthy card, node drivers and GPU models: one small query while the pool's structure number stands,
    the three aggregates again once a card changes health or a card of a new model appears."""
    from cluster.models import GPU, Node

    facts = reference.cluster_facts(16384)
    with CaptureQueriesContext(connection) as queries:
        assert reference.cluster_facts(16384) is facts
    assert [q["sql"] for q in queries] == ["SELECT n FROM trainyard_pool_version WHERE id = 1"]
    assert facts.card_mib == 24 * 1024
    GPU.objects.update(health=GPU.Health.UNHEALTHY)  # no healthy card left: the default size
    assert reference.cluster_facts(16384).card_mib == 16384
    node = Node.objects.first()
    GPU.objects.create(node=node, uuid="GPU-new-model", index=99, model="NVIDIA H200", memory_mib=143771)
    again = reference.cluster_facts(16384)
    assert "NVIDIA H200" in again.models and again.card_mib == 143771
