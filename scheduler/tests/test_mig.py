"""MIG as a sharing mode: an emulated card in MIG mode offers its instances as exclusive devices; a spec asks for a
profile; placement hands out only instances of that profile (and never an instance to any other job); a released
instance is handed out again. On Kubernetes the pod requests nvidia.com/mig-<profile>: test_volcano_render.py."""

from __future__ import annotations

import pytest

from cluster.inventory import InventoryError, emulated_node, parse_emulated
from cluster.models import GPU
from jobs import lifecycle, store
from jobs.models import Job
from jobs.tests.conftest import platform  # noqa: F401 - the seeded platform fixture
from quotas.models import Queue, ResourceSpec
from scheduler.tests.test_dispatch import fresh_pool, open_up, submit

MIXED = "1x24GiB:L4,1x80GiB:A100-SXM4-80GB[mig=3g.40gb+2g.20gb+1g.10gb+1g.10gb]"


def test_the_emulated_inventory_reads_mig_instances_and_refuses_impossible_splits():
    info = emulated_node(MIXED)
    rows = [(g.index, g.model, g.memory_mib, g.mig_profile) for g in info.gpus]
    assert rows == [
        (0, "L4", 24 * 1024, ""),
        (1, "A100-SXM4-80GB MIG 3g.40gb", 40 * 1024, "3g.40gb"),
        (2, "A100-SXM4-80GB MIG 2g.20gb", 20 * 1024, "2g.20gb"),
        (3, "A100-SXM4-80GB MIG 1g.10gb", 10 * 1024, "1g.10gb"),
        (4, "A100-SXM4-80GB MIG 1g.10gb", 10 * 1024, "1g.10gb"),
    ]
    assert {g.mig_parent for g in info.gpus[1:]} == {f"EMU-{info.name}-1"}
    for bad in ("1x80GiB[mig=3g.40gb+4g.40gb+1g.10gb]", "1x40GiB[mig=3g.40gb+3g.40gb]", "1x80GiB[mig=big]"):
        with pytest.raises(InventoryError):
            parse_emulated(bad)


@pytest.mark.django_db(transaction=True)
def test_mig_instances_are_placed_only_for_their_profile_and_released(platform):  # noqa: F811
    fresh_pool(emulated_node(MIXED), backend="local")
    train = open_up("train")
    spec = ResourceSpec.objects.create(
        name="mig-1g", tier="guaranteed", gpu_milli=1000, gpu_memory_eighths=8, mig_profile="1g.10gb",
        cpu_milli_per_gpu=1000, memory_mib_per_gpu=4096,
    )  # fmt: skip
    Queue.objects.get(pk=train.pk).specs.add(spec)
    small = [submit(platform, spec="mig-1g") for _ in range(3)]
    whole = [submit(platform, spec="guaranteed") for _ in range(2)]
    assert store.dispatch().admitted == 3
    jobs = {j.pk: Job.objects.get(pk=j.pk) for j in small + whole}

    def device(job):
        return jobs[job.pk].attempts.get().placement["devices"][0]

    assert [jobs[j.pk].state for j in small] == ["admitted", "admitted", "pending"]
    assert {device(j)["model"] for j in small[:2]} == {"A100-SXM4-80GB MIG 1g.10gb"}
    assert {device(j)["memory_mib"] for j in small[:2]} == {10 * 1024}
    assert jobs[small[2].pk].reason == "no_capacity"  # the 2g and 3g instances and the L4 are not for it
    assert jobs[small[0].pk].total_gpu_milli == 142 and jobs[small[0].pk].mig_profile == "1g.10gb"
    # A job that asks for no profile never gets an instance: the one whole card, and the next one waits.
    assert device(whole[0])["model"] == "L4" and jobs[whole[1].pk].state == "pending"

    lifecycle.job_cancel(job_id=small[0].id, actor="demo")  # released: its instance is handed out again
    assert store.dispatch().admitted == 1
    freed = device(small[0])["gpu_uuid"]
    assert Job.objects.get(pk=small[2].pk).attempts.get().placement["devices"][0]["gpu_uuid"] == freed
    assert GPU.objects.get(uuid=freed).mig_profile == "1g.10gb"

    other = ResourceSpec.objects.create(
        name="mig-7g", tier="guaranteed", gpu_milli=1000, gpu_memory_eighths=8, mig_profile="7g.80gb"
    )
    Queue.objects.get(pk=train.pk).specs.add(other)
    lonely = submit(platform, spec="mig-7g")
    store.dispatch()
    lonely.refresh_from_db()
    assert lonely.reason == "no_capacity" and "7g.80gb" in lonely.message


