"""Celery tasks of the lifecycle: each takes ids, loads, and calls one service."""

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import structlog
from celery import shared_task
from celery.signals import worker_before_create_process, worker_process_init, worker_process_shutdown, worker_ready
from django.db import DatabaseError, transaction
from kombu.exceptions import OperationalError as BrokerError

from jobs import lifecycle
from kernel import gctune

log = structlog.get_logger(__name__)


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
    """A requested pass (kernel.wake): one pass over every queue, whatever queue asked."""
    from jobs.store import dispatch
    from kernel.wake import dispatch_started, space_passes

    space_passes()  # submissions arriving meanwhile join this pass (the queued mark is still set)
    dispatch_started()
    return dispatch().admitted


@shared_task(name="jobs.dispatch_all", acks_late=True)
def dispatch_all(full: bool | None = None) -> int:
    """The beat's pass: level-triggered, so a lost wake-up costs one period. It reads every line when `full`, or
    when None and the dispatcher has not done so for TRAINYARD_FULL_PASS_EVERY_S; otherwise it is a pass like a
    wake-up's (which re-decides or reads every line once anything but newcomers changed). Then it folds the
    quota-use log when it has grown (jobs.store.compact_quota_use), every 30 s whatever the pass read."""
    from jobs.store import compact_quota_use, dispatch
    from scheduler.dispatch import full_pass_due

    admitted = dispatch(full=full_pass_due() if full is None else full).admitted
    with transaction.atomic():
        compact_quota_use()
    return admitted


# Idempotent (see lifecycle.attempt_start), so redelivery is safe; an outage is waited out (about 20 minutes of
# retries), and past that the reconciler starts the attempt anyway: a lost message never strands a job.
@shared_task(
    name="jobs.start_attempt",
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(DatabaseError, BrokerError, ConnectionError, TimeoutError),
    retry_backoff=2,
    retry_backoff_max=60,
    retry_jitter=True,
    max_retries=25,
)
def start_attempt(attempt_id: int) -> None:
    lifecycle.attempt_start(attempt_id=attempt_id)


@shared_task(name="jobs.start_attempts", acks_late=True, reject_on_worker_lost=True)
def start_attempts(attempt_ids: list[int]) -> None:
    """Start a dispatch pass's admitted attempts (each start is idempotent, so a redelivered batch is safe);
    one that fails to start is retried on its own, and the reconciler covers a lost batch.

    A backend whose submit is a few API round trips (Volcano: `concurrent_submits`) starts several at once, on
    the worker process's starter threads; the local backend starts them one after another."""
    from jobs.backends import get_backend

    def start_one(attempt_id: int) -> None:
        try:
            lifecycle.attempt_start(attempt_id=attempt_id)
        except Exception:  # noqa: BLE001 - the others of the batch still start
            start_attempt.apply_async((attempt_id,), countdown=2)

    width = min(len(attempt_ids), int(getattr(get_backend(), "concurrent_submits", 1) or 1))
    if width <= 1:
        for attempt_id in attempt_ids:
            start_one(attempt_id)
        return
    list(_starters(width).map(lambda attempt_id: _on_own_connection(start_one, attempt_id), attempt_ids))


_STARTERS: dict[int, tuple[int, ThreadPoolExecutor]] = {}  # this process's starter threads (width, pool), by pid:
# a forked child makes its own


def _starters(width: int):
    """The process's starter threads: they live as long as the process, each with its own database connection
    kept from batch to batch (threads made per batch logged in to PostgreSQL for every batch: at a few attempts
    a batch, most of a start's time on a loaded worker)."""
    have, pool = _STARTERS.get(os.getpid(), (0, None))
    if pool is None or have < width:
        starters_stop()  # narrower ones of this process: their connections closed, not left to their idle threads
        _STARTERS.clear()  # a forked child's copy of its parent's (their threads did not survive the fork)
        pool = ThreadPoolExecutor(max_workers=width, thread_name_prefix="start")
        _STARTERS[os.getpid()] = (width, pool)
    return pool


