"""Execution backends: `local` (processes on this machine) and `volcano` (Kubernetes)."""

from django.conf import settings

from jobs.backends.base import AttemptDescription, Backend, Device, Observation

__all__ = ["AttemptDescription", "Backend", "Device", "Observation", "get_backend"]

_instances: dict[str, Backend] = {}


def get_backend(name: str | None = None) -> Backend:
    name = name or settings.TRAINYARD_BACKEND
    if name not in _instances:
        if name == "local":
            from jobs.backends.local import LocalBackend

            _instances[name] = LocalBackend()
        elif name == "volcano":
            from jobs.backends.volcano import VolcanoBackend

            _instances[name] = VolcanoBackend.from_settings()
        else:
            raise ValueError(f"unknown backend '{name}' (TRAINYARD_BACKEND must be local or volcano)")
    return _instances[name]


def reset_backends() -> None:
    _instances.clear()
