"""Celery tasks of the lifecycle: each takes ids, loads, and calls one service."""

from celery import shared_task

from jobs import services


@shared_task(
    name="jobs.dispatch_queue",
    acks_late=True,
    autoretry_for=(Exception,),
    retry_backoff=1,
    retry_backoff_max=30,
    retry_jitter=True,
    max_retries=5,
)
def dispatch_queue(queue_id: int | None = None) -> int:
    """A requested pass (trainyard.wake): one pass over every queue, whatever queue asked."""
    from jobs.dispatch import dispatch
    from trainyard.wake import dispatch_started

    dispatch_started()
    return dispatch().admitted


@shared_task(name="jobs.dispatch_all", acks_late=True)
def dispatch_all() -> int:
    """The beat's pass: level-triggered, so a lost wake-up costs one period."""
    from jobs.dispatch import dispatch

    return dispatch().admitted


@shared_task(
    name="jobs.start_attempt",
    acks_late=True,
    autoretry_for=(Exception,),
    retry_backoff=2,
    retry_jitter=True,
    max_retries=5,
)
def start_attempt(attempt_id: int) -> None:
    services.attempt_start(attempt_id=attempt_id)


@shared_task(name="jobs.start_attempts", acks_late=True)
def start_attempts(attempt_ids: list[int]) -> None:
    """Start a dispatch pass's admitted attempts; one that fails to start is retried on its own."""
    for attempt_id in attempt_ids:
        try:
            services.attempt_start(attempt_id=attempt_id)
        except Exception:  # noqa: BLE001 - the others of the batch still start
            start_attempt.apply_async((attempt_id,), countdown=2)


@shared_task(name="jobs.observe_attempts", soft_time_limit=60, time_limit=90)
def observe_attempts() -> int:
    return services.attempts_observe()


@shared_task(name="jobs.enforce_timeouts", soft_time_limit=60, time_limit=90)
def enforce_timeouts() -> int:
    return services.timeouts_enforce()


@shared_task(name="cluster.reconcile_pool", soft_time_limit=300, time_limit=360)
def reconcile_pool() -> dict:
    from cluster.services import pool_reconcile
    from jobs.backends import get_backend

    report = pool_reconcile(live_backend_refs=get_backend().live_refs())
    return {"freed": report.freed, "overcommitted": report.overcommitted}


@shared_task(name="cluster.sync_inventory")
def sync_inventory() -> str:
    from django.conf import settings

    from cluster.inventory import local_inventory
    from cluster.services import inventory_sync

    if settings.TRAINYARD_BACKEND != "local":
        from jobs.backends import get_backend

        names = [inventory_sync(info=info, backend="volcano").name for info in get_backend().inventory()]
        return ",".join(names)
    return inventory_sync(info=local_inventory()).name


@shared_task(name="jobs.sync_volcano_queue", autoretry_for=(Exception,), retry_backoff=2, max_retries=5)
def sync_volcano_queue(queue_id: int) -> None:
    from jobs.backends import get_backend
    from quotas.models import Queue

    get_backend("volcano").queue_sync(Queue.objects.get(pk=queue_id))


@shared_task(name="jobs.issue_tensorboard", autoretry_for=(Exception,), retry_backoff=2, max_retries=3)
def issue_tensorboard(job_id: str) -> None:
    from jobs.tensorboard import route_issue

    route_issue(job_id=job_id)


@shared_task(name="jobs.reap_tensorboards")
def reap_tensorboards() -> int:
    from jobs.tensorboard import routes_reap

    return routes_reap()
