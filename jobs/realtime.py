"""Realtime notifications to browsers (Channels groups), sent after commit by the services."""

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer


def job_group(job_id: str) -> str:
    return f"job.{job_id}"


def job_changed(*, job_id: str, state: str) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    async_to_sync(layer.group_send)(job_group(job_id), {"type": "job.state", "job_id": job_id, "state": state})


def job_metrics_changed(*, job_id: str) -> None:
    """New business metrics for the job: the log sockets of its page redraw the metrics charts."""
    layer = get_channel_layer()
    if layer is None:
        return
    async_to_sync(layer.group_send)(job_group(job_id), {"type": "job.metrics", "job_id": job_id})
