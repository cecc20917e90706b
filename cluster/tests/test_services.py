"""The cluster app's own services, without the rest of the platform: the inventory a node reports becomes rows,
an admin's pool outlives a re-sync, a card that stops being reported leaves service, cordoning is idempotent,
and driver versions compare as versions."""

from dataclasses import replace

import pytest

from cluster import selectors, services
from cluster.inventory import LENT_LABEL, POOL_LABEL, GpuInfo, NodeInfo
from cluster.models import GPU, Node
from kernel.errors import Conflict

pytestmark = pytest.mark.django_db


def _info(name="n1", gpus=2, labels=None, driver="550.54.15") -> NodeInfo:
    cards = tuple(GpuInfo(uuid=f"GPU-{name}-{i}", index=i, model="NVIDIA A100-SXM4-80GB", memory_mib=81920)
                  for i in range(gpus))  # fmt: skip
    return NodeInfo(name=name, emulated=True, driver_version=driver, cuda_version="12.4", cpu_milli=64000,
                    memory_mib=512 * 1024, gpus=cards, labels=labels or {})  # fmt: skip


def test_a_reported_node_becomes_a_node_and_its_cards():
    node = services.inventory_sync(info=_info(gpus=4, labels={"trainyard.io/rack": "r7"}))
    assert node.rack == "r7" and node.driver_version == "550.54.15"
    assert list(node.gpus.order_by("index").values_list("uuid", flat=True)) == [f"GPU-n1-{i}" for i in range(4)]
    again = services.inventory_sync(info=_info(gpus=4, driver="560.28.03"))
    assert again.pk == node.pk and Node.objects.count() == 1 and GPU.objects.count() == 4
    assert again.driver_version == "560.28.03"


def test_the_pool_an_admin_chose_outlives_a_resync():
    node = services.inventory_sync(info=_info())
    services.node_move(node_id=node.pk, pool="research", actor="admin")
    synced = services.inventory_sync(info=_info(labels={POOL_LABEL: "default"}))
    assert synced.labels[POOL_LABEL] == "research"


def test_a_card_no_longer_reported_leaves_service():
    services.inventory_sync(info=_info(gpus=2))
    services.inventory_sync(info=_info(gpus=1))
    gone = GPU.objects.get(uuid="GPU-n1-1")
    assert gone.health == GPU.Health.UNHEALTHY and gone.quarantined
    assert "no longer reported" in gone.quarantine_reason
    assert GPU.objects.get(uuid="GPU-n1-0").health != GPU.Health.UNHEALTHY


def test_cordon_and_uncordon_say_whether_they_changed_anything():
    node = services.inventory_sync(info=_info())
    assert services.node_cordon(node_id=node.pk, actor="admin")[1] is True
    assert services.node_cordon(node_id=node.pk, actor="admin")[1] is False
    assert services.node_uncordon(node_id=node.pk, actor="admin")[1] is True
    assert services.node_uncordon(node_id=node.pk, actor="admin")[1] is False
    Node.objects.filter(pk=node.pk).update(state=Node.State.UNHEALTHY)
    with pytest.raises(Conflict) as refused:
        services.node_cordon(node_id=node.pk, actor="admin")
    assert refused.value.code == "node_not_ready"


@pytest.mark.parametrize(
    ("driver", "minimum", "ok"),
    [("550.54.15", "535", True), ("535.104.05", "550", False), ("550.100", "550.54.15", True), ("", "535", False),
     ("", "", True), ("525.60.13", "525.60.13", True)],
)  # fmt: skip
def test_driver_versions_compare_as_versions(driver, minimum, ok):
    assert selectors.driver_satisfies(driver, minimum) is ok


def _sync_queries(infos, backend="volcano") -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        services.inventories_sync(infos=infos, backend=backend)
    return len(queries)


def _k8s(name, gpus=2, ready=True, driver="550.54.15") -> NodeInfo:
    return _info(name=name, gpus=gpus, driver=driver, labels={services.K8S_READY_LABEL: "true" if ready else "false"})


