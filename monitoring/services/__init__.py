"""Every write of the monitoring app: GPU health (probe, fault, quarantine, return to service), telemetry
records, alert evaluation and its actions, acknowledgement and resolution, webhook delivery, business
metrics, scheduling samples and pruning.

Any transaction that may open an alert takes the alerts advisory lock first, before any row lock, so health
reports, telemetry and the periodic evaluation serialise without deadlocking and never open two alerts for
one incident.
"""

# ruff: noqa: F401 - the package re-exports its modules' names
from monitoring.services.alerts import (
    EvaluateReport,
    _open,
    _restart,
    alert_acknowledge,
    alert_close,
    alert_resolve,
    alert_rule_save,
    alert_rule_validate,
    alerts_evaluate,
    evaluate,
    notification_mark_read,
    notification_send,
    webhook_deliver,
    webhook_payload,
)
from monitoring.services.business import ScanReport, business_metrics_report, business_metrics_scan
from monitoring.services.common import (
    ALERTS_LOCK_KEY,
    FAULT_SEVERITY,
    WAIT_BUCKETS,
    alerts_lock,
    at_or_now,
    health_event,
    log,
)
from monitoring.services.health import ProbeReport, gpu_probe_all, gpu_probe_one, gpu_return_to_service, health_apply
from monitoring.services.scheduling import monitoring_prune, scheduling_sample
from monitoring.services.telemetry import CollectReport, telemetry_collect, telemetry_record
from monitoring.services.usage import UsageReport, job_alert, usage_collect
