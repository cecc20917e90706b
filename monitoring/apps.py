from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "monitoring"
    verbose_name = "Monitoring"

    def ready(self) -> None:
        from cluster import probes
        from monitoring import celery_metrics, health, receivers

        celery_metrics.connect()
        receivers.connect()
        probes.register_remote_health(health.dcgm_hand_out_health)  # the dispatcher's check of cluster cards
