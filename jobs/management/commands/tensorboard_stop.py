"""`manage.py tensorboard_stop`: stop every local TensorBoard the platform started (`make run` does this when it
stops, so none outlives the platform holding a port)."""

from django.core.management.base import BaseCommand

from jobs.tensorboard import routes_stop_all


class Command(BaseCommand):
    help = "Stop every local TensorBoard process and revoke its route."

    def handle(self, *args, **options) -> None:
        stopped = routes_stop_all()
        self.stdout.write(f"stopped {stopped} TensorBoard process(es)")
