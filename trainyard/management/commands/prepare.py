"""`manage.py prepare`: what `make run` does before it starts the platform's processes, in one process: migrate,
collect the static files, seed (and find or build the offline base image).

The three ran as three `manage.py` processes, each importing Django and the apps again (about 2.5 s each on a
2-core machine); one process pays that once. A step that fails stops the rest and fails the command."""

from django.core.management import call_command
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Migrate, collect static files and seed (with the offline base image), as `make run` does at start."

    def handle(self, *args, **options) -> None:
        out, err = self.stdout, self.stderr
        call_command("migrate", interactive=False, stdout=out, stderr=err)
        call_command("collectstatic", interactive=False, verbosity=0, stdout=out, stderr=err)
        out.write("seeding; then the offline base image python-local: found by its inputs, or built (first start)")
        call_command("seed", offline_base=True, stdout=out, stderr=err)
