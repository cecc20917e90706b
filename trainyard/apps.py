from django.apps import AppConfig


class TrainyardConfig(AppConfig):
    name = "trainyard"
    verbose_name = "Trainyard"

    def ready(self) -> None:
        # Every process that sets Django up (web, worker, beat, tests) gets the Celery app, so `.delay()` reaches
        # Redis; the CLI, which never sets Django up, does not pay for importing Celery.
        from kernel import login_guard  # noqa: F401 - counts failed logins from the first request on
        from trainyard import celery  # noqa: F401
