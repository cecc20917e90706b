"""NVLink domains from NVML (cluster.topology), on a fake NVML: no machine here has two linked cards."""

from __future__ import annotations

import sys

from cluster.topology import nvlink_labels


class _Memory:
    total = 80 * 1024 * 1024 * 1024


class FakeNvml:
    """Four cards; NVLink between the pairs given (both directions), nothing else."""

    NVML_P2P_STATUS_OK = 0
    NVML_P2P_STATUS_NOT_SUPPORTED = 5
    NVML_P2P_CAPS_INDEX_NVLINK = 3

    def __init__(self, links: set[frozenset[int]], count: int = 4) -> None:
        self.links, self.count, self.asked = links, count, []

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return 12040

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"h{i}"

    def nvmlDeviceGetMigMode(self, handle):
        raise RuntimeError("not supported")

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{handle}"

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, handle):
        return _Memory()

    def nvmlDeviceGetP2PStatus(self, a, b, index):
        self.asked.append(index)
        pair = frozenset({int(a[1:]), int(b[1:])})
        return self.NVML_P2P_STATUS_OK if pair in self.links else self.NVML_P2P_STATUS_NOT_SUPPORTED


def cards(n: int = 4):
    return [(i, f"h{i}") for i in range(n)]


def test_linked_cards_form_domains_named_after_their_lowest_card():
    nvml = FakeNvml({frozenset({0, 3}), frozenset({1, 2})})
    labels = nvlink_labels(nvml, cards())
    assert labels == {
        "trainyard.io/nvlink-domain-gpu0": "nvlink-0",
        "trainyard.io/nvlink-domain-gpu1": "nvlink-1",
        "trainyard.io/nvlink-domain-gpu2": "nvlink-1",
        "trainyard.io/nvlink-domain-gpu3": "nvlink-0",
    }
    assert set(nvml.asked) == {FakeNvml.NVML_P2P_CAPS_INDEX_NVLINK}  # asked about NVLink, not PCIe P2P


def test_links_through_other_cards_join_one_domain_and_a_card_without_links_is_its_own():
    labels = nvlink_labels(FakeNvml({frozenset({0, 1}), frozenset({1, 2})}), cards())
    assert [labels[f"trainyard.io/nvlink-domain-gpu{i}"] for i in range(4)] == [
        "nvlink-0",
        "nvlink-0",
        "nvlink-0",
        "nvlink-3",
    ]


def test_no_links_or_no_answer_give_no_labels():
    assert nvlink_labels(FakeNvml(set()), cards()) == {}
    assert nvlink_labels(object(), cards()) == {}  # a driver without the call
    assert nvlink_labels(FakeNvml({frozenset({0, 1})}), cards(1)) == {}


def test_the_local_inventory_carries_the_domains(monkeypatch):
    from cluster.inventory import read_nvml

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml({frozenset({0, 3}), frozenset({1, 2})}))
    info = read_nvml()
    assert [g.index for g in info.gpus] == [0, 1, 2, 3]
    assert info.labels["trainyard.io/nvlink-domain-gpu3"] == "nvlink-0"
    assert info.labels["trainyard.io/nvlink-domain-gpu2"] == "nvlink-1"
