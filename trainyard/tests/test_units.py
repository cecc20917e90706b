"""Human units: durations read and written as people type them, resources in GPUs and GiB."""

import pytest

from kernel.errors import ValidationFailed
from kernel.units import human_duration, human_resource, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("4h", 14400),
        ("30m", 1800),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("2d", 172800),
        ("90s", 90),
        ("600", 600),
        (600, 600),
        ("1D 2H", 93600),
    ],
)
def test_durations_are_read_as_typed(text, seconds):
    assert parse_duration(text, field="timeout_s") == seconds


@pytest.mark.parametrize("text", ["soon", "4x", "h", "1.5h", "4h4h", True])
def test_anything_else_is_a_clear_400(text):
    with pytest.raises(ValidationFailed) as caught:
        parse_duration(text, field="timeout_s")
    assert caught.value.field == "timeout_s" and caught.value.code == "invalid"


def test_empty_is_the_default():
    assert parse_duration("", field="timeout_s", default=7) == 7 and parse_duration(None, field="x") is None


@pytest.mark.parametrize(
    ("seconds", "text"), [(14400, "4h"), (1800, "30m"), (5400, "1h 30m"), (90, "1m 30s"), (604800, "7d"), (45, "45s")]
)
def test_durations_are_written_as_typed(seconds, text):
    assert human_duration(seconds) == text
    assert parse_duration(text.replace(" ", ""), field="t") == seconds


def test_resources_in_gpus_and_gib():
    assert human_resource("gpu_milli", 8000) == "8 GPUs"
    assert human_resource("gpu_milli", 1000) == "1 GPU"
    assert human_resource("gpu_milli", 250) == "0.25 GPUs"
    assert human_resource("gpu_memory_mib", 49152) == "48 GiB of GPU memory"
    assert human_resource("memory_mib", 1536) == "1.5 GiB of memory"
    assert human_resource("cpu_milli", 16000) == "16 CPU cores"
