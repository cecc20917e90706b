"""The Celery application: configuration comes from Django settings (`CELERY_*`)."""

import os

from celery import Celery
from celery.signals import task_postrun, task_prerun

from ops import loops  # noqa: F401 - records each beat loop's last run (task_postrun)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trainyard.settings")

app = Celery("trainyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
@task_postrun.connect
def keep_usable_connections(sender=None, **kwargs) -> None:
    """Around each task, as Django does around each request: a database connection that failed, outlived
    CONN_MAX_AGE or was left in a transaction is closed (the next query opens a fresh one); a healthy one is kept
    for the next task and checked before its first use (CONN_HEALTH_CHECKS). Celery's own closing of every
    connection is switched off by `CELERY_DB_REUSE_MAX` (settings). A task run eagerly, inside the caller's
    transaction, is left alone, as Celery leaves it."""
    request = getattr(sender, "request", None)
    if getattr(request, "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()


@app.task(name="trainyard.ping")
def ping() -> str:
    return "pong"


@app.task(name="trainyard.heartbeat")
def heartbeat() -> str:
    return "beat"  # its run is recorded by ops.loops, like every beat loop's
