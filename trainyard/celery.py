"""The Celery application: configuration comes from Django settings (`CELERY_*`)."""

import os

from celery import Celery

from ops import loops  # noqa: F401 - records each beat loop's last run (task_postrun)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trainyard.settings")

app = Celery("trainyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.task(name="trainyard.ping")
def ping() -> str:
    return "pong"


@app.task(name="trainyard.heartbeat")
def heartbeat() -> str:
    return "beat"  # its run is recorded by ops.loops, like every beat loop's
