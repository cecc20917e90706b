"""Celery tasks of monitoring (beat entries in settings.CELERY_BEAT_SCHEDULE): each calls one service."""

import random
import smtplib

from celery import shared_task

from monitoring import services


@shared_task(name="monitoring.probe_gpus", soft_time_limit=30, time_limit=45)
def probe_gpus() -> dict:
    report = services.gpu_probe_all()
    return {"probed": report.probed, "failed": report.failed, "left_service": report.left_service}


@shared_task(name="monitoring.collect_telemetry", soft_time_limit=60, time_limit=90)
def collect_telemetry() -> dict:
    report = services.telemetry_collect()
    usage = services.usage_collect()
    return {
        "usage_attempts": usage.attempts,
        "idle_flagged": len(usage.idle_flagged),
        "idle_stopped": len(usage.idle_stopped),
        "leaks": len(usage.leaks),
        "host_metrics_error": usage.host_metrics_error,
        "source": report.source,
        "samples": report.samples,
        "unknown": report.unknown,
        "error": report.error,
    }


@shared_task(name="monitoring.evaluate_alerts", soft_time_limit=60, time_limit=90)
def evaluate_alerts() -> dict:
    report = services.alerts_evaluate()
    return {"opened": report.opened, "resolved": report.resolved, "updated": report.updated}


@shared_task(name="monitoring.scan_job_metrics", soft_time_limit=60, time_limit=90)
def scan_job_metrics() -> dict:
    report = services.business_metrics_scan()
    pushed = services.failures_push()
    return {"attempts": report.attempts, "metrics": report.metrics, "malformed": report.malformed, "pushed": pushed}


@shared_task(name="monitoring.sample_scheduling", soft_time_limit=60, time_limit=90)
def sample_scheduling() -> int:
    return services.scheduling_sample()


@shared_task(name="monitoring.prune", soft_time_limit=600, time_limit=660)
def prune() -> dict:
    return services.monitoring_prune()


@shared_task(bind=True, name="monitoring.deliver_webhook", max_retries=6, acks_late=True)
def deliver_webhook(self, delivery_id: int) -> bool:
    """Idempotent (a delivered row is not sent again); retried with a growing, jittered delay."""
    if services.webhook_deliver(delivery_id=delivery_id):
        return True
    raise self.retry(countdown=min(600, 5 * 2**self.request.retries) * random.uniform(0.8, 1.2))


@shared_task(
    name="monitoring.mail_failure",
    autoretry_for=(OSError, smtplib.SMTPException),
    retry_backoff=5,
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=6,
)
def mail_failure(alert_id: int) -> bool:
    """One failure notice to its owner's email address; a mail server that is down is tried again, backing off."""
    return services.failure_mail(alert_id=alert_id)


@shared_task(name="monitoring.propose_mig", soft_time_limit=60, time_limit=90)
def propose_mig() -> dict[str, int]:
    """MIG rebalancing proposals of the minute (docs/pools.md), as alerts an admin accepts or dismisses."""
    from monitoring.mig import mig_proposals

    return mig_proposals()