def starters_stop() -> None:
    """Close each starter thread's database connection and end the threads (a worker process going away; tests)."""
    from django.db import connections

    width, pool = _STARTERS.pop(os.getpid(), (0, None))
    if pool is None:
        return
    barrier = threading.Barrier(width, timeout=30)

    def close() -> None:
        connections.close_all()
        barrier.wait()  # so that each of the threads runs one of these

    for done in [pool.submit(close) for _ in range(width)]:
        try:
            done.result()
        except threading.BrokenBarrierError:
            pass  # fewer threads than its width were ever started: each of them closed its connection
    pool.shutdown(wait=True)


def _on_own_connection(fn, *args) -> None:
    """Run `fn` on this thread's database connection, renewed first when broken or older than CONN_MAX_AGE (as
    Celery does around each task for the worker's own connection)."""
    from django.db import close_old_connections

    close_old_connections()
    try:
        fn(*args)
    finally:
        close_old_connections()


@shared_task(name="jobs.refresh_estimates", soft_time_limit=60, time_limit=90, ignore_result=True)
def refresh_estimates(queue_id: int) -> None:
    """Compute a queue's estimated starts again for the pages that show them (jobs.selectors.estimated_waits)."""
    from django.core.cache import cache

    from jobs import selectors
    from quotas.models import Queue

    try:
        queue = Queue.objects.filter(id=queue_id).first()
        if queue is not None:
            selectors.estimates_compute(queue)
    finally:
        cache.delete(f"eta:refreshing:{queue_id}")


OBSERVE_LOCK = "trainyard:observe:running"
OBSERVE_REST = "trainyard:observe:rest-until"


@shared_task(name="jobs.observe_attempts", soft_time_limit=60, time_limit=90)
def observe_attempts() -> int:
    return observe_pass() or 0


def observe_pass() -> int | None:
    """One observe pass (how many attempts changed), on whichever worker process beat's message reaches; None when
    skipped. Passes never overlap (one that finds another running is skipped), and a pass that took W seconds is
    followed by at least W x TRAINYARD_OBSERVE_REST_FACTOR seconds without one: on a large cluster a pass lists
    thousands of objects, and back-to-back passes would keep the API server and a worker core busy with that."""
    from django.conf import settings
    from django.core.cache import cache

    if not cache.add(OBSERVE_LOCK, 1, timeout=90):  # the task's time limit: a killed pass frees it then
        return None
    try:
        if time.time() < float(cache.get(OBSERVE_REST) or 0):
            return None
        began = time.monotonic()
        changed = lifecycle.attempts_observe()
        try:
            lifecycle.nodes_reachability_check()
        except Exception:  # noqa: BLE001 - the next pass checks again; the inventory sync is the backstop
            log.warning("node_check_failed", exc_info=True)
        rest = (time.monotonic() - began) * settings.TRAINYARD_OBSERVE_REST_FACTOR
        if rest >= 0.05:
            cache.set(OBSERVE_REST, time.time() + rest, timeout=max(1, int(rest) + 1))
        return changed
    finally:
        cache.delete(OBSERVE_LOCK)


@shared_task(name="jobs.enforce_timeouts", soft_time_limit=60, time_limit=90)
def enforce_timeouts() -> int:
    return lifecycle.timeouts_enforce()


@shared_task(name="jobs.reconcile_lifecycle", soft_time_limit=120, time_limit=180)
def reconcile_lifecycle() -> dict:
    return lifecycle.lifecycle_reconcile()


@shared_task(name="jobs.prune_checkpoints", soft_time_limit=600, time_limit=900)
def prune_checkpoints() -> dict:
    from jobs import checkpoints

    return checkpoints.checkpoints_prune()


@shared_task(name="jobs.prune_code_snapshots", soft_time_limit=600, time_limit=900)
def prune_code_snapshots() -> dict:
    from jobs import code

    return code.snapshots_prune()


@shared_task(name="jobs.lend_idle_nodes", soft_time_limit=60, time_limit=90)
def lend_idle_nodes() -> dict:
    """The pool rule of the minute: idle lending (docs/pools.md). MIG proposals are monitoring's own loop."""
    from jobs import lending

    return lending.pools_lend()


