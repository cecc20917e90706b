"""Teams: part of `frontend.views` (see its package docstring)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone

from jobs import usage as job_usage
from quotas import selectors as quota


@login_required
def team_list(request: HttpRequest) -> HttpResponse:
    teams = list(quota.visible_teams(request.user).order_by("name"))
    if len(teams) == 1:
        return redirect("frontend:team-detail", slug=teams[0].slug)
    rows = [{"team": t, "usage": job_usage.team_usage(t)} for t in teams]
    return render(request, "frontend/team_list.html", {"nav": "teams", "rows": rows})


@login_required
def team_detail(request: HttpRequest, slug: str) -> HttpResponse:
    from jobs.checkpoints import team_storage_used

    team = get_object_or_404(quota.visible_teams(request.user).prefetch_related("memberships__user"), slug=slug)
    usage = job_usage.team_usage(team)
    return render(
        request,
        "frontend/team_detail.html",
        {
            "nav": "teams",
            "team": team,
            "usage": usage,
            "quota_vector": team.vector(),
            "storage_used": team_storage_used([team.id]).get(team.id, 0),
            "by_spec": job_usage.team_usage_by_spec(team),
            "members": sorted(team.memberships.all(), key=lambda m: (m.role != "maintainer", m.user.username)),
            "queues": team.queues.order_by("-priority", "name"),
            "rightsizing": _team_rightsizing(team),
        },
    )


def _team_rightsizing(team):
    """The team page's right-sizing section: the last 30 days (UTC days, today included)."""
    from datetime import timedelta

    from monitoring.selectors import team_rightsizing

    today = timezone.now().date()
    return team_rightsizing(team, start=today - timedelta(days=29), end=today)
