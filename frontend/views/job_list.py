"""Job list: part of `frontend.views` (see its package docstring)."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.contrib.auth.decorators import login_required
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.translation import gettext as _

from frontend import wording
from frontend.views.common import JOBS_PER_PAGE, MAX_POLLED_JOBS
from jobs import selectors
from jobs.api import JobFilter
from jobs.models import Job
from jobs.states import JobState
from kernel.errors import ValidationFailed
from quotas import selectors as quota
from quotas.models import Queue


def _cursor(job: Job) -> str:
    return f"{job.submitted_at.isoformat()}~{job.id}"


def _parse_cursor(raw: str | None) -> tuple[datetime, uuid.UUID] | None:
    if not raw:
        return None
    stamp, _sep, ident = raw.partition("~")
    try:
        return datetime.fromisoformat(stamp), uuid.UUID(ident)
    except ValueError:
        return None


def _keyset_page(qs: QuerySet[Job], *, before: str | None, after: str | None, size: int):
    """One page, newest first, by (submitted_at, id) keys: never OFFSET, so deep pages cost the same."""
    older_than = _parse_cursor(before)
    newer_than = _parse_cursor(after) if older_than is None else None
    if newer_than is not None:
        stamp, ident = newer_than
        rows = list(
            qs.filter(Q(submitted_at__gt=stamp) | Q(submitted_at=stamp, id__gt=ident)).order_by("submitted_at", "id")[
                : size + 1
            ]
        )
        has_newer = len(rows) > size
        rows = list(reversed(rows[:size]))
        has_older = True
    else:
        if older_than is not None:
            stamp, ident = older_than
            qs = qs.filter(Q(submitted_at__lt=stamp) | Q(submitted_at=stamp, id__lt=ident))
        rows = list(qs.order_by("-submitted_at", "-id")[: size + 1])
        has_older = len(rows) > size
        rows = rows[:size]
        has_newer = older_than is not None
    older = _cursor(rows[-1]) if rows and has_older else None
    newer = _cursor(rows[0]) if rows and has_newer else None
    return selectors.with_positions(rows), newer, older


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    params = request.GET.copy()
    mine = params.get("mine") == "1"
    if mine:
        params["owner"] = request.user.username
    # The API's FilterSet, so the page filters exactly like GET /api/v1/jobs/.
    filterset = JobFilter(params, queryset=selectors.jobs_visible_to(request.user))
    error = ""
    try:
        qs = filterset.qs if filterset.is_valid() else Job.objects.none()
        if not filterset.is_valid():
            error = _("Some filters are not valid: %(fields)s") % {"fields": ", ".join(filterset.errors)}
    except ValidationFailed as exc:
        qs, error = Job.objects.none(), exc.detail
    jobs, newer, older = _keyset_page(
        qs, before=request.GET.get("before"), after=request.GET.get("after"), size=JOBS_PER_PAGE
    )
    base = {k: v for k, v in request.GET.items() if k not in {"before", "after"} and v}
    return render(
        request,
        "frontend/job_list.html",
        {
            "nav": "jobs",
            "jobs": jobs,
            "error": error,
            "mine": mine,
            "filters": {
                "state": request.GET.get("state", ""),
                "queue": request.GET.get("queue", ""),
                "team": request.GET.get("team", ""),
            },
            "states": [(s, wording.state_label(s)) for s in JobState.values],
            "teams": quota.visible_teams(request.user).order_by("name"),
            "queues": Queue.objects.order_by("name"),
            "newer_url": "?" + urlencode({**base, "after": newer}) if newer else "",
            "older_url": "?" + urlencode({**base, "before": older}) if older else "",
            "first_url": "?" + urlencode(base) if newer else "",
            "states_url": reverse("frontend:job-states"),
            # Here, not in the template: {% translate %} would look the text up with its % doubled.
            "bulk_confirm": _(
                "Cancel the %(count)s selected jobs? Their processes are stopped and their GPUs freed; "
                "this cannot be undone."
            ),
        },
    )


@login_required
def job_states(request: HttpRequest) -> JsonResponse:
    """The live part of the job list: state, reason and position of up to 100 jobs the user may see."""
    ids = []
    for raw in request.GET.getlist("id")[:MAX_POLLED_JOBS]:
        try:
            ids.append(uuid.UUID(raw))
        except ValueError:
            continue
    rows = list(selectors.jobs_visible_to(request.user).filter(id__in=ids).values("id", "state", "reason"))
    places = selectors.queue_positions(r["id"] for r in rows if r["state"] == JobState.PENDING)
    return JsonResponse(
        {
            "jobs": {
                str(r["id"]): {
                    "state": r["state"],
                    "label": wording.state_label(r["state"]),
                    "reason": wording.reason_sentence(r["reason"]) if r["state"] == JobState.PENDING else "",
                    "position": places.get(r["id"]),
                    "terminal": wording.is_terminal(r["state"]),
                }
                for r in rows
            }
        }
    )
