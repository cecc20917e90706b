"""Shared pieces: part of `frontend.views` (see its package docstring)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.utils.translation import gettext as _

from frontend.templatetags import portal
from jobs import selectors
from jobs.lifecycle import backend_runtime
from jobs.models import Job

JOBS_PER_PAGE = 50

LOG_TAIL = 1000

LOG_DOWNLOAD_PAGE = 5000

MAX_POLLED_JOBS = 100


@login_required
def home(request: HttpRequest) -> HttpResponse:
    return redirect("frontend:job-list")


def portal_runtime() -> dict[str, Any]:
    """What the configured backend runs a command with (the local backend: the host's Python and PATH)."""
    return backend_runtime(settings.TRAINYARD_BACKEND)


def visible_job(request: HttpRequest, job_id) -> Job:
    return get_object_or_404(selectors.jobs_visible_to(request.user), pk=job_id)


def recommendation_message(job: Job) -> str:
    """The submission's right-sizing advice as a one-line notice (the request itself is never changed)."""
    from monitoring.selectors import recommendation_for

    rec = recommendation_for(job)
    if not rec or rec["fits_request"]:
        return ""
    return _(
        "Earlier runs like this one (%(evidence)s) suggest spec %(spec)s with %(gpus)s GPU(s), freeing "
        "%(milli)s GPU milli of quota. Your request was submitted as asked; see Resource use below."
    ) % {
        "evidence": portal.evidence(rec),
        "spec": rec["spec"] or "explicit",
        "gpus": rec["gpu_count"],
        "milli": rec["saves"]["gpu_milli"],
    }
