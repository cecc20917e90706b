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


def code_from_form(request: HttpRequest, *, team_slug: str) -> tuple[str, dict[str, str]] | None:
    """The code a portal form brings: an uploaded archive (`code_archive`) or a git repository + commit
    (`code_git_url`, `code_git_commit`) that the platform fetches, made the team's code snapshot. Returns (its
    digest, the CI record of a git source, else {}), or None when the form gives neither. Raises a DomainError
    with the field and code of what cannot be used (the job form and the experiment form both show it)."""
    from jobs import code
    from kernel.errors import ValidationFailed
    from quotas import selectors as quota
    from quotas.models import Team

    archive = request.FILES.get("code_archive")
    url = (request.POST.get("code_git_url") or "").strip()
    commit = (request.POST.get("code_git_commit") or "").strip()
    if archive is None and not url and not commit:
        return None
    if archive is not None and (url or commit):
        raise ValidationFailed(_("Give an archive or a git repository, not both."), code="code_twice",
                               field="code_archive")  # fmt: skip
    team = Team.objects.filter(slug=team_slug or "").first()
    if team is None or not quota.is_member(request.user, team):
        raise ValidationFailed(_("Choose one of your teams: the code becomes that team's."), code="unknown_team",
                               field="team")  # fmt: skip
    if archive is not None:
        snapshot = code.snapshot_from_archive(team=team, upload=archive, filename=archive.name, user=request.user)
        return snapshot.digest, {}
    snapshot, sha = code.snapshot_from_git(team=team, url=url, commit=commit, user=request.user)
    return snapshot.digest, {"git_url": code._redacted(url), "git_commit": sha}


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
