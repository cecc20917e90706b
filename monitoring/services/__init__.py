"""Every write of the monitoring app: GPU health (probe, fault, quarantine, return to service), telemetry
records, alert evaluation and its actions, acknowledgement and resolution, webhook delivery, business
metrics, scheduling samples and pruning.

Any transaction that may open an alert takes the alerts advisory lock first, before any row lock, so health
reports, telemetry and the periodic evaluation serialise without deadlocking and never open two alerts for
one incident.
"""

from monitoring.services.alerts import (  # noqa: F401
    EvaluateReport,
    _alert_for_update,
    _enqueue_webhook,
    _live_attempts_on,
    _open,
    _quarantine,
    _queue_webhook,
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
from monitoring.services.business import (  # noqa: F401
    ScanReport,
    _log_watch_alerts,
    _metrics_changed,
    business_metrics_report,
    business_metrics_scan,
)
from monitoring.services.common import (  # noqa: F401
    ALERTS_LOCK_KEY,
    FAULT_SEVERITY,
    WAIT_BUCKETS,
    alerts_lock,
    at_or_now,
    health_event,
    log,
)
from monitoring.services.health import (  # noqa: F401
    ProbeReport,
    _enqueue_dispatch_all,
    gpu_probe_all,
    gpu_probe_one,
    gpu_return_to_service,
    health_apply,
)
from monitoring.services.scheduling import _mean, _wait_bucket_counts, monitoring_prune, scheduling_sample  # noqa: F401
from monitoring.services.telemetry import (  # noqa: F401
    CollectReport,
    _enforce_memory_shares,
    _match_gpus,
    _uuids,
    telemetry_collect,
    telemetry_record,
)
from monitoring.services.usage import (  # noqa: F401
    UsageReport,
    _at,
    _idle_alert_resolve,
    _idle_judge,
    _leak_judge,
    _telemetry_points,
    _usage_sample,
    _usage_update,
    job_alert,
    usage_collect,
)
