"""Every write of the monitoring app: GPU health (probe, fault, quarantine, return to service), telemetry
records, alert evaluation and its actions, acknowledgement and resolution, webhook delivery, business
metrics, scheduling samples and pruning.

Any transaction that may open an alert takes the alerts advisory lock first, before any row lock, so health
reports, telemetry and the periodic evaluation serialise without deadlocking and never open two alerts for
one incident.
"""

# ruff: noqa: F401 - what the rest of the platform reads of this package (each module is importable too)
from monitoring.services.alerts import (
    alert_acknowledge,
    alert_close,
    alert_resolve,
    alert_rule_save,
    alert_rule_validate,
    alerts_evaluate,
    notification_mark_read,
    notification_send,
    webhook_deliver,
)
from monitoring.services.business import business_metrics_report, business_metrics_scan
from monitoring.services.common import WAIT_BUCKETS, alerts_lock
from monitoring.services.health import gpu_probe_all, gpu_probe_one, gpu_return_to_service
from monitoring.services.push import failure_mail, failures_push, push_settings_save
from monitoring.services.scheduling import monitoring_prune, scheduling_sample
from monitoring.services.telemetry import telemetry_collect
from monitoring.services.usage import usage_collect
