"""Trainyard: a self-service GPU training platform (Django project package).

The Celery app is loaded when Django is set up (`trainyard.apps`), not on import of this package, so the CLI
(`trainyard_cli.main`) starts without importing Celery. `celery -A trainyard` finds it in `trainyard.celery`.
"""

__all__ = ("celery_app",)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "celery_app":
        from trainyard.celery import app

        return app
    raise AttributeError(f"module 'trainyard' has no attribute {name!r}")