@worker_ready.connect
@worker_process_init.connect
def _freeze_loaded(**_kwargs) -> None:
    # The worker's process (the solo dispatcher's) and each prefork child: what start-up loaded, and later what
    # each dispatch pass leaves alive, out of the collector's full collections (kernel/gctune.py).
    from django.conf import settings

    if settings.TRAINYARD_GC_FREEZE:
        gctune.freeze_passes()


@worker_ready.connect
def _reconcile_on_worker_start(**_kwargs) -> None:
    # A restarted worker re-drives what its predecessor left half done, without waiting for beat.
    try:
        reconcile_lifecycle.delay()
    except Exception:  # noqa: BLE001 - the broker may be down; beat's pass will do it
        log.warning("reconcile_on_start_not_sent")
    _check_cluster()


@worker_before_create_process.connect
def _preload_backend(**_kwargs) -> None:
    # In the prefork parent, before each child is forked: the child inherits the Kubernetes client's imported API
    # classes instead of importing them at its first start (a child's first start batch waited seconds for it).
    from django.conf import settings

    if settings.TRAINYARD_BACKEND == "volcano":
        from jobs.backends import volcano

        volcano.preload()


def _check_cluster() -> None:
    """A worker of the Volcano backend says at start whether the cluster can run jobs (version, Volcano)."""
    from django.conf import settings

    if settings.TRAINYARD_BACKEND != "volcano":
        return
    from jobs.backends import get_backend

    try:
        log.info("cluster_checked", found=get_backend().cluster_check())
    except Exception as exc:  # noqa: BLE001 - said loudly; each submission refuses with the same message
        log.error("cluster_unsupported", error=str(exc))


@shared_task(name="jobs.reconcile_pool", soft_time_limit=300, time_limit=360)
def reconcile_pool() -> dict:
    from django.utils import timezone

    from cluster.services import pool_reconcile
    from jobs.backends import get_backend

    observed_at = timezone.now()
    report = pool_reconcile(live_backend_refs=get_backend().live_refs(), observed_at=observed_at)
    return {"freed": report.freed, "overcommitted": report.overcommitted}


@shared_task(name="jobs.sync_inventory")
def sync_inventory() -> str:
    from django.conf import settings

    from cluster.inventory import local_inventory
    from cluster.services import inventories_sync

    if settings.TRAINYARD_BACKEND != "local":
        from jobs.backends import get_backend

        return ",".join(inventories_sync(infos=get_backend().inventory(), backend="volcano"))
    return ",".join(inventories_sync(infos=[local_inventory()]))


@shared_task(name="jobs.sync_volcano_queue", autoretry_for=(Exception,), retry_backoff=2, max_retries=5)
def sync_volcano_queue(queue_id: int) -> None:
    from jobs.backends import get_backend
    from quotas.models import Queue

    get_backend("volcano").queue_sync(Queue.objects.get(pk=queue_id))


@shared_task(name="jobs.sync_team_namespace", autoretry_for=(Exception,), retry_backoff=2, max_retries=5)
def sync_team_namespace(team_id: int) -> list[str]:
    from jobs.team_namespaces import team_namespaces_sync

    return [change for changes in team_namespaces_sync(team_ids=[team_id]).values() for change in changes]


@shared_task(name="jobs.sync_team_namespaces", soft_time_limit=240, time_limit=300)
def sync_team_namespaces() -> dict:
    from jobs.team_namespaces import team_namespaces_sync

    return team_namespaces_sync()


@shared_task(name="jobs.issue_tensorboard", autoretry_for=(Exception,), retry_backoff=2, max_retries=3)
def issue_tensorboard(job_id: str) -> None:
    from jobs.tensorboard import route_issue

    route_issue(job_id=job_id)


@shared_task(name="jobs.reap_tensorboards")
def reap_tensorboards() -> int:
    from jobs.tensorboard import routes_reap

    return routes_reap()


@worker_process_shutdown.connect
def _close_starters(**_kwargs) -> None:
    # The starter threads' connections end with the process's own, not when PostgreSQL notices the process gone.
    try:
        starters_stop()
    except Exception:  # noqa: BLE001 - the process is going away regardless
        log.warning("starters_not_stopped", exc_info=True)
