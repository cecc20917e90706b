from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "monitoring"
    verbose_name = "Monitoring"

    def ready(self) -> None:
        from monitoring import celery_metrics, receivers

        celery_metrics.connect()
        receivers.connect()
