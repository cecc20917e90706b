"""NUMA-aware pinning of local attempts (jobs/backends/cpu_pinning.py): which CPUs, from NVML's CPU affinity or the
card's PCI device in sysfs, sized by the CPU request; the fallback that says why; and, with real processes, the
supervisor's sched_setaffinity reaching the command inside its sandbox and the job page showing the pinning.

NVML is replaced at its boundary (a module-like object answering the three calls the plan makes) and sysfs by a
folder laid out like /sys: this machine has no NVIDIA GPU. tests/test_real_gpu.py-style checks on a GPU machine
would read the real affinity; none ran for this change."""

from __future__ import annotations

import os
import sys
from collections import Counter
from types import SimpleNamespace

import pytest
from django.test import Client

from cluster.nvml import load_nvml
from jobs.backends import cpu_pinning
from jobs.tests.conftest import wait_for
from jobs.tests.test_lifecycle_e2e import finished, log_text, submit


class FakeNvml:
    """pynvml's calls the plan makes: by UUID a handle, its PCI bus id and its CPU affinity (64-bit words)."""

    class NVMLError(Exception):
        pass

    def __init__(self, cards: dict[str, tuple[str, int | None]]):
        self.cards = cards  # uuid -> (bus id, affinity mask or None for "not supported")

    def nvmlDeviceGetHandleByUUID(self, uuid):  # noqa: N802 - pynvml's names
        if uuid not in self.cards:
            raise self.NVMLError("Not Found")
        return uuid

    def nvmlDeviceGetPciInfo(self, handle):  # noqa: N802
        return SimpleNamespace(busId=self.cards[handle][0].encode())

    def nvmlDeviceGetCpuAffinity(self, handle, size):  # noqa: N802
        mask = self.cards[handle][1]
        if mask is None:
            raise self.NVMLError("Not Supported")
        return [mask]


def sysfs(tmp_path, devices: dict[str, int], nodes: dict[int, str]):
    for bus, node in devices.items():
        (tmp_path / "bus" / "pci" / "devices" / bus).mkdir(parents=True)
        (tmp_path / "bus" / "pci" / "devices" / bus / "numa_node").write_text(f"{node}\n")
    for node, cpus in nodes.items():
        (tmp_path / "devices" / "system" / "node" / f"node{node}").mkdir(parents=True)
        (tmp_path / "devices" / "system" / "node" / f"node{node}" / "cpulist").write_text(cpus + "\n")
    return tmp_path


def test_the_cpus_of_the_gpus_numa_node_as_many_as_it_asks_for_least_used_first(tmp_path):
    root = sysfs(tmp_path, {"0000:3b:00.0": 0, "0000:86:00.0": 1}, {0: "0-3", 1: "4-7"})
    nvml = FakeNvml({"GPU-a": ("00000000:86:00.0", 0b11110000), "GPU-b": ("00000000:3B:00.0", 0b1111)})
    allowed = set(range(8))
    pin = cpu_pinning.plan(gpu_uuids=["GPU-a"], cpu_milli=1500, nvml=nvml, sys_root=root, allowed=allowed,
                           in_use=Counter({4: 1}))  # fmt: skip
    assert (pin.cpus, pin.numa_nodes, pin.source) == ((5, 6), (1,), "nvml")
    assert pin.why == "2 CPU(s) of NUMA node 1, near its GPUs"
    spill = cpu_pinning.plan(gpu_uuids=["GPU-a"], cpu_milli=6000, nvml=nvml, sys_root=root, allowed=allowed)
    assert spill.cpus == (0, 1, 4, 5, 6, 7)
    assert spill.why == "4 CPU(s) of NUMA node 1, near its GPUs, and 2 farther: it asks for 6"
    both = cpu_pinning.plan(gpu_uuids=["GPU-a", "GPU-b"], cpu_milli=8000, nvml=nvml, sys_root=root, allowed=allowed)
    assert (both.cpus, both.numa_nodes) == (tuple(range(8)), (0, 1))
    # Only CPUs this process may use (a platform itself pinned or in a cpuset).
    narrow = cpu_pinning.plan(gpu_uuids=["GPU-a"], cpu_milli=8000, nvml=nvml, sys_root=root, allowed={1, 6})
    assert narrow.cpus == (1, 6)


