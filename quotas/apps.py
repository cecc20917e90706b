from django.apps import AppConfig


class QuotasConfig(AppConfig):
    name = "quotas"
    verbose_name = "Teams, queues and quotas"
