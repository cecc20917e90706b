"""The default alert rules (DESIGN.md §8). A data migration creates them once; admins edit them as data."""

DEFAULT_RULES: list[dict] = [
    dict(
        name="gpu-memory-high",
        level="warning",
        metric="gpu_memory_pct",
        comparator="gt",
        threshold=90,
        for_seconds=300,
        description="GPU memory above 90% of the card for 5 minutes.",
    ),
    dict(
        name="job-failure-rate",
        level="critical",
        metric="job_failure_rate",
        comparator="gt",
        threshold=5,
        window_seconds=3600,
        min_samples=10,
        description="More than 5% of the jobs that finished in the last hour failed (at least 10 finished).",
    ),
    dict(
        name="gpu-temperature",
        level="critical",
        metric="gpu_temperature_c",
        comparator="gt",
        threshold=85,
        for_seconds=0,
        description="GPU temperature above 85 °C.",
    ),
    dict(
        name="gpu-lost",
        level="fatal",
        metric="gpu_fault",
        faults=["gpu_lost"],
        quarantine_gpu=True,
        restart_job=True,
        description="The GPU fell off the bus (NVML: GPU is lost, or Xid 79).",
    ),
    dict(
        name="driver-reset",
        level="fatal",
        metric="gpu_fault",
        faults=["driver_reset"],
        quarantine_gpu=True,
        restart_job=True,
        description="The driver needs a GPU reset before the card can be used again.",
    ),
    dict(
        name="device-unhealthy",
        level="fatal",
        metric="gpu_fault",
        faults=["xid", "probe_failed", "unhealthy"],
        quarantine_gpu=True,
        restart_job=True,
        description="A fatal Xid, a failing health probe, or a card otherwise marked unhealthy.",
    ),
]


def seed_rules(rule_model) -> int:
    """Create the default rules that do not exist yet (an admin's edits are kept); returns how many."""
    created = 0
    for data in DEFAULT_RULES:
        _, was_created = rule_model.objects.get_or_create(name=data["name"], defaults=data)
        created += was_created
    return created
