"""The cluster app's own services, without the rest of the platform: the inventory a node reports becomes rows,
an admin's pool outlives a re-sync, a card that stops being reported leaves service, cordoning is idempotent,
and driver versions compare as versions."""

import pytest

from cluster import selectors, services
from cluster.inventory import POOL_LABEL, GpuInfo, NodeInfo
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
