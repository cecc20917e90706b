"""Shared pieces: part of `jobs.services` (see its package docstring)."""

from __future__ import annotations

import re

import structlog

from kernel.errors import Conflict

log = structlog.get_logger(__name__)

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")

RESERVED_ENV_PREFIXES = ("TRAINYARD_", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_")


class InvalidTransition(Conflict):
    code = "invalid_transition"