class _Memory:
    def __init__(self, mib: int) -> None:
        self.total = mib * 1024 * 1024


class FakeNvml:
    """The NVML library at its boundary: one card in MIG mode (two instances, a slot empty), one card without."""

    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self) -> None:
        instances = [("3g.40gb", 40192), None, ("1g.10gb", 9728)]
        self.cards = [
            {"uuid": "GPU-aaaa", "name": "NVIDIA A100-SXM4-80GB", "mib": 81920, "mig": instances},
            {"uuid": "GPU-bbbb", "name": "NVIDIA L4", "mib": 23034, "mig": None},
        ]

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return 12040

    def nvmlDeviceGetCount(self):
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("card", i)

    def nvmlDeviceGetMigMode(self, handle):
        on = self.cards[handle[1]]["mig"] is not None
        return (1, 1) if on else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return len(self.cards[handle[1]]["mig"])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, k):
        if self.cards[handle[1]]["mig"][k] is None:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return ("mig", handle[1], k)

    def _of(self, handle):
        card = self.cards[handle[1]]
        if handle[0] == "card":
            return card["uuid"], card["name"], card["mib"]
        profile, mib = card["mig"][handle[2]]
        return f"MIG-{card['uuid']}-{handle[2]}", f"{card['name']} MIG {profile}", mib

    def nvmlDeviceGetUUID(self, handle):
        return self._of(handle)[0]

    def nvmlDeviceGetName(self, handle):
        return self._of(handle)[1]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return _Memory(self._of(handle)[2])


def test_nvml_lists_the_instances_of_a_card_in_mig_mode_as_its_devices(monkeypatch):
    import sys

    from cluster.inventory import read_nvml

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    info = read_nvml()
    rows = [(g.uuid, g.index, g.model, g.memory_mib, g.mig_profile, g.mig_parent) for g in info.gpus]
    assert rows == [
        ("MIG-GPU-aaaa-0", 0, "NVIDIA A100-SXM4-80GB MIG 3g.40gb", 40192, "3g.40gb", "GPU-aaaa"),
        ("MIG-GPU-aaaa-2", 1, "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9728, "1g.10gb", "GPU-aaaa"),
        ("GPU-bbbb", 2, "NVIDIA L4", 23034, "", ""),
    ]


def test_a_kubernetes_node_with_mixed_mig_strategy_offers_its_instances():
    from jobs.backends.volcano import node_info

    node = {
        "metadata": {
            "name": "gpu-7",
            "labels": {
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.count": "2",
                "nvidia.com/gpu.memory": "81920",
                "trainyard.io/pool": "inference",
            },
        },
        "status": {
            "allocatable": {"nvidia.com/gpu": "1", "nvidia.com/mig-3g.40gb": "2", "nvidia.com/mig-1g.10gb": "1"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    info = node_info(node, ("trainyard.io/rack",))
    assert [(g.index, g.mig_profile, g.memory_mib) for g in info.gpus] == [
        (0, "", 81920),
        (1, "1g.10gb", 10240),
        (2, "3g.40gb", 40960),
        (3, "3g.40gb", 40960),
    ]
    assert info.gpus[1].model == "NVIDIA A100 SXM4 80GB MIG 1g.10gb"
    assert info.labels["trainyard.io/pool"] == "inference"
