"""The NVLink topology of a machine's cards, from NVML: which whole cards share an NVLink domain, written as the
node labels the dispatcher reads to keep a multi-card job's cards together (``trainyard.io/nvlink-domain-gpu<i>``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

NVLINK_DOMAIN_LABEL = "trainyard.io/nvlink-domain-gpu{index}"


def nvlink_labels(nvml: Any, cards: Sequence[tuple[int, Any]]) -> dict[str, str]:
    """Labels for ``cards`` (device index, NVML handle): cards that NVML says reach each other over NVLink,
    directly or through other cards (an NVSwitch joins them all), form one domain, named after its lowest index;
    a card without an NVLink peer is a domain of its own. No labels when no two cards are linked (the dispatcher
    then keeps the policy's choice) or NVML cannot tell."""
    parent = {index: index for index, _ in cards}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    ok = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
    nvlink = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 3)
    linked = False
    for a, (ia, ha) in enumerate(cards):
        for ib, hb in cards[a + 1 :]:
            try:
                status = nvml.nvmlDeviceGetP2PStatus(ha, hb, nvlink)
            except Exception:  # noqa: BLE001 - an old driver or a card that cannot say: not linked
                continue
            if status == ok:
                linked = True
                ra, rb = root(ia), root(ib)
                parent[max(ra, rb)] = min(ra, rb)
    if not linked:
        return {}
    return {NVLINK_DOMAIN_LABEL.format(index=i): f"nvlink-{root(i)}" for i, _ in cards}
