"""Queues: part of `frontend.views` (see its package docstring)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone

from frontend import wording
from jobs import selectors
from jobs import usage as job_usage
from jobs.models import Job
from quotas import selectors as quota
from quotas.models import Queue


@login_required
def queue_list(request: HttpRequest) -> HttpResponse:
    rows = []
    fleet = selectors.estimate_fleet()
    for queue in Queue.objects.prefetch_related("specs").order_by("-priority", "name"):
        waiting, last = selectors.line_ends(queue)
        waits = selectors.estimated_waits(queue, fleet=fleet) if waiting else {}
        rows.append(
            {
                "queue": queue,
                "usage": job_usage.queue_usage(queue),
                "waiting": waiting,
                "line_clears": selectors.line_clears(last, waits),
            }
        )
    return render(request, "frontend/queue_list.html", {"nav": "queues", "rows": rows})


# Jobs of a waiting line listed on its queue's page, and of the jobs holding its capacity (the rest are counted):
# as many as the queue API lists by default. At 200 of each, rendering the two tables was two thirds of the page.
LINE_SHOWN = 100
HOLDING_SHOWN = 100

MINE_SHOWN = 50  # the user's own jobs of that line listed above it, wherever they wait

# What the holders' table shows (a whole row has some 60 columns, a dozen of them JSON).
HOLDER_FIELDS = (
    "id",
    "name",
    "state",
    "team_id",
    "total_gpu_milli",
    "started_at",
    "deadline",
    "team__slug",
    "owner__username",
)


@login_required
def queue_detail(request: HttpRequest, name: str) -> HttpResponse:
    """Why a job waits: the ordered line with positions, reasons in plain words and estimated waits;
    jobs of teams the user is not in show only their place in the line."""
    queue = get_object_or_404(Queue.objects.prefetch_related("specs", "teams"), name=name)
    visible = set(quota.visible_teams(request.user).values_list("id", flat=True))
    # The whole line is estimated; its first LINE_SHOWN jobs are listed, and the user's own wherever they are.
    light = selectors.line_places(queue)
    own = [j.id for j in light if j.owner_id == request.user.id]
    own_more = max(0, len(own) - MINE_SHOWN)
    own = own[:MINE_SHOWN]
    waits, rows = selectors.line_rows(queue, light, first=LINE_SHOWN, also=own)
    by_id = {job.id: job for job in rows}
    own_set = set(own)
    now = timezone.now()
    line, mine = [], []
    for i, entry in enumerate(light, start=1):
        job = by_id.get(entry.id)
        if job is None:
            continue
        row = {
            "job": job,
            "visible": job.team_id in visible,
            "position": i,
            "ahead": i - 1,
            "mine": job.owner_id == request.user.id,
            "waited_s": (now - job.submitted_at).total_seconds(),
            "wait": waits.get(job.id),
            "reason_text": wording.reason_sentence(job.reason),
        }
        if i <= LINE_SHOWN:
            line.append(row)
        if row["mine"] and job.id in own_set:
            mine.append(row)
    # The head of the holders, as of the line: on a full fleet a queue holds thousands of jobs.
    holders = Job.objects.filter(queue=queue, reserved=True)
    holding = list(
        holders.select_related("team", "owner")
        .only(*HOLDER_FIELDS)
        .order_by("started_at", "admitted_at", "id")[:HOLDING_SHOWN]
    )
    holding_more = max(0, holders.count() - len(holding)) if len(holding) == HOLDING_SHOWN else 0
    usage = job_usage.queue_usage(queue)
    return render(
        request,
        "frontend/queue_detail.html",
        {
            "nav": "queues",
            "queue": queue,
            "line": line,
            "holding": holding,
            "holding_more": holding_more,
            "visible": visible,
            "usage": usage,
            "capability": queue.vector(),
            "mine": mine,
            "line_more": max(0, len(light) - LINE_SHOWN),
            "mine_more": own_more,
        },
    )
