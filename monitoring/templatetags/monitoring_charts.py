"""`{% load monitoring_charts %}{% job_charts job %}`: the job's monitoring charts inside the job page."""

from django import template

from monitoring.views import job_charts_context

register = template.Library()


@register.inclusion_tag("monitoring/job_charts.html")
def job_charts(job) -> dict:
    """Render for a job the page already showed to its reader (the page did the visibility check)."""
    return job_charts_context(job)