@pytest.mark.parametrize(
    "step",
    [
        {},
        {"driver": "560.28.03"},
        {"gpus": 1},
        {"ready": False},
    ],
    ids=["unchanged", "driver", "a-card-gone", "not-ready"],
)
def test_a_sync_costs_as_many_queries_for_thirty_nodes_as_for_three(step):
    """The 5-minute sync of a whole cluster (1,213 nodes in the trace) reads and writes by sets: its queries do
    not grow with the nodes or their cards, whether it creates them, finds nothing changed or changes them all."""
    few, many = [f"few-{i}" for i in range(3)], [f"many-{i}" for i in range(30)]
    first = [_sync_queries([_k8s(n) for n in names]) for names in (few, many)]
    version = _structure_version()
    again = [_sync_queries([_k8s(n, **step) for n in names]) for names in (few, many)]
    assert first[0] == first[1] and again[0] == again[1], (first, again)
    assert Node.objects.count() == 33 and GPU.objects.count() == 66
    # The dispatcher's copy of the pool is reloaded when placement's view changed, and only then.
    assert (_structure_version() != version) is bool(step)


def _structure_version() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT n FROM trainyard_pool_version WHERE id = 1")
        return cursor.fetchone()[0]


def test_a_sync_of_many_nodes_keeps_what_each_node_sync_did():
    """Per node, as before: an admin's pool and a loan outlive the report; a card no longer reported leaves
    service and comes back when reported again; a NotReady node leaves placement with its cards unquarantined
    and comes back when Ready; a node an admin cordoned stays cordoned."""
    nodes = [services.inventory_sync(info=_k8s(f"n{i}", gpus=4), backend="volcano") for i in range(4)]
    services.node_move(node_id=nodes[0].pk, pool="research", actor="admin")
    Node.objects.filter(pk=nodes[0].pk).update(labels={**Node.objects.get(pk=nodes[0].pk).labels,
                                                       LENT_LABEL: "inference"})  # fmt: skip
    services.node_cordon(node_id=nodes[3].pk, actor="admin")
    report = [_k8s("n0", gpus=4), _k8s("n1", gpus=3), _k8s("n2", gpus=4, ready=False), _k8s("n3", gpus=4, ready=False)]
    assert services.inventories_sync(infos=report, backend="volcano") == ["n0", "n1", "n2", "n3"]
    n0 = Node.objects.get(name="n0")
    assert (n0.labels[POOL_LABEL], n0.labels[LENT_LABEL]) == ("research", "inference")
    gone = GPU.objects.get(uuid="GPU-n1-3")
    assert gone.health == GPU.Health.UNHEALTHY and gone.quarantined and gone.quarantine_reason == services.VANISHED
    assert GPU.objects.filter(health=GPU.Health.UNHEALTHY).count() == 1
    states = dict(Node.objects.values_list("name", "state"))
    assert states == {"n0": "ready", "n1": "ready", "n2": "unhealthy", "n3": "cordoned"}
    assert not GPU.objects.filter(node__name="n2", quarantined=True).exists()
    services.inventories_sync(infos=[_k8s(f"n{i}", gpus=4) for i in range(4)], backend="volcano")
    assert not GPU.objects.exclude(health=GPU.Health.HEALTHY).exists() and not GPU.objects.filter(quarantined=True)
    assert dict(Node.objects.values_list("name", "state"))["n2"] == "ready"
    assert Node.objects.get(name="n0").labels[POOL_LABEL] == "research"


def test_a_card_reported_by_another_node_moves_there():
    card = GpuInfo(uuid="GPU-moved", index=0, model="NVIDIA A100-SXM4-80GB", memory_mib=81920)
    services.inventories_sync(infos=[_k8s("a", gpus=0), _k8s("b", gpus=0)], backend="volcano")
    services.inventories_sync(infos=[replace(_k8s("a", gpus=0), gpus=(card,)), _k8s("b", gpus=0)], backend="volcano")
    services.inventories_sync(infos=[_k8s("a", gpus=0), replace(_k8s("b", gpus=0), gpus=(card,))], backend="volcano")
    moved = GPU.objects.get(uuid="GPU-moved")
    assert moved.node.name == "b" and moved.health == GPU.Health.HEALTHY and GPU.objects.count() == 1
