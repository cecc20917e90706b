from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from jobs import (
            checks,  # noqa: F401 - registers the startup checks
            receivers,
            usage,
        )
        from quotas import runtimes
        from quotas import usage as quota_usage

        quota_usage.register(usage)
        runtimes.register(receivers.cluster_runtime_classes)
        receivers.connect()
