"""Monitoring's answers to what the jobs app asks by name (`jobs.signals`), connected in MonitoringConfig.ready."""

from __future__ import annotations

from jobs import signals


def _recommendation(sender, job, **_kwargs):
    from monitoring.selectors import recommendation_for

    return recommendation_for(job)


def _usage(sender, job, **_kwargs):
    from monitoring.selectors import usage_payload

    return usage_payload(job)


def _charts_html(sender, job, **_kwargs):
    from monitoring.views import business_charts_html

    return business_charts_html(job)


def connect() -> None:
    signals.recommendation_wanted.connect(_recommendation, dispatch_uid="monitoring.recommendation")
    signals.usage_wanted.connect(_usage, dispatch_uid="monitoring.usage")
    signals.charts_html_wanted.connect(_charts_html, dispatch_uid="monitoring.charts_html")
