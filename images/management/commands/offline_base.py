"""Make sure the catalog holds its offline base (`python-local`): built with podman from this machine's files on the
first start, found again by its inputs on later ones (`make run` runs this after `seed`)."""

import time

from django.core.management.base import BaseCommand

from images import services


class Command(BaseCommand):
    help = "Build (or find, by its inputs) the offline base image python-local and record its digest in the catalog."

    def handle(self, *args, **options):
        started = time.monotonic()
        try:
            outcome, sentence = services.offline_base_ensure()
        except Exception as exc:  # noqa: BLE001 - the platform runs without it; a start must not stop here
            outcome, sentence = "failed", f"{type(exc).__name__}: {exc}"
        took = time.monotonic() - started
        if outcome in ("failed", "skipped"):
            # The platform runs without it (the external bases stay unresolved); the line says why.
            self.stderr.write(f"offline base {outcome}: {sentence}")
        else:
            self.stdout.write(f"offline base {outcome} in {took:.1f} s: {sentence}")