def test_sysfs_stands_in_when_nvml_cannot_say_and_a_card_nobody_knows_is_not_pinned(tmp_path):
    root = sysfs(tmp_path, {"0000:86:00.0": 1, "0000:af:00.0": -1}, {1: "4-7"})
    nvml = FakeNvml({"GPU-a": ("00000000:86:00.0", None), "GPU-c": ("00000000:AF:00.0", None)})
    pin = cpu_pinning.plan(gpu_uuids=["GPU-a"], cpu_milli=1000, nvml=nvml, sys_root=root, allowed=set(range(8)))
    assert (pin.cpus, pin.source) == ((4,), "sysfs")
    lost = cpu_pinning.plan(gpu_uuids=["GPU-gone"], cpu_milli=1000, nvml=nvml, sys_root=root, allowed={0})
    assert lost.cpus == () and lost.why.startswith("not pinned: NVML does not find GPU-gone")
    nowhere = cpu_pinning.plan(gpu_uuids=["GPU-c"], cpu_milli=1000, nvml=nvml, sys_root=root, allowed={0})
    assert nowhere.why == "not pinned: neither NVML nor sysfs names the CPUs near GPU-c (no NUMA node)"


@pytest.mark.skipif(load_nvml() is not None, reason="this machine has NVML: the fallback is not what runs here")
def test_on_a_machine_without_nvml_the_attempt_is_not_pinned_and_says_why():
    pin = cpu_pinning.plan(gpu_uuids=["GPU-00000000-0000-0000-0000-000000000000"], cpu_milli=4000)
    assert pin.cpus == ()
    assert pin.why == "not pinned: NVML is not available on this machine, so the GPUs' NUMA node is unknown"


def test_cpulists_read_and_written_as_the_kernel_does():
    assert cpu_pinning.parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert cpu_pinning.format_cpulist({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning to one CPU of one shows nothing")
def test_the_supervisor_pins_the_sandboxed_command_and_the_job_page_shows_it(
    platform, celery_worker_thread, monkeypatch
):
    """The emulated cards of the test platform have no NUMA node: their plan is replaced by one naming CPU 0 (what
    NVML would have said), so the real supervisor, sandbox and page are what is tested."""
    real_plan = cpu_pinning.plan
    monkeypatch.setattr(cpu_pinning, "plan", lambda **kw: cpu_pinning.Pinning(
        cpus=(0,), numa_nodes=(0,), source="nvml", why="1 CPU(s) of NUMA node 0, near its GPUs"))  # fmt: skip
    probe = [sys.executable, "-c", "import os; print('affinity', sorted(os.sched_getaffinity(0)))"]
    job = submit(platform, command=probe)
    job = wait_for(lambda: finished(job))
    assert job.state == "succeeded", log_text(job)
    assert "affinity [0]" in log_text(job)
    attempt = job.attempts.get()
    assert attempt.placement["cpu_pinning"]["cpus"] == [0]
    assert job.reproduce["placement"]["cpu_pinning"]["why"] == "1 CPU(s) of NUMA node 0, near its GPUs"
    monkeypatch.setattr(cpu_pinning, "plan", real_plan)
    plain = submit(platform, command=probe)
    plain = wait_for(lambda: finished(plain))
    assert "affinity [0]" not in log_text(plain)  # emulated cards: not pinned
    client = Client()
    assert client.login(username="demo", password="demo-pass-123")
    page = client.get(f"/jobs/{job.id}/").content.decode()
    assert "CPUs 0 · 1 CPU(s) of NUMA node 0, near its GPUs" in page
    other = client.get(f"/jobs/{plain.id}/").content.decode()
    assert "not pinned: emulated GPUs have no PCI device, so no NUMA node" in other
