"""`manage.py seed`: create the platform's starting data (idempotent)."""

import os

from django.core.management import call_command
from django.core.management.base import BaseCommand

from ops.seed import seed

# Half the train queue: the demo team's third whole-GPU job waits on the team's quota, not on the queue's.
DEMO_TEAM_SHARE = 0.5


class Command(BaseCommand):
    help = "Create specs, queues, a demo team and users, base images (only what is missing)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--offline-base",
            action="store_true",
            help="then build (or find by its inputs) the offline base python-local, in the same process",
        )

    def handle(self, *args, offline_base: bool = False, **options):
        report = seed(
            admin_password=os.environ.get("TRAINYARD_ADMIN_PASSWORD") or None,
            demo_password=os.environ.get("TRAINYARD_DEMO_PASSWORD") or None,
            demo_team_share=DEMO_TEAM_SHARE,
        )
        for item in report.created:
            self.stdout.write(f"created {item}")
        for user, password in report.passwords.items():
            self.stdout.write(self.style.WARNING(f"login {user} / {password}   (shown once; keep it)"))
        if report.inventory:
            self.stdout.write(report.inventory)
        if not report.created:
            self.stdout.write("seed data already present")
        if offline_base:
            call_command("offline_base", stdout=self.stdout, stderr=self.stderr)
