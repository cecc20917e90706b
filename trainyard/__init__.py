"""Trainyard: a self-service GPU training platform (Django project package)."""

from .celery import app as celery_app

__all__ = ("celery_app",)
__version__ = "0.1.0"
