"""Fixtures of experiment tests: the lifecycle tests' seeded platform (emulated 4x24GiB node, real processes)."""

from jobs.tests.conftest import platform  # noqa: F401 - a fixture, used by name
